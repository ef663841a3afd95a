//! One micro-batch's forward and backward pass, plain or with activation checkpointing per
//! decoder layer.
//!
//! Checkpointing runs the decoder once without a graph, keeping only each layer's input, then
//! backpropagates one segment at a time from the top: the head (final norm, log-probs, loss)
//! gives the gradient at the last layer's output; each layer is recomputed from its saved input
//! and backpropagated with `Σ y ⊙ ∂L/∂y`, whose gradient is exactly the chain rule's. Peak memory
//! holds one layer's activations instead of all of them; the price is one more forward pass.

use burn::module::Module;
use burn::tensor::Tensor;

use super::optim::GradAccumulator;
use crate::dpo::logps::{DeviceBatch, SequenceScores, score, score_hidden};
use crate::model::Llama;

/// Recompute activations in the backward pass. With LoRA dropout, `dropout_seed` reseeds the
/// generator before each layer so the recomputation draws the first pass's masks.
#[derive(Debug, Clone, Copy)]
pub struct Checkpointing {
    pub dropout_seed: Option<u64>,
}

/// Scores `batch` under `policy`, adds the gradients of `loss_of(scores) · scale` to `grads`, and
/// returns the scores and the unscaled loss (detached).
pub fn forward_backward(
    policy: &Llama,
    batch: &DeviceBatch,
    with_stats: bool,
    checkpointing: Option<Checkpointing>,
    scale: f64,
    grads: &mut GradAccumulator,
    loss_of: impl FnOnce(&SequenceScores) -> Tensor<1>,
) -> (SequenceScores, Tensor<1>) {
    let Some(Checkpointing { dropout_seed }) = checkpointing else {
        let scores = score(policy, batch, with_stats);
        let loss = loss_of(&scores);
        grads.add(policy, &(loss.clone() * scale).backward());
        return (scores, loss.detach());
    };
    let plain_device = batch.input_ids.device().inner();
    let reseed = |layer: usize| {
        if let Some(seed) = dropout_seed {
            plain_device.seed(seed.wrapping_add(layer as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
    };

    // Forward without a graph (the same tensors, no autodiff), keeping each layer's input.
    let frozen = policy.valid();
    let layers = policy.num_layers();
    let mut inputs = Vec::with_capacity(layers);
    let mut x = frozen.embed(batch.input_ids.clone().inner()); // [2B, S, hidden]
    for i in 0..layers {
        reseed(i);
        inputs.push(x.clone());
        x = frozen.layer(i, x);
    }
    drop(frozen);

    // The head: its backward yields the gradient at the top of the decoder.
    let top = Tensor::from_inner(x).require_grad(); // [2B, S, hidden]
    let scores = score_hidden(policy, policy.final_norm(top.clone()), batch, with_stats);
    let loss = loss_of(&scores);
    let head = (loss.clone() * scale).backward();
    grads.add(policy, &head);
    let mut upstream = top.grad(&head);

    // Each layer from the top, recomputed from its input.
    for i in (0..layers).rev() {
        let (Some(dy), Some(input)) = (upstream.take(), inputs.pop()) else { break };
        reseed(i);
        let x = Tensor::from_inner(input).require_grad();
        let y = policy.layer(i, x.clone());
        let g = (y * Tensor::from_inner(dy)).sum().backward();
        grads.add(policy, &g);
        upstream = x.grad(&g);
    }
    // The embedding, when it trains.
    if let Some(dx) = upstream.filter(|_| policy.model.embed_tokens.weight.val().is_require_grad()) {
        let e = policy.embed(batch.input_ids.clone());
        grads.add(policy, &(e * Tensor::from_inner(dx)).sum().backward());
    }
    (scores, loss.detach())
}
