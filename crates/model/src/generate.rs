//! Sampling completions with a KV cache: greedy, temperature and nucleus (top-p) sampling as
//! transformers' `generate` defines them (`TemperatureLogitsWarper`, `TopPLogitsWarper`).
//!
//! One prompt at a time, its `num_samples` continuations decoded together in batches of at most
//! [`SAMPLE_ROWS`]: rows of one prompt share a length, so no left padding or attention mask is
//! needed.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::KvCache;
use super::Llama;
use dpo_data::Text;
use dpo_data::load::row::text_field;

/// A prompts file that cannot be generated from, named by file and line.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("cannot read `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}`, line {line}: {message}", path.display())]
    BadPrompt { path: PathBuf, line: usize, message: String },
    #[error("`{}` holds no prompt", path.display())]
    NoPrompts { path: PathBuf },
    #[error(
        "`{}`, line {line}: the prompt has {tokens} tokens but the model {}: no room to generate",
        path.display(), crate::compat::limit_phrase(*.limit, .key)
    )]
    PromptTooLong { path: PathBuf, line: usize, tokens: usize, limit: usize, key: &'static str },
}

/// One prompt and the line it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub line: usize,
    /// Plain text (encoded with the tokenizer's special tokens, as training encodes prompts) or
    /// chat messages (rendered by the chat template with the assistant's header).
    pub text: Text,
}

/// One prompt per non-blank line of a text file (`\n` written as two characters becomes a
/// newline), or the `prompt` field of each row of a `.jsonl` file: a string or, as in
/// conversational training data, a list of `{role, content}` messages.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>, GenerateError> {
    let text = std::fs::read_to_string(path).map_err(|source| GenerateError::Read { path: path.to_owned(), source })?;
    let jsonl = path.extension().is_some_and(|e| e == "jsonl");
    let bad = |line, message: String| GenerateError::BadPrompt { path: path.to_owned(), line, message };
    let prompts = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            let text = if jsonl {
                let value: serde_json::Value =
                    serde_json::from_str(line).map_err(|_| bad(i + 1, "malformed JSON".to_owned()))?;
                let prompt = value.get("prompt").ok_or_else(|| bad(i + 1, "field `prompt` is missing".to_owned()))?;
                text_field(prompt, "prompt").map_err(|problem| bad(i + 1, problem.to_string()))?
            } else {
                Text::Plain(line.replace("\\n", "\n"))
            };
            Ok(Prompt { line: i + 1, text })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if prompts.is_empty() {
        return Err(GenerateError::NoPrompts { path: path.to_owned() });
    }
    Ok(prompts)
}

/// How tokens are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingConfig {
    pub max_new_tokens: usize,
    /// 0 means greedy decoding.
    pub temperature: f64,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 keeps all).
    pub top_p: f64,
}

impl SamplingConfig {
    /// Greedy decoding of up to `max_new_tokens`.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self { max_new_tokens, temperature: 0.0, top_p: 1.0 }
    }
}

/// Continuations of one prompt decoded together at most: the KV cache and the logits grow with
/// the rows, so `--num-samples 1000` decodes in batches rather than asking for all of their memory
/// at once. (Up to this many, the draws from `rng` are those of one batch.)
pub const SAMPLE_ROWS: usize = 64;

/// `num_samples` continuations of `prompt`, each ending before its first `eos` (excluded).
/// `rng` drives sampling; greedy decoding ignores it.
///
/// The prompt plus the new tokens must fit the model's positions: callers cap `max_new_tokens`.
pub fn generate(
    model: &Llama,
    prompt: &[u32],
    num_samples: usize,
    eos: u32,
    cfg: &SamplingConfig,
    rng: &mut ChaCha8Rng,
    device: &Device,
) -> Vec<Vec<u32>> {
    let n = num_samples.max(1);
    let mut outputs = Vec::new();
    while outputs.len() < n {
        let rows = SAMPLE_ROWS.min(n - outputs.len());
        outputs.extend(decode_rows(model, prompt, rows, eos, cfg, rng, device));
    }
    outputs
}

/// [`generate`]'s `n` continuations as one batch.
fn decode_rows(
    model: &Llama,
    prompt: &[u32],
    n: usize,
    eos: u32,
    cfg: &SamplingConfig,
    rng: &mut ChaCha8Rng,
    device: &Device,
) -> Vec<Vec<u32>> {
    let room = model.max_sequence_length().saturating_sub(prompt.len());
    let steps = cfg.max_new_tokens.min(room);
    let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); n];
    if prompt.is_empty() || steps == 0 {
        return outputs;
    }
    let mut cache = KvCache::new(model.num_layers());
    let ids: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).cycle().take(n * prompt.len()).collect();
    let mut input = Tensor::<2, Int>::from_data(TensorData::new(ids, [n, prompt.len()]), device); // [N, P]
    let mut done = vec![false; n];
    for _ in 0..steps {
        let logits = super::host(&model.forward_cached(input, &mut cache)); // [N, V]
        let v = logits.len() / n;
        let mut next = Vec::with_capacity(n);
        for (row, finished) in done.iter_mut().enumerate() {
            // Finished rows keep decoding EOS so the batch stays rectangular.
            let token = if *finished { eos } else { pick(&logits[row * v..(row + 1) * v], cfg, rng) };
            if !*finished {
                if token == eos {
                    *finished = true;
                } else {
                    outputs[row].push(token);
                }
            }
            next.push(i64::from(token));
        }
        if done.iter().all(|&d| d) {
            break;
        }
        input = Tensor::<2, Int>::from_data(TensorData::new(next, [n, 1]), device); // [N, 1]
    }
    outputs
}

/// A seeded sampler: the same seed gives the same samples.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// One token from one row of logits.
fn pick(logits: &[f32], cfg: &SamplingConfig, rng: &mut ChaCha8Rng) -> u32 {
    if cfg.temperature <= 0.0 {
        // The first maximum, as `torch.argmax`.
        let mut best = 0;
        for (i, &z) in logits.iter().enumerate() {
            if z > logits[best] {
                best = i;
            }
        }
        return best as u32;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<(usize, f64)> =
        logits.iter().enumerate().map(|(i, &z)| (i, ((z as f64 - max) / cfg.temperature).exp())).collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    probs.iter_mut().for_each(|p| p.1 /= total);
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    // Nucleus: keep tokens until the cumulative probability reaches top_p (always at least one).
    let mut kept = 0;
    let mut cumulative = 0.0;
    for p in &probs {
        kept += 1;
        cumulative += p.1;
        if cumulative >= cfg.top_p {
            break;
        }
    }
    let probs = &probs[..kept];
    let mass: f64 = probs.iter().map(|p| p.1).sum();
    let mut draw = rng.random::<f64>() * mass;
    for &(i, p) in probs {
        draw -= p;
        if draw <= 0.0 {
            return i as u32;
        }
    }
    probs[probs.len() - 1].0 as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut r = rng(0);
        assert_eq!(pick(&[0.1, 3.0, 3.0, -1.0], &SamplingConfig::greedy(1), &mut r), 1);
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        let mut r = rng(7);
        let cfg = SamplingConfig { max_new_tokens: 1, temperature: 1.0, top_p: 0.5 };
        // Token 2 alone holds more than half the mass: it is the whole nucleus.
        for _ in 0..50 {
            assert_eq!(pick(&[0.0, 0.0, 5.0, 0.0], &cfg, &mut r), 2);
        }
    }

    #[test]
    fn sampling_is_seeded() {
        let cfg = SamplingConfig { max_new_tokens: 1, temperature: 1.0, top_p: 1.0 };
        let logits = [0.3, 0.1, 0.2, 0.4];
        let a: Vec<u32> = (0..20).scan(rng(3), |r, _| Some(pick(&logits, &cfg, r))).collect();
        let b: Vec<u32> = (0..20).scan(rng(3), |r, _| Some(pick(&logits, &cfg, r))).collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|&t| t != a[0]), "a temperature of 1 should vary");
    }
}
