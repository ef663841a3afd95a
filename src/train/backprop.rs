//! One micro-batch's forward and backward pass, plain or with activation checkpointing per
//! decoder layer.
//!
//! The LM head, the log-probs and the loss are differentiated by hand ([`head_backward`]); their
//! gradient at the final hidden states enters the decoder's autodiff graph as `Σ h ⊙ ∂L/∂h`.
//!
//! Checkpointing runs the decoder once without a graph, keeping only each layer's input, then
//! backpropagates one segment at a time from the top: the head (final norm, log-probs, loss)
//! gives the gradient at the last layer's output; each layer is recomputed from its saved input
//! and backpropagated with `Σ y ⊙ ∂L/∂y`, whose gradient is exactly the chain rule's. Peak memory
//! holds one layer's activations instead of all of them; the price is one more forward pass.
//! ZeRO-3 runs this segmented pass always: each part's parameters are gathered for its forward
//! and again for its recompute and backward ([`super::partition`]).

use std::ops::Range;

use burn::module::Module;
use burn::tensor::{FloatDType, IndexingUpdateOp, Tensor};

use super::optim::GradAccumulator;
use super::partition::{Part, Segments};
use crate::dist::DistError;
use crate::dpo::logps::{DeviceBatch, SequenceScores, assemble, head_forward};
use crate::model::Llama;
use crate::model::linear::linear_rows;

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
    with_stats: bool,
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
        let (scores, loss, dh) = head_backward(policy, hidden.clone(), batch, with_stats, scale, &mut fresh, loss_of);
        fresh.add(policy, &(hidden * dh).sum().backward());
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
    let (scores, loss, dh) = head_backward(&head_part, hidden.clone(), batch, with_stats, scale, &mut fresh, loss_of);
    let head = (hidden * dh).sum().backward();
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
        let g = (y * Tensor::from_inner(dy)).sum().backward();
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
            fresh.add_where(&*part, &(e * Tensor::from_inner(dx)).sum().backward(), |n| model.in_part(n, Part::Embed));
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

/// The head's logit gradients (consecutive blocks of predictions) grouped for its two products.
/// Narrower than f32, all of them as one: the blocks' f32 probabilities, freed by now, held twice
/// their bytes, so the copy costs no peak, and one product replaces a weight-sized cast and f32
/// sum per block (tens of them a step for a 150k vocabulary, more time than the products). In
/// f32 each block alone: there a copy would double the head's peak, and the sum needs no cast.
///
/// # Shapes
/// - each block: `[c, V]` → each group: `[g, V]`, rows `block` of the predictions
fn product_groups(blocks: Vec<(Range<usize>, Tensor<2>)>, dtype: FloatDType) -> Vec<(Range<usize>, Tensor<2>)> {
    if dtype == FloatDType::F32 || blocks.len() < 2 {
        return blocks;
    }
    let rows = blocks[0].0.start..blocks.last().map_or(0, |(b, _)| b.end);
    let whole = Tensor::cat(blocks.into_iter().map(|(_, dz)| dz).collect(), 0); // [N, V]
    vec![(rows, whole)]
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
    with_stats: bool,
    scale: f64,
    grads: &mut GradAccumulator,
    loss_of: impl FnOnce(&SequenceScores) -> Tensor<1>,
) -> (SequenceScores, Tensor<1>, Tensor<3>) {
    let [r, l, h] = hidden.dims();
    let dtype = FloatDType::from(hidden.dtype());
    let hidden = hidden.inner(); // [R, L, h], no graph
    let device = hidden.device();
    let lm_head = policy.head(dtype).inner(); // weight [h, V]
    let head = head_forward(hidden, &lm_head, batch, with_stats, true);

    // The loss over a leaf holding the log-probs gives their gradient.
    let n = head.token_logps.dims()[0];
    let leaf = Tensor::from_inner(head.token_logps).require_grad();
    let scores = assemble(leaf.clone(), head.stats.map(|stats| stats.map(Tensor::from_inner)), batch);
    let loss = loss_of(&scores);
    let g = (loss.clone() * scale).backward();
    let dlogp = leaf.grad(&g).unwrap_or_else(|| Tensor::zeros([n], &device)); // [N]

    // Backward through softmax, block by block, each block's f32 probabilities giving way to its
    // gradient in the compute dtype.
    let labels = batch.labels.clone().inner(); // [N]
    let mut dzs = Vec::new();
    for (block, probs) in head.probs {
        let d = dlogp.clone().slice([block.clone()]).unsqueeze_dim::<2>(1); // [c, 1]
        let y = labels.clone().slice([block.clone()]).unsqueeze_dim::<2>(1); // [c, 1]
        // ∂/∂z = d·(onehot(y) − p)
        let dz = (-probs * d.clone()).scatter(1, y, d, IndexingUpdateOp::Add); // [c, V]
        dzs.push((block, dz.cast(dtype)));
    }
    // Then through the projection, both products in the compute dtype as autocast runs them.
    let mut dh = Vec::new();
    let mut dweight: Option<Tensor<2>> = None;
    for (block, dz) in product_groups(dzs, dtype) {
        dh.push(linear_rows(dz.clone(), lm_head.weight.clone().transpose(), None)); // [g, h]
        if lm_head.trains {
            let x = head.selected.clone().slice([block, 0..h]); // [g, h]
            let dw = x.transpose().matmul(dz).cast(FloatDType::F32); // [h, V]
            dweight = Some(match dweight {
                Some(acc) => acc + dw,
                None => dw,
            });
        }
    }
    if let Some(dw) = dweight {
        let dw = lm_head.param_grad(dw); // under the parameter's own name and layout
        let summed = match grads.grads.remove(lm_head.param_name) {
            Some(acc) => acc + dw,
            None => dw,
        };
        grads.grads.insert(lm_head.param_name.to_owned(), summed);
    }
    let zeros = Tensor::<2>::zeros([r * l, h], &device).cast(dtype);
    let dh = match dh.is_empty() {
        true => zeros,
        false => zeros.select_assign(0, batch.at.clone().inner(), Tensor::cat(dh, 0), IndexingUpdateOp::Add),
    };
    (scores, loss.detach(), Tensor::from_inner(dh.reshape([r, l, h])))
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution};

    use super::*;

    #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
    fn device() -> Device {
        Device::libtorch()
    }

    /// Mixed precision takes the blocks as one group, rows in order, and its weight gradient is
    /// the blocks' sum; f32 keeps the blocks apart.
    #[test]
    fn half_precision_blocks_make_one_product() {
        let d = device();
        let ranges = [0..3, 3..6, 6..7];
        let random = |rows: usize, cols: usize| Tensor::<2>::random([rows, cols], Distribution::Default, &d);
        let blocks: Vec<(Range<usize>, Tensor<2>)> =
            ranges.iter().map(|r| (r.clone(), random(r.len(), 5).cast(FloatDType::BF16))).collect();
        let kept = product_groups(blocks.clone(), FloatDType::F32);
        assert_eq!(kept.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>(), ranges.to_vec());
        let grouped = product_groups(blocks.clone(), FloatDType::BF16);
        assert_eq!(grouped.len(), 1);
        let (rows, whole) = grouped.into_iter().next().unwrap();
        assert_eq!(rows, 0..7);
        let parts: Vec<Tensor<2>> = blocks.iter().map(|(_, dz)| dz.clone()).collect();
        whole.to_data().assert_eq(&Tensor::cat(parts, 0).to_data(), true);
        // One product over the rows equals the blocks' products summed, to f32 round-off.
        let x = random(7, 4);
        let f32 = |t: &Tensor<2>| t.clone().cast(FloatDType::F32);
        let per_block = blocks
            .iter()
            .map(|(r, dz)| x.clone().slice([r.clone(), 0..4]).transpose().matmul(f32(dz)))
            .reduce(|a, b| a + b)
            .unwrap();
        let one = x.transpose().matmul(f32(&whole));
        let diff: f32 = (one - per_block.clone()).abs().max().into_scalar();
        let scale: f32 = per_block.abs().max().into_scalar();
        assert!(diff <= 1e-6 * scale.max(1.0), "{diff} of {scale}");
    }
}
