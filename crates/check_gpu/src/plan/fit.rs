//! Step 4, memory: the estimate at micro-batch 1 against each GPU's free memory. A run (full
//! fine-tuning or LoRA) with `--sharding auto` that does not fit as a full replica tries the ZeRO
//! stages, cheapest in communication first: zero1, zero2, zero2 with activation checkpointing
//! (its gradients shrink only when the backward runs layer by layer), zero3, zero3 with the
//! optimizer offloaded; one GPU has nothing to shard over, so there only the offload is tried.
//! The first that fits at micro-batch 1 (the micro-batch an unsharded run that does not fit
//! would get) is kept. When nothing fits, what would, least intrusive first: activation
//! checkpointing, a precomputed reference, LoRA, and their combinations, each run through the
//! same search and estimated in the first setting of it that fits.

use super::{Alternative, Excluded, LORA_TARGETS, Log, PlanRequest, SUGGESTED_LORA_RANK};
use crate::memory::{self, Engine, FineTune, MemoryEstimate, MemoryRequest, Precision, Reference, Sharding};
use crate::snapshot::{MemoryBasis, Snapshot};
use crate::units::{bytes, list};

/// The memory estimate of the planned run at any micro-batch (`None` without a model).
pub(super) struct Estimator<'a> {
    req: &'a PlanRequest,
    dtype: Precision,
    /// The setting [`Estimator::at`] estimates: the requested one until step 4 chooses.
    setting: Setting,
    /// Ranks the sharded terms divide over.
    world: usize,
    /// GPUs, or CPU processes ([`Estimator::on_cpu`]).
    cuda: bool,
}

impl<'a> Estimator<'a> {
    pub fn new(req: &'a PlanRequest, dtype: Precision) -> Self {
        Self { req, dtype, setting: Setting::requested(req), world: 1, cuda: true }
    }

    /// The same estimator for CPU processes.
    pub fn on_cpu(self) -> Self {
        Self { cuda: false, ..self }
    }

    /// The same estimator for the setting step 4 chose, over `world` GPUs.
    pub fn chosen(self, setting: Setting, world: usize) -> Self {
        Self { setting, world, ..self }
    }

    /// Whether a model was given, so that memory can be checked at all.
    pub fn has_model(&self) -> bool {
        self.req.model.is_some()
    }

    /// The planned run's estimate at micro-batch `micro`.
    pub fn at(&self, micro: u64) -> Option<MemoryEstimate> {
        self.with(micro, self.setting, self.world)
    }

    /// What TRL's `DPOTrainer` under transformers would need for the planned run at `micro`.
    pub fn trl_at(&self, micro: u64) -> Option<MemoryEstimate> {
        self.engine(micro, self.setting, self.world, Engine::Trl)
    }

    fn with(&self, micro: u64, s: Setting, world: usize) -> Option<MemoryEstimate> {
        self.engine(micro, s, world, Engine::DpoTrain(self.req.batch_tokens(micro)))
    }

    /// The least setting `s` needs over `world` ranks: at micro-batch 1, accumulating the rest of
    /// a rank's pairs, or all of them in one pass, which holds no accumulated gradients (the
    /// micro-batches between cost more than one of the two).
    pub fn least(&self, s: Setting, world: usize) -> Option<MemoryEstimate> {
        let whole = super::batch::per_rank(self.req.global_batch.max(1), world);
        let (one, all) = (self.with(1, s, world)?, self.with(whole, s, world)?);
        Some(if all.total < one.total { all } else { one })
    }

    fn engine(&self, micro: u64, s: Setting, world: usize, engine: Engine) -> Option<MemoryEstimate> {
        self.req.model.as_ref().map(|model| {
            memory::estimate(&MemoryRequest {
                model,
                micro_batch: micro,
                seq_len: self.req.seq_len,
                dtype: self.dtype,
                finetune: s.finetune,
                reference: s.reference,
                gradient_checkpointing: s.checkpointing,
                world_size: world as u64,
                sharding: s.sharding,
                offload_optimizer: s.offload,
                engine,
                cuda: self.cuda,
                accumulation: super::batch::per_rank(self.req.global_batch.max(1), world) / micro.max(1),
            })
        })
    }
}

/// The settings that change the memory need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Setting {
    pub finetune: FineTune,
    pub reference: Reference,
    pub checkpointing: bool,
    pub sharding: Sharding,
    pub offload: bool,
}

impl Setting {
    /// What the flags asked for (`--sharding auto` starts from none). zero3 recomputes each
    /// layer in the backward whatever the flag says, so it counts as checkpointing.
    pub fn requested(req: &PlanRequest) -> Setting {
        let sharding = req.sharding.unwrap_or_default();
        Setting {
            finetune: req.finetune,
            reference: req.reference,
            checkpointing: req.gradient_checkpointing || sharding == Sharding::Zero3,
            sharding,
            offload: req.offload_optimizer,
        }
    }

    /// `zero2 with activation checkpointing`, `the optimizer offloaded to host memory`: what
    /// this setting adds to `base`.
    fn describe(self, base: Setting) -> String {
        let mut added = Vec::new();
        // zero3 always recomputes, so checkpointing is only news for the other stages.
        if self.checkpointing && !base.checkpointing && self.sharding != Sharding::Zero3 {
            added.push("activation checkpointing");
        }
        if self.offload && !base.offload {
            added.push("the optimizer offloaded to host memory");
        }
        match (self.sharding, added.is_empty()) {
            (Sharding::None, true) => "no sharding".to_string(),
            (Sharding::None, false) => added.join(" and "),
            (s, true) => s.name().to_string(),
            (s, false) => format!("{} with {}", s.name(), added.join(" and ")),
        }
    }
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
    /// The setting that fits (the requested one when nothing does).
    pub setting: Setting,
    /// The most GPUs the setting was sized for: a sharded estimate grows on fewer.
    pub world: Option<usize>,
}

/// The candidates whose free memory holds micro-batch 1 in the first setting of the search
/// that fits anywhere; the others are excluded.
pub(super) fn fit(snap: &Snapshot, candidates: Vec<u32>, est: &Estimator, log: &mut Log) -> Fit {
    let base = Setting::requested(est.req);
    let most = super::select::world_size(candidates.len(), est.req);
    let empty =
        Fit { gpus: Vec::new(), nothing_fits: false, need: None, alternatives: Vec::new(), setting: base, world: None };
    if !est.has_model() || candidates.is_empty() {
        return Fit { gpus: candidates, need: est.least(base, most), ..empty };
    }
    warn_unknown_free(snap, &candidates, log);
    let ladder = ladder(est.req, base, most);
    let Some(placed) = first_fit(snap, &candidates, est, &ladder, most) else {
        return nothing_fits(snap, &candidates, est, &ladder, most, log);
    };
    let Placed { setting: s, gpus, world, need } = placed;
    for &i in &candidates {
        if let Some(free) = available(snap, i).filter(|_| !gpus.contains(&i)) {
            log.excluded.push(Excluded {
                index: i,
                reason: format!(
                    "too little free memory: needs {} at micro-batch 1, has {} free",
                    bytes(need.total),
                    bytes(free)
                ),
            });
        }
    }
    if s != base {
        log.notes.push(stage_note(est, base, s, world));
    } else if s.sharding != Sharding::None && world == 1 {
        log.warnings.push(format!("{} over one GPU partitions nothing: it needs two or more", s.sharding.name()));
    }
    Fit { gpus, need: Some(need), setting: s, world: Some(world), ..empty }
}

/// When no GPU is left and some were left out only for memory other processes hold: what would
/// fit in the memory they leave free (the search as on an idle GPU, else the first alternative),
/// so whoever shares the GPU knows what to ask for.
pub(super) fn busy_advice(snap: &Snapshot, est: &Estimator, log: &mut Log) {
    let busy: Vec<u32> = log
        .excluded
        .iter()
        .filter(|e| e.reason.starts_with("busy:") && !e.reason.contains("; "))
        .map(|e| e.index)
        .collect();
    if busy.is_empty() || !est.has_model() {
        return;
    }
    let free = busy.iter().filter_map(|&i| available(snap, i)).max().unwrap_or(0);
    let f = fit(snap, busy.clone(), est, &mut Log::default());
    let base = Setting::requested(est.req);
    let what = match (&f.need, f.alternatives.iter().find(|a| a.fits)) {
        (Some(need), _) if !f.nothing_fits => {
            let how = if f.setting == base { String::new() } else { format!(" with {}", f.setting.describe(base)) };
            format!("the run fits there{how} (micro-batch 1 needs {})", bytes(need.total))
        }
        (_, Some(a)) => format!(
            "it fits there with `{}` added to the check-gpu flags ({}, {})",
            a.check_gpu_flags,
            a.description,
            bytes(a.memory_per_gpu_bytes)
        ),
        _ => "no setting check-gpu tries fits there".to_string(),
    };
    let (label, has) = if busy.len() == 1 { ("GPU", "has") } else { ("GPUs", "have up to") };
    log.notes.push(format!(
        "{label} {}, left out as busy, {has} {} free: {what}; stop the other processes, then plan again",
        list(&busy),
        bytes(free)
    ));
}

/// A rung of the ladder that fits: where, and what it needs at micro-batch 1.
struct Placed {
    setting: Setting,
    gpus: Vec<u32>,
    world: usize,
    need: MemoryEstimate,
}

/// The first setting of `ladder` that fits on enough of `candidates`.
fn first_fit(snap: &Snapshot, candidates: &[u32], est: &Estimator, ladder: &[Setting], most: usize) -> Option<Placed> {
    ladder.iter().find_map(|&setting| {
        let (gpus, world, need) = place(snap, candidates, est, setting, most)?;
        Some(Placed { setting, gpus, world, need })
    })
}

/// Step 4 when no setting of the search fits: the warning, and what would fit instead.
fn nothing_fits(
    snap: &Snapshot,
    candidates: &[u32],
    est: &Estimator,
    ladder: &[Setting],
    most: usize,
    log: &mut Log,
) -> Fit {
    let base = Setting::requested(est.req);
    let need = est.least(base, most);
    let best_free = candidates.iter().filter_map(|&i| available(snap, i)).max().unwrap_or(0);
    let mut warning = format!(
        "nothing fits: even micro-batch 1 with gradient accumulation (or a rank's pairs in one pass, which holds no summed gradients) needs {} per GPU and the largest free memory is {}",
        bytes(need.map_or(0, |e| e.total)),
        bytes(best_free)
    );
    let leanest = ladder.last().copied().filter(|&s| s != base);
    if let Some((s, e)) = leanest.and_then(|s| Some((s, est.least(s, most)?))) {
        let over = if s.sharding == Sharding::None { String::new() } else { format!(" over {most} GPUs") };
        warning.push_str(&format!("; {}{over} needs {}", s.describe(base), bytes(e.total)));
    }
    log.warnings.push(warning);
    let alternatives = alternatives(snap, candidates, est, most);
    let tried = match leanest.map(|s| s.sharding) {
        Some(Sharding::None) => "offloading the optimizer, ",
        Some(_) => "ZeRO sharding up to zero3 with the optimizer offloaded, ",
        None => "",
    };
    advise(&alternatives, tried, "GPUs with more memory or a smaller model", log);
    Fit { gpus: Vec::new(), nothing_fits: true, need, alternatives, setting: base, world: None }
}

/// The settings to try in order: the requested one, then with `--sharding auto` the ZeRO
/// stages (on two GPUs or more) or the offload alone (on one).
fn ladder(req: &PlanRequest, base: Setting, most: usize) -> Vec<Setting> {
    // LoRA and a precomputed reference take the same rungs: zero3 splits LoRA's frozen base,
    // by far its largest term, and the offload its adapters' optimizer.
    if req.sharding.is_some() {
        return vec![base];
    }
    let with = |sharding, checkpointing: bool, offload: bool| Setting {
        sharding,
        checkpointing: base.checkpointing || checkpointing,
        offload: base.offload || offload,
        ..base
    };
    let mut out = vec![base];
    if most >= 2 {
        out.extend([
            with(Sharding::Zero1, false, false),
            with(Sharding::Zero2, false, false),
            with(Sharding::Zero2, true, false),
            // zero3 recomputes each layer whatever the flag says; the command says so too.
            with(Sharding::Zero3, true, false),
            with(Sharding::Zero3, true, true),
        ]);
    } else {
        out.push(with(Sharding::None, false, true));
    }
    // A request that already checkpoints or offloads makes the rungs adding it repeat the
    // rung before: keep one.
    out.dedup();
    out
}

/// The most GPUs (at most `most`) that each hold setting `s` at micro-batch 1 over that many:
/// `(the candidates with room, world size, estimate)`. A GPU whose free memory is unknown counts.
fn place(
    snap: &Snapshot,
    candidates: &[u32],
    est: &Estimator,
    s: Setting,
    most: usize,
) -> Option<(Vec<u32>, usize, MemoryEstimate)> {
    // An automatic stage is only worth it over two ranks; one asked for is planned as asked.
    let least = if est.req.sharding.is_none() && s.sharding != Sharding::None { 2 } else { 1 };
    (least..=most).rev().find_map(|n| {
        let need = est.least(s, n)?;
        let gpus: Vec<u32> =
            candidates.iter().copied().filter(|&i| available(snap, i).is_none_or(|free| free >= need.total)).collect();
        (gpus.len() >= n).then_some((gpus, n, need))
    })
}

/// The memory GPU `i` offers the run ([`crate::snapshot::Gpu::available_memory`]).
pub(super) fn available(snap: &Snapshot, i: u32) -> Option<u64> {
    snap.gpu(i)?.available_memory().map(|(b, _)| b)
}

/// A run on `procs` CPU processes against the host's available memory (`None`: unknown): each
/// process needs the estimate at `micro` (with the offloaded optimizer's host bytes, all of it
/// host memory here). Too much is a warning with the numbers; what fits, or is unchecked, a note.
pub(super) fn host_check(e: Option<&MemoryEstimate>, micro: u64, procs: usize, host: Option<u64>, log: &mut Log) {
    let Some(e) = e else { return };
    let each = e.total.saturating_add(e.host);
    let all = each.saturating_mul(procs as u64);
    let need = format!("{procs} process(es) x {} at micro-batch {micro} = {}", bytes(each), bytes(all));
    match host {
        Some(free) if all > free => {
            let fewer = if procs > 1 { "fewer processes (--devices cpu:N), " } else { "" };
            log.warnings.push(format!(
                "does not fit in host memory: {need}, and {} is available (MemAvailable, or the cgroup's limit); {fewer}LoRA or activation checkpointing need less",
                bytes(free)
            ))
        }
        Some(free) => log
            .notes
            .push(format!("host memory: {need} of {} available (MemAvailable, or the cgroup's limit)", bytes(free))),
        None => log.notes.push(format!("host memory unknown (not in this input): {need}, not checked")),
    }
}

/// The offloaded optimizer's host memory over `ranks` GPUs (each rank's fp32 masters and AdamW
/// moments, `host` of the estimate) against the host's available memory (`None`: unknown).
/// Too much is a warning with the numbers; what fits, or is unchecked, a note.
pub(super) fn offload_host_check(e: Option<&MemoryEstimate>, ranks: usize, host: Option<u64>, log: &mut Log) {
    let Some(each) = e.map(|e| e.host).filter(|&b| b > 0) else { return };
    let all = each.saturating_mul(ranks as u64);
    let need =
        format!("the offloaded optimizer takes {} of host memory per GPU x {ranks} = {}", bytes(each), bytes(all));
    match host {
        Some(free) if all > free => log.warnings.push(format!(
            "{need}, and {} is available (MemAvailable, or the cgroup's limit): a higher ZeRO stage (--sharding), fewer GPUs or LoRA need less",
            bytes(free)
        )),
        Some(free) => {
            log.notes.push(format!("{need} of {} available (MemAvailable, or the cgroup's limit)", bytes(free)))
        }
        None => log.notes.push(format!("{need}; the host's memory is unknown (not in this input), not checked")),
    }
}

/// One warning per kind of guess: without `memory.free` the plan goes by total − used or the
/// total (a GPU shared with another job has less), and without any memory figure it checks
/// nothing, so such a plan is never plainly ready.
fn warn_unknown_free(snap: &Snapshot, candidates: &[u32], log: &mut Log) {
    let mut by_basis: [(Option<MemoryBasis>, &str, Vec<String>); 3] = [
        (Some(MemoryBasis::TotalLessUsed), "free memory unknown: planned against total minus used memory", Vec::new()),
        (
            Some(MemoryBasis::Total),
            "free and used memory unknown: planned against the total memory, as if no other process used any",
            Vec::new(),
        ),
        (None, "memory unknown (no --query): the estimate is not checked against it", Vec::new()),
    ];
    for &i in candidates {
        let basis = snap.gpu(i).and_then(|g| g.available_memory()).map(|(_, b)| b);
        if let Some(slot) = by_basis.iter_mut().find(|(b, _, _)| *b == basis) {
            slot.2.push(i.to_string());
        }
    }
    for (_, what, gpus) in by_basis.into_iter().filter(|(_, _, g)| !g.is_empty()) {
        let label = if gpus.len() == 1 { "GPU" } else { "GPUs" };
        log.warnings.push(format!("{label} {}: {what}", gpus.join(",")));
    }
}

/// Why the plan shards or offloads: what the requested setting would need against what the
/// chosen one needs, on the GPU and in host memory.
fn stage_note(est: &Estimator, base: Setting, s: Setting, world: usize) -> String {
    let asked = est.least(base, world).map_or(0, |e| e.total);
    let e = est.least(s, world);
    let over = if s.sharding == Sharding::None { String::new() } else { format!(" over {world} GPUs") };
    let mut note = format!(
        "a full replica needs {} per GPU even at micro-batch 1, more than is free: {}{over} needs {}",
        bytes(asked),
        s.describe(base),
        bytes(e.map_or(0, |e| e.total))
    );
    if let Some(e) = e.filter(|e| e.host > 0) {
        note.push_str(&format!(" on each GPU and {} of host memory per GPU", bytes(e.host)));
    }
    note
}

/// Each suggestion in the setting it would run in: the first rung of its own search that fits
/// (with `--sharding auto`, a LoRA run may shard as a full one does), else the leanest rung's need.
/// A suggestion that lands on a setting the main search or an earlier suggestion already
/// covers (checkpointing is part of the ZeRO rungs) is left out.
fn alternatives(snap: &Snapshot, candidates: &[u32], est: &Estimator, most: usize) -> Vec<Alternative> {
    let mut seen = ladder(est.req, Setting::requested(est.req), most);
    suggestions(est.req)
        .into_iter()
        .filter_map(|s| {
            let ladder = ladder(est.req, s.setting, most);
            let (rung, need, fits) = match first_fit(snap, candidates, est, &ladder, most) {
                Some(p) => (p.setting, p.need, true),
                None => {
                    let leanest = *ladder.last()?;
                    (leanest, est.least(leanest, most)?, false)
                }
            };
            if seen.contains(&rung) {
                return None;
            }
            seen.push(rung);
            let (description, flags) = if rung == s.setting {
                (s.description, s.flags)
            } else {
                (
                    format!("{}, {}", s.description, rung.describe(s.setting)),
                    format!("{}{}", s.flags, added_flags(rung, s.setting)),
                )
            };
            Some(Alternative {
                description,
                flags,
                check_gpu_flags: s.check_gpu_flags,
                memory_per_gpu_bytes: need.total,
                fits,
            })
        })
        .collect()
}

/// The note after "nothing fits": the first alternative that fits, or that none of what was
/// `tried` (the search's own rungs, then the suggestions) does, and what to use `instead`.
pub(super) fn advise(alternatives: &[Alternative], tried: &str, instead: &str, log: &mut Log) {
    log.notes.push(match alternatives.iter().find(|a| a.fits) {
        Some(a) => format!("plan again with `{}` added to the check-gpu flags ({})", a.check_gpu_flags, a.description),
        None => format!("none of {tried}LoRA, a precomputed reference or activation checkpointing fits: use {instead}"),
    });
}

/// On CPU processes whose requested run does not fit the host's `host` bytes: each suggestion's
/// need per process (its least, at micro-batch 1 or the whole batch in one pass, with any
/// offloaded state, all of it host memory here) and whether `procs` of them fit.
pub(super) fn host_alternatives(est: &Estimator, procs: usize, host: u64) -> Vec<Alternative> {
    let mut seen = vec![Setting::requested(est.req)];
    suggestions(est.req)
        .into_iter()
        .filter_map(|s| {
            if seen.contains(&s.setting) {
                return None;
            }
            seen.push(s.setting);
            let need = est.least(s.setting, procs)?;
            let each = need.total.saturating_add(need.host);
            Some(Alternative {
                description: s.description,
                flags: s.flags,
                check_gpu_flags: s.check_gpu_flags,
                memory_per_gpu_bytes: each,
                fits: each.saturating_mul(procs as u64) <= host,
            })
        })
        .collect()
}

/// The `dpo-train` flags that `s` adds to `base`: checkpointing, the stage, the offload.
fn added_flags(s: Setting, base: Setting) -> String {
    let mut out = String::new();
    if s.checkpointing && !base.checkpointing {
        out.push_str(" --gradient-checkpointing");
    }
    if s.sharding != base.sharding {
        out.push_str(&format!(" --sharding {}", s.sharding.name()));
    }
    if s.offload && !base.offload {
        out.push_str(" --offload-optimizer");
    }
    out
}

/// The settings that lower the need from `req`'s, least intrusive first.
fn suggestions(req: &PlanRequest) -> Vec<Suggestion> {
    let base = Setting::requested(req);
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
