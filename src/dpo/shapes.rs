//! Few shapes for a GPU's matrix products.
//!
//! cuBLAS picks a kernel for a new product shape on the host: on an H200 under torch 2.11 (CUDA
//! 13), 21 products on shapes new to the profiled steps took 2.7-18 ms each (median 4.1 ms),
//! where a repeated shape took 64 us on average (134 ms of host time in 5 steps of the 0.5B
//! profile, `results/gpu/2026-11-28-nvidia-h200-targets.md`; the policy's and the reference's
//! threads met them together). A packed row's length and the count of scored positions change
//! with every micro-batch, so new shapes kept coming. On CUDA a batch is therefore padded to a
//! few sizes before it is uploaded: the packed row by a span of its own (it attends only to itself
//! and nothing in it is scored) to a multiple of [`token_multiple`], and the scored positions to a
//! multiple of [`SCORED_MULTIPLE`] by predictions whose log-probs are dropped and whose gradients
//! are zero.

use std::sync::OnceLock;

use burn::tensor::Device;

use crate::data::{Batch, Span};
use crate::dist::EnvError;
pub use dpo_vocab::shapes::{SCORED_MULTIPLE, padded_tokens, token_multiple};

/// The variable that turns the padding on (`1`) or off (`0`) whatever the device.
pub const PADDING_VAR: &str = "DPO_TRAIN_SHAPE_PADDING";

/// [`PADDING_VAR`]'s setting, checked where a command starts (a bad value is an error there).
pub fn padding_setting() -> Result<Option<bool>, EnvError> {
    crate::dist::switch(PADDING_VAR)
}

/// Whether batches for `device` are padded: as [`PADDING_VAR`] says, else on CUDA.
pub fn pads(device: &Device) -> bool {
    static SETTING: OnceLock<Option<bool>> = OnceLock::new();
    let setting = *SETTING.get_or_init(|| padding_setting().ok().flatten());
    setting.unwrap_or_else(|| dpo_torch::allocator::cuda_index(device).is_some())
}

/// A packed batch's row as uploaded: its ids, positions and spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub input_ids: Vec<i64>,
    pub positions: Vec<i64>,
    pub spans: Vec<Span>,
}

/// `batch`'s packed row padded to a multiple of [`token_multiple`] by one more span of token 0
/// at positions `0..`; `None` for a batch of padded rows (their layout is not packed) or a row
/// already at such a length.
pub fn padded_row(batch: &Batch) -> Option<Row> {
    if batch.rows != 1 || batch.spans.is_empty() {
        return None;
    }
    let len = batch.len;
    let pad = padded_tokens(len) - len;
    if pad == 0 {
        return None;
    }
    let mut row =
        Row { input_ids: batch.input_ids.clone(), positions: batch.positions.clone(), spans: batch.spans.clone() };
    row.input_ids.resize(len + pad, 0);
    row.positions.extend(0..pad as i64);
    row.spans.push(Span { start: len, len: pad, prefix: None });
    Some(row)
}

/// `at` and `labels` (`[N]`) padded to a multiple of [`SCORED_MULTIPLE`] by predictions of token 0
/// from position 0, which [`crate::dpo::logps::head_forward`] drops.
pub fn padded_scored(at: &[i64], labels: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let n = dpo_vocab::shapes::padded_scored(at.len());
    let (mut at, mut labels) = (at.to_vec(), labels.to_vec());
    at.resize(n, 0);
    labels.resize(n, 0);
    (at, labels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Packing, TokenizedPair, collate};

    /// The pad span follows the row's spans at positions from 0; padded rows are left alone.
    #[test]
    fn a_packed_row_gains_one_span_of_its_own() {
        let pair = |n: u32| TokenizedPair {
            line: 1,
            prompt_ids: (1..=n).collect(),
            chosen_ids: vec![7, 8],
            rejected_ids: vec![9],
            label: None,
        };
        let batch = collate(&[pair(3), pair(4)], 0, None, Packing::Packed);
        let len = batch.len;
        let row = padded_row(&batch).expect("a packed row shorter than 64");
        assert_eq!(row.input_ids.len(), 64);
        assert_eq!(&row.input_ids[..len], &batch.input_ids[..]);
        assert!(row.input_ids[len..].iter().all(|&id| id == 0));
        assert_eq!(row.positions[len..], (0..(64 - len) as i64).collect::<Vec<_>>()[..]);
        assert_eq!(row.spans.last(), Some(&Span { start: len, len: 64 - len, prefix: None }));
        assert_eq!(row.spans.len(), batch.spans.len() + 1);
        assert_eq!(padded_row(&collate(&[pair(3)], 0, None, Packing::Padded)), None);
        let (at, labels) = padded_scored(&batch.at, &batch.labels);
        assert_eq!((at.len(), labels.len()), (128, 128));
        assert_eq!(&at[..batch.at.len()], &batch.at[..]);
    }
}
