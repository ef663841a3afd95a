//! dpo-train (being assembled).
pub mod data;
pub mod model;
pub mod tokenizer;
