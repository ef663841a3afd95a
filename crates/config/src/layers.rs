//! The effective config as three layers: TRL's defaults ([`TrainConfig::default`]), then one TOML
//! file (the user's `--config`, a resumed run's saved `config.toml`, or the embedded demo), then
//! `--key value` flags. Each value remembers its layer, so a run can print where every value came
//! from, and an invalid value is reported where the user set it: the file and line, or the flag.

use std::collections::BTreeSet;
use std::path::Path;

use super::{ConfigError, KEYS, TrainConfig};

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Nobody set it: TRL's `DPOConfig` default (or ours, for keys TRL does not have).
    Default,
    /// The config file.
    File,
    /// A `--key value` flag.
    Flag,
}

impl Origin {
    fn label(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::File => "file",
            Self::Flag => "flag",
        }
    }
}

/// A config file's text and the name errors give it.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// The path as the user gave it (or a label for the embedded demo).
    pub name: String,
    pub text: String,
}

impl ConfigFile {
    /// Reads a config file: TOML, or YAML (`.yaml`, `.yml`: a TRL recipe) with the same keys.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io { path: path.to_owned(), source })?;
        Ok(Self { name: path.display().to_string(), text })
    }

    fn is_yaml(&self) -> bool {
        self.name.ends_with(".yaml") || self.name.ends_with(".yml")
    }

    /// The file's keys and values, in either format.
    fn table(&self) -> Result<toml::Table, ConfigError> {
        match self.is_yaml() {
            true => crate::yaml::to_table(&self.text, &self.name),
            false => self.text.parse().map_err(|e| crate::toml_error(e, &self.text, &self.name)),
        }
    }

    /// The 1-based line that sets `key`, when one does: the key's own, else that of a TRL key
    /// that sets it (`dataset_name` for `train_file`).
    fn line_of(&self, key: &str) -> Option<usize> {
        super::line_of(&self.text, key).or_else(|| {
            let setters = crate::trl::TRL_KEYS.iter().filter(|(k, _)| crate::trl::own_key(k) == Some(key));
            setters.filter_map(|(k, _)| super::line_of(&self.text, k)).min()
        })
    }
}

/// A value as TOML, floats in the shortest form that reads back (`1e-6`, not `0.000001`).
fn show(value: &toml::Value) -> String {
    match value {
        toml::Value::Float(v) if v.is_finite() && *v != 0.0 && !(1e-4..1e15).contains(&v.abs()) => format!("{v:e}"),
        toml::Value::Array(items) => format!("[{}]", items.iter().map(show).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// Keys as a file or the flags gave them, with the keys of dpo-train's own that TRL's among them
/// set ([`crate::trl::own_key`]).
fn with_own_keys(keys: impl IntoIterator<Item = String>) -> BTreeSet<String> {
    let keys: BTreeSet<String> = keys.into_iter().collect();
    let own = keys.iter().filter_map(|k| crate::trl::own_key(k)).map(str::to_owned).collect::<Vec<_>>();
    keys.into_iter().chain(own).collect()
}

/// The effective config, and where each of its values came from.
#[derive(Debug, Clone)]
pub struct Layered {
    pub cfg: TrainConfig,
    file: Option<ConfigFile>,
    file_keys: BTreeSet<String>,
    flag_keys: BTreeSet<String>,
}

impl Layered {
    /// TRL's defaults, then `file`, then `overrides` (`(key, text)` in snake_case).
    pub fn new(file: Option<ConfigFile>, overrides: &[(String, String)]) -> Result<Self, ConfigError> {
        // The file's table, read once: its keys (a flat table: every key is top-level), the
        // config it sets over TRL's defaults, and its `eval_strategy`, which that config drops.
        let (base, file_keys, file_strategy) = match &file {
            Some(f) => {
                let table = f.table()?;
                let (keys, strategy) = (table.keys().cloned().collect(), table.get("eval_strategy").cloned());
                (TrainConfig::from_table(table, &f.text, &f.name)?, keys, strategy)
            }
            None => (TrainConfig::default(), BTreeSet::new(), None),
        };
        let cfg = base.with_overrides(overrides)?;
        let flag_keys = with_own_keys(overrides.iter().map(|(k, _)| k.clone()));
        let file_keys = with_own_keys(file_keys);
        let mut layered = Self { cfg, file, file_keys, flag_keys };
        let strategy = match overrides.iter().rev().find(|(k, _)| k == "eval_strategy") {
            Some((_, text)) => Some(crate::trl::flag_value(text)),
            None => file_strategy,
        };
        if strategy.as_ref().and_then(toml::Value::as_str) == Some("steps") {
            layered.evaluate_as_trl_script().map_err(|e| layered.locate(e))?;
        }
        Ok(layered)
    }

    /// `eval_strategy = "steps"` without `eval_file`: TRL's script evaluates on the training
    /// dataset's test split, so a dataset directory or Hub name `train_file` is read for
    /// `eval_file` too (its `dataset_test_split`); a single file, or one saved `Dataset`, has no
    /// such split.
    fn evaluate_as_trl_script(&mut self) -> Result<(), ConfigError> {
        let cfg = &mut self.cfg;
        if cfg.eval_file.is_some() || cfg.eval_steps == Some(crate::Steps::Every(0)) {
            return Ok(());
        }
        if cfg.train_file.is_empty() || dpo_base::hub::is_unsplit_data(&cfg.train_file) {
            let message = "`\"steps\"` evaluates on held-out data, and `eval_file` is not set (TRL's script reads the test split of `dataset_name`, a dataset with splits, not a file or one saved `Dataset`): set `eval_file`".to_owned();
            return Err(ConfigError::Invalid { key: "eval_strategy", message });
        }
        cfg.eval_file = Some(cfg.train_file.clone());
        // It comes from where `eval_strategy` was set, not from TRL's defaults.
        let keys = match self.origin("eval_strategy") {
            Origin::Flag => &mut self.flag_keys,
            _ => &mut self.file_keys,
        };
        keys.insert("eval_file".to_owned());
        Ok(())
    }

    /// [`TrainConfig::find_in_hub_cache`], with an error located where the name was set.
    pub fn find_in_hub_cache(&mut self) -> Result<Vec<crate::hub::Found>, ConfigError> {
        self.cfg.find_in_hub_cache().map_err(|e| self.locate(e))
    }

    /// Where `key`'s value came from (a flag wins over the file).
    pub fn origin(&self, key: &str) -> Origin {
        if self.flag_keys.contains(key) {
            Origin::Flag
        } else if self.file_keys.contains(key) {
            Origin::File
        } else {
            Origin::Default
        }
    }

    /// The config file's name, if any.
    pub fn file_name(&self) -> Option<&str> {
        self.file.as_ref().map(|f| f.name.as_str())
    }

    /// [`TrainConfig::validate`], with an invalid value located where it was set.
    pub fn validate(&self) -> Result<crate::RunPlan, ConfigError> {
        self.cfg.resolve().map_err(|e| self.locate(e))
    }

    /// Adds the file and line, or the flag, to an error about one key.
    pub fn locate(&self, err: ConfigError) -> ConfigError {
        let ConfigError::Invalid { key, message } = err else { return err };
        let place = match (self.origin(key), &self.file) {
            (Origin::Flag, _) => format!("`{}`", dpo_vocab::flag(key)),
            (Origin::File, Some(file)) => match file.line_of(key) {
                Some(line) => format!("`{}`, line {line}: `{key}`", file.name),
                None => format!("`{}`: `{key}`", file.name),
            },
            _ => return ConfigError::Invalid { key, message },
        };
        ConfigError::At { place, key, message }
    }

    /// The effective config, one key per line, each marked with its origin:
    /// `beta = 0.1  # default`; then the optional keys nobody set, on one line.
    pub fn describe(&self) -> String {
        let Ok(toml::Value::Table(mut table)) = toml::Value::try_from(&self.cfg) else { return self.cfg.to_toml() };
        // bf16 left unset means TRL's `bf16 = not fp16`: show what it resolves to.
        table.entry("bf16").or_insert(toml::Value::Boolean(self.cfg.bf16()));
        let lines: Vec<(String, Origin)> = KEYS
            .iter()
            .filter_map(|k| table.get(k.name).map(|v| (format!("{} = {}", k.name, show(v)), self.origin(k.name))))
            .collect();
        let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0).min(60);
        let mut text: String =
            lines.iter().map(|(line, origin)| format!("{line:<width$}  # {}\n", origin.label())).collect();
        let unset: Vec<&str> = KEYS.iter().map(|k| k.name).filter(|name| !table.contains_key(*name)).collect();
        if !unset.is_empty() {
            text.push_str(&format!("# unset: {}\n", unset.join(", ")));
        }
        text
    }

    /// One line saying what the origins mean: `from `x.toml`, flags and TRL's defaults`.
    pub fn sources(&self) -> String {
        match self.file_name() {
            Some(name) => format!("file `{name}`, flags, and TRL's DPOConfig defaults for the rest"),
            None => "flags, and TRL's DPOConfig defaults for the rest".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> Option<ConfigFile> {
        Some(ConfigFile { name: "c.toml".into(), text: text.into() })
    }

    /// A TRL YAML recipe layers as its TOML translation would: TRL's keys translated, a wrong
    /// value named by its line in the YAML.
    #[test]
    fn a_yaml_recipe_layers_as_its_toml_would() {
        let yaml = |text: &str| Some(ConfigFile { name: "recipes/dpo.yaml".into(), text: text.into() });
        let recipe = "model_name_or_path: m\ndataset_name: trl-lib/ufb\nbeta: 0.2\nuse_peft: true\n\
                      eval_strategy: steps\ndtype: bfloat16\n";
        let l = Layered::new(yaml(recipe), &[]).unwrap();
        assert_eq!((l.cfg.loss.beta, l.cfg.lora_r, l.cfg.train_file.as_str()), (0.2, Some(16), "trl-lib/ufb"));
        assert_eq!(l.cfg.eval_file.as_deref(), Some("trl-lib/ufb"));
        assert_eq!((l.origin("beta"), l.origin("eval_file")), (Origin::File, Origin::File));
        // What TRL's names set is the file's, and located at their lines.
        let l = Layered::new(yaml("beta: 0.1\ndataset_name: d\nactivation_checkpointing: false\n"), &[]).unwrap();
        let text = l.describe();
        for line in ["train_file = \"d\"", "gradient_checkpointing = false"] {
            assert!(text.lines().any(|x| x.starts_with(line) && x.ends_with("# file")), "{line}: {text}");
        }
        let err = l.locate(ConfigError::Invalid { key: "train_file", message: "m".into() }).to_string();
        assert_eq!(err, "`recipes/dpo.yaml`, line 2: `train_file`: m");
        let err = Layered::new(yaml("beta: 0.1\nlearning_rate: fast\n"), &[]).unwrap_err().to_string();
        assert!(err.starts_with("`recipes/dpo.yaml`, line 2: `learning_rate`: "), "{err}");
        let err = Layered::new(yaml("beta: 0.1\npush_to_hub: true\n"), &[]).unwrap_err().to_string();
        assert!(err.starts_with("`recipes/dpo.yaml`, line 2: `push_to_hub = true` is not supported"), "{err}");
        assert!(ConfigFile::read(Path::new("absent.toml")).unwrap_err().to_string().starts_with("cannot read"));
    }

    #[test]
    fn each_value_knows_its_layer() {
        let l = Layered::new(file("beta = 0.2\nmax_length = 512\n"), &[("max_length".into(), "256".into())]).unwrap();
        assert_eq!((l.cfg.loss.beta, l.cfg.max_length, l.cfg.learning_rate), (0.2, 256, 1e-6));
        assert_eq!(l.origin("beta"), Origin::File);
        assert_eq!(l.origin("max_length"), Origin::Flag);
        assert_eq!(l.origin("learning_rate"), Origin::Default);
        let text = l.describe();
        assert!(text.lines().any(|x| x.starts_with("beta = 0.2") && x.ends_with("# file")), "{text}");
        assert!(text.lines().any(|x| x.starts_with("max_length = 256") && x.ends_with("# flag")), "{text}");
        assert!(text.lines().any(|x| x.starts_with("learning_rate = 1e-6") && x.ends_with("# default")), "{text}");
    }

    #[test]
    fn invalid_values_are_located_in_the_file_or_the_flag() {
        let base = "model_name_or_path = \"m\"\ntrain_file = \"d.jsonl\"\n";
        let l = Layered::new(file(&format!("{base}\n  learning_rate = -1.0\n")), &[]).unwrap();
        assert_eq!(
            l.validate().unwrap_err().to_string(),
            "`c.toml`, line 4: `learning_rate`: must be finite and > 0, got -1"
        );
        let l = Layered::new(file(base), &[("learning_rate".into(), "0".into())]).unwrap();
        assert_eq!(l.validate().unwrap_err().to_string(), "`--learning-rate`: must be finite and > 0, got 0");
        let l = Layered::new(None, &[]).unwrap();
        assert!(l.validate().unwrap_err().to_string().starts_with("`model_name_or_path`: is required"));
    }

    /// TRL's command line: transformers' boolean spellings, TRL's keys as flags, and
    /// `eval_strategy = "steps"` reading the training dataset's test split.
    #[test]
    fn trl_flags_layer_as_trl_reads_them() {
        let flags = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        let l = Layered::new(
            None,
            &flags(&[
                ("train_file", "trl-lib/ufb"),
                ("bf16", "True"),
                ("gradient_checkpointing", "0"),
                ("push_to_hub", "False"),
                ("eval_strategy", "steps"),
                ("use_peft", "true"),
            ]),
        )
        .unwrap();
        assert_eq!((l.cfg.bf16, l.cfg.gradient_checkpointing, l.cfg.lora_r), (Some(true), false, Some(16)));
        assert_eq!(l.cfg.eval_file.as_deref(), Some("trl-lib/ufb"));
        let refused = Layered::new(None, &flags(&[("push_to_hub", "True")])).unwrap_err().to_string();
        assert_eq!(
            refused,
            "`--push-to-hub`: `push_to_hub = true` is not supported by dpo-train: dpo-train does not upload"
        );
        let file = Layered::new(None, &flags(&[("train_file", "d.jsonl"), ("eval_strategy", "steps")])).unwrap_err();
        assert!(file.to_string().starts_with("`--eval-strategy`: `\"steps\"` evaluates on held-out data"), "{file}");
    }

    #[test]
    fn trls_defaults_apply_to_what_nobody_set() {
        let cfg = TrainConfig::default();
        assert_eq!((cfg.loss.beta, cfg.learning_rate, cfg.max_length), (0.1, 1e-6, 1024));
        assert_eq!(cfg.loss.loss_type, vec![crate::LossType::Sigmoid]);
        assert_eq!((cfg.warmup_steps, cfg.warmup_ratio, cfg.sft_steps), (0.0, 0.0, 0));
        assert_eq!(
            (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps, cfg.num_train_epochs),
            (8, 1, 3.0)
        );
        assert_eq!(
            (cfg.logging_steps, cfg.save_steps, cfg.seed),
            (crate::Steps::Every(10), crate::Steps::Every(500), 42)
        );
        assert!(cfg.eval_file.is_none() && cfg.gradient_checkpointing && cfg.bf16());
        assert!(!TrainConfig { fp16: true, ..TrainConfig::default() }.bf16());
    }
}
