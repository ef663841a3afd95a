//! Operations that run as one torch kernel with torch's own derivative, where burn's autodiff
//! would assemble them from primitives and keep each intermediate for its backward.
//!
//! Causal attention is the one that matters: built from burn operations, training materialises
//! the `[B, H, S, S]` scores several times over (scores, softmax, their gradients, and the copies
//! half-precision matrix products make of transposed operands), which dominated a training step.
//! torch's fused scaled-dot-product attention keeps one row block at a time and saves only the
//! output and the log-sum-exp for its backward.
//!
//! The operations extend burn's `Dispatch` through a backend extension: on LibTorch they call the
//! kernel; on `Autodiff<LibTorch>` they record one graph node. A packed row on CUDA goes through
//! torch's variable-length kernel, whose node calls the kernel's backward itself ([`varlen`]);
//! the other nodes ask torch's autograd (which ran the kernel from leaves requiring gradients) for
//! the inputs' gradients.

// burn marks burn-tch deprecated in favour of CubeCL backends; this project runs on LibTorch on
// purpose, so the deprecation is expected here.
#![allow(deprecated)]

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use std::sync::{Arc, Mutex};

use burn::backend::{Autodiff, Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::Tensor;
use burn_tch::{LibTorch, TchTensor};

use dpo_data::Span;
use dpo_torch::TorchError;

mod varlen;

/// Causal softmax attention, `softmax(q·kᵀ/√D + causal mask)·v`, by torch's fused kernel.
///
/// Without spans, each row attends causally within itself, and the `Sq` queries are the last
/// `Sq` of the `Sk` key positions (a KV-cache step has one query and every earlier key): query
/// `i` sees keys `0..=i + Sk - Sq`. With spans (one packed row, `Sq == Sk`), each span's queries
/// see the span's earlier keys and its prefix, and nothing else: the spans are gathered into a
/// batch of sequences for one fused call ([`Spans`]), never a dense `Sq x Sk` mask.
///
/// # Shapes
/// - q: `[B, H, Sq, D]`, k, v: `[B, Hkv, Sk, D]` with `Sq <= Sk` and `H` a multiple of `Hkv` →
///   `[B, H, Sq, D]`
pub fn causal_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spans: Arc<Spans>) -> Tensor<4> {
    let out = <burn::backend::Dispatch as FusedOps>::causal_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        spans,
    );
    Tensor::from_dispatch(out)
}

/// The operations, per backend.
#[backend_extension(LibTorch, Autodiff)]
pub trait FusedOps: Backend {
    /// See [`causal_attention`].
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        spans: Arc<Spans>,
    ) -> FloatTensor<Self>;
}

/// The attention spans of one packed row (none: every row attends causally on its own), and
/// how one fused call per layer attends over them.
///
/// On CUDA, by torch's variable-length kernel: the spans tile the row, so the queries are the row
/// itself and sequence `i` is span `i`; its keys are its prefix then its own positions (the only
/// copy is of the prefixes' keys and values), and the kernel's mask, aligned to each sequence's
/// last query, lets every query see the whole prefix. No padding is computed.
///
/// Elsewhere (torch has no CPU kernel for it), and should the CUDA call fail, the spans are
/// gathered into a batch of sequences: sequence `i` is span `i`'s prefix then its own positions,
/// right-padded to the longest. The padding comes after every real key, so the causal mask alone
/// keeps it out of the real queries' view, and its outputs are dropped (as are a prefix's queries,
/// computed again for the rejected completion that shares it). One call per layer, where a call
/// per span cost a GPU a kernel launch and its host time each (the H100 profile in results/gpu/),
/// at the price of the padding's attention work (a row with one long sequence among short ones
/// pays for the long one in every slot) and the gathered copies torch saves for the backward (3%
/// of a 32M step's peak memory on `make bench-trl`'s data).
#[derive(Debug, Default)]
pub struct Spans {
    spans: Vec<Span>,
    /// Index tensors made on first use, on that call's device, and kept for every later layer
    /// and pass: an upload per layer would wait on the device each time.
    gather: Mutex<Option<(tch::Device, Gather)>>,
    /// The same for the variable-length call (None: the spans do not tile the row).
    varlen: Mutex<Option<(tch::Device, Option<varlen::Varlen>)>>,
}

/// [`Spans`] as index tensors for the padded batch.
#[derive(Debug)]
struct Gather {
    /// `[n · L]` the row position at each slot of the `[n, L]` batch (padding reads position 0).
    slots: tch::Tensor,
    /// `[S]` the slot of each row position's own query.
    back: tch::Tensor,
    /// Sequences n and their padded length L.
    shape: (i64, i64),
}

impl Gather {
    /// `[1, H, S, D]` → `[n, H, L, D]` by way of `[S, H, D]` and `[n·L, H, D]`: rows of heads, so
    /// each gather and scatter moves whole rows.
    fn batch(&self, x: &tch::Tensor) -> tch::Tensor {
        self.unflatten(&to_rows(x).index_select(0, &self.slots))
    }

    /// `[n, H, L, D]` → `[1, H, S, D]`: each row position's output from its own slot.
    fn read_back(&self, y: &tch::Tensor) -> tch::Tensor {
        from_rows(&self.flatten(y).index_select(0, &self.back))
    }

    /// The gradient at [`Gather::batch`]'s input from the one at its output, as torch's autograd
    /// makes it (zeros, then each slot's row added onto its position): `[n, H, L, D]` → `[1, H, S, D]`.
    fn batch_grad(&self, grad: &tch::Tensor) -> tch::Tensor {
        let [_, h, _, d] = dims(grad);
        let mut rows = tch::Tensor::zeros([self.back.size()[0], h, d], (grad.kind(), grad.device()));
        let _ = rows.index_add_(0, &self.slots, &self.flatten(grad));
        from_rows(&rows)
    }

    /// The gradient at [`Gather::read_back`]'s input from the one at its output, likewise:
    /// `[1, H, S, D]` → `[n, H, L, D]` (zero at the slots nothing was read from).
    fn read_back_grad(&self, dy: &tch::Tensor) -> tch::Tensor {
        let ((n, width), [_, h, _, d]) = (self.shape, dims(dy));
        let mut slots = tch::Tensor::zeros([n * width, h, d], (dy.kind(), dy.device()));
        let _ = slots.index_add_(0, &self.back, &to_rows(dy));
        self.unflatten(&slots)
    }

    /// `[n·L, H, D]` → `[n, H, L, D]`.
    fn unflatten(&self, x: &tch::Tensor) -> tch::Tensor {
        let [_, h, d] = rows_dims(x);
        let (n, width) = self.shape;
        x.view([n, width, h, d]).transpose(1, 2)
    }

    /// `[n, H, L, D]` → `[n·L, H, D]`.
    fn flatten(&self, x: &tch::Tensor) -> tch::Tensor {
        let ((n, width), [_, h, _, d]) = (self.shape, dims(x));
        x.transpose(1, 2).reshape([n * width, h, d])
    }
}

/// `[1, H, S, D]` → `[S, H, D]`: a row's positions as rows of heads.
fn to_rows(x: &tch::Tensor) -> tch::Tensor {
    x.squeeze_dim(0).transpose(0, 1)
}

/// `[S, H, D]` → `[1, H, S, D]`.
fn from_rows(x: &tch::Tensor) -> tch::Tensor {
    x.transpose(0, 1).unsqueeze(0)
}

/// A 4-D tensor's sizes.
fn dims(x: &tch::Tensor) -> [i64; 4] {
    let [a, b, c, d] = x.size()[..] else { unreachable!("4-D attention operands") };
    [a, b, c, d]
}

/// A tensor of rows of heads' sizes (`[rows, heads, D]`).
fn rows_dims(x: &tch::Tensor) -> [i64; 3] {
    let [a, b, c] = x.size()[..] else { unreachable!("[rows, heads, D] operands") };
    [a, b, c]
}

impl Spans {
    /// The spans of a packed row; empty for rows that attend on their own.
    pub fn new(spans: Vec<Span>) -> Self {
        Self { spans, ..Self::default() }
    }

    /// Rows that attend on their own.
    pub fn none() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// `(slots, back, (n, L))` on the host (see [`Gather`]).
    fn layout(&self) -> (Vec<i64>, Vec<i64>, (i64, i64)) {
        let width = self.spans.iter().map(|s| prefix_len(s) + s.len).max().unwrap_or(0);
        let row = self.spans.iter().map(|s| s.start + s.len).max().unwrap_or(0);
        let (mut slots, mut back) = (Vec::with_capacity(self.spans.len() * width), vec![0i64; row]);
        for (i, s) in self.spans.iter().enumerate() {
            let first = slots.len() + prefix_len(s);
            for (j, t) in (s.start..s.start + s.len).enumerate() {
                back[t] = (first + j) as i64;
            }
            let padding = std::iter::repeat_n(0, width - prefix_len(s) - s.len); // any real position
            slots.extend(span_keys(s).chain(padding).map(|t| t as i64));
            debug_assert_eq!(slots.len(), (i + 1) * width);
        }
        (slots, back, (self.spans.len() as i64, width as i64))
    }

    /// Runs `f` with the padded batch's index tensors on `device`.
    fn with_gather<T>(&self, device: tch::Device, f: impl FnOnce(&Gather) -> T) -> T {
        let make = || {
            let (slots, back, shape) = self.layout();
            Gather { slots: upload(&slots, device), back: upload(&back, device), shape }
        };
        f(&shared(&self.gather, device, make))
    }

    /// Whether these spans on `device` are attended as the padded batch (the CPU's path, and
    /// CUDA's once the variable-length kernel failed) rather than by rows or that kernel.
    fn padded_on(&self, device: tch::Device) -> bool {
        !self.spans.is_empty() && (!device.is_cuda() || varlen_failure().is_some())
    }
}

/// The row positions a span's queries see, in order: its prefix, then its own.
fn span_keys(s: &Span) -> impl Iterator<Item = usize> {
    s.prefix.map_or(0..0, |(start, len)| start..start + len).chain(s.start..s.start + s.len)
}

/// How many keys of a span's prefix come before its own.
fn prefix_len(s: &Span) -> usize {
    s.prefix.map_or(0, |(_, len)| len)
}

/// `cell`'s value for `device`, made by `make` the first time and again when the device changes,
/// as handles of the caller's own ([`Share`]): the lock is not held while they are used, so the
/// policy's thread and the reference's, which attend over the same spans, do not wait on each
/// other's attention calls.
fn shared<G: Share>(cell: &Mutex<Option<(tch::Device, G)>>, device: tch::Device, make: impl FnOnce() -> G) -> G {
    let mut slot = cell.lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_some_and(|(d, _)| *d != device) {
        *slot = None;
    }
    slot.get_or_insert_with(|| (device, make())).1.share()
}

/// A cached value's copy of shallow handles on the same tensors.
trait Share {
    fn share(&self) -> Self;
}

impl Share for Gather {
    fn share(&self) -> Self {
        Gather { slots: self.slots.shallow_clone(), back: self.back.shallow_clone(), shape: self.shape }
    }
}

/// Tensors on `device` from host values, without waiting for the device ([`dpo_torch::transfers`]).
fn upload<T: tch::kind::Element>(values: &[T], device: tch::Device) -> tch::Tensor {
    dpo_torch::transfers::upload(&tch::Tensor::from_slice(values), device)
}

/// Why the variable-length kernel was given up on in this process (it then stays off and packed
/// rows go through the padded batch), or None while it works or has not run.
pub fn varlen_failure() -> Option<&'static str> {
    VARLEN.failure()
}

/// Why the variable-length kernel's own backward was given up on in this process (torch's
/// autograd then differentiates the kernel's calls), or None while it works or has not run.
pub fn varlen_backward_failure() -> Option<&'static str> {
    VARLEN_BACKWARD.failure()
}

/// Whether the variable-length kernel has attended a packed row in this process.
pub fn varlen_ran() -> bool {
    VARLEN_RAN.load(std::sync::atomic::Ordering::Relaxed)
}

static VARLEN: dpo_torch::fallback::FastPath = dpo_torch::fallback::FastPath::new(
    "torch's variable-length attention",
    "packed rows are attended as padded span batches from now on",
);
static VARLEN_RAN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static VARLEN_BACKWARD: dpo_torch::fallback::FastPath = dpo_torch::fallback::FastPath::new(
    "torch's variable-length attention backward",
    "its gradients come through torch's autograd from now on",
);

/// Whether a variable-length call's result lets the row be attended that way: its output
/// (marking the kernel as having run), or None where the spans do not tile the row or the kernel
/// failed (given up on for the rest of the process, with one warning).
fn varlen_result<T>(result: Option<Result<T, TorchError>>) -> Option<T> {
    match result? {
        Ok(y) => {
            VARLEN_RAN.store(true, std::sync::atomic::Ordering::Relaxed);
            Some(y)
        }
        Err(e) => {
            VARLEN.give_up(e);
            None
        }
    }
}

/// [`causal_attention`] on torch tensors: by rows, or over the spans of one packed row.
fn attend(qkv: &[tch::Tensor; 3], spans: &Spans) -> tch::Tensor {
    let device = qkv[0].device();
    if device != tch::Device::Cpu {
        avoid_cudnn_attention();
    }
    if spans.spans.is_empty() {
        return sdpa_causal(qkv);
    }
    if !spans.padded_on(device)
        && let Some(y) = varlen_result(varlen::attend_varlen(qkv, spans, &varlen::Torch))
    {
        return y;
    }
    attend_spans(qkv, spans)
}

/// The spans of one packed row gathered into a batch of sequences for one call (see [`Spans`]).
fn attend_spans(qkv: &[tch::Tensor; 3], spans: &Spans) -> tch::Tensor {
    spans.with_gather(qkv[0].device(), |g| g.read_back(&sdpa_causal(&qkv.each_ref().map(|x| g.batch(x)))))
}

/// `torch.nn.functional.scaled_dot_product_attention` with the causal mask aligned to the last
/// query (see [`causal_attention`]). torch's `is_causal` aligns it to the first, which is right
/// only when `Sq == Sk`: one query attends to every key, other shapes get an explicit mask. Fewer
/// key/value heads than query heads (grouped-query attention) go in as they are (`enable_gqa`)
/// where torch's kernel takes them: repeating them would copy keys and values and sum their
/// gradients back.
fn sdpa_causal(qkv: &[tch::Tensor; 3]) -> tch::Tensor {
    sdpa_causal_with(qkv, takes_grouped_heads(&qkv[0]))
}

/// Whether torch's fused attention takes `q` with fewer key/value heads than query heads: flash
/// attention does (the CPU's, and CUDA's in half precision). CUDA's f32 kernel (memory-efficient
/// attention) does not, and torch then falls back to its unfused math path, which took a quarter
/// of a 32M grouped-query model's f32 step on an H100 (torch profiler, results/gpu/): there the
/// key/value heads are repeated instead.
fn takes_grouped_heads(q: &tch::Tensor) -> bool {
    q.device() == tch::Device::Cpu || matches!(q.kind(), tch::Kind::BFloat16 | tch::Kind::Half)
}

/// [`sdpa_causal`], with `grouped`: whether grouped key/value heads go to torch as they are.
fn sdpa_causal_with([q, k, v]: &[tch::Tensor; 3], grouped: bool) -> tch::Tensor {
    let (sq, sk) = (q.size()[2], k.size()[2]);
    let groups = q.size()[1] / k.size()[1];
    // torch's `enable_gqa` pairs query head i with key/value head i / groups: repeat_interleave.
    let repeat = |x: &tch::Tensor| match groups > 1 && !grouped {
        true => x.repeat_interleave_self_int(groups, 1, None),
        false => x.shallow_clone(),
    };
    let (k, v) = (&repeat(k), &repeat(v));
    let gqa = q.size()[1] != k.size()[1];
    let sdpa = |mask: Option<tch::Tensor>, is_causal| {
        tch::Tensor::scaled_dot_product_attention(q, k, v, mask, 0.0, is_causal, None, gqa)
    };
    match sq {
        _ if sq == sk => sdpa(None, true),
        1 => sdpa(None, false),
        _ => {
            // `true` where a query may look: key j <= i + (Sk - Sq).
            let visible = tch::Tensor::ones([sq, sk], (tch::Kind::Bool, q.device())).tril(sk - sq); // [Sq, Sk]
            sdpa(Some(visible), false)
        }
    }
}

/// Turns cuDNN's attention off for the process, once. torch 2.11 picks it on Hopper in half
/// precision, and it builds an execution graph for each input shape: 6-7 ms of host time per call
/// on an H100 (torch profiler, results/gpu/), while packed batches change shape every step, so a
/// step of the medium model spent 2 s there. torch then takes flash attention, which needs no setup.
fn avoid_cudnn_attention() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = dpo_torch::kernels::use_cudnn_attention(false) {
            eprintln!("warning: cuDNN's attention stays on: {e}");
        }
    });
}

impl FusedOps for LibTorch {
    fn causal_attention(q: TchTensor, k: TchTensor, v: TchTensor, spans: Arc<Spans>) -> TchTensor {
        TchTensor::new(attend(&[q.tensor, k.tensor, v.tensor], &spans))
    }
}

impl<C: CheckpointStrategy> FusedOps for Autodiff<LibTorch, C> {
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        spans: Arc<Spans>,
    ) -> FloatTensor<Self> {
        let ((q, qn), (k, kn), (v, vn)) = (q.into_parts(), k.into_parts(), v.into_parts());
        let device = q.tensor.device();
        // A packed row on CUDA: the variable-length kernel, differentiated by its own backward
        // (else under torch's autograd, below).
        if !spans.spans.is_empty() && !spans.padded_on(device) && VARLEN_BACKWARD.usable() {
            avoid_cudnn_attention();
            let node = varlen::VarlenAttention(varlen::Torch);
            if let Some((out, kept)) = varlen_result(node.forward([&q, &k, &v], &spans)) {
                return match node.prepare::<C>([qn, kn, vn]).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => prep.finish(kept, out),
                    OpsKind::UnTracked(prep) => prep.finish(out),
                };
            }
        }
        if spans.padded_on(device) {
            return match PaddedSpans.prepare::<C>([qn, kn, vn]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => {
                    let (out, recorded) = PaddedSpans::forward([q, k, v], &spans);
                    prep.finish((recorded, spans), out)
                }
                OpsKind::UnTracked(prep) => prep.finish(LibTorch::causal_attention(q, k, v, spans)),
            };
        }
        match CausalAttention.prepare::<C>([qn, kn, vn]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, recorded) = Recorded::run([q, k, v], |qkv| attend(qkv, &spans));
                prep.finish(recorded, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(LibTorch::causal_attention(q, k, v, spans)),
        }
    }
}

/// [`causal_attention`]'s graph node: torch's autograd differentiates the whole call.
#[derive(Debug)]
struct CausalAttention;

impl Backward<LibTorch, 3> for CausalAttention {
    type State = Recorded<3>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<LibTorch>(&ops.node);
        for (id, grad) in ops.state.gradients(dy, ops.parents.map(|p| p.map(|p| p.id))) {
            grads.register::<LibTorch>(id, grad);
        }
    }
}

/// The padded span batch's graph node: torch's autograd records only the fused call on the
/// gathered batch, and the gather and the read-back are differentiated here. Recorded from the
/// row's own q, k and v (as [`CausalAttention`] is), the node would keep them alive beside the
/// gathered copies torch saves, and the batch's output beside the row's: 0.8 GiB of the medium
/// model's 14.8 GiB peak at 2048 tokens, 2 pairs a step (`make bench`'s growth run). The
/// gradients are the ones torch's autograd makes through the gather (`index_select`'s backward:
/// zeros, then `index_add_`), bit for bit.
#[derive(Debug)]
struct PaddedSpans;

impl PaddedSpans {
    /// The row's output, and the fused call on the gathered batch as torch recorded it.
    fn forward(qkv: [TchTensor; 3], spans: &Spans) -> (TchTensor, Recorded<3>) {
        spans.with_gather(qkv[0].tensor.device(), |g| {
            let (y, recorded) = Recorded::run(qkv.map(|x| TchTensor::new(g.batch(&x.tensor))), sdpa_causal);
            (TchTensor::new(g.read_back(&y.tensor)), recorded)
        })
    }
}

impl Backward<LibTorch, 3> for PaddedSpans {
    type State = (Recorded<3>, Arc<Spans>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<LibTorch>(&ops.node);
        let (recorded, spans) = ops.state;
        spans.with_gather(dy.tensor.device(), |g| {
            let dy = TchTensor::new(g.read_back_grad(&dy.tensor));
            for (id, grad) in recorded.gradients(dy, ops.parents.map(|p| p.map(|p| p.id))) {
                grads.register::<LibTorch>(id, TchTensor::new(g.batch_grad(&grad.tensor)));
            }
        });
    }
}

/// A torch computation recorded by torch's autograd: run from leaves that require gradients, so
/// its output carries the graph that differentiates it.
///
/// Every handle keeps burn's storage reference, so burn never writes in place into a tensor torch
/// saved for the backward.
#[derive(Debug, Clone)]
struct Recorded<const N: usize> {
    leaves: [TchTensor; N],
    output: TchTensor,
}

impl<const N: usize> Recorded<N> {
    /// Runs `f` on `inputs` under torch's autograd; returns its output (without the graph) for burn.
    fn run(inputs: [TchTensor; N], f: impl FnOnce(&[tch::Tensor; N]) -> tch::Tensor) -> (TchTensor, Self) {
        let leaves =
            inputs.map(|t| TchTensor { tensor: t.tensor.detach().set_requires_grad(true), storage: t.storage.clone() });
        let output = TchTensor::new(f(&leaves.each_ref().map(|t| t.tensor.shallow_clone())));
        let detached = TchTensor { tensor: output.tensor.detach(), storage: output.storage.clone() };
        (detached, Self { leaves, output })
    }

    /// The gradients of the inputs with an id (those that need one), given the output's gradient.
    fn gradients(self, dy: TchTensor, ids: [Option<NodeId>; N]) -> Vec<(NodeId, TchTensor)> {
        let (ids, inputs): (Vec<_>, Vec<_>) =
            ids.into_iter().zip(&self.leaves).filter_map(|(id, leaf)| id.map(|id| (id, &leaf.tensor))).unzip();
        if inputs.is_empty() {
            return Vec::new();
        }
        // A failure here is libtorch's, as tch's own backward would panic with it.
        let grads = dpo_torch::kernels::autograd_grad(&self.output.tensor, &dy.tensor, &inputs)
            .unwrap_or_else(|e| dpo_torch::libtorch_failed("torch's autograd through the attention call", &e));
        ids.into_iter().zip(grads.into_iter().map(TchTensor::new)).collect()
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution, Tensor, activation::softmax};

    use std::sync::Arc;

    use super::causal_attention;
    use dpo_data::Span;

    /// Attention written out: key/value heads repeated for their query heads, scores, the mask
    /// aligned to the last query, softmax, values.
    fn reference(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
        let [b, h, sq, d] = q.dims();
        let repeat = |x: Tensor<4>| {
            let [_, hkv, s, _] = x.dims();
            x.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, s, d]).reshape([b, h, s, d])
        };
        let (k, v) = (repeat(k), repeat(v));
        let sk = k.dims()[2];
        let scores = q.matmul(k.swap_dims(2, 3)) / (d as f64).sqrt(); // [B, H, Sq, Sk]
        let mask: Vec<f32> = (0..sq)
            .flat_map(|i| (0..sk).map(move |j| if j <= i + sk - sq { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let mask = Tensor::<2>::from_data(burn::tensor::TensorData::new(mask, [sq, sk]), &scores.device());
        softmax(scores + mask.reshape([1, 1, sq, sk]), 3).matmul(v) // [B, H, Sq, D]
    }

    /// How far two f32 attentions over heads of size `d` and at most `sk` keys can be apart,
    /// relative to the compared tensor's largest entry `scale` (the size of its terms): a score
    /// sums d products of at most `qk` (max|q|·max|k|) in size, γ_d of √d·qk after the 1/√d
    /// scaling, which moves each softmax weight relatively by twice that; the weighted sums add
    /// γ_sk and the softmax's own roundings 2u. Both sides: twice.
    fn attention_bound(d: usize, sk: usize, qk: f32, scale: f32) -> f32 {
        let u = f64::from(f32::EPSILON) / 2.0;
        let gamma = |k: usize| k as f64 * u / (1.0 - k as f64 * u);
        let relative = 2.0 * gamma(d) * (d as f64).sqrt() * f64::from(qk) + gamma(sk) + 2.0 * u;
        (2.0 * relative * f64::from(scale.max(1.0))) as f32
    }

    /// The largest magnitude in a tensor.
    fn largest<const D: usize>(t: &Tensor<D>) -> f32 {
        t.clone().abs().max().into_scalar::<f32>()
    }

    /// The largest difference of two torch tensors.
    pub(in crate::fused) fn max_diff(a: &tch::Tensor, b: &tch::Tensor) -> f32 {
        (a - b).abs().max().double_value(&[]) as f32
    }

    /// [`attention_bound`] of the outputs and of the gradients of torch tensors q, k, v weighted
    /// by `weights`, over at most `s` positions: a gradient entry sums at most s terms of
    /// max|w|·(1 + max|v|·max|k|) each (dv: weights times w; dq, dk: the score gradients through
    /// v and k), over twice the positions (the backward's sums).
    pub(in crate::fused) fn tch_bounds([q, k, v]: [&tch::Tensor; 3], weights: &tch::Tensor, s: usize) -> (f32, f32) {
        let m = |t: &tch::Tensor| t.abs().max().double_value(&[]) as f32;
        let qk = m(q) * m(k);
        (attention_bound(8, s, qk, m(v)), attention_bound(8, 2 * s, qk, s as f32 * m(weights) * (1.0 + m(v) * m(k))))
    }

    #[allow(deprecated)] // burn's libtorch device: this project's backend
    fn devices() -> [Device; 2] {
        [Device::libtorch(), Device::libtorch().autodiff()]
    }

    #[test]
    fn a_query_shorter_than_its_keys_sees_every_earlier_key() {
        for device in devices() {
            for (sq, sk, hkv) in [(7, 7, 6), (1, 7, 6), (3, 7, 6), (1, 1, 6), (7, 7, 2), (3, 7, 3)] {
                let t = |h, s| Tensor::<4>::random([2, h, s, 8], Distribution::Normal(0.0, 1.0), &device);
                let (q, k, v) = (t(6, sq), t(hkv, sk), t(hkv, sk));
                let bound = attention_bound(8, sk, largest(&q) * largest(&k), largest(&v));
                let fused = causal_attention(q.clone(), k.clone(), v.clone(), super::Spans::none());
                let diff = (fused - reference(q, k, v)).abs().max().into_scalar::<f32>();
                let autodiff = device.is_autodiff();
                assert!(
                    diff <= bound,
                    "Sq {sq}, Sk {sk}, autodiff {autodiff}: max difference {diff} (bound {bound:e})"
                );
            }
        }
    }

    /// Key/value heads repeated for their query heads (CUDA's f32 path) give what torch's grouped
    /// attention gives, outputs and the gradients summed back onto the shared heads.
    #[test]
    fn repeated_heads_equal_grouped_heads() {
        let t = |h, s| tch::Tensor::randn([2, h, s, 8], (tch::Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        for (sq, sk) in [(7, 7), (3, 7), (1, 7)] {
            let (q, k, v) = (t(6, sq), t(2, sk), t(2, sk));
            let weights = tch::Tensor::randn([2, 6, sq, 8], (tch::Kind::Float, tch::Device::Cpu));
            let run = |grouped| {
                let y = super::sdpa_causal_with(&[q.shallow_clone(), k.shallow_clone(), v.shallow_clone()], grouped);
                let grads =
                    tch::Tensor::run_backward(&[(&y * &weights).sum(tch::Kind::Float)], &[&q, &k, &v], false, false);
                (y.detach(), grads)
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            let (out, grad) = tch_bounds([&q, &k, &v], &weights, sq.max(sk) as usize);
            assert!(max_diff(&y1, &y2) <= out, "Sq {sq}, Sk {sk}: outputs differ");
            for (a, b) in g1.iter().zip(&g2) {
                assert!(max_diff(a, b) <= grad, "Sq {sq}, Sk {sk}: gradients differ");
            }
        }
    }

    /// A packed row equals its sequences attended apart: two plain spans, and a third whose
    /// prefix is the first span's first 3 keys (the shared-prompt layout), forward and backward,
    /// with 4 query heads on 2 key/value heads.
    #[test]
    fn spans_attend_within_themselves_and_their_prefix() {
        let device = Device::libtorch().autodiff();
        let t = |h| Tensor::<4>::random([1, h, 12, 8], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let (q, k, v) = (t(4), t(2), t(2));
        let list = vec![
            Span { start: 0, len: 5, prefix: None },
            Span { start: 5, len: 4, prefix: None },
            Span { start: 9, len: 3, prefix: Some((0, 3)) },
        ];
        let spans = Arc::new(super::Spans::new(list));
        // Twice: the second call reuses the gather the first made.
        let _ = causal_attention(q.clone(), k.clone(), v.clone(), spans.clone());
        let packed = causal_attention(q.clone(), k.clone(), v.clone(), spans);
        let part = |x: &Tensor<4>, a: usize, n: usize| x.clone().narrow(2, a, n);
        let prefixed = |x: &Tensor<4>| Tensor::cat(vec![part(x, 0, 3), part(x, 9, 3)], 2);
        let apart = Tensor::cat(
            vec![
                reference(part(&q, 0, 5), part(&k, 0, 5), part(&v, 0, 5)),
                reference(part(&q, 5, 4), part(&k, 5, 4), part(&v, 5, 4)),
                reference(part(&q, 9, 3), prefixed(&k), prefixed(&v)),
            ],
            2,
        );
        let diff = (packed.clone() - apart.clone()).abs().max().into_scalar::<f32>();
        let qk = largest(&q) * largest(&k);
        let bound = attention_bound(8, 12, qk, largest(&v));
        assert!(diff <= bound, "forward differs by {diff} (bound {bound:e})");
        let weights = Tensor::<4>::random([1, 4, 12, 8], Distribution::Normal(0.0, 1.0), &device);
        let grad_scale = 12.0 * largest(&weights) * (1.0 + largest(&v) * largest(&k));
        let bound = attention_bound(8, 24, qk, grad_scale);
        let (g1, g2) = ((packed * weights.clone()).sum().backward(), (apart * weights).sum().backward());
        for x in [&q, &k, &v] {
            let diff = (x.grad(&g1).unwrap() - x.grad(&g2).unwrap()).abs().max().into_scalar::<f32>();
            assert!(diff <= bound, "gradients differ by {diff} (bound {bound:e})");
        }
    }

    /// Each span's prefix and own positions, right-padded to the longest (with position 0);
    /// every row position's output read back from its own slot.
    #[test]
    fn spans_gather_into_padded_sequences() {
        let (slots, back, shape) = three_spans().layout();
        assert_eq!(shape, (3, 6));
        assert_eq!(slots, [0, 1, 2, 3, 4, 0, 5, 6, 7, 8, 0, 0, 0, 1, 2, 9, 10, 11]);
        assert_eq!(back, [0, 1, 2, 3, 4, 6, 7, 8, 9, 15, 16, 17]);
    }

    /// The padded batch's graph node (the gather and the read-back differentiated by hand, as on
    /// the CPU under burn's autodiff) gives what torch's autograd gives through them, bit for bit:
    /// the output and the gradients of q, k and v.
    #[test]
    fn the_padded_batch_node_equals_torch_autograd_bit_for_bit() {
        let device = Device::libtorch().autodiff();
        let t = |h| Tensor::<4>::random([1, h, 12, 8], Distribution::Normal(0.0, 1.0), &device);
        let (q, k, v, w) = (t(4).require_grad(), t(2).require_grad(), t(2).require_grad(), t(4));
        let y = causal_attention(q.clone(), k.clone(), v.clone(), Arc::new(three_spans()));
        let grads = (y.clone() * w.clone()).sum().backward();
        let torch = |x: &Tensor<4>| {
            let size: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
            tch::Tensor::from_slice(&crate::host(x)).view(size.as_slice()).set_requires_grad(true)
        };
        let [tq, tk, tv] = [&q, &k, &v].map(torch);
        let ty = super::attend_spans(&[tq.shallow_clone(), tk.shallow_clone(), tv.shallow_clone()], &three_spans());
        let sum = (&ty * torch(&w).detach()).sum(tch::Kind::Float);
        let tgrads = tch::Tensor::run_backward(&[sum], &[&tq, &tk, &tv], false, false);
        let flat = |x: &tch::Tensor| Vec::<f32>::try_from(x.contiguous().view(-1)).unwrap();
        assert_eq!(crate::host(&y), flat(&ty.detach()), "outputs");
        for (x, tgrad) in [&q, &k, &v].into_iter().zip(&tgrads) {
            assert_eq!(crate::host(&x.grad(&grads).unwrap()), flat(tgrad), "gradients");
        }
    }

    /// Two plain spans and a third whose prefix is the first span's first 3 positions.
    pub(in crate::fused) fn three_spans() -> super::Spans {
        super::Spans::new(vec![
            Span { start: 0, len: 5, prefix: None },
            Span { start: 5, len: 4, prefix: None },
            Span { start: 9, len: 3, prefix: Some((0, 3)) },
        ])
    }
}
