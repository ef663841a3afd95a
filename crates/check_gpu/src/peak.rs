//! A bench as reported ([`Summary`]): its measurements beside the nominal per-direction
//! bandwidth of the weakest link among the measured GPUs (a ring all-reduce runs at the speed of
//! its slowest hop), and the warnings that compare the measured bus bandwidth with it.
//!
//! NVLink rates per link and direction, from NVIDIA's totals (bidirectional, all links of one
//! GPU): NVLink 1, P100: 160 GB/s over 4 links = 20 (Pascal P100 whitepaper); NVLink 2, V100:
//! 300 GB/s over 6 links = 25 (Volta V100 whitepaper; Turing's RTX bridges: 100 GB/s over 2);
//! NVLink 3, A100: 600 GB/s over 12 links = 25 (A100 whitepaper); GA102 (RTX A6000 / 3090):
//! 112.5 GB/s over 4 links = 14.0625 (RTX A6000 datasheet); NVLink 4, H100: 900 GB/s over 18
//! links = 25 (H100 whitepaper); NVLink 5, Blackwell: 1.8 TB/s over 18 links = 50 (Blackwell
//! architecture brief). PCIe per lane and direction after line coding: gen1 2.5 GT/s 8b/10b =
//! 0.25 GB/s, gen2 0.5, gen3 8 GT/s 128b/130b = 0.985, gen4 1.969, gen5 3.938 (PCI-SIG).

use serde::{Deserialize, Serialize};

use crate::bench::{BenchRecord, Collective, DeviceSpeed};
use crate::snapshot::{Gpu, Link, Snapshot};
use crate::topology;

/// The hardware ceiling busbw is compared with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NominalPeak {
    /// GB/s per direction (1e9 bytes).
    pub gbps: f64,
    /// The weakest link among the GPUs (`NV12`, `PHB`, `SYS`, ...).
    pub link: Link,
    /// How the number was derived, for the report.
    pub how: String,
}

/// One table row: a measurement with its bandwidths, for the text and `--json` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub op: Collective,
    pub bytes: u64,
    pub seconds: f64,
    pub correct: bool,
    /// GB/s (1e9 bytes).
    pub algbw_gbps: f64,
    /// GB/s (1e9 bytes).
    pub busbw_gbps: f64,
}

/// The bench as reported: measurements with their bandwidths and the nominal peak.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub backend: String,
    pub world_size: usize,
    /// GPUs measured (NVML indices); empty for CPU processes.
    pub gpus: Vec<u32>,
    pub devices: Vec<DeviceSpeed>,
    /// By collective, then size.
    pub collectives: Vec<Row>,
    /// The weakest link's nominal per-direction peak; `None` when unknown.
    pub nominal_peak: Option<NominalPeak>,
    /// Why there is no nominal peak.
    pub no_peak_reason: Option<String>,
}

impl Summary {
    /// The summary of a bench next to the nominal peak of its links (or why there is none;
    /// [`summarize`] finds it in a snapshot).
    pub fn new(rec: &BenchRecord, peak: Result<NominalPeak, String>) -> Summary {
        let b = &rec.bench;
        let collectives = Collective::ALL
            .iter()
            .flat_map(|&op| b.of(op))
            .map(|m| Row {
                op: m.op,
                bytes: m.bytes,
                seconds: m.seconds,
                correct: m.correct,
                algbw_gbps: m.algbw(),
                busbw_gbps: m.busbw(b.world_size),
            })
            .collect();
        let (nominal_peak, no_peak_reason) = match peak {
            Ok(p) => (Some(p), None),
            Err(reason) => (None, Some(reason)),
        };
        Summary {
            backend: b.backend.clone(),
            world_size: b.world_size,
            gpus: rec.gpus.clone(),
            devices: b.devices.clone(),
            collectives,
            nominal_peak,
            no_peak_reason,
        }
    }
}

/// The reason given when the bench ran over CPU processes.
pub const NO_CPU_PEAK: &str = "no nominal peak for CPU processes";

/// Nominal peak of the weakest link among `gpus`; `Err` says why there is none.
pub fn nominal_peak(snap: &Snapshot, gpus: &[u32]) -> Result<NominalPeak, String> {
    if gpus.is_empty() {
        return Err(NO_CPU_PEAK.to_string());
    }
    if gpus.len() < 2 {
        return Err("one GPU: no link to compare with".to_string());
    }
    let link = topology::weakest_link(snap, gpus);
    let members: Vec<&Gpu> = gpus.iter().filter_map(|&i| snap.gpu(i)).collect();
    match link {
        Link::NvLink(n) => nvlink_peak(&members, n).map(|(gbps, how)| NominalPeak { gbps, link, how }),
        Link::Pix | Link::Pxb | Link::Phb | Link::Node | Link::Sys => {
            let (gbps, how) = pcie_peak(&members)?;
            // Across sockets the traffic also crosses the CPU interconnect, which can be the
            // slower hop; PCIe is then an upper bound, not the rate to expect.
            let how = if link == Link::Sys { format!("{how}; the CPU interconnect may be slower") } else { how };
            Ok(NominalPeak { gbps, link, how })
        }
        Link::SelfLink | Link::Unknown => Err("the link between the GPUs is unknown: no nominal peak".to_string()),
    }
}

/// `n` bonded NVLinks at the per-link rate of the GPUs' generation, which the snapshot does not
/// record: it follows from the compute capability (6.0 NVLink 1, 7.x 2, 8.0 3, 8.6 GA102's
/// bridge, 9.0 4, 10.x 5).
fn nvlink_peak(gpus: &[&Gpu], n: u32) -> Result<(f64, String), String> {
    let cc = gpus.iter().filter_map(|g| g.compute_capability_pair()).min();
    let Some((major, minor)) = cc else {
        return Err("NVLink generation unknown (no compute capability): no nominal peak".to_string());
    };
    let (per_link, generation) = match (major, minor) {
        (6, 0) => (20.0, "NVLink 1"),
        (7, _) => (25.0, "NVLink 2"),
        (8, 0) => (25.0, "NVLink 3"),
        (8, 6) => (14.0625, "NVLink 3, GA102 bridge"),
        (9, 0) => (25.0, "NVLink 4"),
        (10, _) => (50.0, "NVLink 5"),
        _ => return Err(format!("no known NVLink rate for compute capability {major}.{minor}: no nominal peak")),
    };
    let gbps = per_link * f64::from(n);
    Ok((gbps, format!("{n} links x {per_link} GB/s ({generation}, from compute capability {major}.{minor})")))
}

/// The slowest PCIe link among the GPUs: its generation (the maximum: a lower current one is
/// idle power saving) times its trained width.
fn pcie_peak(gpus: &[&Gpu]) -> Result<(f64, String), String> {
    let mut best: Option<(f64, u32, u32)> = None;
    for g in gpus {
        let p = &g.pcie;
        let (Some(generation), Some(width)) = (p.gen_max.or(p.gen_current), p.width_current.or(p.width_max)) else {
            return Err(format!("{}: PCIe generation or width unknown: no nominal peak", g.label()));
        };
        let per_lane = match generation {
            1 => 0.25,
            2 => 0.5,
            3 => 0.985,
            4 => 1.969,
            5 => 3.938,
            _ => return Err(format!("{}: no known rate for PCIe gen {generation}: no nominal peak", g.label())),
        };
        let gbps = per_lane * f64::from(width);
        if best.is_none_or(|(b, _, _)| gbps < b) {
            best = Some((gbps, generation, width));
        }
    }
    let (gbps, generation, width) = best.ok_or_else(|| "no GPU details: no nominal peak".to_string())?;
    Ok((gbps, format!("PCIe gen{generation} x{width}")))
}

/// What the bench says is wrong: wrong results, and a bus bandwidth at the largest size below
/// half the nominal peak (NCCL reaches 70-90% of it on a healthy machine; half means a
/// misconfiguration such as P2P disabled, a degraded link or traffic through the CPU).
pub fn warnings(rec: &BenchRecord, peak: Option<&NominalPeak>) -> Vec<String> {
    let b = &rec.bench;
    let mut out = Vec::new();
    for op in Collective::ALL {
        let wrong: Vec<String> =
            b.of(op).iter().filter(|m| !m.correct).map(|m| crate::bench::size_label(m.bytes)).collect();
        if !wrong.is_empty() {
            out.push(format!(
                "{} over {} returned wrong values at {}: do not train on this setup",
                op.name(),
                b.backend,
                wrong.join(", ")
            ));
        }
        if let (Some(p), Some(m)) = (peak, b.largest(op))
            && b.world_size >= 2
            && m.busbw(b.world_size) < p.gbps / 2.0
        {
            out.push(format!(
                "{} bus bandwidth {:.1} GB/s at {} is below half the nominal {:.1} GB/s of the weakest link ({}: {})",
                op.name(),
                m.busbw(b.world_size),
                crate::bench::size_label(m.bytes),
                p.gbps,
                p.link,
                p.how
            ));
        }
    }
    out
}

/// The summary of `rec`, with the nominal peak of its GPUs' links from `snap`.
pub fn summarize(rec: &BenchRecord, snap: Option<&Snapshot>) -> Summary {
    let peak = match snap {
        Some(s) => nominal_peak(s, &rec.gpus),
        None if rec.gpus.is_empty() => Err(NO_CPU_PEAK.to_string()),
        None => Err("no topology of the GPUs: no nominal peak".to_string()),
    };
    Summary::new(rec, peak)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{Bench, Measurement};
    use crate::snapshot::{Pair, Pcie, Source};

    fn machine(cc: &str, link: Link, pcie: (u32, u32)) -> Snapshot {
        let mut s = Snapshot::new(Source::NvidiaSmi);
        let pcie =
            Pcie { gen_current: Some(1), gen_max: Some(pcie.0), width_current: Some(pcie.1), width_max: Some(16) };
        s.gpus = (0..2)
            .map(|i| Gpu { index: i, compute_capability: Some(cc.into()), pcie: pcie.clone(), ..Gpu::default() })
            .collect();
        s.pairs = vec![Pair { a: 0, b: 1, link, nvlinks: None, p2p_read: None, p2p_write: None, p2p_nvlink: None }];
        s
    }

    #[test]
    fn nvlink_by_generation() {
        let p = nominal_peak(&machine("8.0", Link::NvLink(12), (4, 16)), &[0, 1]).expect("peak");
        assert_eq!(p.gbps, 300.0);
        assert_eq!(p.how, "12 links x 25 GB/s (NVLink 3, from compute capability 8.0)");
        assert_eq!(nominal_peak(&machine("9.0", Link::NvLink(18), (5, 16)), &[0, 1]).expect("h100").gbps, 450.0);
        assert_eq!(nominal_peak(&machine("10.0", Link::NvLink(18), (5, 16)), &[0, 1]).expect("b200").gbps, 900.0);
        assert_eq!(nominal_peak(&machine("7.0", Link::NvLink(2), (3, 16)), &[0, 1]).expect("v100").gbps, 50.0);
        assert_eq!(nominal_peak(&machine("8.6", Link::NvLink(4), (4, 16)), &[0, 1]).expect("a6000").gbps, 56.25);
        let err = nominal_peak(&machine("8.9", Link::NvLink(4), (4, 16)), &[0, 1]).expect_err("no NVLink on Ada");
        assert_eq!(err, "no known NVLink rate for compute capability 8.9: no nominal peak");
    }

    #[test]
    fn pcie_uses_max_generation_and_trained_width() {
        let p = nominal_peak(&machine("8.0", Link::Phb, (4, 16)), &[0, 1]).expect("peak");
        assert!((p.gbps - 31.504).abs() < 1e-9, "{}", p.gbps);
        assert_eq!(p.how, "PCIe gen4 x16");
        let p = nominal_peak(&machine("7.5", Link::Sys, (3, 8)), &[0, 1]).expect("peak");
        assert!((p.gbps - 7.88).abs() < 1e-9, "{}", p.gbps);
        assert_eq!(p.how, "PCIe gen3 x8; the CPU interconnect may be slower");
        assert_eq!(nominal_peak(&machine("8.0", Link::Phb, (4, 16)), &[]).expect_err("cpu"), NO_CPU_PEAK);
        assert!(nominal_peak(&machine("8.0", Link::Unknown, (4, 16)), &[0, 1]).is_err());
        assert!(nominal_peak(&machine("8.0", Link::Phb, (4, 16)), &[0]).is_err());
    }

    #[test]
    fn warns_below_half_and_on_wrong_results() {
        let mib = 1u64 << 20;
        let rec = BenchRecord {
            gpus: vec![0, 1],
            bench: Bench {
                backend: "nccl".into(),
                world_size: 2,
                devices: Vec::new(),
                collectives: vec![
                    // 1 GiB in 0.1 s: 10.737 GB/s bus bandwidth at n = 2, below 31.504 / 2.
                    Measurement { op: Collective::AllReduce, bytes: 1 << 30, seconds: 0.1, correct: true },
                    // 41.9 GB/s at the largest size: above half, but wrong at 4 MiB.
                    Measurement { op: Collective::AllGather, bytes: 4 * mib, seconds: 1.0, correct: false },
                    Measurement { op: Collective::AllGather, bytes: 16 * mib, seconds: 0.0002, correct: true },
                ],
            },
        };
        let peak = nominal_peak(&machine("8.0", Link::Phb, (4, 16)), &[0, 1]).expect("peak");
        let w = warnings(&rec, Some(&peak));
        assert_eq!(
            w,
            vec![
                "all_reduce bus bandwidth 10.7 GB/s at 1 GiB is below half the nominal 31.5 GB/s of the weakest link (PHB: PCIe gen4 x16)".to_string(),
                "all_gather over nccl returned wrong values at 4 MiB: do not train on this setup".to_string(),
            ]
        );
        assert_eq!(warnings(&rec, None).len(), 1, "without a peak only the wrong values warn");
    }
}
