//! Hugging Face Hub names (`Qwen/Qwen2.5-0.5B`, `trl-lib/ultrafeedback_binarized`) found where
//! `hf download` and `from_pretrained` leave them: the hub cache's snapshot of the
//! repository's `main`, as huggingface_hub resolves a name offline
//! (`snapshot_download(name, local_files_only=True)`). dpo-train never downloads.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What a repository holds; the cache keeps each kind in its own folders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Model,
    Dataset,
}

impl Kind {
    fn folder(self) -> &'static str {
        match self {
            Kind::Model => "models",
            Kind::Dataset => "datasets",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Model => "model",
            Kind::Dataset => "dataset",
        }
    }

    fn download(self, id: &str) -> String {
        match self {
            Kind::Model => format!("hf download {id}"),
            Kind::Dataset => format!("hf download --repo-type dataset {id}"),
        }
    }
}

/// Why a repository id was not found in the cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotFound(String);

/// The hub cache directory as huggingface_hub picks it: `HF_HUB_CACHE`, else
/// `HUGGINGFACE_HUB_CACHE`, else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_in(|name| std::env::var_os(name))
}

fn cache_dir_in(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let home = var("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    // huggingface_hub expands `~` in these values.
    let set = |name: &str| {
        let value = PathBuf::from(var(name).filter(|v| !v.is_empty())?);
        Some(match (value.strip_prefix("~"), &home) {
            (Ok(rest), Some(home)) => home.join(rest),
            _ => value,
        })
    };
    if let Some(hub) = set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
        return Some(hub);
    }
    let hf_home = match set("HF_HOME") {
        Some(dir) => dir,
        None => set("XDG_CACHE_HOME").or_else(|| Some(home?.join(".cache")))?.join("huggingface"),
    };
    Some(hf_home.join("hub"))
}

/// Whether `name` is a Hub repository id as huggingface_hub's `validate_repo_id` accepts one:
/// `name` or `owner/name`, of letters, digits, `-`, `_` and `.`, each part starting and ending
/// with a letter, digit or `_`, no `--` or `..`, at most 96 characters, not ending in `.git`.
pub fn is_repo_id(name: &str) -> bool {
    let part_ok = |part: &str| {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        !part.is_empty()
            && part.len() <= 96
            && part.chars().all(|c| word(c) || c == '-' || c == '.')
            && part.starts_with(word)
            && part.ends_with(word)
    };
    name.split('/').count() <= 2
        && name.split('/').all(part_ok)
        && !name.contains("--")
        && !name.contains("..")
        && !name.ends_with(".git")
}

/// Data file names dpo-train reads: the text formats (each maybe gzipped), then the binary ones.
const TEXT_EXTENSIONS: [&str; 5] = [".jsonl", ".ndjson", ".json", ".csv", ".tsv"];
const BINARY_EXTENSIONS: [&str; 2] = [".parquet", ".arrow"];

/// Whether `name` is a data file's name dpo-train reads (`.jsonl`, `.ndjson`, `.json`, `.csv`,
/// `.tsv`, each maybe gzipped, `.parquet`, `.arrow`, in any case), where a dataset directory's or
/// Hub name is not.
pub fn is_data_file_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let text = name.strip_suffix(".gz").unwrap_or(&name);
    TEXT_EXTENSIONS.iter().any(|e| text.ends_with(e)) || BINARY_EXTENSIONS.iter().any(|e| name.ends_with(e))
}

/// `datasets`' `Dataset.save_to_disk` leaves `state.json` (the Arrow files of one dataset, no
/// splits) beside its data; `DatasetDict.save_to_disk` leaves `dataset_dict.json` and a directory
/// per split.
pub const SAVED_DATASET: &str = "state.json";
pub const SAVED_DATASET_DICT: &str = "dataset_dict.json";

/// Whether `value` names data without splits: a data file, or a directory one
/// `Dataset.save_to_disk` wrote.
pub fn is_unsplit_data(value: &str) -> bool {
    is_data_file_name(value) || Path::new(value).join(SAVED_DATASET).is_file()
}

/// The local directory `value` stands for, where it is no local path but a repository id of the
/// form `owner/name` that the hub cache holds: its snapshot of `main`. `Ok(None)` leaves `value`
/// as it is (a path that exists, `demo`, a file name, or a one-part name not in the cache); the
/// error says why an `owner/name` that is no local path was not found.
pub fn locate(value: &str, kind: Kind) -> Result<Option<PathBuf>, NotFound> {
    locate_in(value, kind, cache_dir().as_deref())
}

/// A command-line value as a path: `value` itself, or the snapshot [`locate`] finds for it.
pub fn path_of(value: &str, kind: Kind) -> Result<PathBuf, NotFound> {
    Ok(locate(value, kind)?.unwrap_or_else(|| PathBuf::from(value)))
}

fn locate_in(value: &str, kind: Kind, cache: Option<&Path>) -> Result<Option<PathBuf>, NotFound> {
    // A data file's name (`data/pairs.jsonl`, mistyped) is not taken for a dataset's.
    let file_like = kind == Kind::Dataset && is_data_file_name(value);
    if Path::new(value).exists() || !is_repo_id(value) || file_like {
        return Ok(None);
    }
    let found = cache.map(|c| snapshot(c, value, kind)).unwrap_or(Err(None));
    match found {
        Ok(dir) => Ok(Some(dir)),
        // A one-part name that is not cached is more likely a file or folder name mistyped.
        Err(None) if !value.contains('/') => Ok(None),
        Err(None) => {
            let place =
                cache.map_or("(no cache directory: HOME is unset)".to_owned(), |c| format!("`{}`", c.display()));
            Err(NotFound(format!(
                "`{value}` does not exist here, and the Hugging Face cache {place} holds no {} of that name: `{}` puts it there (dpo-train does not download)",
                kind.noun(),
                kind.download(value)
            )))
        }
        Err(Some(why)) => Err(why),
    }
}

/// Where `dir` is (or lies in) a snapshot of the hub cache (`.../models--owner--name/snapshots/<commit>`,
/// as `hf download` leaves it), what a file it lacks says: that the download is incomplete, and
/// the command that completes it (`; ...`, to end a message); empty elsewhere.
pub fn incomplete_download_hint(dir: &Path) -> String {
    let parts: Vec<String> = dir.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let at = parts.windows(2).rposition(|w| w[1] == "snapshots");
    let Some(repo) = at.map(|i| &parts[i]) else { return String::new() };
    let Some((kind, id)) = [Kind::Model, Kind::Dataset].into_iter().find_map(|kind| {
        let rest = repo.strip_prefix(kind.folder())?.strip_prefix("--")?;
        Some((kind, rest.replacen("--", "/", 1)))
    }) else {
        return String::new();
    };
    format!(
        "; the Hugging Face cache holds part of `{id}` (an interrupted download?): `{}` completes it",
        kind.download(&id)
    )
}

/// `cache/<kind>s--owner--name/snapshots/<refs/main>`; `Err(None)` when the cache has no such
/// repository, `Err(Some(why))` when it has one without a usable `main`.
fn snapshot(cache: &Path, id: &str, kind: Kind) -> Result<PathBuf, Option<NotFound>> {
    let repo = cache.join(format!("{}--{}", kind.folder(), id.replace('/', "--")));
    if !repo.is_dir() {
        return Err(None);
    }
    let snapshots = repo.join("snapshots");
    let refs = repo.join("refs").join("main");
    let broken = |what: String| {
        let mut held: Vec<String> = std::fs::read_dir(&snapshots)
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        held.sort();
        let held = match held.is_empty() {
            true => "no snapshot".to_owned(),
            false => format!("snapshots {}: pass one's directory to use it", held.join(", ")),
        };
        Some(NotFound(format!("the Hugging Face cache's `{}` {what} ({held})", repo.display())))
    };
    // huggingface_hub writes the commit without a newline; an edited one may have one.
    let commit = std::fs::read_to_string(&refs).map_err(|_| broken("has no `refs/main`".to_owned()))?;
    let dir = snapshots.join(commit.trim());
    match dir.is_dir() {
        true => Ok(dir),
        false => Err(broken(format!("names main's commit `{}` but holds no snapshot of it", commit.trim()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_directory_is_chosen_as_huggingface_hub_chooses_it() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
        };
        let dir = |pairs| cache_dir_in(env(pairs)).map(|p| p.display().to_string());
        assert_eq!(dir(&[("HOME", "/h")]).as_deref(), Some("/h/.cache/huggingface/hub"));
        assert_eq!(dir(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]).as_deref(), Some("/x/huggingface/hub"));
        assert_eq!(dir(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x"), ("HF_HOME", "~/hf")]).as_deref(), Some("/h/hf/hub"));
        let both = &[("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/old"), ("HF_HUB_CACHE", "/new")];
        assert_eq!(dir(both).as_deref(), Some("/new"));
        assert_eq!(dir(&[("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/old")]).as_deref(), Some("/old"));
        assert_eq!(dir(&[]), None);
    }

    #[test]
    fn repository_ids_are_those_huggingface_hub_accepts() {
        for ok in ["gpt2", "Qwen/Qwen2.5-0.5B", "trl-lib/ultrafeedback_binarized", "a_b/c.d-e", "123"] {
            assert!(is_repo_id(ok), "{ok}");
        }
        for bad in ["", "/abs/dir", "./m", "a/b/c", "a--b/c", "a/b..c", "-a/b", "a/b.", "x.git", "a b/c", "a/"] {
            assert!(!is_repo_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_snapshot_lacking_a_file_says_how_to_complete_it() {
        let snap = Path::new("/h/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc");
        let hint = incomplete_download_hint(snap);
        assert_eq!(
            hint,
            "; the Hugging Face cache holds part of `Qwen/Qwen2.5-0.5B` (an interrupted download?): `hf download Qwen/Qwen2.5-0.5B` completes it"
        );
        assert_eq!(incomplete_download_hint(&snap.join("sub")), hint, "a folder inside the snapshot");
        let data = incomplete_download_hint(Path::new("/h/datasets--trl-lib--ufb/snapshots/abc"));
        assert!(data.ends_with("`hf download --repo-type dataset trl-lib/ufb` completes it"), "{data}");
        assert_eq!(incomplete_download_hint(Path::new("/work/models/llama")), "");
        assert_eq!(incomplete_download_hint(Path::new("/h/snapshots/abc")), "", "no repository folder");
    }

    #[test]
    fn a_cached_repository_is_its_main_snapshot() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--tiny");
        let (old, new) = ("a".repeat(40), "b".repeat(40));
        for commit in [&old, &new] {
            std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        }
        let found = |id: &str, kind| locate_in(id, kind, Some(cache.path()));
        // No refs/main: huggingface_hub finds nothing either; the snapshots are named.
        let err = found("org/tiny", Kind::Model).unwrap_err().to_string();
        assert!(
            err.ends_with(&format!("has no `refs/main` (snapshots {old}, {new}: pass one's directory to use it)")),
            "{err}"
        );
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), &new).unwrap();
        assert_eq!(found("org/tiny", Kind::Model), Ok(Some(repo.join("snapshots").join(&new))));
        // Datasets are another folder; a missing owner/name says how to download it.
        let err = found("org/tiny", Kind::Dataset).unwrap_err().to_string();
        assert!(err.contains("holds no dataset of that name: `hf download --repo-type dataset org/tiny`"));
        std::fs::write(repo.join("refs/main"), "c".repeat(40) + "\n").unwrap();
        let err = found("org/tiny", Kind::Model).unwrap_err().to_string();
        assert!(
            err.contains(&format!("names main's commit `{}` but holds no snapshot of it", "c".repeat(40))),
            "{err}"
        );
        // A path that exists, a one-part name not cached, and what is no id stay as they are.
        assert_eq!(found(&cache.path().display().to_string(), Kind::Model), Ok(None));
        assert_eq!(found("prefs.jsonl", Kind::Dataset), Ok(None));
        assert_eq!(found("data/prefs.jsonl", Kind::Dataset), Ok(None));
        assert_eq!(found("./org/tiny", Kind::Model), Ok(None));
    }
}
