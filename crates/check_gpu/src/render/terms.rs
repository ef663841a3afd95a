//! The plan's memory, term by term with the formula behind each number as the chosen ZeRO stage
//! and offload shape it (the table in [`crate::memory`]), the `sharding` line, and the
//! alternatives that would fit.

use std::fmt::Write as _;

use super::Style;
use crate::memory::{FineTune, Precision, Reference, Sharding, masters_resident};
use crate::plan::Plan;
use crate::units::{bytes, count};

/// `zero2 over 4 GPUs (AdamW state and gradients partitioned)`, `none (every GPU holds a full
/// replica)`, and the offload with its host memory.
pub(super) fn sharding_line(p: &Plan) -> String {
    let what = match p.sharding {
        Sharding::None => "every GPU holds a full replica",
        Sharding::Zero1 => "AdamW state partitioned",
        Sharding::Zero2 => "AdamW state and gradients partitioned",
        Sharding::Zero3 => "weights, gradients and AdamW state partitioned",
    };
    let over = match ranks(p) {
        Some((n, unit)) if p.sharding != Sharding::None => {
            format!(" over {n} {}", if unit == "GPU" { "GPU(s)" } else { "process(es)" })
        }
        _ => String::new(),
    };
    let mut line = format!("{}{over} ({what}", p.sharding.name());
    if let Some(part) = piece(p).filter(|_| p.sharding == Sharding::Zero3) {
        let _ = write!(line, "; gathered a piece at a time, the largest {} parameters", count(part));
    }
    line.push(')');
    if p.offload_optimizer {
        let host = p.memory.map_or(String::new(), |m| format!(" ({} per {})", bytes(m.host), unit(p)));
        let _ = write!(line, ", optimizer offloaded to host memory{host}");
    }
    line
}

/// Memory per GPU (per process on CPU processes), term by term with its formula, and the
/// alternatives that would fit.
pub(super) fn memory_lines(o: &mut String, plan: &Plan, st: Style) {
    let unit = unit(plan);
    if let Some(m) = &plan.memory {
        let free = plan.min_free_bytes.map_or(String::new(), |f| format!(" (smallest free: {})", bytes(f)));
        // A plan that placed nothing estimates micro-batch 1.
        let micro = if ranks(plan).is_some() { plan.micro_batch } else { 1 };
        let label = if unit == "GPU" { "memory/GPU" } else { "memory/proc" };
        let _ = writeln!(o, "  {label:<12} {} at micro-batch {micro}{free}", bytes(m.total));
        for (name, v, how) in [
            ("weights", m.weights, weights_formula(plan)),
            ("gradients", m.gradients, grads_formula(plan)),
            ("optimizer", m.optimizer, opt_formula(plan)),
            ("reference", m.reference, ref_formula(plan)),
            ("activations", m.activations, act_formula(plan)),
            ("logits", m.logits, logits_formula(plan)),
            ("overhead", m.overhead, overhead_formula(plan)),
        ] {
            let _ = writeln!(o, "    {:<12} {:>10}  {how}", name, bytes(v));
        }
        if plan.offload_optimizer {
            let _ = writeln!(o, "    {:<12} {:>10}  {}", "host", bytes(m.host), host_formula(plan));
        }
        if let Some(t) = &plan.memory_trl {
            let _ = writeln!(
                o,
                "  TRL          {} per {unit} for the same run under TRL's DPOTrainer ({:.1}x): 2b rows padded to s (at most), activations {}, fp32 log-softmax {}",
                bytes(t.total),
                t.total as f64 / m.total.max(1) as f64,
                bytes(t.activations),
                bytes(t.logits)
            );
        }
    }
    if !plan.alternatives.is_empty() {
        let _ = writeln!(o, "  what would fit (micro-batch 1, more accumulation):");
        for a in &plan.alternatives {
            let mark = if a.fits { st.green("fits") } else { st.red("too big") };
            let _ =
                writeln!(o, "    {:<52} {:>10}  {mark}  ({})", a.description, bytes(a.memory_per_gpu_bytes), a.flags);
        }
    }
}

/// Parameters of the largest piece zero3 gathers (`Pg`), when the model is known.
fn piece(p: &Plan) -> Option<u64> {
    p.model.as_ref().map(|m| m.gathered_piece_params())
}

/// The ranks the plan places: `(4, "GPU")`, `(2, "process")` on CPU processes; `None` when no
/// GPU was chosen.
fn ranks(p: &Plan) -> Option<(usize, &'static str)> {
    match p.cpu_processes() {
        Some(n) => Some((n, "process")),
        None => (p.world_size > 0).then_some((p.world_size, "GPU")),
    }
}

/// What one rank is: a GPU, or a CPU process.
fn unit(p: &Plan) -> &'static str {
    if p.cpu_processes().is_some() { "process" } else { "GPU" }
}

/// `GPUs`, `processes`.
fn plural(unit: &str) -> &'static str {
    if unit == "GPU" { "GPUs" } else { "processes" }
}

/// ` / 4 GPUs`, ` / 2 processes` on CPU processes, or ` / N` when no GPU was chosen.
fn over(p: &Plan) -> String {
    ranks(p).map_or_else(|| " / N".to_string(), |(n, unit)| format!(" / {n} {}", plural(unit)))
}

/// The allocator's share and what a process holds besides its tensors: the CUDA context on a
/// GPU, libtorch's own resident memory (about the same) in a CPU process.
fn overhead_formula(p: &Plan) -> String {
    match p.cpu_processes() {
        Some(_) => "15% (the allocator's) + 128 MiB kernel scratch + 500 MiB libtorch's own".to_string(),
        None => "15% (the caching allocator's) + 128 MiB kernel scratch + 500 MiB CUDA context".to_string(),
    }
}

/// ` + largest piece 4 B x 233M`: one whole piece (`Pg`) in flight at `per` bytes.
fn plus_piece(p: &Plan, per: &str) -> String {
    piece(p).map_or_else(|| format!(" + largest piece {per} B"), |n| format!(" + largest piece {per} B x {}", count(n)))
}

/// A sharded term's `per` bytes each over the ranks, plus the piece in flight.
fn shard(p: &Plan, per: &str, what: &str) -> String {
    format!("{per} B/{what}{}{}", over(p), plus_piece(p, per))
}

/// Whether the plan's run keeps resident fp32 masters (`memory::masters_resident`).
fn resident(p: &Plan) -> bool {
    masters_resident(p.dtype, p.offload_optimizer, p.gradient_checkpointing, p.sharding)
}

/// ` / 4 GPUs` where zero1/2 shard the resident masters.
fn masters_over(p: &Plan) -> String {
    if p.sharding == Sharding::None { String::new() } else { over(p) }
}

fn weights_formula(p: &Plan) -> String {
    let (c, half) = (p.dtype.bytes(), p.dtype.name());
    if p.offload_optimizer {
        return offloaded_weights_formula(p);
    }
    let tied = p.model.as_ref().is_some_and(|m| m.tied_embeddings);
    match (p.finetune, p.sharding, p.dtype) {
        (FineTune::Lora { .. }, ..) if resident(p) => {
            format!(
                "{c} B/param frozen base + {c} B/adapter param ({half}) + 4 B/adapter param fp32 master{}",
                masters_over(p)
            )
        }
        (FineTune::Full, ..) if resident(p) => format!(
            "{c} B/param ({half}) + 4 B/param fp32 master{} (the embedding: 4 B/param whole{})",
            masters_over(p),
            if tied { format!(", cast to {half} for the head") } else { String::new() }
        ),
        (FineTune::Lora { .. }, Sharding::Zero3, ..) => format!(
            "{c} B/param frozen base{}{} + 4 B/adapter param{} + one layer's",
            over(p),
            plus_piece(p, &c.to_string()),
            over(p)
        ),
        (FineTune::Lora { .. }, ..) => format!("{c} B/param frozen base + 4 B/adapter param"),
        (FineTune::Full, Sharding::Zero3, Precision::Fp32) => format!("{} (gathered)", shard(p, "4", "param")),
        (FineTune::Full, Sharding::Zero3, _) => format!(
            "4 B/param fp32 master{}{} (gathered in fp32, cast to {half})",
            over(p),
            plus_piece(p, &format!("(4+{c})"))
        ),
        (FineTune::Full, _, Precision::Fp32) => "4 B/param".to_string(),
        (FineTune::Full, ..) => {
            format!("4 B/param fp32 master{} (cast to {half} as each layer runs)", plus_piece(p, &c.to_string()))
        }
    }
}

/// Offloaded, the GPU keeps the trained parameters in the compute dtype; their fp32 masters are
/// on the host.
fn offloaded_weights_formula(p: &Plan) -> String {
    let (c, half) = (p.dtype.bytes(), p.dtype.name());
    let masters = if p.dtype == Precision::Fp32 { "" } else { ", fp32 masters on the host" };
    match (p.finetune, p.sharding) {
        (FineTune::Lora { .. }, Sharding::Zero3) => format!(
            "{c} B/param frozen base{}{} + {c} B/adapter param{} + one layer's{masters}",
            over(p),
            plus_piece(p, &c.to_string()),
            over(p)
        ),
        (FineTune::Lora { .. }, _) => format!("{c} B/param frozen base + {c} B/adapter param{masters}"),
        (FineTune::Full, Sharding::Zero3) => {
            format!("{} ({half}, gathered){masters}", shard(p, &c.to_string(), "param"))
        }
        (FineTune::Full, _) => format!("{c} B/param ({half}){masters}"),
    }
}

/// dpo-train's gradients at its peak: the stage's, counted beyond what the activations freed
/// leave (at the backward's start only the LM head's exists), and with accumulation the sum of
/// the step's earlier passes besides.
fn grads_formula(p: &Plan) -> String {
    let first = match p.finetune {
        FineTune::Full => "only the LM head's 4*V*h while the activations live; ",
        FineTune::Lora { .. } => "",
    };
    let summed = match p.grad_accum {
        0 | 1 => String::new(),
        k => format!(
            "; + 4 B/trained param (this rank's shard where each layer's are reduce-scattered), the sum of the step's {k} micro-batches, held through each pass"
        ),
    };
    format!("{} ({first}the rest counted beyond the activations they replace{summed})", stage_grads_formula(p))
}

/// A zero1/zero2 step's copies of the shard's slices it updates (`memory::sharded_gradients`).
fn updated_slices(p: &Plan, what: &str) -> String {
    match p.sharding {
        Sharding::Zero1 | Sharding::Zero2 if !p.offload_optimizer => {
            let per = if resident(p) { p.dtype.bytes() } else { 4 };
            format!(" + {per} B/{what}{} (the step's updated slices)", over(p))
        }
        _ => String::new(),
    }
}

fn stage_grads_formula(p: &Plan) -> String {
    let what = match p.finetune {
        FineTune::Full => "param",
        FineTune::Lora { .. } => "adapter param",
    };
    match p.sharding {
        Sharding::Zero2 if !p.gradient_checkpointing => {
            format!("4 B/{what} (fp32; without checkpointing the backward holds them all before the reduce-scatter)")
        }
        Sharding::Zero2 | Sharding::Zero3 => {
            // A LoRA piece in flight is one layer's adapters, not the base's largest piece.
            let sharded = match p.finetune {
                FineTune::Full => shard(p, "4", what),
                FineTune::Lora { .. } => format!("4 B/adapter param{} + one layer's", over(p)),
            };
            format!("{sharded} (fp32, reduce-scattered after each layer's backward){}", updated_slices(p, what))
        }
        Sharding::None | Sharding::Zero1 => match p.finetune {
            FineTune::Full => format!("4 B/param (fp32){}", updated_slices(p, what)),
            FineTune::Lora { .. } => format!("4 B/adapter param{}", updated_slices(p, what)),
        },
    }
}

fn opt_formula(p: &Plan) -> String {
    let what = match p.finetune {
        FineTune::Full => "param",
        FineTune::Lora { .. } => "adapter param",
    };
    if p.offload_optimizer {
        return "0 on the GPU (AdamW m, v in host memory)".to_string();
    }
    match (p.sharding, p.finetune) {
        (Sharding::None, FineTune::Full) => "8 B/param (AdamW m, v in fp32)".to_string(),
        (Sharding::None, FineTune::Lora { .. }) => "8 B/adapter param".to_string(),
        (_, _) => format!("8 B/{what}{} (AdamW m, v in fp32)", over(p)),
    }
}

fn ref_formula(p: &Plan) -> String {
    let c = p.dtype.bytes().to_string();
    match (p.finetune, p.reference, p.sharding) {
        (_, Reference::None, _) => "0 (no reference model: a reference-free loss)".to_string(),
        (FineTune::Lora { .. }, ..) => "0 (adapter disabled = base)".to_string(),
        (_, Reference::Precompute, _) => "0 (precomputed log-probs)".to_string(),
        (_, Reference::Keep, Sharding::Zero3) => format!("{} frozen copy", shard(p, &c, "param")),
        (_, Reference::Keep, _) => format!("{c} B/param frozen copy"),
    }
}

/// dpo-train's activations over `T` packed tokens, `A` bytes a token and layer (see
/// [`crate::memory::packed`]).
fn act_formula(p: &Plan) -> String {
    let c = p.dtype.bytes();
    let (norms, mlp) = match p.finetune {
        FineTune::Full => (6 * c, 3 * c),
        FineTune::Lora { .. } => (3 * c, 2 * c),
    };
    // fp32 attention takes k and v repeated to every head.
    let attention = if c == 4 { format!("{}d*a", 4 * c) } else { format!("{c}d(2a+2kv)") };
    let layer = format!("A={norms}h+{attention}+{mlp}i+4a+8");
    let recompute = if p.sharding == Sharding::Zero3 { "zero3 recomputes layer by layer" } else { "checkpointing" };
    if p.sharding == Sharding::Zero3 || p.gradient_checkpointing {
        format!("T*L*{c}h + (T*A beyond the freed logits), {layer}, {} ({recompute})", tokens_formula(p))
    } else {
        format!("T*(L*A + {}h), {layer}, {}", 4 + c, tokens_formula(p))
    }
}

/// Where `T` and `N` come from: the data's longest pairs, or sequences of `s` tokens, none shared.
fn tokens_formula(p: &Plan) -> String {
    match p.tokens {
        Some(t) if t.from_data => {
            format!("T = {} packed tokens, N = {} scored (the data's largest micro-batch)", t.packed, t.scored)
        }
        Some(t) => format!("T = N = 2b*s = {} tokens (no data: every sequence s tokens)", t.packed),
        None => "T = 2b*s".to_string(),
    }
}

/// The LM head's backward over the N scored positions: a group of logit gradients and one
/// block in flight (`memory::packed::head_bytes`).
fn logits_formula(p: &Plan) -> String {
    let c = p.dtype.bytes();
    let group = match p.finetune {
        FineTune::Full => "G = up to 8h/c rows, + 4*V*h past one group",
        FineTune::Lora { .. } => "G = one block of n rows",
    };
    // CUDA takes at least 512 rows a block (`memory::packed`); the CPU 2^24/V alone.
    let n = if p.cpu_processes().is_some() { "2^24/V" } else { "max(2^24/V, 512)" };
    format!(
        "{c}*G*V (logit gradients, softmax recomputed; N <= T scored, {group}) + 8*min(N, n)*V in flight, n = {n} rows a block"
    )
}

/// Host memory per GPU's process: AdamW's moments and the fp32 masters.
fn host_formula(p: &Plan) -> String {
    let what = match p.finetune {
        FineTune::Full => "param",
        FineTune::Lora { .. } => "adapter param",
    };
    let split = if p.sharding == Sharding::None { String::new() } else { over(p) };
    format!("12 B/{what}{split} in CPU memory (fp32 master + AdamW m, v; not in the GPU total)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelShape;
    use crate::plan::{PlanRequest, plan};
    use crate::snapshot::{Gpu, Snapshot, Source};

    /// A plan on four 80 GiB GPUs with a stage fixed.
    fn planned(sharding: Sharding, offload: bool) -> Plan {
        let mut s = Snapshot::new(Source::NvidiaSmi);
        s.gpus = (0..4)
            .map(|index| Gpu {
                index,
                name: Some("G".into()),
                memory_total_bytes: Some(80 << 30),
                memory_used_bytes: Some(0),
                memory_free_bytes: Some(80 << 30),
                compute_capability: Some("8.9".into()),
                ..Gpu::default()
            })
            .collect();
        let model = Some(ModelShape::from_param_count(1_500_000_000));
        plan(&s, &PlanRequest { model, sharding: Some(sharding), offload_optimizer: offload, ..PlanRequest::default() })
    }

    #[test]
    fn formulas_name_the_stage() {
        let z3 = planned(Sharding::Zero3, true);
        assert_eq!(z3.world_size, 4);
        assert_eq!(
            weights_formula(&z3),
            "2 B/param / 4 GPUs + largest piece 2 B x 233M (bf16, gathered), fp32 masters on the host"
        );
        assert_eq!(weights_formula(&planned(Sharding::Zero1, true)), "2 B/param (bf16), fp32 masters on the host");
        assert_eq!(
            stage_grads_formula(&z3),
            "4 B/param / 4 GPUs + largest piece 4 B x 233M (fp32, reduce-scattered after each layer's backward)"
        );
        assert_eq!(opt_formula(&z3), "0 on the GPU (AdamW m, v in host memory)");
        assert_eq!(ref_formula(&z3), "2 B/param / 4 GPUs + largest piece 2 B x 233M frozen copy");
        assert_eq!(
            host_formula(&z3),
            "12 B/param / 4 GPUs in CPU memory (fp32 master + AdamW m, v; not in the GPU total)"
        );
        assert!(sharding_line(&z3).starts_with("zero3 over 4 GPU(s) (weights, gradients and AdamW state partitioned; gathered a piece at a time, the largest 233M parameters), optimizer offloaded to host memory ("), "{}", sharding_line(&z3));
        let z3 = planned(Sharding::Zero3, false);
        assert_eq!(
            weights_formula(&z3),
            "4 B/param fp32 master / 4 GPUs + largest piece (4+2) B x 233M (gathered in fp32, cast to bf16)"
        );
        assert_eq!(
            act_formula(&z3),
            "T*L*2h + (T*A beyond the freed logits), A=12h+2d(2a+2kv)+6i+4a+8, T = N = 2b*s = 32768 tokens (no data: every sequence s tokens) (zero3 recomputes layer by layer)"
        );
        let f32 = Plan { dtype: Precision::Fp32, sharding: Sharding::None, ..planned(Sharding::None, false) };
        assert_eq!(
            act_formula(&f32),
            "T*(L*A + 8h), A=24h+16d*a+12i+4a+8, T = N = 2b*s = 16384 tokens (no data: every sequence s tokens)"
        );
        let z1 = planned(Sharding::Zero1, false);
        assert_eq!(opt_formula(&z1), "8 B/param / 4 GPUs (AdamW m, v in fp32)");
        assert_eq!(
            weights_formula(&z1),
            "2 B/param (bf16) + 4 B/param fp32 master / 4 GPUs (the embedding: 4 B/param whole, cast to bf16 for the head)"
        );
        let ck = Plan { gradient_checkpointing: true, ..z1.clone() };
        assert_eq!(
            weights_formula(&ck),
            "4 B/param fp32 master + largest piece 2 B x 233M (cast to bf16 as each layer runs)"
        );
        assert_eq!(sharding_line(&z1), "zero1 over 4 GPU(s) (AdamW state partitioned)");
        let z2 = planned(Sharding::Zero2, false);
        assert!(grads_formula(&z2).starts_with("4 B/param (fp32; without checkpointing"), "{}", grads_formula(&z2));
        let one_pass = Plan { grad_accum: 1, ..z2.clone() };
        assert!(grads_formula(&one_pass).ends_with("(only the LM head's 4*V*h while the activations live; the rest counted beyond the activations they replace)"), "{}", grads_formula(&one_pass));
        assert!(grads_formula(&z2).ends_with("; + 4 B/trained param (this rank's shard where each layer's are reduce-scattered), the sum of the step's 2 micro-batches, held through each pass)"), "{}", grads_formula(&z2));
        assert_eq!(sharding_line(&planned(Sharding::None, false)), "none (every GPU holds a full replica)");
    }
}
