//! Generation with the KV cache against plain full-sequence forwards, and `dpo-train generate`
//! against transformers.

use std::path::PathBuf;

use burn::tensor::{Device, Int, Tensor, TensorData};
use dpo_train::model::generate::{SAMPLE_ROWS, SamplingConfig, generate, rng};
use dpo_train::model::{self, KvCache};

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

#[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
fn cpu() -> Device {
    Device::libtorch()
}

fn ids(tokens: &[u32], device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    Tensor::from_data(TensorData::new(data, [1, tokens.len()]), device)
}

fn values(t: Tensor<2>) -> Vec<f32> {
    t.into_data().convert::<f32>().as_slice::<f32>().unwrap().to_vec()
}

/// The models generation runs on: loaded on the plain device (`generate`), on the autodiff device
/// (the training policy), and the training policy's inference copy (`valid()`, what the in-training
/// sampler decodes with). A cached step has one query and several keys: each must see every key.
fn models_to_decode(name: &str) -> Vec<(&'static str, dpo_train::model::Llama)> {
    use burn::module::Module;
    let (_, plain) = model::load(&model_dir(name), &cpu()).unwrap();
    let (_, trained) = model::load(&model_dir(name), &cpu().autodiff()).unwrap();
    vec![("plain", plain), ("inference copy of an autodiff model", trained.valid()), ("autodiff", trained)]
}

#[test]
fn cached_logits_equal_full_forward_logits() {
    for (name, (kind, model)) in
        ["llama", "qwen3", "mistral"].into_iter().flat_map(|n| models_to_decode(n).into_iter().map(move |m| (n, m)))
    {
        let device = if kind == "autodiff" { cpu().autodiff() } else { cpu() };
        let tokens: Vec<u32> = vec![5, 17, 42, 99, 7, 3, 250, 11];
        let mut cache = KvCache::new(model.num_layers());
        let mut cached = values(model.forward_cached(ids(&tokens[..3], &device), &mut cache));
        for t in 3..tokens.len() {
            let full = model.forward(ids(&tokens[..t], &device)); // [1, t, V]
            let [_, _, v] = full.dims();
            let last = values(full.narrow(1, t - 1, 1).reshape([1, v]));
            // The same forward with attention over cached keys: twice the chain's relative error.
            let worst = last.iter().zip(&cached).map(|(a, b)| (a - b).abs() / a.abs().max(1.0)).fold(0f32, f32::max);
            let bound = crate::common::bounds::llama_logits(&model_dir(name), tokens.len()) as f32;
            assert!(worst <= bound, "{name} ({kind}) position {t}: {worst} (bound {bound:e})");
            cached = values(model.forward_cached(ids(&tokens[t..t + 1], &device), &mut cache));
        }
        assert_eq!(cache.len(), tokens.len());
    }
}

#[test]
fn greedy_generation_equals_argmax_of_full_forwards() {
    for (kind, model) in models_to_decode("llama") {
        let device = if kind == "autodiff" { cpu().autodiff() } else { cpu() };
        greedy_equals_argmax(&model, &device, kind);
    }
}

fn greedy_equals_argmax(model: &dpo_train::model::Llama, device: &Device, kind: &str) {
    let (model, device) = (model, device.clone());
    let prompt = vec![30u32, 61, 7, 88];
    let eos = 2;
    // More rows than one batch decodes: the last batch holds two.
    let rows = SAMPLE_ROWS + 2;
    let out = generate(model, &prompt, rows, eos, &SamplingConfig::greedy(12), &mut rng(0), &device);
    assert_eq!(out.len(), rows);
    assert!(out.iter().all(|row| *row == out[0]), "greedy rows of one prompt agree");
    let mut seq = prompt.clone();
    let mut expected = Vec::new();
    for _ in 0..12 {
        let logits = model.forward(ids(&seq, &device));
        let [_, s, v] = logits.dims();
        let last = values(logits.narrow(1, s - 1, 1).reshape([1, v]));
        let next = last.iter().enumerate().fold(0, |best, (i, &z)| if z > last[best] { i } else { best }) as u32;
        if next == eos {
            break;
        }
        expected.push(next);
        seq.push(next);
    }
    assert_eq!(out[0], expected, "{kind}");
}

/// A copy of the llama fixture whose tokenizer prepends a BOS (`<|endoftext|>`, id 0) to every
/// encoded text, as Llama's and Mistral's tokenizers do.
fn model_with_bos(dir: &std::path::Path) -> PathBuf {
    let out = dir.join("llama-bos");
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(model_dir("llama")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, out.join(path.file_name().unwrap())).unwrap();
    }
    let path = out.join("tokenizer.json");
    let mut tok: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let bos = serde_json::json!({"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}});
    let seq = |id: &str, type_id: u32| serde_json::json!({"Sequence": {"id": id, "type_id": type_id}});
    tok["post_processor"] = serde_json::json!({
        "type": "TemplateProcessing",
        "single": [bos, seq("A", 0)],
        "pair": [bos, seq("A", 0), seq("B", 1)],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
    });
    std::fs::write(&path, tok.to_string()).unwrap();
    out
}

/// `dpo-train generate --temperature 0` answers as transformers' greedy `generate` does
/// (`tests/gen/check_generate.py`), for plain prompts encoded with the tokenizer's BOS (as
/// training encodes them) and for a conversational prompt rendered by the chat template. The
/// plain prompts are ones whose answer changes without the BOS.
#[test]
fn greedy_cli_answers_as_transformers_with_a_bos_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_with_bos(dir.path());
    let plain = ["Hello there", "The sky is", "2 + 2 ="];
    let chat = serde_json::json!([{"role": "user", "content": "Hi"}]);
    let prompts = dir.path().join("prompts.jsonl");
    let rows: Vec<String> = plain
        .iter()
        .map(|p| serde_json::json!({ "prompt": p }).to_string())
        .chain([serde_json::json!({ "prompt": chat }).to_string()])
        .collect();
    std::fs::write(&prompts, rows.join("\n")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["generate", "--temperature", "0", "--max-new-tokens", "8", "--json", "--model"])
        .arg(&model)
        .arg("--prompts")
        .arg(&prompts)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ours: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["completions"][0].as_str().unwrap().to_owned())
        .collect();

    let all: Vec<serde_json::Value> = plain.iter().map(|p| serde_json::json!(p)).chain([chat]).collect();
    let reference = std::process::Command::new(crate::common::python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/gen/check_generate.py"))
        .arg(&model)
        .arg(serde_json::Value::from(all).to_string())
        .arg("8")
        .output()
        .expect("the venv's python runs (make ref-venv installs transformers)");
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stderr));
    let reference: serde_json::Value = serde_json::from_slice(&reference.stdout).unwrap();
    let theirs: Vec<String> = serde_json::from_value(reference["completions"].clone()).unwrap();
    let without: Vec<String> = serde_json::from_value(reference["without_special_tokens"].clone()).unwrap();
    assert_eq!(ours, theirs);
    assert_ne!(theirs[..plain.len()], without[..plain.len()], "the prompts must tell a missing BOS apart");
}
