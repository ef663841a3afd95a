//! Validation of a parsed [`TrainConfig`]: missing and out-of-range values, each refused naming its
//! key ([`super::Layered::validate`] adds the file and line or the flag that set it), and the
//! sharding stage resolved from `sharding` and accelerate's `fsdp`.

use super::{ConfigError, Sharding, TrainConfig};

/// The shortest sequence that scores anything: a token to predict from and a completion token to
/// score (shorter, `keep_end` kept every pair with nothing to score, and `keep_start` dropped them all).
pub const MIN_MAX_LENGTH: usize = 2;

/// Why a shorter `max_length` is refused.
pub const MAX_LENGTH_TOO_SHORT: &str =
    "must be at least 2: a sequence needs a token to predict from and a completion token to score";

impl TrainConfig {
    /// Rejects missing and out-of-range values, naming the key ([`super::Layered::validate`] adds where
    /// the value was set).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        if self.model_name_or_path.is_empty() {
            return invalid(
                "model_name_or_path",
                "is required: a Hugging Face model directory (`--model DIR`), or `demo`".to_owned(),
            );
        }
        if self.train_file.is_empty() {
            return invalid("train_file", "is required: the training preference data (`--data FILE`)".to_owned());
        }
        self.loss.validate()?;
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return invalid("learning_rate", format!("must be finite and > 0, got {}", self.learning_rate));
        }
        if self.sft_steps > 0 && !(self.sft_learning_rate > 0.0 && self.sft_learning_rate.is_finite()) {
            return invalid("sft_learning_rate", format!("must be finite and > 0, got {}", self.sft_learning_rate));
        }
        if self.weight_decay < 0.0 {
            return invalid("weight_decay", format!("must be >= 0, got {}", self.weight_decay));
        }
        for (key, value) in [("adam_beta1", self.adam_beta1), ("adam_beta2", self.adam_beta2)] {
            if !(0.0..1.0).contains(&value) {
                return invalid(key, format!("must be in [0, 1), got {value}"));
            }
        }
        // Written so that NaN fails too: every comparison with it is false.
        if !(self.adam_epsilon > 0.0 && self.adam_epsilon.is_finite()) {
            return invalid("adam_epsilon", format!("must be finite and > 0, got {}", self.adam_epsilon));
        }
        if !(self.max_grad_norm >= 0.0 && self.max_grad_norm.is_finite()) {
            return invalid(
                "max_grad_norm",
                format!("must be finite and >= 0 (0: no clipping), got {}", self.max_grad_norm),
            );
        }
        if !(self.warmup_steps >= 0.0 && self.warmup_steps < 1e15) {
            return invalid(
                "warmup_steps",
                format!("must be >= 0 (below 1: a fraction of the steps), got {}", self.warmup_steps),
            );
        }
        if !(0.0..=1.0).contains(&self.warmup_ratio) {
            return invalid("warmup_ratio", format!("must be in [0, 1], got {}", self.warmup_ratio));
        }
        if !(0.0..=1.0).contains(&self.min_lr_rate) {
            return invalid("min_lr_rate", format!("must be in [0, 1], got {}", self.min_lr_rate));
        }
        self.validate_sizes()?;
        if self.max_steps <= 0 && self.num_train_epochs.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return invalid(
                "num_train_epochs",
                format!("must be > 0 when max_steps is not set, got {}", self.num_train_epochs),
            );
        }
        if !(self.eval_delay >= 0.0 && self.eval_delay.is_finite()) {
            return invalid("eval_delay", format!("must be finite and >= 0, got {}", self.eval_delay));
        }
        if self.logging_steps == crate::Steps::Every(0) {
            return invalid("logging_steps", "must be at least 1".to_owned());
        }
        let known = ["tensorboard", "wandb", "all", "none"];
        if let Some(other) = self.report_to.iter().find(|r| !known.contains(&r.as_str())) {
            return invalid("report_to", format!("`{other}` is not supported: use `tensorboard`, `wandb` (or `none`)"));
        }
        if self.save_total_limit == Some(0) {
            return invalid("save_total_limit", "must be at least 1 (omit it to keep every checkpoint)".to_owned());
        }
        if self.bf16 == Some(true) && self.fp16 {
            return invalid("fp16", "cannot be combined with `bf16`: choose one precision".to_owned());
        }
        if self.merge && self.lora_r.is_none() {
            return invalid("merge", "needs LoRA (`lora_r`): a full fine-tune is already a merged model".to_owned());
        }
        if !self.loss.needs_reference() && self.precompute_ref_log_probs {
            let why = self.loss.family().map_or("`reference_free`".to_owned(), |t| format!("`{}`", t.name()));
            return invalid("precompute_ref_log_probs", format!("has no reference to precompute with {why}"));
        }
        self.check_reference_free()?;
        self.check_kto()
    }

    /// What `KTOTrainer`'s losses cannot run with: keep_end, which it does not define, and the
    /// SFT stage (its rows are not all desirable); and for kto, whose KL rows come from the
    /// micro-batch drawn, a micro-batch of one row (its KL sequence would be its own, TRL's
    /// "Actual (not effective) batch size must be > 1") and precomputed reference log-probs
    /// (the KL rows' reference cannot be computed ahead). `eval` checks its flags here too.
    pub fn check_kto(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        let Some(loss) = self.loss.unpaired_loss() else { return Ok(()) };
        let name = loss.name();
        if self.loss.kl_rows() && self.per_device_train_batch_size < 2 {
            return invalid(
                "per_device_train_batch_size",
                format!(
                    "must be at least 2 with `kto`, got {}: KTO's KL estimate pairs each prompt with another row's completion of its micro-batch",
                    self.per_device_train_batch_size
                ),
            );
        }
        if self.loss.kl_rows() && self.train_sampling_strategy == Some(crate::SamplingStrategy::Random) {
            return invalid(
                "train_sampling_strategy",
                "must be `sequential` with `kto`, as TRL's KTOTrainer requires: the KL rows pair each row with its neighbours' completions in a fixed-order batch".to_owned(),
            );
        }
        if self.truncation_mode == "keep_end" {
            return invalid(
                "truncation_mode",
                format!("`keep_end` is not defined for `{name}`: TRL's KTOTrainer keeps each sequence's start"),
            );
        }
        if self.loss.kl_rows() && self.precompute_ref_log_probs {
            return invalid(
                "precompute_ref_log_probs",
                "is not supported with `kto`: its KL rows are formed from each micro-batch drawn, so their reference log-probs cannot be computed ahead".to_owned(),
            );
        }
        if self.sft_steps > 0 {
            return invalid(
                "sft_steps",
                format!("cannot precede `{name}`: its rows are desirable and undesirable completions, not targets"),
            );
        }
        Ok(())
    }

    /// What a reference-free loss (`cpo`, `simpo`, `alphapo`, `orpo`) cannot run with: a reference
    /// model, or keep_end truncation, which its trainers do not define (`eval` checks its flags
    /// here too).
    pub fn check_reference_free(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        let Some(family) = self.loss.family() else { return Ok(()) };
        let name = family.name();
        if self.ref_model_name_or_path.is_some() {
            return invalid("ref_model_name_or_path", format!("is not used by `{name}`, which has no reference model"));
        }
        if self.truncation_mode == "keep_end" {
            return invalid(
                "truncation_mode",
                format!(
                    "`keep_end` is not defined for `{name}`: TRL's {} keeps each sequence's start",
                    family.trainer()
                ),
            );
        }
        Ok(())
    }

    /// The sharding stage, from `sharding` or its accelerate spelling `fsdp` (see [`TrainConfig::resolve`]).
    pub(crate) fn sharding(&self) -> Result<Sharding, ConfigError> {
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        let from_fsdp = match self.fsdp.split_whitespace().find(|w| w.contains("shard") || *w == "no_shard") {
            None => None,
            Some("shard_grad_op") => Some(Sharding::Zero2),
            Some("full_shard" | "hybrid_shard") => Some(Sharding::Zero3),
            Some("no_shard") => Some(Sharding::None),
            Some(other) => {
                return invalid(
                    "fsdp",
                    format!("`{other}` is not a sharding strategy: use `shard_grad_op` or `full_shard`"),
                );
            }
        };
        let stage = match (from_fsdp, self.sharding) {
            (Some(f), Sharding::None) => f,
            (Some(f), s) if f != s => {
                let stage = format!("{s:?}").to_lowercase();
                return invalid("fsdp", format!("`{}` contradicts `sharding = \"{stage}\"`", self.fsdp.trim()));
            }
            (_, s) => s,
        };
        Ok(stage)
    }

    /// Batch sizes, lengths and the process group's settings: counts that must be positive.
    fn validate_sizes(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        for (key, value) in [
            ("per_device_train_batch_size", self.per_device_train_batch_size),
            ("per_device_eval_batch_size", self.per_device_eval_batch_size),
            ("gradient_accumulation_steps", self.gradient_accumulation_steps),
        ] {
            if value == 0 {
                return invalid(key, "must be at least 1".to_owned());
            }
        }
        if self.max_length < MIN_MAX_LENGTH {
            return invalid("max_length", MAX_LENGTH_TOO_SHORT.to_owned());
        }
        if self.ddp_bucket_cap_mb == 0 {
            return invalid("ddp_bucket_cap_mb", "must be at least 1".to_owned());
        }
        if self.dataset_num_proc == Some(0) {
            return invalid("dataset_num_proc", "must be at least 1 (unset: every core)".to_owned());
        }
        if self.ddp_timeout == 0 {
            return invalid("ddp_timeout", "must be at least 1 second".to_owned());
        }
        if self.global_batch_size == Some(0) {
            return invalid("global_batch_size", "must be at least 1".to_owned());
        }
        if self.num_samples > 0 && self.max_new_tokens == 0 {
            let why = "must be at least 1 where samples are written (`num_samples = 0` writes none)";
            return invalid("max_new_tokens", why.to_owned());
        }
        Ok(())
    }
}

/// Whether a `truncation_mode` (the key's, or `dpo-train eval --truncation-mode`'s) keeps each
/// sequence's end: `keep_end` yes, `keep_start` no, anything else the error's message.
pub fn truncation_keeps_end(mode: &str) -> Result<bool, String> {
    match mode {
        "keep_start" => Ok(false),
        "keep_end" => Ok(true),
        other => Err(format!("unknown value `{other}`: use `keep_start` or `keep_end`")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ConfigFile, Layered};
    use super::*;

    #[test]
    fn sharding_takes_accelerates_spelling() {
        let cfg = |text: &str| TrainConfig::from_toml_str(text, "x.toml").unwrap();
        assert_eq!(cfg("sharding = \"zero1\"\n").sharding().unwrap(), Sharding::Zero1);
        assert_eq!(cfg("fsdp = \"shard_grad_op auto_wrap\"\n").sharding().unwrap(), Sharding::Zero2);
        assert_eq!(cfg("fsdp = \"shard_grad_op\"\nsharding = \"zero2\"\n").sharding().unwrap(), Sharding::Zero2);
        assert_eq!(cfg("fsdp = \"full_shard\"\n").sharding().unwrap(), Sharding::Zero3);
        assert_eq!(cfg("sharding = \"zero3\"\n").sharding().unwrap(), Sharding::Zero3);
        let err = cfg("fsdp = \"shard_grad_op\"\nsharding = \"zero1\"\n").sharding().unwrap_err().to_string();
        assert_eq!(err, "`fsdp`: `shard_grad_op` contradicts `sharding = \"zero1\"`");
        let err = cfg("fsdp = \"offload_shard\"\n").sharding().unwrap_err().to_string();
        assert!(err.starts_with("`fsdp`: `offload_shard` is not a sharding strategy"), "{err}");
        assert!(cfg("fsdp = \"full_shard\"\nsharding = \"zero2\"\n").resolve().is_err());
    }

    /// `dataset_num_proc` sizes the tokenising pool: 0 threads is bad input, named by key and line.
    #[test]
    fn zero_tokenising_threads_are_refused() {
        let base = "model_name_or_path = \"m\"\ntrain_file = \"d.jsonl\"\n";
        let file = ConfigFile { name: "t.toml".into(), text: format!("{base}dataset_num_proc = 0\n") };
        let err = Layered::new(Some(file), &[]).unwrap().validate().unwrap_err().to_string();
        assert_eq!(err, "`t.toml`, line 3: `dataset_num_proc`: must be at least 1 (unset: every core)");
    }

    #[test]
    fn out_of_range_values_are_rejected_by_key() {
        let check = |toml: &str, key: &str| {
            let toml = format!("model_name_or_path = \"m\"\ntrain_file = \"d.jsonl\"\n{toml}");
            let err = TrainConfig::from_toml_str(&toml, "c.toml").unwrap().resolve().unwrap_err();
            assert!(err.to_string().starts_with(&format!("`{key}`")), "{toml}: {err}");
        };
        check("learning_rate = -1e-5", "learning_rate");
        check("learning_rate = 0.0", "learning_rate");
        check("beta = 0.0", "beta");
        check("beta = -0.1", "beta");
        check("loss_type = [\"robust\"]\nlabel_smoothing = 0.5", "label_smoothing");
        check("per_device_train_batch_size = 0", "per_device_train_batch_size");
        check("gradient_accumulation_steps = 0", "gradient_accumulation_steps");
        check("warmup_ratio = 1.5", "warmup_ratio");
        check("max_grad_norm = nan", "max_grad_norm");
        check("adam_epsilon = nan", "adam_epsilon");
        check("beta = inf", "beta");
        check("max_new_tokens = 0", "max_new_tokens");
        let required = TrainConfig::default().resolve().unwrap_err();
        assert!(required.to_string().starts_with("`model_name_or_path`: is required"), "{required}");
    }
}
