//! `dpo-train generate`: completions of a prompts file, sharded over the workers when several.
//! The prompts, the tokenizer and the model's limits are checked before any process starts.

use std::io::Write;
use std::ops::ControlFlow;
use std::process::ExitCode;

use anyhow::Context;

use super::args::GenerateArgs;
use super::launch::place_plain;
use crate::data::Text;
use crate::data::tokenize::encode_prompt;
use crate::data::tokenizer::Tokenizer;
use crate::model::generate::{GenerateError, Prompt, SamplingConfig, generate, read_prompts, rng};
use crate::model::{self, compat};
use crate::train::Workers;

/// Runs `generate`.
pub fn run_generate(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    super::refuse_run_dir("model", &args.model)?;
    let prompts = read_prompts(&args.prompts)?;
    let tokenizer = Tokenizer::from_dir(&model::tokenizer_dir(&args.model)?)?;
    let context = || format!("cannot load the model in `{}`", args.model.display());
    let model_cfg = model::load_config(&args.model).with_context(context)?;
    compat::check_vocab(&model_cfg, &args.model, tokenizer.vocab_size())?;
    let (encoded, notes) = encode_prompts(&args, &prompts, &tokenizer, model_cfg.position_limit())?;
    let (device, group) = match place_plain(&args.parallel)? {
        ControlFlow::Break(exit) => return Ok(exit),
        ControlFlow::Continue(placed) => placed,
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
    // Prompt i draws from seed + i, so the output does not depend on the number of workers.
    let sample = |i: usize| {
        let mut sampler = rng(args.seed.wrapping_add(i as u64));
        generate(&model, &encoded[i], args.num_samples as usize, tokenizer.eos_id(), &cfg, &mut sampler, &device)
    };
    // Rank k samples prompts k, k + world, ...; each round rank 0 gathers one prompt a rank and
    // prints them in order, so the output comes as it is made (a Ctrl-C keeps what was printed)
    // and is the same with any number of workers.
    let (world, mut out) = (workers.world_size(), std::io::stdout().lock());
    for first in (0..prompts.len()).step_by(world) {
        let mine = first + workers.rank();
        let local = if mine < prompts.len() { sample(mine) } else { Vec::new() };
        let round = gather_round(&workers, local)?;
        if workers.is_main() {
            for (prompt, samples) in prompts[first..].iter().zip(round) {
                print_prompt(&mut out, &tokenizer, prompt, &samples, args.json)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Each prompt's token ids, checked against the model's positions (`limit`, from config key
/// `key`): a prompt that fills them is refused, one that leaves fewer than `--max-new-tokens`
/// gets a note; then a prompt's completions are checked against the host's memory.
fn encode_prompts(
    args: &GenerateArgs,
    prompts: &[Prompt],
    tokenizer: &Tokenizer,
    (limit, key): (usize, &'static str),
) -> anyhow::Result<(Vec<Vec<u32>>, Vec<String>)> {
    let mut encoded = Vec::with_capacity(prompts.len());
    let mut notes = Vec::new();
    for prompt in prompts {
        let ids = encode_prompt(tokenizer, &prompt.text, None, usize::MAX)?;
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
    // A prompt's completions are held until they are printed (a round's, one prompt a worker,
    // on the first worker).
    let held = encoded.iter().fold(0u64, |most, ids| {
        let tokens = args.max_new_tokens.min(limit.saturating_sub(ids.len())) as u64;
        let each = (std::mem::size_of::<Vec<u32>>() as u64).saturating_add(tokens.saturating_mul(4));
        most.max(each.saturating_mul(args.num_samples))
    });
    let what = format!("{} completions of a prompt, held until printed,", args.num_samples);
    let advice = "lower `--num-samples` or `--max-new-tokens`";
    super::launch::check_flag_memory("num-samples", held, &what, advice)?;
    Ok((encoded, notes))
}

/// One prompt's completions: each after the prompt as the model saw it, then `---`; or with
/// `json` one object `{prompt, completions}`.
fn print_prompt(
    out: &mut impl Write,
    tokenizer: &Tokenizer,
    prompt: &Prompt,
    samples: &[Vec<u32>],
    json: bool,
) -> anyhow::Result<()> {
    let texts = samples.iter().map(|s| tokenizer.decode(s, true)).collect::<Result<Vec<_>, _>>()?;
    // Messages are shown as the chat template rendered them: the text the model continued.
    let (shown, value) = match &prompt.text {
        Text::Plain(text) => (text.clone(), serde_json::json!(text)),
        Text::Messages(messages) => (tokenizer.apply_chat_template(messages, true)?, serde_json::json!(messages)),
    };
    let text = if json {
        format!("{}\n", serde_json::json!({ "prompt": value, "completions": texts }))
    } else {
        texts.iter().map(|text| format!("{shown}{text}\n---\n")).collect()
    };
    // One write a prompt, flushed: a reader (or a Ctrl-C) sees whole prompts.
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// One round's completions, one prompt's a rank in rank order (a rank past the last prompt sends
/// none), on rank 0; a lone process's own. Token ids travel as f32 (exact below 2^24), each
/// sample prefixed by its length.
fn gather_round(workers: &Workers, local: Vec<Vec<u32>>) -> anyhow::Result<Vec<Vec<Vec<u32>>>> {
    let Some(group) = workers.group else { return Ok(vec![local]) };
    let mut flat = vec![local.len() as f32];
    for sample in &local {
        flat.push(sample.len() as f32);
        flat.extend(sample.iter().map(|&t| t as f32));
    }
    group.set_phase("generation");
    let parts = group.all_gather_f32(&flat)?;
    let unpack = |part: &Vec<f32>| {
        let mut values = part.iter().map(|&v| v as usize);
        let count = values.next().unwrap_or(0);
        (0..count)
            .map(|_| {
                let len = values.next().unwrap_or(0);
                values.by_ref().take(len).map(|t| t as u32).collect()
            })
            .collect()
    };
    Ok(parts.iter().map(unpack).collect())
}
