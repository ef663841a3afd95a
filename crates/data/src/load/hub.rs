//! A dataset directory as `hf download --repo-type dataset` leaves it: one split's
//! files found the way `datasets` resolves a repository without a loading script
//! (`data/<split>-*.parquet`, `<split>-*.parquet`, `<split>.jsonl[.gz]`, `<split>/...`), its
//! shards in name order.

use std::path::{Path, PathBuf};

use dpo_base::hub::is_data_file_name as is_data_file;

use crate::error::DataError;

/// The split a file belongs to by its name, the part before the first `-` or `.`:
/// `train-00000-of-00002.parquet` and `train.jsonl.gz` are `train`'s, `train_prefs-...` is
/// `train_prefs`'s.
fn split_of(name: &str) -> &str {
    let stem = name.split('.').next().unwrap_or(name);
    stem.split('-').next().unwrap_or(stem)
}

/// Data files directly in `dir`, sorted by name.
fn data_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| is_data_file(&n.to_string_lossy())))
        .collect();
    files.sort();
    files
}

/// The files of `split` under `dir`; an error lists what the directory holds when no layout, or
/// more than one, has the split.
pub fn split_files(dir: &Path, split: &str) -> Result<Vec<PathBuf>, DataError> {
    let named = |files: Vec<PathBuf>| -> Vec<PathBuf> {
        files.into_iter().filter(|p| p.file_name().is_some_and(|n| split_of(&n.to_string_lossy()) == split)).collect()
    };
    let layouts = [
        (format!("data/{split}-*"), named(data_files(&dir.join("data")))),
        (format!("{split}-* / {split}.*"), named(data_files(dir))),
        (format!("{split}/*"), data_files(&dir.join(split))),
    ];
    let found: Vec<&(String, Vec<PathBuf>)> = layouts.iter().filter(|(_, files)| !files.is_empty()).collect();
    let layout_error = |message: String| DataError::Layout { path: dir.to_path_buf(), message };
    match found.as_slice() {
        [(_, files)] => Ok(files.clone()),
        [] => Err(layout_error(format!("no data files for split `{split}`; {}", inventory(dir)))),
        several => {
            let names: Vec<&str> = several.iter().map(|(pattern, _)| pattern.as_str()).collect();
            Err(layout_error(format!(
                "split `{split}` is ambiguous: files match {}; pass one file or a directory with one layout",
                names.join(" and ")
            )))
        }
    }
}

/// What a directory offers: its data files' splits, or that it has none.
fn inventory(dir: &Path) -> String {
    let mut files: Vec<String> = Vec::new();
    for sub in [dir.to_path_buf(), dir.join("data")] {
        for f in data_files(&sub) {
            files.push(f.strip_prefix(dir).unwrap_or(&f).display().to_string());
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok).filter(|e| e.path().is_dir()) {
            let (name, inside) = (e.file_name().to_string_lossy().into_owned(), data_files(&e.path()).len());
            if name != "data" && inside > 0 {
                files.push(format!("{name}/ ({inside} files)"));
            }
        }
    }
    files.sort();
    if files.is_empty() {
        "the directory holds no `.parquet`, `.jsonl`, `.json` or `.csv` file (optionally `.gz`)".to_owned()
    } else {
        let shown: Vec<&str> = files.iter().take(8).map(String::as_str).collect();
        let more = if files.len() > 8 { format!(" and {} more", files.len() - 8) } else { String::new() };
        format!("found {}{more} (choose the split with `dataset_train_split` / `dataset_test_split`)", shown.join(", "))
    }
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
            names(d.path(), split_files(d.path(), "train").unwrap()),
            ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
        );
        assert_eq!(names(d.path(), split_files(d.path(), "test").unwrap()), ["data/test-00000-of-00001.parquet"]);
        let d = tree(&["train.jsonl.gz", "test.jsonl.gz"]);
        assert_eq!(names(d.path(), split_files(d.path(), "train").unwrap()), ["train.jsonl.gz"]);
        let d = tree(&["train/a.parquet", "train/b.parquet", "test/a.parquet"]);
        assert_eq!(names(d.path(), split_files(d.path(), "train").unwrap()), ["train/a.parquet", "train/b.parquet"]);
        let d = tree(&["data/train_prefs-00000-of-00001.parquet", "data/test_prefs-00000-of-00001.parquet"]);
        assert_eq!(
            names(d.path(), split_files(d.path(), "train_prefs").unwrap()),
            ["data/train_prefs-00000-of-00001.parquet"]
        );
    }

    #[test]
    fn a_missing_split_lists_what_is_there_and_two_layouts_are_refused() {
        let d = tree(&["data/train_prefs-00000-of-00001.parquet", "data/test_prefs-00000-of-00001.parquet"]);
        let err = split_files(d.path(), "train").unwrap_err().to_string();
        assert!(err.contains("no data files for split `train`"), "{err}");
        assert!(err.contains("data/train_prefs-00000-of-00001.parquet"), "{err}");
        let d = tree(&["README.md"]);
        let err = split_files(d.path(), "train").unwrap_err().to_string();
        assert!(err.contains("holds no `.parquet`"), "{err}");
        let d = tree(&["train.jsonl", "data/train-00000-of-00001.parquet"]);
        let err = split_files(d.path(), "train").unwrap_err().to_string();
        assert!(err.contains("is ambiguous: files match data/train-* and train-* / train.*"), "{err}");
    }
}
