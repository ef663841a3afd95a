//! The few lengths a CUDA run pads its micro-batches to (dpo-train's `dpo::shapes` pads them,
//! check-gpu's memory plan counts them): cuBLAS chooses a kernel on the host for each new product
//! shape, so a packed row's tokens and its scored positions are rounded up to few values.

/// The scored positions are padded to a multiple of this: with head blocks of 512 rows
/// ([`crate::head`]), a batch's last block comes in four sizes.
pub const SCORED_MULTIPLE: usize = 128;

/// The multiple a packed row of `tokens` is padded to: `2^(⌊log2 tokens⌋ − 4)`, at least 64, so
/// that at most a sixteenth more tokens are computed (a few percent on average) and lengths
/// between 4096 and 8192 take 16 sizes.
pub fn token_multiple(tokens: usize) -> usize {
    let log2 = usize::BITS - 1 - tokens.max(1).leading_zeros();
    (1usize << log2.saturating_sub(4)).max(64)
}

/// `x` rounded up to a multiple of `m`.
pub fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m.max(1)) * m.max(1)
}

/// The tokens a packed row of `tokens` is padded to.
pub fn padded_tokens(tokens: usize) -> usize {
    round_up(tokens, token_multiple(tokens))
}

/// The scored positions `scored` are padded to.
pub fn padded_scored(scored: usize) -> usize {
    round_up(scored, SCORED_MULTIPLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_grow_by_at_most_a_sixteenth() {
        assert_eq!(token_multiple(1), 64);
        assert_eq!(token_multiple(1023), 64);
        assert_eq!(token_multiple(4096), 256);
        assert_eq!(token_multiple(8191), 256);
        assert_eq!(token_multiple(8192), 512);
        for t in [1, 63, 64, 65, 1000, 6646, 9392, 100_000] {
            let padded = padded_tokens(t);
            assert!(padded >= t && (padded - t) * 16 <= t.max(1024), "{t} -> {padded}");
        }
        // 6,000-10,000 tokens take 13 lengths.
        let lengths: std::collections::BTreeSet<usize> = (6000..=10_000).map(padded_tokens).collect();
        assert_eq!(lengths.len(), 13);
        assert_eq!((padded_scored(0), padded_scored(1), padded_scored(128), padded_scored(129)), (0, 128, 128, 256));
    }
}
