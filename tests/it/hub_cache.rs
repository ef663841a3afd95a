//! Hub names (`--model org/name`, `--data org/name`, as TRL's scripts take them) read from the
//! local Hugging Face cache: each resolves to the snapshot huggingface_hub itself resolves offline
//! (asked in the venv), in `train`, `eval`, `generate`, `data lengths` and an adapter's base; a
//! name the cache lacks gets one line saying how to download it. TRL's own command line runs as
//! written.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::cli::{dpo_train, finish, model, one_line_error, s, short_run, stderr};
use crate::common::{fixtures, python};

/// A cache repository as huggingface_hub writes one: the files as blobs named by their hash, the
/// snapshot's files symlinks to them, `refs/main` naming the commit; an older snapshot beside it
/// that `main` no longer names. Returns the current snapshot's directory.
fn cached_repo(cache: &Path, folder: &str, id: &str, from: &Path) -> PathBuf {
    let repo = cache.join(format!("{folder}--{}", id.replace('/', "--")));
    let (old, main) = ("0".repeat(40), "1234567890abcdef".repeat(3)[..40].to_owned());
    fs::create_dir_all(repo.join("snapshots").join(old)).unwrap();
    fs::create_dir_all(repo.join("refs")).unwrap();
    fs::write(repo.join("refs/main"), &main).unwrap();
    let snapshot = repo.join("snapshots").join(&main);
    let mut stack = vec![from.to_path_buf()];
    let mut n = 0;
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let at = snapshot.join(path.strip_prefix(from).unwrap());
            fs::create_dir_all(at.parent().unwrap()).unwrap();
            n += 1;
            let blob = repo.join("blobs").join(format!("blob{n}"));
            fs::create_dir_all(blob.parent().unwrap()).unwrap();
            fs::copy(&path, &blob).unwrap();
            std::os::unix::fs::symlink(&blob, &at).unwrap();
        }
    }
    snapshot
}

/// A command under `HF_HOME` alone (no `HF_HUB_CACHE`): the cache is `HF_HOME/hub`.
fn under(mut cmd: Command, hf_home: &Path) -> Command {
    cmd.env("HF_HOME", hf_home).env_remove("HF_HUB_CACHE").env_remove("HUGGINGFACE_HUB_CACHE");
    cmd
}

/// huggingface_hub's own answer: `snapshot_download(id, local_files_only=True)`.
fn huggingface_hub_resolves(hf_home: &Path, id: &str, repo_type: &str) -> PathBuf {
    let code = format!(
        "from huggingface_hub import snapshot_download; print(snapshot_download('{id}', repo_type='{repo_type}', local_files_only=True))"
    );
    let mut cmd = Command::new(python());
    cmd.args(["-c", &code]);
    let out = under(cmd, hf_home).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn run(args: &[&str], hf_home: &Path) -> Output {
    let mut cmd = dpo_train();
    cmd.args(args);
    finish(under(cmd, hf_home), Duration::from_secs(120))
}

#[test]
fn hub_names_are_read_from_the_cache_where_huggingface_hub_finds_them() {
    let dir = tempfile::tempdir().unwrap();
    let hf_home = dir.path().join("hf");
    let cache = hf_home.join("hub");
    let snapshot = cached_repo(&cache, "models", "org/llama", &model());
    let data = cached_repo(&cache, "datasets", "trl-lib/ufb", &fixtures().join("hub/ultrafeedback"));
    assert_eq!(huggingface_hub_resolves(&hf_home, "org/llama", "model"), snapshot);
    assert_eq!(huggingface_hub_resolves(&hf_home, "trl-lib/ufb", "dataset"), data);

    let out_dir = dir.path().join("runs");
    let mut args = vec!["train".to_owned()];
    let extra = ["--eval-file", "trl-lib/ufb"];
    args.extend(short_run(&out_dir, "hub", Path::new("org/llama"), Path::new("trl-lib/ufb"), &extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&args, &hf_home);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let note =
        format!("`model_name_or_path` = `org/llama`: the Hugging Face cache's snapshot `{}`", snapshot.display());
    assert!(err.contains(&note), "{err}");
    // The saved config names the snapshot: a resume reads these files whatever `main` becomes.
    let saved: toml::Table = fs::read_to_string(out_dir.join("hub/config.toml")).unwrap().parse().unwrap();
    assert_eq!(saved["model_name_or_path"].as_str(), Some(s(&snapshot)));
    assert_eq!(saved["train_file"].as_str(), Some(s(&data)));
    assert_eq!(saved["eval_file"].as_str(), Some(s(&data)));

    let eval = run(&["eval", "--model", "org/llama", "--data", "trl-lib/ufb"], &hf_home);
    assert!(eval.status.success(), "{}", stderr(&eval));
    let lengths = run(&["data", "lengths", "--model", "org/llama", "--data", "trl-lib/ufb"], &hf_home);
    assert!(String::from_utf8_lossy(&lengths.stdout).starts_with("{\"pairs\":6,"), "{}", stderr(&lengths));
    let prompts = dir.path().join("prompts.txt");
    fs::write(&prompts, "2+2=\n").unwrap();
    let generated =
        run(&["generate", "--model", "org/llama", "--prompts", s(&prompts), "--max-new-tokens", "2"], &hf_home);
    assert!(generated.status.success(), "{}", stderr(&generated));

    // An adapter from the Hub names its base by its Hub name.
    let adapter = dir.path().join("adapter");
    fs::create_dir(&adapter).unwrap();
    let from = fixtures().join("adapters/llama-lora");
    fs::copy(from.join("adapter_model.safetensors"), adapter.join("adapter_model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(from.join("adapter_config.json")).unwrap()).unwrap();
    config["base_model_name_or_path"] = "org/llama".into();
    fs::write(adapter.join("adapter_config.json"), config.to_string()).unwrap();
    let eval = run(&["eval", "--model", s(&adapter), "--data", "trl-lib/ufb"], &hf_home);
    assert!(eval.status.success(), "{}", stderr(&eval));

    // A name the cache lacks: one line naming the flag and the download, nothing written.
    let nowhere = dir.path().join("no");
    let missing = ["train", "--model", "org/nope", "--data", "trl-lib/ufb", "--output-dir", s(&nowhere)];
    let err = one_line_error(&run(&missing, &hf_home));
    let download = format!(
        "error: `--model-name-or-path`: `org/nope` does not exist here, and the Hugging Face cache `{}` holds no model of that name: `hf download org/nope` puts it there",
        cache.display()
    );
    assert!(err.starts_with(&download), "{err}");
    assert!(!nowhere.exists());
    let err = one_line_error(&run(&["eval", "--model", "org/llama", "--data", "trl-lib/nope"], &hf_home));
    assert!(err.contains("`hf download --repo-type dataset trl-lib/nope`"), "{err}");
}

/// A download cut short leaves a snapshot without a shard's blob, or without weights at all: one
/// line naming what is missing and the `hf download` that completes it, nothing written.
#[test]
fn a_partial_download_says_how_to_complete_it() {
    let dir = tempfile::tempdir().unwrap();
    let hf_home = dir.path().join("hf");
    let snapshot = cached_repo(&hf_home.join("hub"), "models", "org/partial", &fixtures().join("models/mistral"));
    let data = fixtures().join("data/prefs.jsonl");
    let nowhere = dir.path().join("no");
    let args = ["train", "--model", "org/partial", "--data", s(&data), "--output-dir", s(&nowhere)];
    let complete = "; the Hugging Face cache holds part of `org/partial` (an interrupted download?): `hf download org/partial` completes it";

    let shard = snapshot.join("model-00002-of-00003.safetensors");
    fs::remove_file(fs::read_link(&shard).unwrap()).unwrap();
    let err = one_line_error(&run(&args, &hf_home));
    let want = format!("`{}` is missing, though `model.safetensors.index.json` names it{complete}", shard.display());
    assert!(err.ends_with(&want), "{err}");

    fs::remove_file(snapshot.join("model.safetensors.index.json")).unwrap();
    let err = one_line_error(&run(&args, &hf_home));
    let want =
        format!("`{}` has no `model.safetensors` and no `model.safetensors.index.json`{complete}", snapshot.display());
    assert!(err.ends_with(&want), "{err}");
    assert!(!nowhere.exists());
}

/// TRL's quickstart command line (`trl dpo ...` in TRL's docs, with LoRA) runs as written after
/// `dpo-train train`: transformers' spellings, `--dataset_name`, `--eval_strategy steps` (on the
/// dataset's test split, as TRL's script evaluates), `--no_remove_unused_columns`, `--use_peft`.
#[test]
fn trl_s_command_line_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let hf_home = dir.path().join("hf");
    let data = cached_repo(&hf_home.join("hub"), "datasets", "trl-lib/ufb", &fixtures().join("hub/ultrafeedback"));
    cached_repo(&hf_home.join("hub"), "models", "org/llama", &model());
    let out_dir = dir.path().join("Qwen2-0.5B-DPO");
    let line = format!(
        "train --model_name_or_path org/llama --dataset_name trl-lib/ufb --learning_rate 5.0e-7 \
         --num_train_epochs 1 --per_device_train_batch_size 2 --gradient_accumulation_steps 8 \
         --gradient_checkpointing --eval_strategy steps --eval_steps 50 --output_dir {} \
         --no_remove_unused_columns --use_peft --lora_r 32 --lora_alpha 16",
        out_dir.display()
    );
    let out = run(&line.split_whitespace().collect::<Vec<_>>(), &hf_home);
    assert!(out.status.success(), "{}", stderr(&out));
    let run_dir = fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.join("config.toml").is_file());
    let run_dir = run_dir.expect("a run directory");
    let saved: toml::Table = fs::read_to_string(run_dir.join("config.toml")).unwrap().parse().unwrap();
    assert_eq!(saved["eval_file"].as_str(), Some(s(&data)));
    assert_eq!((saved["lora_r"].as_integer(), saved["lora_alpha"].as_float()), (Some(32), Some(16.0)));
    assert_eq!(saved["gradient_accumulation_steps"].as_integer(), Some(8));
    assert!(fs::read_to_string(run_dir.join("metrics.csv")).unwrap().contains(",eval,"));

    // A file has no test split to evaluate: refused, saying what to set.
    let (file, model) = (fixtures().join("data/prefs.jsonl"), model());
    let args = ["train", "--model", s(&model), "--dataset_name", s(&file), "--eval_strategy", "steps"];
    let err = one_line_error(&run(&args, &hf_home));
    assert!(
        err.starts_with("error: `--eval-strategy`: `\"steps\"` evaluates on held-out data, and `eval_file` is not set"),
        "{err}"
    );
}
