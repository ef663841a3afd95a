//! One micro-batch's forward and backward pass, plain or with activation checkpointing per
//! decoder layer.
//!
//! The LM head, the log-probs and the loss are differentiated by hand ([`head_backward`]); their
//! gradient at the final hidden states starts the decoder's backward pass there
//! ([`backward_from`], the gradients of `Σ h ⊙ ∂L/∂h` without computing that sum).
//!
//! Checkpointing runs the decoder once without a graph, keeping only each layer's input, then
//! backpropagates one segment at a time from the top: the head (final norm, log-probs, loss)
//! gives the gradient at the last layer's output; each layer is recomputed from its saved input
//! and backpropagated from `∂L/∂y` at its output, exactly the chain rule's gradient. Peak memory
//! holds one layer's activations instead of all of them; the price is one more forward pass.
//! ZeRO-3 runs this segmented pass always: each part's parameters are gathered for its forward
//! and again for its recompute and backward ([`super::partition`]).

use std::ops::Range;

use burn::module::Module;
use burn::tensor::{FloatDType, IndexingUpdateOp, Int, Tensor};
use dpo_torch::bridge;
use dpo_torch::graph::backward_from;

use super::optim::GradAccumulator;
use super::partition::{Part, Segments};
use crate::dist::DistError;
use crate::dpo::logps::{
    DeviceBatch, HeadStats, SequenceScores, Stats, assemble, head_block_rows, head_blocks, head_forward, token_stats,
};
use crate::model::linear::linear_rows;
use crate::model::{Llama, LmHead};

/// Recompute activations in the backward pass. With LoRA dropout, `dropout_seed` reseeds the
/// generator before each layer so the recomputation draws the first pass's masks.
#[derive(Debug, Clone, Copy)]
pub struct Checkpointing {
    pub dropout_seed: Option<u64>,
}

/// Scores `batch` under the policy `model` gives, adds the gradients of `loss_of(scores) · scale`
/// to `grads`, and returns the scores and the unscaled loss (detached).
///
/// The pass is segmented (one part at a time, recomputing each layer in the backward) under
/// `checkpointing` and whenever `model` gathers parameters or scatters gradients per part.
pub fn forward_backward(
    model: &dyn Segments,
    batch: &DeviceBatch,
    stats: Stats,
    checkpointing: Option<Checkpointing>,
    scale: f64,
    grads: &mut GradAccumulator,
    loss_of: impl FnOnce(&SequenceScores) -> Tensor<1>,
) -> Result<(SequenceScores, Tensor<1>), DistError> {
    let policy = model.skeleton();
    let at = batch.placement(policy);
    if checkpointing.is_none() && !model.segmented() {
        let hidden = policy.hidden_states(batch.input_ids.clone(), &at); // [R, L, hidden]
        // This micro-batch's gradients are summed apart first (the tied embedding's head and input
        // parts), then added: the order data parallelism sums them in, so one process and two
        // ranks on the same micro-batches compute the same bits.
        let mut fresh = GradAccumulator::default();
        let (scores, loss, dh) = head_backward(policy, hidden.clone(), batch, stats, scale, &mut fresh, loss_of);
        fresh.add(policy, &backward_from(hidden, dh));
        grads.merge(fresh);
        return Ok((scores, loss));
    }
    let dropout_seed = checkpointing.and_then(|c| c.dropout_seed);
    let plain_device = batch.input_ids.device().inner();
    let reseed = |layer: usize| {
        if let Some(seed) = dropout_seed {
            plain_device.seed(seed.wrapping_add(layer as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
    };

    // Forward without a graph (the same tensors, no autodiff), keeping each layer's input.
    let layers = policy.num_layers();
    let mut inputs = Vec::with_capacity(layers);
    let mut x = model.part(Part::Embed)?.valid().embed(batch.input_ids.clone().inner()); // [R, L, hidden]
    for i in 0..layers {
        reseed(i);
        inputs.push(x.clone());
        x = model.part(Part::Layer(i))?.valid().layer(i, x, &at);
    }

    // The head and the final norm: their backward yields the gradient at the top of the decoder.
    let head_part = model.part(Part::Head)?;
    let top = Tensor::from_inner(x).require_grad(); // [R, L, hidden]
    let hidden = head_part.final_norm(top.clone());
    let mut fresh = GradAccumulator::default();
    let (scores, loss, dh) = head_backward(&head_part, hidden.clone(), batch, stats, scale, &mut fresh, loss_of);
    let head = backward_from(hidden, dh);
    fresh.add_where(&*head_part, &head, |n| model.in_part(n, Part::Head));
    let mut upstream = top.grad(&head);
    drop(head_part);
    model.absorb(Part::Head, fresh, grads)?;

    // Each layer from the top, recomputed from its input.
    for i in (0..layers).rev() {
        let (Some(dy), Some(input)) = (upstream.take(), inputs.pop()) else { break };
        reseed(i);
        let part = model.part(Part::Layer(i))?;
        let x = Tensor::from_inner(input).require_grad();
        let y = part.layer(i, x.clone(), &at);
        let g = backward_from(y, Tensor::from_inner(dy));
        let mut fresh = GradAccumulator::default();
        fresh.add_where(&*part, &g, |n| model.in_part(n, Part::Layer(i)));
        upstream = x.grad(&g);
        drop(part);
        model.absorb(Part::Layer(i), fresh, grads)?;
    }
    // The embedding, when it trains.
    if policy.model.embed_tokens.weight.val().is_require_grad() {
        let mut fresh = GradAccumulator::default();
        if let Some(dx) = upstream {
            let part = model.part(Part::Embed)?;
            let e = part.embed(batch.input_ids.clone());
            fresh.add_where(&*part, &backward_from(e, Tensor::from_inner(dx)), |n| model.in_part(n, Part::Embed));
        }
        model.absorb(Part::Embed, fresh, grads)?;
    }
    Ok((scores, loss))
}

/// The collectives of one segmented [`forward_backward`] pass, in its order, without its compute:
/// every part gathered (under ZeRO-3) and zero gradients reduce-scattered into `grads`. A rank
/// short of micro-batches runs it to stay in step with the others.
pub fn idle_pass(model: &dyn Segments, grads: &mut GradAccumulator) -> Result<(), DistError> {
    let layers = model.skeleton().num_layers();
    model.part(Part::Embed)?;
    for i in 0..layers {
        model.part(Part::Layer(i))?;
    }
    model.part(Part::Head)?;
    model.absorb(Part::Head, GradAccumulator::default(), grads)?;
    for i in (0..layers).rev() {
        model.part(Part::Layer(i))?;
        model.absorb(Part::Layer(i), GradAccumulator::default(), grads)?;
    }
    if model.skeleton().model.embed_tokens.weight.val().is_require_grad() {
        model.part(Part::Embed)?;
        model.absorb(Part::Embed, GradAccumulator::default(), grads)?;
    }
    Ok(())
}

/// The LM head, the log-probs and the loss with a hand-written backward: burn's autodiff would
/// keep and revisit several vocabulary-wide tensors per prediction, where `∂ log p(y_t) / ∂ z_t =
/// onehot(y_t) − p_t` needs one (the probabilities) and torch's fused log-softmax.
///
/// Adds the output projection's gradient to `grads` when it trains, and returns the scores (their
/// log-probs a leaf of their own graph), the unscaled loss, and `∂(loss·scale) / ∂hidden` (zero
/// where no scored token is predicted; summed where one position predicts two, as a shared
/// prompt's last position does).
///
/// # Shapes
/// - hidden: `[R, L, h]` (the model's final hidden states) → gradient `[R, L, h]`
fn head_backward(
    policy: &Llama,
    hidden: Tensor<3>,
    batch: &DeviceBatch,
    stats: Stats,
    scale: f64,
    grads: &mut GradAccumulator,
    loss_of: impl FnOnce(&SequenceScores) -> Tensor<1>,
) -> (SequenceScores, Tensor<1>, Tensor<3>) {
    let [r, l, h] = hidden.dims();
    let dtype = FloatDType::from(hidden.dtype());
    let hidden = hidden.inner(); // [R, L, h], no graph
    let device = hidden.device();
    let lm_head = policy.head(dtype).inner(); // weight [h, V]
    // The statistics come from the backward's softmax ([`BackwardStats`]), but WPO's, which the
    // loss reads, from the forward.
    let in_forward = matches!(stats, Stats::Metrics { wpo: true });
    let head = head_forward(hidden, &lm_head, batch, if in_forward { stats } else { Stats::Off });

    // The loss over a leaf holding the log-probs gives their gradient.
    let n = head.token_logps.dims()[0];
    let leaf = Tensor::from_inner(head.token_logps).require_grad();
    let mut scores = assemble(leaf.clone(), head.stats.map(|s| s.map(Tensor::from_inner)), batch);
    let loss = loss_of(&scores);
    let g = (loss.clone() * scale).backward();
    let dlogp = leaf.grad(&g).unwrap_or_else(|| Tensor::zeros([n], &device)); // [N]
    // The padding's predictions (`dpo::shapes`) take no gradient.
    let padded = head.selected.dims()[0];
    let pad = |t: Tensor<1>| match padded > n {
        true => Tensor::cat(vec![t, Tensor::zeros([padded - n], &device)], 0), // [N']
        false => t,
    };
    let dlogp = pad(dlogp);
    let mut from_backward = (stats != Stats::Off && !in_forward).then(|| BackwardStats::new(pad(leaf.clone().inner())));
    let n = padded;

    // Back through the softmax and the projection a group of blocks at a time, each block's
    // softmax recomputed from its hidden states: one more product of the head, where keeping the
    // forward's f32 probabilities held `4·N·V` bytes, a step's largest tensor, to the end of it.
    // The groups (`dpo_vocab::head`) bound the logit gradients multiplied at once.
    let labels = batch.labels.clone().inner(); // [N']
    let v = lm_head.weight.dims()[1];
    let rows = head_block_rows(&head.selected, v);
    let blocks: Vec<Range<usize>> = head_blocks(0..n, rows).collect();
    let bytes = burn::tensor::DType::from(dtype).size();
    let per_group = dpo_vocab::head::group_blocks(n, rows, h, bytes, lm_head.trains);
    let mut dh = Vec::new();
    let mut dweight: Option<Tensor<2>> = None;
    for group in blocks.chunks(per_group) {
        let (rows, dz) = logit_gradients(&lm_head, &head.selected, &labels, group, dtype, from_backward.as_mut()); // [g, V]
        // ∂z = (p − onehot(y))·(−d) row by row: the factor goes on the products' narrow side.
        let minus_d = -dlogp.clone().slice([rows.clone()]).unsqueeze_dim::<2>(1); // [g, 1]
        dh.push(rows_scaled(linear_rows(dz.clone(), lm_head.weight.clone().transpose(), None), &minus_d)); // [g, h]
        if lm_head.trains {
            let x = rows_scaled(head.selected.clone().slice([rows, 0..h]), &minus_d); // [g, h]
            let dw = lm_head.weight_grad(x, dz, blocks.len() > per_group); // in the parameter's layout
            dweight = Some(match dweight {
                Some(acc) => acc + dw,
                None => dw,
            });
        }
    }
    if let Some(dw) = dweight {
        let dw = dw.reshape([h * v]); // under the parameter's own name
        let summed = match grads.grads.remove(lm_head.param_name) {
            Some(acc) => acc + dw,
            None => dw,
        };
        grads.grads.insert(lm_head.param_name.to_owned(), summed);
    }
    if let Some(stats) = from_backward {
        scores.stats = Some(token_stats(&leaf, stats.finish(batch.scored()).map(Tensor::from_inner), batch));
    }
    let zeros = Tensor::<2>::zeros([r * l, h], (&device, dtype.into())); // [R·L, h]
    let dh = match dh.is_empty() {
        true => zeros,
        false => zeros.select_assign(0, batch.at.clone().inner(), Tensor::cat(dh, 0), IndexingUpdateOp::Add),
    };
    (scores, loss.detach(), Tensor::from_inner(dh.reshape([r, l, h])))
}

/// `p − onehot(y)` at the predictions of `group` (consecutive blocks), each block's softmax
/// recomputed: `∂ log p(y_t) / ∂z` negated, which the caller scales row by row by `−∂(loss·scale)
/// / ∂ log p(y_t)` on the products' narrow side ([`rows_scaled`]); in the compute dtype, as
/// autocast's products take it, written into one `[g, V]` buffer.
///
/// After the projection (f32), each block is the softmax, `p − onehot(y)` in place (one element a
/// row) and its copy into the buffer, rounded once: two passes over its `[c, V]` logits, where
/// burn's operations took seven (a log-softmax and its exponential, a negation, the product, the
/// label's addition into a copy, the cast and the copy into the buffer). On a GPU these are
/// memory-bound passes over the step's widest tensors, and the copy is a dense cast: storing the
/// scaled product (an f32 row factor into a bf16 buffer) took CUDA's general elementwise kernel,
/// 4.8 ms of the 0.5B step's kernels on an H200 (`tools/trace_summary.py --by-op`), where a cast
/// of those bytes is about a third of that.
///
/// With `stats`, each block's statistics are taken from its logits and softmax on the way.
///
/// # Shapes
/// - selected: `[N, h]`, labels: `[N]` → the group's rows and `[g, V]`
fn logit_gradients(
    head: &LmHead,
    selected: &Tensor<2>,
    labels: &Tensor<1, Int>,
    group: &[Range<usize>],
    dtype: FloatDType,
    mut stats: Option<&mut BackwardStats>,
) -> (Range<usize>, Tensor<2>) {
    let rows = group[0].start..group[group.len() - 1].end;
    let v = head.weight.dims()[1];
    let tch = |t: Tensor<2>| bridge::on_libtorch(t, "the LM head's gradient").0;
    let mut dz: Option<(Tensor<2>, tch::Tensor)> = None;
    let labels = labels.clone().slice([rows.clone()]).unsqueeze_dim::<2>(1);
    let labels = bridge::int_on_libtorch(labels, "the LM head's labels"); // [g, 1]
    let h = selected.dims()[1];
    for block in group {
        let (at, c) = ((block.start - rows.start) as i64, block.len() as i64);
        let logits = tch(head.block_logits(selected.clone().slice([block.clone(), 0..h]))); // [c, V] f32
        let mut p = logits.softmax(1, tch::Kind::Float);
        match stats.as_mut() {
            Some(stats) => stats.block(logits, &p, &labels.narrow(0, at, c), block.start),
            None => drop(logits),
        }
        let _ = p.scatter_value_reduce_(1, &labels.narrow(0, at, c), -1.0, "add"); // p − onehot(y)
        // Made once the first block's logits are gone: a buffer of one block costs no more than
        // the cast it replaces.
        let (_, out) = dz.get_or_insert_with(|| {
            let buffer = Tensor::<2>::empty([rows.len(), v], (&selected.device(), dtype.into())); // [g, V]
            (buffer.clone(), tch(buffer))
        });
        out.narrow(0, at, c).copy_(&p);
    }
    let Some((dz, _)) = dz else { unreachable!("a group holds a block") };
    (rows, dz)
}

/// Each row of `x` (`[g, h]`, any float dtype) times its factor in `factors` (`[g, 1]` f32), in
/// f32 and rounded once into `x`'s dtype (one `mul.out`, as autocast would round the product).
fn rows_scaled(x: Tensor<2>, factors: &Tensor<2>) -> Tensor<2> {
    let what = "the LM head's row factors";
    let ((t, origin), (f, _)) = (bridge::on_libtorch(x, what), bridge::on_libtorch(factors.clone(), what));
    let out = t.empty_like();
    let _ = t.mul_out(&out, &f);
    bridge::from_tch(out, origin)
}

/// The head's statistics taken in its backward, where each block's softmax is recomputed anyway:
/// the entropy as TRL's kernel takes it, `log Σ_v e^{z_v} − Σ_v p_v·z_v` (the log-sum-exp from
/// the label's logit and the forward's log-prob), the mean logit and whether the label is the
/// first argmax. Six passes over a block's `[c, V]` logits and probabilities, one of them writing
/// (the product, in place in the logits, which are dropped after it), where the forward's took
/// eight, two of them writing new tensors (an exponential and a product). (A batched product
/// would read each once, but the CPU's accumulates `Σ p·z` in order: 1e-3 off at V = 152k.)
struct BackwardStats {
    /// `[N']` the forward's `log p(y_t)`, then zeros for the padding's predictions.
    logp: tch::Tensor,
    /// Each block's `[entropy, mean logit, top-1]`, `[c]` each.
    blocks: Vec<[tch::Tensor; 3]>,
}

impl BackwardStats {
    fn new(logp: Tensor<1>) -> Self {
        Self { logp: bridge::on_libtorch(logp, "the LM head's log-probs").0, blocks: Vec::new() }
    }

    /// One block's, from its f32 logits (consumed) and softmax (`[c, V]`) and labels (`[c, 1]`),
    /// its first prediction `start`.
    fn block(&mut self, mut z: tch::Tensor, p: &tch::Tensor, labels: &tch::Tensor, start: usize) {
        let (c, f32) = (z.size()[0], tch::Kind::Float);
        let sum = |t: &tch::Tensor| t.sum_dim_intlist([1i64].as_slice(), false, f32);
        let mean = sum(&z) / z.size()[1] as f64;
        let top1 = z.argmax(1, true).eq_tensor(labels).to_kind(f32).view([c]);
        let log_sum_exp = z.gather(1, labels, false).view([c]) - self.logp.narrow(0, start as i64, c);
        let expected = sum(&z.g_mul_(p)); // Σ_v p_v·z_v
        self.blocks.push([log_sum_exp - expected, mean, top1]);
    }

    /// The statistics of the first `n` predictions (the padding's dropped), plain.
    fn finish(self, n: usize) -> HeadStats {
        let column = |i: usize| {
            let parts: Vec<&tch::Tensor> = self.blocks.iter().map(|b| &b[i]).collect();
            let whole = tch::Tensor::cat(&parts, 0).narrow(0, 0, n as i64);
            bridge::from_tch(whole, bridge::Origin::plain())
        };
        HeadStats { entropy: column(0), mean_logit: column(1), log_sum_sq: None, top1: column(2) }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution, TensorData};

    use super::*;

    #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
    fn device() -> Device {
        Device::libtorch()
    }

    /// A group of blocks written into one buffer equals each block alone, bit for bit, and the
    /// buffer is `softmax(x·W) − onehot(y)` of the recomputed logits (f32 round-off, then the
    /// compute dtype's one rounding).
    #[test]
    fn a_group_of_recomputed_blocks_is_the_blocks_gradient() {
        let d = device();
        let (n, h, v) = (7, 4, 5);
        d.seed(7);
        let selected = Tensor::<2>::random([n, h], Distribution::Normal(0.0, 1.0), &d);
        let weight = Tensor::<2>::random([h, v], Distribution::Normal(0.0, 1.0), &d);
        let labels = Tensor::<1, Int>::from_data(TensorData::new(vec![0i64, 4, 2, 2, 1, 3, 0], [n]), &d);
        for dtype in [FloatDType::BF16, FloatDType::F32] {
            let head = LmHead::new(weight.clone(), false, dtype);
            let x = selected.clone().cast(dtype);
            let blocks = [1..3, 3..6, 6..7]; // the group starts past row 0
            let (rows, group) = logit_gradients(&head, &x, &labels, &blocks, dtype, None);
            assert_eq!((rows, group.dims(), group.dtype()), (1..7, [n - 1, v], dtype.into()));
            let alone: Vec<Tensor<2>> = blocks
                .iter()
                .map(|b| logit_gradients(&head, &x, &labels, std::slice::from_ref(b), dtype, None).1)
                .collect();
            group.to_data().assert_eq(&Tensor::cat(alone, 0).to_data(), true);

            let logits = x.clone().cast(FloatDType::F32).matmul(head.weight.clone().cast(FloatDType::F32));
            let p = burn::tensor::activation::softmax(logits, 1);
            let onehot = Tensor::<2>::zeros([n, v], &d).scatter(
                1,
                labels.clone().unsqueeze_dim(1),
                Tensor::ones([n, 1], &d),
                IndexingUpdateOp::Add,
            );
            let expected = (p - onehot).slice([1..n, 0..v]);
            let diff: f32 = (group.cast(FloatDType::F32) - expected.clone()).abs().max().into_scalar();
            let scale: f32 = expected.abs().max().into_scalar();
            // bf16: the product's output rounded (relative 2^-8 of each logit), then the gradient's.
            let bound = if dtype == FloatDType::F32 { 1e-5 } else { 3e-2 };
            assert!(diff <= bound * scale, "{dtype:?}: {diff} of {scale}");
        }
    }

    /// Each row times its f32 factor, computed in f32 and rounded once into the rows' dtype: the
    /// f32 product cast, bit for bit, in bf16 and in f32.
    #[test]
    fn rows_are_scaled_in_f32_and_rounded_once() {
        let d = device();
        d.seed(11);
        let x = Tensor::<2>::random([6, 9], Distribution::Normal(0.0, 3.0), &d);
        let factors = Tensor::<2>::random([6, 1], Distribution::Normal(0.0, 1e-3), &d);
        for dtype in [FloatDType::BF16, FloatDType::F32] {
            let x = x.clone().cast(dtype);
            let got = rows_scaled(x.clone(), &factors);
            assert_eq!(got.dtype(), dtype.into());
            let want = (x.cast(FloatDType::F32) * factors.clone()).cast(dtype);
            got.to_data().assert_eq(&want.to_data(), true);
        }
    }
}
