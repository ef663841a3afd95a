//! The projection every transformer block is made of: `y = x·W + b`, optionally with a LoRA
//! adapter added beside the frozen weight (Hu et al. 2021, as PEFT's `lora.Linear`):
//!
//! `y = x·W + b + dropout(x)·A·B · α/r`
//!
//! or its DoRA form (Liu et al. 2024, PEFT's `DoraLinearLayer`), where a trained magnitude `m`
//! rescales each output column of the adapted weight to `m / ‖W + A·B·α/r‖`:
//!
//! `y = x·W + b + (s - 1)·x·W + s·dropout(x)·A·B · α/r`, `s = m / ‖W + A·B·α/r‖` (the norm a constant)
//!
//! `W` is stored `[in, out]` (burn's orientation; HF checkpoints hold `[out, in]` and are
//! transposed on the way in and out). The weight is cast to the input's dtype, so one module
//! serves f32 training, mixed precision over f32 master weights, and a frozen half-precision base.
//!
//! The projection with its casts is one graph node ([`project`]): the weight gradient comes back in
//! the master's dtype from the product itself on CUDA (`torch.mm(..., out_dtype=float32)`, no
//! cast kernel) and the bias gradient from one sum in f32, where burn's autodiff differentiated a
//! cast, a reshape, a product and a broadcast addition one by one.
//!
//! Projections of one input (a layer's q, k and v; gate and up) run as one product over their
//! weights side by side ([`Linear::forward_group`]): on a GPU each product is a launch and
//! cuBLAS's host time (about a third of a small model's step, results/gpu/), and the narrow k and
//! v products (128 columns on the 0.5B shape) leave most of the device idle.

// burn marks burn-tch deprecated in favour of CubeCL backends; this project runs on LibTorch on
// purpose, so the deprecation is expected here.
#![allow(deprecated)]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::module::{Module, Param};
use burn::tensor::module::linear;
use burn::tensor::{Distribution, FloatDType, Tensor};
use burn_tch::{LibTorch, TchTensor};
use dpo_torch::dtype::{as_kind, grad_kind};
use dpo_torch::fallback::FastPath;
use dpo_torch::product::{addmm, mm};

use dpo_torch::graph::{Ad, on_autodiff, split};

/// A linear layer, with an optional LoRA adapter.
#[derive(Module, Debug)]
pub struct Linear {
    /// `[in, out]`
    pub weight: Param<Tensor<2>>,
    /// `[out]`
    pub bias: Option<Param<Tensor<1>>>,
    pub lora: Option<Lora>,
}

/// A low-rank update `A·B` scaled by `α/r`. `B` starts at zero, so a fresh adapter leaves the
/// layer's output unchanged.
#[derive(Module, Debug)]
pub struct Lora {
    /// `[in, r]` (PEFT's `lora_A.weight` is `[r, in]`)
    pub a: Param<Tensor<2>>,
    /// `[r, out]` (PEFT's `lora_B.weight` is `[out, r]`)
    pub b: Param<Tensor<2>>,
    /// `α / r`
    #[module(skip)]
    pub scale: f64,
    /// Probability of zeroing an input feature of the adapter path; only ever non-zero on the
    /// policy being trained (evaluation copies switch it off).
    #[module(skip)]
    pub dropout: f64,
    /// DoRA's magnitude `m`, `[out]` (PEFT's `lora_magnitude_vector`); `None`: plain LoRA.
    pub magnitude: Option<Param<Tensor<1>>>,
}

impl Linear {
    /// # Shapes
    /// - x: `[..., in]` → `[..., out]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let y = project(x.clone(), self.weight.val(), self.bias.as_ref().map(Param::val)); // [..., out]
        self.adapt(x, y)
    }

    /// The projections of one input by each of `group` (q, k and v; gate and up): as one product
    /// over their weights side by side where that saves more than it costs (see [`fuses`]), then
    /// cut into each one's output, each adapter added to its own.
    ///
    /// # Shapes
    /// - x: `[..., in]` → `[..., out_i]` each
    pub fn forward_group<const D: usize, const K: usize>(x: Tensor<D>, group: [&Linear; K]) -> [Tensor<D>; K] {
        if !fuses(&x, &group) {
            return group.map(|l| l.forward(x.clone()));
        }
        let widths = group.map(|l| l.weight.dims()[1]);
        let mut ys = split(project_group(x.clone(), &group, Columns(false)), D - 1, widths).into_iter();
        group.map(|l| match ys.next() {
            Some(y) => l.adapt(x.clone(), y),
            None => unreachable!("one part a projection"),
        })
    }

    /// [`Linear::forward_group`] with each output laid out column by column (the transpose of a
    /// dense `[out_i, rows]`) where the group joins without adapters, so that
    /// elementwise work over the parts (SwiGLU's gate and up) reads and writes dense blocks: row
    /// by row, each part is a strided slice of the joined rows, which CUDA's elementwise kernels
    /// take only by their general, unvectorised path. A product that reads the result (the down
    /// projection) takes its transpose as it is, and its input's gradient comes back laid out so.
    ///
    /// # Shapes
    /// - x: `[..., in]` → `[..., out_i]` each
    pub fn forward_group_by_columns<const D: usize, const K: usize>(
        x: Tensor<D>,
        group: [&Linear; K],
    ) -> [Tensor<D>; K] {
        if !joins_plainly(&x, &group) {
            return Self::forward_group(x, group);
        }
        split(project_group(x, &group, Columns(true)), D - 1, group.map(|l| l.weight.dims()[1]))
    }

    /// The projections of `x` by each of `group` side by side, as one product, where
    /// [`Linear::forward_group`] would join them and none has an adapter; else `None`.
    ///
    /// # Shapes
    /// - x: `[..., in]` → `[..., Σ out_i]`
    pub fn forward_joined<const D: usize, const K: usize>(x: Tensor<D>, group: [&Linear; K]) -> Option<Tensor<D>> {
        joins_plainly(&x, &group).then(|| project_group(x, &group, Columns(false)))
    }

    /// Moves the frozen weights of `group` (and their biases) into one buffer, side by side,
    /// each `Linear`'s own a view of it, so that [`Linear::forward_group`] multiplies by the
    /// buffer where it copied the weights together every pass (a frozen reference, a LoRA base):
    /// three copies a layer and pass fewer. Left as they are where a weight trains or has an
    /// adapter, or the group differs in dtype, device or bias; nothing writes into a frozen
    /// weight, and each view keeps the whole buffer.
    pub fn share_storage<const K: usize>(group: [&mut Linear; K]) {
        let frozen = group.iter().all(|l| l.lora.is_none() && !l.weight.val().is_require_grad());
        let biased = group.iter().filter(|l| l.bias.is_some()).count();
        if K < 2 || !frozen || (biased != 0 && biased != K) {
            return;
        }
        let Some(weights) = side_by_side(group.each_ref().map(|l| l.weight.val())) else { return };
        let biases = group.each_ref().map(|l| l.bias.as_ref().map(Param::val));
        let biases =
            biases.into_iter().collect::<Option<Vec<_>>>().and_then(|b| side_by_side::<1, K>(b.try_into().ok()?));
        for (i, l) in group.into_iter().enumerate() {
            let view = weights[i].clone();
            l.weight = l.weight.clone().map(|_| view);
            if let (Some(bias), Some(views)) = (l.bias.as_mut(), &biases) {
                let view = views[i].clone();
                *bias = bias.clone().map(|_| view);
            }
        }
    }

    /// `y`, the base projection of `x`, with the adapter's update added (none: `y`).
    fn adapt<const D: usize>(&self, x: Tensor<D>, y: Tensor<D>) -> Tensor<D> {
        let Some(lora) = &self.lora else { return y };
        let dropped = lora.dropped(x);
        let update = lora.update(dropped.clone()); // [..., out]
        let Some(magnitude) = &lora.magnitude else { return y + update };
        let dtype = FloatDType::from(y.dtype());
        // PEFT's `DoraLinearLayer.forward`: the base output without its bias, recomputed from the
        // dropped input where dropout trains.
        let base = match self.bias.as_ref().map(Param::val) {
            _ if lora.dropout > 0.0 => project(dropped, self.weight.val(), None),
            Some(b) => y.clone() - b.cast(dtype).unsqueeze::<D>(),
            None => y.clone(),
        };
        let s = lora.dora_scale(self.weight.val(), magnitude.val()).cast(dtype).unsqueeze::<D>(); // [1, .., out]
        y + (s.clone() - 1.0) * base + s * update
    }

    /// Folds the adapter into the weight and removes it: `W + A·B·α/r` (DoRA: each column then
    /// scaled to its magnitude), in f32 (a half-precision base would round the update away).
    pub fn merge(&mut self) {
        let Some(lora) = self.lora.take() else { return };
        let merged = lora.adapted(self.weight.val()); // [in, out]
        self.weight = Param::from_tensor(match &lora.magnitude {
            Some(m) => merged * lora.dora_scale(self.weight.val(), m.val()).unsqueeze::<2>(),
            None => merged,
        });
    }
}

/// `x` projected by the weights (and biases) of `group` side by side, laid out by `columns`:
/// `[..., Σ out_i]`.
fn project_group<const D: usize>(x: Tensor<D>, group: &[&Linear], columns: Columns) -> Tensor<D> {
    project_laid(x, group.iter().map(|l| (l.weight.val(), l.bias.as_ref().map(Param::val))).collect(), columns)
}

/// Whether `group` joins over `x` ([`fuses`]) with no adapter to add to a part.
fn joins_plainly<const D: usize>(x: &Tensor<D>, group: &[&Linear]) -> bool {
    fuses(x, group) && group.iter().all(|l| l.lora.is_none())
}

/// Whether a product's output is laid out column by column: the transpose of a dense
/// `[out, rows]`, where `false` is row by row (dense `[rows, out]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Columns(bool);

impl Columns {
    /// How the `[rows, n]` matrix `m` lies: by columns where it is the transpose of a dense
    /// `[n, rows]` (and neither side is 1, where both layouts are one).
    fn of(m: &tch::Tensor) -> Self {
        let (size, stride) = (m.size(), m.stride());
        Self(size.len() == 2 && size[0] > 1 && size[1] > 1 && stride == [1, size[0]])
    }
}

/// Whether [`Linear::forward_group`] runs `group` over `x` as one product: two or more
/// projections, all with a bias or none, and at least as many rows as inputs (`rows ≥ in`). Joining
/// the weights copies them once a pass (or casts them, as each use would anyway), at most one more
/// write of the output the product makes; a decoding step of a few rows would copy a large model's
/// weights for every token. The dtypes take no part: the same batch computes the same way however
/// the weights are held (ZeRO-3 gathers a frozen bf16 base in f32, plain data parallelism keeps it
/// in bf16), as the sums the joined product groups differently round differently.
fn fuses<const D: usize>(x: &Tensor<D>, group: &[&Linear]) -> bool {
    let rows: usize = x.dims()[..D - 1].iter().product();
    let biased = group.iter().filter(|l| l.bias.is_some()).count();
    group.len() > 1 && (biased == 0 || biased == group.len()) && group.iter().all(|l| rows >= l.weight.dims()[0])
}

impl Lora {
    /// The adapter's input: `x` with dropout while it trains.
    fn dropped<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        if self.dropout == 0.0 {
            return x;
        }
        let keep = 1.0 - self.dropout;
        // Drawn from the device generator: a checkpointed layer reseeds it to redraw the same mask.
        let mask = x.random_like(Distribution::Bernoulli(keep));
        x * mask / keep
    }

    /// `x·A·B·α/r` of the (dropped) input, A and B cast to x's dtype by the projection node (which
    /// keeps its operands in that dtype for the backward).
    ///
    /// # Shapes
    /// - x: `[..., in]` → `[..., out]`
    fn update<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let down = project(x, self.a.val(), None); // [..., r]
        project(down, self.b.val(), None) * self.scale // [..., out]
    }

    /// `W + A·B·α/r` in f32, off the graph.
    ///
    /// # Shapes
    /// - weight: `[in, out]` → `[in, out]`
    fn adapted(&self, weight: Tensor<2>) -> Tensor<2> {
        let f32 = |t: Tensor<2>| t.detach().cast(FloatDType::F32);
        f32(weight) + f32(self.a.val()).matmul(f32(self.b.val())) * self.scale
    }

    /// DoRA's column scale `m / ‖W + A·B·α/r‖`, f32, the norm computed off the graph (PEFT
    /// detaches it, as the paper's section 4.3 suggests): only `m` gets a gradient here.
    ///
    /// # Shapes
    /// - weight: `[in, out]`, magnitude: `[out]` → `[out]`
    fn dora_scale(&self, weight: Tensor<2>, magnitude: Tensor<1>) -> Tensor<1> {
        magnitude.cast(FloatDType::F32) / column_norms(&self.adapted(weight))
    }
}

/// The norm of each output column of `weight` (`[in, out]` → `[out]`, f32, off the graph): DoRA's
/// starting magnitude, as PEFT sets it where the fresh `B = 0`.
pub fn column_norms(weight: &Tensor<2>) -> Tensor<1> {
    let out = weight.dims()[1];
    weight.clone().detach().cast(FloatDType::F32).square().sum_dim(0).sqrt().reshape([out])
}

/// `x·W + b` as one matrix product over every leading position. burn's `linear` keeps a batched
/// input batched (`[B, S, in] @ [1, in, out]`), which torch runs as a `bmm` against the weight
/// expanded per batch, and its half-precision (oneDNN) kernels copy that expansion on every call,
/// forward and backward. On a CPU that multiplies half precision on f32 copies
/// ([`dpo_torch::product`]) it is [`project`], whose node keeps its operands in their dtype for
/// the backward and multiplies in blocks (burn's product of f32 casts would keep f32 copies).
///
/// # Shapes
/// - x: `[..., in]`, weight: `[in, out]`, bias: `[out]` → `[..., out]`
pub fn linear_rows<const D: usize>(x: Tensor<D>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<D> {
    let t = dpo_torch::bridge::on_libtorch(x.clone(), "a linear layer's input").0;
    if dpo_torch::product::widens(t.kind(), t.device()) {
        return project(x, weight, bias);
    }
    let mut dims = x.dims();
    let rows = dims[..D - 1].iter().product();
    let y = linear(x.reshape([rows, dims[D - 1]]), weight, bias); // [rows, out]
    dims[D - 1] = y.dims()[1];
    y.reshape(dims)
}

/// `x·W + b` over every leading position, `W` and `b` cast to x's dtype as they are used, as one
/// graph node whose gradients come back in their masters' dtypes ([`grad_kind`]: f32 for a compute-dtype copy).
///
/// # Shapes
/// - x: `[..., in]`, weight: `[in, out]`, bias: `[out]` → `[..., out]`
pub fn project<const D: usize>(x: Tensor<D>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<D> {
    project_many(x, vec![(weight, bias)])
}

/// [`project`] by several weights at once: `x·[W₁|…|W_k] + [b₁|…|b_k]`, one product over the
/// weights side by side (cast as they are joined), whose backward takes the input's gradient by
/// one product too and each weight's gradient from its own columns of the output's.
///
/// # Shapes
/// - x: `[..., in]`, parts: (`[in, out_i]`, `[out_i]`) → `[..., Σ out_i]`
///
/// # Panics
/// If some parts have a bias and others none, or the operands (x, the weights, the biases) are
/// more than seven.
pub fn project_many<const D: usize>(x: Tensor<D>, parts: Vec<(Tensor<2>, Option<Tensor<1>>)>) -> Tensor<D> {
    project_laid(x, parts, Columns(false))
}

/// [`project_many`] with its output laid out by `columns`.
fn project_laid<const D: usize>(
    x: Tensor<D>,
    parts: Vec<(Tensor<2>, Option<Tensor<1>>)>,
    columns: Columns,
) -> Tensor<D> {
    let k = parts.len();
    let (weights, biases): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
    let biases: Vec<Tensor<1>> = biases.into_iter().flatten().collect();
    assert!(biases.is_empty() || biases.len() == k, "a bias on some of the projections joined, not all");
    if !x.is_autodiff() {
        let tch = |t: Tensor<2>| dpo_torch::bridge::on_libtorch(t, "a projection's weight").0;
        let (x, origin) = dpo_torch::bridge::on_libtorch(x, "a projection's input");
        let w: Vec<_> = weights.into_iter().map(tch).collect();
        let b: Vec<_> =
            biases.into_iter().map(|b| dpo_torch::bridge::on_libtorch(b, "a projection's bias").0).collect();
        let [y, ..] = projected(&x, &w, &b, columns);
        return dpo_torch::bridge::from_tch(y, origin);
    }
    let what = "a projection's operand";
    let inputs: Vec<FloatTensor<Ad>> = std::iter::once(on_autodiff(x, what))
        .chain(weights.into_iter().map(|w| on_autodiff(w, what)))
        .chain(biases.into_iter().map(|b| on_autodiff(b, what)))
        .collect();
    let y = match inputs.len() {
        2 => linear_node::<2>(inputs, k, columns),
        3 => linear_node::<3>(inputs, k, columns),
        4 => linear_node::<4>(inputs, k, columns),
        5 => linear_node::<5>(inputs, k, columns),
        6 => linear_node::<6>(inputs, k, columns),
        7 => linear_node::<7>(inputs, k, columns),
        n => panic!("{k} projections joined ({n} operands): at most seven operands are"),
    };
    Tensor::from_primitive::<Ad>(y)
}

/// The weights (or biases) side by side along `dim`, in `kind`: one of them as it is where it is
/// in `kind` already.
fn joined(parts: &[tch::Tensor], dim: i64, kind: tch::Kind) -> tch::Tensor {
    match parts {
        [one] => as_kind(one, kind),
        _ => match adjacent(parts) {
            Some(whole) => as_kind(&whole, kind),
            None => as_kind(&tch::Tensor::cat(parts, dim), kind),
        },
    }
}

/// The parts as one tensor along their last dimension without a copy, where they are views of
/// one buffer side by side in order ([`Linear::share_storage`]); else `None`. torch checks the
/// view against the buffer's storage, so parts that merely sit next to each other in memory are
/// refused there.
fn adjacent(parts: &[tch::Tensor]) -> Option<tch::Tensor> {
    let first = parts.first()?;
    let last = first.dim().checked_sub(1)?;
    let mut size = first.size();
    size[last] = parts.iter().map(|p| p.size().get(last).copied().unwrap_or(0)).sum();
    // The strides of the whole, contiguous, which each part shares.
    let mut stride = vec![1i64; size.len()];
    for d in (0..last).rev() {
        stride[d] = stride[d + 1] * size[d + 1];
    }
    let bytes = first.kind().elt_size_in_bytes();
    let mut at = first.data_ptr() as usize;
    for p in parts {
        let fits = p.kind() == first.kind() && p.device() == first.device() && p.dim() == first.dim();
        if !(fits && p.size()[..last] == size[..last] && p.stride() == stride && p.data_ptr() as usize == at) {
            return None;
        }
        at += p.size()[last] as usize * bytes;
    }
    first.f_as_strided(size.as_slice(), stride.as_slice(), None).ok()
}

/// `tensors` moved into one buffer along their last dimension, each returned as its view of it.
fn side_by_side<const D: usize, const K: usize>(tensors: [Tensor<D>; K]) -> Option<[Tensor<D>; K]> {
    let what = "a frozen weight";
    let origin = dpo_torch::bridge::on_libtorch(tensors[0].clone(), what).1;
    let parts = tensors.map(|t| dpo_torch::bridge::on_libtorch(t, what).0);
    let kind = parts[0].kind();
    if parts.iter().any(|p| p.kind() != kind || p.device() != parts[0].device()) {
        return None;
    }
    let whole = tch::Tensor::cat(&parts, (D - 1) as i64);
    let mut start = 0;
    Some(parts.map(|p| {
        let width = p.size()[D - 1];
        let view = whole.narrow((D - 1) as i64, start, width);
        start += width;
        dpo_torch::bridge::from_tch(view, origin)
    }))
}

/// `(x·W + b, W in x's dtype, x's rows)` for the weights and biases joined ([`joined`]; no biases
/// or one each): one `addmm` (transformers' `F.linear`) or `mm` over the rows
/// (`[rows, in]`, a view of x), the output laid out by `columns`.
fn projected(x: &tch::Tensor, weights: &[tch::Tensor], biases: &[tch::Tensor], columns: Columns) -> [tch::Tensor; 3] {
    let w = joined(weights, 1, x.kind());
    let size = x.size();
    let (leading, inner) = size.split_at(size.len().saturating_sub(1));
    let rows = x.reshape([-1, inner.iter().product()]); // [rows, in]
    let y = match (biases.is_empty(), columns.0) {
        (false, false) => addmm(&joined(biases, 0, x.kind()), &rows, &w),
        // The bias a column broadcast over `[out, rows]`.
        (false, true) => addmm(&joined(biases, 0, x.kind()).unsqueeze(1), &w.tr(), &rows.tr()).tr(),
        (true, false) => mm(&rows, &w),
        (true, true) => mm(&w.tr(), &rows.tr()).tr(),
    }; // [rows, out]
    let out: Vec<i64> = leading.iter().copied().chain([w.size()[1]]).collect();
    [y.reshape(out.as_slice()), w, rows]
}

/// [`project_many`] under autodiff over `[x, W₁..W_k, b₁..b_k]` (N = 1 + k or 1 + 2k): the output,
/// and what the backward reads of the inputs that take a gradient (the rows of x for the
/// weights', the joined weight for the input's, as the product's own backward would keep them).
fn linear_node<const N: usize>(inputs: Vec<FloatTensor<Ad>>, k: usize, columns: Columns) -> FloatTensor<Ad> {
    let Ok(inputs) = <[FloatTensor<Ad>; N]>::try_from(inputs) else { unreachable!("N operands") };
    let tracked = inputs.each_ref().map(|t| t.is_tracked());
    let mut values = Vec::with_capacity(N);
    let nodes = inputs.map(|t| {
        let (value, node) = t.into_parts();
        values.push(value.tensor);
        node
    });
    let (x, weights, biases) = (&values[0], &values[1..=k], &values[k + 1..]);
    let [y, w, rows] = projected(x, weights, biases, columns);
    let x_columns = Columns::of(&rows);
    match CastLinear.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let kinds = |ts: &[tch::Tensor], tracked: &[bool]| {
                ts.iter().zip(tracked).map(|(t, &on)| on.then(|| grad_kind(t.kind()))).collect()
            };
            let widths = weights.iter().map(|w| w.size()[1]).collect();
            // The input's gradient reads the joined weight: kept where it is a cast (as the casts
            // it replaces were), else joined again then (holding no copy of frozen weights).
            let cast = weights.iter().any(|w| w.kind() != x.kind());
            let weight = tracked[0].then(|| match k == 1 || cast {
                true => Weight::Kept(TchTensor::new(w)),
                false => Weight::Joined(weights.iter().map(|w| TchTensor::new(w.shallow_clone())).collect()),
            });
            let saved = Saved {
                rows: tracked[1..=k].contains(&true).then(|| TchTensor::new(rows)),
                weight,
                x_size: x.size(),
                x_columns,
                widths,
                weight_kinds: kinds(weights, &tracked[1..=k]),
                bias_kinds: kinds(biases, &tracked[k + 1..]),
            };
            prep.finish(saved, TchTensor::new(y))
        }
        OpsKind::UnTracked(prep) => prep.finish(TchTensor::new(y)),
    }
}

/// [`project_many`]'s graph node.
#[derive(Debug)]
struct CastLinear;

/// The joined weight [`CastLinear`]'s backward multiplies by.
#[derive(Debug, Clone)]
enum Weight {
    /// `[in, Σ out]` in x's dtype.
    Kept(TchTensor),
    /// The weights as they are, in x's dtype, joined again in the backward.
    Joined(Vec<TchTensor>),
}

/// What [`CastLinear`]'s backward reads.
#[derive(Debug, Clone)]
struct Saved {
    /// `[rows, in]`, when some weight trains.
    rows: Option<TchTensor>,
    /// When x takes a gradient.
    weight: Option<Weight>,
    x_size: Vec<i64>,
    /// How x's rows lie; its gradient comes back laid out so.
    x_columns: Columns,
    /// Each weight's output columns.
    widths: Vec<i64>,
    /// The dtype each weight's and each bias's gradient comes back in ([`grad_kind`]), where it trains.
    weight_kinds: Vec<Option<tch::Kind>>,
    bias_kinds: Vec<Option<tch::Kind>>,
}

impl<const N: usize> Backward<LibTorch, N> for CastLinear {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<LibTorch>(&ops.node).tensor;
        let s = &ops.state;
        let g = g.reshape([-1, g.size()[g.dim() - 1]]); // [rows, Σ out]
        let (px, params) = (&ops.parents[0], &ops.parents[1..]);
        let (pw, pb) = params.split_at(s.widths.len());
        let starts: Vec<i64> = s.widths.iter().scan(0, |at, &n| Some(std::mem::replace(at, *at + n))).collect();
        // Part i's columns of a `[.., Σ out]` gradient along `dim` (the whole of it for one part).
        let part = |t: &tch::Tensor, dim: i64, i: usize| match s.widths.len() {
            1 => t.shallow_clone(),
            _ => t.narrow(dim, starts[i], s.widths[i]),
        };
        if let (Some(p), Some(w)) = (px, &s.weight) {
            let w = match w {
                Weight::Kept(w) => w.tensor.shallow_clone(),
                Weight::Joined(parts) => {
                    let parts: Vec<tch::Tensor> = parts.iter().map(|p| p.tensor.shallow_clone()).collect();
                    joined(&parts, 1, g.kind())
                }
            };
            let dx = match s.x_columns.0 {
                true => mm(&w, &g.tr()).tr(),
                false => mm(&g, &w.tr()),
            };
            let dx = dx.reshape(s.x_size.as_slice()); // [..., in]
            grads.register::<LibTorch>(p.id, TchTensor::new(dx));
        }
        for (i, (p, kind)) in pw.iter().zip(&s.weight_kinds).enumerate() {
            if let (Some(p), Some(rows), Some(kind)) = (p, &s.rows, kind) {
                grads.register::<LibTorch>(p.id, TchTensor::new(weight_grad(&rows.tensor, &part(&g, 1, i), *kind)));
            }
        }
        // One sum over the rows for every bias, then each bias's columns of it.
        if let Some(kind) = s.bias_kinds.iter().flatten().next() {
            let db = g.sum_dim_intlist([0i64].as_slice(), false, *kind); // [Σ out]
            for (i, (p, k)) in pb.iter().zip(&s.bias_kinds).enumerate() {
                if let (Some(p), Some(k)) = (p, k) {
                    grads.register::<LibTorch>(p.id, TchTensor::new(as_kind(&part(&db, 0, i), *k)));
                }
            }
        }
    }
}

/// `rowsᵀ·g` in f32, a master's gradient of burn tensors without a graph (the LM head's
/// hand-written backward): [`weight_grad`], written in f32 by the product on CUDA. A `partial`
/// product, one of several summed (the head's groups of rows), is accumulated in f32 on the CPU
/// too, from f32 copies of `2^24` elements of the wider operand at a time: a sum of bf16-rounded partial
/// products loses what cancels between them, as a pair's chosen and rejected rows do.
///
/// # Shapes
/// - rows: `[rows, in]`, g: `[rows, out]` → `[in, out]`
pub fn f32_weight_grad(rows: Tensor<2>, g: Tensor<2>, partial: bool) -> Tensor<2> {
    let tch = |t: Tensor<2>| dpo_torch::bridge::on_libtorch(t, "a weight gradient");
    let ((rows, origin), (g, _)) = (tch(rows), tch(g));
    let half = matches!(g.kind(), tch::Kind::BFloat16 | tch::Kind::Half);
    if !(half && partial) || g.device().is_cuda() {
        return dpo_torch::bridge::from_tch(weight_grad(&rows, &g, tch::Kind::Float), origin);
    }
    let (n, out) = (g.size()[0], g.size()[1]);
    // 2^24 elements of the wider operand at a time: `g`, or `rows` where the caller swaps them
    // for the transposed product (a tied head's `[V, hidden]` gradient).
    let step = ((1i64 << 24) / out.max(rows.size()[1]).max(1)).max(1);
    let mut acc = tch::Tensor::zeros([rows.size()[1], out], (tch::Kind::Float, g.device()));
    for start in (0..n).step_by(step as usize) {
        let len = step.min(n - start);
        let r = rows.narrow(0, start, len).to_kind(tch::Kind::Float);
        let _ = acc.addmm_(&r.tr(), &g.narrow(0, start, len).to_kind(tch::Kind::Float));
    }
    dpo_torch::bridge::from_tch(acc, origin)
}

/// `rowsᵀ·g` in `kind`: written in f32 by the product itself where CUDA can (half-precision
/// operands, an f32 master), else computed in the operands' dtype and cast.
///
/// # Shapes
/// - rows: `[rows, in]`, g: `[rows, out]` → `[in, out]`
fn weight_grad(rows: &tch::Tensor, g: &tch::Tensor, kind: tch::Kind) -> tch::Tensor {
    let half = matches!(g.kind(), tch::Kind::BFloat16 | tch::Kind::Half);
    product_in(rows, g, kind, g.device().is_cuda() && half && kind == tch::Kind::Float)
}

/// [`weight_grad`]'s product, by `mm` with `out_dtype` where `by_out_dtype` (and it has not
/// failed before), else computed in the operands' dtype and cast.
fn product_in(rows: &tch::Tensor, g: &tch::Tensor, kind: tch::Kind, by_out_dtype: bool) -> tch::Tensor {
    if by_out_dtype
        && kind == tch::Kind::Float
        && let Some(dw) = mm_f32(&rows.tr(), g)
    {
        return dw;
    }
    as_kind(&mm(&rows.tr(), g), kind)
}

/// `a·b` written in f32 by the product itself (`mm` with `out_dtype`, which CUDA has for
/// half-precision operands), or `None` where torch refuses it, then for the rest of the process.
pub fn mm_f32(a: &tch::Tensor, b: &tch::Tensor) -> Option<tch::Tensor> {
    if !MM_OUT_DTYPE.usable() {
        return None;
    }
    a.f_mm_dtype(b, tch::Kind::Float).map_err(|e| MM_OUT_DTYPE.give_up(e)).ok()
}

/// `mm(..., out_dtype=float32)`, until it fails (a cast a gradient then, not the run).
static MM_OUT_DTYPE: FastPath = FastPath::new("torch's `mm` with an f32 output", "products are cast instead");

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::testing::{against_cotangent, max_rel, normal};

    /// Frozen weights moved into one buffer are views of it side by side, and the joined
    /// projections over them (no copy) equal those over separate weights bit for bit: outputs
    /// without a graph, and the input's and an adapter's gradients on an autodiff device, with
    /// and without biases. Weights that train stay where they are, and tensors that are not one
    /// buffer's views are joined by a copy.
    #[test]
    fn frozen_weights_in_one_buffer_join_without_a_copy() {
        let ptr = |t: &Tensor<2>| dpo_torch::bridge::on_libtorch(t.clone(), "test").0.data_ptr() as usize;
        for device in [Device::libtorch(), Device::libtorch().autodiff()] {
            for biased in [true, false] {
                let random = |shape: [usize; 2], name: &str| normal(shape, (0.0, 1.0), name, &device);
                let linear = |out: usize, name: &str| Linear {
                    weight: Param::initialized(burn::module::ParamId::new(), random([16, out], name)),
                    bias: biased.then(|| {
                        Param::initialized(burn::module::ParamId::new(), random([1, out], name).reshape([out]))
                    }),
                    lora: None,
                };
                let fresh = || [linear(8, "q"), linear(4, "k"), linear(4, "v")];
                let (apart, mut shared) = (fresh(), fresh());
                let [q, k, v] = &mut shared;
                Linear::share_storage([q, k, v]);
                let [q, k, _] = &shared;
                assert_eq!(ptr(&k.weight.val()), ptr(&q.weight.val()) + 8 * 4, "k's columns follow q's in one row");
                let tch = |l: &Linear| dpo_torch::bridge::on_libtorch(l.weight.val(), "test").0;
                let whole = adjacent(&shared.each_ref().map(tch)).expect("one buffer's views");
                assert_eq!((whole.size(), whole.data_ptr() as usize), (vec![16, 16], ptr(&q.weight.val())));
                let x = normal([2, 9, 16], (0.0, 1.0), "x", &device);
                let x = if device.is_autodiff() { x.require_grad() } else { x };
                let run = |mut group: [Linear; 3]| {
                    if device.is_autodiff() {
                        group[2].lora = Some(Lora {
                            a: Param::initialized(burn::module::ParamId::new(), random([16, 2], "a").require_grad()),
                            b: Param::initialized(burn::module::ParamId::new(), random([2, 4], "b").require_grad()),
                            scale: 2.0,
                            dropout: 0.0,
                            magnitude: None,
                        });
                    }
                    let ys = Linear::forward_group(x.clone(), [&group[0], &group[1], &group[2]]);
                    let sum = ys.iter().map(|y| y.clone().sin().sum()).reduce(|a, b| a + b).unwrap();
                    (ys, group, sum)
                };
                let ((ys1, g1, s1), (ys2, g2, s2)) = (run(apart), run(shared));
                for (a, b) in ys1.iter().zip(&ys2) {
                    a.to_data().assert_eq(&b.to_data(), true);
                }
                if device.is_autodiff() {
                    let (d1, d2) = (s1.backward(), s2.backward());
                    x.grad(&d1).unwrap().to_data().assert_eq(&x.grad(&d2).unwrap().to_data(), true);
                    let a = |g: &[Linear; 3], d| g[2].lora.as_ref().unwrap().a.val().grad(d).unwrap();
                    a(&g1, &d1).to_data().assert_eq(&a(&g2, &d2).to_data(), true);
                }
            }
        }
        let device = Device::libtorch().autodiff();
        let trained = |name: &str| Linear {
            weight: Param::from_tensor(normal([16, 4], (0.0, 1.0), name, &device).require_grad()),
            bias: None,
            lora: None,
        };
        let (mut a, mut b) = (trained("a"), trained("b"));
        let before = (ptr(&a.weight.val()), ptr(&b.weight.val()));
        Linear::share_storage([&mut a, &mut b]);
        assert_eq!((ptr(&a.weight.val()), ptr(&b.weight.val())), before, "weights that train are left alone");
        let tch = |t: Tensor<2>| dpo_torch::bridge::on_libtorch(t, "test").0;
        assert!(adjacent(&[tch(a.weight.val()), tch(b.weight.val())]).is_none(), "two buffers are copied together");
    }

    /// Gate and up laid out by columns ([`Linear::forward_group_by_columns`]) equal them laid out
    /// by rows within f32's round-off (the products of the transposes), values and the gradients
    /// of x and every weight through SwiGLU and the down projection, under one fixed cotangent
    /// (at most 4.0e-7 of the largest value on torch's avx2, avx512 and default CPU kernels; a
    /// Σ sin(y) loss had amplified y's round-off to 1.8e-5 on avx2); each part is a dense block.
    /// With padded rows (B > 1) too, and a bias on both. A projection gives back the gradient of
    /// an input laid out by columns laid out so.
    #[test]
    fn projections_by_columns_equal_them_by_rows() {
        let device = Device::libtorch().autodiff();
        for (batch, biased) in [(1, false), (3, false), (2, true)] {
            let random = |shape: [usize; 2], name: &str| normal(shape, (0.0, 1.0), name, &device);
            let linear = |shape: [usize; 2], name: &str, bias: bool| Linear {
                weight: Param::from_tensor(random(shape, name).require_grad()),
                bias: bias.then(|| Param::from_tensor(random([1, shape[1]], name).reshape([shape[1]]).require_grad())),
                lora: None,
            };
            let (gate, up, down) =
                (linear([16, 12], "g", biased), linear([16, 12], "u", biased), linear([12, 16], "d", false));
            let x = normal([batch, 17, 16], (0.0, 1.0), "x", &device).require_grad();
            let laid = |t: &Tensor<3>| dpo_torch::bridge::on_libtorch(t.clone(), "test").0;
            let mut seen = Vec::new();
            let mut run = |by_columns: bool| {
                let [g, u] = match by_columns {
                    true => Linear::forward_group_by_columns(x.clone(), [&gate, &up]),
                    false => Linear::forward_group(x.clone(), [&gate, &up]),
                };
                seen.push([&g, &u].map(|t| laid(t).movedim_int(-1, 0).is_contiguous()));
                let y = down.forward(crate::swiglu::swiglu(g, u));
                (y.clone(), against_cotangent(y, "dy").backward())
            };
            let ((y1, g1), (y2, g2)) = (run(false), run(true));
            assert_eq!(seen, [[false, false], [true, true]], "rows, then dense blocks by columns");
            assert!(max_rel(y1, y2) <= 1e-6, "batch {batch}: output");
            assert!(max_rel(x.grad(&g1).unwrap(), x.grad(&g2).unwrap()) <= 1e-5, "batch {batch}: input gradient");
            for (name, l) in [("gate", &gate), ("up", &up), ("down", &down)] {
                let w = l.weight.val();
                assert!(max_rel(w.grad(&g1).unwrap(), w.grad(&g2).unwrap()) <= 1e-5, "batch {batch}: {name}");
                if let Some(b) = l.bias.as_ref().map(Param::val) {
                    assert!(
                        max_rel(b.grad(&g1).unwrap(), b.grad(&g2).unwrap()) <= 1e-5,
                        "batch {batch}: {name}'s bias"
                    );
                }
            }
        }
        let x = normal([12, 17], (0.0, 1.0), "x", &device).transpose().require_grad(); // [17, 12] by columns
        let w = normal([12, 5], (0.0, 1.0), "w", &device);
        let grads = project(x.clone(), w, None).sum().backward();
        let dx = dpo_torch::bridge::on_libtorch(x.grad(&grads).unwrap(), "test").0;
        assert_eq!(dx.stride(), [1, 17], "the input's gradient by columns");
    }

    /// A partial weight gradient of bf16 operands is their exact product to f32 round-off, over
    /// several f32 slices of `g` (17 rows of a 2^20-wide `g`: 16 rows a slice); a whole one is the
    /// product rounded to bf16 as autocast's, then widened.
    #[test]
    fn a_partial_weight_gradient_is_accumulated_in_f32() {
        let d = Device::libtorch();
        let (n, out) = (17, 1 << 20);
        let rows = normal([n, 2], (0.0, 1.0), "rows", &d).cast(FloatDType::BF16);
        let g = normal([n, out], (0.0, 1.0), "g", &d).cast(FloatDType::BF16);
        let f32 = |t: &Tensor<2>| t.clone().cast(FloatDType::F32);
        let exact = f32(&rows).transpose().matmul(f32(&g)); // [2, out]
        let partial = f32_weight_grad(rows.clone(), g.clone(), true);
        assert_eq!(partial.dtype(), burn::tensor::DType::F32);
        assert!(max_rel(partial, exact.clone()) <= 1e-6);
        let whole = f32_weight_grad(rows, g, false);
        let err = max_rel(whole, exact);
        assert!(err > 1e-6 && err <= 1.0 / 256.0, "{err}");
    }

    /// A product whose `mm` with an f32 output torch refuses (the CPU has no such kernel) is
    /// computed in the operands' dtype and cast, and the failure is remembered.
    #[test]
    fn a_refused_f32_output_product_falls_back_to_a_cast() {
        let d = Device::libtorch();
        let rows = normal([6, 3], (0.0, 1.0), "rows", &d).cast(FloatDType::BF16);
        let g = normal([6, 4], (0.0, 1.0), "g", &d).cast(FloatDType::BF16);
        let tch = |t: Tensor<2>| dpo_torch::bridge::on_libtorch(t, "test").0;
        let (rows, g) = (tch(rows), tch(g));
        let dw = product_in(&rows, &g, tch::Kind::Float, true);
        assert_eq!(dw.kind(), tch::Kind::Float);
        assert!(dw.equal(&rows.tr().mm(&g).to_kind(tch::Kind::Float)));
        assert!(MM_OUT_DTYPE.failure().is_some_and(|e| e.contains("mm")), "{:?}", MM_OUT_DTYPE.failure());
    }

    /// Projections joined ([`Linear::forward_group`]) give each part's output and the input's,
    /// weights' and biases' gradients of the projections one by one: f32 masters under bf16
    /// (the joined cast kept), weights in x's dtype (joined again in the backward), with and
    /// without biases, a frozen weight, and an adapter on one part; the gradients in the masters'
    /// dtypes. Within f32's round-off of sums grouped differently (the input's gradient is one
    /// product over every output column where it was three products added: 3.2e-7 of the largest
    /// value here), and one rounding of the largest value in bf16.
    #[test]
    fn joined_projections_equal_them_one_by_one() {
        let device = Device::libtorch().autodiff();
        let random = |shape: [usize; 2], name: &str| normal(shape, (0.0, 1.0), name, &device);
        for (dtype, weights_dtype, bound) in [
            (FloatDType::F32, FloatDType::F32, 1e-5f32),
            (FloatDType::BF16, FloatDType::F32, 1e-2),
            (FloatDType::BF16, FloatDType::BF16, 1e-2),
        ] {
            for biased in [true, false] {
                let linear = |out: usize, name: &str, trains: bool| {
                    let w = random([16, out], name).cast(weights_dtype);
                    let b = random([1, out], &format!("{name}.b")).reshape([out]);
                    Linear {
                        weight: Param::from_tensor(if trains { w.require_grad() } else { w }),
                        bias: biased.then(|| Param::from_tensor(b.require_grad())),
                        lora: None,
                    }
                };
                let mut group = [linear(8, "q", true), linear(4, "k", false), linear(4, "v", true)];
                group[2].lora = Some(Lora {
                    a: Param::from_tensor(random([16, 2], "a").require_grad()),
                    b: Param::from_tensor(random([2, 4], "b").require_grad()),
                    scale: 2.0,
                    dropout: 0.0,
                    magnitude: None,
                });
                let x = normal([2, 9, 16], (0.0, 1.0), "x", &device).cast(dtype).require_grad();
                let refs = [&group[0], &group[1], &group[2]];
                assert!(fuses(&x, &refs), "18 rows of 16 inputs are joined");
                let joined = Linear::forward_group(x.clone(), refs);
                let apart: Vec<Tensor<3>> = group.iter().map(|l| l.forward(x.clone())).collect();
                let loss = |ys: &[Tensor<3>]| {
                    ys.iter()
                        .enumerate()
                        .map(|(i, y)| against_cotangent(y.clone(), &format!("dy{i}")))
                        .reduce(|a, b| a + b)
                        .unwrap()
                };
                for (a, b) in joined.iter().zip(&apart) {
                    assert!(max_rel(a.clone(), b.clone()) <= bound, "{dtype:?} output");
                }
                let (g1, g2) = (loss(&joined).backward(), loss(&apart).backward());
                let case = format!("{dtype:?} over {weights_dtype:?} weights, biases {biased}");
                assert!(max_rel(x.grad(&g1).unwrap(), x.grad(&g2).unwrap()) <= bound, "{case}: input gradient");
                for (i, l) in group.iter().enumerate() {
                    let w = l.weight.val();
                    match (w.grad(&g1), w.grad(&g2)) {
                        (Some(a), Some(b)) => {
                            assert_eq!(a.dtype(), b.dtype(), "{case}: weight {i}'s gradient dtype");
                            assert!(max_rel(a, b) <= bound, "{case}: weight {i}'s gradient");
                        }
                        (None, None) => assert_eq!(i, 1, "only k is frozen"),
                        _ => panic!("{case}: weight {i} has a gradient one way only"),
                    }
                    if let Some(b) = l.bias.as_ref().map(Param::val) {
                        assert!(max_rel(b.grad(&g1).unwrap(), b.grad(&g2).unwrap()) <= bound, "{case}: bias {i}");
                    }
                }
                let lora = group[2].lora.as_ref().unwrap();
                assert!(
                    max_rel(lora.a.val().grad(&g1).unwrap(), lora.a.val().grad(&g2).unwrap()) <= bound,
                    "{case}: A"
                );
            }
        }
        // Fewer rows than inputs: one by one, no copy of the weights.
        let l = |name: &str| Linear { weight: Param::from_tensor(random([16, 4], name)), bias: None, lora: None };
        let (a, b) = (l("a"), l("b"));
        let x = normal([1, 3, 16], (0.0, 1.0), "x", &device);
        assert!(!fuses(&x, &[&a, &b]) && !fuses(&x.cast(FloatDType::BF16), &[&a, &b]), "whatever the dtypes");
        assert!(fuses(&normal([2, 8, 16], (0.0, 1.0), "x", &device), &[&a, &b]), "as many rows as inputs");
    }

    /// The node's output and its input, weight and bias gradients equal burn's cast, product and
    /// addition within the dtype's round-off (f32; bf16 one rounding of the largest value), the
    /// gradients in the f32 masters' dtype; without a bias, and with a frozen weight (LoRA's base)
    /// whose gradient is not computed.
    #[test]
    fn the_projection_node_equals_the_composite() {
        let device = Device::libtorch().autodiff();
        let random = |shape: [usize; 3]| normal(shape, (0.0, 1.0), &format!("{shape:?}"), &device);
        for (dtype, bound) in [(FloatDType::F32, 1e-6f32), (FloatDType::BF16, 1e-2)] {
            let x = random([2, 5, 16]).cast(dtype).require_grad();
            let w = random([1, 16, 8]).squeeze_dim::<2>(0).require_grad();
            let b = random([1, 1, 8]).reshape([8]).require_grad();
            let g = random([2, 5, 8]).cast(dtype);
            let fused = project(x.clone(), w.clone(), Some(b.clone()));
            let plain = linear_rows(x.clone(), w.clone().cast(dtype), Some(b.clone().cast(dtype)));
            assert!(max_rel(fused.clone(), plain.clone()) <= bound, "{dtype:?} output");
            let (g1, g2) = ((fused * g.clone()).sum().backward(), (plain * g.clone()).sum().backward());
            assert!(max_rel(x.grad(&g1).unwrap(), x.grad(&g2).unwrap()) <= bound, "{dtype:?} input gradient");
            let (dw1, dw2) = (w.grad(&g1).unwrap(), w.grad(&g2).unwrap());
            assert_eq!(dw1.dtype(), w.dtype());
            assert!(max_rel(dw1, dw2) <= bound, "{dtype:?} weight gradient");
            let (db1, db2) = (b.grad(&g1).unwrap(), b.grad(&g2).unwrap());
            assert_eq!(db1.dtype(), b.dtype());
            assert!(max_rel(db1, db2) <= bound, "{dtype:?} bias gradient");
            let frozen = Tensor::<2>::from_data(w.to_data(), &device); // a leaf without require_grad
            let grads = (project(x.clone(), frozen.clone(), None) * g).sum().backward();
            assert!(frozen.grad(&grads).is_none(), "a frozen weight's gradient");
            assert!(x.grad(&grads).is_some(), "the input's gradient past a frozen weight");
        }
        // A bf16 weight (the compute-dtype copy of an f32 master) gives its gradient in f32, equal
        // to the master's own (the cast of a bf16-exact master is the copy itself).
        let x = random([2, 5, 16]).cast(FloatDType::BF16);
        let w32 = random([1, 16, 8]).squeeze_dim::<2>(0).cast(FloatDType::BF16).cast(FloatDType::F32).require_grad();
        let w16 = Tensor::<2>::from_data(w32.to_data(), &device).cast(FloatDType::BF16).require_grad();
        let g = random([2, 5, 8]).cast(FloatDType::BF16);
        let (d32, d16) = (
            (project(x.clone(), w32.clone(), None) * g.clone()).sum().backward(),
            (project(x, w16.clone(), None) * g).sum().backward(),
        );
        let (dw32, dw16) = (w32.grad(&d32).unwrap(), w16.grad(&d16).unwrap());
        assert_eq!(dw16.dtype(), burn::tensor::DType::F32);
        assert_eq!(max_rel(dw32, dw16), 0.0, "the copy's gradient is the master's");
    }
}
