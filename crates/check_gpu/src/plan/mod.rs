//! The planner: which GPUs to use, the batch split, learning-rate factors, the memory estimate,
//! the environment and the exact `dpo-train` command, from a [`Snapshot`] and a [`PlanRequest`],
//! in named steps: health and model ([`select`]), precision, memory ([`fit`]), world size
//! ([`select`]), batch split ([`batch`]), environment ([`env`]), command ([`command`]), and with a
//! measured bench the time per step spent all-reducing gradients ([`comm`]).
//!
//! Learning-rate scaling: linear (Goyal et al. 2017, "Accurate, Large Minibatch SGD") and square
//! root for Adam (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
//! Algorithms"), relative to the batch the learning rate was tuned at. The RTX 40xx NCCL
//! workaround follows `accelerate` (`NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1` below driver 550.40.07).

mod batch;
pub mod comm;
mod command;
mod cpu;
mod env;
mod fit;
mod select;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use dpo_vocab::{Ranks, RunSettings};

use crate::memory::{BatchTokens, DataLengths, FineTune, MemoryEstimate, PairTokens, Precision, Reference, Sharding};
use crate::model::ModelShape;
use crate::snapshot::{Gpu, Snapshot};
use crate::topology::{self, Topology};

pub use cpu::{cpu_plan, cpu_processes};

/// Version of the plan JSON layout.
pub const PLAN_SCHEMA_VERSION: u32 = 1;
/// Memory used by other processes above which a GPU counts as busy when NVML lists no processes.
pub const BUSY_BYTES: u64 = 1024 * 1024 * 1024;
/// Micro-batch cap when no model is given (TRL's default `per_device_train_batch_size`).
pub const DEFAULT_MICRO_BATCH_CAP: u64 = 8;
/// The projections the LoRA memory estimate counts (see [`crate::memory`]).
pub(crate) const LORA_TARGETS: &str = "q_proj,k_proj,v_proj,o_proj";

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

/// What the printed `dpo-train` command holds where the plan was not given the model
/// (`--model`) or the data (`--data`): the user puts theirs there. Every other setting is spelled
/// out, so no config file is needed.
pub const MODEL_PLACEHOLDER: &str = "YOUR_MODEL_DIR";
pub const DATA_PLACEHOLDER: &str = "YOUR_DATA.jsonl";

/// What to put in `command`'s placeholders, if it has any.
pub fn placeholder_note(command: &str) -> Option<String> {
    let missing: Vec<&str> = [(MODEL_PLACEHOLDER, "--model DIR"), (DATA_PLACEHOLDER, "--data FILE")]
        .into_iter()
        .filter(|(placeholder, _)| command.contains(placeholder))
        .map(|(placeholder, _)| placeholder)
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "(put your model directory and preference data in place of {} (check-gpu --model and --data fill them); every key the command does not set takes TRL's DPOConfig default)",
            missing.join(" and ")
        )
    })
}

/// The training run to plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRequest {
    /// `None`: no memory check, micro-batch capped at [`DEFAULT_MICRO_BATCH_CAP`].
    pub model: Option<ModelShape>,
    /// The model directory given with `--model`: the command trains it.
    pub model_dir: Option<std::path::PathBuf>,
    /// The training data given with `--data`: the command trains on it.
    pub data: Option<std::path::PathBuf>,
    /// How dpo-train reads it (`--prompt-column`, ...): the command passes each on.
    pub reading: dpo_vocab::DataReading,
    /// Preference pairs per optimizer step, over all GPUs.
    pub global_batch: u64,
    /// `--max-length`.
    pub seq_len: u64,
    /// `None`: bf16 when every chosen GPU has compute capability 8.0+, else fp16.
    pub dtype: Option<Precision>,
    pub finetune: FineTune,
    pub reference: Reference,
    /// The loss of `--loss-type`, which the command passes on: a reference-free one makes
    /// `reference` [`Reference::None`]; kto needs 2 rows a micro-batch.
    pub loss_type: Option<&'static str>,
    pub gradient_checkpointing: bool,
    /// `None` (`--sharding auto`): the first ZeRO stage that fits when a full replica does not
    /// (LoRA and a precomputed reference included); else that stage.
    pub sharding: Option<Sharding>,
    /// Keep AdamW's state (and the fp32 master weights) in host memory.
    pub offload_optimizer: bool,
    /// Use at most this many GPUs.
    pub max_world_size: Option<usize>,
    /// Global batch the learning rate was tuned at (the DPO paper uses 64).
    pub lr_base_batch: u64,
    pub device_ids: DeviceIds,
    /// Also estimate TRL's `DPOTrainer` (transformers) for the planned run (`--compare trl`).
    pub compare_trl: bool,
    /// The data's longest pairs (`--data`, tokenised by `dpo-train data lengths`); `None`:
    /// sequences of `seq_len` tokens.
    pub lengths: Option<DataLengths>,
    /// Why `--data`'s lengths could not be read.
    pub lengths_error: Option<LengthsError>,
}

/// Why `--data`'s lengths are missing from a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LengthsError {
    /// dpo-train read the data and refused it (its one-line error): training would stop there too.
    Data(String),
    /// dpo-train could not be run to read it.
    NotRun(String),
}

impl PlanRequest {
    /// The tokens of the longest micro-batch of `b` pairs: from the data's lengths, else every
    /// sequence `seq_len` tokens with no prompt shared.
    pub fn batch_tokens(&self, b: u64) -> BatchTokens {
        match &self.lengths {
            Some(l) => l.batch(b),
            None => PairTokens::bound(self.seq_len).batch(b),
        }
    }

    /// The smallest micro-batch the loss trains with.
    pub fn min_micro_batch(&self) -> u64 {
        if self.loss_type == Some(dpo_vocab::keys::KTO) { dpo_vocab::keys::KTO_MIN_MICRO_BATCH } else { 1 }
    }
}

impl Default for PlanRequest {
    fn default() -> Self {
        PlanRequest {
            model: None,
            model_dir: None,
            data: None,
            reading: Default::default(),
            global_batch: 64,
            seq_len: 1024,
            dtype: None,
            finetune: FineTune::Full,
            reference: Reference::Keep,
            loss_type: None,
            gradient_checkpointing: false,
            sharding: None,
            offload_optimizer: false,
            max_world_size: None,
            lr_base_batch: 64,
            device_ids: DeviceIds::Index,
            compare_trl: false,
            lengths: None,
            lengths_error: None,
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
    pub dtype: Precision,
    pub finetune: FineTune,
    pub reference: Reference,
    pub gradient_checkpointing: bool,
    /// The ZeRO stage the plan trains with (`--sharding`).
    #[serde(default)]
    pub sharding: Sharding,
    /// AdamW's state in host memory (`--offload-optimizer`).
    #[serde(default)]
    pub offload_optimizer: bool,
    pub seq_len: u64,
    /// Estimated peak per GPU; `None` without a model.
    pub memory_per_gpu_bytes: Option<u64>,
    pub memory: Option<MemoryEstimate>,
    /// With `--compare trl`: what TRL's `DPOTrainer` under transformers would need for the same
    /// run (padded rows, the fp32 log-softmax of every position).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_trl: Option<MemoryEstimate>,
    /// The planned micro-batch's tokens, as the estimate counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<BatchTokens>,
    /// Smallest free memory among the chosen GPUs.
    pub min_free_bytes: Option<u64>,
    pub model: Option<ModelShape>,
    pub topology: Topology,
    pub env: BTreeMap<String, String>,
    /// What the `dpo-train` command asks for, in dpo-train's terms; `None` when nothing fits.
    #[serde(default)]
    pub settings: Option<RunSettings>,
    /// The `dpo-train` command to run with `env` exported: [`Plan::settings`] as flags.
    pub command: String,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
    /// Filled when nothing fits: what would.
    pub alternatives: Vec<Alternative>,
    /// The collectives of an optimizer step and their time, from a bench of the chosen GPUs; `None`
    /// without one, without a model or with one GPU.
    #[serde(default)]
    pub communication: Option<comm::Communication>,
}

impl Plan {
    /// What the CPU and the GPU plans share: the batch split and its learning-rate factors, the
    /// requested settings, the command and the log; no GPU, no memory estimate per GPU, no
    /// topology, environment or alternatives (the GPU plan fills those in).
    fn with_split(
        req: &PlanRequest,
        dtype: Precision,
        split: &batch::Split,
        settings: Option<RunSettings>,
        log: Log,
    ) -> Plan {
        Plan {
            schema_version: PLAN_SCHEMA_VERSION,
            status: Status::NotReady,
            world_size: 0,
            gpus: Vec::new(),
            excluded: log.excluded,
            micro_batch: split.micro,
            grad_accum: split.accum,
            global_batch: split.effective,
            requested_global_batch: req.global_batch.max(1),
            lr_scale: batch::lr_scale(split.effective, req.lr_base_batch),
            dtype,
            finetune: req.finetune,
            reference: req.reference,
            gradient_checkpointing: req.gradient_checkpointing,
            sharding: req.sharding.unwrap_or_default(),
            offload_optimizer: req.offload_optimizer,
            seq_len: req.seq_len,
            memory_per_gpu_bytes: None,
            memory: None,
            memory_trl: None,
            tokens: Some(req.batch_tokens(split.micro)),
            min_free_bytes: None,
            model: req.model.clone(),
            topology: Topology { nvlink_islands: Vec::new(), numa_groups: Vec::new(), links_known: true },
            env: BTreeMap::new(),
            command: settings.as_ref().map(command::render).unwrap_or_default(),
            settings,
            warnings: log.warnings,
            notes: log.notes,
            alternatives: Vec::new(),
            communication: None,
        }
    }
}

impl Plan {
    /// What decides the collectives of one optimizer step (one micro-batch per rank when the
    /// plan has no batch split).
    pub fn step_setting(&self) -> comm::StepSetting {
        comm::StepSetting {
            finetune: self.finetune,
            sharding: self.sharding,
            dtype: self.dtype,
            offload_optimizer: self.offload_optimizer,
            gradient_checkpointing: self.gradient_checkpointing,
            reference: self.reference,
            micro_batches: self.grad_accum.max(1),
        }
    }
}

/// What the steps report besides their results.
#[derive(Debug, Default)]
struct Log {
    warnings: Vec<String>,
    notes: Vec<String>,
    excluded: Vec<Excluded>,
}

impl Log {
    /// One warning per excluded GPU; when nothing fits, the one "nothing fits" warning stands
    /// for the memory exclusions.
    fn warn_exclusions(&mut self, nothing_fits: bool) {
        for e in &self.excluded {
            if !(nothing_fits && e.reason.starts_with("too little free memory")) {
                self.warnings.push(format!("GPU {} excluded: {}", e.index, e.reason));
            }
        }
    }
}

/// Where the planned tokens come from: `--data`'s pairs, or why not; and data smaller than the
/// global batch, which every optimizer step then takes whole.
fn lengths_note(req: &PlanRequest, log: &mut Log) {
    match (&req.lengths, &req.lengths_error) {
        (Some(l), _) => {
            // KTOTrainer's losses train on rows (kto's each beside its KL sequence).
            let unpaired = req.loss_type.is_some_and(|loss| dpo_vocab::keys::UNPAIRED_LOSSES.contains(&loss));
            let what = if unpaired { "row" } else { "pair" };
            log.notes.push(format!(
                "planned for the data's longest {what}s: {} {what}(s) tokenised at max length {}, the longest {} tokens packed (the prompt once)",
                l.pairs,
                req.seq_len,
                l.packed_longest.first().copied().unwrap_or(0)
            ));
            if l.pairs < req.global_batch {
                log.notes.push(format!(
                    "the data's {} {what}(s) are fewer than the global batch of {}: each optimizer step takes all of them, one step an epoch (--global-batch sets it)",
                    l.pairs, req.global_batch
                ));
            }
        }
        (None, Some(LengthsError::Data(why))) => log.warnings.push(format!(
            "dpo-train cannot read --data ({why}): training would stop there; planned for sequences of {} tokens (--seq-len)",
            req.seq_len
        )),
        (None, Some(LengthsError::NotRun(why))) => log.notes.push(format!(
            "--data's lengths were not read ({why}): planned for sequences of {} tokens (--seq-len), none of them shared",
            req.seq_len
        )),
        (None, None) => {}
    }
}

/// Plans a run. Never fails: problems become exclusions, warnings or `Status::NotReady`.
pub fn plan(snap: &Snapshot, req: &PlanRequest) -> Plan {
    let topo = topology::analyze(snap);
    if snap.gpus.is_empty() {
        let reason = "no NVIDIA GPU found".to_string();
        return Plan { topology: topo, ..cpu_plan(req, &snap.system, reason, snap.bench.as_ref()) };
    }
    let mut log = Log::default();
    lengths_note(req, &mut log);
    // 1-2. Health and one GPU model.
    let candidates = select::usable(snap, &mut log);
    if !topo.links_known && candidates.len() > 1 {
        log.warnings.push(
            "the links between the GPUs are unknown (no --topo): they were chosen without knowing which share NVLink or a PCIe switch; pass `nvidia-smi topo -m` output as --topo".to_string(),
        );
    }
    // 3. Precision.
    let dtype = precision(snap, &candidates, req, &mut log);
    let est = fit::Estimator::new(req, dtype);
    // 4. Memory at micro-batch 1: the ZeRO stage, and what would fit when nothing does.
    let fit = fit::fit(snap, candidates, &est, &mut log);
    // 5. World size and which GPUs.
    let chosen = select::world(snap, &fit.gpus, req, fit.world, &mut log);
    log.warn_exclusions(fit.nothing_fits);
    if chosen.is_empty() {
        fit::busy_advice(snap, &est, &mut log);
        return unplaced(req, topo, dtype, fit, log);
    }
    // 6. Batch split, in the chosen setting over the chosen GPUs.
    let global = req.global_batch.max(1);
    let (setting, est) = (fit.setting, est.chosen(fit.setting, chosen.len()));
    let min_free = chosen.iter().filter_map(|&i| fit::available(snap, i)).min();
    let split = batch::split(chosen.len(), min_free, (global, req.min_micro_batch()), &est, &mut log);
    fit::offload_host_check(split.estimate.as_ref(), chosen.len(), snap.system.memory_available_bytes, &mut log);
    // 7. Environment.
    let env = env::environment(snap, &chosen, req, &mut log);
    // 8. Command.
    let settings = command::settings(req, &setting, Ranks::Gpus(chosen.len()), &split, dtype);
    // 9. Communication, when a bench measured these GPUs.
    let step = comm::StepSetting {
        finetune: req.finetune,
        sharding: setting.sharding,
        dtype,
        offload_optimizer: setting.offload,
        gradient_checkpointing: setting.checkpointing,
        reference: req.reference,
        micro_batches: split.accum,
    };
    let communication = comm::communication(snap, &chosen, req.model.as_ref(), &step, &mut log);
    // Data dpo-train refuses stops the printed command at once: not ready, whatever fits.
    let status = match (&req.lengths_error, log.warnings.is_empty()) {
        (Some(LengthsError::Data(_)), _) => Status::NotReady,
        (_, true) => Status::Ready,
        (_, false) => Status::ReadyWithWarnings,
    };
    Plan {
        status,
        world_size: chosen.len(),
        gpus: chosen,
        gradient_checkpointing: setting.checkpointing,
        sharding: setting.sharding,
        offload_optimizer: setting.offload,
        memory_per_gpu_bytes: split.estimate.map(|e| e.total),
        memory: split.estimate,
        memory_trl: req.compare_trl.then(|| est.trl_at(split.micro)).flatten(),
        min_free_bytes: split.min_free,
        topology: topo,
        env,
        alternatives: fit.alternatives,
        communication,
        ..Plan::with_split(req, dtype, &split, Some(settings), log)
    }
}

/// The plan when no GPU could be chosen: why (the log), what would fit instead, and the CPU's run.
fn unplaced(req: &PlanRequest, topo: Topology, dtype: Precision, fit: fit::Fit, mut log: Log) -> Plan {
    if !fit.nothing_fits {
        log.warnings.push("no usable GPU: every GPU was excluded".to_string());
    }
    Plan {
        warnings: log.warnings,
        notes: log.notes,
        excluded: log.excluded,
        alternatives: fit.alternatives,
        dtype,
        topology: topo,
        memory: fit.need,
        memory_per_gpu_bytes: fit.need.map(|m| m.total),
        memory_trl: None,
        command: String::new(),
        settings: None,
        micro_batch: 0,
        grad_accum: 0,
        global_batch: req.global_batch,
        lr_scale: batch::lr_scale(req.global_batch, req.lr_base_batch),
        ..Plan::cpu_fallback(req, 1, String::new())
    }
}

/// Step 3: bf16 unless a chosen GPU lacks it (compute capability below 8.0: fp16), or as asked.
fn precision(snap: &Snapshot, candidates: &[u32], req: &PlanRequest, log: &mut Log) -> Precision {
    let gpus: Vec<&Gpu> = candidates.iter().filter_map(|&i| snap.gpu(i)).collect();
    let without = gpus.iter().find(|g| g.has_bf16() == Some(false));
    let unknown = gpus.iter().find(|g| g.has_bf16().is_none());
    let older = |g: &Gpu| match g.compute_capability_pair() {
        Some((maj, min)) => format!("have compute capability {maj}.{min}"),
        None => format!("include {}, older than that", g.label()),
    };
    match (req.dtype, without, unknown) {
        (Some(Precision::Bf16), Some(g), _) => {
            let have = older(g);
            log.warnings.push(format!(
                "bf16 needs compute capability 8.0 or newer and the chosen GPUs {have}: use --dtype fp16"
            ));
            Precision::Bf16
        }
        (Some(d), _, _) => d,
        (None, Some(_), _) => {
            log.notes.push("fp16 chosen: these GPUs have no bf16 (compute capability below 8.0)".to_string());
            Precision::Fp16
        }
        (None, None, Some(g)) => {
            log.warnings.push(format!(
                "the compute capability of {} is unknown (no compute_cap in the --query file, or no --query): planned in fp16, which every GPU trains in; with Ampere or newer GPUs (8.0+) pass --dtype bf16",
                g.label()
            ));
            Precision::Fp16
        }
        (None, None, None) => Precision::Bf16,
    }
}

#[cfg(test)]
mod tests {
    use super::env::driver_tuple;
    use super::select::{choose_subset, health_reasons, split_by_model};
    use super::*;
    use crate::snapshot::Gpu;
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
        // Without a process list, memory in use marks the GPU busy; an empty list (a container
        // that sees no other PID) too.
        let mut h = gpu(1, "A", 80);
        h.memory_used_bytes = Some(3 * GIB);
        assert_eq!(health_reasons(&h), vec!["busy: 3.0 GiB of memory already in use".to_string()]);
        h.processes = Some(Vec::new());
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

    /// Inside a NUMA node or an NVLink island the best-connected GPUs are picked, and of several
    /// large enough, the one whose are best connected: not the first GPUs of the first.
    #[test]
    fn subset_is_the_best_connected_inside_its_node_or_island() {
        let numa = |nodes: [u32; 4]| {
            move |mut g: Gpu| {
                g.numa_node = Some(nodes[g.index as usize]);
                g
            }
        };
        // One node; 1-3 share a PCIe switch, every other pair crosses the host bridge.
        let one = numa([0; 4]);
        let s = machine((0..4).map(|i| one(gpu(i, "A", 70))).collect(), |a, b| {
            if (a, b) == (1, 3) { Link::Pix } else { Link::Node }
        });
        let mut notes = Vec::new();
        assert_eq!(choose_subset(&s, &[0, 1, 2, 3], 2, &mut notes), vec![1, 3]);
        // Two nodes of two: node 1's pair shares a switch, node 0's does not.
        let two = numa([0, 0, 1, 1]);
        let s = machine((0..4).map(|i| two(gpu(i, "A", 70))).collect(), |a, b| match (a, b) {
            (2, 3) => Link::Pix,
            (0, 1) => Link::Node,
            _ => Link::Sys,
        });
        notes.clear();
        assert_eq!(choose_subset(&s, &[0, 1, 2, 3], 2, &mut notes), vec![2, 3]);
        assert_eq!(notes, ["kept to NUMA node 1: GPUs 2,3"]);
        // DGX-1V's hybrid cube mesh: one island of 8, some pairs with two links (NV2).
        let nv2 = [(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)];
        let nv1 = [(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)];
        let s = machine((0..8).map(|i| gpu(i, "V", 30)).collect(), |a, b| match (a, b) {
            p if nv2.contains(&p) => Link::NvLink(2),
            p if nv1.contains(&p) => Link::NvLink(1),
            _ => Link::Sys,
        });
        assert_eq!(choose_subset(&s, &(0..8).collect::<Vec<_>>(), 2, &mut notes), vec![0, 3]);
    }

    /// A driver without the `NUMA Affinity` column: GPUs are kept to one socket by their CPU
    /// affinity (8 GPUs all `SYS` apart, 0-3 on CPUs 0-55, 4-7 on 56-111, GPUs 1-3 busy).
    #[test]
    fn subset_keeps_to_one_socket_by_cpu_affinity_without_numa() {
        let s = machine(
            (0..8)
                .map(|i| {
                    let mut g = gpu(i, "A", 70);
                    g.cpu_affinity = Some(if i < 4 { "0-55" } else { "56-111" }.to_owned());
                    g
                })
                .collect(),
            |_, _| Link::Sys,
        );
        let mut notes = Vec::new();
        assert_eq!(choose_subset(&s, &[0, 4, 5, 6, 7], 2, &mut notes), vec![4, 5]);
        assert_eq!(notes, ["kept to the GPUs local to CPUs 56-111: GPUs 4,5,6,7"]);
    }

    #[test]
    fn rounding_and_micro_batch() {
        let s = machine((0..6).map(|i| gpu(i, "A", 70)).collect(), |_, _| Link::NvLink(12));
        let req = PlanRequest { model: Some(ModelShape::from_param_count(500_000_000)), ..PlanRequest::default() };
        let p = plan(&s, &req);
        // 64 over 6 rounds to 66: 11 per GPU, all of it in one micro-batch (11 divides 11).
        assert_eq!((p.world_size, p.micro_batch, p.grad_accum, p.global_batch), (6, 11, 1, 66));
        assert_eq!(p.status, Status::ReadyWithWarnings);
        assert!(p.warnings[0].ends_with("for exactly 64 use --world-size 4"), "{}", p.warnings[0]);
        let p = plan(&s, &PlanRequest { max_world_size: Some(4), ..req.clone() });
        assert_eq!((p.world_size, p.global_batch), (4, 64));
        assert!(p.micro_batch >= 2 && p.micro_batch * p.grad_accum == 16);
        assert_eq!(p.status, Status::Ready);
        // 63 over 3 GPUs: 21 each, a 1B model on 70 GiB takes micro-batch 7, not 1 (a power of two).
        let s3 = machine((0..3).map(|i| gpu(i, "A", 70)).collect(), |_, _| Link::NvLink(12));
        let one_b = PlanRequest { model: Some(ModelShape::from_param_count(1_000_000_000)), global_batch: 63, ..req };
        let p = plan(&s3, &one_b);
        assert_eq!((p.world_size, p.micro_batch, p.grad_accum, p.global_batch), (3, 7, 3, 63));
    }

    /// `--sharding auto` keeps the first stage that fits: 1.5B full fine-tuning in bf16, 16 pairs a
    /// GPU a step, needs at least 40.0 GiB unsharded, 26.3 GiB under zero1 over 4 GPUs (the fp32
    /// masters sharded beside the bf16 weights), 20.8 GiB under zero2 with checkpointing (the fp32
    /// weights cast a layer at a time, its step's updated slices included), 13.5 GiB under zero3,
    /// 8.5 GiB with the offload: at micro-batch 1 with the 16 micro-batches' summed gradients
    /// held, or all 16 pairs in one pass, whichever is less.
    #[test]
    fn auto_sharding_takes_the_first_stage_that_fits() {
        let req = PlanRequest { model: Some(ModelShape::from_param_count(1_500_000_000)), ..PlanRequest::default() };
        let expect = [
            (44, Sharding::None, false, false),
            (33, Sharding::Zero1, false, false),
            (24, Sharding::Zero2, true, false),
            (16, Sharding::Zero3, true, false),
            (10, Sharding::Zero3, true, true),
        ];
        for (free, sharding, checkpointing, offload) in expect {
            let p = plan(&machine((0..4).map(|i| gpu(i, "A", free)).collect(), |_, _| Link::Phb), &req);
            assert_eq!(p.world_size, 4, "{free} GiB");
            assert_eq!((p.sharding, p.gradient_checkpointing, p.offload_optimizer), (sharding, checkpointing, offload));
            assert!(p.memory_per_gpu_bytes.expect("a model") <= free * GIB, "{free} GiB");
            let settings = p.settings.as_ref().expect("a command");
            assert_eq!((settings.sharding, settings.offload_optimizer), (sharding, offload), "{}", p.command);
            assert!(p.command.contains(&format!(" --sharding {}", sharding.name())), "{}", p.command);
            assert!(p.command.ends_with(&format!(" --offload-optimizer {offload}")), "{}", p.command);
        }
        // Nothing fits: the requested setting is reported, with the leanest stage's need.
        let p = plan(&machine((0..4).map(|i| gpu(i, "A", 5)).collect(), |_, _| Link::Phb), &req);
        assert_eq!((p.status, p.sharding), (Status::NotReady, Sharding::None));
        assert!(
            p.warnings[0].ends_with("; zero3 with the optimizer offloaded to host memory over 4 GPUs needs 8.5 GiB"),
            "{}",
            p.warnings[0]
        );
        // LoRA, under a stage as the search would run it, fits (a precomputed reference does not:
        // micro-batch 1 accumulates, and a rank's 16 pairs in one pass take more).
        assert!(p.notes.iter().any(|n| n.starts_with("plan again with `--lora 16` added")), "{:?}", p.notes);
        // One GPU has nothing to shard over: only the offload is tried.
        let one = plan(&machine(vec![gpu(0, "A", 24)], |_, _| Link::Phb), &req);
        assert_eq!((one.sharding, one.offload_optimizer, one.world_size), (Sharding::None, true, 1));
        // LoRA and a fixed stage are planned as asked.
        let lora = PlanRequest { finetune: FineTune::Lora { rank: 16 }, ..req.clone() };
        let p = plan(&machine((0..4).map(|i| gpu(i, "A", 40)).collect(), |_, _| Link::Phb), &lora);
        assert_eq!(p.sharding, Sharding::None);
        let fixed = PlanRequest { sharding: Some(Sharding::Zero1), ..req.clone() };
        let p = plan(&machine((0..4).map(|i| gpu(i, "A", 19)).collect(), |_, _| Link::Phb), &fixed);
        assert_eq!((p.status, p.sharding), (Status::NotReady, Sharding::Zero1));
        // A fixed stage on one GPU is planned, with a warning.
        let p = plan(
            &machine(vec![gpu(0, "A", 80)], |_, _| Link::Phb),
            &PlanRequest { sharding: Some(Sharding::Zero2), ..req },
        );
        assert!(
            p.warnings.iter().any(|w| w == "zero2 over one GPU partitions nothing: it needs two or more"),
            "{:?}",
            p.warnings
        );
    }

    /// Without `memory.free` the plan goes by total − used (else the total), says so, and is
    /// never plainly ready; free memory above the total counts as the total.
    #[test]
    fn unknown_free_memory_is_total_less_used_with_a_warning() {
        let req = PlanRequest { model: Some(ModelShape::from_param_count(1_500_000_000)), ..PlanRequest::default() };
        let unknown = |used: Option<u64>| {
            let mut g = gpu(0, "A", 0);
            (g.memory_free_bytes, g.memory_used_bytes) = (None, used);
            g
        };
        // 1 GiB of a 24 GiB card in use: 23 GiB left, too little for the 38.6 GiB full replica.
        let mut small = unknown(Some(GIB));
        small.memory_total_bytes = Some(24 * GIB);
        let p = plan(&machine(vec![small], |_, _| Link::Phb), &req);
        assert_eq!(p.min_free_bytes, Some(23 * GIB));
        assert!(p.memory_per_gpu_bytes.expect("a model") <= 23 * GIB);
        assert!(p.offload_optimizer, "{:?}", p.warnings);
        assert_eq!(p.status, Status::ReadyWithWarnings);
        assert_eq!(p.warnings[0], "GPU 0: free memory unknown: planned against total minus used memory");
        let p = plan(&machine(vec![unknown(None)], |_, _| Link::Phb), &req);
        assert_eq!((p.status, p.min_free_bytes), (Status::ReadyWithWarnings, Some(80 * GIB)));
        assert!(p.warnings[0].starts_with("GPU 0: free and used memory unknown: planned against the total"));
        // Nothing known: not checked, and said so.
        let mut g = unknown(None);
        g.memory_total_bytes = None;
        let h = Gpu { index: 1, ..g.clone() };
        let p = plan(&machine(vec![g, h], |_, _| Link::Phb), &req);
        assert_eq!(p.status, Status::ReadyWithWarnings);
        assert!(p.warnings.iter().any(|w| w.starts_with("GPUs 0,1: memory unknown")), "{:?}", p.warnings);
        // A free figure above the total is capped at the total.
        let mut g = gpu(0, "A", 0);
        (g.memory_free_bytes, g.memory_total_bytes) = (Some(900 * GIB), Some(24 * GIB));
        let p = plan(&machine(vec![g], |_, _| Link::Phb), &req);
        assert_eq!(p.min_free_bytes, Some(24 * GIB));
    }

    /// 70B on eight 80 GiB GPUs: no full fine-tuning setting fits, LoRA does under zero3; the
    /// search runs for LoRA too, and each alternative is estimated in the setting it would run in.
    #[test]
    fn lora_and_precomputed_reference_search_the_stages_too() {
        let s = machine((0..8).map(|i| gpu(i, "H100", 79)).collect(), |_, _| Link::NvLink(18));
        let req = PlanRequest { model: Some(ModelShape::from_param_count(70_000_000_000)), ..PlanRequest::default() };
        let p = plan(&s, &req);
        assert_eq!(p.status, Status::NotReady);
        let lora = p.alternatives.iter().find(|a| a.check_gpu_flags == "--lora 16").expect("LoRA is suggested");
        assert!(lora.fits && lora.memory_per_gpu_bytes <= 79 * GIB, "{lora:?}");
        assert!(lora.flags.ends_with(" --gradient-checkpointing --sharding zero3"), "{}", lora.flags);
        assert_eq!(lora.description, "LoRA rank 16, zero3");
        // Checkpointing alone is one of the search's own rungs: not listed again.
        assert!(p.alternatives.iter().all(|a| a.check_gpu_flags != "--gradient-checkpointing"), "{:?}", p.alternatives);
        let asked = PlanRequest { finetune: FineTune::Lora { rank: 16 }, gradient_checkpointing: true, ..req.clone() };
        let p = plan(&s, &asked);
        assert_eq!((p.status, p.sharding, p.world_size), (Status::Ready, Sharding::Zero3, 8), "{:?}", p.warnings);
        let pre = plan(&s, &PlanRequest { reference: Reference::Precompute, ..req });
        assert_eq!((pre.status, pre.sharding, pre.offload_optimizer), (Status::Ready, Sharding::Zero3, true));
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

    /// Two ranks kept to NUMA node 0 of a two-socket box share node 0's 32 CPUs, not all 64.
    #[test]
    fn omp_threads_count_the_cpus_near_the_chosen_gpus() {
        let mut gpus: Vec<Gpu> = (0..4).map(|i| gpu(i, "A", 70)).collect();
        for g in &mut gpus {
            g.cpu_affinity = Some(if g.index < 2 { "0-15,32-47" } else { "16-31,48-63" }.to_string());
            g.numa_node = Some(g.index / 2);
        }
        let s = machine(gpus, |a, b| if a / 2 == b / 2 { Link::Pix } else { Link::Sys });
        let p = plan(&s, &PlanRequest { max_world_size: Some(2), ..PlanRequest::default() });
        assert_eq!((p.gpus.clone(), p.env["OMP_NUM_THREADS"].as_str()), (vec![0, 1], "16"));
        let p = plan(&s, &PlanRequest::default());
        assert_eq!(p.env["OMP_NUM_THREADS"], "16");
    }

    /// A GPU left out only because another job holds 18 of its 40 GiB: the plan says what
    /// would fit in the 22 GiB left.
    #[test]
    fn busy_gpu_says_what_fits_in_its_free_memory() {
        let mut g = gpu(0, "A100-40GB", 22);
        (g.memory_total_bytes, g.memory_used_bytes) = (Some(40 * GIB), Some(18 * GIB));
        let s = machine(vec![g], |_, _| Link::Phb);
        let note = |params: u64| {
            let p =
                plan(&s, &PlanRequest { model: Some(ModelShape::from_param_count(params)), ..PlanRequest::default() });
            assert_eq!(p.status, Status::NotReady);
            p.notes.into_iter().find(|n| n.starts_with("GPU 0, left out as busy, has 22.0 GiB free: ")).expect("advice")
        };
        assert!(note(1_000_000_000).contains(": the run fits there"));
        assert!(note(7_000_000_000).contains(": it fits there with `--lora 16"));
        assert!(note(13_000_000_000).contains(": no setting check-gpu tries fits there"));
    }

    #[test]
    fn empty_machine_falls_back_to_cpu() {
        let mut s = Snapshot::new(Source::NvidiaSmi);
        s.system.cpu_count = Some(12);
        // NUMA nodes unknown: one process on all 12 cores.
        let p = plan(&s, &PlanRequest::default());
        assert_eq!(p.status, Status::NotReady);
        assert_eq!(
            p.command,
            "dpo-train train --model-name-or-path YOUR_MODEL_DIR --train-file YOUR_DATA.jsonl --devices cpu:1 --per-device-train-batch-size 8 \
             --gradient-accumulation-steps 8 --global-batch-size 64 --max-length 1024 --bf16 false --fp16 false \
             --precompute-ref-log-probs false --gradient-checkpointing false --sharding none --offload-optimizer false"
        );
        assert!(p.notes[0].starts_with("1 process(es) on 12 cores, one per NUMA node (the NUMA nodes unknown)"));
        // Three nodes: a process each; 64 over 3 processes rounds, and says so.
        s.system.cpu_numa_nodes = Some(3);
        let p = plan(&s, &PlanRequest::default());
        assert!(p.command.contains(" --devices cpu:3 "), "{}", p.command);
        assert!(p.warnings[1].starts_with("global batch 64 cannot be split exactly over 3"), "{:?}", p.warnings);
        assert!(p.notes[0].starts_with("3 process(es) on 12 cores, one per NUMA node (3 NUMA node(s) with"));
        assert_eq!(p.status.exit_code(), 2);
        // Never more processes than cores.
        (s.system.cpu_count, s.system.cpu_numa_nodes) = (Some(2), Some(4));
        assert!(plan(&s, &PlanRequest::default()).command.contains(" --devices cpu:2 "));
    }

    /// Each rank offloads its share of the masters and AdamW's moments to the host: eight ranks of
    /// a 7B model without sharding take 8 x 78.2 GiB there, which 64 GiB cannot hold.
    #[test]
    fn an_offloaded_optimizer_is_checked_against_host_memory() {
        let req = PlanRequest {
            model: Some(ModelShape::from_param_count(7_000_000_000)),
            sharding: Some(Sharding::None),
            offload_optimizer: true,
            gradient_checkpointing: true,
            global_batch: 8,
            ..PlanRequest::default()
        };
        let mut s = machine((0..8).map(|i| gpu(i, "H100", 79)).collect(), |_, _| Link::NvLink(18));
        let offload =
            |p: &Plan| p.warnings.iter().chain(&p.notes).find(|w| w.contains("offloaded optimizer takes")).cloned();
        let unknown = plan(&s, &req);
        assert!(
            offload(&unknown)
                .expect("a note")
                .ends_with("the host's memory is unknown (not in this input), not checked")
        );
        s.system.memory_available_bytes = Some(64 * GIB);
        let p = plan(&s, &req);
        assert_eq!(p.status, Status::ReadyWithWarnings, "{:?}", p.warnings);
        let w = offload(&p).expect("a warning");
        assert!(w.starts_with("the offloaded optimizer takes 78.2 GiB of host memory per GPU x 8 = 625.8 GiB, and 64.0 GiB is available"), "{w}");
        assert!(p.warnings.contains(&w));
        s.system.memory_available_bytes = Some(1024 * GIB);
        let p = plan(&s, &req);
        assert!(
            p.notes
                .iter()
                .any(|n| n.ends_with(" = 625.8 GiB of 1024.0 GiB available (MemAvailable, or the cgroup's limit)")),
            "{:?}",
            p.notes
        );
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
