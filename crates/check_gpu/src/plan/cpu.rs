//! The plan without a usable GPU: CPU processes (one per NUMA node with the job's CPUs), the
//! batch split held against the host's available memory, the memory per process term by term,
//! and, when the requested run does not fit, what would.

use dpo_vocab::Ranks;

use super::{Log, Plan, PlanRequest, batch, comm, command, fit, lengths_note};
use crate::memory::Precision;

impl Plan {
    /// The plan for a machine without usable NVIDIA GPUs: train on `procs` CPU processes (see
    /// [`cpu_processes`]), with the batch split and every requested setting in the command, as on
    /// GPUs. The host's memory is unknown here ([`Plan::on_cpu`] checks it).
    pub fn cpu_fallback(req: &PlanRequest, procs: u32, reason: String) -> Plan {
        Plan::on_cpu(req, procs, reason, None)
    }

    /// [`Plan::cpu_fallback`] on a host with `host_available` bytes of memory available
    /// (`MemAvailable`; `None`: unknown): the micro-batch is the largest whose estimate fits
    /// each process's share, and a run that does not fit even at micro-batch 1 says so, with the
    /// settings that would ([`Plan::alternatives`]).
    pub fn on_cpu(req: &PlanRequest, procs: u32, reason: String, host_available: Option<u64>) -> Plan {
        let procs = usize::try_from(procs.max(1)).unwrap_or(1);
        let dtype = req.dtype.unwrap_or(Precision::Fp32);
        let setting = fit::Setting::requested(req);
        let est = fit::Estimator::new(req, dtype).on_cpu().chosen(setting, procs);
        let mut log = Log { warnings: vec![reason], ..Log::default() };
        lengths_note(req, &mut log);
        let share = host_available.map(|b| b / procs as u64);
        let split = batch::split(procs, share, (req.global_batch.max(1), req.min_micro_batch()), &est, &mut log);
        fit::host_check(split.estimate.as_ref(), split.micro, procs, host_available, &mut log);
        let alternatives = match (host_available, est.least(setting, procs)) {
            (Some(host), Some(need)) if need.total.saturating_add(need.host).saturating_mul(procs as u64) > host => {
                let found = fit::host_alternatives(&est, procs, host);
                fit::advise(&found, "", "a machine with more memory or a smaller model", &mut log);
                found
            }
            _ => Vec::new(),
        };
        let settings = command::settings(req, &setting, Ranks::Cpu(procs), &split, dtype);
        Plan {
            memory: split.estimate,
            memory_trl: req.compare_trl.then(|| est.trl_at(split.micro)).flatten(),
            alternatives,
            ..Plan::with_split(req, dtype, &split, Some(settings), log)
        }
    }

    /// The CPU processes the plan trains on (`--devices cpu:N`); `None` on GPUs.
    pub fn cpu_processes(&self) -> Option<usize> {
        match self.settings.as_ref()?.ranks {
            Ranks::Cpu(n) => Some(n),
            Ranks::Gpus(_) => None,
        }
    }
}

/// CPU processes for a run without GPUs: one per NUMA node with the job's CPUs (one when that is
/// unknown), each dividing its node's cores among its threads. One process per core is slower:
/// every process holds a replica and all-reduces the gradients while the cores it could have
/// shared sit in another process (`make bench` on 2 cores: `cpu:1` 291.5 pairs/s, `cpu:2` 256.3),
/// and torch's CPU guidance (`torch.backends.xeon.run_cpu`) likewise runs one instance per socket.
pub fn cpu_processes(system: &crate::snapshot::System) -> u32 {
    system.cpu_numa_nodes.unwrap_or(1).clamp(1, system.cpu_count.unwrap_or(1).max(1))
}

/// The plan to train on CPU processes ([`cpu_processes`], or the N a bench of `--devices cpu:N`
/// measured) on a host with `system`'s available
/// memory (`None`: unknown), with what a bench of them measured: its warnings (there is no link
/// to compare with, but wrong results count) and the time its collectives take per step.
pub fn cpu_plan(
    req: &PlanRequest,
    system: &crate::snapshot::System,
    reason: String,
    bench: Option<&crate::bench::BenchRecord>,
) -> Plan {
    // A bench of `--devices cpu:N` plans the N processes it measured, so its collectives' time is
    // this run's.
    let benched = bench.map(|rec| u32::try_from(rec.bench.world_size).unwrap_or(u32::MAX).max(1));
    let procs = benched.unwrap_or_else(|| cpu_processes(system));
    let mut p = Plan::on_cpu(req, procs, reason, system.memory_available_bytes);
    let nodes = match system.cpu_numa_nodes {
        Some(n) => format!("{n} NUMA node(s) with this job's CPUs"),
        None => "the NUMA nodes unknown".to_owned(),
    };
    let cores = system.cpu_count.map_or_else(|| "its cores".to_owned(), |c| format!("{c} cores"));
    let why = match benched {
        Some(_) => format!(
            "as benched (--devices cpu:{procs}); {} per NUMA node is the default ({nodes})",
            cpu_processes(system)
        ),
        None => format!(
            "one per NUMA node ({nodes}); a process per core would be slower: a replica each, and an all-reduce of the gradients every step"
        ),
    };
    p.notes.insert(0, format!("{procs} process(es) on {cores}, {why}"));
    if let Some(rec) = bench {
        p.warnings.extend(crate::peak::warnings(rec, None));
        if let Some(model) = &req.model {
            p.communication = comm::estimate(model, &p.step_setting(), &rec.bench);
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{FineTune, Reference};
    use crate::model::ModelShape;
    use crate::plan::{DEFAULT_MICRO_BATCH_CAP, Status, plan};
    use crate::render::{Style, memory_text};
    use crate::snapshot::{Snapshot, Source};

    const GIB: u64 = 1024 * 1024 * 1024;

    /// The CPU command carries what the plan reports, as the GPU command does.
    #[test]
    fn cpu_fallback_command_keeps_the_settings() {
        let req = PlanRequest {
            model: Some(ModelShape::from_param_count(1_000_000_000)),
            model_dir: Some("m".into()),
            finetune: FineTune::Lora { rank: 16 },
            global_batch: 32,
            seq_len: 2048,
            reference: Reference::Precompute,
            ..PlanRequest::default()
        };
        let p = Plan::cpu_fallback(&req, 2, "no GPU".into());
        assert_eq!((p.micro_batch, p.grad_accum, p.global_batch, p.dtype), (8, 2, 32, Precision::Fp32));
        assert_eq!(
            p.command,
            "dpo-train train --model-name-or-path m --train-file YOUR_DATA.jsonl --devices cpu:2 \
             --per-device-train-batch-size 8 --gradient-accumulation-steps 2 --global-batch-size 32 --max-length 2048 \
             --bf16 false --fp16 false --lora-r 16 --lora-target-modules q_proj,k_proj,v_proj,o_proj \
             --precompute-ref-log-probs true --gradient-checkpointing false --sharding none --offload-optimizer false"
        );
    }

    /// On CPU processes the estimate is checked against the host's available memory: a 70B model
    /// does not fit in 16 GiB, said with the numbers; a small one fits and says how much it takes;
    /// a snapshot without the figure says it is unknown.
    #[test]
    fn cpu_plan_checks_host_memory() {
        let req = |params| PlanRequest { model: Some(ModelShape::from_param_count(params)), ..PlanRequest::default() };
        let huge = Plan::on_cpu(&req(70_000_000_000), 4, "no GPU".into(), Some(16 * GIB));
        assert_eq!((huge.status, huge.micro_batch, huge.grad_accum), (Status::NotReady, 1, 16));
        let w = huge.warnings.iter().find(|w| w.starts_with("does not fit in host memory: ")).expect("a warning");
        // fp32 full fine-tuning: 12 B/param + a 4 B/param reference, 1043 GiB, the 16 micro-batches'
        // summed gradients (4 B/param), the activations and the LM head's gradient, the
        // allocator's share and the CUDA context.
        assert!(w.starts_with("does not fit in host memory: 4 process(es) x 1799.9 GiB at micro-batch 1 = 7199.8 GiB, and 16.0 GiB is available (MemAvailable, or the cgroup's limit)"), "{w}");
        assert!(w.ends_with("; fewer processes (--devices cpu:N), LoRA or activation checkpointing need less"), "{w}");
        // One process cannot be fewer.
        let one = Plan::on_cpu(&req(70_000_000_000), 1, "no GPU".into(), Some(16 * GIB));
        let w1 = one.warnings.iter().find(|w| w.starts_with("does not fit in host memory: ")).expect("a warning");
        assert!(
            w1.ends_with("(MemAvailable, or the cgroup's limit); LoRA or activation checkpointing need less"),
            "{w1}"
        );
        // A snapshot with no GPU carries the host's figure to the same check.
        let mut snap = Snapshot::new(Source::Live);
        (snap.system.cpu_count, snap.system.memory_available_bytes) = (Some(4), Some(16 * GIB));
        snap.system.cpu_numa_nodes = Some(4);
        let p = plan(&snap, &req(70_000_000_000));
        assert!(p.warnings.iter().any(|x| x == w), "{:?}", p.warnings);
        // 135M on 2 processes with 256 GiB: the micro-batch is the largest that fits, past the cap of 8.
        let small = Plan::on_cpu(&req(135_000_000), 2, "no GPU".into(), Some(256 * GIB));
        assert!(small.warnings.iter().all(|w| !w.contains("host memory")), "{:?}", small.warnings);
        assert!(small.micro_batch > DEFAULT_MICRO_BATCH_CAP, "{}", small.micro_batch);
        let note = small.notes.iter().find(|n| n.starts_with("host memory: 2 process(es) x ")).expect("a note");
        assert!(note.ends_with(" of 256.0 GiB available (MemAvailable, or the cgroup's limit)"), "{note}");
        let unknown = Plan::cpu_fallback(&req(135_000_000), 2, "no GPU".into());
        assert_eq!(unknown.micro_batch, DEFAULT_MICRO_BATCH_CAP);
        assert!(
            unknown.notes.iter().any(|n| n.starts_with("host memory unknown (not in this input): 2 process(es) x "))
        );
    }

    /// A CPU plan carries its estimate per process (`--json`'s `memory`), the figure the host
    /// check multiplies by the processes, and prints it term by term as a GPU plan does.
    #[test]
    fn cpu_plan_reports_the_memory_per_process() {
        let req = PlanRequest {
            model: Some(ModelShape::from_param_count(135_000_000)),
            compare_trl: true,
            ..PlanRequest::default()
        };
        let p = Plan::on_cpu(&req, 2, "no GPU".into(), Some(64 * GIB));
        let m = p.memory.expect("an estimate");
        let each = crate::units::bytes(m.total);
        let note = p.notes.iter().find(|n| n.starts_with("host memory: ")).expect("a note");
        assert!(note.starts_with(&format!("host memory: 2 process(es) x {each} at micro-batch {} = ", p.micro_batch)));
        assert!(p.memory_trl.is_some() && p.alternatives.is_empty());
        let text = memory_text(&p, Style { color: false });
        assert!(text.starts_with(&format!("  memory/proc  {each} at micro-batch {}\n", p.micro_batch)), "{text}");
        assert!(text.contains("500 MiB libtorch's own\n") && text.contains(" per process for the same run under TRL"));
        assert!(!text.contains("GPU"), "{text}");
    }

    /// A run the host cannot hold lists what would fit, with the need per process, and the plan
    /// names the first that fits: 1.5B in fp32 needs about 46 GiB, LoRA about 14.
    #[test]
    fn cpu_plan_that_does_not_fit_says_what_would() {
        let req = PlanRequest { model: Some(ModelShape::from_param_count(1_500_000_000)), ..PlanRequest::default() };
        let p = Plan::on_cpu(&req, 1, "no GPU".into(), Some(22 * GIB));
        assert!(p.warnings.iter().any(|w| w.starts_with("does not fit in host memory: ")), "{:?}", p.warnings);
        let fits: Vec<(&str, bool)> = p.alternatives.iter().map(|a| (a.description.as_str(), a.fits)).collect();
        assert_eq!(
            fits,
            [
                ("activation checkpointing", false),
                ("precomputed reference log-probs", false),
                ("precomputed reference + activation checkpointing", false),
                ("LoRA rank 16", true),
                ("LoRA rank 16 + activation checkpointing", true),
            ]
        );
        // Each alternative is the least its setting needs, as a plan asking for it would find.
        let lora = PlanRequest { finetune: FineTune::Lora { rank: 16 }, ..req.clone() };
        let least = fit::Estimator::new(&lora, Precision::Fp32).on_cpu().least(fit::Setting::requested(&lora), 1);
        assert_eq!(p.alternatives[3].memory_per_gpu_bytes, least.expect("an estimate").total);
        let with_lora = Plan::on_cpu(&lora, 1, "no GPU".into(), Some(22 * GIB));
        assert!(with_lora.alternatives.is_empty() && with_lora.warnings.len() == 1, "{:?}", with_lora.warnings);
        assert!(
            p.notes.contains(&"plan again with `--lora 16` added to the check-gpu flags (LoRA rank 16)".to_string())
        );
        // Unknown host memory checks nothing and suggests nothing.
        assert!(Plan::cpu_fallback(&req, 1, "no GPU".into()).alternatives.is_empty());
        // A precomputed reference is no alternative where there is none to precompute.
        let pre = PlanRequest { reference: Reference::Precompute, ..req };
        let p = Plan::on_cpu(&pre, 1, "no GPU".into(), Some(8 * GIB));
        assert!(p.alternatives.iter().all(|a| !a.description.contains("precomputed")), "{:?}", p.alternatives);
    }
}
