//! Reading a config: TOML text into [`TrainConfig`], and `--key value` flags on top, each error
//! one line naming the file, line and key (with the closest known key or value where one is near).

use std::path::Path;

use super::{ConfigError, KEYS, TrainConfig, parse_key, trl};

impl TrainConfig {
    /// Reads a TOML file; unknown keys and wrong types are errors naming the line.
    pub fn from_toml_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io { path: path.to_owned(), source })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses TOML text; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::from_table(text.parse().map_err(|e| toml_error(e, text, origin))?, text, origin)
    }

    /// The config a file's table of keys sets (`text` is the file, for the line of a key).
    pub fn from_table(mut table: toml::Table, text: &str, origin: &str) -> Result<Self, ConfigError> {
        // The loss keys are a flattened struct, which serde cannot combine with
        // `deny_unknown_fields`: unknown keys are refused here, with the closest known one.
        let located = |key: &str, message: String| ConfigError::Toml {
            path: origin.to_owned(),
            line: line_of(text, key).unwrap_or(0),
            message,
        };
        let at = |key: &str, message: String| located(key, format!("`{key}`: {message}"));
        trl::accept_trl_keys(&mut table).map_err(|(key, message)| located(&key, message))?;
        if let Some(key) = table.keys().find(|k| !KEYS.iter().any(|d| d.name == k.as_str())) {
            let candidates: Vec<&str> = KEYS.iter().map(|d| d.name).collect();
            let message = match closest(key, &candidates) {
                Some(best) => format!("unknown key `{key}`; did you mean `{best}`?"),
                None => format!("unknown key `{key}` (`dpo-train --help` lists every key)"),
            };
            return Err(located(key, message));
        }
        strings_as_lists(&mut table).map_err(|(key, message)| at(key, message))?;
        // Each key alone first: serde loses the position inside the flattened loss keys, so a
        // wrong type is blamed on the line that sets it.
        for (key, value) in &table {
            let alone = toml::Table::from_iter([(key.clone(), value.clone())]);
            toml::Value::Table(alone)
                .try_into::<Self>()
                .map_err(|e| at(key, with_suggestion(e.message().lines().next().unwrap_or("invalid value"))))?;
        }
        toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| ConfigError::Toml {
            path: origin.to_owned(),
            line: 0,
            message: e.message().to_owned(),
        })
    }

    /// Applies `--key value` overrides (keys in snake_case) on top of this config.
    pub fn with_overrides(self, overrides: &[(String, String)]) -> Result<Self, ConfigError> {
        if overrides.is_empty() {
            return Ok(self);
        }
        let toml::Value::Table(mut table) =
            toml::Value::try_from(&self).map_err(|e| ConfigError::Invalid { key: "config", message: e.to_string() })?
        else {
            unreachable!("a struct serialises to a table")
        };
        for (key, text) in overrides {
            let flag = dpo_vocab::flag_name(key);
            if trl::is_trl_key(key) {
                // As the same key in a file: accepted, translated or refused.
                table.insert(key.clone(), trl::flag_value(text));
                trl::accept_trl_keys(&mut table).map_err(|(_, message)| ConfigError::Flag { flag, message })?;
                continue;
            }
            let value = parse_key(key, text)
                .ok_or_else(|| ConfigError::Flag { flag: flag.clone(), message: "unknown option".to_owned() })?
                .map_err(|message| ConfigError::Flag { flag: flag.clone(), message })?;
            // Checked alone, so a bad value is blamed on its own flag.
            let alone = toml::Table::from_iter([(key.clone(), value.clone())]);
            toml::Value::Table(alone)
                .try_into::<Self>()
                .map_err(|e| ConfigError::Flag { flag: flag.clone(), message: with_suggestion(e.message()) })?;
            table.insert(key.clone(), value);
        }
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Invalid { key: "config", message: e.message().to_owned() })
    }
}

/// TRL's `DPOConfig` takes `loss_type = "ipo"` for `["ipo"]`, transformers `report_to = "none"`,
/// and PEFT `target_modules = "all-linear"`: such a string becomes a one-element list. PEFT reads
/// any other single string as a regular expression, which dpo-train does not implement.
fn strings_as_lists(table: &mut toml::Table) -> Result<(), (&'static str, String)> {
    for key in ["loss_type", "report_to", "lora_target_modules"] {
        let Some(toml::Value::String(one)) = table.get(key) else { continue };
        if key == "lora_target_modules" && one != "all-linear" {
            let message = format!(
                "a single string is a regular expression in PEFT, which dpo-train does not implement: \
                 write a list ([\"{one}\"]) or `all-linear`"
            );
            return Err((key, message));
        }
        let list = toml::Value::Array(vec![toml::Value::String(one.clone())]);
        table.insert(key.to_owned(), list);
    }
    Ok(())
}

/// Turns a TOML error into one line naming the file, line and key.
pub(crate) fn toml_error(e: toml::de::Error, text: &str, origin: &str) -> ConfigError {
    let line = e.span().map_or(0, |span| text[..span.start.min(text.len())].matches('\n').count() + 1);
    let message = e.message().lines().next().unwrap_or("invalid TOML");
    ConfigError::Toml { path: origin.to_owned(), line, message: with_suggestion(message) }
}

/// serde's "unknown variant `x`, expected one of `a`, `b`, ..." becomes "unknown value `x`; did
/// you mean `a`?" when one is close.
fn with_suggestion(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown variant ") else { return plain_types(message) };
    let names: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    let Some((given, candidates)) = names.split_first() else { return message.to_owned() };
    match closest(given, candidates) {
        Some(best) => format!("unknown value `{given}`; did you mean `{best}`?"),
        None => message.to_owned(),
    }
}

/// serde's Rust type names in a user's words: "expected f64" is "expected a number".
fn plain_types(message: &str) -> String {
    let whole = ["u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize"];
    let mut out = message.replace("expected f64", "expected a number").replace("expected f32", "expected a number");
    for t in whole {
        out = out.replace(&format!("expected {t}"), "expected a whole number");
    }
    out
}

/// The candidate a misspelling most likely meant: within a third of its length in edits.
fn closest<'a>(given: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (strsim::levenshtein(given, c), *c))
        .filter(|(d, c)| *d <= (c.len() / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// The 1-based line of a flat TOML file that sets `key`, when one does.
pub(crate) fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            // `key = ...`, `"key" = ...`, a table `[key]` / `[[key]]`, or YAML's `key: ...`.
            let header =
                line.trim_start_matches('[').strip_prefix(key).is_some_and(|r| r.trim_start().starts_with(']'));
            let rest = line.strip_prefix(key).or_else(|| line.strip_prefix(&format!("\"{key}\"")));
            header && line.starts_with('[') || rest.is_some_and(|r| r.trim_start().starts_with(['=', ':']))
        })
        .map(|i| i + 1)
}
