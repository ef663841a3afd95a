//! The planner: which GPUs to use, the batch split, learning-rate factors, the memory estimate,
//! the environment and the exact `dpo-train` command, from a [`Snapshot`] and a [`PlanRequest`].
//!
//! Learning-rate scaling: linear (Goyal et al. 2017, "Accurate, Large Minibatch SGD") and square
//! root for Adam (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
//! Algorithms"), relative to the batch the learning rate was tuned at. The RTX 40xx NCCL
//! workaround follows `accelerate` (`NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1` below driver 550.40.07).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::memory::{self, Dtype, FineTune, MemoryEstimate, MemoryRequest, Reference};
use crate::model::ModelShape;
use crate::render::bytes;
use crate::snapshot::{Gpu, P2p, Snapshot};
use crate::topology::{self, Topology};

/// Version of the plan JSON layout.
pub const PLAN_SCHEMA_VERSION: u32 = 1;
/// Memory used by other processes above which a GPU counts as busy when NVML lists no processes.
pub const BUSY_BYTES: u64 = 1024 * 1024 * 1024;
/// Micro-batch cap when no model is given (TRL's default `per_device_train_batch_size`).
pub const DEFAULT_MICRO_BATCH_CAP: u64 = 8;
/// The projections the LoRA memory estimate counts (see [`crate::memory`]).
const LORA_TARGETS: &str = "q_proj,k_proj,v_proj,o_proj";

/// LoRA rank suggested when full fine-tuning does not fit.
pub const SUGGESTED_LORA_RANK: u64 = 16;

/// How `CUDA_VISIBLE_DEVICES` names the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceIds {
    /// PCI-bus-ordered indices (`0,1`).
    Index,
    /// `GPU-...` UUIDs, stable across reboots and renumbering.
    Uuid,
}

/// The config file the printed `dpo-train` command names: the user writes it (their data, and
/// any key they change from TRL's defaults).
pub const CONFIG_PLACEHOLDER: &str = "YOUR_CONFIG.toml";

/// The training run to plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRequest {
    /// `None`: no memory check, micro-batch capped at [`DEFAULT_MICRO_BATCH_CAP`].
    pub model: Option<ModelShape>,
    /// The model directory given with `--model`: the command trains it.
    pub model_dir: Option<std::path::PathBuf>,
    /// Preference pairs per optimizer step, over all GPUs.
    pub global_batch: u64,
    /// `--max-length`.
    pub seq_len: u64,
    /// `None`: bf16 when every chosen GPU has compute capability 8.0+, else fp16.
    pub dtype: Option<Dtype>,
    pub finetune: FineTune,
    pub reference: Reference,
    pub gradient_checkpointing: bool,
    /// Use at most this many GPUs.
    pub max_world_size: Option<usize>,
    /// Global batch the learning rate was tuned at (the DPO paper uses 64).
    pub lr_base_batch: u64,
    pub device_ids: DeviceIds,
}

impl Default for PlanRequest {
    fn default() -> Self {
        PlanRequest {
            model: None,
            model_dir: None,
            global_batch: 64,
            seq_len: 1024,
            dtype: None,
            finetune: FineTune::Full,
            reference: Reference::Keep,
            gradient_checkpointing: false,
            max_world_size: None,
            lr_base_batch: 64,
            device_ids: DeviceIds::Index,
        }
    }
}

/// Overall verdict; maps to the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Exit 0.
    Ready,
    /// Exit 1.
    ReadyWithWarnings,
    /// Exit 2.
    NotReady,
}

impl Status {
    /// 0 ready, 1 ready with warnings, 2 not ready.
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Ready => 0,
            Status::ReadyWithWarnings => 1,
            Status::NotReady => 2,
        }
    }
}

/// A GPU left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Excluded {
    pub index: u32,
    pub reason: String,
}

/// Learning-rate multipliers for the effective global batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrScale {
    /// The batch the base learning rate was tuned at.
    pub base_batch: u64,
    /// `global / base`.
    pub linear: f64,
    /// `sqrt(global / base)`.
    pub sqrt: f64,
}

/// A setting that changes the memory need, evaluated when nothing fits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alternative {
    pub description: String,
    /// Extra `dpo-train` flags.
    pub flags: String,
    /// The `check-gpu` flags that plan with this setting.
    pub check_gpu_flags: String,
    pub memory_per_gpu_bytes: u64,
    pub fits: bool,
}

/// The plan. `--json` prints it (plus the snapshot) as one object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub schema_version: u32,
    pub status: Status,
    pub world_size: usize,
    /// Selected GPU indices.
    pub gpus: Vec<u32>,
    pub excluded: Vec<Excluded>,
    /// Pairs per GPU per forward.
    pub micro_batch: u64,
    pub grad_accum: u64,
    /// Effective global batch: `micro_batch * world_size * grad_accum`.
    pub global_batch: u64,
    pub requested_global_batch: u64,
    pub lr_scale: LrScale,
    pub dtype: Dtype,
    pub finetune: FineTune,
    pub reference: Reference,
    pub gradient_checkpointing: bool,
    pub seq_len: u64,
    /// Estimated peak per GPU; `None` without a model.
    pub memory_per_gpu_bytes: Option<u64>,
    pub memory: Option<MemoryEstimate>,
    /// Smallest free memory among the chosen GPUs.
    pub min_free_bytes: Option<u64>,
    pub model: Option<ModelShape>,
    pub topology: Topology,
    pub env: BTreeMap<String, String>,
    /// The `dpo-train` command to run with `env` exported.
    pub command: String,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
    /// Filled when nothing fits: what would.
    pub alternatives: Vec<Alternative>,
}

impl Plan {
    /// The plan for a machine without usable NVIDIA GPUs: train on CPU cores.
    pub fn cpu_fallback(req: &PlanRequest, cpus: u32, reason: String) -> Plan {
        let lr = lr_scale(req.global_batch, req.lr_base_batch);
        Plan {
            schema_version: PLAN_SCHEMA_VERSION,
            status: Status::NotReady,
            world_size: 0,
            gpus: Vec::new(),
            excluded: Vec::new(),
            micro_batch: 0,
            grad_accum: 0,
            global_batch: req.global_batch,
            requested_global_batch: req.global_batch,
            lr_scale: lr,
            dtype: req.dtype.unwrap_or(Dtype::Fp32),
            finetune: req.finetune,
            reference: req.reference,
            gradient_checkpointing: req.gradient_checkpointing,
            seq_len: req.seq_len,
            memory_per_gpu_bytes: None,
            memory: None,
            min_free_bytes: None,
            model: req.model.clone(),
            topology: Topology { nvlink_islands: Vec::new(), numa_groups: Vec::new() },
            env: BTreeMap::new(),
            command: format!("{} --devices cpu:{}", command_head(req), cpus.max(1)),
            warnings: vec![reason],
            notes: Vec::new(),
            alternatives: Vec::new(),
        }
    }
}

fn lr_scale(global: u64, base: u64) -> LrScale {
    let ratio = global as f64 / base.max(1) as f64;
    LrScale { base_batch: base, linear: ratio, sqrt: ratio.sqrt() }
}

/// Why a GPU should not train, from its own state (not memory or model mix).
fn health_reasons(g: &Gpu) -> Vec<String> {
    let mut reasons = Vec::new();
    if g.mig_enabled == Some(true) {
        reasons.push(format!("MIG mode is enabled (a MIG slice is not a whole GPU for NCCL data parallelism; disable with `nvidia-smi -i {} -mig 0`)", g.index));
    }
    match &g.processes {
        Some(procs) if !procs.is_empty() => {
            let held: u64 = procs.iter().filter_map(|p| p.used_memory_bytes).sum();
            let pids: Vec<String> = procs.iter().map(|p| p.pid.to_string()).collect();
            reasons.push(format!(
                "busy: {} other process(es) hold {} (pid {})",
                procs.len(),
                bytes(held),
                pids.join(", ")
            ));
        }
        Some(_) => {}
        None => {
            if let Some(used) = g.memory_used_bytes
                && used > BUSY_BYTES
            {
                reasons.push(format!("busy: {} of memory already in use", bytes(used)));
            }
        }
    }
    if let Some(n) = g.ecc_uncorrected_volatile
        && n > 0
    {
        reasons.push(format!("{n} uncorrectable ECC error(s) since the driver loaded"));
    }
    if g.pending_page_retirement == Some(true) {
        reasons.push("memory pages pending retirement (reset the GPU or reboot)".to_string());
    }
    if g.pcie.is_degraded() {
        let (c, m) = (g.pcie.width_current.unwrap_or(0), g.pcie.width_max.unwrap_or(0));
        reasons.push(format!("degraded PCIe link: x{c} of x{m} (reseat the card or check the riser)"));
    }
    let hw = g.hardware_throttles();
    if !hw.is_empty() {
        reasons.push(format!("throttled by hardware ({}): check cooling and power", hw.join(", ")));
    }
    reasons
}

/// Keeps the most common GPU model; returns the others with reasons.
fn split_by_model(snap: &Snapshot, candidates: &[u32]) -> (Vec<u32>, Vec<Excluded>) {
    let mut groups: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for &i in candidates {
        let name = snap.gpu(i).and_then(|g| g.name.clone()).unwrap_or_default();
        groups.entry(name).or_default().push(i);
    }
    if groups.len() <= 1 {
        return (candidates.to_vec(), Vec::new());
    }
    let total = |g: &[u32]| g.iter().filter_map(|&i| snap.gpu(i)?.memory_total_bytes).sum::<u64>();
    let Some((keep_name, keep)) = groups
        .iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(total(a.1).cmp(&total(b.1))).then(b.1[0].cmp(&a.1[0])))
        .map(|(n, g)| (n.clone(), g.clone()))
    else {
        return (candidates.to_vec(), Vec::new());
    };
    let mut excluded = Vec::new();
    for (name, gpus) in &groups {
        if *name == keep_name {
            continue;
        }
        for &i in gpus {
            let shown = if name.is_empty() { "unknown" } else { name };
            excluded.push(Excluded {
                index: i,
                reason: format!(
                    "different model ({shown}) from the other {} GPU(s) ({keep_name}); data parallelism runs at the pace of the slowest GPU",
                    keep.len()
                ),
            });
        }
    }
    (keep, excluded)
}

/// Picks `w` GPUs of `candidates`: inside one NVLink island if one is large enough, else inside
/// one NUMA node, else greedily by the best weakest link.
fn choose_subset(snap: &Snapshot, candidates: &[u32], w: usize, notes: &mut Vec<String>) -> Vec<u32> {
    if w >= candidates.len() {
        return candidates.to_vec();
    }
    for island in topology::nvlink_islands(snap, candidates) {
        if island.len() >= w {
            notes.push(format!("kept to one NVLink island: GPUs {}", list(&island)));
            return island[..w].to_vec();
        }
    }
    for group in topology::numa_groups(snap, candidates) {
        if let Some(node) = group.node
            && group.gpus.len() >= w
        {
            notes.push(format!("kept to NUMA node {node}: GPUs {}", list(&group.gpus)));
            return group.gpus[..w].to_vec();
        }
    }
    let mut best: Option<(u32, Vec<u32>)> = None;
    for &start in candidates {
        let mut chosen = vec![start];
        while chosen.len() < w {
            let next = candidates.iter().filter(|c| !chosen.contains(c)).max_by_key(|&&c| {
                (chosen.iter().map(|&x| snap.link(x, c).rank()).min().unwrap_or(0), std::cmp::Reverse(c))
            });
            match next {
                Some(&c) => chosen.push(c),
                None => break,
            }
        }
        chosen.sort_unstable();
        let score = topology::weakest_link(snap, &chosen).rank();
        if best.as_ref().is_none_or(|(s, _)| score > *s) {
            best = Some((score, chosen));
        }
    }
    best.map_or_else(|| candidates[..w].to_vec(), |(_, c)| c)
}

/// `0,1,2`.
pub fn list(gpus: &[u32]) -> String {
    gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Parses `550.40.07` into comparable numbers.
fn driver_tuple(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.trim().parse().unwrap_or(0)).collect()
}

/// `dpo-train train --config YOUR_CONFIG.toml`, and the model when `--model` named one.
fn command_head(req: &PlanRequest) -> String {
    let mut head = format!("dpo-train train --config {CONFIG_PLACEHOLDER}");
    if let Some(dir) = &req.model_dir {
        head.push_str(&format!(" --model-name-or-path {}", shell_word(&dir.display().to_string())));
    }
    head
}

/// `text` as one shell word: quoted when it holds anything but plain path characters.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@%,=".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// Plans a run. Never fails: problems become exclusions, warnings or `Status::NotReady`.
pub fn plan(snap: &Snapshot, req: &PlanRequest) -> Plan {
    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    let mut excluded = Vec::new();
    let topo = topology::analyze(snap);
    let global = req.global_batch.max(1);

    if snap.gpus.is_empty() {
        let cpus = snap.system.cpu_count.unwrap_or(1);
        let mut p = Plan::cpu_fallback(req, cpus, "no NVIDIA GPU found".to_string());
        p.topology = topo;
        return p;
    }

    // 1. Health.
    let mut healthy = Vec::new();
    for g in &snap.gpus {
        let reasons = health_reasons(g);
        if reasons.is_empty() {
            healthy.push(g.index);
        } else {
            excluded.push(Excluded { index: g.index, reason: reasons.join("; ") });
        }
        let soft: Vec<&String> = g
            .throttle_reasons
            .iter()
            .flatten()
            .filter(|r| r.as_str() == "sw_thermal_slowdown" || r.as_str() == "sw_power_cap")
            .collect();
        if !soft.is_empty() && g.utilization_gpu_pct.unwrap_or(0) > 0 {
            notes.push(format!(
                "{} is throttled by software ({})",
                g.label(),
                soft.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
    }

    // 2. One GPU model.
    let (mut candidates, mixed) = split_by_model(snap, &healthy);
    excluded.extend(mixed);

    // 3. Precision.
    let min_cc = candidates.iter().filter_map(|&i| snap.gpu(i)?.compute_capability_pair()).min();
    let dtype = match req.dtype {
        Some(d) => {
            if d == Dtype::Bf16
                && let Some((maj, min)) = min_cc
                && maj < 8
            {
                warnings.push(format!(
                    "bf16 needs compute capability 8.0 or newer and the chosen GPUs have {maj}.{min}: use --dtype fp16"
                ));
            }
            d
        }
        None => match min_cc {
            Some((maj, _)) if maj < 8 => {
                notes.push("fp16 chosen: these GPUs have no bf16 (compute capability below 8.0)".to_string());
                Dtype::Fp16
            }
            _ => Dtype::Bf16,
        },
    };

    // 4. Memory at micro-batch 1.
    let mem_req = |micro: u64, finetune: FineTune, reference: Reference, ckpt: bool| {
        req.model.as_ref().map(|m| {
            memory::estimate(&MemoryRequest {
                model: m,
                micro_batch: micro,
                seq_len: req.seq_len,
                dtype,
                finetune,
                reference,
                gradient_checkpointing: ckpt,
            })
        })
    };
    let need1 = mem_req(1, req.finetune, req.reference, req.gradient_checkpointing);
    let mut alternatives = Vec::new();
    let before_memory = candidates.clone();
    let mut nothing_fits = false;
    if let Some(need) = need1 {
        let mut fit = Vec::new();
        for &i in &candidates {
            match snap.gpu(i).and_then(|g| g.memory_free_bytes) {
                Some(free) if free < need.total => excluded.push(Excluded {
                    index: i,
                    reason: format!(
                        "too little free memory: needs {} at micro-batch 1, has {} free",
                        bytes(need.total),
                        bytes(free)
                    ),
                }),
                Some(_) => fit.push(i),
                None => {
                    notes.push(format!("GPU {i}: free memory unknown, not checked against the estimate"));
                    fit.push(i);
                }
            }
        }
        if fit.is_empty() && !candidates.is_empty() {
            nothing_fits = true;
            let best_free = before_memory.iter().filter_map(|&i| snap.gpu(i)?.memory_free_bytes).max().unwrap_or(0);
            warnings.push(format!(
                "nothing fits: even micro-batch 1 with gradient accumulation needs {} per GPU and the largest free memory is {}",
                bytes(need.total),
                bytes(best_free)
            ));
            let lora = FineTune::Lora { rank: SUGGESTED_LORA_RANK };
            let lora_flags = format!("--lora-r {SUGGESTED_LORA_RANK} --lora-target-modules {LORA_TARGETS}");
            // (description, dpo-train flags, check-gpu flags, settings), least intrusive first.
            let ckpt = ("--gradient-checkpointing", "--gradient-checkpointing");
            let pre = ("--precompute-ref-log-probs", "--reference precompute");
            let lora_cg = format!("--lora {SUGGESTED_LORA_RANK}");
            let mut options: Vec<(String, String, String, FineTune, Reference, bool)> = Vec::new();
            if !req.gradient_checkpointing {
                options.push((
                    "activation checkpointing".into(),
                    ckpt.0.into(),
                    ckpt.1.into(),
                    req.finetune,
                    req.reference,
                    true,
                ));
            }
            if req.reference == Reference::Keep && req.finetune == FineTune::Full {
                options.push((
                    "precomputed reference log-probs".into(),
                    pre.0.into(),
                    pre.1.into(),
                    req.finetune,
                    Reference::Precompute,
                    req.gradient_checkpointing,
                ));
                options.push((
                    "precomputed reference + activation checkpointing".into(),
                    format!("{} {}", pre.0, ckpt.0),
                    format!("{} {}", pre.1, ckpt.1),
                    req.finetune,
                    Reference::Precompute,
                    true,
                ));
            }
            if req.finetune == FineTune::Full {
                options.push((
                    format!("LoRA rank {SUGGESTED_LORA_RANK}"),
                    lora_flags.clone(),
                    lora_cg.clone(),
                    lora,
                    req.reference,
                    req.gradient_checkpointing,
                ));
                options.push((
                    format!("LoRA rank {SUGGESTED_LORA_RANK} + activation checkpointing"),
                    format!("{lora_flags} {}", ckpt.0),
                    format!("{lora_cg} {}", ckpt.1),
                    lora,
                    req.reference,
                    true,
                ));
            }
            for (description, flags, check_gpu_flags, ft, r, ck) in options {
                if let Some(e) = mem_req(1, ft, r, ck) {
                    alternatives.push(Alternative {
                        description,
                        flags,
                        check_gpu_flags,
                        memory_per_gpu_bytes: e.total,
                        fits: e.total <= best_free,
                    });
                }
            }
            match alternatives.iter().find(|a| a.fits) {
                Some(a) => notes.push(format!("plan again with `{}` added to the check-gpu flags ({})", a.check_gpu_flags, a.description)),
                None => notes.push("none of LoRA, a precomputed reference or activation checkpointing fits: use GPUs with more memory or a smaller model".to_string()),
            }
        }
        candidates = fit;
    }

    // 5. World size and which GPUs.
    let n = candidates.len();
    let mut w = n.min(usize::try_from(global).unwrap_or(usize::MAX));
    if let Some(max) = req.max_world_size {
        w = w.min(max.max(1));
    }
    if w < n && w as u64 == global {
        notes.push(format!(
            "the global batch of {global} is smaller than the {n} usable GPUs: world size {w}, one pair per GPU"
        ));
    }
    let chosen = if w == 0 { Vec::new() } else { choose_subset(snap, &candidates, w, &mut notes) };
    for e in &excluded {
        // When nothing fits, the one "nothing fits" warning stands for the memory exclusions.
        if !(nothing_fits && e.reason.starts_with("too little free memory")) {
            warnings.push(format!("GPU {} excluded: {}", e.index, e.reason));
        }
    }

    if chosen.is_empty() {
        if !nothing_fits {
            warnings.push("no usable GPU: every GPU was excluded".to_string());
        }
        let mut p = Plan::cpu_fallback(req, snap.system.cpu_count.unwrap_or(1), String::new());
        p.warnings = warnings;
        p.notes = notes;
        p.excluded = excluded;
        p.alternatives = alternatives;
        p.dtype = dtype;
        p.topology = topo;
        p.memory = need1;
        p.memory_per_gpu_bytes = need1.map(|m| m.total);
        p.command = String::new();
        return p;
    }

    // 6. Batch split.
    let wu = w as u64;
    let per_rank = if global.is_multiple_of(wu) { global / wu } else { (global.saturating_add(wu / 2) / wu).max(1) };
    let effective = per_rank * wu;
    if effective != global {
        let exact = (1..=wu).rev().find(|&d| global.is_multiple_of(d)).unwrap_or(1);
        warnings.push(format!(
            "global batch {global} cannot be split exactly over {w} GPUs: it rounds to {effective} ({per_rank} per GPU); for exactly {global} use --world-size {exact}"
        ));
    }
    let min_free = chosen.iter().filter_map(|&i| snap.gpu(i)?.memory_free_bytes).min();
    let mut micro = 1;
    let mut estimate = mem_req(1, req.finetune, req.reference, req.gradient_checkpointing);
    let mut m = 1;
    while m <= per_rank {
        if per_rank.is_multiple_of(m) {
            match (mem_req(m, req.finetune, req.reference, req.gradient_checkpointing), min_free) {
                (Some(e), Some(free)) if e.total <= free => {
                    micro = m;
                    estimate = Some(e);
                }
                (Some(e), None) if m <= DEFAULT_MICRO_BATCH_CAP => {
                    micro = m;
                    estimate = Some(e);
                }
                (None, _) if m <= DEFAULT_MICRO_BATCH_CAP => micro = m,
                _ => {}
            }
        }
        m *= 2;
    }
    if req.model.is_none() {
        notes.push(format!(
            "no model given (--model-params or --model): micro-batch not checked against memory, capped at {DEFAULT_MICRO_BATCH_CAP}"
        ));
    } else if min_free.is_none() {
        notes.push(format!("free memory unknown: micro-batch capped at {DEFAULT_MICRO_BATCH_CAP}"));
    }
    let accum = per_rank / micro;

    // 7. Environment.
    let mut env = BTreeMap::new();
    env.insert("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string());
    let uuids: Option<Vec<String>> = chosen.iter().map(|&i| snap.gpu(i)?.uuid.clone()).collect();
    let visible = match (req.device_ids, uuids) {
        (DeviceIds::Uuid, Some(u)) => u.join(","),
        (DeviceIds::Uuid, None) => {
            notes.push("UUIDs unknown for some GPUs: CUDA_VISIBLE_DEVICES uses indices".to_string());
            list(&chosen)
        }
        (DeviceIds::Index, _) => list(&chosen),
    };
    env.insert("CUDA_VISIBLE_DEVICES".to_string(), visible);
    match snap.system.cpu_count {
        Some(cpus) => {
            env.insert("OMP_NUM_THREADS".to_string(), (cpus / w as u32).max(1).to_string());
        }
        None => notes.push("CPU count unknown: OMP_NUM_THREADS not set".to_string()),
    }
    if w > 1 {
        let mut no_p2p = Vec::new();
        for (k, &a) in chosen.iter().enumerate() {
            for &b in &chosen[k + 1..] {
                if let Some(s) = snap.pair(a, b).and_then(|p| p.p2p_read)
                    && s != P2p::Ok
                {
                    no_p2p.push(format!("{a}-{b} ({s:?})"));
                }
            }
        }
        let rtx40_old_driver =
            chosen.iter().any(|&i| snap.gpu(i).and_then(|g| g.name.as_deref()).is_some_and(|n| n.contains("RTX 40")))
                && snap.system.driver_version.as_deref().is_some_and(|v| driver_tuple(v) < vec![550, 40, 7]);
        if rtx40_old_driver {
            env.insert("NCCL_P2P_DISABLE".to_string(), "1".to_string());
            env.insert("NCCL_IB_DISABLE".to_string(), "1".to_string());
            warnings.push(format!(
                "GeForce RTX 40xx with driver {} (below 550.40.07): NCCL peer-to-peer can hang; NCCL_P2P_DISABLE=1 and NCCL_IB_DISABLE=1 set (as accelerate does), or upgrade the driver",
                snap.system.driver_version.as_deref().unwrap_or("?")
            ));
        } else if !no_p2p.is_empty() {
            env.insert("NCCL_P2P_DISABLE".to_string(), "1".to_string());
            warnings.push(format!(
                "P2P not available between GPUs {}: NCCL_P2P_DISABLE=1 set (traffic goes through host memory)",
                no_p2p.join(", ")
            ));
        }
        let weakest = topology::weakest_link(snap, &chosen);
        let nodes: Vec<u32> = topology::numa_groups(snap, &chosen).iter().filter_map(|g| g.node).collect();
        if nodes.len() > 1 && !matches!(weakest, crate::snapshot::Link::NvLink(_)) {
            notes.push(format!(
                "the chosen GPUs span NUMA nodes {}: the all-reduce crosses the CPU interconnect (weakest link {weakest})",
                list(&nodes)
            ));
        }
    }
    if snap.source == crate::snapshot::Source::Live {
        match &snap.system.nccl {
            Some(n) if n.version.is_some() => {}
            Some(n) if w > 1 => warnings.push(format!(
                "NCCL not found ({}): install torch into the venv or set NCCL_HOME",
                n.error.as_deref().unwrap_or("not found")
            )),
            _ => {}
        }
    }

    // 8. Command: every setting the plan assumed, spelled out (dpo-train's own defaults are
    // TRL's: bf16 and gradient checkpointing on).
    let mut cmd = format!(
        "{} --gpus {w} --per-device-train-batch-size {micro} --gradient-accumulation-steps {accum} --global-batch-size {effective} --max-length {}",
        command_head(req),
        req.seq_len
    );
    cmd.push_str(match dtype {
        Dtype::Bf16 => " --bf16",
        Dtype::Fp16 => " --fp16",
        Dtype::Fp32 => " --bf16 false",
    });
    if let FineTune::Lora { rank } = req.finetune {
        // The adapters the estimate counts (dpo-train's own default is q_proj,v_proj, as PEFT's).
        cmd.push_str(&format!(" --lora-r {rank} --lora-target-modules {LORA_TARGETS}"));
    }
    if req.reference == Reference::Precompute {
        cmd.push_str(" --precompute-ref-log-probs");
    }
    cmd.push_str(if req.gradient_checkpointing {
        " --gradient-checkpointing"
    } else {
        " --gradient-checkpointing false"
    });

    let status = if warnings.is_empty() { Status::Ready } else { Status::ReadyWithWarnings };
    Plan {
        schema_version: PLAN_SCHEMA_VERSION,
        status,
        world_size: w,
        gpus: chosen,
        excluded,
        micro_batch: micro,
        grad_accum: accum,
        global_batch: effective,
        requested_global_batch: global,
        lr_scale: lr_scale(effective, req.lr_base_batch),
        dtype,
        finetune: req.finetune,
        reference: req.reference,
        gradient_checkpointing: req.gradient_checkpointing,
        seq_len: req.seq_len,
        memory_per_gpu_bytes: estimate.map(|e| e.total),
        memory: estimate,
        min_free_bytes: min_free,
        model: req.model.clone(),
        topology: topo,
        env,
        command: cmd,
        warnings,
        notes,
        alternatives,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Link, Pair, Process, Source};

    const GIB: u64 = 1024 * 1024 * 1024;

    fn gpu(index: u32, name: &str, free_gib: u64) -> Gpu {
        Gpu {
            index,
            name: Some(name.to_string()),
            uuid: Some(format!("GPU-{index}")),
            memory_total_bytes: Some(80 * GIB),
            memory_used_bytes: Some(0),
            memory_free_bytes: Some(free_gib * GIB),
            compute_capability: Some("8.0".to_string()),
            ..Gpu::default()
        }
    }

    fn machine(gpus: Vec<Gpu>, link: impl Fn(u32, u32) -> Link) -> Snapshot {
        let mut s = Snapshot::new(Source::NvidiaSmi);
        let n = gpus.len() as u32;
        s.gpus = gpus;
        s.system.cpu_count = Some(64);
        for a in 0..n {
            for b in a + 1..n {
                s.pairs.push(Pair {
                    a,
                    b,
                    link: link(a, b),
                    nvlinks: None,
                    p2p_read: None,
                    p2p_write: None,
                    p2p_nvlink: None,
                });
            }
        }
        s
    }

    #[test]
    fn health_reasons_cover_each_fault() {
        let mut g = gpu(0, "A", 80);
        assert!(health_reasons(&g).is_empty());
        g.mig_enabled = Some(true);
        g.processes = Some(vec![Process { pid: 7, used_memory_bytes: Some(2 * GIB) }]);
        g.ecc_uncorrected_volatile = Some(1);
        g.pending_page_retirement = Some(true);
        g.pcie.width_current = Some(4);
        g.pcie.width_max = Some(16);
        g.throttle_reasons = Some(vec!["gpu_idle".into(), "hw_power_brake_slowdown".into()]);
        let r = health_reasons(&g);
        assert_eq!(r.len(), 6, "{r:?}");
        assert_eq!(r[1], "busy: 1 other process(es) hold 2.0 GiB (pid 7)");
        assert_eq!(r[5], "throttled by hardware (hw_power_brake_slowdown): check cooling and power");
        // Without a process list, memory in use marks the GPU busy.
        let mut h = gpu(1, "A", 80);
        h.memory_used_bytes = Some(3 * GIB);
        assert_eq!(health_reasons(&h), vec!["busy: 3.0 GiB of memory already in use".to_string()]);
    }

    #[test]
    fn majority_model_wins_ties_by_memory() {
        let mut small = gpu(0, "Small", 10);
        small.memory_total_bytes = Some(16 * GIB);
        let s = machine(vec![small, gpu(1, "Big", 70)], |_, _| Link::Phb);
        let (keep, ex) = split_by_model(&s, &[0, 1]);
        assert_eq!(keep, vec![1]);
        assert_eq!(ex[0].index, 0);
    }

    #[test]
    fn subset_prefers_best_links_without_islands_or_numa() {
        // 0-1 PIX, 2-3 PIX, everything else SYS, no NUMA information.
        let s = machine(
            (0..4).map(|i| gpu(i, "A", 70)).collect(),
            |a, b| {
                if a / 2 == b / 2 { Link::Pix } else { Link::Sys }
            },
        );
        let mut notes = Vec::new();
        assert_eq!(choose_subset(&s, &[0, 1, 2, 3], 2, &mut notes), vec![0, 1]);
        assert_eq!(choose_subset(&s, &[1, 2, 3], 2, &mut notes), vec![2, 3]);
    }

    #[test]
    fn rounding_and_micro_batch() {
        let s = machine((0..6).map(|i| gpu(i, "A", 70)).collect(), |_, _| Link::NvLink(12));
        let req = PlanRequest { model: Some(ModelShape::from_param_count(500_000_000)), ..PlanRequest::default() };
        let p = plan(&s, &req);
        // 64 over 6 rounds to 66 (11 per GPU, odd, so micro-batch 1).
        assert_eq!((p.world_size, p.micro_batch, p.grad_accum, p.global_batch), (6, 1, 11, 66));
        assert_eq!(p.status, Status::ReadyWithWarnings);
        assert!(p.warnings[0].ends_with("for exactly 64 use --world-size 4"), "{}", p.warnings[0]);
        let p = plan(&s, &PlanRequest { max_world_size: Some(4), ..req.clone() });
        assert_eq!((p.world_size, p.global_batch), (4, 64));
        assert!(p.micro_batch >= 2 && p.micro_batch * p.grad_accum == 16);
        assert_eq!(p.status, Status::Ready);
    }

    #[test]
    fn no_model_caps_micro_batch() {
        let s = machine(vec![gpu(0, "A", 70)], |_, _| Link::Phb);
        let p = plan(&s, &PlanRequest { global_batch: 64, ..PlanRequest::default() });
        assert_eq!((p.micro_batch, p.grad_accum), (DEFAULT_MICRO_BATCH_CAP, 8));
        assert!(p.memory.is_none());
        assert!(p.notes.iter().any(|n| n.starts_with("no model given")));
        assert_eq!(p.env["OMP_NUM_THREADS"], "64");
    }

    #[test]
    fn empty_machine_falls_back_to_cpu() {
        let mut s = Snapshot::new(Source::NvidiaSmi);
        s.system.cpu_count = Some(12);
        let p = plan(&s, &PlanRequest::default());
        assert_eq!(p.status, Status::NotReady);
        assert_eq!(p.command, "dpo-train train --config YOUR_CONFIG.toml --devices cpu:12");
        assert_eq!(p.status.exit_code(), 2);
    }

    #[test]
    fn all_gpus_excluded_is_not_ready() {
        let mut g = gpu(0, "A", 70);
        g.mig_enabled = Some(true);
        let p = plan(&machine(vec![g], |_, _| Link::Phb), &PlanRequest::default());
        assert_eq!(p.status, Status::NotReady);
        assert!(p.warnings.iter().any(|w| w == "no usable GPU: every GPU was excluded"));
        assert!(p.command.is_empty());
    }

    #[test]
    fn driver_versions_compare_numerically() {
        assert!(driver_tuple("535.129.03") < driver_tuple("550.40.07"));
        assert!(driver_tuple("550.40.10") > driver_tuple("550.40.07"));
        assert!(driver_tuple("560.28.03") > driver_tuple("550.40.07"));
    }
}
