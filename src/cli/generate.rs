//! `dpo-train generate`: completions of a prompts file, sharded over the workers when several.
//! The prompts, the tokenizer and the model's limits are checked before any process starts.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::INTERRUPTED;
use super::args::GenerateArgs;
use super::launch::{Placed, ProcessMemory, place};
use crate::data::Text;
use crate::data::tokenize::encode_prompt;
use crate::data::tokenizer::Tokenizer;
use crate::dist::LaunchOutcome;
use crate::model::generate::{GenerateError, SamplingConfig, generate, read_prompts, rng};
use crate::model::{self, compat};
use crate::train::Workers;

/// Runs `generate`.
pub fn run_generate(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let prompts = read_prompts(&args.prompts)?;
    let tokenizer = Tokenizer::from_dir(&model::tokenizer_dir(&args.model)?)?;
    let context = || format!("cannot load the model in `{}`", args.model.display());
    let model_cfg = model::load_config(&args.model).with_context(context)?;
    compat::check_vocab(&model_cfg, &args.model, tokenizer.vocab_size())?;
    let (limit, key) = model_cfg.position_limit();
    let mut encoded = Vec::with_capacity(prompts.len());
    let mut notes = Vec::new();
    for prompt in &prompts {
        let ids = encode_prompt(&tokenizer, &prompt.text, usize::MAX)?;
        let (path, line, tokens) = (args.prompts.clone(), prompt.line, ids.len());
        if tokens >= limit {
            return Err(GenerateError::PromptTooLong { path, line, tokens, limit, key }.into());
        }
        if tokens.saturating_add(args.max_new_tokens) > limit {
            notes.push(format!(
                "note: `{}`, line {line}: the prompt has {tokens} tokens and the model handles {limit} (`{key}`): at most {} new tokens",
                path.display(),
                limit - tokens
            ));
        }
        encoded.push(ids);
    }
    // Every completion's token ids are held until the prompts' are all printed.
    let held = encoded.iter().fold(0u64, |sum, ids| {
        let tokens = args.max_new_tokens.min(limit.saturating_sub(ids.len())) as u64;
        let each = (std::mem::size_of::<Vec<u32>>() as u64).saturating_add(tokens.saturating_mul(4));
        sum.saturating_add(each.saturating_mul(args.num_samples))
    });
    let what = format!("{} completions of each of {} prompts, held until printed,", args.num_samples, prompts.len());
    let advice = "lower `--num-samples` or `--max-new-tokens`, or split the prompts file";
    super::launch::check_flag_memory("num-samples", held, &what, advice)?;
    let floor = ProcessMemory {
        each: check_gpu::memory::CUDA_CONTEXT_BYTES,
        basis: "a libtorch process's own",
        lone: "free memory on this machine",
    };
    super::launch::check_host_memory(&args.parallel, floor)?;
    let (device, group) = match place(&args.parallel, &|| Ok(Vec::new()), Duration::from_secs(1800), &mut |_| Ok(()))? {
        Placed::Launched(LaunchOutcome::Finished) => return Ok(ExitCode::SUCCESS),
        Placed::Launched(LaunchOutcome::Interrupted) => return Ok(ExitCode::from(INTERRUPTED)),
        Placed::Here { device, group, .. } => (device, group),
    };
    let workers = Workers { group: group.as_ref() };
    let (_, model) = model::load(&args.model, &device).with_context(context)?;
    // After the inputs are checked: a refused run is one line.
    if workers.is_main() {
        let ranks = group.as_ref().map_or(1, |g| g.world_size());
        eprintln!("{}", crate::run::device::describe(&device, Some(crate::config::Precision::Fp32), ranks));
        let par = &args.parallel;
        let chosen = par.devices.is_some() || par.gpus.is_some();
        super::device::auto_fell_back(par.device, chosen, &device).into_iter().for_each(|n| eprintln!("{n}"));
        notes.iter().for_each(|n| eprintln!("{n}"));
    }
    let cfg = SamplingConfig { max_new_tokens: args.max_new_tokens, temperature: args.temperature, top_p: args.top_p };
    // Each rank samples its shard of the prompts; prompt i draws from seed + i, so the output does
    // not depend on the number of workers.
    let mut local = Vec::new();
    for i in workers.shard(prompts.len()) {
        let mut sampler = rng(args.seed.wrapping_add(i as u64));
        let samples = args.num_samples as usize;
        local.push(generate(&model, &encoded[i], samples, tokenizer.eos_id(), &cfg, &mut sampler, &device));
    }
    let completions = gather_completions(&workers, prompts.len(), &local)?;
    if !workers.is_main() {
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    for (prompt, samples) in prompts.iter().zip(completions) {
        let texts = samples.iter().map(|s| tokenizer.decode(s, true)).collect::<Result<Vec<_>, _>>()?;
        // Messages are shown as the chat template rendered them: the text the model continued.
        let (shown, value) = match &prompt.text {
            Text::Plain(text) => (text.clone(), serde_json::json!(text)),
            Text::Messages(messages) => (tokenizer.apply_chat_template(messages, true)?, serde_json::json!(messages)),
        };
        if args.json {
            writeln!(out, "{}", serde_json::json!({ "prompt": value, "completions": texts }))?;
        } else {
            for text in texts {
                writeln!(out, "{shown}{text}")?;
                writeln!(out, "---")?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Every prompt's sampled token ids in prompt order, from each rank's shard. Token ids travel as
/// f32 (exact below 2^24), each sample prefixed by its length.
fn gather_completions(
    workers: &Workers,
    prompts: usize,
    local: &[Vec<Vec<u32>>],
) -> anyhow::Result<Vec<Vec<Vec<u32>>>> {
    let Some(group) = workers.group else { return Ok(local.to_vec()) };
    let mut flat = Vec::new();
    for samples in local {
        flat.push(samples.len() as f32);
        for sample in samples {
            flat.push(sample.len() as f32);
            flat.extend(sample.iter().map(|&t| t as f32));
        }
    }
    group.set_phase("generation");
    let parts = group.all_gather_f32(&flat)?;
    let mut out = vec![Vec::new(); prompts];
    for (rank, part) in parts.iter().enumerate() {
        let mut values = part.iter().map(|&v| v as usize);
        for index in crate::train::workers::shard(prompts, group.world_size(), rank) {
            let count = values.next().unwrap_or(0);
            out[index] = (0..count)
                .map(|_| {
                    let len = values.next().unwrap_or(0);
                    values.by_ref().take(len).map(|t| t as u32).collect()
                })
                .collect();
        }
    }
    Ok(out)
}
