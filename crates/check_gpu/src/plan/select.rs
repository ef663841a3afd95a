//! Which GPUs train: the healthy ones (no MIG, not busy, no ECC faults, full PCIe width, no
//! hardware throttling), of the most common model, as many as the batch allows, chosen to keep
//! the all-reduce on the best links (one NVLink island, else one NUMA node or one socket's CPU
//! affinity, else the best weakest link).

use std::collections::BTreeMap;

use super::{BUSY_BYTES, Excluded, Log, PlanRequest};
use crate::snapshot::{Gpu, Snapshot};
use crate::topology;
use crate::units::{bytes, list};

/// Steps 1 and 2: the healthy GPUs of the majority model; the rest are excluded with a reason.
pub(super) fn usable(snap: &Snapshot, log: &mut Log) -> Vec<u32> {
    let mut healthy = Vec::new();
    for g in &snap.gpus {
        let reasons = health_reasons(g);
        if reasons.is_empty() {
            healthy.push(g.index);
        } else {
            log.excluded.push(Excluded { index: g.index, reason: reasons.join("; ") });
        }
        let soft: Vec<&str> = g
            .throttle_reasons
            .iter()
            .flatten()
            .map(String::as_str)
            .filter(|r| *r == "sw_thermal_slowdown" || *r == "sw_power_cap")
            .collect();
        if !soft.is_empty() && g.utilization_gpu_pct.unwrap_or(0) > 0 {
            log.notes.push(format!("{} is throttled by software ({})", g.label(), soft.join(", ")));
        }
    }
    let (candidates, mixed) = split_by_model(snap, &healthy);
    log.excluded.extend(mixed);
    candidates
}

/// The world size `n` usable GPUs give: capped by `--world-size` and by the global batch, each GPU
/// given at least the loss's smallest micro-batch (KTO's 2 rows).
pub(super) fn world_size(n: usize, req: &PlanRequest) -> usize {
    let ranks = (req.global_batch.max(1) / req.min_micro_batch()).max(1);
    let w = n.min(usize::try_from(ranks).unwrap_or(usize::MAX));
    req.max_world_size.map_or(w, |max| w.min(max.max(1)))
}

/// Step 5: the world size (usable GPUs, capped by `--world-size`, by the global batch and by
/// `cap`, the GPUs step 4 sized a sharded estimate for) and which GPUs.
pub(super) fn world(
    snap: &Snapshot,
    candidates: &[u32],
    req: &PlanRequest,
    cap: Option<usize>,
    log: &mut Log,
) -> Vec<u32> {
    let global = req.global_batch.max(1);
    let n = candidates.len();
    let w = world_size(n, req).min(cap.unwrap_or(usize::MAX));
    let min_micro = req.min_micro_batch();
    if w < n && w as u64 == (global / min_micro).max(1) {
        let each = if min_micro == 1 { "one pair".to_owned() } else { format!("at least {min_micro} rows") };
        log.notes.push(format!(
            "the global batch of {global} is too small for the {n} usable GPUs: world size {w}, {each} per GPU"
        ));
    }
    if w == 0 { Vec::new() } else { choose_subset(snap, candidates, w, &mut log.notes) }
}

/// Why a GPU should not train, from its own state (not memory or model mix).
pub(super) fn health_reasons(g: &Gpu) -> Vec<String> {
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
        // No process listed: containers often cannot see other PIDs, so memory in use is the
        // sign of another job, as when processes are unknown.
        Some(_) | None => {
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
pub(super) fn split_by_model(snap: &Snapshot, candidates: &[u32]) -> (Vec<u32>, Vec<Excluded>) {
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
/// one NUMA node, else anywhere; within that, the best-connected `w` ([`best_connected`]), and
/// of several islands or nodes large enough, the one whose `w` are best connected.
pub(super) fn choose_subset(snap: &Snapshot, candidates: &[u32], w: usize, notes: &mut Vec<String>) -> Vec<u32> {
    if w >= candidates.len() {
        return candidates.to_vec();
    }
    // Of pools of GPUs each with its label, the one whose `w` are best connected.
    let best_in = |pools: Vec<(String, Vec<u32>)>| {
        let picks = pools.into_iter().filter(|(_, p)| p.len() >= w).map(|(label, p)| {
            let (score, chosen) = best_connected(snap, &p, w);
            (score, chosen, format!("{label}: GPUs {}", list(&p)))
        });
        picks.reduce(|a, b| if b.0 > a.0 { b } else { a })
    };
    let islands = topology::nvlink_islands(snap, candidates).into_iter().map(|i| ("one NVLink island".to_owned(), i));
    let nodes = topology::numa_groups(snap, candidates).into_iter();
    let nodes = nodes.filter_map(|g| g.node.map(|n| (format!("NUMA node {n}"), g.gpus)));
    for pools in [islands.collect(), nodes.collect(), same_cpus(snap, candidates)] {
        if let Some((_, chosen, kept)) = best_in(pools) {
            notes.push(format!("kept to {kept}"));
            return chosen;
        }
    }
    best_connected(snap, candidates, w).1
}

/// The GPUs of `candidates` whose NUMA node is unknown, grouped by their CPU affinity: a driver
/// without the `NUMA Affinity` column still places each GPU by its socket's CPUs.
fn same_cpus(snap: &Snapshot, candidates: &[u32]) -> Vec<(String, Vec<u32>)> {
    let mut by_cpus: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for g in candidates.iter().filter_map(|&i| snap.gpu(i)).filter(|g| g.numa_node.is_none()) {
        if let Some(cpus) = g.cpu_affinity.as_deref() {
            by_cpus.entry(cpus).or_default().push(g.index);
        }
    }
    by_cpus.into_iter().map(|(cpus, gpus)| (format!("the GPUs local to CPUs {cpus}"), gpus)).collect()
}

/// The `w` GPUs of `pool` (`w <= pool.len()`) with the best weakest link between any two, then
/// the best links in all (a sum of [`Link::rank`]s), then the lowest indices: greedily from each
/// GPU in turn, adding the one best linked to those chosen. Returns the score and the GPUs, sorted.
fn best_connected(snap: &Snapshot, pool: &[u32], w: usize) -> ((u32, u32), Vec<u32>) {
    let score = |gpus: &[u32]| {
        let pairs = gpus.iter().enumerate().flat_map(|(k, &a)| gpus[k + 1..].iter().map(move |&b| (a, b)));
        (topology::weakest_link(snap, gpus).rank(), pairs.map(|(a, b)| snap.link(a, b).rank()).sum::<u32>())
    };
    let mut best: Option<((u32, u32), Vec<u32>)> = None;
    for &start in pool {
        let mut chosen = vec![start];
        while chosen.len() < w {
            let next = pool.iter().filter(|c| !chosen.contains(c)).max_by_key(|&&c| {
                let links = chosen.iter().map(|&x| snap.link(x, c).rank());
                (links.clone().min().unwrap_or(0), links.sum::<u32>(), std::cmp::Reverse(c))
            });
            match next {
                Some(&c) => chosen.push(c),
                None => break,
            }
        }
        chosen.sort_unstable();
        let s = score(&chosen);
        if best.as_ref().is_none_or(|(b, c)| s > *b || (s == *b && chosen < *c)) {
            best = Some((s, chosen));
        }
    }
    best.unwrap_or_else(|| ((0, 0), pool[..w].to_vec()))
}
