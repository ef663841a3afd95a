//! Step 4, memory: the estimate at micro-batch 1 against each GPU's free memory; when nothing
//! fits, what would, least intrusive first: activation checkpointing, a precomputed reference,
//! LoRA, and their combinations, each with its estimate.

use super::{Alternative, Excluded, LORA_TARGETS, Log, PlanRequest, SUGGESTED_LORA_RANK};
use crate::memory::{self, Dtype, FineTune, MemoryEstimate, MemoryRequest, Reference};
use crate::snapshot::Snapshot;
use crate::units::bytes;

/// The memory estimate of the planned run at any micro-batch (`None` without a model).
pub(super) struct Estimator<'a> {
    req: &'a PlanRequest,
    dtype: Dtype,
}

impl<'a> Estimator<'a> {
    pub fn new(req: &'a PlanRequest, dtype: Dtype) -> Self {
        Self { req, dtype }
    }

    /// Whether a model was given, so that memory can be checked at all.
    pub fn has_model(&self) -> bool {
        self.req.model.is_some()
    }

    /// The planned run's estimate at micro-batch `micro`.
    pub fn at(&self, micro: u64) -> Option<MemoryEstimate> {
        let setting = Setting {
            finetune: self.req.finetune,
            reference: self.req.reference,
            checkpointing: self.req.gradient_checkpointing,
        };
        self.with(micro, setting)
    }

    fn with(&self, micro: u64, s: Setting) -> Option<MemoryEstimate> {
        self.req.model.as_ref().map(|model| {
            memory::estimate(&MemoryRequest {
                model,
                micro_batch: micro,
                seq_len: self.req.seq_len,
                dtype: self.dtype,
                finetune: s.finetune,
                reference: s.reference,
                gradient_checkpointing: s.checkpointing,
                world_size: 1,
                sharding: crate::memory::Sharding::None,
                offload_optimizer: false,
            })
        })
    }
}

/// The settings that change the memory need.
#[derive(Debug, Clone, Copy)]
struct Setting {
    finetune: FineTune,
    reference: Reference,
    checkpointing: bool,
}

/// A setting to suggest, and how to ask for it.
struct Suggestion {
    description: String,
    /// The `dpo-train` flags.
    flags: String,
    /// The `check-gpu` flags that plan with it.
    check_gpu_flags: String,
    setting: Setting,
}

/// What step 4 leaves.
pub(super) struct Fit {
    /// The candidates with room for micro-batch 1 (all of them without a model).
    pub gpus: Vec<u32>,
    /// Not one candidate had room.
    pub nothing_fits: bool,
    /// The estimate at micro-batch 1.
    pub need: Option<MemoryEstimate>,
    /// Filled when nothing fits: what would.
    pub alternatives: Vec<Alternative>,
}

/// The candidates whose free memory holds micro-batch 1; the others are excluded.
pub(super) fn fit(snap: &Snapshot, candidates: Vec<u32>, est: &Estimator, log: &mut Log) -> Fit {
    let need = est.at(1);
    let Some(needed) = need else {
        return Fit { gpus: candidates, nothing_fits: false, need, alternatives: Vec::new() };
    };
    let mut gpus = Vec::new();
    for &i in &candidates {
        match snap.gpu(i).and_then(|g| g.memory_free_bytes) {
            Some(free) if free < needed.total => log.excluded.push(Excluded {
                index: i,
                reason: format!(
                    "too little free memory: needs {} at micro-batch 1, has {} free",
                    bytes(needed.total),
                    bytes(free)
                ),
            }),
            Some(_) => gpus.push(i),
            None => {
                log.notes.push(format!("GPU {i}: free memory unknown, not checked against the estimate"));
                gpus.push(i);
            }
        }
    }
    if !gpus.is_empty() || candidates.is_empty() {
        return Fit { gpus, nothing_fits: false, need, alternatives: Vec::new() };
    }
    let best_free = candidates.iter().filter_map(|&i| snap.gpu(i)?.memory_free_bytes).max().unwrap_or(0);
    log.warnings.push(format!(
        "nothing fits: even micro-batch 1 with gradient accumulation needs {} per GPU and the largest free memory is {}",
        bytes(needed.total),
        bytes(best_free)
    ));
    let alternatives: Vec<Alternative> = suggestions(est.req)
        .into_iter()
        .filter_map(|s| {
            let e = est.with(1, s.setting)?;
            Some(Alternative {
                description: s.description,
                flags: s.flags,
                check_gpu_flags: s.check_gpu_flags,
                memory_per_gpu_bytes: e.total,
                fits: e.total <= best_free,
            })
        })
        .collect();
    match alternatives.iter().find(|a| a.fits) {
        Some(a) => log.notes.push(format!("plan again with `{}` added to the check-gpu flags ({})", a.check_gpu_flags, a.description)),
        None => log.notes.push("none of LoRA, a precomputed reference or activation checkpointing fits: use GPUs with more memory or a smaller model".to_string()),
    }
    Fit { gpus, nothing_fits: true, need, alternatives }
}

/// The settings that lower the need from `req`'s, least intrusive first.
fn suggestions(req: &PlanRequest) -> Vec<Suggestion> {
    let base = Setting { finetune: req.finetune, reference: req.reference, checkpointing: req.gradient_checkpointing };
    let lora = FineTune::Lora { rank: SUGGESTED_LORA_RANK };
    let lora_flags = format!("--lora-r {SUGGESTED_LORA_RANK} --lora-target-modules {LORA_TARGETS}");
    let lora_cg = format!("--lora {SUGGESTED_LORA_RANK}");
    let (ckpt, ckpt_cg) = ("--gradient-checkpointing", "--gradient-checkpointing");
    let (pre, pre_cg) = ("--precompute-ref-log-probs", "--reference precompute");
    let option = |description: String, flags: String, check_gpu_flags: String, setting| Suggestion {
        description,
        flags,
        check_gpu_flags,
        setting,
    };
    let mut out = Vec::new();
    if !req.gradient_checkpointing {
        let s = Setting { checkpointing: true, ..base };
        out.push(option("activation checkpointing".into(), ckpt.into(), ckpt_cg.into(), s));
    }
    if req.reference == Reference::Keep && req.finetune == FineTune::Full {
        let s = Setting { reference: Reference::Precompute, ..base };
        out.push(option("precomputed reference log-probs".into(), pre.into(), pre_cg.into(), s));
        let both = Setting { checkpointing: true, ..s };
        let (flags, cg) = (format!("{pre} {ckpt}"), format!("{pre_cg} {ckpt_cg}"));
        out.push(option("precomputed reference + activation checkpointing".into(), flags, cg, both));
    }
    if req.finetune == FineTune::Full {
        let s = Setting { finetune: lora, ..base };
        out.push(option(format!("LoRA rank {SUGGESTED_LORA_RANK}"), lora_flags.clone(), lora_cg.clone(), s));
        let both = Setting { checkpointing: true, ..s };
        let (flags, cg) = (format!("{lora_flags} {ckpt}"), format!("{lora_cg} {ckpt_cg}"));
        out.push(option(format!("LoRA rank {SUGGESTED_LORA_RANK} + activation checkpointing"), flags, cg, both));
    }
    out
}
