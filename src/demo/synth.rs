//! A deterministic synthetic preference task with a known ground truth, for the offline demo.
//!
//! Two kinds of pairs, both in TRL's standard (plain text) preference format
//! (`{"prompt": .., "chosen": .., "rejected": ..}`, as `trl/trainer/dpo_trainer.py`
//! `_prepare_dataset` reads it):
//!
//! - **Arithmetic**: `"Q: What is 7 + 5?\nA:"`; chosen is the right answer `" 12."`, rejected is
//!   the answer off by 1 to [`SynthConfig::max_offset`] (`" 14."`), sometimes also in a rude style
//!   (`" 14. Obviously."`). Operands are `0..=max_operand`; differences are never negative.
//! - **Politeness**: `"Q: Hello. Could you please fix my bike?\nA:"`; chosen is a polite reply
//!   (`" Of course! I will fix your bike for you."`), rejected a rude one (`" No. Fix your bike
//!   yourself."`), from small template lists combined.
//!
//! Held-out prompts never occur in train: each kind's pool of distinct problems (an arithmetic
//! problem is its `a op b`, a politeness problem its prompt) is shuffled and cut into test, val and
//! train parts before any pair is drawn, so val and test are disjoint from train and from each
//! other. Each held-out part is at most a quarter of its pool, so train always keeps at least half
//! the problems. Everything is drawn from one ChaCha8 stream seeded by [`SynthConfig::seed`] with
//! this module's own integer sampling, so the same config gives the same bytes on every platform.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Errors writing synthetic preference files.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// Creating, writing or renaming the output file failed.
    #[error("cannot write `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A pair could not be serialised to JSON.
    #[error("cannot serialise a pair for `{path}`")]
    Serialize {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The knobs of the synthetic task; missing keys of a serialised config take the defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SynthConfig {
    /// Seed of the one random stream everything is drawn from.
    pub seed: u64,
    /// Number of training pairs (default 2000).
    pub train: usize,
    /// Number of validation pairs (default 200).
    pub val: usize,
    /// Number of test pairs (default 200).
    pub test: usize,
    /// Fraction of arithmetic pairs in every split, the rest being politeness pairs (default 0.6).
    pub arithmetic_fraction: f64,
    /// Largest operand of `a + b` and `a - b` (default 20, so answers are at most 40).
    pub max_operand: u32,
    /// Largest distance between the rejected and the right answer; at least 1 is used (default 3).
    pub max_offset: u32,
    /// Fraction of arithmetic pairs whose wrong answer is also phrased rudely (default 0.2).
    pub rude_wrong_fraction: f64,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            train: 2000,
            val: 200,
            test: 200,
            arithmetic_fraction: 0.6,
            max_operand: 20,
            max_offset: 3,
            rude_wrong_fraction: 0.2,
        }
    }
}

/// An arithmetic operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// `a + b`.
    #[serde(rename = "+")]
    Add,
    /// `a - b` with `a >= b`.
    #[serde(rename = "-")]
    Sub,
}

impl Op {
    /// The operator as written in prompts.
    pub fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Sub => '-',
        }
    }
}

/// What a pair tests, with its ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "task", rename_all = "snake_case")]
pub enum TaskKind {
    /// `a op b = answer`; the chosen completion states `answer`.
    Arithmetic { a: u32, b: u32, op: Op, answer: u32 },
    /// The chosen completion is polite, the rejected one rude.
    Politeness,
}

/// One synthetic preference example. Serialised as a TRL standard row plus a `kind` key, which
/// [`super::load_preferences`] ignores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SynthPair {
    /// The prompt, ending with `"\nA:"`.
    pub prompt: String,
    /// The preferred completion (starts with a space).
    pub chosen: String,
    /// The dispreferred completion (starts with a space; never equal to `chosen`).
    pub rejected: String,
    /// The task and its ground truth.
    pub kind: TaskKind,
}

/// The three splits, each in a shuffled order with kinds mixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthData {
    /// Training pairs.
    pub train: Vec<SynthPair>,
    /// Validation pairs (prompts disjoint from train and test).
    pub val: Vec<SynthPair>,
    /// Test pairs (prompts disjoint from train and val).
    pub test: Vec<SynthPair>,
}

/// Generates the three splits for `cfg`, deterministically.
///
/// The split sizes are exact, except that a held-out split gets no pairs of a kind whose pool is
/// too small to hold a quarter out (`max_operand` 0 for arithmetic). When a split asks for more
/// pairs of a kind than its part of the pool has problems, problems repeat (with fresh rejected
/// answers and reply templates), round-robin.
pub fn generate(cfg: &SynthConfig) -> SynthData {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let frac = if cfg.arithmetic_fraction.is_nan() { 0.0 } else { cfg.arithmetic_fraction.clamp(0.0, 1.0) };
    let arith_count = |n: usize| ((n as f64 * frac).round() as usize).min(n);

    let mut arith = arithmetic_problems(cfg.max_operand);
    shuffle(&mut arith, &mut rng);
    let mut polite = politeness_problems();
    shuffle(&mut polite, &mut rng);
    let (a_test, a_val, a_train) = cut(&arith, arith_count(cfg.test), arith_count(cfg.val));
    let (p_test, p_val, p_train) = cut(&polite, cfg.test - arith_count(cfg.test), cfg.val - arith_count(cfg.val));

    let mut split = |n: usize, arith: &[Arithmetic], polite: &[Politeness]| {
        let mut pairs = Vec::with_capacity(n);
        let n_arith = arith_count(n);
        if !arith.is_empty() {
            for i in 0..n_arith {
                pairs.push(arithmetic_pair(arith[i % arith.len()], cfg, &mut rng));
            }
        }
        if !polite.is_empty() {
            for i in 0..n - n_arith {
                pairs.push(politeness_pair(polite[i % polite.len()], &mut rng));
            }
        }
        shuffle(&mut pairs, &mut rng);
        pairs
    };
    let test = split(cfg.test, a_test, p_test);
    let val = split(cfg.val, a_val, p_val);
    let train = split(cfg.train, a_train, p_train);
    SynthData { train, val, test }
}

/// Whether `completion` (a generated continuation of an arithmetic prompt) states the right answer:
/// its first integer (a `-` directly before the digits makes it negative) equals the answer.
/// Text after the number is ignored (`" 17 apples"` answers 17). Politeness prompts have no
/// numeric answer, so this is `false` for them.
pub fn is_correct_answer(kind: &TaskKind, completion: &str) -> bool {
    let TaskKind::Arithmetic { answer, .. } = kind else {
        return false;
    };
    first_integer(completion) == Some(i64::from(*answer))
}

/// The first integer of `text`, with a directly preceding `-`; `None` without digits or when it
/// overflows `i64`.
fn first_integer(text: &str) -> Option<i64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let digits =
        text[start..].find(|c: char| !c.is_ascii_digit()).map_or(&text[start..], |end| &text[start..start + end]);
    let value: i64 = digits.parse().ok()?;
    if text[..start].ends_with('-') { Some(-value) } else { Some(value) }
}

/// The task of an arithmetic prompt written by [`generate`] (`"Q: What is 7 + 5?\nA:"`), or
/// `None` for any other prompt; lets a reader of the JSONL files score generations without the
/// `kind` key.
pub fn arithmetic_kind(prompt: &str) -> Option<TaskKind> {
    let body = prompt.strip_prefix("Q: What is ")?.strip_suffix("?\nA:")?;
    let mut parts = body.split(' ');
    let (a, op, b) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let a: u32 = a.parse().ok()?;
    let b: u32 = b.parse().ok()?;
    let (op, answer) = match op {
        "+" => (Op::Add, a.checked_add(b)?),
        "-" => (Op::Sub, a.checked_sub(b)?),
        _ => return None,
    };
    Some(TaskKind::Arithmetic { a, b, op, answer })
}

/// Writes `pairs` as JSON Lines (keys `prompt`, `chosen`, `rejected`, `kind`), atomically: to a
/// temporary file beside `path`, then renamed over it. Missing parent directories are created.
pub fn write_jsonl(path: &Path, pairs: &[SynthPair]) -> Result<(), SynthError> {
    let mut text = String::new();
    for pair in pairs {
        let line =
            serde_json::to_string(pair).map_err(|source| SynthError::Serialize { path: path.to_path_buf(), source })?;
        text.push_str(&line);
        text.push('\n');
    }
    crate::fsutil::write_atomic(path, text.as_bytes())
        .map_err(|source| SynthError::Write { path: path.to_path_buf(), source })
}

/// Writes `data` as `train.jsonl`, `val.jsonl` and `test.jsonl` in `dir` (created if missing),
/// returning the three paths in that order.
pub fn write_splits(dir: &Path, data: &SynthData) -> Result<[PathBuf; 3], SynthError> {
    let paths = [dir.join("train.jsonl"), dir.join("val.jsonl"), dir.join("test.jsonl")];
    for (path, pairs) in paths.iter().zip([&data.train, &data.val, &data.test]) {
        write_jsonl(path, pairs)?;
    }
    Ok(paths)
}

/// One arithmetic problem `a op b`.
#[derive(Debug, Clone, Copy)]
struct Arithmetic {
    a: u32,
    b: u32,
    op: Op,
}

/// One politeness request: indices into the template lists below.
#[derive(Debug, Clone, Copy)]
struct Politeness {
    greeting: usize,
    form: usize,
    verb: usize,
    object: usize,
}

/// Openings of politeness prompts.
const GREETINGS: [&str; 4] = ["", "Hi. ", "Hello. ", "Excuse me. "];
/// Request forms; `{}` is the task (`fix my bike`).
const FORMS: [(&str, &str); 4] = [("Can you ", "?"), ("Could you please ", "?"), ("Please ", "."), ("Will you ", "?")];
/// Task verbs.
const VERBS: [&str; 8] = ["fix", "clean", "paint", "check", "move", "carry", "wash", "open"];
/// Task objects, as the asker says them and as the replier says them.
const OBJECTS: [(&str, &str); 8] = [
    ("my bike", "your bike"),
    ("the door", "the door"),
    ("the car", "the car"),
    ("my desk", "your desk"),
    ("the box", "the box"),
    ("my bag", "your bag"),
    ("the window", "the window"),
    ("the chair", "the chair"),
];
/// Polite replies, as (before, after) the task in the replier's words.
const POLITE: [(&str, &str); 4] = [
    (" Of course! I will ", " for you."),
    (" Sure, I am happy to ", "."),
    (" Certainly. Let me ", " right away."),
    (" Yes, gladly. I can ", " now."),
];
/// Rude replies; `None` marks the one that repeats the task (`" No. Fix your bike yourself."`).
const RUDE: [Option<&str>; 4] = [
    None,
    Some(" Ugh, that is your problem, not mine."),
    Some(" Why should I? Go away."),
    Some(" No way. Stop asking me."),
];
/// Rude phrasings of a wrong arithmetic answer, as (before, after) the number.
const RUDE_WRONG: [(&str, &str); 2] = [(" ", ". Obviously."), (" Ugh, ", ". Go away.")];

/// Every distinct arithmetic problem, in a fixed order: all `a + b`, then all `a - b` with
/// `a >= b`.
fn arithmetic_problems(max: u32) -> Vec<Arithmetic> {
    let mut out = Vec::new();
    for op in [Op::Add, Op::Sub] {
        for a in 0..=max {
            for b in 0..=max {
                if op == Op::Add || a >= b {
                    out.push(Arithmetic { a, b, op });
                }
            }
        }
    }
    out
}

/// Every distinct politeness request, in a fixed order.
fn politeness_problems() -> Vec<Politeness> {
    let mut out = Vec::new();
    for greeting in 0..GREETINGS.len() {
        for form in 0..FORMS.len() {
            for verb in 0..VERBS.len() {
                for object in 0..OBJECTS.len() {
                    out.push(Politeness { greeting, form, verb, object });
                }
            }
        }
    }
    out
}

/// Cuts a shuffled pool into (test, val, train); each held-out part has at most a quarter of it.
fn cut<T>(pool: &[T], test: usize, val: usize) -> (&[T], &[T], &[T]) {
    let cap = pool.len() / 4;
    let (test, val) = (test.min(cap), val.min(cap));
    let (t, rest) = pool.split_at(test);
    let (v, train) = rest.split_at(val);
    (t, v, train)
}

fn arithmetic_pair(p: Arithmetic, cfg: &SynthConfig, rng: &mut ChaCha8Rng) -> SynthPair {
    let answer = match p.op {
        Op::Add => p.a + p.b,
        Op::Sub => p.a - p.b,
    };
    // Offsets -max..=-1 and 1..=max, without negative wrong answers; `answer + 1` is always one.
    let max = cfg.max_offset.max(1);
    let wrongs: Vec<u32> = (1..=max).flat_map(|d| [answer.checked_sub(d), answer.checked_add(d)]).flatten().collect();
    let wrong = wrongs[below(rng, wrongs.len())];
    let rejected = if chance(rng, cfg.rude_wrong_fraction) {
        let (pre, post) = RUDE_WRONG[below(rng, RUDE_WRONG.len())];
        format!("{pre}{wrong}{post}")
    } else {
        format!(" {wrong}.")
    };
    SynthPair {
        prompt: format!("Q: What is {} {} {}?\nA:", p.a, p.op.symbol(), p.b),
        chosen: format!(" {answer}."),
        rejected,
        kind: TaskKind::Arithmetic { a: p.a, b: p.b, op: p.op, answer },
    }
}

fn politeness_pair(p: Politeness, rng: &mut ChaCha8Rng) -> SynthPair {
    let (form_pre, form_post) = FORMS[p.form];
    let verb = VERBS[p.verb];
    let (asked, replied) = OBJECTS[p.object];
    let (polite_pre, polite_post) = POLITE[below(rng, POLITE.len())];
    let rejected = match RUDE[below(rng, RUDE.len())] {
        Some(text) => text.to_string(),
        None => format!(" No. {} {replied} yourself.", capitalize(verb)),
    };
    SynthPair {
        prompt: format!("Q: {}{form_pre}{verb} {asked}{form_post}\nA:", GREETINGS[p.greeting]),
        chosen: format!("{polite_pre}{verb} {replied}{polite_post}"),
        rejected,
        kind: TaskKind::Politeness,
    }
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map_or_else(String::new, |c| c.to_ascii_uppercase().to_string() + chars.as_str())
}

/// A uniform index in `0..n` (`n > 0`), by rejection so that no value is favoured; independent of
/// `rand`'s own sampling algorithms, which may change between versions.
fn below(rng: &mut ChaCha8Rng, n: usize) -> usize {
    let n = n as u64;
    // The largest multiple of n that fits; values at or above it are redrawn.
    let zone = u64::MAX - (u64::MAX % n);
    loop {
        let x = rng.next_u64();
        if x < zone {
            return (x % n) as usize;
        }
    }
}

/// `true` with probability `p` (never below 0, always above 1), from 53 random bits.
fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    u < p
}

/// Fisher-Yates shuffle with [`below`].
fn shuffle<T>(items: &mut [T], rng: &mut ChaCha8Rng) {
    for i in (1..items.len()).rev() {
        let j = below(rng, i + 1);
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn small() -> SynthConfig {
        SynthConfig { seed: 7, ..SynthConfig::default() }
    }

    fn prompts(pairs: &[SynthPair]) -> HashSet<&str> {
        pairs.iter().map(|p| p.prompt.as_str()).collect()
    }

    #[test]
    fn sizes_and_mix() {
        let data = generate(&small());
        assert_eq!((data.train.len(), data.val.len(), data.test.len()), (2000, 200, 200));
        for split in [&data.train, &data.val, &data.test] {
            let arith = split.iter().filter(|p| matches!(p.kind, TaskKind::Arithmetic { .. })).count();
            assert_eq!(arith * 10, split.len() * 6);
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let a = generate(&small());
        let b = generate(&small());
        assert_eq!(a, b);
        let c = generate(&SynthConfig { seed: 8, ..small() });
        assert_ne!(a.train, c.train);
        // Pinned: the default data must never change silently.
        let d = generate(&SynthConfig::default());
        assert_eq!(
            d.train[0],
            SynthPair {
                prompt: "Q: Excuse me. Can you wash the box?\nA:".into(),
                chosen: " Of course! I will wash the box for you.".into(),
                rejected: " No way. Stop asking me.".into(),
                kind: TaskKind::Politeness,
            }
        );
        assert_eq!(d.val[0].prompt, "Q: Excuse me. Will you carry the window?\nA:");
        assert_eq!(d.test[0].prompt, "Q: Hello. Please open the car.\nA:");
    }

    #[test]
    fn splits_are_disjoint_by_prompt_and_problem() {
        let data = generate(&small());
        let (train, val, test) = (prompts(&data.train), prompts(&data.val), prompts(&data.test));
        assert!(train.is_disjoint(&val));
        assert!(train.is_disjoint(&test));
        assert!(val.is_disjoint(&test));
        // Held-out splits use each prompt once.
        assert_eq!(val.len(), data.val.len());
        assert_eq!(test.len(), data.test.len());
    }

    #[test]
    fn answers_are_right_and_rejected_is_wrong() {
        let data = generate(&small());
        for pair in data.train.iter().chain(&data.val).chain(&data.test) {
            assert_ne!(pair.chosen, pair.rejected);
            assert!(pair.prompt.ends_with("\nA:"));
            assert!(pair.chosen.starts_with(' ') && pair.rejected.starts_with(' '));
            match pair.kind {
                TaskKind::Arithmetic { a, b, op, answer } => {
                    let expected = match op {
                        Op::Add => i64::from(a) + i64::from(b),
                        Op::Sub => i64::from(a) - i64::from(b),
                    };
                    assert_eq!(i64::from(answer), expected);
                    assert!(a <= 20 && b <= 20);
                    assert!(is_correct_answer(&pair.kind, &pair.chosen));
                    assert!(!is_correct_answer(&pair.kind, &pair.rejected));
                    let wrong = first_integer(&pair.rejected).unwrap();
                    assert!(wrong >= 0 && (wrong - expected).abs() <= 3);
                    assert_eq!(arithmetic_kind(&pair.prompt), Some(pair.kind));
                }
                TaskKind::Politeness => {
                    assert_eq!(arithmetic_kind(&pair.prompt), None);
                    assert!(!is_correct_answer(&pair.kind, &pair.chosen));
                }
            }
        }
    }

    #[test]
    fn is_correct_answer_parses_the_first_integer() {
        let kind = TaskKind::Arithmetic { a: 12, b: 5, op: Op::Add, answer: 17 };
        assert!(is_correct_answer(&kind, " 17."));
        assert!(is_correct_answer(&kind, " 17 apples"));
        assert!(is_correct_answer(&kind, "17"));
        assert!(is_correct_answer(&kind, " It is 17, obviously. 3"));
        assert!(!is_correct_answer(&kind, " 16."));
        assert!(!is_correct_answer(&kind, " 170."));
        assert!(!is_correct_answer(&kind, " -17."));
        assert!(!is_correct_answer(&kind, ""));
        assert!(!is_correct_answer(&kind, " seventeen"));
        assert!(!is_correct_answer(&kind, " 99999999999999999999999"));
        assert!(!is_correct_answer(&TaskKind::Politeness, " 17."));
        let zero = TaskKind::Arithmetic { a: 3, b: 3, op: Op::Sub, answer: 0 };
        assert!(is_correct_answer(&zero, " 0."));
        assert_eq!(first_integer("a-5b"), Some(-5));
    }

    #[test]
    fn tiny_pools_do_not_leak_or_panic() {
        let cfg = SynthConfig { max_operand: 0, max_offset: 0, train: 10, val: 4, test: 4, ..small() };
        let data = generate(&cfg);
        // Two arithmetic problems (0 + 0, 0 - 0): none can be held out.
        assert!(data.val.iter().all(|p| matches!(p.kind, TaskKind::Politeness)));
        assert_eq!(data.train.len(), 10);
        for p in &data.train {
            assert_ne!(p.chosen, p.rejected);
        }
        assert!(prompts(&data.train).is_disjoint(&prompts(&data.val)));
        let none = generate(&SynthConfig { train: 0, val: 0, test: 0, ..small() });
        assert!(none.train.is_empty() && none.val.is_empty() && none.test.is_empty());
    }

    #[test]
    fn config_deserialises_with_defaults() {
        let cfg: SynthConfig = serde_json::from_str(r#"{"seed": 3, "train": 10}"#).unwrap();
        assert_eq!(cfg, SynthConfig { seed: 3, train: 10, ..SynthConfig::default() });
        assert!(serde_json::from_str::<SynthConfig>(r#"{"sead": 3}"#).is_err());
    }

    #[test]
    fn politeness_text() {
        let p = Politeness { greeting: 2, form: 1, verb: 0, object: 0 };
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let pair = politeness_pair(p, &mut rng);
        assert_eq!(pair.prompt, "Q: Hello. Could you please fix my bike?\nA:");
        assert!(pair.chosen.contains("fix your bike"), "{}", pair.chosen);
        assert_eq!(capitalize("wash"), "Wash");
    }

    #[test]
    fn jsonl_round_trip_is_byte_stable() {
        let dir = tempfile::tempdir().unwrap();
        let data = generate(&SynthConfig { train: 50, val: 10, test: 10, ..small() });
        let paths = write_splits(&dir.path().join("nested"), &data).unwrap();
        let first = std::fs::read(&paths[0]).unwrap();
        // The data pipeline reads them back: the `kind` key is an extra column it ignores.
        let back = crate::data::load_preferences(&paths[2], &Default::default()).unwrap();
        let prompts: Vec<_> = back.rows.iter().map(|r| r.prompt.clone()).collect();
        let expected: Vec<_> = data.test.iter().map(|p| crate::data::Text::Plain(p.prompt.clone())).collect();
        assert_eq!(prompts, expected);
        write_jsonl(&paths[0], &generate(&SynthConfig { train: 50, val: 10, test: 10, ..small() }).train).unwrap();
        assert_eq!(std::fs::read(&paths[0]).unwrap(), first);
        let line = std::str::from_utf8(&first).unwrap().lines().next().unwrap();
        assert!(line.starts_with("{\"prompt\":\"Q: "), "{line}");
        // No temporary files are left behind.
        let names: Vec<_> =
            std::fs::read_dir(dir.path().join("nested")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // A directory cannot be replaced by a file.
        let err = write_jsonl(dir.path(), &[]).unwrap_err();
        assert_eq!(err.to_string(), format!("cannot write `{}`", dir.path().display()));
    }
}
