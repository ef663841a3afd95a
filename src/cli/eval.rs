//! `dpo-train eval`: TRL's loss and metrics of a policy against a reference, as a table or JSON.

use std::io::Write;
use std::ops::ControlFlow;
use std::process::ExitCode;

use super::args::EvalArgs;
use super::launch::place_plain;
use super::progress::ConsoleProgress;
use crate::config::{ConfigError, TrainConfig};
use crate::data::{Columns, Packing, Truncation};
use crate::eval::{EvalOptions, EvalReport, evaluate_showing};
use crate::train::{Progress, Workers};

/// Runs `eval`: in this process, or over workers it starts (`--devices cpu:N`, `--gpus N`), each
/// scoring its shard of the pairs, rank 0 printing the whole set's metrics.
pub fn run_eval(args: EvalArgs) -> anyhow::Result<ExitCode> {
    super::refuse_run_dir("model", &args.model)?;
    if let Some(reference) = &args.ref_model {
        super::refuse_run_dir("ref-model", reference)?;
    }
    crate::dpo::shapes::padding_setting()?;
    let mut opts = options(&args)?;
    // Before any worker starts: a refusal is one line from this process.
    let checked = crate::eval::check_models(&opts)?;
    let (device, group) = match place_plain(&args.parallel)? {
        ControlFlow::Break(exit) => return Ok(exit),
        ControlFlow::Continue(placed) => placed,
    };
    opts.device = device;
    let workers = Workers { group: group.as_ref() };
    let mut console = workers.is_main().then(ConsoleProgress::default);
    let label = format!("reading `{}`", opts.data.display());
    let mut reading = |done, total| console.iter_mut().for_each(|c| c.reading(&label, done, total));
    let report = evaluate_showing(&opts, checked, workers, &mut reading)?;
    drop(console);
    if !workers.is_main() {
        return Ok(ExitCode::SUCCESS);
    }
    // After the inputs are checked: a refused evaluation is one line.
    let par = &args.parallel;
    let chosen = par.devices.is_some() || par.gpus.is_some();
    super::device::auto_fell_back(par.device, chosen, &opts.device).into_iter().for_each(|n| eprintln!("{n}"));
    if let Some(note) = reference_note(&opts) {
        eprintln!("note: {note}");
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        // The table's metrics in its order: TRL's names, none the trainer leaves out.
        let m = &report.metrics;
        let fields: Vec<String> = m
            .named()
            .into_iter()
            .chain(m.extra())
            .map(|(name, v)| Ok(format!("{}:{}", serde_json::to_string(name)?, serde_json::to_string(&v)?)))
            .collect::<serde_json::Result<_>>()?;
        writeln!(out, "{{{}}}", fields.join(","))?;
        // What left the means (skipped and dropped rows) goes beside the object, not into it.
        data_report(&mut std::io::stderr().lock(), &opts, &report)?;
    } else {
        print_table(&mut out, &opts, &report, workers.world_size())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The evaluation `args` ask for, its loss and truncation checked as `train` checks them, each
/// refusal named by this command's flag; on the CPU until the workers are placed.
fn options(args: &EvalArgs) -> anyhow::Result<EvalOptions> {
    let mut keys = TrainConfig::default().with_overrides(&args.loss.values)?;
    let mut truncation = eval_truncation(args.max_length, args.keep_end);
    // The loss, the reference-free family's rows and KTO's, and what they cannot run with,
    // refused as `train` refuses them, each named by this command's flag.
    keys.ref_model_name_or_path = args.ref_model.clone();
    keys.truncation_mode = if truncation.keep_end { "keep_end" } else { "keep_start" }.to_owned();
    // KTO's KL rows rotate within blocks of `--batch-size` here.
    keys.per_device_train_batch_size = args.batch_size;
    let checked = |keys: &TrainConfig| -> Result<(), ConfigError> {
        keys.loss.validate()?;
        keys.check_reference_free()?;
        keys.check_kto()
    };
    checked(&keys).map_err(at_eval_flag)?;
    truncation.rows = keys.truncation()?.rows;
    Ok(EvalOptions {
        model: args.model.clone(),
        ref_model: args.ref_model.clone(),
        tokenizer: args.tokenizer.clone(),
        data: args.data.clone(),
        columns: Columns {
            prompt: args.columns.prompt_column.clone(),
            chosen: args.columns.chosen_column.clone(),
            rejected: args.columns.rejected_column.clone(),
        },
        skip_bad_rows: args.skip_bad_rows,
        split: Some(args.split.clone()),
        config: args.dataset_config.clone(),
        loss: keys.loss,
        truncation,
        batch_size: args.batch_size,
        metrics_batch: None,
        packing: Packing::SharedPrompt,
        #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
        device: burn::tensor::Device::libtorch(),
    })
}

/// Without `--ref-model` a full model is its own reference (as TRL copies it), so every reward is
/// 0: said up front, since a user comparing a trained model most likely meant its starting point.
fn reference_note(opts: &EvalOptions) -> Option<String> {
    let own = opts.ref_model.is_none() && !crate::model::lora::is_adapter_dir(&opts.model);
    (own && opts.loss.needs_reference()).then(|| {
        format!(
            "no --ref-model: `{}` is its own reference, so every reward and margin is 0; pass --ref-model with the model it was trained from",
            opts.model.display()
        )
    })
}

fn print_table(out: &mut impl Write, opts: &EvalOptions, report: &EvalReport, ranks: usize) -> anyhow::Result<()> {
    let types: Vec<String> = opts
        .loss
        .weighted_types()
        .map(
            |(t, w)| if opts.loss.loss_weights.is_empty() { t.name().to_owned() } else { format!("{} x{w}", t.name()) },
        )
        .collect();
    writeln!(out, "model      {}", opts.model.display())?;
    match (&opts.ref_model, crate::model::lora::is_adapter_dir(&opts.model)) {
        _ if !opts.loss.needs_reference() => writeln!(out, "reference  none (reference-free loss)")?,
        (Some(r), _) => writeln!(out, "reference  {}", r.display())?,
        (None, true) => writeln!(out, "reference  the adapter's base (adapter off)")?,
        (None, false) => writeln!(out, "reference  the model itself")?,
    }
    writeln!(out, "data       {} ({} {})", opts.data.display(), report.pairs, opts.loss.examples())?;
    writeln!(out, "loss       {} (beta {})", types.join(" + "), opts.loss.beta)?;
    let device = crate::run::device::describe(&opts.device, Some(crate::config::Precision::Fp32), ranks);
    writeln!(out, "device     {}", device.trim_start_matches("device: "))?;
    writeln!(out)?;
    for (name, value) in report.metrics.named().into_iter().chain(report.metrics.extra()) {
        writeln!(out, "{name:<20} {value:>14.6}")?;
    }
    data_report(out, opts, report)
}

/// The rows the metrics leave out or cut, each kind with its lines: skipped bad rows, dropped
/// pairs, prompts tokenised apart, truncated sequences.
fn data_report(out: &mut impl Write, opts: &EvalOptions, report: &EvalReport) -> anyhow::Result<()> {
    // The first 20 lines, as training's note of skipped rows gives them.
    let lines = |ls: &mut dyn Iterator<Item = usize>| {
        let all: Vec<String> = ls.map(|l| l.to_string()).collect();
        match all.len() {
            0..=20 => all.join(", "),
            n => format!("{}, ... and {} more", all[..20].join(", "), n - 20),
        }
    };
    let t = &report.tokenize;
    if !report.skipped.is_empty() {
        writeln!(
            out,
            "bad rows skipped: {} (lines {})",
            report.skipped.len(),
            lines(&mut report.skipped.iter().map(|s| s.line))
        )?;
    }
    let dropped = [
        ("pairs dropped, prompt alone reaches max_length", &t.dropped_prompt_too_long),
        ("pairs dropped, no completion token after the prompt", &t.empty_completion),
        ("pairs dropped, chosen identical to rejected", &t.identical),
        (
            "prompt tokenised differently inside prompt+completion (the common prefix is the prompt: DPOTrainer and KTOTrainer do the same; CPO/ORPO give each side its own)",
            &t.prefix_mismatch,
        ),
    ];
    for (what, rows) in dropped.into_iter().filter(|(_, rows)| !rows.is_empty()) {
        writeln!(out, "{what}: {} (lines {})", rows.len(), lines(&mut rows.iter().copied()))?;
    }
    if t.truncated > 0 {
        let mode = if opts.truncation.keep_end { "keep_end" } else { "keep_start" };
        writeln!(out, "sequences truncated to max_length ({mode}): {}", t.truncated)?;
    }
    Ok(())
}

/// `--max-length` and `--truncation-mode`, each defaulting to its config key's default (eval
/// reads no config file).
/// An invalid key's error located at the flag of `eval` that sets it (`--batch-size` the
/// micro-batch KTO's rows rotate in, `--ref-model` the reference; the loss keys' flags are
/// `train`'s).
fn at_eval_flag(e: ConfigError) -> ConfigError {
    let ConfigError::Invalid { key, message } = e else { return e };
    let flag = match key {
        "per_device_train_batch_size" => "--batch-size".to_owned(),
        "ref_model_name_or_path" => "--ref-model".to_owned(),
        _ => dpo_vocab::flag(key),
    };
    ConfigError::At { place: format!("`{flag}`"), key, message }
}

fn eval_truncation(max_length: Option<usize>, keep_end: Option<bool>) -> Truncation {
    let defaults = TrainConfig::default().truncation().expect("the key table's default truncation_mode is valid");
    Truncation {
        max_length: max_length.or(defaults.max_length),
        keep_end: keep_end.unwrap_or(defaults.keep_end),
        ..defaults
    }
}
