//! [`RunSettings`]: the settings of a planned run, and the flags that ask dpo-train for them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Precision, Sharding, flag, keys};

/// Where a run's ranks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "count")]
pub enum Ranks {
    /// One process per GPU (`--gpus N`).
    Gpus(usize),
    /// CPU processes (`--devices cpu:N`), no GPU usable.
    Cpu(usize),
}

/// LoRA adapters of rank `r` on `targets` (PEFT's module names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lora {
    pub r: u64,
    pub targets: Vec<String>,
}

/// How the training data is read, where the plan was told: dpo-train's keys of the same names,
/// each unset (`None`, `false`) at dpo-train's default. check-gpu reads the data with them and
/// its command trains with them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
pub struct DataReading {
    /// The data's prompt column, as dpo-train's --prompt-column [default: prompt].
    #[arg(long, value_name = "NAME")]
    pub prompt_column: Option<String>,
    /// The data's preferred completion column, as dpo-train's --chosen-column [default: chosen].
    #[arg(long, value_name = "NAME")]
    pub chosen_column: Option<String>,
    /// The data's dispreferred completion column, as dpo-train's --rejected-column [default:
    /// rejected].
    #[arg(long, value_name = "NAME")]
    pub rejected_column: Option<String>,
    /// The split --data reads when it is a dataset directory, as dpo-train's
    /// --dataset-train-split [default: train].
    #[arg(long, value_name = "NAME")]
    pub dataset_train_split: Option<String>,
    /// The configuration of --data's card (its README's `configs`) to read, as dpo-train's
    /// --dataset-config [default: the card's default].
    #[arg(long, value_name = "NAME")]
    pub dataset_config: Option<String>,
    /// With --loss-type kto or apo_zero_unpaired, train on preference pairs, each as a desirable
    /// and an undesirable row (dpo-train's --unpair).
    #[arg(long, requires = "loss_type")]
    pub unpair: bool,
    /// Skip malformed rows (and rows the chat template refuses) instead of stopping, as
    /// dpo-train's --skip-bad-rows.
    #[arg(long)]
    pub skip_bad_rows: bool,
    /// The tokenizer's directory (or Hub name, cached) where the model's has none, as dpo-train's
    /// --tokenizer.
    #[arg(long = "tokenizer", value_name = "DIR")]
    pub tokenizer_name_or_path: Option<String>,
}

impl DataReading {
    /// `(key, value)` of each setting given.
    pub fn keys(&self) -> Vec<(&'static str, String)> {
        let named = [
            (keys::PROMPT_COLUMN, &self.prompt_column),
            (keys::CHOSEN_COLUMN, &self.chosen_column),
            (keys::REJECTED_COLUMN, &self.rejected_column),
            (keys::DATASET_TRAIN_SPLIT, &self.dataset_train_split),
            (keys::DATASET_CONFIG, &self.dataset_config),
            (keys::TOKENIZER_NAME_OR_PATH, &self.tokenizer_name_or_path),
        ];
        let mut out: Vec<_> = named.into_iter().filter_map(|(k, v)| Some((k, v.clone()?))).collect();
        for (key, set) in [(keys::UNPAIR, self.unpair), (keys::SKIP_BAD_ROWS, self.skip_bad_rows)] {
            if set {
                out.push((key, "true".to_owned()));
            }
        }
        out
    }
}

/// Every setting a plan assumes, each a dpo-train key or launcher flag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSettings {
    /// The model directory, when the plan was made for one.
    pub model: Option<PathBuf>,
    /// The training data, when the plan was given it.
    pub data: Option<PathBuf>,
    /// How that data is read.
    #[serde(default)]
    pub reading: DataReading,
    pub ranks: Ranks,
    pub micro_batch: u64,
    pub accumulation: u64,
    pub global_batch: u64,
    pub max_length: u64,
    pub precision: Precision,
    pub lora: Option<Lora>,
    pub precompute_ref_log_probs: bool,
    pub gradient_checkpointing: bool,
    pub sharding: Sharding,
    pub offload_optimizer: bool,
    /// A reference-free loss the plan was made for (`None`: dpo-train's default, with a reference).
    pub loss_type: Option<String>,
}

impl RunSettings {
    /// The flags that ask `dpo-train train` for these settings, every one spelled out (dpo-train's
    /// defaults are TRL's, which a plan need not share): each key through [`flag`], the rule
    /// dpo-train's flag parser is built with.
    pub fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut set = |key: &str, value: String| out.extend([flag(key), value]);
        if let Some(model) = &self.model {
            set(keys::MODEL_NAME_OR_PATH, model.display().to_string());
        }
        if let Some(data) = &self.data {
            set(keys::TRAIN_FILE, data.display().to_string());
        }
        for (key, value) in self.reading.keys() {
            set(key, value);
        }
        match self.ranks {
            Ranks::Gpus(n) => set(keys::GPUS, n.to_string()),
            Ranks::Cpu(n) => set(keys::DEVICES, format!("cpu:{n}")),
        }
        set(keys::PER_DEVICE_TRAIN_BATCH_SIZE, self.micro_batch.to_string());
        set(keys::GRADIENT_ACCUMULATION_STEPS, self.accumulation.to_string());
        set(keys::GLOBAL_BATCH_SIZE, self.global_batch.to_string());
        set(keys::MAX_LENGTH, self.max_length.to_string());
        set(keys::BF16, (self.precision == Precision::Bf16).to_string());
        set(keys::FP16, (self.precision == Precision::Fp16).to_string());
        if let Some(lora) = &self.lora {
            set(keys::LORA_R, lora.r.to_string());
            set(keys::LORA_TARGET_MODULES, lora.targets.join(","));
        }
        set(keys::PRECOMPUTE_REF_LOG_PROBS, self.precompute_ref_log_probs.to_string());
        set(keys::GRADIENT_CHECKPOINTING, self.gradient_checkpointing.to_string());
        set(keys::SHARDING, self.sharding.name().to_owned());
        set(keys::OFFLOAD_OPTIMIZER, self.offload_optimizer.to_string());
        if let Some(loss) = &self.loss_type {
            set(keys::LOSS_TYPE, loss.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_is_a_flag_and_its_value() {
        let settings = RunSettings {
            model: Some("/models/m".into()),
            data: Some("/data/prefs.jsonl".into()),
            reading: DataReading::default(),
            ranks: Ranks::Gpus(2),
            micro_batch: 4,
            accumulation: 2,
            global_batch: 16,
            max_length: 1024,
            precision: Precision::Bf16,
            lora: Some(Lora { r: 16, targets: vec!["q_proj".into(), "v_proj".into()] }),
            precompute_ref_log_probs: false,
            gradient_checkpointing: true,
            sharding: Sharding::Zero2,
            offload_optimizer: false,
            loss_type: None,
        };
        let flags = settings.flags().join(" ");
        assert_eq!(
            flags,
            "--model-name-or-path /models/m --train-file /data/prefs.jsonl --gpus 2 --per-device-train-batch-size 4 \
             --gradient-accumulation-steps 2 --global-batch-size 16 --max-length 1024 --bf16 true --fp16 false \
             --lora-r 16 --lora-target-modules q_proj,v_proj --precompute-ref-log-probs false \
             --gradient-checkpointing true --sharding zero2 --offload-optimizer false"
        );
        let orpo = RunSettings { loss_type: Some("orpo".into()), ..settings.clone() };
        assert!(orpo.flags().ends_with(&["--loss-type".to_owned(), "orpo".to_owned()]));
        let cpu = RunSettings { ranks: Ranks::Cpu(3), ..settings.clone() };
        assert!(cpu.flags().windows(2).any(|w| w == ["--devices", "cpu:3"]));
        // How the data is read follows the data, each key given; none given, none written.
        let reading = DataReading {
            prompt_column: Some("question".into()),
            rejected_column: Some("bad".into()),
            dataset_train_split: Some("train_prefs".into()),
            tokenizer_name_or_path: Some("/models/tok".into()),
            unpair: true,
            skip_bad_rows: true,
            ..DataReading::default()
        };
        let kto = RunSettings { reading, loss_type: Some("kto".into()), ..settings };
        assert!(
            kto.flags().join(" ").starts_with(
                "--model-name-or-path /models/m --train-file /data/prefs.jsonl --prompt-column question \
                 --rejected-column bad --dataset-train-split train_prefs --tokenizer-name-or-path /models/tok \
                 --unpair true --skip-bad-rows true --gpus 2"
            ),
            "{:?}",
            kto.flags()
        );
    }
}
