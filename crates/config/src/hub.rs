//! The model, tokenizer and data keys given as Hugging Face Hub names (`Qwen/Qwen2.5-0.5B`, as
//! TRL's scripts take them) read from the local hub cache: each becomes its snapshot's directory,
//! so the saved config names exactly the files trained on (a later download that moves `main`
//! does not change what `--resume` reads).

use std::path::PathBuf;

use dpo_base::hub::{self, Kind};

use crate::{ConfigError, TrainConfig};

/// A value the hub cache resolved: the key, the name given and the snapshot's directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub key: &'static str,
    pub name: String,
    pub dir: PathBuf,
}

impl Found {
    /// The line a run prints about it.
    pub fn describe(&self) -> String {
        format!("`{}` = `{}`: the Hugging Face cache's snapshot `{}`", self.key, self.name, self.dir.display())
    }
}

/// `demo` names the embedded demo's model and data, never a repository.
const DEMO: &str = "demo";

impl TrainConfig {
    /// Replaces each model, tokenizer and data value that is no local path but a repository the
    /// hub cache holds by its snapshot's directory. An `owner/name` found neither here nor in the
    /// cache is an error naming the key and how to download it.
    pub fn find_in_hub_cache(&mut self) -> Result<Vec<Found>, ConfigError> {
        let mut found = Vec::new();
        let mut look = |key: &'static str, value: &str, kind: Kind| -> Result<Option<PathBuf>, ConfigError> {
            if value == DEMO {
                return Ok(None);
            }
            let dir = hub::locate(value, kind).map_err(|e| ConfigError::Invalid { key, message: e.to_string() })?;
            if let Some(dir) = &dir {
                found.push(Found { key, name: value.to_owned(), dir: dir.clone() });
            }
            Ok(dir)
        };
        let text = |dir: PathBuf| dir.to_string_lossy().into_owned();
        if let Some(dir) = look("model_name_or_path", &self.model_name_or_path, Kind::Model)? {
            self.model_name_or_path = text(dir);
        }
        for (key, value) in [
            ("ref_model_name_or_path", &mut self.ref_model_name_or_path),
            ("tokenizer_name_or_path", &mut self.tokenizer_name_or_path),
        ] {
            let Some(path) = value.as_ref().and_then(|p| p.to_str()) else { continue };
            if let Some(dir) = look(key, path, Kind::Model)? {
                *value = Some(dir);
            }
        }
        if let Some(dir) = look("train_file", &self.train_file, Kind::Dataset)? {
            self.train_file = text(dir);
        }
        for (key, value) in [("eval_file", &mut self.eval_file), ("test_file", &mut self.test_file)] {
            let Some(name) = value.as_deref() else { continue };
            if let Some(dir) = look(key, name, Kind::Dataset)? {
                *value = Some(text(dir));
            }
        }
        Ok(found)
    }
}
