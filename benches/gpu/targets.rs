//! The `targets` section: issue 33's rows on this GPU, as the issue measured them. The
//! Qwen2.5-0.5B shape at TRL's defaults (bf16, 8 pairs a step, max_length 1024, pairs of 250-1000
//! tokens) with gradient checkpointing (TRL 1.16's default) and without, and TinyLlama-1.1B's
//! trunk (tied embeddings: 1.03B parameters) without; each row dpo-train, TRL as installed and
//! TRL with Liger's kernels (`use_liger_kernel=True`; the bundle brings liger-kernel 0.8.5), with
//! MFU against the bf16 matrix peak measured here; then torch's profiler over the 0.5B row
//! without checkpointing (operator and kernel counts a step, the matrix products' share of kernel
//! time). The `mfu` section (not in a run without names): those rows, dpo-train alone. The
//! `shapes` section (likewise named only): that row with its micro-batches as they come and
//! padded to few shapes. The `checkpointing` section (likewise named only): the
//! checkpointed 0.5B row with settings changed since an earlier, faster run turned back, profiled;
//! `bisect` (named only): that row by earlier builds of dpo-train brought beside this one.
//! The `lora8b` section: Llama-3.1-8B's trunk with LoRA r 16, likewise (its own section: the
//! model alone is 30 GB to write and read). Each row's line names its shape ("0.5B", "1.1B",
//! "8B LoRA") with `MFU N%`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use burn::tensor::FloatDType;

use super::common::{self, LLAMA1B, LLAMA8B, QWEN05B};
use super::profiled;
use super::rows::{Row, compare, cuda_matmul_peak};

/// Pairs a step, steps, max_length: TRL's defaults, with steps enough for a rate past warm-up.
const RUN: (usize, usize, usize) = (8, 24, 1024);

/// dpo-train's flags for the checkpointed 0.5B row in the `checkpointing` and `bisect` sections.
const CHECKPOINTED: [&str; 5] = ["--device", "cuda:0", "--bf16", "--gradient-checkpointing", "true"];

/// The rows, then the 0.5B profile (the profiled run takes 20 steps: steps 11-15 are traced).
pub fn targets(work: &Path, out: &Path, failures: &mut Vec<String>) -> String {
    let (mut text, qwen, data) = rows(work, out, true, failures);
    let _ = write!(text, "\n{}", profiled("qwen05b-bf16", &qwen, &data, out, (RUN.0, 20, RUN.2), &["--bf16"]));
    text
}

/// The `mfu` section (named only): the targets' three rows, dpo-train alone (no TRL, no profile):
/// their MFU in about a minute and a half of a GPU session's 15, to see a change's effect before
/// `targets` measures it beside TRL.
pub fn mfu(work: &Path, out: &Path, failures: &mut Vec<String>) -> String {
    rows(work, out, false, failures).0
}

/// Issue 33's three rows (the 0.5B shape with gradient checkpointing and without, the 1.1B
/// shape), each beside TRL as installed and TRL with Liger's kernels where `with_trl`; the text,
/// and the 0.5B model and the pairs.
fn rows(work: &Path, out: &Path, with_trl: bool, failures: &mut Vec<String>) -> (String, PathBuf, PathBuf) {
    let qwen = common::generated(work, &QWEN05B, "qwen2");
    let llama = common::generated(work, &LLAMA1B, "llama");
    let (data, peak, mut text) = workload(work, &qwen, RUN);
    let row = |name, model, shape, checkpointing| Row {
        name,
        model,
        shape,
        data: &data,
        run: RUN,
        bf16: true,
        padding_free: true,
        checkpointing,
        with_trl,
        liger: with_trl,
        lora: false,
    };
    let rows = [
        row("0.5B, gradient checkpointing", &qwen, &QWEN05B, true),
        row("0.5B", &qwen, &QWEN05B, false),
        row("1.1B", &llama, &LLAMA1B, false),
    ];
    for row in &rows {
        text += &compare(row, peak, out, failures);
    }
    (text, qwen, data)
}

/// The `shapes` section: the 0.5B row without checkpointing twice, its micro-batches uploaded as
/// they come (`DPO_TRAIN_SHAPE_PADDING=0`) and padded to few shapes (CUDA's default,
/// `dpo::shapes`): what cuBLAS's choices for new product shapes cost a step. (The reference on a
/// thread of its own against the training thread measured 43.1 against 43.2 pairs/s on an H200,
/// 2026-11-28.)
pub fn shape_padding(work: &Path, out: &Path) -> String {
    let model = common::generated(work, &QWEN05B, "qwen2");
    let data = pairs(work, &model);
    let (model, data) = (model.as_path(), data.as_path());
    let rate = |pads: &str| {
        let envs = [(dpo_train::dpo::shapes::PADDING_VAR, Path::new(pads))];
        common::dpo_train_rate_env(model, data, out, RUN, &["--device", "cuda:0", "--bf16"], &envs).pairs_per_second
    };
    let (unpadded, padded) = (rate("0"), rate("1"));
    let text = format!(
        "0.5B, micro-batches as they come: {unpadded:.1} pairs/s; padded to few shapes: {padded:.1} pairs/s, {:.2}x\n",
        padded / unpadded
    );
    print!("{text}");
    text
}

/// The `checkpointing` section (a diagnosis, not in a run without names): the 0.5B row with
/// gradient checkpointing, where an H200 measured 35.1 pairs/s at 4789ffe and 14.5 at 4f2c655
/// while the row without it went from 43.4 to 56.6. Its rate as the targets run it, then with
/// each setting that differs from that earlier code turned back (the caching allocator without
/// expandable segments, the reference on the training thread, micro-batches not padded to few
/// shapes), then all three together, then torch's profiler over it.
pub fn checkpointing(work: &Path, out: &Path) -> String {
    let model = common::generated(work, &QWEN05B, "qwen2");
    let data = pairs(work, &model);
    let (model, data) = (model.as_path(), data.as_path());
    let flags = CHECKPOINTED;
    let mut text = String::new();
    // torch's own name for the allocator's settings, as dpo-train reads it.
    let allocator = dpo_torch::allocator::ALLOCATOR_VARS[0];
    let no_expandable = (allocator, Path::new("expandable_segments:False"));
    let no_overlap = (dpo_train::train::step::OVERLAP_VAR, Path::new("0"));
    let no_padding = (dpo_train::dpo::shapes::PADDING_VAR, Path::new("0"));
    // Each setting alone, then all three at once (as 4789ffe ran, in these respects).
    let settings: [(&str, &[(&str, &Path)]); 5] = [
        ("as the targets run it", &[]),
        ("without expandable segments", &[no_expandable]),
        ("the reference on the training thread", &[no_overlap]),
        ("micro-batches not padded to few shapes", &[no_padding]),
        ("all three of those", &[no_expandable, no_overlap, no_padding]),
    ];
    for (name, envs) in settings {
        let rate = common::dpo_train_rate_env(model, data, out, RUN, &flags, envs);
        let line = format!("0.5B, gradient checkpointing, {name}: {:.1} pairs/s\n", rate.pairs_per_second);
        print!("{line}");
        text += &line;
    }
    let run = (RUN.0, 20, RUN.2);
    let _ = write!(text, "\n{}", profiled("qwen05b-bf16-checkpointing", model, data, out, run, &flags[2..]));
    text
}

/// The `bisect` section (named only): the checkpointed 0.5B row, as [`checkpointing`] runs it, by
/// this build and then by each earlier dpo-train `tools/gpu_bisect.sh` packed into `gpu-bisect/`
/// (oldest first): which commits the row's rate changed between, measured on one machine in one
/// call. 12 steps a run (the rate over steps 2-12), half the targets' 24: a regression worth finding
/// is larger than what the shorter window costs in precision, and each build's start (CUDA, the
/// 0.5B model) is paid once a run. Each rate is printed as it is measured, so a call cut short
/// keeps the ones before; a build that fails is said and the next one runs.
pub fn bisect(work: &Path, out: &Path) -> String {
    let model = common::generated(work, &QWEN05B, "qwen2");
    let data = pairs(work, &model);
    let flags = CHECKPOINTED;
    let dir = common::root().join("gpu-bisect");
    let list = std::fs::read_to_string(dir.join("list")).unwrap_or_default();
    let mut builds = vec![(PathBuf::from(env!("CARGO_BIN_EXE_dpo-train")), "this build".to_owned())];
    for line in list.lines().filter(|l| !l.trim().is_empty()) {
        let (commit, subject) = line.split_once(' ').unwrap_or((line, ""));
        let bin = out.join(format!("dpo-train-{commit}"));
        match unpacked(&dir.join(format!("{commit}.xz")), &bin) {
            Ok(()) => builds.push((bin, format!("at {commit} ({})", subject.chars().take(60).collect::<String>()))),
            Err(why) => println!("bisect: {commit}: {why}"),
        }
    }
    let mut text = match list.is_empty() {
        true => "no earlier builds in gpu-bisect/ (tools/gpu_bisect.sh packs them): this build alone\n".to_owned(),
        false => String::new(),
    };
    for (bin, name) in &builds {
        let rate = std::panic::catch_unwind(|| {
            common::dpo_train_rate_of(bin, &model, &data, out, (RUN.0, 12, RUN.2), &flags, &[]).pairs_per_second
        });
        let line = match rate {
            Ok(rate) => format!("0.5B, gradient checkpointing, {name}: {rate:.1} pairs/s\n"),
            Err(_) => format!("0.5B, gradient checkpointing, {name}: failed (the log above says why)\n"),
        };
        print!("{line}");
        text += &line;
    }
    text
}

/// `packed` (xz) decompressed to the executable `bin`.
fn unpacked(packed: &Path, bin: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let file = std::fs::File::create(bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    let status = std::process::Command::new("xz").arg("-dc").arg(packed).stdout(file).status();
    match status {
        Ok(s) if s.success() => {
            std::fs::set_permissions(bin, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
        }
        Ok(s) => Err(format!("xz -dc {} exited {s}", packed.display())),
        Err(e) => Err(format!("xz: {e}")),
    }
}

/// Llama-3.1-8B's trunk with LoRA r 16 on q_proj and v_proj (PEFT's default targets) over a bf16
/// base, the same pairs, fewer steps (a step is about a second): with gradient checkpointing on
/// both sides (TRL's default, with which TRL + PEFT fits an 80 GB GPU), then dpo-train alone
/// without it. TRL + PEFT without checkpointing needs 134 GiB by check-gpu's plan (rows padded to
/// max_length 1024), more than an H100 holds, and its two runs of an 8B model would take minutes
/// of the check's 15 (issue 33, item 6): the 8B row is the one TRL runs by default.
pub fn lora8b(work: &Path, out: &Path, failures: &mut Vec<String>) -> String {
    let model = common::generated(work, &LLAMA8B, "llama");
    let run = (RUN.0, 12, RUN.2);
    let (data, peak, mut text) = workload(work, &model, run);
    let row = |name, checkpointing| Row {
        name,
        model: &model,
        shape: &LLAMA8B,
        data: &data,
        run,
        bf16: true,
        padding_free: true,
        checkpointing,
        with_trl: checkpointing,
        liger: true,
        lora: true,
    };
    text += &compare(&row("8B LoRA, gradient checkpointing", true), peak, out, failures);
    text += &compare(&row("8B LoRA", false), peak, out, failures);
    text
}

/// [`lora8b`]'s model written ahead (its weights drawn on every core and 15 GB written), while
/// the GPU runs what measures no time; the section then finds it there.
pub fn lora8b_model(work: &Path) -> String {
    let model = common::generated(work, &LLAMA8B, "llama");
    let bytes = std::fs::metadata(model.join("model.safetensors")).map_or(0, |m| m.len());
    format!("{}: {:.1} GB of bf16 weights\n", model.display(), bytes as f64 / 1e9)
}

/// The pairs (256 of 250-1000 tokens, prompts 32-200, under the fixture tokenizer every model
/// here carries), the bf16 matrix peak measured here, and the section's first line.
fn workload(work: &Path, model: &Path, (pairs_a_step, _, max_length): (usize, usize, usize)) -> (PathBuf, f64, String) {
    let data = pairs(work, model);
    let peak = cuda_matmul_peak(FloatDType::BF16);
    let text = format!(
        "256 pairs of 250-1000 tokens (prompts 32-200), {pairs_a_step} a step, max_length {max_length}, bf16, the \
         reference every step; matmul peak bf16 {:.1} TFLOP/s\n",
        peak / 1e12
    );
    (data, peak, text)
}

/// The rows' pairs: 256 of 250-1000 tokens, prompts 32-200 (the plan section's too).
pub fn pairs(work: &Path, model: &Path) -> PathBuf {
    common::sized_pairs(&work.join("pairs-32-200-250-1000.jsonl"), model, 256, 32..=200, 250..=1000, 3)
}
