//! Graph nodes of burn's autodiff that are plumbing rather than layers.
//!
//! [`split`]: a tensor cut along one dimension into views, whose gradients go back as
//! one concatenation (torch's `split` and its `SplitBackward`). burn differentiates each `narrow` on its own: a zero tensor of the whole input's shape, the
//! part's gradient written into it, then the parts' zero-padded gradients added up, a memset, a
//! copy and an addition a part. Here the parts' gradients are collected as they arrive and sent
//! on as one `cat`, zeros standing in only for a part nothing differentiated.
//!
//! The graph: the input, then a node that passes it through (`Joint`), then one node per part
//! (`Piece`) reading the joint. burn's backward runs a node after every deeper one (a node's depth
//! is one more than its deepest parent's), so every part has handed in its gradient when the
//! joint's step runs. The joint's output is never given out, so nothing else registers a gradient
//! on it.
//!
//! [`owned`]: a view copied into storage of its own, so what is saved of it does not keep the
//! tensor it viewed alive.
//!
//! [`backward_from`]: a backward pass that starts from a given gradient at a tensor (torch's
//! `y.backward(dy)`), where `(y * dy).sum().backward()` multiplied, summed, then differentiated both.

// burn marks burn-tch deprecated in favour of CubeCL backends; this project runs on LibTorch on
// purpose, so the deprecation is expected here.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, tensor::FloatTensor};
use burn::tensor::Tensor;
use burn_tch::{LibTorch, TchTensor};

/// The autodiff backend the model's tensors live on (burn's `Device::libtorch().autodiff()`).
pub type Ad = Autodiff<LibTorch>;

/// `x` cut along dimension `dim` into parts of `sizes` (views of `x`, in order), differentiable
/// as one operation.
///
/// # Shapes
/// - x: `[..., Σ sizes, ...]` → `[..., sizes[i], ...]` each
///
/// # Panics
/// If `sizes` do not add up to dimension `dim`.
pub fn split<const D: usize, const K: usize>(x: Tensor<D>, dim: usize, sizes: [usize; K]) -> [Tensor<D>; K] {
    let width = x.dims()[dim];
    assert_eq!(sizes.iter().sum::<usize>(), width, "split sizes {sizes:?} of a dimension of {width}");
    let offsets: [usize; K] = std::array::from_fn(|i| sizes[..i].iter().sum());
    let narrow = |t: &tch::Tensor, i: usize| t.narrow(dim as i64, offsets[i] as i64, sizes[i] as i64);
    if !x.is_autodiff() {
        let (t, origin) = crate::bridge::on_libtorch(x, "a split tensor");
        return std::array::from_fn(|i| crate::bridge::from_tch(narrow(&t, i), origin));
    }
    let (value, node) = on_autodiff(x, "a split tensor").into_parts();
    let slots = Arc::new(Slots { grads: Mutex::new(vec![None; K]), sizes: sizes.to_vec(), dim });
    let joint = match Joint.prepare::<NoCheckpointing>([node]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(slots.clone(), value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    };
    std::array::from_fn(|i| {
        let part = narrow(&joint.primitive().tensor, i);
        let out = match Piece.prepare::<NoCheckpointing>([joint.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((slots.clone(), i), TchTensor::new(part)),
            OpsKind::UnTracked(prep) => prep.finish(TchTensor::new(part)),
        };
        Tensor::from_primitive::<Ad>(out)
    })
}

/// The parts' gradients as they arrive.
#[derive(Debug)]
struct Slots {
    grads: Mutex<Vec<Option<TchTensor>>>,
    sizes: Vec<usize>,
    /// The dimension cut.
    dim: usize,
}

/// The node the parts read: its backward sends their gradients on, concatenated.
#[derive(Debug)]
struct Joint;

impl Backward<LibTorch, 1> for Joint {
    type State = Arc<Slots>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [Some(parent)] = ops.parents else { return };
        let slots = ops.state;
        let parts = std::mem::take(&mut *slots.grads.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        // The joint's step runs only when some part was reached, so one gradient gives the
        // shape and dtype of the zeros standing in for a part that was not.
        let Some(like) = parts.iter().flatten().next().map(|g| g.tensor.shallow_clone()) else { return };
        let dim = slots.dim;
        let mut parts: Vec<TchTensor> = parts
            .into_iter()
            .zip(&slots.sizes)
            .map(|(g, &n)| {
                g.unwrap_or_else(|| {
                    let mut size = like.size();
                    size[dim] = n as i64;
                    TchTensor::new(tch::Tensor::zeros(size.as_slice(), (like.kind(), like.device())))
                })
            })
            .collect();
        let whole = match parts.len() {
            1 => parts.remove(0),
            _ => TchTensor::new(cat_as_laid(&parts.iter().map(|p| &p.tensor).collect::<Vec<_>>(), dim)),
        };
        grads.register::<LibTorch>(parent.id, whole);
    }
}

/// `parts` concatenated along `dim`. Parts cut along their last dimension and laid out by
/// columns (dense with the last dimension outermost, as `model::linear`'s products laid out by
/// columns make them) are joined so too, a dense copy of each, where torch's `cat` would write
/// by rows and read them across.
fn cat_as_laid(parts: &[&tch::Tensor], dim: usize) -> tch::Tensor {
    let last = parts[0].dim().saturating_sub(1);
    if dim != last || last == 0 || !parts.iter().all(|p| by_columns(p)) {
        return tch::Tensor::cat(parts, dim as i64);
    }
    let moved: Vec<tch::Tensor> = parts.iter().map(|p| p.movedim_int(-1, 0)).collect();
    tch::Tensor::cat(&moved, 0).movedim_int(0, -1)
}

/// Whether `t` is dense with its last dimension outermost, read from its strides. Where the last
/// dimension or the rest holds one element, the two layouts are one: `false`.
fn by_columns(t: &tch::Tensor) -> bool {
    let (size, stride) = (t.size(), t.stride());
    let Some((&n, rows)) = size.split_last() else { return false };
    if n <= 1 || rows.iter().product::<i64>() <= 1 {
        return false;
    }
    let mut dense = 1;
    for (d, &len) in rows.iter().enumerate().rev() {
        if len != 1 && stride[d] != dense {
            return false;
        }
        dense *= len;
    }
    stride[rows.len()] == dense
}

/// One part: its backward hands its gradient to the joint.
#[derive(Debug)]
struct Piece;

impl Backward<LibTorch, 1> for Piece {
    type State = (Arc<Slots>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<LibTorch>(&ops.node);
        let (slots, i) = ops.state;
        slots.grads.lock().unwrap_or_else(std::sync::PoisonError::into_inner)[i] = Some(g);
    }
}

/// The gradients of `Σ y ⊙ dy`: a backward pass from `y` whose gradient there is `dy` (same shape).
pub fn backward_from<const D: usize>(y: Tensor<D>, dy: Tensor<D>) -> burn::tensor::Gradients {
    // dy's own primitive, which knows whether its storage is shared: burn's backward writes in
    // place into a gradient it holds alone, and the caller may still read dy.
    let dy = match dy.inner().try_into_primitive::<LibTorch>() {
        Ok(dy) => dy,
        Err(e) => panic!("a seed gradient off LibTorch: {e:?}"),
    };
    let (value, node) = on_autodiff(y, "a seeded tensor").into_parts();
    // The root's value is never read: its gradient, ones, goes to `Seed`, which passes dy on.
    let root = TchTensor::new(tch::Tensor::empty([1], (value.tensor.kind(), value.tensor.device())));
    let root = match Seed.prepare::<NoCheckpointing>([node]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(dy, root),
        OpsKind::UnTracked(prep) => prep.finish(root),
    };
    Tensor::<1>::from_primitive::<Ad>(root).backward()
}

/// The root of [`backward_from`]'s pass: registers its state, `dy`, as its parent's gradient.
#[derive(Debug)]
struct Seed;

impl Backward<LibTorch, 1> for Seed {
    type State = TchTensor;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let _ = grads.consume::<LibTorch>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        grads.register::<LibTorch>(parent.id, ops.state);
    }
}

/// `x` in storage of its own (a dense copy where it is a view that is not, else `x` itself), with
/// the identity's gradient: a node that saves it for the backward then keeps it alone, not the
/// wider tensor it viewed. Off the graph (nothing saved), `x` as it is.
pub fn owned<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if !x.is_autodiff() {
        return x;
    }
    let (value, node) = on_autodiff(x, "an owned tensor").into_parts();
    let dense = match value.tensor.is_contiguous() {
        true => value,
        false => TchTensor::new(value.tensor.contiguous()),
    };
    let out = match Own.prepare::<NoCheckpointing>([node]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((), dense),
        OpsKind::UnTracked(prep) => prep.finish(dense),
    };
    Tensor::from_primitive::<Ad>(out)
}

/// [`owned`]'s node: the gradient passes through.
#[derive(Debug)]
struct Own;

impl Backward<LibTorch, 1> for Own {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<LibTorch>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        grads.register::<LibTorch>(parent.id, g);
    }
}

/// A tensor under autodiff as a node's operand (`what` names it if it is not one).
pub fn on_autodiff<const D: usize>(t: Tensor<D>, what: &str) -> FloatTensor<Ad> {
    match t.try_into_primitive::<Ad>() {
        Ok(primitive) => primitive,
        Err(e) => panic!("{what} off Autodiff<LibTorch>: {e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, FloatDType};

    use super::*;

    /// Deterministic values of `shape`, differing by `seed` (no generator involved).
    fn normal<const D: usize>(shape: [usize; D], seed: f32, device: &Device) -> Tensor<D> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|i| ((i as f32 + 1.0) * (0.37 + seed)).sin() * 1.7).collect();
        Tensor::<D>::from_data(burn::tensor::TensorData::new(values, shape), device)
    }

    /// The parts are burn's `narrow`s of the input, and the input's gradient through them is
    /// burn's bit for bit: every part used, a part unused (its gradient zero), and a part used
    /// twice; on a plain device the parts are views of the input.
    #[test]
    fn a_split_is_burns_narrows_bit_for_bit() {
        let device = Device::libtorch().autodiff();
        for dtype in [FloatDType::F32, FloatDType::BF16] {
            let x = normal([2, 3, 9], 0.0, &device).cast(dtype).require_grad();
            let w = |i: usize| normal([2, 3, [4, 2, 3][i]], 1.0 + i as f32, &device).cast(dtype);
            let narrows = |x: &Tensor<3>| [(0, 4), (4, 2), (6, 3)].map(|(at, n)| x.clone().narrow(2, at, n)).to_vec();
            let loss = |parts: Vec<Tensor<3>>, uses: [usize; 3]| {
                let mut total = Tensor::<1>::zeros([1], &device).cast(dtype);
                for (i, p) in parts.into_iter().enumerate() {
                    for _ in 0..uses[i] {
                        total = total + (p.clone() * w(i)).sum();
                    }
                }
                total
            };
            for uses in [[1, 1, 1], [1, 0, 1], [2, 1, 0]] {
                let ours = split(x.clone(), 2, [4, 2, 3]).to_vec();
                for (a, b) in ours.iter().zip(narrows(&x)) {
                    a.to_data().assert_eq(&b.to_data(), true);
                }
                let (g1, g2) = (loss(ours, uses).backward(), loss(narrows(&x), uses).backward());
                x.grad(&g1).unwrap().to_data().assert_eq(&x.grad(&g2).unwrap().to_data(), true);
            }
        }
        let plain = normal([2, 6], 0.5, &Device::libtorch());
        let parts = split(plain.clone(), 1, [1, 5]);
        let ptr = |t: &Tensor<2>| crate::bridge::on_libtorch(t.clone(), "test").0.data_ptr() as usize;
        assert_eq!(ptr(&parts[1]), ptr(&plain) + 4, "a view one f32 into the row");
        parts[1].to_data().assert_eq(&plain.narrow(1, 1, 5).to_data(), true);
    }

    /// Parts laid out by columns (the last dimension outermost) are joined laid out so, with the
    /// values of torch's `cat`; parts by rows are joined by it.
    #[test]
    fn parts_by_columns_join_by_columns() {
        let laid = |n: i64, seed: f64| {
            tch::Tensor::arange(n * 6, (tch::Kind::Float, tch::Device::Cpu)).view([n, 1, 6]).movedim_int(0, -1) * seed
        };
        let parts = [laid(3, 1.0), laid(2, -0.5)]; // [1, 6, 3] and [1, 6, 2]
        let whole = cat_as_laid(&[&parts[0], &parts[1]], 2);
        assert!(whole.equal(&tch::Tensor::cat(&parts, 2)));
        assert!(whole.movedim_int(-1, 0).is_contiguous() && by_columns(&whole), "by columns");
        assert!(by_columns(&parts[1]) && !by_columns(&whole.contiguous()), "read from the strides");
        let rows = parts.each_ref().map(|p| p.contiguous());
        assert!(cat_as_laid(&[&rows[0], &rows[1]], 2).is_contiguous(), "by rows");
    }

    /// An owned part of a split is a dense copy of the view (the same values) with the view's
    /// gradient; a dense tensor stays itself.
    #[test]
    fn an_owned_view_is_a_copy_with_the_same_gradient() {
        let device = Device::libtorch().autodiff();
        let x = normal([3, 8], 0.2, &device).require_grad();
        let w = normal([3, 5], 1.4, &device);
        let view = || {
            let [_, view] = split(x.clone(), 1, [3, 5]);
            view
        };
        let own = owned(view());
        let ptr = |t: &Tensor<2>| crate::bridge::on_libtorch(t.clone(), "test").0.data_ptr() as usize;
        assert_ne!(ptr(&own), ptr(&view()), "copied");
        own.to_data().assert_eq(&view().to_data(), true);
        let (a, b) = (backward_from(own, w.clone()), backward_from(view(), w));
        x.grad(&a).unwrap().to_data().assert_eq(&x.grad(&b).unwrap().to_data(), true);
        let dense = normal([2, 2], 0.1, &device).require_grad();
        assert_eq!(ptr(&owned(dense.clone())), ptr(&dense), "not copied");
    }

    /// A pass seeded with `dy` at `y` gives the gradients of `(y * dy).sum()`, bit for bit, in f32
    /// and bf16, through a parameter used twice.
    #[test]
    fn a_seeded_pass_is_the_weighted_sums() {
        let device = Device::libtorch().autodiff();
        for dtype in [FloatDType::F32, FloatDType::BF16] {
            let w = normal([4, 5], 0.3, &device).cast(dtype).require_grad();
            let x = normal([3, 4], 0.9, &device).cast(dtype);
            // Each pass on a graph of its own (burn does not keep one for a second backward).
            let y = || x.clone().matmul(w.clone()).tanh() * w.clone().sum_dim(0); // [3, 5]
            let dy = normal([3, 5], 2.0, &device).cast(dtype);
            let (ours, summed) = (backward_from(y(), dy.clone()), (y() * dy).sum().backward());
            w.grad(&ours).unwrap().to_data().assert_eq(&w.grad(&summed).unwrap().to_data(), true);
        }
    }
}
