//! Parquet, as the Hugging Face hub stores datasets: only the columns a row needs are decoded
//! (extra columns are never read), one record batch at a time, so memory holds one batch of raw
//! values and one chunk of rows (see [`super::records`]).

use std::fs::File;

use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::records::{push_batch, select};
use super::{LoadOptions, ReadSummary, Rows};
use crate::error::DataError;

/// Rows decoded at a time.
const BATCH_ROWS: usize = 1024;

pub(super) fn read_parquet(file: File, opts: &LoadOptions, rows: &mut Rows) -> Result<ReadSummary, DataError> {
    let path = rows.path.clone();
    let err = |message: String| DataError::Records { path: path.clone(), format: "Parquet", message };
    let size = file.metadata().map_or(0, |m| m.len());
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| err(e.to_string()))?;
    let selected = select(&builder.schema().fields().clone(), opts, rows)?;
    let total = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0).max(1);
    let mask = ProjectionMask::roots(builder.parquet_schema(), selected.projection.iter().copied());
    let reader = builder.with_projection(mask).with_batch_size(BATCH_ROWS).build().map_err(|e| err(e.to_string()))?;
    let mut row = 0;
    for batch in reader {
        push_batch(&batch.map_err(|e| err(e.to_string()))?, &selected, rows, &mut row)?;
        // Progress in bytes, as the rows' share of the file.
        rows.bytes.set(size * row as u64 / total);
    }
    rows.finish()
}
