//! dpo-config: the training configuration: TOML files in `configs/` whose keys are TRL's `DPOConfig` /
//! transformers' `TrainingArguments` names wherever one exists, so a TRL config ports line by line.
//!
//! Every key is declared once, in [`train_config!`], which yields the serde struct, its defaults,
//! its documentation and a kebab-case CLI flag (`per_device_train_batch_size` →
//! `--per-device-train-batch-size`). The defaults are TRL 1.16's `DPOConfig` defaults wherever TRL
//! has the key (a key the user leaves out behaves as in TRL); the demo's settings live in
//! `configs/demo.toml` and apply only to the demo. [`layers`] stacks defaults, a file and flags,
//! remembers where each value came from, and validates once; the rest of the program only reads
//! the result.

pub mod hub;
pub mod keys;
pub mod layers;
pub mod lora;
pub mod loss;
mod parse;
pub mod plan;
pub mod reference;
pub mod resume;
mod steps;
pub mod trl;
mod validate;
pub mod yaml;

pub use keys::{FlagValue, KeyDoc, Section};
pub use layers::{ConfigFile, Layered, Origin};
pub use lora::LoraSettings;
pub use loss::{FDivergence, LossConfigError, LossType};
pub use plan::{Rows, RunPlan, ScheduleSpec, Truncation, Warmup};
pub use steps::Steps;
pub use validate::{MAX_LENGTH_TOO_SHORT, MIN_MAX_LENGTH, truncation_keeps_end};

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use dpo_vocab::{Precision, Sharding};
pub(crate) use parse::{line_of, toml_error};

/// Errors in a config file or a flag, each naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}`, line {line}: {message}")]
    Toml { path: String, line: usize, message: String },
    #[error("`--{flag}`: {message}")]
    Flag { flag: String, message: String },
    #[error("`{key}`: {message}")]
    Invalid { key: &'static str, message: String },
    /// An invalid value, located where the user set it: `` `c.toml`, line 3: `beta` `` or
    /// `` `--beta` ``.
    #[error("{place}: {message}")]
    At { place: String, key: &'static str, message: String },
}

/// A loss setting out of range is an invalid value of its key (located where it was set by
/// [`Layered::validate`]).
impl From<LossConfigError> for ConfigError {
    fn from(e: LossConfigError) -> Self {
        ConfigError::Invalid { key: e.key, message: e.message }
    }
}

/// The learning-rate schedule after warm-up (transformers' `lr_scheduler_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedulerType {
    /// The peak throughout: transformers' `get_constant_schedule`, which takes no warm-up.
    Constant,
    /// The warm-up, then the peak.
    ConstantWithWarmup,
    Linear,
    Cosine,
    CosineWithMinLr,
}

/// Whether a run writes checkpoints (transformers' `save_strategy`, in the two values TRL's
/// scripts use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveStrategy {
    /// Every `save_steps` steps and at the end.
    Steps,
    /// None, as transformers saves none: only a run stopped by Ctrl-C writes one, to resume from.
    No,
}

/// The order an epoch visits the training rows (transformers' `train_sampling_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplingStrategy {
    /// A permutation an epoch, drawn from the data seed and the epoch.
    Random,
    /// The data's own order every epoch.
    Sequential,
}

/// How the learning rate follows the number of data-parallel workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrScaling {
    /// The configured rate as is.
    None,
    /// × world size (Goyal et al. 2017).
    Linear,
    /// × √world size (Malladi et al. 2022, for Adam).
    Sqrt,
}

impl LrScaling {
    /// The factor for `world_size` workers.
    pub fn factor(self, world_size: usize) -> f64 {
        match self {
            Self::None => 1.0,
            Self::Linear => world_size as f64,
            Self::Sqrt => (world_size as f64).sqrt(),
        }
    }
}

/// How gradient buckets travel between workers (DDP's communication hook, TRL's
/// `ddp_comm_hook`): as they are, or in half precision, halving the bytes sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommHook {
    None,
    /// torch's `bf16_compress_hook`.
    Bf16,
    /// torch's `fp16_compress_hook`.
    Fp16,
}

impl std::fmt::Display for LrScaling {
    /// The config's spelling (`none`, `linear`, `sqrt`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Linear => "linear",
            Self::Sqrt => "sqrt",
        })
    }
}

macro_rules! train_config {
    (
        run { $( #[doc = $doc:literal] $name:ident : $ty:ty = $default:expr, )* }
        loss { $( #[doc = $ldoc:literal] $lname:ident : $lty:ty = $ldefault:expr, )* }
        rest { $( #[doc = $rdoc:literal] $rname:ident : $rty:ty = $rdefault:expr, )* }
    ) => {
        /// The effective configuration of a run (see the module doc).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct TrainConfig {
            $( #[doc = $doc] pub $name: $ty, )*
            /// The loss keys, flat in the file as in TRL.
            #[serde(flatten)]
            pub loss: LossConfig,
            $( #[doc = $rdoc] pub $rname: $rty, )*
        }

        /// Everything that shapes the DPO loss (validated by [`LossConfig::validate`]); its keys are
        /// [`TrainConfig`]'s too, and `dpo-train eval`'s flags.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct LossConfig {
            $( #[doc = $ldoc] pub $lname: $lty, )*
        }

        impl Default for TrainConfig {
            fn default() -> Self {
                Self { $( $name: $default, )* loss: LossConfig::default(), $( $rname: $rdefault, )* }
            }
        }

        impl Default for LossConfig {
            fn default() -> Self {
                Self { $( $lname: $ldefault, )* }
            }
        }

        /// Every key, in declaration order.
        pub const KEYS: &[KeyDoc] = &[
            $( key_doc!($name, $ty, $doc, Section::Run), )*
            $( key_doc!($lname, $lty, $ldoc, Section::Loss), )*
            $( key_doc!($rname, $rty, $rdoc, Section::Run), )*
        ];

        fn parse_key(key: &str, text: &str) -> Option<Result<toml::Value, String>> {
            match key {
                $( stringify!($name) => Some(<$ty as FlagValue>::parse_flag(text)), )*
                $( stringify!($lname) => Some(<$lty as FlagValue>::parse_flag(text)), )*
                $( stringify!($rname) => Some(<$rty as FlagValue>::parse_flag(text)), )*
                _ => None,
            }
        }
    };
}

macro_rules! key_doc {
    ($name:ident, $ty:ty, $doc:literal, $section:expr) => {
        KeyDoc {
            name: stringify!($name),
            kind: <$ty as FlagValue>::KIND,
            doc: $doc,
            is_bool: <$ty as FlagValue>::IS_BOOL,
            section: $section,
        }
    };
}

train_config! {
    run {
    // --- model and data ---
    /// Policy to train (required): a Hugging Face directory, a PEFT LoRA adapter directory (its training continues), a Hub name the local Hugging Face cache holds (`Qwen/Qwen2.5-0.5B`: its snapshot of `main`), or `demo` for the embedded demo.
    model_name_or_path: String = String::new(),
    /// Reference model directory, or a Hub name in the local Hugging Face cache [default: a frozen copy of the starting policy].
    ref_model_name_or_path: Option<PathBuf> = None,
    /// Directory with tokenizer.json, or a Hub name in the local Hugging Face cache [default: the policy's directory].
    tokenizer_name_or_path: Option<PathBuf> = None,
    /// Training preference data (required): .jsonl, .json, .csv, .tsv (each optionally .gz), .parquet, .arrow, a dataset directory as the hub lays it out or as `save_to_disk` wrote it (its `dataset_train_split`), a dataset's Hub name the local Hugging Face cache holds, or `demo` for the synthetic demo task.
    train_file: String = String::new(),
    /// Held-out data for evaluations and samples, a file, a dataset directory (its `dataset_test_split`) or a cached dataset's Hub name [default: none: no evaluation].
    eval_file: Option<String> = None,
    /// Test data, scored and sampled once at the end (a directory: its `dataset_test_split`).
    test_file: Option<String> = None,
    /// The split `train_file` reads when it is a dataset directory (TRL's script argument).
    dataset_train_split: String = "train".to_owned(),
    /// The split `eval_file` and `test_file` read when they are dataset directories.
    dataset_test_split: String = "test".to_owned(),
    /// The configuration a dataset directory's card (its README's `configs`) names, whose files are read (TRL's script argument) [default: the card's default configuration].
    dataset_config: Option<String> = None,
    /// Column holding the prompt.
    prompt_column: String = "prompt".to_owned(),
    /// Column holding the preferred completion.
    chosen_column: String = "chosen".to_owned(),
    /// Column holding the dispreferred completion.
    rejected_column: String = "rejected".to_owned(),
    /// Skip malformed rows (and report their lines) instead of stopping.
    skip_bad_rows: bool = false,
    /// Tokens kept per sequence, prompt included (which part: truncation_mode).
    max_length: usize = 1024,
    /// keep_start, TRL's default: a sequence over max_length keeps its start; keep_end (deprecated in TRL 1.16, which still implements it): its end, and no row is dropped for a long prompt.
    truncation_mode: String = "keep_start".to_owned(),
    /// Threads that tokenise the data (TRL's processes for it); unset: every core of the process.
    dataset_num_proc: Option<usize> = None,
    }
    loss {
    // --- DPO ---
    /// Temperature of the implicit reward.
    beta: f64 = 0.1,
    /// Loss types, summed with `loss_weights`.
    loss_type: Vec<LossType> = vec![LossType::Sigmoid],
    /// One weight per loss type [default: 1 each].
    loss_weights: Vec<f64> = Vec::new(),
    /// ε of robust, exo_pair and aot.
    label_smoothing: f64 = 0.0,
    /// reverse_kl, forward_kl, js_divergence or alpha_divergence.
    f_divergence_type: FDivergence = FDivergence::ReverseKl,
    /// α of alpha_divergence.
    f_alpha_divergence_coef: f64 = 0.5,
    /// LD-DPO weight of the tokens past the shorter completion.
    ld_alpha: Option<f64> = None,
    /// τ of discopop.
    discopop_tau: f64 = 0.05,
    /// WPO weighting of each pair by the policy's own probability.
    use_weighting: bool = false,
    /// Train without a reference model (reference log-probs taken as 0).
    reference_free: bool = false,
    // --- the reference-free family (TRL's CPOConfig and ORPOConfig) ---
    /// Weight of the NLL of the chosen completions in cpo and simpo (CPO's BC regulariser; 0 for pure SimPO).
    cpo_alpha: f64 = 1.0,
    /// SimPO's target reward margin γ (simpo, alphapo).
    simpo_gamma: f64 = 0.5,
    /// AlphaPO's reward shape α for cpo, simpo and alphapo: r = (1 - p^(-α)) / α; 0: the log-prob itself.
    alpha: f64 = 0.0,
    // --- KTO (TRL's KTOConfig) ---
    /// KTO: weight of the desirable rows' losses (raise it when they are the fewer).
    desirable_weight: f64 = 1.0,
    /// KTO: weight of the undesirable rows' losses.
    undesirable_weight: f64 = 1.0,
    /// KTO: train on preference pairs, each as a desirable (chosen) and an undesirable (rejected) row, as TRL's unpair_preference_dataset.
    unpair: bool = false,
    }
    rest {
    /// Compute the reference log-probs once before training (cached on disk) and free the reference.
    precompute_ref_log_probs: bool = false,
    // --- LoRA, precision, memory ---
    /// LoRA rank: setting it trains low-rank adapters on a frozen base instead of every weight.
    lora_r: Option<usize> = None,
    /// LoRA α: the adapters' update is scaled by lora_alpha / lora_r.
    lora_alpha: f64 = 32.0,
    /// Rank-stabilised LoRA (rsLoRA): scale the adapters' update by lora_alpha / sqrt(lora_r) instead of lora_alpha / lora_r (PEFT's and TRL's `use_rslora`; adapter_config.json records it).
    use_rslora: bool = false,
    /// DoRA: a trained magnitude rescales each output column of every adapted weight to m / ‖W + A·B·scale‖ (PEFT's and TRL's `use_dora`; adapter_config.json records it). Each step computes every adapted weight whole, so it costs more time and memory than LoRA.
    use_dora: bool = false,
    /// Dropout on the adapters' input during training (applied only with `disable_dropout = false`; adapter_config.json records it either way, as PEFT).
    lora_dropout: f64 = 0.05,
    /// Projections given adapters: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj or all-linear, or one layer's (model.layers.3.self_attn.q_proj) [default: q_proj,v_proj].
    lora_target_modules: Vec<String> = Vec::new(),
    /// Train without dropout, as TRL: the LoRA adapters' dropout is 0 whatever `lora_dropout` says (dpo-train's models apply no other dropout; config.json's attention_dropout is not read).
    disable_dropout: bool = true,
    /// With LoRA, also write final/merged: the base with the adapters folded in, as a full HF model.
    merge: bool = false,
    /// bfloat16 mixed precision: half-precision weights and activations over f32 master weights and optimizer state [default: true unless fp16, as TRL].
    bf16: Option<bool> = None,
    /// float16 mixed precision, with dynamic loss scaling.
    fp16: bool = false,
    /// TF32 for the matrix products and convolutions done in f32 on CUDA (Ampere and newer), as transformers' `tf32`; `true` needs a CUDA device [default: unset, torch's default: off].
    tf32: Option<bool> = None,
    /// Recompute each decoder layer's activations in the backward pass instead of keeping them (TRL's default: on).
    gradient_checkpointing: bool = true,
    /// Pack each micro-batch's sequences into one row without padding: positions restart at each sequence and attention never crosses one, so the log-probs are the padded rows' (TRL's key).
    padding_free: bool = true,
    /// With padding_free, write each pair's prompt once: the rejected completion attends to the prompt it shares with the chosen one (prefix sharing); the same log-probs, fewer tokens. Off while LoRA dropout trains (`disable_dropout = false`: one dropout mask would serve both rows).
    prefix_sharing: bool = true,
    // --- optimisation ---
    /// Peak learning rate of AdamW (> 0).
    learning_rate: f64 = 1e-6,
    /// Decoupled weight decay, on the parameters transformers decays: every one but biases and norms (embeddings and the head included).
    weight_decay: f64 = 0.0,
    /// AdamW β1.
    adam_beta1: f64 = 0.9,
    /// AdamW β2.
    adam_beta2: f64 = 0.999,
    /// AdamW ε.
    adam_epsilon: f64 = 1e-8,
    /// Clip gradients to this global L2 norm (0 disables clipping).
    max_grad_norm: f64 = 1.0,
    /// constant (no warm-up, as transformers' constant takes none), constant_with_warmup, linear, cosine or cosine_with_min_lr.
    lr_scheduler_type: SchedulerType = SchedulerType::Linear,
    /// Final learning rate of cosine_with_min_lr, as a fraction of the peak.
    min_lr_rate: f64 = 0.1,
    /// Linear warm-up, as transformers 5 reads it: steps (1 or more; the whole part), or a fraction of the training steps (below 1); takes precedence over warmup_ratio.
    warmup_steps: f64 = 0.0,
    /// Linear warm-up as a fraction of the training steps (transformers 4's key; transformers 5 writes the fraction as warmup_steps).
    warmup_ratio: f64 = 0.0,
    /// Pairs per device per micro-batch.
    per_device_train_batch_size: usize = 8,
    /// Pairs per device per evaluation batch.
    per_device_eval_batch_size: usize = 8,
    /// Micro-batches accumulated into one optimizer step.
    gradient_accumulation_steps: usize = 1,
    /// Pairs per optimizer step over all devices; when set, split into micro-batch × devices × accumulation.
    global_batch_size: Option<usize> = None,
    /// none, linear or sqrt: scale learning_rate by the number of data-parallel workers.
    lr_scaling: LrScaling = LrScaling::None,
    /// Gradient all-reduce bucket size in MB (one collective per bucket).
    ddp_bucket_cap_mb: usize = 25,
    /// none, bf16 or fp16: send gradient buckets in half precision (divided by the world size first, as torch's compress hooks).
    ddp_comm_hook: CommHook = CommHook::None,
    /// none, zero1 (AdamW moments partitioned over the workers), zero2 (and gradients reduce-scattered) or zero3 (and parameters, gathered one layer at a time).
    sharding: Sharding = Sharding::None,
    /// accelerate/TRL's spelling of the sharding: `shard_grad_op` is zero2, `full_shard` zero3.
    fsdp: String = String::new(),
    /// Seconds a rendezvous or collective may wait for a peer before the job fails.
    ddp_timeout: u64 = 1800,
    /// Keep AdamW's moments and the fp32 master weights in host memory and run the update there; the device keeps the compute dtype's copy (DeepSpeed's offload_optimizer).
    offload_optimizer: bool = false,
    /// Passes over the training data (fractions allowed).
    num_train_epochs: f64 = 3.0,
    /// Optimizer steps; overrides num_train_epochs when positive.
    max_steps: i64 = -1,
    /// Supervised warm-up steps on the chosen completions before DPO (0: none).
    sft_steps: u64 = 0,
    /// Learning rate of the supervised warm-up.
    sft_learning_rate: f64 = 1e-4,
    /// Seed of initialisation, data order and sampling.
    seed: u64 = 42,
    /// Seed of the training data's order alone, as transformers' `data_seed` [default: seed].
    data_seed: Option<u64> = None,
    /// random: each epoch a permutation drawn from data_seed; sequential: the data's order every epoch [default: sequential for the DPO stage under kto and apo_zero_unpaired, as TRL's KTOConfig (kto's KL rows pair each row with its neighbours' completions and need it), else random].
    train_sampling_strategy: Option<SamplingStrategy> = None,
    // --- reporting ---
    /// Log (console, metrics.csv) every this many optimizer steps; a number in (0, 1) is that share of the stage's steps, rounded up (transformers' ratio).
    logging_steps: Steps = Steps::Every(10),
    /// Also log the first step (transformers' `logging_first_step`).
    logging_first_step: bool = false,
    /// Evaluate every this many steps, or that share of them as `logging_steps` [default: logging_steps]; 0 disables periodic evaluation.
    eval_steps: Option<Steps> = None,
    /// Also evaluate before the first step (the policy still equals the reference there).
    eval_on_start: bool = false,
    /// No periodic evaluation before this step (transformers' `eval_delay`, in steps as `eval_strategy = "steps"` counts it); `eval_on_start` is not delayed.
    eval_delay: f64 = 0.0,
    /// Save a checkpoint every this many steps, or that share of them as `logging_steps` (0: only at the end and on Ctrl-C).
    save_steps: Steps = Steps::Every(500),
    /// `steps`: checkpoints every `save_steps` and at the end; `no`: none (transformers' `save_strategy = "no"`), but the one a Ctrl-C writes to resume from. `final/` is written either way.
    save_strategy: SaveStrategy = SaveStrategy::Steps,
    /// Checkpoints kept (oldest deleted first) [default: all].
    save_total_limit: Option<usize> = None,
    /// Where else to log: `tensorboard` (event files under `logging_dir`), `wandb` (Weights & Biases, through the `wandb` package of a python that has it), `all` (TensorBoard, and W&B where a python imports wandb, as transformers takes every integration installed), or none [default: none, as TRL].
    report_to: Vec<String> = Vec::new(),
    /// TensorBoard's directory, one subdirectory per stage [default: <run>/runs].
    logging_dir: Option<PathBuf> = None,
    /// Parent of the run directory.
    output_dir: PathBuf = PathBuf::from("results"),
    /// Run directory name [default: date-time plus config name].
    run_name: Option<String> = None,
    /// Held-out prompts sampled into samples_val.txt and samples_test.txt.
    num_samples: usize = 8,
    /// Tokens generated per sample.
    max_new_tokens: usize = 32,
    }
}

impl TrainConfig {
    /// The TensorBoard directory of the run in `run_dir`, when `report_to` asks for TensorBoard.
    pub fn tensorboard_dir(&self, run_dir: &Path) -> Option<PathBuf> {
        let wanted = self.report_to.iter().any(|r| r == "tensorboard" || r == "all");
        wanted.then(|| self.logging_dir.clone().unwrap_or_else(|| run_dir.join("runs")))
    }

    /// Whether `report_to` asks for Weights & Biases: `Some(true)` by name, `Some(false)` through
    /// `all` (where it is installed), `None` not at all.
    pub fn reports_to_wandb(&self) -> Option<bool> {
        let named = self.report_to.iter().any(|r| r == "wandb");
        (named || self.report_to.iter().any(|r| r == "all")).then_some(named)
    }

    /// The LoRA adapter to train; `None` for full fine-tuning.
    /// Under `disable_dropout` its training dropout is 0 (see [`LoraSettings::set_dropout`]).
    pub fn lora(&self) -> Result<Option<LoraSettings>, (&'static str, String)> {
        let Some(r) = self.lora_r else { return Ok(None) };
        let mut settings = LoraSettings::new(r, self.lora_alpha, self.lora_dropout, &self.lora_target_modules)?;
        settings.set_dropout(self.lora_dropout, self.disable_dropout);
        settings.use_rslora = self.use_rslora;
        settings.use_dora = self.use_dora;
        Ok(Some(settings))
    }

    /// Whether bf16 mixed precision is on: as set, else on unless fp16 is (TRL's `bf16 = not fp16`).
    pub fn bf16(&self) -> bool {
        self.bf16.unwrap_or(!self.fp16)
    }

    /// The precision of weights and activations in the forward pass (master weights stay f32).
    pub fn precision(&self) -> Precision {
        Precision::of_keys(self.bf16(), self.fp16)
    }

    /// Whether step `step` of a stage of `last` steps logs: every `logging_steps`, the last one,
    /// and the first under `logging_first_step`.
    pub fn logs_at(&self, step: u64, last: u64) -> bool {
        step.is_multiple_of(self.logging_steps.of(last)) || step == last || (self.logging_first_step && step == 1)
    }

    /// Whether a stage (the supervised warm-up, else the preference stage) visits the rows in the
    /// data's order: `train_sampling_strategy`, else KTO's default (sequential, as TRL's
    /// `KTOConfig`: its KL rows are each block's completions rotated) for the preference stage.
    pub fn sequential_order(&self, warm_up: bool) -> bool {
        match self.train_sampling_strategy {
            Some(strategy) => strategy == SamplingStrategy::Sequential,
            None => !warm_up && self.loss.is_kto(),
        }
    }

    /// The seed of the training data's order: `data_seed`, else `seed`.
    pub fn data_order_seed(&self) -> u64 {
        self.data_seed.unwrap_or(self.seed)
    }

    /// Whether step `step` of a stage of `last` steps evaluates: every `eval_steps` and the last
    /// step, from `eval_delay` on (transformers' `DefaultFlowCallback`, which compares it with the
    /// step).
    pub fn evaluates_at(&self, step: u64, last: u64) -> bool {
        let every = self.eval_every(last);
        every > 0 && (step.is_multiple_of(every) || step == last) && self.eval_delay <= step as f64
    }

    /// Evaluation cadence in steps of a stage of `last` steps (0: never during training).
    pub fn eval_every(&self, last: u64) -> u64 {
        self.eval_steps.unwrap_or(self.logging_steps).of(last)
    }

    /// Whether step `step` of a stage of `last` steps writes a periodic checkpoint: every
    /// `save_steps` under `save_strategy = "steps"`, before the last (the end writes its own).
    pub fn saves_at(&self, step: u64, last: u64) -> bool {
        let every = self.save_steps.of(last);
        self.save_strategy == SaveStrategy::Steps && every > 0 && step.is_multiple_of(every) && step < last
    }

    /// The config as TOML, as saved in the run directory and every checkpoint: with the paths
    /// made absolute, so `--resume` from another working directory (a scheduler's) reads the same
    /// model, tokenizer and data.
    pub fn to_toml(&self) -> String {
        toml::to_string(&self.with_absolute_paths()).unwrap_or_else(|e| format!("# cannot serialise the config: {e}\n"))
    }

    /// Each relative path that names an existing file or directory, made absolute; other values
    /// (`demo`, a Hub dataset's name, a file not there yet) as they are.
    pub(crate) fn with_absolute_paths(&self) -> Self {
        let absolute = |p: &Path| p.is_relative().then(|| std::fs::canonicalize(p).ok()).flatten();
        let fix = |s: &mut String| {
            if let Some(a) = absolute(Path::new(s.as_str())).and_then(|a| a.to_str().map(str::to_owned)) {
                *s = a;
            }
        };
        let fix_path = |p: &mut PathBuf| {
            if let Some(a) = absolute(p) {
                *p = a;
            }
        };
        let mut cfg = self.clone();
        fix(&mut cfg.model_name_or_path);
        fix(&mut cfg.train_file);
        cfg.eval_file.iter_mut().chain(cfg.test_file.iter_mut()).for_each(fix);
        let paths = [&mut cfg.ref_model_name_or_path, &mut cfg.tokenizer_name_or_path, &mut cfg.logging_dir];
        paths.into_iter().flatten().for_each(fix_path);
        fix_path(&mut cfg.output_dir);
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The steps of a 25-step stage where `at` holds under the config `text`.
    fn steps_where(text: &str, at: impl Fn(&TrainConfig, u64) -> bool) -> Vec<u64> {
        let cfg = TrainConfig::from_toml_str(text, "t.toml").unwrap();
        (1..=25).filter(|&s| at(&cfg, s)).collect()
    }

    /// Every `logging_steps`, the last step, and step 1 too under `logging_first_step`, as
    /// transformers' `DefaultFlowCallback` decides.
    #[test]
    fn logging_steps_and_the_first_step() {
        let logged = |text| steps_where(text, |cfg, s| cfg.logs_at(s, 25));
        assert_eq!(logged("logging_steps = 10\n"), [10, 20, 25]);
        assert_eq!(logged("logging_steps = 10\nlogging_first_step = true\n"), [1, 10, 20, 25]);
    }

    /// Every `eval_steps` and the last step, none before `eval_delay`.
    #[test]
    fn evaluation_steps_and_their_delay() {
        let evaluated = |text| steps_where(text, |cfg, s| cfg.evaluates_at(s, 25));
        assert_eq!(evaluated("eval_steps = 10\n"), [10, 20, 25]);
        assert_eq!(evaluated("eval_steps = 10\neval_delay = 20\n"), [20, 25]);
        assert_eq!(evaluated("eval_steps = 10\neval_delay = 20.5\n"), [25]);
        assert!(evaluated("eval_strategy = \"no\"\n").is_empty());
    }

    /// A step count in (0, 1) is transformers' share of the stage's steps, rounded up (25 x 0.1:
    /// every 3rd); `eval_steps` takes `logging_steps`' share when unset; a checkpoint every
    /// `save_steps` before the last step.
    #[test]
    fn shares_of_the_stage_s_steps() {
        let logged = |text| steps_where(text, |cfg, s| cfg.logs_at(s, 25));
        assert_eq!(logged("logging_steps = 0.1\n"), [3, 6, 9, 12, 15, 18, 21, 24, 25]);
        let evaluated = |text| steps_where(text, |cfg, s| cfg.evaluates_at(s, 25));
        assert_eq!(evaluated("logging_steps = 0.2\n"), [5, 10, 15, 20, 25]);
        assert_eq!(evaluated("logging_steps = 0.2\neval_steps = 0.5\n"), [13, 25]);
        let saved = |text| steps_where(text, |cfg, s| cfg.saves_at(s, 25));
        assert_eq!(saved("save_steps = 0.3\n"), [8, 16, 24]);
        assert_eq!(saved("save_steps = 10\n"), [10, 20]);
        assert!(saved("save_steps = 0.3\nsave_strategy = \"no\"\n").is_empty());
        let refused = TrainConfig::from_toml_str("save_steps = 2.5\n", "t.toml").unwrap_err().to_string();
        assert!(refused.contains("must be a whole number of steps, or a share"), "{refused}");
    }

    #[test]
    fn the_data_order_follows_data_seed_else_seed() {
        let cfg = |text: &str| TrainConfig::from_toml_str(text, "t.toml").unwrap();
        assert_eq!(cfg("seed = 7\n").data_order_seed(), 7);
        assert_eq!(cfg("seed = 7\ndata_seed = 11\n").data_order_seed(), 11);
    }

    /// `--resume` from another working directory: the saved config names existing inputs by
    /// absolute paths; names that are no path here stay as written.
    #[test]
    fn the_saved_config_holds_absolute_paths() {
        // Relative to this crate's directory, where its tests run: the workspace's fixtures.
        let cfg = TrainConfig {
            model_name_or_path: "../../tests/fixtures/models/llama".into(),
            train_file: "../../tests/fixtures/data/prefs.jsonl".into(),
            eval_file: Some("not/there.jsonl".into()),
            tokenizer_name_or_path: Some("../../tests/fixtures/tokenizer".into()),
            ..Default::default()
        };
        let saved: toml::Table = cfg.to_toml().parse().unwrap();
        let root = std::fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).unwrap();
        let at = |rel: &str| root.join(rel).display().to_string();
        assert_eq!(saved["model_name_or_path"].as_str(), Some(at("tests/fixtures/models/llama").as_str()));
        assert_eq!(saved["train_file"].as_str(), Some(at("tests/fixtures/data/prefs.jsonl").as_str()));
        assert_eq!(saved["tokenizer_name_or_path"].as_str(), Some(at("tests/fixtures/tokenizer").as_str()));
        assert_eq!(saved["eval_file"].as_str(), Some("not/there.jsonl"));
    }

    /// check-gpu hands its plan over in dpo-vocab's key names: each is a key of this table, with
    /// the type the plan writes.
    #[test]
    fn the_vocabulary_s_keys_are_keys_of_the_table() {
        for name in dpo_vocab::keys::CONFIG_KEYS {
            assert!(KEYS.iter().any(|k| k.name == name), "dpo-vocab's `{name}` is no config key");
        }
        for bool_key in [dpo_vocab::keys::BF16, dpo_vocab::keys::FP16, dpo_vocab::keys::GRADIENT_CHECKPOINTING] {
            assert!(KEYS.iter().find(|k| k.name == bool_key).unwrap().is_bool, "{bool_key}");
        }
        // check-gpu plans no reference for exactly the losses that train without one.
        for name in dpo_vocab::keys::REFERENCE_FREE_LOSSES {
            let t: LossType = serde_json::from_value(serde_json::json!(name)).expect("a loss type");
            assert!(t.is_reference_free(), "{name}");
        }
        for t in LossType::ALL.into_iter().filter(|t| t.is_reference_free()) {
            assert!(dpo_vocab::keys::REFERENCE_FREE_LOSSES.contains(&t.name()), "{}", t.name());
        }
        // ... and keeps one for KTOTrainer's losses, with KTO's micro-batch minimum for `kto`.
        for t in LossType::ALL {
            let loss = LossConfig { loss_type: vec![t], ..LossConfig::default() };
            assert_eq!(dpo_vocab::keys::UNPAIRED_LOSSES.contains(&t.name()), loss.is_kto(), "{}", t.name());
            assert_eq!(t.name() == dpo_vocab::keys::KTO, loss.kl_rows(), "{}", t.name());
        }
    }

    #[test]
    fn every_field_has_a_key_and_a_flag() {
        let toml::Value::Table(table) = toml::Value::try_from(TrainConfig::default()).unwrap() else { panic!() };
        for key in table.keys() {
            assert!(KEYS.iter().any(|k| k.name == key), "{key} has no KeyDoc");
        }
        assert!(KEYS.iter().find(|k| k.name == "skip_bad_rows").unwrap().is_bool);
        assert!(!KEYS.iter().find(|k| k.name == "beta").unwrap().is_bool);
    }

    #[test]
    fn flags_override_the_file() {
        let cfg = TrainConfig::from_toml_str("beta = 0.2\nper_device_train_batch_size = 2\n", "x.toml").unwrap();
        let cfg = cfg
            .with_overrides(&[
                ("per_device_train_batch_size".into(), "4".into()),
                ("loss_type".into(), "sigmoid,sft".into()),
                ("loss_weights".into(), "1,0.5".into()),
                ("output_dir".into(), "/tmp/x".into()),
            ])
            .unwrap();
        assert_eq!(cfg.loss.beta, 0.2);
        assert_eq!(cfg.per_device_train_batch_size, 4);
        assert_eq!(cfg.loss.loss_type, vec![LossType::Sigmoid, LossType::Sft]);
        assert_eq!(cfg.loss.loss_weights, vec![1.0, 0.5]);
        assert_eq!(cfg.output_dir, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let err = TrainConfig::from_toml_str("beta = 0.1\nlearning_rat = 1e-5\n", "c.toml").unwrap_err();
        assert_eq!(err.to_string(), "`c.toml`, line 2: unknown key `learning_rat`; did you mean `learning_rate`?");
        let err = TrainConfig::from_toml_str("temperature = 1\n", "c.toml").unwrap_err();
        assert_eq!(err.to_string(), "`c.toml`, line 1: unknown key `temperature` (`dpo-train --help` lists every key)");
        let err = TrainConfig::from_toml_str("beta = \"high\"\n", "c.toml").unwrap_err();
        assert_eq!(err.to_string(), "`c.toml`, line 1: `beta`: invalid type: string \"high\", expected a number");
        let err = TrainConfig::from_toml_str("max_steps = 1.5\n", "c.toml").unwrap_err();
        assert!(err.to_string().ends_with("expected a whole number"), "{err}");
        let err = TrainConfig::default().with_overrides(&[("beta".into(), "x".into())]).unwrap_err();
        assert_eq!(err.to_string(), "`--beta`: expected a number, got `x`");
        let err = TrainConfig::default().with_overrides(&[("loss_type".into(), "sigmoidd".into())]).unwrap_err();
        assert_eq!(err.to_string(), "`--loss-type`: unknown value `sigmoidd`; did you mean `sigmoid`?");
    }

    #[test]
    fn a_string_is_a_one_element_list_where_trl_takes_one() {
        let text = "beta = 0.1\nloss_type = \"ipo\"\nreport_to = \"none\"\nlora_target_modules = \"all-linear\"\n";
        let cfg = TrainConfig::from_toml_str(text, "k.toml").unwrap();
        assert_eq!(cfg.loss.loss_type, vec![LossType::Ipo]);
        assert_eq!(cfg.report_to, vec!["none".to_owned()]);
        assert_eq!(cfg.lora_target_modules, vec!["all-linear".to_owned()]);
        let err = TrainConfig::from_toml_str("lora_r = 8\nlora_target_modules = \"q_proj\"\n", "k.toml").unwrap_err();
        assert!(err.to_string().starts_with("`k.toml`, line 2: `lora_target_modules`: a single string is a regular"));
        let cfg = TrainConfig::default().with_overrides(&[("loss_type".into(), "ipo".into())]).unwrap();
        assert_eq!(cfg.loss.loss_type, vec![LossType::Ipo]);
    }

    #[test]
    fn trls_other_keys_are_accepted_or_refused_by_name() {
        let text = "beta = 0.1\ndataset_num_proc = 8\ntruncation_mode = \"keep_start\"\ndisable_dropout = true\n\
                    sync_ref_model = false\ndataloader_num_workers = 2\n";
        let cfg = TrainConfig::from_toml_str(text, "t.toml").unwrap();
        assert_eq!((cfg.dataset_num_proc, cfg.truncation_mode.as_str()), (Some(8), "keep_start"));
        let err = TrainConfig::from_toml_str("beta = 0.1\nsync_ref_model = true\n", "t.toml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`t.toml`, line 2: `sync_ref_model = true` is not supported by dpo-train: \
             TR-DPO's reference syncing is not implemented"
        );
        let cfg = TrainConfig::from_toml_str("eval_strategy = \"no\"\n", "t.toml").unwrap();
        assert_eq!(cfg.eval_every(100), 0, "TRL's eval_strategy = \"no\" never evaluates");
        // `save_strategy` keeps TRL's meaning (no checkpoint at all with "no"), not `save_steps = 0`'s.
        let cfg = TrainConfig::from_toml_str("save_strategy = \"no\"\n", "t.toml").unwrap();
        assert_eq!((cfg.save_strategy, cfg.save_steps), (SaveStrategy::No, Steps::Every(500)));
        let err = TrainConfig::from_toml_str("beta = 0.1\nsave_strategy = \"epoch\"\n", "t.toml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`t.toml`, line 2: `save_strategy`: unknown variant `epoch`, expected `steps` or `no`"
        );
        let base = "model_name_or_path = \"m\"\ntrain_file = \"d.jsonl\"\n";
        let mode = |m: &str| {
            let text = format!("{base}truncation_mode = \"{m}\"\n");
            Layered::new(Some(ConfigFile { name: "t.toml".into(), text }), &[]).unwrap().validate()
        };
        // TRL 1.16 deprecates keep_end but implements it, and so does dpo-train.
        mode("keep_end").unwrap();
        let err = mode("keep_middle").unwrap_err().to_string();
        assert_eq!(
            err,
            "`t.toml`, line 3: `truncation_mode`: unknown value `keep_middle`: use `keep_start` or `keep_end`"
        );
    }

    #[test]
    fn a_wrong_type_names_its_own_line() {
        let text = "# TRL\nbeta = 0.1\n\nlearning_rate = 1e-6\nloss_weights = 1.0\n";
        let err = TrainConfig::from_toml_str(text, "k2.toml").unwrap_err().to_string();
        assert!(err.starts_with("`k2.toml`, line 5: `loss_weights`: invalid type: floating point"), "{err}");
        let err = TrainConfig::from_toml_str("beta = 0.1\n\nmax_length = \"long\"\n", "k2.toml").unwrap_err();
        assert!(err.to_string().starts_with("`k2.toml`, line 3: `max_length`: invalid type: string"), "{err}");
        let err = TrainConfig::from_toml_str("beta = 0.1\nloss_type = \"sigmoidd\"\n", "k2.toml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`k2.toml`, line 2: `loss_type`: unknown value `sigmoidd`; did you mean `sigmoid`?"
        );
    }

    #[test]
    fn disable_dropout_zeroes_the_trained_lora_dropout() {
        let cfg = |text: &str| TrainConfig::from_toml_str(text, "c.toml").unwrap().lora().unwrap().unwrap();
        let default = cfg("lora_r = 8\n");
        assert_eq!((default.dropout, default.config_dropout), (0.0, 0.05), "TRL's disable_dropout = true");
        let on = cfg("lora_r = 8\nlora_dropout = 0.1\ndisable_dropout = false\n");
        assert_eq!((on.dropout, on.config_dropout), (0.1, 0.1));
        let off = TrainConfig::default().with_overrides(&[("lora_r".into(), "4".into())]).unwrap();
        assert_eq!(off.lora().unwrap().unwrap().dropout, 0.0);
        assert!(TrainConfig::default().disable_dropout);
    }
}
