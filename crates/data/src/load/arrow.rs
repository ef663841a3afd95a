//! Arrow IPC files, as `datasets` writes them (`Dataset.save_to_disk`'s `data-00000-of-00001.arrow`,
//! its cache files, a repository's `.arrow` shards): the stream format, or the file format (its
//! `ARROW1` magic), which `datasets`' Arrow reader takes too. Only the columns a row needs are
//! decoded, one record batch at a time (see [`super::records`]).

use std::io::{BufRead, Seek};

use arrow_array::RecordBatch;
use arrow_ipc::reader::{FileReader, StreamReader};
use arrow_schema::ArrowError;

use super::records::{Selected, push_batch, select};
use super::{LoadOptions, ReadSummary, Rows};
use crate::error::DataError;

/// The file format's leading magic; the stream format has none.
pub(super) const FILE_MAGIC: &[u8] = b"ARROW1";

/// Whether `head`, a file's first bytes, starts an Arrow IPC file or stream (a stream's first
/// message begins with the continuation marker `0xFFFFFFFF`).
pub(super) fn is_arrow(head: &[u8]) -> bool {
    head.starts_with(FILE_MAGIC) || head.starts_with(&[0xff; 4])
}

pub(super) fn read_arrow<R: BufRead + Seek>(
    mut file: R,
    opts: &LoadOptions,
    rows: &mut Rows,
) -> Result<ReadSummary, DataError> {
    let path = rows.path.clone();
    let err = |e: ArrowError| DataError::Records { path: path.clone(), format: "Arrow", message: e.to_string() };
    let io = |source| DataError::Read { path: path.clone(), source };
    let file_format = file.fill_buf().map_err(io)?.starts_with(FILE_MAGIC);
    // The schema first, to learn which columns to decode; then the reader again, projected.
    let schema = match file_format {
        true => FileReader::try_new(&mut file, None).map_err(err)?.schema(),
        false => StreamReader::try_new(&mut file, None).map_err(err)?.schema(),
    };
    file.rewind().map_err(io)?;
    let selected = select(schema.fields(), opts, rows)?;
    let projection = Some(selected.projection.clone());
    match file_format {
        true => each_batch(FileReader::try_new(file, projection).map_err(err)?, &selected, rows, &err)?,
        false => each_batch(StreamReader::try_new(file, projection).map_err(err)?, &selected, rows, &err)?,
    }
    rows.finish()
}

fn each_batch<I: Iterator<Item = Result<RecordBatch, ArrowError>>>(
    batches: I,
    selected: &Selected,
    rows: &mut Rows,
    err: &dyn Fn(ArrowError) -> DataError,
) -> Result<(), DataError> {
    let mut row = 0;
    for batch in batches {
        push_batch(&batch.map_err(err)?, selected, rows, &mut row)?;
    }
    Ok(())
}
