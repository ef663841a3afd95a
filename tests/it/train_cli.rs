//! `dpo-train` training-side commands as a user runs them: config errors, `data synth`,
//! `generate`, `plot`, and every shipped config parsing and validating.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dpo_train(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpo-train")).args(args).output().expect("the binary runs")
}

fn one_line_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    stderr.trim_end().to_owned()
}

#[test]
fn unknown_config_key_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    fs::write(&path, "beta = 0.1\nlearning_rat = 1e-5\n").unwrap();
    let err = one_line_error(&dpo_train(&["train", "--config", path.to_str().unwrap()]));
    assert_eq!(
        err,
        format!("error: `{}`, line 2: unknown key `learning_rat`; did you mean `learning_rate`?", path.display())
    );
}

#[test]
fn out_of_range_values_name_the_key() {
    for (flag, value) in [("--learning-rate", "-1e-5"), ("--beta", "0"), ("--per-device-train-batch-size", "0")] {
        let err = one_line_error(&dpo_train(&["train", flag, value]));
        assert!(err.starts_with(&format!("error: `{flag}`: must be ")), "{err}");
    }
    let err = one_line_error(&dpo_train(&["--loss-type", "robust", "--loss-weights", "1", "--label-smoothing", "0.5"]));
    assert_eq!(err, "error: `--label-smoothing`: must be < 0.5 with `robust`, got 0.5");
    let err = one_line_error(&dpo_train(&["train", "--beta", "high"]));
    assert_eq!(err, "error: `--beta`: expected a number, got `high`");
}

#[test]
fn every_shipped_config_parses_and_validates() {
    let mut seen = 0;
    for entry in fs::read_dir(root().join("configs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let cfg = dpo_train::config::TrainConfig::from_toml_file(&path).unwrap_or_else(|e| panic!("{e}"));
            cfg.resolve().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(seen >= 3, "configs/ should hold the demo and real-world examples");
    // The embedded demo config is the shipped file.
    let shipped = fs::read_to_string(root().join("configs/demo.toml")).unwrap();
    assert_eq!(shipped, dpo_train::demo::DEMO_CONFIG);
}

#[test]
fn data_synth_writes_three_loadable_splits() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("prefs.jsonl");
    let status =
        dpo_train(&["data", "synth", "--out", out.to_str().unwrap(), "--train", "50", "--val", "10", "--test", "10"]);
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    for (file, n) in [("prefs.jsonl", 50), ("prefs_val.jsonl", 10), ("prefs_test.jsonl", 10)] {
        let loaded = dpo_train::data::load_preferences(&dir.path().join(file), &Default::default()).unwrap();
        assert_eq!(loaded.rows.len(), n, "{file}");
    }
    // Another data format's name is refused, nothing written (it made a directory of that name).
    let json = dir.path().join("prefs.json");
    let err = one_line_error(&dpo_train(&["data", "synth", "--out", json.to_str().unwrap()]));
    assert!(err.starts_with("error: `--out`: ") && err.contains("written as JSON Lines"), "{err}");
    assert!(!json.exists());
}

/// Counts no host holds are refused with one line naming the flag, before anything is written
/// (`--train 10^13` aborted on a failed allocation with a backtrace; `--num-samples 10^12` was
/// killed by the OOM killer after 24 GB).
#[test]
fn counts_beyond_the_host_memory_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("prefs.jsonl");
    let synth =
        one_line_error(&dpo_train(&["data", "synth", "--out", out.to_str().unwrap(), "--val", "10000000000000"]));
    assert!(synth.starts_with("error: `--val`: 10000000002200 pairs made and written in memory need about"), "{synth}");
    assert!(!out.exists());
    let prompts = dir.path().join("prompts.txt");
    fs::write(&prompts, "Hello\n").unwrap();
    let model = root().join("tests/fixtures/models/llama");
    let (model, prompts) = (model.to_str().unwrap(), prompts.to_str().unwrap());
    let many = dpo_train(&["generate", "--model", model, "--prompts", prompts, "--num-samples", "1000000000000"]);
    let said = one_line_error(&many);
    assert!(
        said.starts_with("error: `--num-samples`: 1000000000000 completions of a prompt, held until printed"),
        "{said}"
    );
    assert!(said.ends_with("lower `--num-samples` or `--max-new-tokens`"), "{said}");
    assert!(many.stdout.is_empty());
}

#[test]
fn generate_is_seeded_and_greedy_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.txt");
    fs::write(&prompts, "Hello, how are\nThe capital of\n").unwrap();
    let model = root().join("tests/fixtures/models/llama");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "--max-new-tokens",
            "8",
            "--json",
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_dpo-train")).args(args(extra)).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let sampled = run(&["--num-samples", "3", "--seed", "5"]);
    assert_eq!(sampled, run(&["--num-samples", "3", "--seed", "5"]));
    assert_eq!(sampled.lines().count(), 2);
    let first: serde_json::Value = serde_json::from_str(sampled.lines().next().unwrap()).unwrap();
    assert_eq!(first["prompt"], "Hello, how are");
    assert_eq!(first["completions"].as_array().unwrap().len(), 3);
    let greedy = run(&["--temperature", "0", "--num-samples", "2"]);
    let row: serde_json::Value = serde_json::from_str(greedy.lines().next().unwrap()).unwrap();
    assert_eq!(row["completions"][0], row["completions"][1]);
}

/// Every command `check-gpu` prints (the plan's and each alternative's flags) is one `dpo-train`
/// accepts and validates: precision, LoRA, checkpointing and reference flags included.
#[test]
fn check_gpu_commands_are_accepted() {
    use check_gpu::parse::{self, Input};
    use check_gpu::{FineTune, ModelShape, PlanRequest, plan};
    use clap::Parser;

    let fixture = root().join("crates/check_gpu/tests/fixtures");
    let (tp, qp) = (fixture.join("t4x2-phb.topo.txt"), fixture.join("t4x2-phb.query.csv"));
    let (topo, query) = (parse::read(&tp).unwrap(), parse::read(&qp).unwrap());
    let snap = parse::offline_snapshot(Some(Input { text: &topo, path: &tp }), Some(Input { text: &query, path: &qp }))
        .unwrap();
    let model = Some(ModelShape::from_param_count(1_500_000_000));
    let mut commands = Vec::new();
    for finetune in [FineTune::Full, FineTune::Lora { rank: 16 }] {
        let p = plan(&snap, &PlanRequest { model: model.clone(), finetune, ..PlanRequest::default() });
        if p.world_size > 0 {
            commands.push(p.command.clone());
        }
        commands.extend(p.alternatives.iter().map(|a| format!("dpo-train {}", a.flags)));
    }
    assert!(commands.iter().any(|c| c.contains("--fp16") && c.contains("--lora-r 16")), "{commands:?}");
    assert!(commands.iter().any(|c| c.contains("--gradient-checkpointing")), "{commands:?}");
    for command in &commands {
        let cli = dpo_train::cli::Cli::try_parse_from(command.split_whitespace())
            .unwrap_or_else(|e| panic!("`{command}` does not parse: {e}"));
        let overrides = match &cli.command {
            Some(dpo_train::cli::Command::Train(args)) => &args.overrides.values,
            _ => &cli.train.overrides.values,
        };
        // The command names the model and the data (placeholders where the plan had none).
        let base = dpo_train::config::TrainConfig {
            model_name_or_path: "model".into(),
            train_file: "data.jsonl".into(),
            ..Default::default()
        };
        let cfg = base.with_overrides(overrides).unwrap();
        cfg.resolve().unwrap_or_else(|e| panic!("`{command}`: {e}"));
    }
}

#[test]
fn precision_and_lora_errors_name_the_key() {
    for (args, expected) in [
        (vec!["--bf16", "--fp16"], "error: `--fp16`: cannot be combined with `bf16`"),
        (
            vec!["--lora-r", "8", "--lora-target-modules", "q_proj,qkv"],
            "error: `--lora-target-modules`: unknown module `qkv`",
        ),
        (vec!["--lora-r", "0"], "error: `--lora-r`: must be at least 1"),
        (vec!["--lora-r", "8", "--lora-dropout", "1.5"], "error: `--lora-dropout`: must be in [0, 1)"),
        (vec!["--merge"], "error: `--merge`: needs LoRA"),
        (
            vec!["--model", "/nonexistent/model", "--data", "x.jsonl"],
            "error: `--model-name-or-path`: `/nonexistent/model` is not a model directory",
        ),
        (vec!["--max-grad-norm", "nan"], "error: `--max-grad-norm`: must be finite and >= 0"),
        (
            vec![
                "--model",
                "tests/fixtures/models/llama",
                "--data",
                "tests/fixtures/data/prefs.jsonl",
                "--device",
                "cpu",
                "--tf32",
                "true",
                "--output-dir",
                "/nonexistent/never-made",
            ],
            "error: `--tf32`: `true` needs a CUDA device",
        ),
        (
            vec!["--model", "demo", "--output-dir", "Cargo.toml"],
            "error: `--output-dir`: `Cargo.toml` is a file, not a directory",
        ),
    ] {
        let mut all = vec!["train"];
        all.extend(args);
        let err = one_line_error(&dpo_train(&all));
        assert!(err.starts_with(expected), "{err}");
    }
}

/// `dpo-train sft` trains at `learning_rate` for `max_steps` and evaluates nothing: the warm-up's
/// keys and `--eval-file` are refused before any work instead of being printed as in effect.
#[test]
fn sft_refuses_the_keys_it_would_ignore() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("warm.toml");
    fs::write(&config, "beta = 0.1\nsft_steps = 3\nmodel_name_or_path = \"m\"\ntrain_file = \"d.jsonl\"\n").unwrap();
    let config = config.to_str().unwrap();
    for (args, expected) in [
        (vec!["--sft-learning-rate", "1e-3"], "error: `--sft-learning-rate`: not used: `dpo-train sft` trains at"),
        (vec!["--eval-file", "x.jsonl"], "error: `--eval-file`: not used: `dpo-train sft` does not evaluate"),
        (vec!["--config", config], "`, line 2: `sft_steps`: not used: `dpo-train sft` runs `max_steps`"),
    ] {
        let mut all = vec!["sft"];
        all.extend(args);
        let err = one_line_error(&dpo_train(&all));
        assert!(err.starts_with(expected) || err.contains(expected), "{err}");
    }
}

/// A switch variable set to neither `1` nor `0` is refused with one line naming it, before the
/// run directory is made: each is read once where the command starts.
#[test]
fn a_switch_variable_takes_one_or_zero() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = crate::common::fixtures();
    let (model, data) = (fixtures.join("models/llama"), fixtures.join("data/prefs.jsonl"));
    let out = dir.path().join("out");
    let args = [
        "train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--output-dir",
        out.to_str().unwrap(),
        "--max-steps",
        "1",
    ];
    for var in [dpo_train::train::step::OVERLAP_VAR, dpo_train::dpo::shapes::PADDING_VAR, dpo_torch::product::WIDEN_VAR]
    {
        let run = crate::common::cli::dpo_train().args(args).env(var, "yes").output().unwrap();
        let err = one_line_error(&run);
        assert_eq!(err, format!("error: `{var}` is `yes`, not a switch: 1 (on) or 0 (off)"));
        assert!(!out.exists(), "{var}: the run directory was made");
    }
}

/// The fixture's PEFT adapter copied into `dir/name`, its base named by absolute path and its
/// config changed by `edit`.
fn adapter_copy(dir: &std::path::Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let adapter = root().join("tests/fixtures/adapters/llama-lora");
    let copy = dir.join(name);
    let _ = fs::create_dir(&copy);
    fs::copy(adapter.join("adapter_model.safetensors"), copy.join("adapter_model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(adapter.join("adapter_config.json")).unwrap()).unwrap();
    cfg["base_model_name_or_path"] =
        serde_json::Value::String(root().join("tests/fixtures/models/llama").display().to_string());
    edit(&mut cfg);
    fs::write(copy.join("adapter_config.json"), cfg.to_string()).unwrap();
    copy
}

/// A PEFT adapter using a feature we do not implement is refused, naming the file and field.
#[test]
fn unsupported_adapter_is_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let fields = [
        ("lora_bias", serde_json::json!(true), "true"),
        ("exclude_modules", serde_json::json!(["q_proj"]), "[\"q_proj\"]"),
        ("modules_to_save", serde_json::json!(["lm_head"]), "[\"lm_head\"]"),
        // Review findings: loaded as W + B·A these computed another model than PEFT's.
        ("init_lora_weights", serde_json::json!("pissa_niter_4"), "`pissa_niter_4`"),
        ("init_lora_weights", serde_json::json!("olora"), "`olora`"),
        ("kasa_config", serde_json::json!({"beta": 1e-4}), "{\"beta\":0.0001}"),
        ("alpha_pattern", serde_json::json!({"q_proj": 8}), "per-module alphas"),
    ];
    for (field, value, shown) in fields {
        let copy = adapter_copy(dir.path(), "unsupported", |cfg| cfg[field] = value);
        let config = copy.join("adapter_config.json");
        let data = root().join("tests/fixtures/data/prefs.jsonl");
        let out = dpo_train(&["eval", "--model", copy.to_str().unwrap(), "--data", data.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let want = format!("`{}`: `{field}` = {shown} is not supported", config.display());
        assert!(stderr.contains(&want), "{stderr}");
    }
}

/// An adapter file holding a tensor no LoRA weight reads (KaSA's `lora_diag`, another variant's
/// own) is refused by name: it was dropped, and the model computed without it.
#[test]
fn an_adapter_s_unknown_tensor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let copy = adapter_copy(dir.path(), "extra", |_| {});
    let file = copy.join("adapter_model.safetensors");
    let python = crate::common::python();
    let script = "import sys, torch\nfrom safetensors.torch import load_file, save_file\n\
                  t = load_file(sys.argv[1])\n\
                  t['base_model.model.model.layers.0.self_attn.q_proj.lora_diag.weight'] = torch.ones(4)\n\
                  save_file(t, sys.argv[1])\n";
    let done = std::process::Command::new(python).args(["-c", script, file.to_str().unwrap()]).status().unwrap();
    assert!(done.success());
    let data = root().join("tests/fixtures/data/prefs.jsonl");
    let out = dpo_train(&["eval", "--model", copy.to_str().unwrap(), "--data", data.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("tensor `base_model.model.model.layers.0.self_attn.q_proj.lora_diag.weight` in `")
            && stderr.contains("is not one of the adapter's LoRA weights"),
        "{stderr}"
    );
}

/// TRL's `disable_dropout = true` (the default) sets PEFT's `lora_dropout` to p=0 while training,
/// and PEFT still saves the configured value: a continued adapter is its own reference, so the
/// first step's rewards are 0; prompts are shared; `adapter_config.json` records the 0.1 set.
#[test]
fn disable_dropout_trains_lora_without_dropout() {
    let dir = tempfile::tempdir().unwrap();
    let copy = adapter_copy(dir.path(), "adapter", |_| {});
    let data = root().join("tests/fixtures/data/prefs.jsonl");
    let out_dir = dir.path().join("out");
    let args = [
        ["train", "--model", copy.to_str().unwrap(), "--data", data.to_str().unwrap()].as_slice(),
        &["--output-dir", out_dir.to_str().unwrap(), "--run-name", "r", "--max-steps", "1", "--logging-steps", "1"],
        &["--save-steps", "0", "--num-samples", "0", "--bf16", "false", "--per-device-train-batch-size", "4"],
        &["--lora-dropout", "0.1"],
    ]
    .concat();
    let out = dpo_train(&args);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let line = said.lines().find(|l| l.contains("% avoided")).expect("the avoided positions are reported");
    assert!(line.contains("each prompt once"), "no dropout, so prompts are shared: {line}");
    let run = out_dir.join("r");
    let rows = dpo_train::train::log::read_metrics(&run.join("metrics.csv")).unwrap();
    for name in ["rewards/chosen", "rewards/rejected"] {
        let value = rows[0].metric(name).unwrap();
        // A fresh adapter adds exactly zero (B = 0) to the base the reference runs: the same bits.
        assert_eq!(value, 0.0, "step 1 {name} = {value}: the policy is the reference");
    }
    let saved: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(run.join("final/adapter_config.json")).unwrap()).unwrap();
    assert_eq!(saved["lora_dropout"], serde_json::json!(0.1), "the configured value, as PEFT saves it");
}

/// A saved adapter trains at its own shape: a LoRA key set to another value is refused (it would
/// be ignored) before anything is written, and `lora_dropout`, unset, is the adapter's own (0.0
/// here, where the default is 0.05).
#[test]
fn a_continued_adapter_keeps_its_shape_and_dropout() {
    let dir = tempfile::tempdir().unwrap();
    let copy = adapter_copy(dir.path(), "adapter", |_| {});
    let data = root().join("tests/fixtures/data/prefs.jsonl");
    let out_dir = dir.path().join("out");
    let base = [
        ["train", "--model", copy.to_str().unwrap(), "--data", data.to_str().unwrap()].as_slice(),
        &["--output-dir", out_dir.to_str().unwrap(), "--run-name", "r", "--max-steps", "1", "--save-steps", "0"],
        &["--num-samples", "0", "--bf16", "false", "--per-device-train-batch-size", "4"],
    ]
    .concat();
    for (flag, value, has) in [("--lora-r", "16", "r = 4"), ("--lora-target-modules", "q_proj", "target_modules ")] {
        let out = dpo_train(&[&base[..], &[flag, value]].concat());
        let err = one_line_error(&out);
        let want = format!("error: `{flag}`: `{}` is an adapter with {has}", copy.display());
        assert!(
            err.starts_with(&want) && err.ends_with("drop this setting, or train a new adapter on its base"),
            "{err}"
        );
        assert!(!out_dir.exists(), "a refused run wrote {}", out_dir.display());
    }
    let out = dpo_train(&base);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let saved: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out_dir.join("r/final/adapter_config.json")).unwrap()).unwrap();
    assert_eq!((saved["lora_dropout"].as_f64(), saved["r"].as_u64()), (Some(0.0), Some(4)));
}

/// `dpo-train env --json` on this machine: every field it can fill here equals what the venv's
/// torch says of itself, the variables that change a run are kept (a fake set of them) and the
/// others not; `--version` names the commit and the backends.
#[test]
fn env_reports_the_build_and_the_machine() {
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .args(["env", "--json"])
        .env("CUDA_VISIBLE_DEVICES", "3")
        .env("MASTER_PORT", "29511")
        .env("SLURM_JOB_ID", "77")
        .env("DPO_TRAIN_PROFILE_STEPS", "2-3")
        .env("NOT_A_RUN_VARIABLE", "1")
        .env("HF_HOME", "/hf")
        .env("WANDB_PROJECT", "p")
        .env("WANDB_API_KEY", "secret")
        .env("DPO_TRAIN_TOKEN", "secret")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let python = |code: &str| {
        let out =
            Command::new(crate::common::python()).args(["-c", code]).env("CUDA_VISIBLE_DEVICES", "3").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    // The commit, `-dirty` where dpo-train's code differs from it (as build.rs tells them apart).
    let commit = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().unwrap();
    let code = env!("DPO_TRAIN_BUILT_FROM").split(' ');
    let diff = Command::new("git").args(["diff", "--quiet", "HEAD", "--"]).args(code).status().unwrap();
    let dirty = if diff.code() == Some(1) { "-dirty" } else { "" };
    assert_eq!(v["dpo_train"]["commit"], format!("{}{dirty}", String::from_utf8_lossy(&commit.stdout).trim()));
    assert_eq!(v["dpo_train"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["torch"]["version"], python("import torch; print(torch.__version__)"));
    let cuda = python("import torch; print(torch.version.cuda or '')");
    assert_eq!(v["torch"]["cuda"].as_str().unwrap_or(""), cuda);
    assert_eq!(v["backends"]["gloo"], true);
    // A CUDA build of torch with its headers installed (`make venv`) has NCCL compiled in.
    assert_eq!(v["backends"]["nccl"], !cuda.is_empty(), "{}", v["backends"]);
    if !cuda.is_empty() {
        let nccl = python("import torch; print('.'.join(map(str, torch.cuda.nccl.version())))");
        assert_eq!(v["backends"]["nccl_version"], nccl);
    }
    let devices: i64 = python("import torch; print(torch.cuda.device_count())").parse().unwrap();
    assert_eq!(v["cuda"]["torch_device_count"], devices);
    let cores = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(v["host"]["cores"], cores);
    assert!(v["host"]["memory_total_bytes"].as_u64().unwrap() > 0);
    let env: Vec<&str> = v["env"].as_object().unwrap().keys().map(String::as_str).collect();
    for kept in
        ["CUDA_VISIBLE_DEVICES", "DPO_TRAIN_PROFILE_STEPS", "MASTER_PORT", "SLURM_JOB_ID", "HF_HOME", "WANDB_PROJECT"]
    {
        assert!(env.contains(&kept), "{kept} missing from {env:?}");
    }
    // Neither an unrelated variable nor a credential.
    for left in ["NOT_A_RUN_VARIABLE", "WANDB_API_KEY", "DPO_TRAIN_TOKEN"] {
        assert!(!env.contains(&left), "{left}: {env:?}");
    }

    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train")).arg("--version").output().unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    assert!(
        line.starts_with(&format!(
            "dpo-train {} (commit {}",
            env!("CARGO_PKG_VERSION"),
            v["dpo_train"]["commit"].as_str().unwrap()
        )),
        "{line}"
    );
    let backends = if cuda.is_empty() { "backends: gloo)" } else { "backends: gloo, nccl)" };
    assert!(line.trim_end().ends_with(backends), "{line}");
}

/// `data lengths` (what `check-gpu --data` reads): every pair tokenised as training tokenises it,
/// the longest listed first, packed as dpo-train packs a pair (the prompt once, both completions),
/// and a shorter `--max-length` truncating them; a row it cannot read is one line, exit 1. Other
/// columns, KTO's rows and `--unpair` are read as train's keys read them.
#[test]
fn data_lengths_lists_the_longest_pairs_as_training_tokenises_them() {
    use dpo_train::data::{self, LoadOptions, Tokenizer};
    let (model, prefs) = (root().join("tests/fixtures/models/llama"), root().join("tests/fixtures/data/prefs.jsonl"));
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["data", "lengths", "--model", model.to_str().unwrap(), "--data", prefs.to_str().unwrap()];
        args.extend(extra);
        let out = dpo_train(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let tokenizer = Tokenizer::from_dir(&model).unwrap();
    let pairs = |max_length| {
        let truncation = data::Truncation { max_length, ..Default::default() };
        data::prepare(&prefs, &LoadOptions::default(), &tokenizer, truncation, Default::default(), &mut |_, _| {})
            .unwrap()
            .pairs
    };
    for (extra, max_length) in [(&[][..], 1024), (&["--max-length", "40"][..], 40)] {
        let v = run(&[extra, &["--top", "3"][..]].concat());
        let expected = pairs(Some(max_length));
        let mut packed: Vec<u64> =
            expected.iter().map(|p| (p.prompt_ids.len() + p.chosen_ids.len() + p.rejected_ids.len()) as u64).collect();
        packed.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(v["pairs"], expected.len(), "{v}");
        assert_eq!(v["max_length"], max_length, "{v}");
        assert_eq!(v["packed_longest"], serde_json::json!(packed[..3]), "{v}");
        let mean = packed.iter().sum::<u64>() as f64 / packed.len() as f64;
        assert!((v["packed_mean_std"][0].as_f64().unwrap() - mean).abs() < 1e-9, "{v}");
        let scored = v["scored_longest"].as_array().unwrap();
        assert!(scored.len() == 3 && scored.windows(2).all(|w| w[0].as_u64() >= w[1].as_u64()), "{v}");
    }
    // Truncation shortens the longest pair (121 tokens packed at 1024; at most 2 x 40 at 40).
    assert!(run(&["--max-length", "40"])["packed_longest"][0].as_u64().unwrap() <= 80);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    fs::write(&bad, "{\"prompt\": \"a\", \"chosen\": \"b\"}\n").unwrap();
    let err = one_line_error(&dpo_train(&[
        "data",
        "lengths",
        "--model",
        model.to_str().unwrap(),
        "--data",
        bad.to_str().unwrap(),
    ]));
    assert!(err.contains(&bad.display().to_string()) && err.contains("line 1") && err.contains("rejected"), "{err}");
    // `--skip-bad-rows` skips it and says so, as training does.
    let mixed = dir.path().join("mixed.jsonl");
    fs::write(&mixed, [fs::read_to_string(&prefs).unwrap(), fs::read_to_string(&bad).unwrap()].concat()).unwrap();
    let lines = fs::read_to_string(&mixed).unwrap().lines().count();
    let args = ["data", "lengths", "--model", model.to_str().unwrap(), "--data", mixed.to_str().unwrap()];
    let out = dpo_train(&[&args[..], &["--skip-bad-rows"]].concat());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains(&format!("(lines {lines})")), "{said}");

    // Read by train's keys: other column names read the same pairs.
    let renamed = dir.path().join("renamed.jsonl");
    crate::common::with_renamed_columns(&prefs, &renamed);
    let columns = ["--prompt-column", "question", "--chosen-column", "good", "--rejected-column", "bad"];
    let read = |data: &std::path::Path, extra: &[&str]| {
        let args = [&["data", "lengths", "--model", model.to_str().unwrap(), "--data", data.to_str().unwrap()], extra];
        let out = dpo_train(&args.concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert_eq!(read(&renamed, &columns), run(&[]));
    // A model directory without a tokenizer, read by `--tokenizer` (train's flag); without it,
    // one line naming the missing file.
    let bare = dir.path().join("bare");
    fs::create_dir(&bare).unwrap();
    for file in ["config.json", "model.safetensors"] {
        fs::copy(model.join(file), bare.join(file)).unwrap();
    }
    let (bare, prefs_path, model_path) = (bare.to_str().unwrap(), prefs.to_str().unwrap(), model.to_str().unwrap());
    let err = one_line_error(&dpo_train(&["data", "lengths", "--model", bare, "--data", prefs_path]));
    assert!(err.contains("tokenizer.json"), "{err}");
    let out = dpo_train(&["data", "lengths", "--model", bare, "--data", prefs_path, "--tokenizer", model_path]);
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(), run(&[]));
    // KTO's rows, each scored beside its KL sequence (another row's completion within a block of
    // `per_device_train_batch_size`), as training lends them; pairs without `--unpair` refused.
    let kto = root().join("tests/fixtures/data/kto.jsonl");
    let v = read(&kto, &["--loss-type", "kto", "--per-device-train-batch-size", "4"]);
    let opts = LoadOptions { rows: data::RowKind::Unpaired { unpair: false }, ..LoadOptions::default() };
    let truncation =
        data::Truncation { max_length: Some(1024), rows: dpo_train::config::Rows::Kto, ..Default::default() };
    let rows = data::prepare(&kto, &opts, &tokenizer, truncation, Default::default(), &mut |_, _| {}).unwrap().pairs;
    let rows = data::kto::with_kl(&rows, 4, Some(1024));
    let mut packed: Vec<u64> =
        rows.iter().map(|p| (p.prompt_ids.len() + p.chosen_ids.len() + p.rejected_ids.len()) as u64).collect();
    packed.sort_unstable_by(|a, b| b.cmp(a));
    assert!(rows.iter().all(|p| !p.rejected_ids.is_empty()));
    assert_eq!((v["pairs"].as_u64(), &v["packed_longest"]), (Some(rows.len() as u64), &serde_json::json!(packed)));
    let err = one_line_error(&dpo_train(
        &[
            &["data", "lengths", "--model", model.to_str().unwrap(), "--data", prefs.to_str().unwrap()][..],
            &["--loss-type", "kto"],
        ]
        .concat(),
    ));
    assert!(err.contains("`--unpair true`"), "{err}");
    let unpaired = read(&prefs, &["--loss-type", "kto", "--unpair"]);
    assert_eq!(unpaired["pairs"].as_u64(), Some(2 * run(&[])["pairs"].as_u64().unwrap()));
    // A bad value is refused as `train` refuses it, named by its flag.
    for (flag, value) in [("--unpair", "true"), ("--max-length", "1")] {
        let args = [&["data", "lengths", "--model", model_path, "--data", prefs_path][..], &[flag, value]].concat();
        let err = one_line_error(&dpo_train(&args));
        assert!(err.starts_with(&format!("error: `{flag}`: ")), "{err}");
    }
}

/// A run reports its largest micro-batch beside its peak memory (what check-gpu's estimate of
/// the run takes): one micro-batch of every fixture pair holds each pair's prompt once and both
/// completions, and scores the completions' tokens; with two CPU ranks, each rank's own.
#[test]
fn a_run_reports_its_largest_micro_batch() {
    use dpo_train::data::{self, LoadOptions, Tokenizer};
    let (model, prefs) = (root().join("tests/fixtures/models/llama"), root().join("tests/fixtures/data/prefs.jsonl"));
    let tokenizer = Tokenizer::from_dir(&model).unwrap();
    let truncation = data::Truncation { max_length: Some(1024), ..Default::default() };
    let pairs =
        data::prepare(&prefs, &LoadOptions::default(), &tokenizer, truncation, Default::default(), &mut |_, _| {})
            .unwrap()
            .pairs;
    let packed: usize = pairs.iter().map(|p| p.prompt_ids.len() + p.chosen_ids.len() + p.rejected_ids.len()).sum();
    let scored: usize = pairs.iter().map(|p| p.chosen_ids.len() + p.rejected_ids.len()).sum();
    let dir = tempfile::tempdir().unwrap();
    let largest = |extra: &[&str]| {
        let out_dir = dir.path().join(extra.len().to_string());
        let args = [
            ["train", "--model", model.to_str().unwrap(), "--data", prefs.to_str().unwrap()].as_slice(),
            &["--output-dir", out_dir.to_str().unwrap(), "--max-steps", "1", "--save-steps", "0", "--num-samples", "0"],
            &["--per-device-train-batch-size", "32", "--bf16", "false"],
            extra,
        ]
        .concat();
        let out = dpo_train(&args);
        let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{said}");
        let line =
            said.lines().find(|l| l.contains("largest micro-batch")).expect("the largest micro-batch is reported");
        line.split("per rank: ").nth(1).unwrap().to_owned()
    };
    assert_eq!(largest(&[]), format!("{packed}/{scored}"));
    // Two ranks split the pairs: each rank's largest is its own, together the whole batch's.
    let per_rank: Vec<(usize, usize)> = largest(&["--devices", "cpu:2"])
        .split(", ")
        .map(|r| r.split_once('/').map(|(t, n)| (t.parse().unwrap(), n.parse().unwrap())).unwrap())
        .collect();
    assert_eq!(per_rank.len(), 2);
    assert_eq!(per_rank.iter().fold((0, 0), |a, r| (a.0 + r.0, a.1 + r.1)), (packed, scored));
}

/// `slurm` takes the config keys' flags as `train` does, with or without a file: they reach every
/// task's `dpo-train train` as given (dpo-train's own parser reads back the same keys, TRL's
/// spellings included), and a config `train` would refuse, or a batch the job's tasks cannot
/// split, is refused before a script is printed: one line, exit 1.
#[test]
fn slurm_checks_the_config_and_passes_its_flags_on() {
    let (model, prefs) = (root().join("tests/fixtures/models/llama"), root().join("tests/fixtures/data/prefs.jsonl"));
    let (m, d) = (model.to_str().unwrap(), prefs.to_str().unwrap());
    let given = ["--model", m, "--data", d, "--beta", "0.2", "--per-device-train-batch-size", "2", "--use_peft"];
    let out = dpo_train(&[&["slurm", "--nodes", "2", "--gpus-per-node", "4"][..], &given].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let script = String::from_utf8(out.stdout).unwrap();
    let srun = script.lines().find(|l| l.starts_with("srun ")).expect("an srun line");
    // The resume's array (empty on a first submission) is bash's.
    let words: Vec<&str> = std::iter::once("dpo-train")
        .chain(srun.split_whitespace().skip_while(|w| *w != "train").filter(|w| !w.starts_with("${")))
        .collect();
    use clap::Parser;
    let Some(dpo_train::cli::args::Command::Train(task)) =
        dpo_train::cli::args::Cli::try_parse_from(&words).unwrap().command
    else {
        panic!("not a train command: {srun}")
    };
    let asked = dpo_train::cli::args::Cli::try_parse_from([&["dpo-train", "train"][..], &given].concat()).unwrap();
    let Some(dpo_train::cli::args::Command::Train(asked)) = asked.command else { unreachable!() };
    let named: Vec<_> = task.overrides.values.iter().filter(|(k, _)| k != "run_name").cloned().collect();
    assert_eq!(named, asked.overrides.values, "{srun}");
    assert!(srun.contains(" --device cuda "), "{srun}");
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));

    // What this host does not have is noted, where it was set, and the script printed all the
    // same (the job's nodes may mount it).
    let out = dpo_train(&["slurm", "--model", m, "--data", "nowhere.jsonl"]);
    assert!(out.status.success() && out.stdout.starts_with(b"#!/bin/bash"));
    let notes = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        notes.trim_end(),
        "note: `--train-file`: `nowhere.jsonl` is not on this host (nor in its Hugging Face cache): the job fails unless its nodes have it"
    );

    // Refused, before any script: a value train refuses, no model, a batch 8 tasks cannot split.
    let refused =
        |extra: &[&str]| one_line_error(&dpo_train(&[&["slurm", "--gpus-per-node", "4"][..], extra].concat()));
    assert_eq!(
        refused(&["--model", m, "--data", d, "--beta", "-1"]),
        "error: `--beta`: must be finite and > 0, got -1"
    );
    assert!(refused(&["--data", d]).contains("`model_name_or_path`: is required"));
    let err = refused(&["--model", m, "--data", d, "--per-device-train-batch-size", "4", "--global-batch-size", "8"]);
    assert!(err.contains("8 does not split into per_device_train_batch_size 4 x 4 devices"), "{err}");
    let err = refused(&["--model", m, "--data", d, "--time", "00:02:00"]);
    assert!(err.starts_with("error: `--save-before-limit`: 300 is not less than `--time 00:02:00` (120 s)"), "{err}");
    // What sbatch would refuse once queued, or read as lines of their own (a newline in the job's
    // name ended its `#SBATCH` options there), is refused here, the value escaped.
    let err = refused(&["--model", m, "--data", d, "--job-name", "x\necho INJECTED"]);
    assert!(err.starts_with("error: invalid value 'x\\necho INJECTED' for '--job-name"), "{err}");
    assert!(
        refused(&["--model", m, "--data", d, "--time", "abc"]).starts_with("error: invalid value 'abc' for '--time")
    );
    let err = refused(&["--model", m, "--data", d, "--mem-per-gpu", "lots"]);
    assert!(err.starts_with("error: invalid value 'lots' for '--mem-per-gpu"), "{err}");
}

/// The script `slurm` prints is one run: submitted again (or requeued), it resumes that run rather
/// than starting another. Run by bash with `srun` standing in (dpo-train on the CPU, the job's
/// flags as they come, its paths relative): the first submission trains to the end, the second
/// resumes the same run directory, finds nothing left to train and makes no other; a run that died
/// before its first checkpoint (its config and metrics there, no checkpoint) starts again.
#[test]
fn a_slurm_script_submitted_again_resumes_its_run() {
    let dir = tempfile::tempdir().unwrap();
    // The model and data by paths relative to the job's directory, as a user writes them there
    // (the run saves them absolute, and its resume compares them so).
    std::os::unix::fs::symlink(root().join("tests/fixtures/models/llama"), dir.path().join("model")).unwrap();
    std::os::unix::fs::symlink(root().join("tests/fixtures/data/prefs.jsonl"), dir.path().join("prefs.jsonl")).unwrap();
    // Made where the job runs, as a user makes it: the script runs its tasks there.
    let out = Command::new(env!("CARGO_BIN_EXE_dpo-train"))
        .current_dir(dir.path())
        .args([
            "slurm",
            "--gpus-per-node",
            "1",
            "--model",
            "model",
            "--data",
            "prefs.jsonl",
            "--max-steps",
            "2",
            "--num-samples",
            "0",
            "--output-dir",
            "runs",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fs::write(dir.path().join("job.sbatch"), &out.stdout).unwrap();
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).unwrap();
    // srun: its option, then `dpo-train train ...`, run here on the CPU.
    let srun = "#!/bin/bash\nshift 2\nargs=()\nfor a in \"$@\"; do [ \"$a\" = cuda ] && a=cpu; args+=(\"$a\"); done\n\
                echo \"${args[@]}\" >> submitted\nexec \"$DPO_TRAIN\" \"${args[@]}\"\n";
    for (name, body) in [("srun", srun), ("scontrol", "#!/bin/sh\necho node1\n")] {
        fs::write(bin.join(name), body).unwrap();
        Command::new("chmod").arg("+x").arg(bin.join(name)).status().unwrap();
    }
    let submit = || {
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        let out = Command::new("bash")
            .arg("job.sbatch")
            .current_dir(dir.path())
            .env("PATH", path)
            .env("DPO_TRAIN", env!("CARGO_BIN_EXE_dpo-train"))
            .envs([("SLURM_JOB_NODELIST", "node1"), ("SLURM_JOB_ID", "7")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    submit();
    let listed = || -> Vec<_> {
        let all = fs::read_dir(dir.path().join("runs")).unwrap().map(|e| e.unwrap().path());
        all.filter(|p| p.join("config.toml").is_file()).collect()
    };
    let runs = listed();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].join("final").is_dir());
    let said = submit();
    let submitted = fs::read_to_string(dir.path().join("submitted")).unwrap();
    let second = submitted.lines().nth(1).unwrap();
    let run = format!("runs/{}", runs[0].file_name().unwrap().to_string_lossy());
    assert!(second.ends_with(&format!("--device cpu --resume {run}")), "{second}");
    assert_eq!(listed(), runs, "{said}");
    // Killed before its first checkpoint: requeued, it trains the run again, not a resume refused.
    fs::remove_dir_all(runs[0].join("checkpoints")).unwrap();
    fs::remove_dir_all(runs[0].join("final")).unwrap();
    submit();
    let third = fs::read_to_string(dir.path().join("submitted")).unwrap().lines().nth(2).unwrap().to_owned();
    assert!(third.ends_with("--device cpu"), "{third}");
    assert!(runs[0].join("final").is_dir() && listed() == runs);
}

/// `plot` of a directory that is no run, or of a run whose `metrics.csv` is foreign or damaged,
/// is bad input: one line naming the file (and the line), exit 1.
#[test]
fn plot_refuses_what_is_no_run_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err = one_line_error(&dpo_train(&["plot", missing.to_str().unwrap()]));
    assert!(err.starts_with(&format!("error: cannot read `{}`", missing.join("metrics.csv").display())), "{err}");
    let metrics = dir.path().join("metrics.csv");
    fs::write(&metrics, "step,loss\n1,0.5\n").unwrap();
    let err = one_line_error(&dpo_train(&["plot", dir.path().to_str().unwrap()]));
    assert!(err.starts_with(&format!("error: `{}`, line 1: not the header", metrics.display())), "{err}");
    assert!(!dir.path().join("loss.png").exists(), "nothing drawn");
    // An overlay's `--out` that is a file is named as the bad flag (it was an I/O failure, exit 2).
    let file = dir.path().join("afile");
    fs::write(&file, "").unwrap();
    let (a, f) = (missing.to_str().unwrap(), file.to_str().unwrap());
    fs::create_dir(&missing).unwrap();
    fs::copy(root().join("results/example/metrics.csv"), missing.join("metrics.csv")).unwrap();
    let err = one_line_error(&dpo_train(&["plot", a, a, "--out", f]));
    assert_eq!(err, format!("error: `--out`: `{f}` is a file, not a directory"));
}

/// A TRL command line's lists are space-separated values (`--loss_type sigmoid sft`, argparse's
/// `nargs="+"`), read as the comma-separated ones here, negative numbers included; a flag given
/// twice takes its last value, as argparse does.
#[test]
fn trl_lists_and_repeated_flags_read_as_argparse_reads_them() {
    use clap::Parser;
    let words = [
        "dpo-train",
        "train",
        "--loss_type",
        "sigmoid",
        "sft",
        "--loss_weights",
        "1.0",
        "-0.5",
        "--beta",
        "0.2",
        "--beta",
        "0.3",
        "--lora_target_modules",
        "q_proj",
        "k_proj",
        "--use_peft",
    ];
    let Some(dpo_train::cli::args::Command::Train(args)) =
        dpo_train::cli::args::Cli::try_parse_from(words).unwrap().command
    else {
        panic!("not a train command")
    };
    let got: std::collections::BTreeMap<_, _> = args.overrides.values.into_iter().collect();
    assert_eq!(got["loss_type"], "sigmoid,sft");
    assert_eq!(got["loss_weights"], "1.0,-0.5");
    assert_eq!(got["beta"], "0.3");
    assert_eq!(got["lora_target_modules"], "q_proj,k_proj");
    assert_eq!(got["use_peft"], "true");
}

/// A TRL recipe with `lora_r` but no `use_peft` trains LoRA here, where `trl dpo` trains every
/// weight: the run says so at its start.
#[test]
fn a_recipe_with_lora_r_and_no_use_peft_is_told_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("r.yaml");
    let text = format!(
        "model_name_or_path: {}\ndataset_name: {}\nlora_r: 8\nmax_steps: 1\nnum_samples: 0\noutput_dir: {}\n",
        root().join("tests/fixtures/models/llama").display(),
        root().join("tests/fixtures/data/prefs.jsonl").display(),
        dir.path().join("out").display()
    );
    fs::write(&recipe, text).unwrap();
    let out = dpo_train(&["train", "--config", recipe.to_str().unwrap(), "--bf16", "false"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let note = "note: `lora_r` trains a LoRA adapter here; TRL's `trl dpo` trains one only with `use_peft`";
    assert!(said.contains(note), "{said}");
    // TRL's command line, spelled as TRL spells it, is told too; dpo-train's own flag is not.
    let (model, data) = (root().join("tests/fixtures/models/llama"), root().join("tests/fixtures/data/prefs.jsonl"));
    let out_dir = dir.path().join("out");
    let common = ["--model_name_or_path", model.to_str().unwrap(), "--dataset_name", data.to_str().unwrap()];
    let rest = ["--max_steps", "1", "--num-samples", "0", "--bf16", "false", "--output_dir", out_dir.to_str().unwrap()];
    for (flag, told) in [("--lora_r", true), ("--lora-r", false)] {
        let out = dpo_train(&[&["train"][..], &common, &rest, &[flag, "8"]].concat());
        let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{said}");
        assert_eq!(said.contains(note), told, "{flag}: {said}");
    }
}

/// A global batch the devices asked for cannot split is refused before any worker starts: one
/// line saying what would split, nothing written.
#[test]
fn a_batch_the_devices_cannot_split_is_refused_before_workers_start() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let (model, data) = (root().join("tests/fixtures/models/llama"), root().join("tests/fixtures/data/prefs.jsonl"));
    let out = dpo_train(&[
        "train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--global-batch-size",
        "4",
        "--devices",
        "cpu:2",
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    let err = one_line_error(&out);
    assert!(err.ends_with("4 does not split into per_device_train_batch_size 8 x 2 devices x a whole number of accumulation steps: give a multiple of 16, or another per_device_train_batch_size"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("launching"), "workers started");
    assert!(!out_dir.exists());
}
