//! Rotary position embeddings in Hugging Face's rotate-half convention
//! (`transformers/modeling_rope_utils.py` and `apply_rotary_pos_emb` in `modeling_llama.py`),
//! with the frequencies and scale of each scaling type from [`crate::rope_scaling`].
//!
//! cos/sin are computed once for each position a run reaches; a forward pass gathers the rows of
//! its tokens' positions once ([`Rope::at`]) and every layer rotates with them ([`rotate`]).
//!
//! The rotation is one graph node with its derivative written out (`x·cos + R(x)·sin`, so
//! `dx = g·cos + Rᵀ(g·sin)`): burn's autodiff built it from narrows (four slices each), a negation
//! and a concatenation, whose backward materialised zeros and slice assignments per half; a bf16
//! step of the 0.5B shape went from 34,465 torch operators to 30,865 (`make bench`), each a kernel
//! launch on a GPU. `R(x)·sin = roll(x)·s` with `s = [-sin₁, sin₂]` (the halves swapped by one
//! roll; the sign kept in the table), and `Rᵀ(g·sin) = roll(g·s)`: three operations each way
//! where the halves took five. The values are the same, bit for bit: negation is exact, and the
//! products and sums are the same ones in the same order.
//!
//! Queries and keys are rotated in the layout their projections make (`[B, L, H, D]`, dense)
//! against cos and sin spread over that shape once a pass ([`Angles`]): every product is then of
//! two dense tensors of one shape, which CUDA runs by its vectorised elementwise kernel, where a
//! head-major view against `[1, 1, L, D]` tables took the general strided one. Where q, k and v
//! come out of one joined projection, one rotation turns the query and key heads and passes the
//! value heads through ([`rotate_heads`]: cos 1, sin 0 on those), over the dense joined output.

// burn marks burn-tch deprecated in favour of CubeCL backends; this project runs on LibTorch on
// purpose, so the deprecation is expected here.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};
use burn_tch::{LibTorch, TchTensor};

use crate::rope_scaling::{RopeScaling, inverse_frequencies};

/// cos and signed sin tables (`[-sin₁, sin₂]` by halves), `[rows, D]` each, in f32, for the
/// positions `0..rows`: built for the first [`FIRST_ROWS`] positions and grown (at least doubling,
/// up to `max_positions`) when a forward pass reaches past them. Whole tables for a long-context
/// checkpoint cost memory no run of ours uses: Qwen2.5-7B-Instruct-1M's 1,010,000 positions of
/// 128 would be 1 GB a model, on the device.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Arc<[f32]>,
    /// What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    scale: f32,
    head_dim: usize,
    max_positions: usize,
    device: Device,
    /// Shared by a model's clones (the tables are constants).
    tables: Arc<Mutex<Tables>>,
}

/// The positions `0..cos.dims()[0]`'s rows.
#[derive(Debug)]
struct Tables {
    cos: Tensor<2>,
    sin: Tensor<2>,
}

/// Positions whose rows a model builds when it is made (a `max_length` of up to 4096 never grows them).
pub const FIRST_ROWS: usize = 4096;

impl Rope {
    /// Rotation for positions `0..max_positions` of a `head_dim`-wide head (the first
    /// [`FIRST_ROWS`] rows built now).
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling, max_positions: usize, device: &Device) -> Self {
        let (inv_freq, scale) = inverse_frequencies(head_dim, theta, scaling);
        let inv_freq: Arc<[f32]> = inv_freq.into();
        let tables = build((&inv_freq, scale), head_dim, max_positions.min(FIRST_ROWS), device);
        let tables = Arc::new(Mutex::new(tables));
        Self { inv_freq, scale, head_dim, max_positions, device: device.clone(), tables }
    }

    /// Number of positions the model takes (`max_position_embeddings`), built or not.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// cos and sin at each of `positions` (each below `end`), in `dtype` (transformers casts them
    /// to the activations' dtype under mixed precision).
    ///
    /// # Shapes
    /// - positions: `[L]` → `[1, L, 1, D]` each
    ///
    /// # Panics
    /// If `end` exceeds `max_positions`, or a position reaches `end`.
    pub fn at(&self, positions: Tensor<1, Int>, end: usize, dtype: FloatDType) -> Arc<Angles> {
        assert!(end <= self.max_positions, "positions up to {end} where the model has {}", self.max_positions);
        let (l, d) = (positions.dims()[0], self.head_dim);
        let mut tables = self.tables.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let rows = tables.cos.dims()[0];
        if end > rows {
            let grown = end.max(2 * rows).min(self.max_positions);
            *tables = build((&self.inv_freq, self.scale), d, grown, &self.device);
        }
        let positions = positions.inner();
        let gather = |table: &Tensor<2>| table.clone().select(0, positions.clone()).reshape([1, l, 1, d]).cast(dtype);
        Arc::new(Angles { cos: gather(&tables.cos), sin: gather(&tables.sin), spread: Mutex::default() })
    }
}

/// The tables' rows for positions `0..rows`, each `[freqs, freqs]` (the two halves share
/// frequencies, as HF's `emb = cat(freqs, freqs)`), cos and sin multiplied by `scale`.
fn build((inv_freq, scale): (&[f32], f32), head_dim: usize, rows: usize, device: &Device) -> Tables {
    let half = inv_freq.len();
    let mut cos = Vec::with_capacity(rows * head_dim);
    let mut sin = Vec::with_capacity(rows * head_dim);
    for pos in 0..rows {
        for j in 0..head_dim {
            // HF computes `positions (f32) @ inv_freq (f32)` in f32; do the same so the
            // angles round identically.
            let angle = (pos as f32) * inv_freq[j % half];
            // `emb.cos() * attention_scaling`, in f32 as there (exact where the scale is 1).
            let (c, s) = (angle.cos() * scale, angle.sin() * scale);
            cos.push(c);
            sin.push(if j < half { -s } else { s });
        }
    }
    let shape = [rows, head_dim];
    // Constants, never differentiated: kept off the autodiff graph even when the model is
    // built on an autodiff device, so `Module::valid` (which does not visit them) yields a
    // model with no autodiff tensor left.
    let table = |values| Tensor::from_data(TensorData::new(values, shape), device).without_autodiff();
    Tables { cos: table(cos), sin: table(sin) }
}

/// A spread's shape (`[B, L, H, D]`) and the heads it rotates.
type SpreadKey = (Vec<i64>, usize);

/// The cos and signed sin of a forward pass's positions, `[1, L, 1, D]` each in the compute dtype
/// (plain tensors: constants, never differentiated).
#[derive(Debug)]
pub struct Angles {
    cos: Tensor<4>,
    sin: Tensor<4>,
    /// cos and sin spread over the shape of each input rotated (`[B, L, H, D]`, queries and keys),
    /// made on first use and kept for the pass's every layer: a product with a broadcast operand
    /// takes CUDA's general elementwise kernel, one with two dense ones of the same shape its
    /// vectorised kernel, and a pass rotates once a layer each way (queries and keys joined) or twice.
    spread: Mutex<Vec<(SpreadKey, [tch::Tensor; 2])>>,
}

impl Angles {
    /// cos and sin as torch tensors (handles on the same storage), `[1, L, 1, D]`.
    fn tch(&self) -> [tch::Tensor; 2] {
        [&self.cos, &self.sin].map(|t| dpo_torch::bridge::on_libtorch(t.clone(), "rotary angles").0)
    }

    /// cos and sin spread over `x`'s shape (`[B, L, H, D]`), contiguous: the angles on the first
    /// `rotated` heads, cos 1 and sin 0 on the others.
    fn spread_over(&self, x: &tch::Tensor, rotated: usize) -> [tch::Tensor; 2] {
        let size = x.size();
        let key = (size.clone(), rotated);
        let mut spread = self.spread.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, tables)) = spread.iter().find(|(k, _)| *k == key) {
            return tables.each_ref().map(tch::Tensor::shallow_clone);
        }
        let (heads, rotated) = (size[2], (rotated as i64).min(size[2]));
        let turned = [size[0], size[1], rotated, size[3]];
        let [cos, sin] = self.tch().map(|t| t.expand(turned.as_slice(), false));
        let tables = match heads - rotated {
            0 => [cos, sin].map(|t| t.contiguous()),
            rest => {
                let still = [size[0], size[1], rest, size[3]];
                let opts = (cos.kind(), cos.device());
                let (ones, zeros) =
                    (tch::Tensor::ones(still.as_slice(), opts), tch::Tensor::zeros(still.as_slice(), opts));
                [tch::Tensor::cat(&[&cos, &ones], 2), tch::Tensor::cat(&[&sin, &zeros], 2)]
            }
        };
        spread.push((key, tables.each_ref().map(tch::Tensor::shallow_clone)));
        tables
    }
}

/// Rotates queries or keys by the angles of their positions (`x·cos + rotate_half(x)·sin`), in the
/// layout the projections make them (contiguous, so each product is dense).
///
/// # Shapes
/// - x: `[B, L, H, D]`, angles: `[1, L, 1, D]` → `[B, L, H, D]`
pub fn rotate(x: Tensor<4>, angles: &Arc<Angles>) -> Tensor<4> {
    let heads = x.dims()[2];
    rotate_heads(x, angles, heads)
}

/// [`rotate`] of the first `rotated` heads of `x`, the others passed through (as the rotation by
/// angle 0: cos 1, sin 0): queries and keys rotated in one pass over their joined projection,
/// values beside them, into the one tensor attention saves.
///
/// # Shapes
/// - x: `[B, L, H, D]`, angles: `[1, L, 1, D]` → `[B, L, H, D]`
pub fn rotate_heads(x: Tensor<4>, angles: &Arc<Angles>, rotated: usize) -> Tensor<4> {
    let turn = Turn { angles: angles.clone(), rotated };
    Tensor::from_dispatch(<burn::backend::Dispatch as RopeOps>::rotary(x.into_dispatch(), turn))
}

/// A pass's angles and how many leading heads they rotate.
#[derive(Debug, Clone)]
pub struct Turn {
    angles: Arc<Angles>,
    rotated: usize,
}

/// The rotation, per backend.
#[backend_extension(LibTorch, Autodiff)]
pub trait RopeOps: Backend {
    /// See [`rotate_heads`].
    fn rotary(x: FloatTensor<Self>, turn: Turn) -> FloatTensor<Self>;
}

impl RopeOps for LibTorch {
    fn rotary(x: TchTensor, turn: Turn) -> TchTensor {
        let [cos, sin] = turn.angles.spread_over(&x.tensor, turn.rotated);
        // rotate_half(x)·sin = [x2, x1]·[-sin1, sin2]
        let turned = half_turn(&x.tensor);
        TchTensor::new(&x.tensor * cos + turned * sin)
    }
}

impl<C: CheckpointStrategy> RopeOps for Autodiff<LibTorch, C> {
    fn rotary(x: FloatTensor<Self>, turn: Turn) -> FloatTensor<Self> {
        let (x, node) = x.into_parts();
        match Rotary.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = LibTorch::rotary(x, turn.clone());
                prep.finish(turn, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(LibTorch::rotary(x, turn)),
        }
    }
}

/// The halves of the last dimension swapped, `[x1, x2] → [x2, x1]` (one copy).
fn half_turn(x: &tch::Tensor) -> tch::Tensor {
    let d = x.size()[3] / 2;
    x.roll([d].as_slice(), [3i64].as_slice())
}

/// [`rotate`]'s graph node: `dx = g·cos + Rᵀ(g·sin)`, with `Rᵀ[u1, u2] = [u2, -u1]`, which is
/// the halves of `g·[-sin1, sin2]` swapped.
#[derive(Debug)]
struct Rotary;

impl Backward<LibTorch, 1> for Rotary {
    type State = Turn;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<LibTorch>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        let [cos, sin] = ops.state.angles.spread_over(&g.tensor, ops.state.rotated);
        let turned_back = half_turn(&(&g.tensor * sin));
        grads.register::<LibTorch>(parent.id, TchTensor::new(&g.tensor * cos + turned_back));
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::normal;

    use super::*;

    /// The rotation as burn's autodiff differentiated it before the node.
    fn composite(x: Tensor<4>, angles: &Angles) -> Tensor<4> {
        let d = x.dims()[3];
        let x1 = x.clone().narrow(3, 0, d / 2); // [B, L, H, D/2]
        let x2 = x.clone().narrow(3, d / 2, d / 2); // [B, L, H, D/2]
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3); // [B, L, H, D]
        // The plain sin from the signed table: [-s1, s2] → [s1, s2].
        let s = angles.sin.clone();
        let sin = Tensor::cat(vec![s.clone().narrow(3, 0, d / 2).neg(), s.narrow(3, d / 2, d / 2)], 3);
        x * angles.cos.clone() + rotated * sin
    }

    /// The node's output and input gradient equal the composite's bit for bit, in f32 and bf16,
    /// on a plain device (no graph) and under autodiff, at positions that do not start at 0, for
    /// queries and keys of two head counts rotated by one pass's angles (each shape's spread
    /// tables made once, on first use).
    #[test]
    fn the_rotation_node_is_the_composite_bit_for_bit() {
        let rope = Rope::new(8, 10_000.0, &RopeScaling::Default, 64, &Device::libtorch());
        for dtype in [FloatDType::F32, FloatDType::BF16] {
            for device in [Device::libtorch(), Device::libtorch().autodiff()] {
                let positions = Tensor::<1, Int>::arange(5..12, &device);
                let angles = rope.at(positions, 12, dtype);
                for heads in [3, 1, 3] {
                    let x = normal([2, 7, heads, 8], (0.0, 1.0), "x", &device).cast(dtype);
                    let x = if device.is_autodiff() { x.require_grad() } else { x };
                    let (fused, plain) = (rotate(x.clone(), &angles), composite(x.clone(), &angles));
                    fused.to_data().assert_eq(&plain.to_data(), true);
                    if device.is_autodiff() {
                        let w = normal([2, 7, heads, 8], (0.0, 1.0), "w", &device).cast(dtype);
                        let (g1, g2) = ((fused * w.clone()).sum().backward(), (plain * w).sum().backward());
                        let (a, b) = (x.grad(&g1).unwrap(), x.grad(&g2).unwrap());
                        a.to_data().assert_eq(&b.to_data(), true);
                    }
                }
                assert_eq!(angles.spread.lock().unwrap().len(), 2, "one spread per shape rotated");
            }
        }
    }

    /// Rotating the leading heads of a tensor is rotating them alone and passing the rest
    /// through, bit for bit, values and input gradient, in f32 and bf16.
    #[test]
    fn leading_heads_rotate_and_the_rest_pass_through() {
        let rope = Rope::new(8, 10_000.0, &RopeScaling::Default, 64, &Device::libtorch());
        let device = Device::libtorch().autodiff();
        for dtype in [FloatDType::F32, FloatDType::BF16] {
            let angles = rope.at(Tensor::<1, Int>::arange(3..10, &device), 10, dtype);
            let x = normal([2, 7, 5, 8], (0.0, 1.0), "x", &device).cast(dtype).require_grad();
            let joint = rotate_heads(x.clone(), &angles, 3);
            let apart = Tensor::cat(vec![rotate(x.clone().narrow(2, 0, 3), &angles), x.clone().narrow(2, 3, 2)], 2);
            joint.to_data().assert_eq(&apart.to_data(), true);
            let w = normal([2, 7, 5, 8], (0.0, 1.0), "w", &device).cast(dtype);
            let (g1, g2) = ((joint * w.clone()).sum().backward(), (apart * w).sum().backward());
            x.grad(&g1).unwrap().to_data().assert_eq(&x.grad(&g2).unwrap().to_data(), true);
        }
    }

    /// The tables start at [`FIRST_ROWS`] positions and grow, doubling up to `max_positions`, when
    /// a pass reaches past them: the rows are those of tables built whole, bit for bit, before and
    /// after the growth.
    #[test]
    fn the_tables_grow_to_the_positions_a_pass_reaches() {
        let device = Device::libtorch();
        let max = 2 * FIRST_ROWS + 100;
        let rope = Rope::new(8, 10_000.0, &RopeScaling::Default, max, &device);
        let rows = || rope.tables.lock().unwrap().cos.dims()[0];
        assert_eq!(rows(), FIRST_ROWS);
        let whole = build((&rope.inv_freq, rope.scale), 8, max, &device);
        let check = |from: usize, to: usize| {
            let positions = Tensor::<1, Int>::arange(from as i64..to as i64, &device);
            let angles = rope.at(positions.clone(), to, FloatDType::F32);
            let want = |t: &Tensor<2>| t.clone().select(0, positions.clone()).reshape([1, to - from, 1, 8]);
            angles.cos.to_data().assert_eq(&want(&whole.cos).to_data(), true);
            angles.sin.to_data().assert_eq(&want(&whole.sin).to_data(), true);
        };
        check(10, 20);
        assert_eq!(rows(), FIRST_ROWS, "no growth below the first rows");
        check(FIRST_ROWS, FIRST_ROWS + 3);
        assert_eq!(rows(), 2 * FIRST_ROWS, "doubled");
        check(10, 20);
        check(max - 5, max);
        assert_eq!(rows(), max, "capped at max_positions");
    }

    /// Each scaling type's cos and sin (attention scaling included) are those of transformers'
    /// rotary module built from the same `config.json` (`tests/gen/make_rope_fixture.py`), at
    /// positions up to 16,383, past the first tables.
    #[test]
    fn every_scaling_type_gives_transformers_angles() {
        #[derive(serde::Deserialize)]
        struct Case {
            name: String,
            config: serde_json::Value,
            positions: Vec<i64>,
            cos: Vec<Vec<f32>>,
            sin: Vec<Vec<f32>>,
        }
        #[derive(serde::Deserialize)]
        struct Fixture {
            cases: Vec<Case>,
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/expected/rope.json");
        let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(fixture.cases.len(), 11);
        let device = Device::libtorch();
        for case in fixture.cases {
            let cfg = crate::LlamaConfig::parse(&case.config.to_string(), std::path::Path::new("config.json"))
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            let rope = Rope::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling, cfg.max_position_embeddings, &device);
            let end = *case.positions.iter().max().unwrap() as usize + 1;
            let positions =
                Tensor::<1, Int>::from_data(TensorData::new(case.positions.clone(), [case.positions.len()]), &device);
            let angles = rope.at(positions, end, FloatDType::F32);
            let values = |t: &Tensor<4>| t.to_data().convert::<f32>().to_vec::<f32>().unwrap();
            let (cos, sin) = (values(&angles.cos), values(&angles.sin));
            let d = cfg.head_dim;
            for (row, &p) in case.positions.iter().enumerate() {
                let mut worst = 0f32;
                for j in 0..d {
                    let sign = if j < d / 2 { -1.0 } else { 1.0 }; // the table keeps [-sin1, sin2]
                    worst = worst.max((cos[row * d + j] - case.cos[row][j]).abs());
                    worst = worst.max((sign * sin[row * d + j] - case.sin[row][j]).abs());
                }
                // The frequencies are transformers' bit for bit (else the angle at 16,383 would be
                // far off); what is left is the cos and sin of torch's and Rust's f32 math, an ulp
                // or two of values up to 1.25.
                assert!(worst <= 3e-7, "{} at position {p}: cos/sin differ by {worst:e}", case.name);
            }
        }
    }
}
