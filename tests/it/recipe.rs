//! A TRL recipe (`trl dpo --config recipe.yaml`) read by TRL's own parser in the venv
//! (`TrlParser` over `ScriptArguments`, `DPOConfig` and `ModelConfig`) and by dpo-train: every
//! setting the recipe makes is the same on both sides, TRL's script names and transformers 5's
//! (`activation_checkpointing`, `warmup_steps` as a fraction) included, and `logging_steps` and
//! `save_steps` as shares of the training steps.

use std::path::PathBuf;
use std::process::Command;

use dpo_train::config::{ConfigFile, Layered};

use crate::common::{fixtures, python};

/// What TRL resolves the recipe to, as JSON.
fn trl_reads(recipe: &std::path::Path) -> serde_json::Value {
    let code = format!(
        "import json\n\
         from transformers import TrainerState\n\
         from trl import TrlParser, DPOConfig, ModelConfig, ScriptArguments\n\
         s, t, m = TrlParser((ScriptArguments, DPOConfig, ModelConfig)).parse_args_and_config(['--config', '{}'])\n\
         of_37 = TrainerState()\n\
         of_37.compute_steps(t, 37)\n\
         print(json.dumps(dict(model_name_or_path=m.model_name_or_path, dataset_name=s.dataset_name,\n\
           dataset_test_split=s.dataset_test_split, eval_strategy=str(t.eval_strategy.value), eval_steps=t.eval_steps,\n\
           logging_steps=t.logging_steps, save_steps=t.save_steps,\n\
           cadences_of_37=[of_37.logging_steps, of_37.eval_steps, of_37.save_steps],\n\
           learning_rate=t.learning_rate, beta=t.beta, loss_type=t.loss_type, loss_weights=t.loss_weights,\n\
           num_train_epochs=t.num_train_epochs, per_device_train_batch_size=t.per_device_train_batch_size,\n\
           gradient_accumulation_steps=t.gradient_accumulation_steps, lr_scheduler_type=str(t.lr_scheduler_type.value),\n\
           warmup_of_100=t.get_warmup_steps(100), max_length=t.max_length, bf16=t.bf16, seed=t.seed,\n\
           lora_r=m.lora_r if m.use_peft else None, lora_alpha=m.lora_alpha, lora_target_modules=m.lora_target_modules,\n\
           gradient_checkpointing=t.activation_checkpointing, report_to=t.report_to, output_dir=t.output_dir)))\n",
        recipe.display()
    );
    let out = Command::new(python()).args(["-W", "ignore", "-c", &code]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_trl_recipe_reads_as_trl_reads_it() {
    let recipe: PathBuf = fixtures().join("recipes/dpo.yaml");
    let trl = trl_reads(&recipe);
    let layered = Layered::new(Some(ConfigFile::read(&recipe).unwrap()), &[]).unwrap();
    let (cfg, plan) = (&layered.cfg, layered.validate().unwrap());
    let ours = serde_json::to_value(cfg).unwrap();
    // The same key on both sides.
    for key in [
        "model_name_or_path",
        "learning_rate",
        "loss_type",
        "loss_weights",
        "num_train_epochs",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "lr_scheduler_type",
        "max_length",
        "seed",
        "lora_r",
        "lora_alpha",
        "gradient_checkpointing",
        "eval_steps",
        "logging_steps",
        "save_steps",
    ] {
        let (a, b) = (&trl[key], &ours[key]);
        let same = a == b || a.as_f64().zip(b.as_f64()).is_some_and(|(x, y)| x == y);
        assert!(same, "{key}: TRL {a}, dpo-train {b}");
    }
    assert_eq!(trl["beta"].as_f64(), Some(cfg.loss.beta));
    assert_eq!(trl["bf16"].as_bool(), Some(cfg.bf16()));
    assert_eq!(trl["output_dir"].as_str(), cfg.output_dir.to_str());
    assert_eq!(trl["warmup_of_100"].as_u64(), Some(plan.schedule.warmup_steps(100)));
    // Logging, evaluation and saving in a run of 37 steps, as transformers' `TrainerState` sets
    // them from the shares.
    let ours_of_37 = [cfg.logging_steps.of(37), cfg.eval_every(37), cfg.save_steps.of(37)];
    assert_eq!(trl["cadences_of_37"], serde_json::json!(ours_of_37));
    // `dataset_name` is the training data; `eval_strategy = "steps"` evaluates its test split.
    assert_eq!(
        (trl["dataset_name"].as_str(), trl["eval_strategy"].as_str()),
        (Some(cfg.train_file.as_str()), Some("steps"))
    );
    assert_eq!(cfg.eval_file.as_deref(), Some(cfg.train_file.as_str()));
    assert_eq!(trl["dataset_test_split"].as_str(), Some(cfg.dataset_test_split.as_str()));
    assert_eq!(trl["lora_target_modules"].as_str(), Some("all-linear"));
    assert_eq!(cfg.lora_target_modules, ["all-linear"]);
    // `report_to: none`: nothing reported on either side.
    assert_eq!(trl["report_to"], serde_json::json!([]));
    assert!(cfg.tensorboard_dir(std::path::Path::new("run")).is_none());
}

/// Every field of the dataclasses `trl dpo` parses (TRL as installed in the venv) is a key of
/// dpo-train's or one of TRL's keys it accepts, translates or refuses by name: no recipe or
/// command line of TRL's gets "unknown key".
#[test]
fn every_key_of_trl_s_script_is_known() {
    let code = "import dataclasses\n\
                from trl import DPOConfig, ModelConfig, ScriptArguments\n\
                print('\\n'.join(f.name for c in (DPOConfig, ModelConfig, ScriptArguments) for f in dataclasses.fields(c)))\n";
    let out = Command::new(python()).args(["-W", "ignore", "-c", code]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names = String::from_utf8(out.stdout).unwrap();
    let known =
        |name: &str| dpo_train::config::KEYS.iter().any(|k| k.name == name) || dpo_train::config::trl::is_trl_key(name);
    let unknown: Vec<&str> = names.lines().filter(|n| !known(n)).collect();
    assert!(names.lines().count() > 150 && unknown.is_empty(), "unknown: {unknown:?}");
}
