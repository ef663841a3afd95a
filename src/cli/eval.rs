//! `dpo-train eval`: TRL's loss and metrics of a policy against a reference, as a table or JSON.

use std::io::Write;

use super::args::EvalArgs;
use super::launch::single_device;
use crate::config::TrainConfig;
use crate::data::Columns;
use crate::eval::{EvalOptions, EvalReport, evaluate};

/// Runs `eval`.
pub fn run_eval(args: EvalArgs) -> anyhow::Result<()> {
    let opts = EvalOptions {
        model: args.model,
        ref_model: args.ref_model,
        tokenizer: args.tokenizer,
        data: args.data,
        columns: Columns {
            prompt: args.columns.prompt_column,
            chosen: args.columns.chosen_column,
            rejected: args.columns.rejected_column,
        },
        skip_bad_rows: args.skip_bad_rows,
        split: Some(args.split),
        loss: TrainConfig::default().with_overrides(&args.loss.values)?.loss,
        max_length: Some(args.max_length),
        batch_size: args.batch_size,
        device: single_device(args.device)?,
    };
    let report = evaluate(&opts)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report.metrics)?)?;
    } else {
        print_table(&mut out, &opts, &report)?;
    }
    Ok(())
}

fn print_table(out: &mut impl Write, opts: &EvalOptions, report: &EvalReport) -> anyhow::Result<()> {
    let types: Vec<String> = opts
        .loss
        .weighted_types()
        .map(
            |(t, w)| if opts.loss.loss_weights.is_empty() { t.name().to_owned() } else { format!("{} x{w}", t.name()) },
        )
        .collect();
    writeln!(out, "model      {}", opts.model.display())?;
    if let Some(r) = &opts.ref_model {
        writeln!(out, "reference  {}", r.display())?;
    }
    writeln!(out, "data       {} ({} pairs)", opts.data.display(), report.pairs)?;
    writeln!(out, "loss       {} (beta {})", types.join(" + "), opts.loss.beta)?;
    writeln!(out)?;
    for (name, value) in report.metrics.named() {
        writeln!(out, "{name:<20} {value:>14.6}")?;
    }
    let lines = |ls: &mut dyn Iterator<Item = usize>| ls.map(|l| l.to_string()).collect::<Vec<_>>().join(", ");
    let t = &report.tokenize;
    if !report.skipped.is_empty() {
        writeln!(
            out,
            "bad rows skipped: {} (lines {})",
            report.skipped.len(),
            lines(&mut report.skipped.iter().map(|s| s.line))
        )?;
    }
    if !t.dropped_prompt_too_long.is_empty() {
        let n = t.dropped_prompt_too_long.len();
        writeln!(
            out,
            "pairs dropped, prompt alone reaches max_length: {n} (lines {})",
            lines(&mut t.dropped_prompt_too_long.iter().copied())
        )?;
    }
    if !t.empty_completion.is_empty() {
        let n = t.empty_completion.len();
        writeln!(
            out,
            "pairs dropped, no completion token after the prompt: {n} (lines {})",
            lines(&mut t.empty_completion.iter().copied())
        )?;
    }
    if !t.prefix_mismatch.is_empty() {
        let n = t.prefix_mismatch.len();
        writeln!(
            out,
            "prompt tokenised differently inside prompt+completion (the common prefix is kept, as TRL does): {n} (lines {})",
            lines(&mut t.prefix_mismatch.iter().copied())
        )?;
    }
    if t.truncated > 0 {
        writeln!(out, "sequences truncated to max_length (keep_start): {}", t.truncated)?;
    }
    Ok(())
}
