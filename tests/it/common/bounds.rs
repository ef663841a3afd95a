//! Tolerances of the numerical tests, derived from the arithmetic each one checks, so that they
//! hold whichever of torch's CPU kernels run it (`ATEN_CPU_CAPABILITY` default / avx2 / avx512,
//! oneDNN's bf16 units or torch's reference gemm; `make test-cpu-paths` runs the suites under
//! each) and on whatever CPU CI draws.
//!
//! **Rounding.** A float type with p significand bits rounds with a relative error of at most
//! its unit round-off u = 2^-p (f32 2^-24, bf16 2^-8, f64 2^-53). A sum of n terms computed in
//! any order is within γ_{n−1}·Σ|terms| of the exact sum (Higham, *Accuracy and Stability of
//! Numerical Algorithms*, §4.2; γ_k = k·u / (1 − k·u)), so two orders differ by at most
//! [`reordered`]`(n) · Σ|terms|`. Kernels for other CPUs differ exactly there: in the order and
//! blocking of their sums, not in the operations.
//!
//! **A forward pass** of products and sums of inner size k_1, k_2, … along its longest chain
//! has a relative error of at most Σ γ_{k_i} to first order, when the terms do not cancel (the
//! fixtures are random models whose terms and results are of one scale). [`chain`] adds them up
//! and [`llama_forward`] lists the chain of one Llama forward; two implementations differ by at
//! most twice that.
//!
//! **AdamW** turns a gradient difference into a parameter difference. Its step direction
//! d = m̂ / (√v̂ + ε), with m̂ and v̂ the bias-corrected moments of the gradients g_1..g_t, obeys
//! |∂d/∂m̂| ≤ 1/ε and |∂d/∂√v̂| ≤ |m̂|/(√v̂+ε)² ≤ √t/(4ε) (Cauchy–Schwarz: |m̂| ≤ √t·√v̂ for
//! β₂ = 0.999 and t ≤ 10), and both moments move by at most max|δg|: so |δd| ≤ (1 + √t/4)·
//! max|δg| / ε. Scaling every gradient by 1 + s (another clipping factor) moves d by at most
//! √t/4·|s|. Each step also rounds p − η(d + λp) twice in f32: 2u·|p|. Summed over the steps
//! ([`Adam::entry`]; curvature, the second-order effect of one step's difference on the next
//! gradient, is left out). With TRL's ε = 1e-8 the constant 1/ε is 1e8: a gradient entry that
//! cancels to its rounding can step either way, a difference of 2η whatever the kernels; the
//! equivalence tests therefore train with ε = 1e-3, where Adam still divides by √v̂ (the clipped
//! gradients' entries are of that size) but a rounding difference cannot flip a step.
//!
//! **The scale of a gradient's terms.** The bounds need the size of the terms a gradient entry
//! sums (the ranks' or micro-batches' partial gradients, the tied embedding's input and head
//! parts). They take it as the clipped global norm `max_grad_norm` (every run here clips: the
//! fixtures' step-1 gradient norm is about 3.8 against 0.5): no partial gradient is larger
//! than the whole step's.

/// A bound on the fixture datasets' longest sequence (prompt and completion): 106 tokens under
/// the fixture tokenizer (`tests/fixtures/data/prefs.jsonl`), rounded up.
pub const FIXTURE_SEQ: usize = 128;

/// f32's unit round-off, 2^-24.
pub const U_F32: f64 = 1.0 / 16_777_216.0;
/// bf16's unit round-off, 2^-8 (8 significand bits).
pub const U_BF16: f64 = 1.0 / 256.0;
/// f64's unit round-off, 2^-53.
pub const U_F64: f64 = f64::EPSILON / 2.0;

/// Higham's γ_k = k·u / (1 − k·u).
pub fn gamma(k: usize, u: f64) -> f64 {
    let ku = k as f64 * u;
    assert!(ku < 1.0, "γ_{k} is unbounded at u = {u}");
    ku / (1.0 - ku)
}

/// How far two evaluations of one sum of `terms` terms, in different orders, can be apart,
/// relative to the sum of the terms' magnitudes: 2·γ_{terms−1}.
pub fn reordered(terms: usize, u: f64) -> f64 {
    2.0 * gamma(terms.saturating_sub(1), u)
}

/// The first-order relative error of a chain of sums of inner sizes `inner`: Σ γ_k.
pub fn chain(inner: &[usize], u: f64) -> f64 {
    inner.iter().map(|&k| gamma(k, u)).sum()
}

/// The longest chain of sums in one Llama forward over `seq` positions, read from a model
/// directory's `config.json`: per layer the RMSNorm (hidden), q/k/v (hidden), the scores
/// (head_dim), softmax and the weighted values (seq, twice), o_proj (heads·head_dim), the second
/// RMSNorm (hidden), gate/up (hidden) and down (intermediate); then the final norm and the head
/// (hidden), and the log-softmax over the vocabulary.
pub fn llama_forward(model_dir: &std::path::Path, seq: usize) -> Vec<usize> {
    let text = std::fs::read_to_string(model_dir.join("config.json")).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    let field = |name: &str| cfg[name].as_u64().unwrap_or_else(|| panic!("config.json: {name}")) as usize;
    let (hidden, heads, layers) = (field("hidden_size"), field("num_attention_heads"), field("num_hidden_layers"));
    let head_dim = cfg["head_dim"].as_u64().map_or(hidden / heads, |d| d as usize);
    let layer = [hidden, hidden, head_dim, seq, seq, heads * head_dim, hidden, hidden, field("intermediate_size")];
    let mut inner: Vec<usize> = (0..layers).flat_map(|_| layer).collect();
    inner.extend([hidden, hidden, field("vocab_size")]);
    inner
}

/// Two implementations of one f32 Llama forward over `seq` positions: their outputs differ by
/// at most twice the chain's error, relative to the outputs' scale.
pub fn llama_logits(model_dir: &std::path::Path, seq: usize) -> f64 {
    2.0 * chain(&llama_forward(model_dir, seq), U_F32)
}

/// The AdamW settings of the runs a test compares, for [`Adam::entry`] and [`Adam::norm`].
#[derive(Debug, Clone, Copy)]
pub struct Adam {
    /// The peak learning rate (every step's rate is at most this).
    pub lr: f64,
    pub eps: f64,
    pub steps: u32,
    /// The clipped global gradient norm: the scale of every gradient's terms.
    pub max_grad_norm: f64,
    /// Trainable entries (the clipping norm's sum of squares has that many terms).
    pub params: usize,
    /// The largest parameter magnitude (each step's rounding is relative to it).
    pub p_max: f64,
}

impl Adam {
    /// AdamW at `lr`, `eps` and `max_grad_norm` for `steps` steps, on parameters like `params`
    /// (their count and largest magnitude).
    pub fn on(lr: f64, eps: f64, max_grad_norm: f64, steps: u32, params: &[(String, Vec<f32>)]) -> Self {
        Self { lr, eps, steps, max_grad_norm, params: entries(params), p_max: largest(params) }
    }

    /// The largest difference of one parameter after `steps`, when each step's clipped
    /// gradient entries differ by at most `dg` (absolute) between the two runs.
    pub fn entry(&self, dg: f64) -> f64 {
        self.entry_with_clip(dg, 0.0)
    }

    /// [`Adam::entry`] when the clipping factors also differ by a relative `dc` for a reason of
    /// their own (a part of the gradient summed in bf16 by one run only).
    pub fn entry_with_clip(&self, dg: f64, dc: f64) -> f64 {
        assert!(self.steps <= 10, "the moments' bound |m̂| ≤ √t·√v̂ is derived for t ≤ 10");
        let clip = self.clip_factor(dg * (self.params as f64).sqrt()) + dc;
        (1..=self.steps)
            .map(|t| {
                let t = f64::from(t);
                self.lr * ((1.0 + t.sqrt() / 4.0) * dg / self.eps + t.sqrt() / 4.0 * clip) + 2.0 * U_F32 * self.p_max
            })
            .sum()
    }

    /// The largest L2 distance of the parameter vectors after `steps`, when each step's clipped
    /// gradients are at most `dg2` apart in L2.
    pub fn norm(&self, dg2: f64) -> f64 {
        assert!(self.steps <= 10, "the moments' bound |m̂| ≤ √t·√v̂ is derived for t ≤ 10");
        let root_n = (self.params as f64).sqrt();
        let clip = self.clip_factor(dg2);
        (1..=self.steps)
            .map(|t| {
                let t = f64::from(t);
                self.lr * ((1.0 + t.sqrt() / 4.0) * dg2 / self.eps + root_n * t.sqrt() / 4.0 * clip)
                    + 2.0 * U_F32 * self.p_max * root_n
            })
            .sum()
    }

    /// The relative difference of the two runs' clipping factors max_grad_norm / ‖g‖: the sum of
    /// squares over every entry in another order, and gradients `dg2` apart in L2 (‖g‖ is at
    /// least max_grad_norm when the factor applies).
    fn clip_factor(&self, dg2: f64) -> f64 {
        gamma(self.params, U_F32) + dg2 / self.max_grad_norm
    }

    /// The bound on a parameter difference that Adam cannot exceed whatever the gradients: each
    /// step moves an entry by at most η·√t (|m̂| ≤ √t·√v̂) plus the decay, in either direction.
    pub fn any_gradients(&self, weight_decay: f64) -> f64 {
        (1..=self.steps).map(|t| 2.0 * self.lr * (f64::from(t).sqrt() + weight_decay * self.p_max)).sum()
    }
}

/// The largest magnitude among the tensors' entries.
pub fn largest(tensors: &[(String, Vec<f32>)]) -> f64 {
    tensors.iter().flat_map(|(_, v)| v.iter()).fold(0f32, |m, x| m.max(x.abs())) as f64
}

/// The number of entries among the tensors.
pub fn entries(tensors: &[(String, Vec<f32>)]) -> usize {
    tensors.iter().map(|(_, v)| v.len()).sum()
}

/// The L2 distance of two tensor lists of the same names.
pub fn l2_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f64 {
    let squares = a.iter().zip(b).flat_map(|((_, x), (_, y))| x.iter().zip(y).map(|(p, q)| f64::from(p - q).powi(2)));
    squares.sum::<f64>().sqrt()
}

/// Metrics logged from bit-identical per-pair values (the same parameters and micro-batches),
/// averaged over at most `pairs` values in f64 in another order: they differ by at most
/// reordered(pairs) · the largest value magnitude.
pub fn reordered_means(pairs: usize, largest: f64) -> f64 {
    reordered(pairs, U_F64) * largest.max(1.0)
}

/// How far two computations of one step's DPO gradient can be apart, relative to the terms'
/// scale (the clipped norm), when they run the same arithmetic over other batch shapes or
/// layouts (micro-batches of other sizes, packed or padded rows, a reference scored in other
/// batches), on sequences of at most `seq` positions and `tokens` positions a step:
/// - each run's forward and backward chains (twice [`chain`] of the forward), and the step's
///   tokens summed into every weight's gradient (γ_tokens);
/// - each pair's loss weight β·σ(−β·h): log σ is 1-Lipschitz, so the weight moves relatively by
///   at most β·|δh|, and the margin h adds four log-probs, each of at most `logp` in size and off
///   by the forward chain's relative error.
///
/// Twice that: two runs.
pub fn dpo_gradient(model_dir: &std::path::Path, seq: usize, tokens: usize, beta: f64, logp: f64) -> f64 {
    let forward = chain(&llama_forward(model_dir, seq), U_F32);
    2.0 * (2.0 * forward + gamma(tokens, U_F32) + beta * 4.0 * logp * forward)
}

/// The largest size of one pair's log-prob in a logged row: log-probs are all negative, so one
/// pair's is at most the `pairs` pairs' mean times `pairs`.
pub fn largest_logp(row: &dpo_train::train::log::MetricsRow, pairs: usize) -> f64 {
    let mean = |name: &str| row.metric(name).unwrap_or_else(|| panic!("no {name} logged")).abs();
    mean("logps/chosen").max(mean("logps/rejected")) * pairs as f64
}

/// How far a metric TRL logs (TRL's names) can be from TRL's own value for the same pairs and
/// models, when both compute in f32 with their own kernels: the log-probs' means are off by at
/// most `forward` relative (log-probs are negative: no cancellation); every other metric (the
/// losses, rewards, margins, accuracies, logits) is a function of the four log-probs of each pair
/// whose derivative in the margin is at most 1 + |metric| for every TRL loss (β·σ ≤ 1 for the
/// sigmoid family; 2·√ℓ ≤ 1 + ℓ for the squared ones, IPO's and SPPO's), so it is off by at most
/// `forward` · (the four log-probs' sizes) · (1 + |metric|). `metrics` holds TRL's values.
/// `mean_token_accuracy` counts argmaxes: a token's flips only where its two largest logits lie
/// within `forward` of each other, which the fixture's models do not hold, so the counts must be
/// TRL's; TRL divides them in f32 (one rounding, `u`).
pub fn trl_metric(name: &str, want: f64, metrics: &dyn Fn(&str) -> Option<f64>, beta: f64, forward: f64) -> f64 {
    if name.starts_with("logps/") {
        return forward * want.abs();
    }
    if name == "mean_token_accuracy" {
        return U_F32 * want.abs();
    }
    let logp = |side: &str| metrics(&format!("logps/{side}")).unwrap_or(0.0).abs();
    let reference = |side: &str| {
        let reward = metrics(&format!("rewards/{side}")).unwrap_or(0.0);
        (metrics(&format!("logps/{side}")).unwrap_or(0.0) - reward / beta).abs()
    };
    let sizes = logp("chosen") + logp("rejected") + reference("chosen") + reference("rejected");
    forward * sizes.max(1.0) * (1.0 + want.abs())
}

/// [`llama_logits`] for a model with LoRA adapters of rank `r`: each adapted linear on the chain
/// (q/k/v, o, gate/up, down: four per layer) adds a rank-r product to its sum (γ_r) and one
/// rounding of the addition (u); a merged model rounds W + s·BA once instead (u).
pub fn lora_logits(model_dir: &std::path::Path, seq: usize, r: usize) -> f64 {
    let layers = llama_forward(model_dir, seq).len().saturating_sub(3) / 9;
    llama_logits(model_dir, seq) + 2.0 * (4 * layers) as f64 * (gamma(r, U_F32) + 2.0 * U_F32)
}

/// A Llama forward in a half-precision type of unit round-off `u` against f32, relative to the
/// logits' scale: every product of the chain takes operands rounded to half (u each) and rounds
/// its f32-accumulated output (u, and γ_k of f32), and each layer rounds four elementwise results
/// (rotary, activation, the two residual additions).
pub fn half_logits(model_dir: &std::path::Path, seq: usize, u: f64) -> f64 {
    let inner = llama_forward(model_dir, seq);
    let layers = inner.len().saturating_sub(3) / 9;
    inner.iter().map(|&k| 3.0 * u + gamma(k, U_F32)).sum::<f64>() + (4 * layers) as f64 * u
}
