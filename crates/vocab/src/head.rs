//! How dpo-train's LM head splits the scored positions, the one rule its scoring and hand-written
//! backward run and check-gpu's memory plan counts.
//!
//! The head projects a block of [`block_rows`] predictions at a time, so that no more than one
//! block's vocabulary-wide tensors are alive. Its backward recomputes each block's softmax and,
//! where the head's weight trains, multiplies the logit gradients of a group of blocks at once
//! ([`group_blocks`]): one weight-sized product per group instead of per block.

/// Elements of the `[rows, V]` logits a block holds (64 MiB of f32), unless CUDA's
/// [`CUDA_MIN_BLOCK_ROWS`] asks for more.
pub const CHUNK_ELEMENTS: usize = 1 << 24;

/// Rows a block holds at least on CUDA. A block is a dozen operators the host issues one after
/// another: at `2^24` logits (110 rows of a 152k vocabulary) the 0.5B shape's step on an H200 ran
/// about 200 blocks, 2,310 of the training thread's 15,437 operator calls, each block's kernels
/// too short to keep the GPU ahead of the host. A 32k vocabulary's blocks hold 512 rows already.
pub const CUDA_MIN_BLOCK_ROWS: usize = 512;

/// Predictions a block holds: [`CHUNK_ELEMENTS`] logits at most, one row at least, and on CUDA
/// at least [`CUDA_MIN_BLOCK_ROWS`].
pub fn block_rows(vocab: usize, cuda: bool) -> usize {
    let least = if cuda { CUDA_MIN_BLOCK_ROWS } else { 1 };
    (CHUNK_ELEMENTS / vocab.max(1)).max(least)
}

/// Blocks of logit gradients the backward multiplies at once, for `scored` predictions in blocks
/// of `rows` ([`block_rows`]) over a head of `hidden` inputs whose gradients are `bytes` wide (the
/// compute dtype).
///
/// A frozen head (LoRA) takes each block alone: only `∂L/∂h` is needed, a product per block. A
/// trained head's groups hold up to `8h / bytes` rows, in groups as even as whole blocks allow: a
/// group costs `bytes·rows·V`, and past the first each group's `4·V·h` fp32 weight gradient
/// exists beside the sum, so two groups pay only above `8h / bytes` rows. Each group's product
/// also replaces a weight-sized product, cast and sum per block (tens of blocks for a 150k
/// vocabulary, more time than the products).
pub fn group_blocks(scored: usize, rows: usize, hidden: usize, bytes: usize, head_trains: bool) -> usize {
    if !head_trains {
        return 1;
    }
    let rows = rows.max(1);
    let cap = rows.max((8 * hidden).div_ceil(bytes.max(1)));
    let groups = scored.div_ceil(cap).max(1);
    scored.div_ceil(rows).max(1).div_ceil(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2.5-0.5B's head (V 151,936, h 896) in bf16: blocks of 110 rows on the CPU, 512 on
    /// CUDA; 3584 scored rows make one group, 5300 two of 25 and 24 blocks (CUDA: 6 and 5),
    /// frozen each block alone; f32 caps a group at 2h = 1792 rows. A 32k vocabulary's blocks
    /// are the same on both.
    #[test]
    fn groups_are_even_and_bounded_by_the_weight_gradient() {
        let (v, h) = (151_936, 896);
        let (cpu, cuda) = (block_rows(v, false), block_rows(v, true));
        assert_eq!((cpu, cuda), (110, 512));
        assert_eq!(block_rows(32_000, false), block_rows(32_000, true));
        assert_eq!(group_blocks(3584, cpu, h, 2, true), 33);
        assert_eq!(group_blocks(5300, cpu, h, 2, true), 25);
        assert_eq!(group_blocks(5300, cuda, h, 2, true), 6);
        assert_eq!(group_blocks(5300, cpu, h, 2, false), 1);
        assert_eq!(group_blocks(5300, cpu, h, 4, true), 17);
        assert_eq!(group_blocks(1, cpu, h, 2, true), 1);
        // A vocabulary wider than the chunk still scores a row at a time on the CPU.
        assert_eq!(block_rows(1 << 25, false), 1);
    }
}
