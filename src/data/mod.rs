//! Preference datasets: readers, TRL-style tokenisation, and batching.
//!
//! The pipeline follows TRL 1.16's `DPOTrainer` (`trl/trainer/dpo_trainer.py`): [`load_preferences`]
//! reads the rows (standard, conversational or implicit-prompt, as `_prepare_dataset` accepts
//! them), [`tokenize`] turns them into prompt/chosen/rejected ids like `_prepare_dataset`'s
//! `tokenize_fn`, and [`collate`] builds the concatenated `[chosen; rejected]` batch like
//! `DataCollatorForPreference`.

pub mod batch;
pub mod error;
pub mod load;
pub mod report;
pub mod tokenize;
pub mod tokenizer;

pub use batch::{Batch, batches, collate, collate_chosen};
pub use error::{DataError, RowProblem};
pub use load::{Columns, LoadOptions, Loaded, PreferenceRow, SkippedRow, Text, load_preferences};
pub use report::{DataReport, ReportInput};
pub use tokenize::{TokenizeReport, TokenizedPair, common_prefix_length, tokenize};
pub use tokenizer::{Message, Tokenizer, TokenizerError};
