//! `dpo-train data lengths`: the data tokenised as training tokenises it (the model's tokenizer,
//! `--max-length`'s truncation), summed up as the token counts of its longest pairs, one JSON
//! object on stdout. `check-gpu --data` runs it to plan dpo-train's packed rows at the data's
//! lengths rather than at `--seq-len`.

use std::io::Write;

use anyhow::Context;
use serde::Serialize;

use super::args::LengthsArgs;
use crate::config::TrainConfig;
use crate::data::{self, LoadOptions, Prepared, TokenizedPair, Tokenizer};

/// What `check-gpu` reads.
#[derive(Debug, Serialize)]
struct Lengths {
    /// Pairs read.
    pairs: usize,
    /// The truncation's length per sequence.
    max_length: Option<usize>,
    /// Tokens of each of the longest pairs packed as dpo-train packs them (the prompt once, both
    /// completions), longest first.
    packed_longest: Vec<usize>,
    /// Scored tokens (both completions) of each of the pairs with the most, most first.
    scored_longest: Vec<usize>,
    /// Mean and standard deviation over every pair of its packed tokens.
    packed_mean_std: (f64, f64),
    /// The same of its scored tokens.
    scored_mean_std: (f64, f64),
}

pub fn run_lengths(args: LengthsArgs) -> anyhow::Result<()> {
    let tokenizer_dir = crate::model::tokenizer_dir(&args.model)
        .with_context(|| format!("cannot find a tokenizer for `{}`", args.model.display()))?;
    let tokenizer = Tokenizer::from_dir(&tokenizer_dir)?;
    let defaults = TrainConfig::default().truncation().context("the default truncation")?;
    let truncation = data::Truncation { max_length: args.max_length.or(defaults.max_length), ..defaults };
    let Prepared { pairs, .. } =
        data::prepare(&args.data, &LoadOptions::default(), &tokenizer, truncation, Default::default(), &mut |_, _| {})?;
    let longest = |count: fn(&TokenizedPair) -> usize| {
        let mut all: Vec<usize> = pairs.iter().map(count).collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all.truncate(args.top);
        all
    };
    let spread = |count: fn(&TokenizedPair) -> usize| {
        let n = pairs.len().max(1) as f64;
        let mean = pairs.iter().map(|p| count(p) as f64).sum::<f64>() / n;
        let var = pairs.iter().map(|p| (count(p) as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    };
    let packed: fn(&TokenizedPair) -> usize = |p| p.prompt_ids.len() + p.chosen_ids.len() + p.rejected_ids.len();
    let scored: fn(&TokenizedPair) -> usize = |p| p.chosen_ids.len() + p.rejected_ids.len();
    let lengths = Lengths {
        pairs: pairs.len(),
        max_length: truncation.max_length,
        packed_longest: longest(packed),
        scored_longest: longest(scored),
        packed_mean_std: spread(packed),
        scored_mean_std: spread(scored),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&lengths)?)?;
    Ok(())
}
