//! `final/` is a Hugging Face model directory: transformers (in the project's venv) loads what a
//! training run exported and computes the same logits as our model.

use std::sync::atomic::AtomicBool;

use burn::tensor::{Int, Tensor, TensorData};
use dpo_train::config::TrainConfig;

use crate::common::{Quiet, cpu, fixtures, max_rel_diff, reference_logits, run_alone};

#[test]
fn final_model_loads_in_transformers_with_equal_logits() {
    let out = tempfile::tempdir().unwrap();
    let fixtures = fixtures();
    let text = format!(
        "model_name_or_path = \"{}\"\ntrain_file = \"{}\"\noutput_dir = \"{}\"\nrun_name = \"export\"\nbf16 = false\ngradient_checkpointing = false\nlearning_rate = 1e-2\nmax_steps = 2\nper_device_train_batch_size = 4\nnum_samples = 0\n",
        fixtures.join("models/qwen2").display(),
        fixtures.join("data/prefs.jsonl").display(),
        out.path().display()
    );
    let cfg = TrainConfig::from_toml_str(&text, "test").unwrap();
    let summary = run_alone(cfg, None, false, &AtomicBool::new(false), &mut Quiet);
    let final_dir = summary.run_dir.join("final");
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(final_dir.join(file).is_file(), "final/ lacks {file}");
    }
    // The starting model's generation settings are kept, as transformers' `save_pretrained` keeps
    // them (end-of-sequence ids, sampling defaults), and so are its checkpoints'.
    let generation = std::fs::read(fixtures.join("models/qwen2/generation_config.json")).unwrap();
    assert_eq!(std::fs::read(final_dir.join("generation_config.json")).unwrap(), generation);
    let ckpt = dpo_train::train::checkpoint::latest(&summary.run_dir).unwrap();
    assert_eq!(std::fs::read(ckpt.join("generation_config.json")).unwrap(), generation);

    let ids: Vec<Vec<i64>> = vec![vec![11, 45, 201, 7, 99, 3, 150, 42], vec![300, 2, 17, 17, 88, 120, 5, 64]];
    let device = cpu();
    let (_, model) = dpo_train::model::load(&final_dir, &device).unwrap();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids.concat(), [2, 8]), &device);
    let ours = model.forward(input).into_data().convert::<f32>().as_slice::<f32>().unwrap().to_vec();
    let theirs = reference_logits(&final_dir, &ids);
    let worst = max_rel_diff(&ours, &theirs);
    let bound = crate::common::bounds::llama_logits(&fixtures.join("models/qwen2"), 8) as f32;
    assert!(worst <= bound, "worst relative logit difference {worst} (bound {bound:e})");
    // Training moved the weights: the comparison is not of the untouched fixture.
    let (_, start) = dpo_train::model::load(&fixtures.join("models/qwen2"), &device).unwrap();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids.concat(), [2, 8]), &device);
    let before = start.forward(input).into_data().convert::<f32>().as_slice::<f32>().unwrap().to_vec();
    assert!(before.iter().zip(&ours).any(|(a, b)| (a - b).abs() > 1e-3));
}
