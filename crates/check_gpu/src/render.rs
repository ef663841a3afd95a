//! Output: a readable report (coloured only on a terminal, `NO_COLOR` respected) and one JSON
//! object for `--json`. Both render the same [`Snapshot`] and [`Plan`], and the bench the
//! snapshot carries (as nccl-tests prints it, with the link's nominal peak). The memory terms
//! and their formulas are in [`terms`].

use std::fmt::Write as _;

use serde::Serialize;

mod terms;

use crate::bench::{self, size_label};
use crate::memory::{FineTune, Reference};
use crate::peak::{self, Summary};
use crate::plan::{Plan, Status};
use crate::snapshot::{Snapshot, Source};
use crate::units::{bytes, count, list};

/// ANSI styling, or none.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
}

impl Style {
    /// Colour when stdout is a terminal and `NO_COLOR` is unset or empty.
    pub fn detect() -> Style {
        use std::io::IsTerminal;
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style { color: std::io::stdout().is_terminal() && !no_color }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.color { format!("\u{1b}[{code}m{text}\u{1b}[0m") } else { text.to_string() }
    }
    fn bold(self, t: &str) -> String {
        self.paint("1", t)
    }
    fn green(self, t: &str) -> String {
        self.paint("32", t)
    }
    fn yellow(self, t: &str) -> String {
        self.paint("33", t)
    }
    fn red(self, t: &str) -> String {
        self.paint("31", t)
    }
}

/// The `--json` object: the plan's keys at the top level, the bench with its bandwidths, and
/// the snapshot it came from.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    plan: &'a Plan,
    bench: Option<Summary>,
    snapshot: Option<&'a Snapshot>,
}

/// One JSON object, pretty-printed.
pub fn json(snap: Option<&Snapshot>, plan: &Plan) -> String {
    let bench = snap.and_then(|s| s.bench.as_ref().map(|b| peak::summarize(b, Some(s))));
    // Serializing plain structs of strings, numbers and maps cannot fail.
    serde_json::to_string_pretty(&Report { plan, bench, snapshot: snap })
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// The bench: one nccl-tests table per collective (`#wrong` is 0 or `>0`: the measuring side
/// reports whether any element was wrong, not how many), each device's copy and matmul speed,
/// and the nominal peak of the weakest link.
pub fn bench_text(b: &Summary, st: Style) -> String {
    let mut o = String::new();
    let over = if b.gpus.is_empty() {
        format!("{} CPU process(es)", b.world_size)
    } else {
        format!("GPU(s) {}", list(&b.gpus))
    };
    let _ = writeln!(o, "\n{}", st.bold(&format!("Bench ({} over {over}, dpo-train bench-comm)", b.backend)));
    for op in crate::bench::Collective::ALL {
        let rows: Vec<_> = b.collectives.iter().filter(|r| r.op == op).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            o,
            "  {:<16} {:>12} {:>10} {:>12} {:>12} {:>7}",
            op.name(),
            "size(B)",
            "time(us)",
            "algbw(GB/s)",
            "busbw(GB/s)",
            "#wrong"
        );
        for r in rows {
            let wrong = if r.correct { "0".to_string() } else { st.red(">0") };
            let _ = writeln!(
                o,
                "  {:<16} {:>12} {:>10.1} {:>12.2} {:>12.2} {:>7}",
                size_label(r.bytes),
                r.bytes,
                r.seconds * 1e6,
                r.algbw_gbps,
                r.busbw_gbps,
                wrong
            );
        }
    }
    if !b.devices.is_empty() {
        let _ = writeln!(o, "  {:<16} {:>12} {:>16}", "device", "copy(GB/s)", "matmul(TFLOP/s)");
        for d in &b.devices {
            // Below 0.01 (a CPU's bf16 without matrix units) two decimals would print 0.00.
            let rate = match d.matmul_tflops {
                t if t > 0.0 && t < 0.01 => format!("{t:.1e}"),
                t => format!("{t:.2}"),
            };
            let _ = writeln!(o, "  {:<16} {:>12.1} {:>11} {}", d.device, d.copy_gbps, rate, d.matmul_dtype);
        }
    }
    match (&b.nominal_peak, &b.no_peak_reason) {
        (Some(p), _) => {
            let _ = writeln!(
                o,
                "  nominal peak     {:.1} GB/s per direction over the weakest link {} ({})",
                p.gbps, p.link, p.how
            );
        }
        (None, reason) => {
            let _ = writeln!(o, "  nominal peak     none: {}", reason.as_deref().unwrap_or("unknown"));
        }
    }
    o
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "?".to_string(), |v| v.to_string())
}

fn pad(s: &str, w: usize) -> String {
    format!("{s:<w$}")
}

/// The machine part: system line, GPU table, topology matrix, islands and NUMA groups.
pub fn snapshot_text(snap: &Snapshot, plan: &Plan, st: Style) -> String {
    let mut o = String::new();
    system_lines(&mut o, snap, st);
    if snap.gpus.is_empty() {
        // A snapshot of a machine without GPUs (one saved with a CPU bench): nothing to tabulate.
        return o;
    }
    gpu_table(&mut o, snap, plan, st);
    if !shows_matrix(snap) {
        // No matrix (CSV only, or one GPU without affinities): the islands and groups still need
        // their heading.
        let _ = writeln!(o, "\n{}", st.bold("Topology"));
    }
    topology_matrix(&mut o, snap, st);
    let t = &plan.topology;
    let islands = if !t.links_known {
        "unknown (no --topo)".to_string()
    } else if t.nvlink_islands.is_empty() {
        "none".to_string()
    } else {
        t.nvlink_islands.iter().map(|i| format!("[{}]", list(i))).collect::<Vec<_>>().join(" ")
    };
    let numa = t
        .numa_groups
        .iter()
        .map(|g| format!("node {}: [{}]", opt(g.node), list(&g.gpus)))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(o, "  NVLink islands: {islands}");
    let _ = writeln!(o, "  NUMA groups: {numa}");
    o
}

/// Where the snapshot came from, versions, NCCL, the environment and failed probes.
fn system_lines(o: &mut String, snap: &Snapshot, st: Style) {
    let source = match snap.source {
        Source::Live => "live NVML probe",
        Source::NvidiaSmi => "nvidia-smi output",
    };
    let s = &snap.system;
    let versions = match snap.source {
        Source::Live => format!(
            "driver {}, CUDA {}, NVML {}",
            opt(s.driver_version.as_deref()),
            opt(s.cuda_driver_version.as_deref()),
            opt(s.nvml_version.as_deref())
        ),
        Source::NvidiaSmi => format!("driver {}", opt(s.driver_version.as_deref())),
    };
    let _ = writeln!(o, "{} {} GPU(s) from {source}; {versions}", st.bold("check-gpu:"), snap.gpus.len());
    if let Some(n) = &s.nccl {
        match (&n.version, &n.path) {
            (Some(v), Some(p)) => {
                let _ = writeln!(o, "NCCL {v} ({p})");
            }
            _ => {
                let _ = writeln!(o, "NCCL not found: {}", n.error.as_deref().unwrap_or("no libnccl.so.2"));
            }
        }
    }
    if snap.source == Source::Live {
        if s.env.is_empty() {
            let _ = writeln!(o, "environment: no NCCL_*, CUDA_* or OMP_NUM_THREADS variable set");
        } else {
            let vars: Vec<String> = s.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(o, "environment: {}", vars.join(" "));
        }
    }

    if !snap.probe_notes.is_empty() {
        let _ = writeln!(o, "probe: {} NVML call(s) failed, those fields show `?`:", snap.probe_notes.len());
        for n in &snap.probe_notes {
            let _ = writeln!(o, "  {n}");
        }
    }
}

/// One row per GPU, and a line of details under it.
fn gpu_table(o: &mut String, snap: &Snapshot, plan: &Plan, st: Style) {
    let _ = writeln!(o, "\n{}", st.bold("GPUs"));
    let header = format!(
        "  {:>3}  {:<26} {:>17}  {:>4}  {:<12} {:>4}  {:<15} {:>5} {:>13} {:>5}  {}",
        "#", "name", "free / total", "cc", "PCIe now/max", "NUMA", "CPU affinity", "temp", "power", "util", "state"
    );
    let _ = writeln!(o, "{header}");
    for g in &snap.gpus {
        let mem = match (g.memory_free_bytes, g.memory_total_bytes) {
            (Some(f), Some(t)) => format!("{} / {}", bytes(f).replace(" GiB", ""), bytes(t)),
            (None, Some(t)) => format!("? / {}", bytes(t)),
            _ => "?".to_string(),
        };
        let p = &g.pcie;
        let link = |gen_: Option<u32>, w: Option<u32>| format!("{}x{}", opt(gen_), opt(w));
        let pcie = format!("{}/{}", link(p.gen_current, p.width_current), link(p.gen_max, p.width_max));
        let power = match (g.power_draw_w, g.power_limit_w) {
            (Some(d), Some(l)) => format!("{d:.0}/{l:.0} W"),
            (Some(d), None) => format!("{d:.0} W"),
            _ => "?".to_string(),
        };
        let state = match plan.excluded.iter().find(|e| e.index == g.index) {
            Some(e) => st.red(&format!("excluded: {}", e.reason.split(';').next().unwrap_or(""))),
            None if plan.gpus.contains(&g.index) => st.green("selected"),
            None => "spare".to_string(),
        };
        let name: String = g.name.as_deref().unwrap_or("?").chars().take(26).collect();
        let _ = writeln!(
            o,
            "  {:>3}  {:<26} {:>17}  {:>4}  {:<12} {:>4}  {:<15} {:>5} {:>13} {:>5}  {}",
            g.index,
            name,
            mem,
            opt(g.compute_capability.as_deref()),
            pcie,
            opt(g.numa_node),
            g.cpu_affinity.as_deref().unwrap_or("?"),
            g.temperature_c.map_or("?".to_string(), |t| format!("{t}C")),
            power,
            g.utilization_gpu_pct.map_or("?".to_string(), |u| format!("{u}%")),
            state
        );
        let extra = gpu_details(g);
        if !extra.is_empty() {
            let _ = writeln!(o, "       {}", extra.join(" | "));
        }
    }
}

/// Architecture, ids and health of a GPU, for the line under its row.
fn gpu_details(g: &crate::snapshot::Gpu) -> Vec<String> {
    let mut extra = Vec::new();
    if let Some(a) = &g.architecture {
        extra.push(a.clone());
    }
    if let Some(u) = &g.uuid {
        extra.push(u.clone());
    }
    if let Some(b) = &g.pci_bus_id {
        extra.push(b.clone());
    }
    if let Some(m) = g.mig_enabled {
        extra.push(format!("MIG {}", if m { "on" } else { "off" }));
    }
    if let Some(pm) = g.persistence_mode {
        extra.push(format!("persistence {}", if pm { "on" } else { "off" }));
    }
    if let Some(e) = g.ecc_enabled {
        let errs = g.ecc_uncorrected_volatile.map_or(String::new(), |n| format!(", {n} uncorrectable"));
        extra.push(format!("ECC {}{errs}", if e { "on" } else { "off" }));
    }
    if let Some(t) = &g.throttle_reasons
        && !t.is_empty()
    {
        extra.push(format!("throttle: {}", t.join(",")));
    }
    if let Some(ps) = &g.processes
        && !ps.is_empty()
    {
        let v: Vec<String> =
            ps.iter().map(|p| format!("pid {} {}", p.pid, p.used_memory_bytes.map_or("?".into(), bytes))).collect();
        extra.push(format!("processes: {}", v.join(", ")));
    }
    extra
}

/// The link matrix as `nvidia-smi topo -m` prints it, and P2P support.
/// Whether the topology matrix is shown: with links between GPUs, or for one GPU with its CPU
/// or NUMA affinity.
fn shows_matrix(snap: &Snapshot) -> bool {
    let placed = |g: &crate::snapshot::Gpu| g.cpu_affinity.is_some() || g.numa_node.is_some();
    !snap.pairs.is_empty() || (snap.gpus.len() == 1 && snap.gpus.iter().any(placed))
}

fn topology_matrix(o: &mut String, snap: &Snapshot, st: Style) {
    if !shows_matrix(snap) {
        return;
    }
    let _ = writeln!(o, "\n{}", st.bold("Topology (nvidia-smi topo -m legend)"));
    let mut head = String::from("        ");
    for g in &snap.gpus {
        head.push_str(&pad(&format!("GPU{}", g.index), 6));
    }
    // The affinity column as wide as its longest list (a list of every other core runs long).
    let affinity = |g: &crate::snapshot::Gpu| g.cpu_affinity.clone().unwrap_or_else(|| "N/A".to_owned());
    let width = snap.gpus.iter().map(|g| affinity(g).len() + 2).max().unwrap_or(0).max(17);
    head.push_str(&pad("CPU Affinity", width));
    head.push_str("NUMA");
    let _ = writeln!(o, "{}", head.trim_end());
    for a in &snap.gpus {
        let mut row = pad(&format!("  GPU{}", a.index), 8);
        for b in &snap.gpus {
            row.push_str(&pad(&snap.link(a.index, b.index).to_string(), 6));
        }
        row.push_str(&pad(&affinity(a), width));
        row.push_str(&opt(a.numa_node));
        let _ = writeln!(o, "{row}");
    }
    let p2p: Vec<String> =
        snap.pairs.iter().filter_map(|p| p.p2p_read.map(|s| format!("{}-{} {:?}", p.a, p.b, s))).collect();
    if !p2p.is_empty() {
        let _ = writeln!(o, "  P2P read: {}", p2p.join(", "));
    }
}

/// The plan part: verdict, GPUs, batch split, memory, warnings and the command.
pub fn plan_text(plan: &Plan, st: Style) -> String {
    let mut o = String::new();
    setup_lines(&mut o, plan, st);
    o.push_str(&memory_text(plan, st));
    advice_lines(&mut o, plan, st);
    o
}

/// The memory per rank, term by term, and what would fit instead (the CPU fallback's part).
pub fn memory_text(plan: &Plan, st: Style) -> String {
    let mut o = String::new();
    terms::memory_lines(&mut o, plan, st);
    o
}

/// Status, GPUs, model, what trains and the batch split.
fn setup_lines(o: &mut String, plan: &Plan, st: Style) {
    let status = match plan.status {
        Status::Ready => st.green("ready"),
        Status::ReadyWithWarnings => st.yellow("ready with warnings"),
        Status::NotReady => st.red("not ready"),
    };
    let _ = writeln!(o, "\n{}", st.bold("Plan"));
    let _ = writeln!(o, "  status       {status}");
    if plan.world_size > 0 {
        let _ = writeln!(o, "  GPUs         {} (world size {})", list(&plan.gpus), plan.world_size);
    }
    for e in &plan.excluded {
        let _ = writeln!(o, "  {}  GPU {}: {}", st.red("excluded"), e.index, e.reason);
    }
    if let Some(m) = &plan.model {
        let _ = writeln!(
            o,
            "  model        {} parameters ({}; h {}, {} layers, {} heads / {} kv, vocab {})",
            count(m.params),
            m.source,
            m.hidden_size,
            m.num_layers,
            m.num_heads,
            m.num_kv_heads,
            m.vocab_size
        );
    }
    let ft = match plan.finetune {
        FineTune::Full => "full fine-tuning".to_string(),
        FineTune::Lora { rank } => format!("LoRA rank {rank} on q,k,v,o"),
    };
    let reference = match (plan.finetune, plan.reference) {
        (_, Reference::None) => "no reference model (a reference-free loss)",
        (FineTune::Lora { .. }, _) => "reference = base model with the adapter disabled",
        (_, Reference::Keep) => "reference model kept on each GPU",
        (_, Reference::Precompute) => "reference log-probs precomputed",
    };
    let ckpt = if plan.gradient_checkpointing { ", activation checkpointing" } else { "" };
    let _ = writeln!(o, "  training     {ft}, {}, {reference}, max length {}{ckpt}", plan.dtype.name(), plan.seq_len);
    if plan.world_size > 0 || plan.memory.is_some() {
        let _ = writeln!(o, "  sharding     {}", terms::sharding_line(plan));
    }
    if plan.world_size > 0 {
        let _ = writeln!(
            o,
            "  batch        micro-batch {} x {} GPU(s) x accumulation {} = global batch {}{}",
            plan.micro_batch,
            plan.world_size,
            plan.grad_accum,
            plan.global_batch,
            if plan.global_batch != plan.requested_global_batch {
                format!(" (requested {})", plan.requested_global_batch)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            o,
            "  lr scale     linear x{:.3}, sqrt x{:.3} (for a learning rate tuned at global batch {})",
            plan.lr_scale.linear, plan.lr_scale.sqrt, plan.lr_scale.base_batch
        );
    }
    if let Some(c) = &plan.communication {
        let _ = writeln!(o, "  {}", communication_line(c));
    }
}

/// `communication ~0.42 s per optimizer step: 3.1 GB of gradients all-reduced at 14.8 GB/s
/// measured bus bandwidth (nccl, 16 MiB messages)`; under ZeRO each collective in turn, e.g.
/// `... under zero3: 8 x 3.1 GB of weights all-gathered at 20.1 GB/s + 4 x ...`.
pub fn communication_line(c: &crate::plan::comm::Communication) -> String {
    let s = c.seconds_per_step;
    let time = if s >= 0.1 { format!("{s:.2} s") } else { format!("{:.1} ms", s * 1e3) };
    let gb = |b: u64| {
        let b = b as f64;
        if b >= 1e9 { format!("{:.1} GB", b / 1e9) } else { format!("{:.1} MB", b / 1e6) }
    };
    let at = c.transfers.first().map_or(0, |t| t.measured_at_bytes);
    // One message size for all, said once at the end; else each collective's beside it.
    let one_size = c.transfers.iter().all(|t| t.measured_at_bytes == at);
    let parts: Vec<String> = c
        .transfers
        .iter()
        .map(|t| {
            let times = if t.calls > 1 { format!("{} x ", t.calls) } else { String::new() };
            let verb = match t.collective {
                bench::Collective::AllReduce => "all-reduced",
                bench::Collective::AllGather => "all-gathered",
                bench::Collective::ReduceScatter => "reduce-scattered",
            };
            let size = if one_size { String::new() } else { format!(" ({})", size_label(t.measured_at_bytes)) };
            format!("{times}{} of {} {verb} at {:.1} GB/s{size}", gb(t.bytes), t.what, t.busbw_gbps)
        })
        .collect();
    let stage = match c.sharding {
        crate::memory::Sharding::None => String::new(),
        stage => format!(" under {}", stage.name()),
    };
    let messages = if one_size { format!(", {} messages", size_label(at)) } else { String::new() };
    format!(
        "communication ~{time} per optimizer step{stage}: {} measured bus bandwidth ({}{messages})",
        parts.join(" + "),
        c.backend,
    )
}

/// Warnings, notes and the command to run.
fn advice_lines(o: &mut String, plan: &Plan, st: Style) {
    if !plan.warnings.is_empty() {
        let _ = writeln!(o, "\n{}", st.bold("Warnings"));
        for w in &plan.warnings {
            let _ = writeln!(o, "  {} {w}", st.yellow("!"));
        }
    }
    if !plan.notes.is_empty() {
        let _ = writeln!(o, "\n{}", st.bold("Notes"));
        for n in &plan.notes {
            let _ = writeln!(o, "  - {n}");
        }
    }
    if !plan.command.is_empty() {
        let _ = writeln!(o, "\n{}", st.bold("Run"));
        for (k, v) in &plan.env {
            let _ = writeln!(o, "  export {k}={v}");
        }
        let _ = writeln!(o, "  {}", plan.command);
        if let Some(note) = crate::plan::placeholder_note(&plan.command) {
            let _ = writeln!(o, "  {note}");
        }
    }
}

/// The full report.
pub fn text(snap: Option<&Snapshot>, plan: &Plan, st: Style) -> String {
    let mut o = snap.map(|s| snapshot_text(s, plan, st)).unwrap_or_default();
    if let Some((s, b)) = snap.and_then(|s| s.bench.as_ref().map(|b| (s, b))) {
        o.push_str(&bench_text(&peak::summarize(b, Some(s)), st));
    }
    o.push_str(&plan_text(plan, st));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(81920 * 1024 * 1024), "80.0 GiB");
        assert_eq!(bytes(500 * 1024 * 1024), "500 MiB");
        assert_eq!(count(1_543_714_304), "1.54B");
        assert_eq!(count(135_000_000), "135M");
        let st = Style { color: true };
        assert_eq!(st.red("x"), "\u{1b}[31mx\u{1b}[0m");
        assert_eq!(Style { color: false }.red("x"), "x");
    }

    /// One GPU has no link matrix; its islands and NUMA lines still sit under a heading.
    #[test]
    fn topology_heading_without_a_matrix() {
        let mut snap = Snapshot::new(crate::snapshot::Source::NvidiaSmi);
        snap.gpus.push(crate::snapshot::Gpu { index: 0, ..Default::default() });
        let plan = crate::plan::plan(&snap, &crate::plan::PlanRequest::default());
        let text = snapshot_text(&snap, &plan, Style { color: false });
        assert!(text.contains("\nTopology\n  NVLink islands: none\n  NUMA groups: "), "{text}");
    }

    /// One GPU with its affinities gets its row; an affinity list longer than the column widens
    /// it rather than running into the NUMA node.
    #[test]
    fn one_gpu_row_and_a_long_affinity() {
        let mut snap = Snapshot::new(crate::snapshot::Source::NvidiaSmi);
        let cpus = (0..32).map(|c| (2 * c).to_string()).collect::<Vec<_>>().join(",");
        let gpu = crate::snapshot::Gpu {
            index: 0,
            cpu_affinity: Some(cpus.clone()),
            numa_node: Some(0),
            ..Default::default()
        };
        snap.gpus.push(gpu);
        let plan = crate::plan::plan(&snap, &crate::plan::PlanRequest::default());
        let text = snapshot_text(&snap, &plan, Style { color: false });
        assert!(text.contains(&format!("\n  GPU0  X     {cpus}  0\n")), "{text}");
        assert!(!text.contains("\nTopology\n"), "{text}");
    }
}
