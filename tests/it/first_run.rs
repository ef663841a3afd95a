//! A researcher's first real run, as they would walk it: their own model directory and data, no
//! `--config`, one device and several, Ctrl-C in the middle, a full disk, bad files. Each test runs
//! the `dpo-train` binary and checks what the user sees: the exit code, the one-line error, the
//! files written, the processes left.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::cli::{
    children_of, data, dpo_train, finish, model, one_line_error, s, short_run, stderr, train, wait_or_kill, wait_until,
};
use crate::common::{fixtures, max_diff, tensors};

// --- 1. one device is one process -------------------------------------------------------------

/// `--devices cpu:1` runs as one process (no launcher, no worker launching workers) and trains the
/// same parameters as a plain run; so does a process that has worker variables of a world of 1
/// (torchrun --nproc-per-node 1) asked for one device (`--devices cpu:2` there launches 2: the
/// launch rules' unit tests).
#[test]
fn one_device_is_one_process_and_trains_like_a_plain_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str], env: &[(&str, &str)]| {
        let args = short_run(dir.path(), name, &model(), &data(), extra);
        let mut cmd = dpo_train();
        cmd.arg("train").args(&args).envs(env.iter().copied());
        let out = finish(cmd, Duration::from_secs(120));
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert!(!stderr(&out).contains("launching"), "{name} launched workers: {}", stderr(&out));
        tensors(&dir.path().join(name).join("final/model.safetensors"))
    };
    let plain = run("plain", &[], &[]);
    let one_cpu = run("cpu1", &["--devices", "cpu:1"], &[]);
    assert_eq!(max_diff(&plain, &one_cpu), 0.0);
    let torchrun_of_one = [
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29999"),
    ];
    let worker = run("worker", &["--devices", "cpu:1"], &torchrun_of_one);
    assert_eq!(max_diff(&plain, &worker), 0.0);
}

// --- 2. a user's model trains with TRL's defaults ----------------------------------------------

/// No `--config`: the user's model and data train with TRL's DPOConfig defaults; nothing of the
/// demo is built or used, and the start lists where every value came from.
#[test]
fn a_users_model_trains_with_trls_defaults_without_a_config() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(&["--model", s(&model()), "--data", s(&data()), "--output-dir", s(dir.path()), "--max-steps", "2"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("demo"), "the demo leaked into a user's run: {err}");
    assert!(err.contains("effective config (flags, and TRL's DPOConfig defaults for the rest)"), "{err}");
    let origin = |key: &str| err.lines().find(|l| l.trim_start().starts_with(&format!("{key} = "))).map(str::to_owned);
    assert!(origin("model_name_or_path").is_some_and(|l| l.ends_with("# flag")), "{err}");
    assert!(origin("learning_rate").is_some_and(|l| l.contains("= 1e-6") && l.ends_with("# default")), "{err}");
    assert!(origin("bf16").is_some_and(|l| l.contains("= true") && l.ends_with("# default")), "{err}");
    // The run directory, beside the tokenised-data cache.
    let mut runs: Vec<PathBuf> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    runs.sort();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[0].ends_with(".data_cache"), "{runs:?}");
    let run = &runs[1];
    assert!(run.file_name().unwrap().to_string_lossy().ends_with("-llama"), "{run:?}");
    assert!(!run.join("demo").exists() && !run.join("sft").exists());
    let saved = dpo_train::config::TrainConfig::from_toml_file(&run.join("config.toml")).unwrap();
    assert_eq!((saved.loss.beta, saved.learning_rate, saved.max_length, saved.sft_steps), (0.1, 1e-6, 1024, 0));
    assert_eq!(saved.loss.loss_type, vec![dpo_train::config::LossType::Sigmoid]);
    assert!(saved.eval_file.is_none() && saved.test_file.is_none() && saved.warmup_steps == 0.0);
    // No evaluation ran, so the summary shows none.
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(!summary.contains("eval:") && !summary.contains("test:"), "{summary}");
    assert!(run.join("final/model.safetensors").is_file());
    // The data report: printed before the first step and kept in the run directory.
    assert!(err.contains("17 pairs kept of 17 rows; dropped 0 bad, 0 prompt too long"), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&fs::read(run.join("data_report.json")).unwrap()).unwrap();
    let train = &report["train"];
    assert_eq!((train["rows_read"].as_u64(), train["pairs_kept"].as_u64()), (Some(17), Some(17)));
    assert_eq!(train["micro_batch"].as_u64(), Some(8));
    let p = &train["tokens"]["chosen"];
    assert!(p["p50"].as_u64() <= p["p90"].as_u64() && p["p90"].as_u64() <= p["max"].as_u64(), "{p}");
    assert!((0.0..1.0).contains(&train["padding_fraction"].as_f64().unwrap()), "{train}");
    assert!(report["eval"].is_null() && report["test"].is_null(), "{report}");
}

/// TRL 1.16's DPOConfig defaults, read from TRL itself (`tests/gen/make_trl_defaults.py`), are
/// dpo-train's for every key the two share.
#[test]
fn defaults_are_trls() {
    let text = fs::read_to_string(fixtures().join("expected/trl_config_defaults.json")).unwrap();
    let trl: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ours = toml::Value::try_from(dpo_train::config::TrainConfig::default()).unwrap();
    let mut compared = 0;
    for (key, expected) in trl.as_object().unwrap().iter().filter(|(k, _)| !k.starts_with('_')) {
        let found = match (key.as_str(), ours.get(key)) {
            ("bf16", _) => serde_json::json!(dpo_train::config::TrainConfig::default().bf16()),
            // TRL's `None` is "not set": an empty list or an absent key here.
            ("loss_weights", Some(v)) => serde_json::json!(v.as_array().filter(|a| !a.is_empty())),
            (_, Some(v)) => serde_json::to_value(v).unwrap(),
            (_, None) => serde_json::Value::Null,
        };
        let equal = match (found.as_f64(), expected.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => &found == expected,
        };
        assert!(equal, "`{key}`: dpo-train {found}, TRL {expected}");
        compared += 1;
    }
    assert!(compared >= 25, "only {compared} keys compared");
}

/// Every command `check-gpu` prints, with the GPUs swapped for as many CPU processes, the data in
/// place of its placeholder (or given to the plan, as `check-gpu --data` does), and a short run's
/// output directory and step count added, trains the fixture model (TRL's defaults elsewhere).
#[test]
fn check_gpus_commands_run_as_printed() {
    use check_gpu::parse::{self, Input};
    use check_gpu::{FineTune, ModelShape, PlanRequest, plan};

    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("runs");
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crates/check_gpu/tests/fixtures");
    let (tp, qp) = (fixture.join("t4x2-phb.topo.txt"), fixture.join("t4x2-phb.query.csv"));
    let (topo, query) = (parse::read(&tp).unwrap(), parse::read(&qp).unwrap());
    let snap = parse::offline_snapshot(Some(Input { text: &topo, path: &tp }), Some(Input { text: &query, path: &qp }))
        .unwrap();
    let shape = Some(ModelShape::from_hf_dir(&model()).unwrap());
    let mut plans = Vec::new();
    for finetune in [FineTune::Full, FineTune::Lora { rank: 4 }] {
        let req = PlanRequest { model: shape.clone(), model_dir: Some(model()), finetune, ..PlanRequest::default() };
        plans.push(plan(&snap, &req));
    }
    let no_gpu = PlanRequest { model_dir: Some(model()), data: Some(data()), ..PlanRequest::default() };
    plans.push(check_gpu::Plan::cpu_fallback(&no_gpu, 2, String::new()));
    // Data of other column names, which the command reads by them.
    let renamed = dir.path().join("renamed.jsonl");
    crate::common::with_renamed_columns(&data(), &renamed);
    let reading = dpo_vocab::DataReading {
        prompt_column: Some("question".into()),
        chosen_column: Some("good".into()),
        rejected_column: Some("bad".into()),
        ..Default::default()
    };
    let columns = PlanRequest { data: Some(renamed), reading, ..no_gpu };
    plans.push(check_gpu::Plan::cpu_fallback(&columns, 2, String::new()));
    for (i, plan) in plans.iter().enumerate() {
        let command = &plan.command;
        let words: Vec<String> = command
            .split_whitespace()
            .map(|w| w.replace("YOUR_DATA.jsonl", s(&data())))
            .collect::<Vec<_>>()
            .join(" ")
            .replace("--gpus ", "--devices cpu:")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        assert_eq!(words[0], "dpo-train", "{command}");
        let name = format!("cmd{i}");
        let mut cmd = dpo_train();
        cmd.args(&words[1..]).args(["--run-name", &name, "--max-steps", "1", "--output-dir", s(&out_dir)]);
        let out = finish(cmd, Duration::from_secs(180));
        assert!(out.status.success(), "`{command}`: {}", stderr(&out));
        let saved = dpo_train::config::TrainConfig::from_toml_file(&out_dir.join(&name).join("config.toml")).unwrap();
        assert_eq!(saved.model_name_or_path, model().display().to_string(), "{command}");
        assert_eq!((saved.loss.beta, saved.learning_rate), (0.1, 1e-6), "{command}");
        assert!(out_dir.join(&name).join("final").is_dir(), "{command}");
        // dpo-train's own parser read back every setting the plan made, in dpo-vocab's types.
        let want = plan.settings.as_ref().expect("a plan that fits");
        let got = (
            saved.per_device_train_batch_size as u64,
            saved.gradient_accumulation_steps as u64,
            saved.global_batch_size.map(|g| g as u64),
            saved.max_length as u64,
        );
        assert_eq!(got, (want.micro_batch, want.accumulation, Some(want.global_batch), want.max_length), "{command}");
        assert_eq!(saved.precision(), want.precision, "{command}");
        assert_eq!(saved.lora_r.map(|r| r as u64), want.lora.as_ref().map(|l| l.r), "{command}");
        assert_eq!(saved.gradient_checkpointing, want.gradient_checkpointing, "{command}");
        assert_eq!((saved.sharding, saved.offload_optimizer), (want.sharding, want.offload_optimizer), "{command}");
        assert_eq!(saved.precompute_ref_log_probs, want.precompute_ref_log_probs, "{command}");
        let (r, or) = (&want.reading, |c: &Option<String>, default: &str| c.clone().unwrap_or(default.to_owned()));
        let columns =
            [or(&r.prompt_column, "prompt"), or(&r.chosen_column, "chosen"), or(&r.rejected_column, "rejected")];
        assert_eq!([saved.prompt_column, saved.chosen_column, saved.rejected_column], columns, "{command}");
    }
}

// --- 5. bad and interrupted runs ---------------------------------------------------------------

/// A copy of the fixture model whose `config.json` is edited by `edit` (the weights are not read
/// before the check that refuses it).
fn edited_model(dir: &Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let copy = dir.join(name);
    fs::create_dir_all(&copy).unwrap();
    for entry in fs::read_dir(model()).unwrap() {
        let path = entry.unwrap().path();
        fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(copy.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    fs::write(copy.join("config.json"), cfg.to_string()).unwrap();
    copy
}

/// Sequences beyond the model's positions, vocabularies the tokenizer overflows, a reference of
/// another shape, a CUDA device that is not there: one line each, exit 1, for every command.
#[test]
fn inputs_the_model_cannot_take_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("long.jsonl");
    let words = "the sea is wide and the wind is free ".repeat(60);
    fs::write(&long, format!("{}\n", serde_json::json!({"prompt": "Q:", "chosen": words, "rejected": " no"}))).unwrap();
    let (m, d, o) = (model(), data(), dir.path().join("runs"));
    let base = ["--output-dir", s(&o), "--max-steps", "1"];
    let err = one_line_error(&train(&[&["--model", s(&m), "--data", s(&long)][..], &base].concat()));
    assert!(err.contains(&format!("`{}` has a sequence of", long.display())), "{err}");
    assert!(err.ends_with("handles at most 256 (`max_position_embeddings`): pass `--max-length 256` or less"), "{err}");
    let eval = |args: &[&str]| {
        let mut cmd = dpo_train();
        cmd.arg("eval").args(args);
        finish(cmd, Duration::from_secs(60))
    };
    let err = one_line_error(&eval(&["--model", s(&m), "--data", s(&long)]));
    assert!(err.contains("handles at most 256 (`max_position_embeddings`)"), "{err}");

    let small = edited_model(dir.path(), "small-vocab", |c| c["vocab_size"] = 300.into());
    let expected =
        format!("the tokenizer has 380 tokens but the model in `{}` embeds only 300 (`vocab_size`)", small.display());
    let err =
        one_line_error(&train(&[&["--model", s(&m), "--ref-model", s(&small), "--data", s(&d)][..], &base].concat()));
    assert!(err.ends_with(&expected), "{err}");
    let prompts = dir.path().join("prompts.txt");
    fs::write(&prompts, "Hello\n").unwrap();
    let mut cmd = dpo_train();
    cmd.args(["generate", "--model", s(&small), "--prompts", s(&prompts)]);
    let err = one_line_error(&finish(cmd, Duration::from_secs(60)));
    assert!(err.ends_with(&expected), "{err}");

    let other_vocab = edited_model(dir.path(), "bigger-vocab", |c| c["vocab_size"] = 448.into());
    let err = one_line_error(&train(
        &[&["--model", s(&m), "--ref-model", s(&other_vocab), "--data", s(&d)][..], &base].concat(),
    ));
    assert!(
        err.ends_with(&format!(
            "the reference in `{}` (vocab_size 448) does not match the policy in `{}` (vocab_size 384): its vocabulary differs",
            other_vocab.display(),
            m.display()
        )),
        "{err}"
    );
    let other_family = edited_model(dir.path(), "qwen-shaped", |c| c["model_type"] = "qwen2".into());
    let err = one_line_error(&eval(&["--model", s(&m), "--ref-model", s(&other_family), "--data", s(&d)]));
    assert!(
        err.contains("(model_type qwen2) does not match the policy") && err.ends_with("its architecture differs"),
        "{err}"
    );

    // A truncated weights file (a download cut short) is found before the run directory exists.
    let cut = edited_model(dir.path(), "truncated", |_| {});
    let weights = fs::read(cut.join("model.safetensors")).unwrap();
    fs::write(cut.join("model.safetensors"), &weights[..weights.len() / 2]).unwrap();
    let err = one_line_error(&train(&[&["--model", s(&cut), "--data", s(&d)][..], &base].concat()));
    assert!(err.contains(&format!("cannot load the model in `{}`", cut.display())), "{err}");
    assert!(err.contains("model.safetensors"), "{err}");

    let err = one_line_error(&train(&[&["--model", s(&m), "--data", s(&d), "--device", "cuda"][..], &base].concat()));
    assert!(
        err.ends_with("`--device`: asks for CUDA device 0 and 0 CUDA device(s) are found; run with `--device cpu`"),
        "{err}"
    );
    let err = one_line_error(&eval(&["--model", s(&m), "--data", s(&d), "--device", "cuda:1"]));
    assert!(
        err.ends_with("`--device`: asks for CUDA device 1 and 0 CUDA device(s) are found; run with `--device cpu`"),
        "{err}"
    );
    assert!(!o.exists(), "a refused run wrote `{}`", o.display());
}

/// `generate` says when the model's positions cut a completion short, and refuses a prompt that
/// leaves no room.
#[test]
fn generate_names_the_position_limit() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.txt");
    let long = "the sea is wide and the wind is free ".repeat(15);
    fs::write(&prompts, format!("Hello\n{long}\n")).unwrap();
    let mut cmd = dpo_train();
    cmd.args([
        "generate",
        "--model",
        s(&model()),
        "--prompts",
        s(&prompts),
        "--max-new-tokens",
        "20",
        "--temperature",
        "0",
    ]);
    let out = finish(cmd, Duration::from_secs(60));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("`{}`, line 2: the prompt has", prompts.display())) && err.contains("at most"),
        "{err}"
    );
    fs::write(&prompts, format!("Hello\n{}\n", long.repeat(2))).unwrap();
    let mut cmd = dpo_train();
    cmd.args(["generate", "--model", s(&model()), "--prompts", s(&prompts)]);
    let err = one_line_error(&finish(cmd, Duration::from_secs(60)));
    assert!(err.contains(", line 2: the prompt has") && err.ends_with("no room to generate"), "{err}");
}

/// Bad flags, worker variables and config values: one line, exit 1, named where they were set.
#[test]
fn bad_flags_variables_and_values_exit_1_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let err = one_line_error(&train(&["--learning-rat", "1e-5"]));
    assert!(
        err.starts_with("error: unexpected argument '--learning-rat' found") && err.contains("--learning-rate"),
        "{err}"
    );
    let mut cmd = dpo_train();
    cmd.args(["train", "--model", s(&model()), "--data", s(&data())]).env("RANK", "x").env("WORLD_SIZE", "2");
    let err = one_line_error(&finish(cmd, Duration::from_secs(60)));
    assert!(err.contains("`LOCAL_RANK` is not set") || err.contains("`RANK` is `x`"), "{err}");
    let config = dir.path().join("c.toml");
    fs::write(
        &config,
        format!("model_name_or_path = \"{}\"\ntrain_file = \"x.jsonl\"\n\nlearning_rate = -1.0\n", model().display()),
    )
    .unwrap();
    let err = one_line_error(&train(&["--config", s(&config)]));
    assert_eq!(err, format!("error: `{}`, line 4: `learning_rate`: must be finite and > 0, got -1", config.display()));
    let err = one_line_error(&train(&["--config", s(&config), "--learning-rate", "0"]));
    assert_eq!(err, "error: `--learning-rate`: must be finite and > 0, got 0");
    fs::write(&config, "learning_rat = 1e-5\n").unwrap();
    let err = one_line_error(&train(&["--config", s(&config)]));
    assert_eq!(
        err,
        format!("error: `{}`, line 1: unknown key `learning_rat`; did you mean `learning_rate`?", config.display())
    );
    let err = one_line_error(&train(&["--data", s(&data())]));
    assert!(err.starts_with("error: `model_name_or_path`: is required"), "{err}");
}

/// A run that died before its first checkpoint, started again under its name, logs each step
/// once; `--resume` without a directory continues the newest run and keeps the metrics to its
/// checkpoint.
#[test]
fn restarts_and_resumes_log_each_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let args = short_run(dir.path(), "again", &model(), &data(), &["--logging-steps", "1", "--save-steps", "0"]);
    assert!(train(&args).status.success());
    // The state of a run that died after logging, before any checkpoint.
    fs::remove_dir_all(dir.path().join("again/checkpoints")).unwrap();
    fs::remove_dir_all(dir.path().join("again/final")).unwrap();
    let out = train(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let steps = |run: &str| -> Vec<(u64, String)> {
        let rows = dpo_train::train::log::read_metrics(&dir.path().join(run).join("metrics.csv")).unwrap();
        rows.iter().map(|r| (r.step, format!("{:?}", r.split))).collect()
    };
    assert_eq!(steps("again").iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2, 3]);

    let out = train(&["--resume", "--output-dir", s(dir.path()), "--max-steps", "5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("resuming dpo from"), "{}", stderr(&out));
    assert_eq!(steps("again").iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);

    // Another global batch would replay or skip data: refused, naming both, before anything is
    // rewritten; the same batch another way (2 per device x 2 accumulation) resumes.
    let config = fs::read_to_string(dir.path().join("again/config.toml")).unwrap();
    let run = dir.path().join("again");
    let resume = |extra: &[&str]| {
        let mut args = vec!["--resume", s(&run), "--max-steps", "6"];
        args.extend_from_slice(extra);
        train(&args)
    };
    let err = one_line_error(&resume(&["--per-device-train-batch-size", "2"]));
    assert!(
        err.contains("was saved at a global batch of 4 pairs and this run's is 2 (2 per device x 1 devices"),
        "{err}"
    );
    assert_eq!(fs::read_to_string(dir.path().join("again/config.toml")).unwrap(), config);
    let out = resume(&["--per-device-train-batch-size", "2", "--global-batch-size", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `save_strategy = "no"` (TRL's value) writes no checkpoint, not even at the end, as transformers
/// saves none; `final/` holds the model, and a resume of the finished run says there is nothing
/// to train and writes nothing.
#[test]
fn save_strategy_no_writes_the_model_and_no_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--save-strategy", "no", "--save-steps", "1", "--logging-steps", "1"];
    let out = train(&short_run(dir.path(), "nosave", &model(), &data(), &extra));
    assert!(out.status.success(), "{}", stderr(&out));
    let run = dir.path().join("nosave");
    assert!(!run.join("checkpoints").exists() && run.join("final/model.safetensors").is_file());
    let metrics = fs::read_to_string(run.join("metrics.csv")).unwrap();
    let out = train(&["--resume", s(&run), "--max-steps", "5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing to train: the run finished and"), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(run.join("metrics.csv")).unwrap(), metrics);
    assert!(!run.join("checkpoints").exists());
}

/// A checkpoint holds the tokenizer, so `eval` (and `generate`) take it as a model directory;
/// `--resume RUN/checkpoints/step-N`, as TRL's `resume_from_checkpoint` takes one, continues
/// that run when the checkpoint is its newest (it trained a new run inside the checkpoint's
/// directory, from step 0); an older one is refused, naming what came after it. A newest
/// checkpoint that cannot be loaded (a flipped bit found by its checksums, a damaged trainer
/// state) says how to resume from the one before, and that works.
#[test]
fn resume_takes_a_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert!(train(&short_run(dir.path(), "ck", &model(), &data(), &["--save-steps", "1"])).status.success());
    let run = dir.path().join("ck");
    let ckpt = |n: u64| run.join(format!("checkpoints/step-{n}"));
    // A checkpoint is a model directory, tokenizer included: it evaluates as `final/` does.
    let mut eval = dpo_train();
    eval.args(["eval", "--model", s(&ckpt(2)), "--data", s(&data())]);
    let evaluated = finish(eval, Duration::from_secs(120));
    assert!(evaluated.status.success(), "{}", stderr(&evaluated));
    let older = one_line_error(&train(&["--resume", s(&ckpt(2)), "--max-steps", "4"]));
    let after = format!("is not the newest checkpoint of its run: `{}` came after it", ckpt(3).display());
    assert!(older.contains(&after), "{older}");
    assert!(older.ends_with(&format!("`--resume {}` to continue from the newest", run.display())), "{older}");
    assert!(!ckpt(2).join("checkpoints").exists() && !ckpt(4).exists());
    let out = train(&["--resume", s(&ckpt(3)), "--max-steps", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("resuming dpo from `{}` (step 3)", ckpt(3).display())), "{}", stderr(&out));
    assert!(ckpt(4).is_dir() && !ckpt(3).join("checkpoints").exists());
    // One flipped bit in the weights' data still parses as safetensors: the checksums written
    // with the checkpoint find it, in a resume and in an eval of the checkpoint.
    let weights = ckpt(4).join("model.safetensors");
    let mut bytes = fs::read(&weights).unwrap();
    let at = bytes.len() - 9;
    bytes[at] ^= 0x10;
    fs::write(&weights, &bytes).unwrap();
    let mut eval = dpo_train();
    eval.args(["eval", "--model", s(&ckpt(4)), "--data", s(&data())]);
    let damaged = one_line_error(&finish(eval, Duration::from_secs(120)));
    let named = format!("`{}` is damaged: its CRC-32C is ", weights.display());
    assert!(damaged.contains(&named) && damaged.contains("that checksums.json recorded when"), "{damaged}");
    // A damaged checkpoint is bad input (exit 1), with the way to resume from the one before.
    let out = train(&["--resume", s(&run), "--max-steps", "5"]);
    let damaged = stderr(&out);
    let advice = format!("(move `step-4` out of `{}` to resume from step-3)", run.join("checkpoints").display());
    assert!(damaged.contains(&advice) && damaged.contains(&named) && out.status.code() == Some(1), "{damaged}");
    fs::write(ckpt(4).join("trainer_state.json"), "{damaged").unwrap();
    let out = train(&["--resume", s(&run), "--max-steps", "5"]);
    let damaged = stderr(&out);
    assert!(damaged.contains("trainer_state.json` is damaged: its length is 8 bytes"), "{damaged}");
    assert!(damaged.contains(&advice) && out.status.code() == Some(1), "{damaged}");
    fs::rename(ckpt(4), dir.path().join("step-4-damaged")).unwrap();
    let out = train(&["--resume", s(&run), "--max-steps", "5"]);
    assert!(out.status.success() && stderr(&out).contains("(step 3)"), "{}", stderr(&out));
}

/// A resume of a finished run has nothing to train: it says so, prints the run's summary, exits
/// 0 and writes nothing (a second export rewrote `final/` and dropped the held-out metrics from
/// `summary.txt`). A `final/` older than the newest checkpoint (a resume that trained on and died
/// before its export) is written again.
#[test]
fn a_finished_run_resumed_trains_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    assert!(train(&short_run(dir.path(), "done", &model(), &data(), &["--eval-file", s(&data())])).status.success());
    let run = dir.path().join("done");
    let model_file = run.join("final/model.safetensors");
    let summary = fs::read_to_string(run.join("summary.txt")).unwrap();
    assert!(summary.contains("\neval: loss "), "{summary}");
    let written = || fs::metadata(&model_file).unwrap().modified().unwrap();
    let exported = written();
    // Nor are the run's config and data report rewritten, even with a change accepted: nothing
    // trains with it (the run's config said `beta = 0.3` of a model trained at 0.1).
    let kept = ["config.toml", "data_report.json"].map(|f| fs::read_to_string(run.join(f)).unwrap());
    let out = train(&["--resume", s(&run), "--beta", "0.3", "--resume-with-changes"]);
    assert!(out.status.success() && stderr(&out).contains("nothing to train"), "{}", stderr(&out));
    assert_eq!(["config.toml", "data_report.json"].map(|f| fs::read_to_string(run.join(f)).unwrap()), kept);
    let out = train(&["--resume", s(&run)]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let note = format!("dpo: nothing to train: the run is at step 3 of 3 and `{}` holds", run.join("final").display());
    assert!(err.contains(&note) && !err.contains("dpo: steps"), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), summary);
    assert_eq!(written(), exported);
    assert_eq!(fs::read_to_string(run.join("summary.txt")).unwrap(), summary);

    let stale = exported - Duration::from_secs(3600);
    fs::File::options().write(true).open(&model_file).unwrap().set_modified(stale).unwrap();
    let out = train(&["--resume", s(&run)]);
    assert!(out.status.success() && !stderr(&out).contains("nothing to train"), "{}", stderr(&out));
    assert!(written() > stale);
}

/// A file-size limit (as a full disk) while a checkpoint is written: exit 2, one line that says
/// it was a write and gives the cause once, and no half-written checkpoint left behind.
#[test]
fn a_failed_checkpoint_write_is_reported_and_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let args = short_run(dir.path(), "full", &model(), &data(), &["--save-steps", "2"]);
    // The model file is 396 KB: a 200 KiB limit stops the first checkpoint.
    let mut cmd = Command::new("bash");
    cmd.args(["-c", "ulimit -f 200; exec \"$0\" train \"$@\"", env!("CARGO_BIN_EXE_dpo-train")]).args(&args);
    let out = finish(cmd, Duration::from_secs(120));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: cannot write `") && last.ends_with("File too large (os error 27)"), "{err}");
    assert_eq!(last.matches("os error").count(), 1, "{last}");
    let leftovers: Vec<String> = fs::read_dir(dir.path().join("full/checkpoints"))
        .map(|entries| entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Ctrl-C (SIGINT) or SIGTERM to the launcher of `--devices cpu:2`, alone, with its whole process
/// group, or with every worker too (a scheduler's SIGTERM to every process of a job step, each
/// worker then also getting a launcher's SIGINT: the same request twice, not the abort): the
/// workers save one checkpoint together, the job exits 130, and no worker is left.
#[test]
fn an_interrupted_multi_process_run_saves_and_exits_130() {
    let cases =
        [(libc::SIGINT, "launcher"), (libc::SIGINT, "group"), (libc::SIGTERM, "launcher"), (libc::SIGTERM, "all")];
    for (signal, to) in cases {
        let group = to == "group";
        let dir = tempfile::tempdir().unwrap();
        // `save_strategy = "no"` saves no checkpoint but this one, the way to resume.
        let saving = if to == "all" { ["--save-strategy", "no"] } else { ["--save-steps", "0"] };
        let extra = ["--devices", "cpu:2", "--logging-steps", "1", saving[0], saving[1]];
        let mut args = short_run(dir.path(), "stop", &model(), &data(), &extra);
        let steps = args.iter().position(|a| a == "--max-steps").unwrap() + 1;
        args[steps] = "100000".into();
        let mut cmd = dpo_train();
        cmd.arg("train").args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        let metrics = dir.path().join("stop/metrics.csv");
        let trained = || fs::read_to_string(&metrics).map_or(0, |t| t.lines().count()) >= 3;
        wait_until("the workers never trained", Duration::from_secs(90), Duration::from_millis(100), trained);
        let workers = children_of(pid);
        assert_eq!(workers.len(), 2, "{workers:?}");
        if to == "all" {
            for worker in &workers {
                // The scheduler's signal and, at once, a launcher's forward of it (this launcher's
                // own comes within its 50 ms poll, often after the tiny model's checkpoint).
                // SAFETY: signals to our child's unreaped children.
                unsafe { libc::kill(*worker, signal) };
                unsafe { libc::kill(*worker, libc::SIGINT) };
            }
        }
        // SAFETY: a signal to our own child (or its process group).
        unsafe { libc::kill(if group { -pid } else { pid }, signal) };
        let out = wait_or_kill(child, Duration::from_secs(90));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(130), "signal {signal} to {to}: {err}");
        assert!(err.contains("interrupted at step"), "signal {signal} to {to}: {err}");
        if to == "launcher" {
            assert!(err.contains("interrupt: asking the workers to save a checkpoint and stop"), "{err}");
        }
        let saved = dpo_train::train::checkpoint::list(&dir.path().join("stop"));
        assert_eq!(saved.len(), 1, "signal {signal} to {to}: {saved:?}");
        for worker in workers {
            assert!(!Path::new(&format!("/proc/{worker}")).exists(), "worker {worker} outlived the job");
        }
        // The way to resume names this run's devices, or the batch that resumes on others (8
        // pairs: 4 per device on 2); followed on one process, it resumes.
        let run = dir.path().join("stop");
        let hint = format!(
            "resume with `--resume {}` and `--devices cpu:2` (its 2 devices), or on others with `--global-batch-size 8`",
            run.display()
        );
        assert!(err.contains(&hint), "{err}");
        if to == "launcher" && signal == libc::SIGINT {
            let step: u64 =
                err.split("interrupted at step ").nth(1).and_then(|t| t.split(':').next()).unwrap().parse().unwrap();
            let next = (step + 1).to_string();
            let out = train(&["--resume", s(&run), "--global-batch-size", "8", "--max-steps", &next]);
            assert!(out.status.success(), "{}", stderr(&out));
        }
    }
}

/// A second Ctrl-C right behind the first aborts, in one process and under a launcher (where two
/// quick signals must not reach the workers as one): exit 130, no panic (exit's teardown under a
/// running kernel crashed in torch's dispatcher), no worker left. Whether the first signal's
/// checkpoint is written before the second lands is a race with a step of milliseconds.
#[test]
fn a_second_interrupt_aborts_at_once() {
    for devices in [None, Some("cpu:2")] {
        let dir = tempfile::tempdir().unwrap();
        let mut extra = vec!["--logging-steps", "1", "--save-steps", "0"];
        extra.extend(devices.iter().flat_map(|d| ["--devices", d]));
        let mut args = short_run(dir.path(), "abort", &model(), &data(), &extra);
        let steps = args.iter().position(|a| a == "--max-steps").unwrap() + 1;
        args[steps] = "100000".into();
        let mut cmd = dpo_train();
        cmd.arg("train").args(&args).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        let metrics = dir.path().join("abort/metrics.csv");
        let trained = || fs::read_to_string(&metrics).map_or(0, |t| t.lines().count()) >= 3;
        let what = format!("{devices:?}: it never trained");
        wait_until(&what, Duration::from_secs(90), Duration::from_millis(100), trained);
        let workers = children_of(pid);
        for _ in 0..2 {
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let out = wait_or_kill(child, Duration::from_secs(30));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(130), "{devices:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("INTERNAL ASSERT"), "{devices:?}: {err}");
        if devices.is_none() {
            // Training had begun: the first signal promised the step and a checkpoint.
            assert!(err.contains("interrupt: finishing the current step, then saving a checkpoint"), "{err}");
            // Unless the first signal's checkpoint won the race, the abort says what was lost.
            let saved = err.contains("saved `");
            assert!(
                saved || err.contains("interrupt: aborted; the steps since the last checkpoint were not saved"),
                "{err}"
            );
        } else if err.contains("interrupt: aborting the workers") {
            // The launcher killed the workers (unless the kernel merged the two signals, pending
            // at once, into one): it says so, and where a resume would start.
            assert!(err.contains("interrupt: aborted; the steps since the last checkpoint were not saved"), "{err}");
            assert!(err.contains("no checkpoint was saved yet") || err.contains("with `--resume "), "{err}");
        }
        for worker in workers {
            assert!(!Path::new(&format!("/proc/{worker}")).exists(), "worker {worker} outlived the job");
        }
    }
}

/// Runs `dpo-train train ARGS`, sends it SIGINT once a line of its stderr starts with `after`,
/// and returns its exit status and every stderr line.
fn interrupted_after(args: &[String], after: &str) -> (std::process::ExitStatus, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let mut cmd = dpo_train();
    cmd.arg("train").args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let pipe = BufReader::new(child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || pipe.lines().map_while(Result::ok).for_each(|l| tx.send(l).unwrap()));
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.starts_with(after)) {
        seen.push(lines.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| panic!("no `{after}`: {seen:?}")));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = wait_or_kill(child, Duration::from_secs(120)).status;
    reader.join().unwrap();
    seen.extend(lines.try_iter());
    (status, seen)
}

/// Ctrl-C while the test set is scored after the last step (thousands of pairs: seconds here,
/// minutes on a real set) stops the scoring: the run exits 130 with the last step's checkpoint
/// and no `final/`, as a Ctrl-C in a step does (it went on scoring, exported and exited 0), and a
/// resume exports and tests.
#[test]
fn an_interrupt_while_the_test_set_is_scored_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("test.jsonl");
    fs::write(&big, fs::read_to_string(data()).unwrap().repeat(600)).unwrap();
    let args = short_run(dir.path(), "t", &model(), &data(), &["--test-file", s(&big), "--max-steps", "1"]);
    // The last step's checkpoint is written just before the test set is scored.
    let (status, seen) = interrupted_after(&args, "saved `");
    assert_eq!(status.code(), Some(130), "{seen:?}");
    let run = dir.path().join("t");
    assert!(seen.iter().any(|l| l.starts_with("interrupted at step 1: resume with")), "{seen:?}");
    assert!(!seen.iter().any(|l| l.starts_with("test |")), "{seen:?}");
    assert!(!run.join("final").exists() && !run.join("summary.txt").exists());
    assert_eq!(dpo_train::train::checkpoint::list(&run).len(), 1);
    let resumed = train(&["--resume", s(&run)]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(run.join("final/model.safetensors").is_file());
    assert!(fs::read_to_string(run.join("summary.txt")).unwrap().contains("\ntest: loss "));
}

/// Ctrl-C in `eval` (one process; nothing to save) says it stopped and exits 130 at once, where
/// the signal ended it without a word. Sent once the handler is in place (the process catches
/// SIGINT), while 10,200 pairs are read and scored.
#[test]
fn an_interrupted_eval_says_so_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("eval.jsonl");
    fs::write(&big, fs::read_to_string(data()).unwrap().repeat(600)).unwrap();
    let mut cmd = dpo_train();
    cmd.args(["eval", "--model", s(&model()), "--data", s(&big)]).stdout(Stdio::null()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let catches_sigint = || {
        let status = fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
        let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).map(str::trim).unwrap_or("0");
        u64::from_str_radix(mask, 16).is_ok_and(|m| m & (1 << (libc::SIGINT - 1)) != 0)
    };
    wait_until("no handler installed", Duration::from_secs(60), Duration::from_millis(20), catches_sigint);
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = wait_or_kill(child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim(), "interrupt: stopped");
}

/// Ctrl-C while the reference scores a large held-out set before the first step stops the
/// scoring: the run stops at step 0 (exit 130) without going on to precompute the training set's
/// reference log-probs, and stores no cache entry (it scored every pair first).
#[test]
fn an_interrupt_while_the_reference_scores_stops_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("eval.jsonl");
    fs::write(&big, fs::read_to_string(data()).unwrap().repeat(600)).unwrap();
    let extra = ["--eval-file", s(&big), "--precompute-ref-log-probs", "true"];
    let args = short_run(dir.path(), "r", &model(), &data(), &extra);
    let (status, seen) = interrupted_after(&args, "scoring 10200 held-out pairs under the reference");
    assert_eq!(status.code(), Some(130), "{seen:?}");
    assert!(seen.iter().any(|l| l.starts_with("interrupted at step 0: resume with")), "{seen:?}");
    assert!(!seen.iter().any(|l| l.starts_with("precomputing reference log-probs")), "{seen:?}");
    let cached = fs::read_dir(dir.path().join(".ref_cache")).map_or(0, |d| d.count());
    assert_eq!(cached, 0);
}

/// Ctrl-C while a large file is tokenised (on the one thread `--dataset-num-proc 1` asks for)
/// stops at the next row: exit 130 within seconds, where tokenising the whole file takes about
/// 20 s here, the message, and nothing written: no cache entry, no run directory.
#[test]
fn an_interrupt_while_tokenising_stops_at_once_and_writes_nothing() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.jsonl");
    let rows: Vec<serde_json::Value> =
        fs::read_to_string(data()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut text = String::new();
    for i in 0.. {
        if text.len() > 40 << 20 {
            break;
        }
        let mut row = rows[i % rows.len()].clone();
        // Unique prompts, so no tokenizer cache makes the rows cheap.
        row["prompt"] = format!("{} {i}{i}{i}", row["prompt"].as_str().unwrap()).into();
        text += &row.to_string();
        text.push('\n');
    }
    fs::write(&big, text).unwrap();
    let out_dir = dir.path().join("out");
    let mut cmd = dpo_train();
    cmd.args(["train", "--model", s(&model()), "--train-file", s(&big), "--output-dir", s(&out_dir)])
        .args(["--max-steps", "1", "--dataset-num-proc", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || stderr.lines().map_while(Result::ok).for_each(|l| tx.send(l).unwrap()));
    let first = lines.recv_timeout(Duration::from_secs(60)).expect("a progress line");
    assert!(first.starts_with(&format!("reading `{}` (tokenising on 1 thread): ", big.display())), "{first}");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let signalled = Instant::now();
    let status = wait_or_kill(child, Duration::from_secs(60)).status;
    let took = signalled.elapsed();
    reader.join().unwrap();
    let err: Vec<String> = lines.try_iter().collect();
    assert_eq!(status.code(), Some(130), "{err:?}");
    let last = format!("`{}`: interrupted while tokenising: nothing was written", big.display());
    assert_eq!(err.last(), Some(&last), "{err:?}");
    // No step to finish and no checkpoint to save: the handler says so.
    assert!(err.iter().any(|l| l == "interrupt: stopping (Ctrl-C again to abort)"), "{err:?}");
    assert!(!err.iter().any(|l| l.contains("saving a checkpoint")), "{err:?}");
    // A generous bound: the whole file would take about 20 s more.
    assert!(took < Duration::from_secs(5), "stopped {took:?} after the signal");
    let left: Vec<_> = fs::read_dir(out_dir.join(".data_cache")).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "cache entries written: {left:?}");
    let runs: Vec<_> = fs::read_dir(&out_dir).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(runs.iter().all(|n| n == ".data_cache"), "{runs:?}");
}

/// Pairs whose chosen equals rejected are dropped and counted (they would add ln 2 and no
/// gradient); a huge row does not cost memory beyond the `max_length` tokens kept.
#[test]
fn identical_pairs_are_dropped_and_huge_rows_stay_small() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("same.jsonl");
    let mut text = fs::read_to_string(data()).unwrap();
    text.push_str(&format!("{}\n", serde_json::json!({"prompt": "Say hi.", "chosen": " Hi.", "rejected": " Hi."})));
    fs::write(&file, &text).unwrap();
    let lines = text.lines().count();
    let out = train(&short_run(dir.path(), "same", &model(), &file, &[]));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let kept = format!(
        "{} pairs kept of {lines} rows; dropped 0 bad, 0 prompt too long, 0 empty completion, 1 chosen identical to rejected",
        lines - 1
    );
    assert!(err.contains(&kept), "{err}");

    // One 20 MB row, of which 64 tokens are kept.
    let huge = dir.path().join("huge.jsonl");
    let words = "the sea is wide and the wind is free ".repeat(20 << 20 >> 5);
    let row = serde_json::json!({"prompt": "Q:", "chosen": words, "rejected": " no"});
    fs::write(&huge, format!("{row}\n{}", fs::read_to_string(data()).unwrap())).unwrap();
    let mut cmd = dpo_train();
    cmd.args(["eval", "--model", s(&model()), "--data", s(&huge), "--max-length", "64"]);
    let (out, peak) = finish_measuring_memory(cmd, Duration::from_secs(300));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(peak < 2 << 30, "a 20 MB row took {} MB of memory", peak >> 20);
}

/// A big file streams: 100k rows carrying a 2 kB column nobody reads (as hub datasets carry
/// `messages` copies and scores) cost the tokenised pairs and one chunk, not the 200 MB of text.
#[test]
fn a_big_file_streams_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let peak_of = |file: &Path, name: &str| {
        let mut cmd = dpo_train();
        cmd.arg("train").args(short_run(dir.path(), name, &model(), file, &["--max-length", "16"]));
        let (out, peak) = finish_measuring_memory(cmd, Duration::from_secs(600));
        assert!(out.status.success(), "{}", stderr(&out));
        (peak, stderr(&out))
    };
    let (small_peak, _) = peak_of(&data(), "small");
    let big = dir.path().join("big.jsonl");
    let extra = "x".repeat(2000);
    let mut text = String::with_capacity(100_000 * 2100);
    for i in 0..100_000 {
        let row = serde_json::json!({"prompt": format!("Q{i}"), "chosen": " a", "rejected": " b", "extra": extra});
        text += &format!("{row}\n");
    }
    fs::write(&big, &text).unwrap();
    let (big_peak, err) = peak_of(&big, "big");
    assert!(err.contains("100000 pairs kept of 100000 rows"), "{err}");
    let grown = big_peak.saturating_sub(small_peak);
    eprintln!("peak resident: {} MB for 17 rows, {} MB for 100,000", small_peak >> 20, big_peak >> 20);
    // Measured here: 28 MB more; reading the file whole took 527 MB more.
    assert!(
        grown < (text.len() as u64) / 2,
        "{} MB of data took {} MB more than 17 rows",
        text.len() >> 20,
        grown >> 20
    );
}

/// Runs to the end (bounded as [`finish`]) and returns the output and the process's peak
/// resident memory in bytes (its VmHWM).
#[allow(clippy::zombie_processes)] // reaped by `waitpid`, which clippy does not see
fn finish_measuring_memory(mut cmd: Command, limit: Duration) -> (Output, u64) {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("dpo-train starts");
    let pid = child.id() as i32;
    let mut stderr_pipe = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr_pipe, &mut text);
        text
    });
    let deadline = Instant::now() + limit;
    // The child's own high-water mark (VmHWM), read while it lives: wait4's ru_maxrss would also
    // count this test process's, which a child spawned from it carries over at exec (Linux
    // records the old address space's high-water mark), and this binary holds the in-process demo.
    let hwm = || {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().strip_suffix("kB"));
        kib.and_then(|k| k.trim().parse::<u64>().ok()).unwrap_or(0) * 1024
    };
    let (mut status, mut peak) = (0, 0);
    loop {
        peak = peak.max(hwm());
        // SAFETY: waitpid on our own child, writing into a local.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let stderr = reader.join().unwrap_or_default();
    let status = std::os::unix::process::ExitStatusExt::from_raw(status);
    (Output { status, stdout: Vec::new(), stderr }, peak)
}

/// `generate` prints each prompt's completions as they are made, one process or several, so a
/// Ctrl-C keeps every prompt printed whole (it printed nothing before the last prompt was done).
#[test]
fn generate_prints_as_it_goes_and_a_ctrl_c_keeps_it() {
    use std::io::{BufRead, BufReader, Read};
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.txt");
    const PROMPTS: usize = 300;
    fs::write(&prompts, (0..PROMPTS).map(|i| format!("prompt {i}\n")).collect::<String>()).unwrap();
    for workers in [&[][..], &["--devices", "cpu:2"]] {
        let mut cmd = dpo_train();
        cmd.args(["generate", "--model", s(&model()), "--prompts", s(&prompts), "--json"])
            .args(["--num-samples", "4", "--max-new-tokens", "200"])
            .args(workers)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A Ctrl-C's default action in the child, whatever this process's is at the moment of the
        // spawn: `generate` alone installs no handler, so an ignored SIGINT is inherited through
        // exec, and under `make test` another thread of this process sometimes had it ignored
        // (the run then printed every prompt and exited 0).
        // SAFETY: `signal` is async-signal-safe, as a `pre_exec` hook must be.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let row: serde_json::Value = serde_json::from_str(&first).unwrap_or_else(|e| panic!("{e}: {first}"));
        assert_eq!((row["prompt"].as_str(), row["completions"].as_array().map(Vec::len)), (Some("prompt 0"), Some(4)));
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        let out = wait_or_kill(child, Duration::from_secs(60));
        assert!(!out.status.success(), "{workers:?}: a Ctrl-C before the last prompt");
        // A launcher says what its workers do: `generate` has no checkpoint to save.
        let err = stderr(&out);
        assert!(!err.contains("checkpoint"), "{workers:?}: {err}");
        if !workers.is_empty() {
            assert!(err.contains("interrupt: asking the workers to stop (Ctrl-C again to abort)"), "{err}");
        }
        let lines: Vec<&str> = first.lines().chain(rest.lines()).collect();
        assert!(rest.is_empty() || rest.ends_with('\n'), "{workers:?}: a prompt cut in the middle");
        assert!(lines.len() < PROMPTS, "{workers:?}: finished before the Ctrl-C");
        for (i, line) in lines.iter().enumerate() {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(row["prompt"], format!("prompt {i}"), "{workers:?}: in prompt order");
        }
    }
}
