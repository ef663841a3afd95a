//! The run's vocabulary, defined once for dpo-train and check-gpu: the precision a run computes
//! in, the ZeRO stage it shards with, where its ranks run, and the config keys that carry them,
//! with the one rule that spells a key as its flag ([`flag`]). check-gpu's plan hands its choices
//! over as a [`RunSettings`], whose [`RunSettings::flags`] are dpo-train's own flags.

pub mod head;
pub mod keys;
mod settings;
pub mod shapes;

pub use settings::{DataReading, Lora, Ranks, RunSettings};

use serde::{Deserialize, Serialize};

/// The flag of a config key: `per_device_train_batch_size` → `--per-device-train-batch-size`.
pub fn flag(key: &str) -> String {
    format!("--{}", flag_name(key))
}

/// [`flag`] without the dashes (clap's `long` name).
pub fn flag_name(key: &str) -> String {
    key.replace('_', "-")
}

/// Whether a run keeps its trained parameters in the compute dtype between steps beside fp32
/// masters on its device (dpo-train's resident masters, which check-gpu's memory plan counts):
/// mixed precision, not offloaded, and no layer recomputed (no gradient checkpointing, not zero3),
/// so the step holds every weight's compute-dtype copy anyway. `sharding` is the stage the ranks
/// run (a lone process: none).
pub fn masters_resident(precision: Precision, offload: bool, checkpointing: bool, sharding: Sharding) -> bool {
    precision.is_mixed() && !offload && !checkpointing && sharding != Sharding::Zero3
}

/// The precision a run computes in (the master weights are f32 under both half precisions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bfloat16 mixed precision (compute capability 8.0+).
    Bf16,
    /// float16 mixed precision, with a dynamic loss scale.
    Fp16,
    /// float32 throughout.
    Fp32,
}

impl Precision {
    /// Bytes per element of the compute dtype.
    pub fn bytes(self) -> u64 {
        match self {
            Self::Bf16 | Self::Fp16 => 2,
            Self::Fp32 => 4,
        }
    }

    /// The lowercase name (`bf16`, `fp16`, `fp32`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
            Self::Fp32 => "fp32",
        }
    }

    /// Whether an f32 master copy sits behind half-precision weights.
    pub fn is_mixed(self) -> bool {
        self != Self::Fp32
    }

    /// The precision TRL's `bf16` and `fp16` keys select (validation refuses both at once).
    pub fn of_keys(bf16: bool, fp16: bool) -> Self {
        match (bf16, fp16) {
            (true, _) => Self::Bf16,
            (false, true) => Self::Fp16,
            (false, false) => Self::Fp32,
        }
    }
}

/// What the data-parallel ranks partition (DeepSpeed's ZeRO stages; dpo-train's `sharding`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Every rank holds everything (DDP).
    #[default]
    None,
    /// AdamW moments partitioned: each rank updates its part, the parameters are all-gathered.
    Zero1,
    /// As zero1, and the gradients reduce-scattered: each rank keeps its part's only.
    Zero2,
    /// As zero2, and the parameters partitioned (FSDP's full shard), gathered a part at a time.
    Zero3,
}

impl Sharding {
    /// Every stage, in order.
    pub const ALL: [Self; 4] = [Self::None, Self::Zero1, Self::Zero2, Self::Zero3];

    /// The name `--sharding` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Zero1 => "zero1",
            Self::Zero2 => "zero2",
            Self::Zero3 => "zero3",
        }
    }

    /// The stage named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether each rank keeps only its slice of AdamW's moments.
    pub fn partitions_optimizer(self) -> bool {
        self != Self::None
    }

    /// Whether each rank keeps only its slice of the gradients.
    pub fn partitions_gradients(self) -> bool {
        matches!(self, Self::Zero2 | Self::Zero3)
    }

    /// Whether each rank keeps only its slice of the parameters.
    pub fn partitions_parameters(self) -> bool {
        self == Self::Zero3
    }
}

impl std::fmt::Display for Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_spelled_as_its_flag() {
        assert_eq!(flag(keys::PER_DEVICE_TRAIN_BATCH_SIZE), "--per-device-train-batch-size");
        assert_eq!(flag_name(keys::GPUS), "gpus");
    }

    #[test]
    fn stages_round_trip_their_names() {
        for stage in Sharding::ALL {
            assert_eq!(Sharding::parse(stage.name()), Some(stage));
        }
        assert_eq!(Sharding::parse("zero4"), None);
        assert!(Sharding::Zero3.partitions_parameters() && !Sharding::Zero2.partitions_parameters());
    }

    #[test]
    fn the_precision_keys_select_one_precision() {
        assert_eq!(Precision::of_keys(true, false), Precision::Bf16);
        assert_eq!(Precision::of_keys(false, true), Precision::Fp16);
        assert_eq!(Precision::of_keys(false, false), Precision::Fp32);
    }
}
