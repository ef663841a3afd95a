//! A dataset card's `configs` (the YAML block that opens a repository's `README.md`), as
//! `datasets` reads them (`utils/metadata.py` `MetadataConfigs`, `load.py`
//! `create_builder_configs_from_metadata_configs`, `data_files.py` `sanitize_patterns`): each
//! configuration names its splits' files by glob patterns (`data_files`), or a directory laid out
//! as any other (`data_dir`). The configuration read is the one asked for (TRL's
//! `dataset_config`), else the card's default: the only one, the one named `default`, or the one
//! marked `default: true`.

use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use crate::error::DataError;

/// What a card says of a directory's files.
pub(super) enum Card {
    /// A configuration's splits, each with its patterns (relative to the directory).
    Patterns(Vec<(String, Vec<String>)>),
    /// A configuration whose files are found in this sub-directory as in any directory.
    DataDir(String),
}

/// The configuration `config` (or the default one) of `dir`'s card; `None` where the directory
/// has no card with `configs` (and no configuration was asked for).
pub(super) fn read(dir: &Path, config: Option<&str>) -> Option<Result<Card, DataError>> {
    let (card, configs) = match card_configs(dir) {
        Ok(found) => found,
        Err(e) => return Some(Err(e)),
    };
    if configs.is_empty() && config.is_none() {
        return None;
    }
    let names = || configs.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    let chosen = match config {
        Some(name) => {
            let found = configs.iter().find(|(n, _)| n == name).map(|(n, node)| (n.as_str(), node));
            found.ok_or_else(|| match configs.is_empty() {
                true => format!("no configuration `{name}` (`dataset_config`): its card names no `configs`"),
                false => format!("no configuration `{name}` (`dataset_config`); its card names {}", names()),
            })
        }
        None => default_config(&configs).map_err(|m| format!("{m}; choose one with `dataset_config`: {}", names())),
    };
    let card_of = |(name, node)| card_of(node).map_err(|m| format!("configuration `{name}`: {m}"));
    Some(chosen.and_then(card_of).map_err(|m| layout(&card, m)))
}

/// The card's configurations and the file they come from: a standalone `.huggingface.yaml`'s,
/// which override the README's (as `datasets` merges them), else the README's YAML block's.
fn card_configs(dir: &Path) -> Result<(PathBuf, Vec<(String, Yaml)>), DataError> {
    let standalone = dir.join(".huggingface.yaml");
    let readme = dir.join("README.md");
    let yaml = |path: &Path| std::fs::read_to_string(path).ok();
    let blocks =
        [(standalone.clone(), yaml(&standalone)), (readme.clone(), yaml(&readme).and_then(|t| front_matter(&t)))];
    for (path, text) in blocks {
        let found = text.map(|t| configs(&t)).transpose().map_err(|m| layout(&path, m))?.unwrap_or_default();
        if !found.is_empty() {
            return Ok((path, found));
        }
    }
    Ok((readme, Vec::new()))
}

fn layout(path: &Path, message: String) -> DataError {
    DataError::Layout { path: path.to_path_buf(), message }
}

/// The YAML between a `README.md`'s opening `---` line (white space may precede it) and the next
/// (huggingface_hub's `REGEX_YAML_BLOCK`).
fn front_matter(text: &str) -> Option<String> {
    let mut lines = text.strip_prefix('\u{feff}').unwrap_or(text).trim_start().lines();
    if lines.next()? != "---" {
        return None;
    }
    let mut block = Vec::new();
    for line in lines {
        if line.trim_end_matches([' ', '\t']) == "---" {
            return Some(block.join("\n"));
        }
        block.push(line);
    }
    None
}

/// The card's configurations by name, in its order.
fn configs(yaml: &str) -> Result<Vec<(String, Yaml)>, String> {
    let docs = match YamlLoader::load_from_str(yaml) {
        Ok(docs) => docs,
        // A block this parser refuses and that names no `configs` cannot choose the files.
        Err(_) if !yaml.lines().any(|l| l.starts_with("configs:")) => return Ok(Vec::new()),
        Err(e) => return Err(format!("its YAML block does not parse ({e})")),
    };
    let Some(configs) = docs.first().map(|d| &d["configs"]).filter(|c| !c.is_badvalue() && !c.is_null()) else {
        return Ok(Vec::new());
    };
    let Yaml::Array(items) = configs else {
        return Err("`configs` is not a list".to_owned());
    };
    items
        .iter()
        .map(|item| match item["config_name"].as_str() {
            Some(name) => Ok((name.to_owned(), item.clone())),
            None => Err("a configuration has no `config_name`".to_owned()),
        })
        .collect()
}

/// `get_default_config_name`: the only configuration, or the one named `default` or marked
/// `default: true`; more than one such is an error, as none is where there are several.
fn default_config(configs: &[(String, Yaml)]) -> Result<(&str, &Yaml), String> {
    // PyYAML reads YAML 1.1, whose booleans include `yes` and `on`.
    let truthy = |v: &Yaml| match v {
        Yaml::Boolean(b) => *b,
        Yaml::String(s) => ["yes", "Yes", "YES", "on", "On", "ON", "True", "TRUE", "true"].contains(&s.as_str()),
        _ => false,
    };
    let is_default =
        |(name, node): &&(String, Yaml)| configs.len() == 1 || name == "default" || truthy(&node["default"]);
    let defaults: Vec<&(String, Yaml)> = configs.iter().filter(is_default).collect();
    match defaults.as_slice() {
        [(name, node)] => Ok((name, node)),
        [] => Err("its card names several configurations and none is the default".to_owned()),
        [(a, _), (b, ..), ..] => Err(format!("its card has several default configurations, `{a}` and `{b}`")),
    }
}

/// One configuration's files: `data_files` (`sanitize_patterns`: a pattern or a list of them for
/// `train`, or a list of `{split, path}`), else `data_dir`.
fn card_of(node: &Yaml) -> Result<Card, String> {
    let patterns = |v: &Yaml| -> Option<Vec<String>> {
        match v {
            Yaml::String(s) => Some(vec![s.clone()]),
            Yaml::Array(a) => a.iter().map(|p| p.as_str().map(str::to_owned)).collect(),
            _ => None,
        }
    };
    let files = &node["data_files"];
    if files.is_badvalue() || files.is_null() {
        return match node["data_dir"].as_str() {
            Some(dir) => Ok(Card::DataDir(dir.to_owned())),
            None => Ok(Card::DataDir(String::new())),
        };
    }
    let bad = || "`data_files` is neither a pattern, a list of patterns nor a list of `{split, path}`".to_owned();
    let splits = match files {
        Yaml::Array(items) if items.iter().any(|i| matches!(i, Yaml::Hash(_))) => items
            .iter()
            .map(|i| Some((i["split"].as_str()?.to_owned(), patterns(&i["path"])?)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?,
        other => vec![("train".to_owned(), patterns(other).ok_or_else(bad)?)],
    };
    let base = node["data_dir"].as_str().map_or(String::new(), |d| format!("{}/", d.trim_end_matches('/')));
    Ok(Card::Patterns(splits.into_iter().map(|(s, p)| (s, p.iter().map(|p| format!("{base}{p}")).collect())).collect()))
}

/// The files among `files` (relative, `/`-separated, sorted) that `patterns` match, pattern by
/// pattern as `datasets` resolves them (`resolve_pattern`): a file `FILES_TO_IGNORE` names, or one
/// in a `__`-named directory, only where the pattern names it; a pattern that matches nothing is
/// an error where it names one file, and matches nothing where it is a glob.
pub(super) fn resolve(dir: &Path, files: &[String], patterns: &[String]) -> Result<Vec<PathBuf>, DataError> {
    let mut out = Vec::new();
    for pattern in patterns {
        let pattern = pattern.trim_start_matches("./");
        let found: Vec<&String> = files.iter().filter(|f| glob(pattern, f) && requested(f, pattern)).collect();
        if found.is_empty() && !pattern.contains(['*', '?', '[']) {
            let message = format!("the card names `{pattern}`, which is no data file here");
            return Err(layout(dir, message));
        }
        out.extend(found.into_iter().map(|f| dir.join(f)));
    }
    if out.is_empty() {
        let message = format!("the card's patterns {} match no data file", patterns.join(", "));
        return Err(layout(dir, message));
    }
    Ok(out)
}

/// `datasets`' `FILES_TO_IGNORE`: never data, unless a pattern names one.
const FILES_TO_IGNORE: [&str; 6] =
    ["README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip", "dataset_dict.json"];

/// Whether `pattern` asks for `path` as `datasets` reads it: an ignored file name only by name,
/// a file in `__`-named directories (`__pycache__`) only where the pattern names as many.
pub(super) fn requested(path: &str, pattern: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let named = pattern.rsplit('/').next() == Some(name);
    let special =
        |p: &str| p.rsplit_once('/').map_or(0, |(dirs, _)| dirs.split('/').filter(|d| d.starts_with("__")).count());
    (named || !FILES_TO_IGNORE.contains(&name)) && special(path) == special(pattern)
}

/// fsspec's glob over `/`-separated paths: `**` spans any number of directories, `*` and `?`
/// stay within a name, `[...]` is a character class.
fn glob(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = pattern.split('/').collect();
    let path: Vec<&str> = path.split('/').collect();
    segments(&pattern, &path)
}

fn segments(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.split_first(), path.split_first()) {
        (None, None) => true,
        (Some((&"**", rest)), _) => segments(rest, path) || (!path.is_empty() && segments(pattern, &path[1..])),
        (Some((p, rest)), Some((name, names))) => name_matches(p.as_bytes(), name.as_bytes()) && segments(rest, names),
        _ => false,
    }
}

/// One name against one pattern segment (`*`, `?`, `[abc]`, `[!abc]`, `[a-z]`).
fn name_matches(p: &[u8], s: &[u8]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some(b'*') => (0..=s.len()).any(|i| name_matches(&p[1..], &s[i..])),
        Some(b'?') => !s.is_empty() && name_matches(&p[1..], &s[1..]),
        Some(b'[') if p.contains(&b']') => {
            let Some(end) = p.iter().skip(2).position(|&b| b == b']').map(|i| i + 2) else { return false };
            let (negate, class) = match p[1] {
                b'!' | b'^' => (true, &p[2..end]),
                _ => (false, &p[1..end]),
            };
            let Some(&c) = s.first() else { return false };
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == b'-' {
                    hit |= class[i] <= c && c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == c;
                    i += 1;
                }
            }
            hit != negate && name_matches(&p[end + 1..], &s[1..])
        }
        Some(&b) => s.first() == Some(&b) && name_matches(&p[1..], &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_fsspec_does() {
        assert!(glob("data/train-*", "data/train-00000-of-00001.parquet"));
        assert!(!glob("data/train-*", "data/sub/train-0.parquet"));
        assert!(glob("**/train*.jsonl", "a/b/train_1.jsonl"));
        assert!(glob("**/train*.jsonl", "train.jsonl"));
        assert!(glob("data/**", "data/x/y.csv"));
        assert!(glob("part[0-1]/?.csv", "part1/a.csv"));
        assert!(!glob("part[!0-1]/?.csv", "part1/a.csv"));
        assert!(!glob("train.jsonl", "train.jsonl.gz"));
    }

    #[test]
    fn front_matter_and_default_config() {
        let text = "---\nconfigs:\n- config_name: a\n  data_files: a/*.jsonl\n- config_name: b\n  default: true\n  data_files:\n  - split: train\n    path: [b/x-*, b/y-*]\n  - split: test\n    path: b/t.csv\n---\n# Card\n";
        let yaml = front_matter(text).unwrap();
        let configs = configs(&yaml).unwrap();
        let (name, node) = default_config(&configs).unwrap();
        assert_eq!(name, "b");
        let Ok(Card::Patterns(splits)) = card_of(node) else { panic!("patterns") };
        assert_eq!(
            splits,
            [("train".into(), vec!["b/x-*".into(), "b/y-*".into()]), ("test".into(), vec!["b/t.csv".into()])]
        );
        let Ok(Card::Patterns(splits)) = card_of(&configs[0].1) else { panic!("patterns") };
        assert_eq!(splits, [("train".to_owned(), vec!["a/*.jsonl".to_owned()])]);
        assert!(front_matter("# no card\n").is_none());
        // A block that does not parse matters only where it names configurations.
        assert!(super::configs("license: [mit\n").unwrap().is_empty());
        assert!(super::configs("configs: [\n").unwrap_err().starts_with("its YAML block does not parse"));
    }
}
