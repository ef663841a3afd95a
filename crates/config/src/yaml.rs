//! A YAML config (a TRL recipe, as `trl dpo --config recipe.yaml` reads one) as the table a TOML
//! file parses to: the same keys then go through the same checks, TRL's included. Scalars read
//! as YAML 1.2 reads them (`5e-7` is a number, `no` a string), so `eval_strategy: no` is TRL's
//! `"no"`; a null leaves its key unset (TRL's default), but `max_length`'s, which TRL reads as no
//! truncation, is refused.

use yaml_rust2::{Yaml, YamlLoader};

use crate::ConfigError;

/// `text`'s mapping of keys as a TOML table; `origin` names the file in errors.
pub fn to_table(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    let error = |line: usize, message: String| ConfigError::Toml { path: origin.to_owned(), line, message };
    // An error at the end of the text is on its last line (the parser counts one past it).
    let last = text.lines().count().max(1);
    let docs = YamlLoader::load_from_str(text).map_err(|e| error(e.marker().line().min(last), plain(e.info())))?;
    match docs.as_slice() {
        [] => Ok(toml::Table::new()),
        [Yaml::Hash(map)] if map.get(&Yaml::String(NO_TRUNCATION.to_owned())) == Some(&Yaml::Null) => {
            let line = text.lines().position(|l| l.trim_start().starts_with(NO_TRUNCATION)).map_or(0, |i| i + 1);
            let message = format!(
                "`{NO_TRUNCATION}: null` is TRL's \"no truncation\", which dpo-train does not do: set the longest sequence to keep"
            );
            Err(error(line, message))
        }
        [Yaml::Hash(_)] => match value(&docs[0]).map_err(|m| error(0, m))? {
            Some(toml::Value::Table(mut table)) => {
                yaml11_booleans(&mut table);
                Ok(table)
            }
            _ => unreachable!("a mapping converts to a table"),
        },
        [_] => Err(error(1, "a config is a mapping of keys to values (`beta: 0.1`)".to_owned())),
        _ => Err(error(0, "a config is one YAML document; this file holds several".to_owned())),
    }
}

/// The parser's message in the words of the rest: `String("beta"): duplicated key in mapping` is
/// "`beta` is set twice".
fn plain(info: &str) -> String {
    let duplicated = info.strip_suffix(": duplicated key in mapping");
    match duplicated.map(|k| k.strip_prefix("String(\"").and_then(|k| k.strip_suffix("\")")).unwrap_or(k)) {
        Some(key) => format!("`{key}` is set twice"),
        None => info.to_owned(),
    }
}

/// The YAML 1.1 booleans PyYAML (TRL's reader) takes (`gradient_checkpointing: no`), as the
/// booleans they are where a key is one; elsewhere they stay strings (`eval_strategy: no`).
fn yaml11_booleans(table: &mut toml::Table) {
    for (key, value) in table.iter_mut() {
        let boolean = crate::KEYS.iter().any(|k| k.name == key && k.is_bool);
        let word = value.as_str().map(str::to_ascii_lowercase);
        let truth = match word.as_deref() {
            Some("yes" | "y" | "on") => true,
            Some("no" | "n" | "off") => false,
            _ => continue,
        };
        if boolean {
            *value = toml::Value::Boolean(truth);
        }
    }
}

/// The key whose null is not its default in TRL: `max_length: null` keeps whole sequences.
const NO_TRUNCATION: &str = "max_length";

/// A YAML node as a TOML value; `None` for a null.
fn value(node: &Yaml) -> Result<Option<toml::Value>, String> {
    Ok(Some(match node {
        Yaml::Null => return Ok(None),
        Yaml::Boolean(b) => toml::Value::Boolean(*b),
        Yaml::Integer(i) => toml::Value::Integer(*i),
        Yaml::Real(text) => match text.parse::<f64>() {
            Ok(f) => toml::Value::Float(f),
            // `.inf`, `.nan`: YAML's spellings, no config value.
            Err(_) => return Err(format!("`{text}` is not a number a config takes")),
        },
        Yaml::String(s) => toml::Value::String(s.clone()),
        Yaml::Array(items) => {
            toml::Value::Array(items.iter().map(value).filter_map(Result::transpose).collect::<Result<_, _>>()?)
        }
        Yaml::Hash(map) => {
            let mut table = toml::Table::new();
            for (k, v) in map {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    other => return Err(format!("a key must be a name, got `{other:?}`")),
                };
                if let Some(v) = value(v)? {
                    table.insert(key, v);
                }
            }
            toml::Value::Table(table)
        }
        Yaml::Alias(_) | Yaml::BadValue => return Err("YAML aliases are not read".to_owned()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_1_1_booleans_where_a_key_is_boolean() {
        let t = to_table("gradient_checkpointing: no\nbf16: Yes\neval_strategy: no\n", "r.yaml").unwrap();
        assert_eq!(t["gradient_checkpointing"], toml::Value::Boolean(false));
        assert_eq!(t["bf16"], toml::Value::Boolean(true));
        assert_eq!(t["eval_strategy"], toml::Value::String("no".to_owned()));
    }

    #[test]
    fn a_null_max_length_is_refused_on_its_line() {
        let err = to_table("beta: 0.1\nmax_length: null\n", "r.yaml").unwrap_err().to_string();
        assert!(err.starts_with("`r.yaml`, line 2: `max_length: null` is TRL's \"no truncation\""), "{err}");
        assert!(to_table("beta: 0.1\nhub_model_id: null\n", "r.yaml").unwrap().get("hub_model_id").is_none());
    }

    #[test]
    fn a_recipe_reads_as_the_table_its_toml_would() {
        let recipe = "# a TRL recipe\nmodel_name_or_path: Qwen/Qwen2-0.5B-Instruct\nlearning_rate: 5.0e-7\n\
                      beta: 1e-1\nbf16: True\neval_strategy: no\nloss_type: [sigmoid, sft]\n\
                      gradient_checkpointing_kwargs:\n  use_reentrant: false\nhub_model_id: null\n";
        let want = "model_name_or_path = \"Qwen/Qwen2-0.5B-Instruct\"\nlearning_rate = 5.0e-7\nbeta = 0.1\n\
                    bf16 = true\neval_strategy = \"no\"\nloss_type = [\"sigmoid\", \"sft\"]\n\
                    gradient_checkpointing_kwargs = { use_reentrant = false }\n";
        assert_eq!(to_table(recipe, "r.yaml").unwrap(), want.parse::<toml::Table>().unwrap());
    }

    #[test]
    fn what_is_no_mapping_is_one_line_with_its_place() {
        let err = |text: &str| to_table(text, "r.yaml").unwrap_err().to_string();
        assert!(err("beta: [0.1\n").starts_with("`r.yaml`, line 1: "), "{}", err("beta: [0.1\n"));
        assert_eq!(err("beta: 0.1\nbeta: 0.2\n"), "`r.yaml`, line 2: `beta` is set twice");
        assert_eq!(err("- beta\n"), "`r.yaml`, line 1: a config is a mapping of keys to values (`beta: 0.1`)");
        assert_eq!(to_table("", "r.yaml").unwrap(), toml::Table::new());
    }
}
