//! [`RunPlan`]: a config resolved into the types the layers below take. Each option string is
//! parsed here, once: how sequences are cut (`max_length`, `truncation_mode`), the ZeRO stage
//! (`sharding`, or TRL's `fsdp`), the precision (`bf16`, `fp16`) and the learning-rate schedule
//! (`lr_scheduler_type`, `warmup_steps` or `warmup_ratio`, `min_lr_rate`) and the LoRA adapters
//! (`lora_r`, `lora_target_modules`, ...). Nothing below `config` reads those keys again.

use dpo_vocab::{Precision, Sharding};

use crate::{ConfigError, LoraSettings, SchedulerType, TrainConfig};

/// TRL's `max_length` and `truncation_mode`: how long a sequence may be (`None`: any length), and
/// whether a longer one keeps its start (`keep_start`, TRL's default) or its end (`keep_end`, which
/// TRL 1.16 deprecates but still implements: its collator keeps `ids[-max_length:]`).
///
/// `rows` says whose tokenisation the sequences follow (the reference-free family's trainers
/// tokenise as TRL's `CPOTrainer.tokenize_row`, not as `DPOTrainer`), and so travels with it to
/// the tokeniser, its cache key and the collator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Truncation {
    pub max_length: Option<usize>,
    pub keep_end: bool,
    pub rows: Rows,
}

/// Whose rows: `DPOTrainer._prepare_dataset`'s, or `tokenize_row` of `CPOTrainer` and
/// `ORPOTrainer` (the same function); ORPO also scores the chosen prompts, whose NLL it trains.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Rows {
    #[default]
    Dpo,
    Cpo,
    Orpo,
    /// `KTOTrainer`'s: one prompt and completion a row, its completion kept whole up to
    /// `max_length` so that the row can lend it to another's KL sequence.
    Kto,
    /// `dpo-train sft`'s: DPO's tokenisation, for the chosen completion alone, so a pair is kept
    /// whatever its rejected side is (the same text, or no token), as `SFTTrainer` keeps its rows.
    Sft,
}

impl RunPlan {
    /// The plan of `dpo-train sft`: its rows are [`Rows::Sft`].
    pub fn sft_only(mut self) -> Self {
        self.truncation.rows = Rows::Sft;
        self
    }
}

impl From<Option<usize>> for Truncation {
    /// `keep_start` at `max_length`, DPO's rows.
    fn from(max_length: Option<usize>) -> Self {
        Self { max_length, keep_end: false, rows: Rows::Dpo }
    }
}

/// The warm-up as configured: a number of steps, or a fraction of the run (transformers' rule:
/// `warmup_steps` wins when set).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Warmup {
    Steps(u64),
    Ratio(f64),
}

/// The learning-rate schedule but for its peak (a stage's own) and its length (the data's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScheduleSpec {
    pub kind: SchedulerType,
    pub warmup: Warmup,
    /// Floor of `cosine_with_min_lr`, as a fraction of the peak.
    pub min_lr_rate: f64,
}

impl ScheduleSpec {
    /// The warm-up steps of a run of `total_steps`: `ceil(ratio · total)` for a ratio.
    pub fn warmup_steps(&self, total_steps: u64) -> u64 {
        match self.warmup {
            Warmup::Steps(steps) => steps,
            Warmup::Ratio(ratio) => (ratio * total_steps as f64).ceil() as u64,
        }
    }
}

/// What a validated config resolves to.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub truncation: Truncation,
    /// The stage data-parallel ranks shard with (a single process runs unsharded whatever this says).
    pub sharding: Sharding,
    pub precision: Precision,
    pub schedule: ScheduleSpec,
    /// The adapters a fresh LoRA run adds (`lora_r` and its keys); `None` for full fine-tuning.
    pub lora: Option<LoraSettings>,
}

impl TrainConfig {
    /// `max_length` and `truncation_mode` (the parse of the mode that `resolve` and the defaults of
    /// `dpo-train eval`'s flags share).
    pub fn truncation(&self) -> Result<Truncation, ConfigError> {
        let keep_end = crate::truncation_keeps_end(&self.truncation_mode)
            .map_err(|message| ConfigError::Invalid { key: "truncation_mode", message })?;
        let rows = match self.loss.family() {
            None if self.loss.is_kto() => Rows::Kto,
            None => Rows::Dpo,
            Some(crate::LossType::Orpo) => Rows::Orpo,
            Some(_) => Rows::Cpo,
        };
        Ok(Truncation { max_length: Some(self.max_length), keep_end, rows })
    }

    /// Validates the config and resolves it: the one place its option strings are parsed.
    pub fn resolve(&self) -> Result<RunPlan, ConfigError> {
        self.validate()?;
        // transformers 5's `get_warmup_steps`: whole steps from 1 up, a fraction of the run below.
        let warmup = match self.warmup_steps {
            w if w >= 1.0 => Warmup::Steps(w as u64),
            w if w > 0.0 => Warmup::Ratio(w),
            _ => Warmup::Ratio(self.warmup_ratio),
        };
        Ok(RunPlan {
            truncation: self.truncation()?,
            sharding: self.sharding()?,
            precision: self.precision(),
            schedule: ScheduleSpec { kind: self.lr_scheduler_type, warmup, min_lr_rate: self.min_lr_rate },
            lora: self.lora().map_err(|(key, message)| ConfigError::Invalid { key, message })?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> TrainConfig {
        TrainConfig::from_toml_str(&format!("model_name_or_path = \"m\"\ntrain_file = \"d\"\n{text}"), "t").unwrap()
    }

    #[test]
    fn a_config_resolves_to_typed_values() {
        let plan = cfg("max_length = 64\ntruncation_mode = \"keep_end\"\nfsdp = \"full_shard\"\nfp16 = true\nbf16 = false\nwarmup_ratio = 0.1\n")
            .resolve()
            .unwrap();
        assert_eq!(plan.truncation, Truncation { max_length: Some(64), keep_end: true, rows: Rows::Dpo });
        assert_eq!((plan.sharding, plan.precision), (Sharding::Zero3, Precision::Fp16));
        assert_eq!(plan.schedule.warmup, Warmup::Ratio(0.1));
        assert_eq!(plan.schedule.warmup_steps(95), 10);
        let plan = cfg("warmup_steps = 7\nwarmup_ratio = 0.5\n").resolve().unwrap();
        assert_eq!(plan.schedule.warmup_steps(100), 7, "warmup_steps wins");
        // transformers 5: a fraction below 1 (ceil of its share), the whole part from 1 up.
        let plan = cfg("warmup_steps = 0.1\n").resolve().unwrap();
        assert_eq!(plan.schedule.warmup_steps(95), 10);
        assert_eq!(cfg("warmup_steps = 7.9\n").resolve().unwrap().schedule.warmup_steps(100), 7);
        assert_eq!(plan.precision, Precision::Bf16, "TRL's bf16 = not fp16");
    }

    #[test]
    fn a_bad_option_is_refused_by_its_key() {
        assert_eq!(
            cfg("truncation_mode = \"keep_middle\"\n").resolve().unwrap_err().to_string().split(':').next(),
            Some("`truncation_mode`")
        );
        assert!(cfg("fsdp = \"offload_shard\"\n").resolve().is_err());
    }
}
