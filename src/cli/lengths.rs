//! `dpo-train data lengths`: the data tokenised as training tokenises it (the model's tokenizer;
//! the columns, split, loss rows and truncation of `train`'s keys), summed up as the token counts
//! of its longest pairs, one JSON object on stdout. `check-gpu --data` runs it to plan dpo-train's
//! packed rows at the data's lengths rather than at `--seq-len`.

use std::io::Write;

use anyhow::Context;
use serde::Serialize;

use super::args::LengthsArgs;
use crate::config::Layered;
use crate::data::{self, Prepared, TokenizedPair, Tokenizer};

/// What `check-gpu` reads.
#[derive(Debug, Serialize)]
struct Lengths {
    /// Pairs read (KTO's rows, each with its KL sequence as a second completion).
    pairs: usize,
    /// The truncation's length per sequence.
    max_length: usize,
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
    // The keys as training reads and checks them (its tokenizer, columns, split, rows and
    // truncation), a bad value named by its flag; `--model` and `--data` stand for the two keys
    // training requires.
    let mut layered = Layered::new(None, &args.read.values)?;
    layered.find_in_hub_cache()?;
    layered.cfg.model_name_or_path = args.model.display().to_string();
    layered.cfg.train_file = args.data.display().to_string();
    layered.validate()?;
    let cfg = layered.cfg;
    let tokenizer_dir = match cfg.tokenizer_name_or_path.clone() {
        Some(dir) => dir,
        None => crate::model::tokenizer_dir(&args.model)
            .with_context(|| format!("cannot find a tokenizer for `{}`", args.model.display()))?,
    };
    let tokenizer = Tokenizer::from_dir(&tokenizer_dir)?;
    let opts = crate::run::read_options(&cfg, &cfg.dataset_train_split);
    let Prepared { mut pairs, summary } =
        data::prepare(&args.data, &opts, &tokenizer, cfg.truncation()?, Default::default(), &mut |_, _| {})?;
    // The rows `--skip-bad-rows` skipped, said as training says them.
    if let Some(note) = crate::run::skipped_note(&args.data, &summary.read.skipped) {
        eprintln!("{note}");
    }
    // Training refuses a sequence the model's positions cannot hold before any work; so does
    // this, so that check-gpu does not plan a run that stops there.
    let model_cfg = crate::model::load_config(&args.model)
        .with_context(|| format!("cannot load the model in `{}`", args.model.display()))?;
    let longest = pairs.iter().map(TokenizedPair::longest).max().unwrap_or(0).min(cfg.max_length);
    crate::model::compat::check_length(&model_cfg, &args.model, longest, &args.data)?;
    if cfg.loss.kl_rows() {
        // A KTO row is scored beside its KL sequence (another row's completion), as training
        // lends them within micro-batches.
        pairs = data::kto::with_kl(&pairs, cfg.per_device_train_batch_size, Some(cfg.max_length));
    }
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
        max_length: cfg.max_length,
        packed_longest: longest(packed),
        scored_longest: longest(scored),
        packed_mean_std: spread(packed),
        scored_mean_std: spread(scored),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&lengths)?)?;
    Ok(())
}
