//! Bad model directories get one clear error naming the file and what is wrong.

use std::fs;
use std::path::{Path, PathBuf};

use burn::tensor::Device;
use dpo_train::model;

fn fixture_model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn cpu() -> Device {
    Device::libtorch()
}

/// A copy of the llama fixture whose config.json went through `edit`.
fn edited_llama(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(fixture_model("llama")).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut cfg);
    fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    dir
}

fn load_error(dir: &Path) -> String {
    match model::load(dir, &cpu()) {
        Ok(_) => panic!("`{}` loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn directory_without_config() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        load_error(dir.path()),
        format!(
            "`{}/config.json` not found: a model directory needs `config.json` and safetensors weights",
            dir.path().display()
        )
    );
}

#[test]
fn directory_without_weights() {
    let dir = edited_llama(|_| {});
    fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    assert_eq!(
        load_error(dir.path()),
        format!("`{}` has no `model.safetensors` and no `model.safetensors.index.json`", dir.path().display())
    );
}

#[test]
fn unsupported_model_type() {
    let dir = edited_llama(|c| c["model_type"] = "gpt2".into());
    assert_eq!(
        load_error(dir.path()),
        format!(
            "`{}/config.json`: unsupported `model_type` `gpt2`; supported: llama, mistral, qwen2, qwen3",
            dir.path().display()
        )
    );
}

#[test]
fn unsupported_rope_type() {
    let dir = edited_llama(|c| c["rope_parameters"]["rope_type"] = "longrope".into());
    assert_eq!(
        load_error(dir.path()),
        format!(
            "`{}/config.json`: unsupported `rope_type` = `longrope`; supported: `default`, `linear`, `dynamic`, `llama3`, `yarn`",
            dir.path().display()
        )
    );
}

/// A scaling type without the key it scales by is named with that key.
#[test]
fn a_linear_rope_without_its_factor() {
    let dir =
        edited_llama(|c| c["rope_parameters"] = serde_json::json!({"rope_type": "linear", "rope_theta": 10000.0}));
    let want = format!("`{}/config.json`: `linear` rope scaling needs `factor`", dir.path().display());
    assert_eq!(load_error(dir.path()), want);
}

#[test]
fn unsupported_activation() {
    let dir = edited_llama(|c| c["hidden_act"] = "gelu".into());
    assert_eq!(
        load_error(dir.path()),
        format!("`{}/config.json`: unsupported `hidden_act` = `gelu`; supported: `silu`", dir.path().display())
    );
}

/// Fewer than 2 positions (nothing to predict from and score) is a broken config, named as such,
/// where it was refused later with the advice to pass `--max-length 0`.
#[test]
fn too_few_positions() {
    let dir = edited_llama(|c| c["max_position_embeddings"] = 0.into());
    let want = format!("`{}/config.json`: `max_position_embeddings` must be at least 2, got 0", dir.path().display());
    assert_eq!(load_error(dir.path()), want);
}

#[test]
fn weights_that_do_not_fit_the_config() {
    let dir = edited_llama(|c| c["intermediate_size"] = 100.into());
    assert_eq!(
        load_error(dir.path()),
        "tensor `model.layers.0.mlp.gate_proj.weight` has shape [128, 64], expected [100, 64]"
    );
}

#[test]
fn missing_tensor_is_named() {
    let dir = edited_llama(|c| c["num_hidden_layers"] = 3.into());
    assert_eq!(
        load_error(dir.path()),
        format!(
            "tensor `model.layers.2.self_attn.q_proj.weight` is missing from the checkpoint in `{}`",
            dir.path().display()
        )
    );
}
