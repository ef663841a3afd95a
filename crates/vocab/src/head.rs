//! How dpo-train's LM head splits the scored positions, the one rule its scoring and hand-written
//! backward run and check-gpu's memory plan counts.
//!
//! The head projects `2^24` logits at a time (a block of [`block_rows`]), so that no more than one
//! block's vocabulary-wide tensors are alive. Its backward recomputes each block's softmax and,
//! where the head's weight trains, multiplies the logit gradients of a group of blocks at once
//! ([`group_blocks`]): one weight-sized product per group instead of per block.

/// Elements of the `[rows, V]` logits the head scores at once (64 MiB of f32).
pub const CHUNK_ELEMENTS: usize = 1 << 24;

/// Predictions a block holds: [`CHUNK_ELEMENTS`] logits at most, one row at least.
pub fn block_rows(vocab: usize) -> usize {
    (CHUNK_ELEMENTS / vocab.max(1)).max(1)
}

/// Blocks of logit gradients the backward multiplies at once, for `scored` predictions over a
/// `vocab`-wide head of `hidden` inputs whose gradients are `bytes` wide (the compute dtype).
///
/// A frozen head (LoRA) takes each block alone: only `∂L/∂h` is needed, a product per block. A
/// trained head's groups hold up to `8h / bytes` rows, in groups as even as whole blocks allow: a
/// group costs `bytes·rows·V`, and past the first each group's `4·V·h` fp32 weight gradient
/// exists beside the sum, so two groups pay only above `8h / bytes` rows. Each group's product
/// also replaces a weight-sized product, cast and sum per block (tens of blocks for a 150k
/// vocabulary, more time than the products).
pub fn group_blocks(scored: usize, vocab: usize, hidden: usize, bytes: usize, head_trains: bool) -> usize {
    if !head_trains {
        return 1;
    }
    let rows = block_rows(vocab);
    let cap = rows.max((8 * hidden).div_ceil(bytes.max(1)));
    let groups = scored.div_ceil(cap).max(1);
    scored.div_ceil(rows).max(1).div_ceil(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2.5-0.5B's head (V 151,936, h 896) in bf16: blocks of 110 rows; 3584 scored rows
    /// make one group, 5300 two of 25 and 24 blocks, frozen each block alone; f32 caps a group
    /// at 2h = 1792 rows.
    #[test]
    fn groups_are_even_and_bounded_by_the_weight_gradient() {
        let (v, h) = (151_936, 896);
        assert_eq!(block_rows(v), 110);
        assert_eq!(group_blocks(3584, v, h, 2, true), 33);
        assert_eq!(group_blocks(5300, v, h, 2, true), 25);
        assert_eq!(group_blocks(5300, v, h, 2, false), 1);
        assert_eq!(group_blocks(5300, v, h, 4, true), 17);
        assert_eq!(group_blocks(1, v, h, 2, true), 1);
        // A vocabulary wider than the chunk still scores a row at a time.
        assert_eq!(block_rows(1 << 25), 1);
    }
}
