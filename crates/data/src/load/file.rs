//! One data file read by its format: the name (`.gz` stripped) and the first bytes decide.

use std::cell::Cell;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::rc::Rc;

use super::json::{self, is_json_lines, read_json_array, read_json_lines};
use super::{LoadOptions, ReadSummary, Rows, arrow, csv, parquet};
use crate::error::DataError;

/// Reads one file: the format by its name (`.gz` stripped) and by its first bytes (Parquet's,
/// Arrow's and gzip's magic numbers), so a compressed file under a plain name is still read.
/// `.ndjson` is JSON Lines and `.tsv` tab-separated CSV, as `datasets` reads them.
pub(super) fn read_file(path: &Path, opts: &LoadOptions, rows: &mut Rows) -> Result<ReadSummary, DataError> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    let ext = name.rsplit_once('.').map(|(_, e)| e);
    let read_err = |source| DataError::Read { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut file = Counted { inner: file, done: rows.bytes.clone() };
    let mut plain = BufReader::with_capacity(1 << 20, &mut file);
    let head = plain.fill_buf().map_err(read_err)?;
    let gzip = head.starts_with(&[0x1f, 0x8b]);
    if head.starts_with(b"PAR1") || ext == Some("parquet") {
        drop(plain);
        rows.records = true;
        return parquet::read_parquet(file.inner, opts, rows);
    }
    if arrow::is_arrow(head) || ext == Some("arrow") {
        rows.records = true;
        return arrow::read_arrow(plain, opts, rows);
    }
    let mut format = match ext {
        Some("jsonl" | "ndjson") => Format::JsonLines,
        Some("json") => Format::JsonArray,
        Some("csv") => Format::Csv(b','),
        Some("tsv") => Format::Csv(b'\t'),
        _ => return Err(DataError::UnsupportedFormat { path: path.to_path_buf() }),
    };
    rows.gzip = gzip;
    let mut reader: Box<dyn BufRead + '_> = if rows.gzip {
        Box::new(BufReader::with_capacity(1 << 20, flate2::bufread::MultiGzDecoder::new(plain)))
    } else {
        Box::new(plain)
    };
    if let Format::JsonLines = format {
        if !json::starts_an_array(&mut reader).map_err(|e| rows.io_error(e))? {
            read_json_lines(&mut reader, rows)?;
            return rows.finish();
        }
        format = Format::JsonArray;
    }
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).map_err(|e| rows.io_error(e))?;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let fixed = match format {
        Format::Csv(_) => None,
        _ => json::python_constants(bytes),
    };
    let bytes = fixed.as_deref().unwrap_or(bytes);
    match format {
        Format::JsonArray if is_json_lines(bytes) => read_json_lines(&mut &bytes[..], rows)?,
        Format::JsonArray => read_json_array(bytes, rows)?,
        Format::Csv(delimiter) => csv::read_csv(bytes, delimiter, opts, rows)?,
        Format::JsonLines => read_json_lines(&mut &bytes[..], rows)?,
    }
    rows.finish()
}

enum Format {
    JsonLines,
    JsonArray,
    /// With its field delimiter.
    Csv(u8),
}

/// A reader that counts the bytes read through it (the progress of a streamed file).
pub(super) struct Counted<R> {
    inner: R,
    done: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done.set(self.done.get() + n as u64);
        Ok(n)
    }
}

/// An Arrow reader seeks (to its start again, or to an IPC file's footer): the count follows.
impl<R: Seek> Seek for Counted<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        let at = self.inner.seek(pos)?;
        self.done.set(at);
        Ok(at)
    }
}
