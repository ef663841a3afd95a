//! What a resumed run may not change without saying so: the keys that decide what is trained
//! (the model and its reference, the tokenizer, the data and how it is cut, the LoRA adapters,
//! the loss, the data order and its seeds). A resume that sets one of them to another value than the
//! run's saved config is refused naming the key and both values, unless `--resume-with-changes`
//! accepts it; the schedule, the batch (checked against the checkpoint by the trainer), the
//! cadences and the number of steps may change freely.

use crate::{KEYS, Section, TrainConfig};

/// The keys that decide how the training data is read, tokenised and cut (`dpo-train data
/// lengths` reads it by them, as training does).
pub const DATA_KEYS: [&str; 9] = [
    "tokenizer_name_or_path",
    "dataset_train_split",
    "dataset_config",
    "prompt_column",
    "chosen_column",
    "rejected_column",
    "skip_bad_rows",
    "max_length",
    "truncation_mode",
];

/// With [`DATA_KEYS`], the keys of the run's own section that decide what is trained; every loss
/// key does too. The seeds among them: the sampler draws each step's pairs from the data seed and
/// the step, so another one in mid-epoch repeats some pairs and skips others.
pub const FIXED_ON_RESUME: [&str; 13] = [
    "model_name_or_path",
    "ref_model_name_or_path",
    "train_file",
    "lora_r",
    "lora_alpha",
    "use_rslora",
    "use_dora",
    "lora_target_modules",
    "disable_dropout",
    "precompute_ref_log_probs",
    "seed",
    "data_seed",
    "train_sampling_strategy",
];

/// Among [`FIXED_ON_RESUME`], the keys that shape the weights a checkpoint holds (whole, or
/// adapters of a rank on some projections): a resume loads that checkpoint, so none of them can
/// change, even with `--resume-with-changes`.
pub const SHAPE_KEYS: [&str; 3] = ["lora_r", "lora_target_modules", "use_dora"];

/// One key a resume changes: its name, the saved value and the new one (as TOML would write
/// them; `unset` for none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: &'static str,
    pub saved: String,
    pub now: String,
}

/// The keys of [`DATA_KEYS`], [`FIXED_ON_RESUME`] and the loss that `now` sets otherwise than
/// `saved`. The run saved its paths absolute ([`TrainConfig::to_toml`]): `now`'s are compared
/// made absolute the same way, so `--model ../m` names the model the run saved as `/abs/m`.
pub fn changes(saved: &TrainConfig, now: &TrainConfig) -> Vec<Change> {
    let table = |cfg: &TrainConfig| match toml::Value::try_from(cfg) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    let (before, after) = (table(saved), table(&now.with_absolute_paths()));
    let text = |t: &toml::Table, key: &str| t.get(key).map_or_else(|| "unset".to_owned(), ToString::to_string);
    // Target lists that name the same projections (`q_proj,v_proj` and the default, `all-linear`
    // and the seven listed) are one shape.
    let targets = |cfg: &TrainConfig| {
        crate::LoraSettings::new(1, 1.0, 0.0, &cfg.lora_target_modules)
            .ok()
            .map(|l| (l.target_modules, l.layer_modules))
    };
    let same_targets = targets(saved).is_some() && targets(saved) == targets(now);
    KEYS.iter()
        .filter(|k| k.section == Section::Loss || DATA_KEYS.contains(&k.name) || FIXED_ON_RESUME.contains(&k.name))
        .filter(|k| before.get(k.name) != after.get(k.name))
        .filter(|k| !(k.name == "lora_target_modules" && same_targets))
        .map(|k| Change { key: k.name, saved: text(&before, k.name), now: text(&after, k.name) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_trained_is_compared_and_the_schedule_is_not() {
        let saved = TrainConfig::from_toml_str("model_name_or_path = \"a\"\nlearning_rate = 1e-6\n", "s").unwrap();
        let now = TrainConfig::from_toml_str(
            "model_name_or_path = \"b\"\nlearning_rate = 5e-7\nmax_steps = 900\nbeta = 0.2\nseed = 8\n",
            "n",
        )
        .unwrap();
        let changed = changes(&saved, &now);
        let keys: Vec<&str> = changed.iter().map(|c| c.key).collect();
        assert_eq!(keys, ["model_name_or_path", "beta", "seed"]);
        assert_eq!((changed[0].saved.as_str(), changed[0].now.as_str()), ("\"a\"", "\"b\""));
        assert!(changes(&saved, &saved).is_empty());
        // A relative path names what the run saved absolute (this crate's `src` from its tests'
        // working directory), another spelling of it too; another directory is a change.
        let relative = TrainConfig::from_toml_str("model_name_or_path = \"src\"\n", "r").unwrap();
        let saved = TrainConfig::from_toml_str(&relative.to_toml(), "s").unwrap();
        assert!(saved.model_name_or_path.starts_with('/'), "{}", saved.model_name_or_path);
        assert!(changes(&saved, &relative).is_empty());
        let respelled = TrainConfig::from_toml_str("model_name_or_path = \"../config/src\"\n", "r").unwrap();
        assert!(changes(&saved, &respelled).is_empty());
        let other = TrainConfig::from_toml_str("model_name_or_path = \"Cargo.toml\"\n", "o").unwrap();
        assert_eq!(changes(&saved, &other).len(), 1);
        // Another spelling of the same projections is no change; other projections are.
        let targets = |t: &str| TrainConfig::from_toml_str(&format!("lora_target_modules = {t}\n"), "t").unwrap();
        assert!(changes(&targets("[\"q_proj\", \"v_proj\"]"), &targets("[\"v_proj\", \"q_proj\"]")).is_empty());
        assert!(changes(&TrainConfig::default(), &targets("[\"q_proj\", \"v_proj\"]")).is_empty());
        assert_eq!(changes(&targets("[\"q_proj\"]"), &targets("[\"q_proj\", \"v_proj\"]")).len(), 1);
        // A shape key is compared to be refused.
        assert!(SHAPE_KEYS.iter().all(|k| FIXED_ON_RESUME.contains(k)));
        for key in DATA_KEYS.into_iter().chain(FIXED_ON_RESUME) {
            assert!(KEYS.iter().any(|k| k.name == key), "{key} is no key");
        }
    }
}
