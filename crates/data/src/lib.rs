//! Preference datasets: readers, TRL-style tokenisation, and batching.
//!
//! The pipeline follows TRL 1.16's `DPOTrainer` (`trl/trainer/dpo_trainer.py`): [`read_rows`]
//! streams the rows (standard, conversational or implicit-prompt, as `_prepare_dataset` accepts
//! them), [`tokenize`] turns them into prompt/chosen/rejected ids like `_prepare_dataset`'s
//! `tokenize_fn` ([`prepare`] does both a chunk at a time, [`cache`] keeps the result), and
//! [`collate`] builds the concatenated `[chosen; rejected]` batch like `DataCollatorForPreference`,
//! or packed without padding.

pub mod batch;
pub mod cache;
mod encode;
pub mod error;
pub mod kto;
pub mod load;
mod pair;
pub mod prepare;
pub mod report;
pub mod tokenize;
mod tokenize_cpo;
pub mod tokenizer;

pub use batch::{Batch, Packing, Span, collate, collate_chosen};
pub use error::{DataError, RowProblem};
pub use load::{
    Columns, LoadOptions, Loaded, PreferenceRow, ReadSummary, RowKind, SkippedRow, Text, load_preferences, read_rows,
};
pub use prepare::{DataSummary, Prepared, TokenizeControl, prepare};
pub use report::{DataReport, ReportInput};
pub use tokenize::{TokenizeReport, TokenizedPair, Tokenizing, Truncation, common_prefix_length, tokenize};
pub use tokenizer::{Message, Tokenizer, TokenizerError};
