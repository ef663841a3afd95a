//! Step 7, the environment the command runs in: device order and visibility, threads per rank,
//! and the NCCL switches the topology or driver call for.

use std::collections::BTreeMap;

use super::{DeviceIds, Log, PlanRequest};
use crate::snapshot::{Link, P2p, Snapshot, Source};
use crate::topology;
use crate::units::list;

/// The variables to export before the command.
pub(super) fn environment(
    snap: &Snapshot,
    chosen: &[u32],
    req: &PlanRequest,
    log: &mut Log,
) -> BTreeMap<String, String> {
    let w = chosen.len();
    let mut env = BTreeMap::new();
    env.insert("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string());
    let uuids: Option<Vec<String>> = chosen.iter().map(|&i| snap.gpu(i)?.uuid.clone()).collect();
    let visible = match (req.device_ids, uuids) {
        (DeviceIds::Uuid, Some(u)) => u.join(","),
        (DeviceIds::Uuid, None) => {
            log.notes.push("UUIDs unknown for some GPUs: CUDA_VISIBLE_DEVICES uses indices".to_string());
            list(chosen)
        }
        (DeviceIds::Index, _) => list(chosen),
    };
    env.insert("CUDA_VISIBLE_DEVICES".to_string(), visible);
    match rank_cpus(snap, chosen) {
        Some(cpus) => {
            env.insert("OMP_NUM_THREADS".to_string(), (cpus / w as u32).max(1).to_string());
        }
        None => log.notes.push("CPU count unknown: OMP_NUM_THREADS not set".to_string()),
    }
    if w > 1 {
        nccl_switches(snap, chosen, &mut env, log);
    }
    if snap.source == Source::Live {
        match &snap.system.nccl {
            Some(n) if n.version.is_some() => {}
            Some(n) if w > 1 => log.warnings.push(format!(
                "NCCL not found ({}): install torch into the venv or set NCCL_HOME",
                n.error.as_deref().unwrap_or("not found")
            )),
            _ => {}
        }
    }
    env
}

/// The CPUs the ranks' threads share: those close to the chosen GPUs (the union of their CPU
/// affinity lists, where each GPU has one) rather than the whole machine, since two ranks on one
/// NUMA node of a two-socket box would otherwise each start a thread per CPU of both sockets.
fn rank_cpus(snap: &Snapshot, chosen: &[u32]) -> Option<u32> {
    let lists: Option<Vec<Vec<u32>>> =
        chosen.iter().map(|&i| crate::cpulist::parse(snap.gpu(i)?.cpu_affinity.as_deref()?)).collect();
    let near = lists.map(|l| {
        let mut all = l.concat();
        all.sort_unstable();
        all.dedup();
        u32::try_from(all.len()).unwrap_or(u32::MAX)
    });
    match (near.filter(|&n| n > 0), snap.system.cpu_count) {
        (Some(n), Some(machine)) => Some(n.min(machine)),
        (near, machine) => near.or(machine),
    }
}

/// Peer-to-peer off where NVML says it does not work, or for RTX 40xx on old drivers (as
/// accelerate does); a note when the all-reduce crosses NUMA nodes.
fn nccl_switches(snap: &Snapshot, chosen: &[u32], env: &mut BTreeMap<String, String>, log: &mut Log) {
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
        log.warnings.push(format!(
            "GeForce RTX 40xx with driver {} (below 550.40.07): NCCL peer-to-peer can hang; NCCL_P2P_DISABLE=1 and NCCL_IB_DISABLE=1 set (as accelerate does), or upgrade the driver",
            snap.system.driver_version.as_deref().unwrap_or("?")
        ));
    } else if !no_p2p.is_empty() {
        env.insert("NCCL_P2P_DISABLE".to_string(), "1".to_string());
        log.warnings.push(format!(
            "P2P not available between GPUs {}: NCCL_P2P_DISABLE=1 set (traffic goes through host memory)",
            no_p2p.join(", ")
        ));
    }
    let weakest = topology::weakest_link(snap, chosen);
    let nodes: Vec<u32> = topology::numa_groups(snap, chosen).iter().filter_map(|g| g.node).collect();
    if nodes.len() > 1 && !matches!(weakest, Link::NvLink(_)) {
        log.notes.push(format!(
            "the chosen GPUs span NUMA nodes {}: the all-reduce crosses the CPU interconnect (weakest link {weakest})",
            list(&nodes)
        ));
    }
}

/// Parses `550.40.07` into comparable numbers.
pub(super) fn driver_tuple(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.trim().parse().unwrap_or(0)).collect()
}
