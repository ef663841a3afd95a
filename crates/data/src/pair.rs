//! A tokenised preference pair, the unit every later stage takes.

/// One tokenised preference example (TRL's `prompt_ids`, `chosen_ids`, `rejected_ids`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedPair {
    /// Line of the source row.
    pub line: usize,
    /// Prompt ids (the part both sides share: see `tokenize`'s module doc).
    pub prompt_ids: Vec<u32>,
    /// Chosen completion ids (what follows the prompt ids).
    pub chosen_ids: Vec<u32>,
    /// Rejected completion ids.
    pub rejected_ids: Vec<u32>,
    /// `None` for a preference pair. For an unpaired (KTO) row, its label (true: desirable):
    /// its completion is `chosen_ids`, and `rejected_ids` is empty until [`crate::kto`] puts
    /// there the completion its KL sequence borrows from another row.
    pub label: Option<bool>,
}

impl TokenizedPair {
    /// An unpaired (KTO) row.
    pub fn unpaired(line: usize, prompt_ids: Vec<u32>, completion_ids: Vec<u32>, desirable: bool) -> Self {
        Self { line, prompt_ids, chosen_ids: completion_ids, rejected_ids: Vec::new(), label: Some(desirable) }
    }

    /// Tokens of the pair's longer sequence, prompt included.
    pub fn longest(&self) -> usize {
        self.prompt_ids.len() + self.chosen_ids.len().max(self.rejected_ids.len())
    }
}

/// Number of leading ids `a` and `b` share (`trl/data_utils.py` `common_prefix_length`).
pub fn common_prefix_length(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
