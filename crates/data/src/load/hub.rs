//! A dataset directory as `hf download --repo-type dataset` leaves it: one split's files found
//! the way `datasets` resolves a repository without a loading script (`data_files.py`,
//! `get_data_patterns`), its shards in name order. First the hub's sharded layout
//! (`data/<split>-00000-of-00002.parquet`, any split name); else the splits `train`, `validation`
//! and `test` by their keywords (`training`; `valid`, `dev`, `val`; `testing`, `eval`,
//! `evaluation`) in a directory's name at any depth (`train/`, `my-test/`), else in a file's
//! (`train.jsonl.gz`, `harmless-base/train.jsonl.gz`, `my_test_0.csv`), a keyword standing between
//! `-._ 0-9` or the name's ends; else every data file is `train`'s. `tests/it/hub_data.rs` holds
//! each layout to `datasets`' own resolution.
//!
//! A directory `save_to_disk` wrote is read as `datasets.load_from_disk` reads it: one saved
//! `Dataset` (`state.json`) whole, whichever split is asked for, as a single file is; a saved
//! `DatasetDict` (`dataset_dict.json`) by its split's directory. Either lists its Arrow files.

use std::path::{Path, PathBuf};

use dpo_base::hub::is_data_file_name as is_data_file;
use dpo_base::hub::{SAVED_DATASET, SAVED_DATASET_DICT};
use serde_json::Value;

use super::card::{self, Card};
use crate::error::DataError;

/// `datasets`' split keywords (`SPLIT_KEYWORDS`), and the characters that may stand around them.
const SPLIT_KEYWORDS: [(&str, &[&str]); 3] = [
    ("train", &["train", "training"]),
    ("validation", &["validation", "valid", "dev", "val"]),
    ("test", &["test", "testing", "eval", "evaluation"]),
];

fn is_sep(c: char) -> bool {
    matches!(c, '-' | '.' | '_' | ' ' | '0'..='9')
}

/// `name` is `keyword` then a separator and anything (`{keyword}[sep]*`), or holds it between
/// separators (`*[sep]{keyword}[sep]*`); `at_end` also takes `*[sep]{keyword}` (a directory).
fn has_keyword(name: &str, keyword: &str, at_end: bool) -> bool {
    let starts = name.strip_prefix(keyword).is_some_and(|rest| rest.starts_with(is_sep));
    let ends = at_end && name.strip_suffix(keyword).is_some_and(|rest| rest.ends_with(is_sep));
    let inside = name.match_indices(keyword).any(|(at, _)| {
        let (before, after) = (&name[..at], &name[at + keyword.len()..]);
        before.ends_with(is_sep) && after.starts_with(is_sep)
    });
    starts || ends || inside || (at_end && name == keyword)
}

/// The hub's sharded name `data/<split>-NNNNN-of-NNNNN.<ext>`: its split.
fn sharded_split(relative: &str) -> Option<&str> {
    let name = relative.strip_prefix("data/")?;
    let (split, rest) = name.split_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    let (shard, rest) = rest.split_once("-of-")?;
    let count = rest.get(..5)?;
    (digits(shard) && digits(count) && !name.contains('/')).then_some(split)
}

/// Every data file under `dir` (hidden ones aside; links to files, as the hub cache's snapshots
/// hold, included), as `/`-separated paths relative to it, sorted.
fn all_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(sub) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(dir.join(&sub)) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let relative = sub.join(&name);
            // A directory's own entry, not a link's target: a link back up would never end.
            match entry.file_type().is_ok_and(|t| t.is_dir()) {
                true => pending.push(relative),
                false if is_data_file(&name) => out.push(relative.to_string_lossy().replace('\\', "/")),
                false => {}
            }
        }
    }
    out.sort();
    out
}

/// The files of each split, as `datasets` finds them: the first of its layouts that has any
/// (without `all`, none where no file is named for a split).
fn splits(files: &[String], all: bool) -> Vec<(String, Vec<String>)> {
    let mut sharded: Vec<(String, Vec<String>)> = Vec::new();
    for f in files {
        if let Some(split) = sharded_split(f) {
            match sharded.iter_mut().find(|(s, _)| s == split) {
                Some((_, list)) => list.push(f.clone()),
                None => sharded.push((split.to_owned(), vec![f.clone()])),
            }
        }
    }
    if !sharded.is_empty() {
        return sharded;
    }
    // `**/{keyword}/**`, `**/{keyword}[sep]*/**`, `**/*[sep]{keyword}/**`, `**/*[sep]{keyword}[sep]*/**`.
    let in_dir = |f: &str, keyword: &str| {
        let dirs: Vec<&str> = f.split('/').collect();
        dirs[..dirs.len() - 1].iter().any(|d| has_keyword(d, keyword, true))
    };
    let in_name = |f: &str, keyword: &str| has_keyword(f.rsplit('/').next().unwrap_or(f), keyword, false);
    for matches in [&in_dir as &dyn Fn(&str, &str) -> bool, &in_name] {
        let found: Vec<(String, Vec<String>)> = SPLIT_KEYWORDS
            .iter()
            .map(|(split, keywords)| {
                let of = files.iter().filter(|f| keywords.iter().any(|k| matches(f, k))).cloned().collect();
                (split.to_string(), of)
            })
            .filter(|(_, of): &(String, Vec<String>)| !of.is_empty())
            .collect();
        if !found.is_empty() {
            return found;
        }
    }
    match all && !files.is_empty() {
        true => vec![("train".to_owned(), files.to_vec())],
        false => Vec::new(),
    }
}

/// The files of `split` under `dir`, of its card's configuration `config` (or default one) where
/// its `README.md` names `configs`; an error lists what the directory holds when it has no such
/// split, or when the hub's sharded layout and files named for the split elsewhere both do
/// (`datasets` would take the sharded files alone).
pub fn split_files(dir: &Path, split: &str, config: Option<&str>) -> Result<Vec<PathBuf>, DataError> {
    if let Some(saved) = saved_split(dir, split) {
        if let Some(name) = config {
            let message = format!(
                "no configuration `{name}` (`dataset_config`): `save_to_disk` wrote this directory, which has none"
            );
            return Err(DataError::Layout { path: dir.to_path_buf(), message });
        }
        return saved;
    }
    match card::read(dir, config).transpose()? {
        Some(Card::Patterns(splits)) => {
            let Some((_, patterns)) = splits.iter().find(|(s, _)| s == split) else {
                let has = splits.iter().map(|(s, _)| format!("`{s}`")).collect::<Vec<_>>().join(", ");
                let message = format!("the card's configuration has no split `{split}`; it has {has} {CHOOSE_SPLIT}");
                return Err(DataError::Layout { path: dir.to_path_buf(), message });
            };
            card::resolve(dir, &all_files(dir), patterns)
        }
        Some(Card::DataDir(sub)) if !sub.is_empty() => layout_files(&dir.join(sub), split),
        Some(Card::DataDir(_)) | None => layout_files(dir, split),
    }
}

/// The files of `split` in `dir` as `get_data_patterns` finds them.
fn layout_files(dir: &Path, split: &str) -> Result<Vec<PathBuf>, DataError> {
    // Its patterns name no ignored file and no `__`-named directory.
    let files: Vec<String> = all_files(dir).into_iter().filter(|f| card::requested(f, "**")).collect();
    let layout_error = |message: String| DataError::Layout { path: dir.to_path_buf(), message };
    let found = splits(&files, true);
    let Some((_, chosen)) = found.iter().find(|(s, _)| s == split) else {
        return Err(layout_error(format!("no data files for split `{split}`; {}", inventory(dir, &found))));
    };
    if chosen.iter().all(|f| sharded_split(f).is_some()) {
        let rest: Vec<String> = files.iter().filter(|f| sharded_split(f).is_none()).cloned().collect();
        if splits(&rest, false).iter().any(|(s, _)| s == split) {
            return Err(layout_error(format!(
                "split `{split}` is ambiguous: files match data/{split}-* and others outside `data/`; pass one file or a directory with one layout"
            )));
        }
    }
    Ok(chosen.iter().map(|f| dir.join(f)).collect())
}

/// The Arrow files of `split` where `dir` is one `save_to_disk` wrote; `None` where it is not.
fn saved_split(dir: &Path, split: &str) -> Option<Result<Vec<PathBuf>, DataError>> {
    if dir.join(SAVED_DATASET).is_file() {
        return Some(saved_files(dir));
    }
    let dict = dir.join(SAVED_DATASET_DICT);
    if !dict.is_file() {
        return None;
    }
    let splits = read_json(&dict).and_then(|value| {
        let names = value
            .get("splits")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_owned)).collect());
        names.ok_or_else(|| bad_json(&dict, "`splits` is not a list of split names"))
    });
    Some(splits.and_then(|splits: Vec<String>| match splits.iter().any(|s| s == split) {
        true => saved_files(&dir.join(split)),
        false => {
            let has = splits.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ");
            let message = format!("the saved `DatasetDict` has no split `{split}`; it has {has} {CHOOSE_SPLIT}");
            Err(DataError::Layout { path: dir.to_path_buf(), message })
        }
    }))
}

/// The Arrow files a saved `Dataset`'s `state.json` lists (`_data_files`), in its order.
fn saved_files(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let state = dir.join(SAVED_DATASET);
    let value = read_json(&state)?;
    let names: Option<Vec<&str>> = value
        .get("_data_files")
        .and_then(Value::as_array)
        .and_then(|files| files.iter().map(|f| f.get("filename").and_then(Value::as_str)).collect());
    match names {
        Some(names) if !names.is_empty() => Ok(names.iter().map(|n| dir.join(n)).collect()),
        _ => Err(bad_json(&state, "`_data_files` lists no `{\"filename\": ...}` Arrow file")),
    }
}

fn read_json(path: &Path) -> Result<Value, DataError> {
    let text = std::fs::read(path).map_err(|source| DataError::Read { path: path.to_path_buf(), source })?;
    serde_json::from_slice(&text).map_err(|e| bad_json(path, &format!("not `datasets`' JSON ({e})")))
}

fn bad_json(path: &Path, problem: &str) -> DataError {
    let message = format!("{problem}; `datasets.load_from_disk` could not read it either");
    DataError::Layout { path: path.to_path_buf(), message }
}

/// The settings that choose the split read: training's and `eval`'s.
const CHOOSE_SPLIT: &str = "(choose the split with `dataset_train_split` / `dataset_test_split`, or `eval --split`)";

/// What a directory offers: its splits and their files, or that it has no data file.
fn inventory(dir: &Path, found: &[(String, Vec<String>)]) -> String {
    if found.is_empty() {
        return format!(
            "`{}` holds no `.parquet`, `.arrow`, `.jsonl`, `.json`, `.csv` or `.tsv` file (optionally `.gz`)",
            dir.display()
        );
    }
    let shown: Vec<String> = found
        .iter()
        .map(|(split, files)| match files.as_slice() {
            [one] => format!("`{split}` ({one})"),
            many => format!("`{split}` ({}, {} files)", many[0], many.len()),
        })
        .collect();
    format!("it has {} {CHOOSE_SPLIT}", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for f in files {
            let path = dir.path().join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"").unwrap();
        }
        dir
    }

    fn names(dir: &Path, files: Vec<PathBuf>) -> Vec<String> {
        files.iter().map(|f| f.strip_prefix(dir).unwrap().display().to_string()).collect()
    }

    #[test]
    fn the_hubs_layouts_resolve_to_their_shards_in_name_order() {
        let d = tree(&[
            "data/train-00001-of-00002.parquet",
            "data/train-00000-of-00002.parquet",
            "data/test-00000-of-00001.parquet",
            "README.md",
        ]);
        assert_eq!(
            names(d.path(), split_files(d.path(), "train", None).unwrap()),
            ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
        );
        assert_eq!(names(d.path(), split_files(d.path(), "test", None).unwrap()), ["data/test-00000-of-00001.parquet"]);
        let d = tree(&["train.jsonl.gz", "test.jsonl.gz"]);
        assert_eq!(names(d.path(), split_files(d.path(), "train", None).unwrap()), ["train.jsonl.gz"]);
        let d = tree(&["train/a.parquet", "train/b.parquet", "test/a.parquet"]);
        assert_eq!(
            names(d.path(), split_files(d.path(), "train", None).unwrap()),
            ["train/a.parquet", "train/b.parquet"]
        );
        let d = tree(&["data/train_prefs-00000-of-00001.parquet", "data/test_prefs-00000-of-00001.parquet"]);
        assert_eq!(
            names(d.path(), split_files(d.path(), "train_prefs", None).unwrap()),
            ["data/train_prefs-00000-of-00001.parquet"]
        );
    }

    #[test]
    fn a_missing_split_lists_what_is_there_and_two_layouts_are_refused() {
        let d = tree(&["data/train_prefs-00000-of-00001.parquet", "data/test_prefs-00000-of-00001.parquet"]);
        let err = split_files(d.path(), "train", None).unwrap_err().to_string();
        assert!(err.contains("no data files for split `train`"), "{err}");
        assert!(err.contains("data/train_prefs-00000-of-00001.parquet"), "{err}");
        let d = tree(&["README.md"]);
        let err = split_files(d.path(), "train", None).unwrap_err().to_string();
        assert!(err.contains("holds no `.parquet`"), "{err}");
        let d = tree(&["train.jsonl", "data/train-00000-of-00001.parquet"]);
        let err = split_files(d.path(), "train", None).unwrap_err().to_string();
        assert!(err.contains("is ambiguous: files match data/train-* and others outside `data/`"), "{err}");
    }
}
