//! AdamW with decoupled weight decay (Loshchilov & Hutter 2019) exactly as `torch.optim.AdamW`
//! updates, gradient accumulation, and clipping by the global L2 norm over every parameter
//! (`torch.nn.utils.clip_grad_norm_`; burn's own clipping works per tensor).
//!
//! Parameters are keyed by their checkpoint name (`model.layers.0.mlp.up_proj.weight`), which
//! also decides the decay group: norms, biases and embeddings are not decayed.

use std::collections::BTreeMap;

use burn::module::Module;
use burn::tensor::{Device, FloatDType, Gradients, Tensor};

use crate::dist::DistError;
use crate::dist::bridge;
use crate::dist::fused::{AdamWStep, fused_adamw};
use crate::model::params;

/// AdamW hyper-parameters (the learning rate comes from the schedule at each step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
    pub weight_decay: f64,
}

/// Whether a parameter is decayed, from its name (transformers' `get_decay_parameter_names`
/// patterns, plus embeddings).
pub fn decays(name: &str) -> bool {
    let last = name.rsplit('.').nth(1).unwrap_or("");
    !(name.ends_with(".bias") || last.ends_with("norm") || last.contains("layernorm") || last.contains("embed"))
}

/// The moment estimates of one parameter, flattened.
#[derive(Debug, Clone)]
pub struct Moments {
    pub exp_avg: Tensor<1>,
    pub exp_avg_sq: Tensor<1>,
}

/// The optimizer state: the update count and each parameter's moments.
#[derive(Debug, Clone, Default)]
pub struct AdamW {
    pub step: u64,
    pub moments: BTreeMap<String, Moments>,
    /// `(rank, world_size)` under ZeRO: the moments are this rank's slices of each parameter
    /// ([`crate::dist::shards`]), not whole parameters.
    pub shard: Option<(usize, usize)>,
    /// `offload_optimizer`: the fp32 masters and the moments live on the host and the update runs
    /// there; the device keeps the parameters in the compute dtype.
    pub offload: Option<Offload>,
}

/// The optimizer's host side under `offload_optimizer` (DeepSpeed's ZeRO-Offload): the fp32
/// master of each trained parameter (this rank's slice under ZeRO) and the moments in host memory,
/// page-locked when the device is a GPU so the copies each way go by DMA. The update runs on the
/// host, in place (burn's libtorch operations write into a tensor nobody else holds, so the
/// pinned buffers stay); the new values go back to the device cast to `device_dtype`.
#[derive(Debug, Clone)]
pub struct Offload {
    /// libtorch's CPU device (on a CPU-only machine, the training device itself).
    pub host: Device,
    /// The dtype the device keeps trained parameters in: the compute dtype (half the bytes of an
    /// fp32 copy under mixed precision).
    pub device_dtype: FloatDType,
    /// Page-lock host tensors (the device is a GPU).
    pub pin: bool,
    /// fp32 masters by parameter name: whole (`[N]`), or this rank's slices (`[c]`) under ZeRO,
    /// `shard` being `(rank, world_size)`.
    pub masters: BTreeMap<String, Tensor<1>>,
    pub shard: Option<(usize, usize)>,
}

impl Offload {
    /// `t` in host memory: page-locked when `pin` (copied by DMA), else libtorch's plain copy.
    pub fn to_host(&self, t: Tensor<1>) -> Tensor<1> {
        match self.pin {
            true => crate::model::pinned_copy(t),
            false => t.to_device(&self.host),
        }
    }
}

/// A flat tensor padded with zeros to `world` slices of equal length (ZeRO's layout).
pub fn padded(flat: Tensor<1>, world: usize) -> Tensor<1> {
    let n = flat.dims()[0];
    let c = crate::dist::shards::shard_len(n, world);
    if c * world == n {
        return flat;
    }
    let zeros = Tensor::zeros([c * world - n], &flat.device());
    Tensor::cat(vec![flat, zeros], 0)
}

/// Slice `rank` of `world` of a flat tensor, [`padded`].
pub fn slice_of(flat: Tensor<1>, (rank, world): (usize, usize)) -> Tensor<1> {
    let c = crate::dist::shards::shard_len(flat.dims()[0], world);
    padded(flat, world).narrow(0, rank * c, c)
}

/// Gradients summed over micro-batches, flattened and keyed by parameter name.
#[derive(Debug, Default)]
pub struct GradAccumulator {
    pub grads: BTreeMap<String, Tensor<1>>,
}

impl GradAccumulator {
    /// Adds the gradients of one backward pass.
    pub fn add<M: Module>(&mut self, model: &M, grads: &Gradients) {
        self.add_where(model, grads, |_| true);
    }

    /// [`GradAccumulator::add`] for the parameters whose names `keep` accepts.
    pub fn add_where<M: Module>(&mut self, model: &M, grads: &Gradients, keep: impl Fn(&str) -> bool) {
        let mut fresh = BTreeMap::new();
        params::visit_where(model, Some(grads), keep, |p| {
            // Summed in f32 whatever the parameter's dtype (an offloaded run keeps half-precision
            // parameters on the device; their gradients add up as a master's would).
            if let Some(grad) = p.grad {
                fresh.insert(p.name, grad.cast(FloatDType::F32));
            }
        });
        self.merge(GradAccumulator { grads: fresh });
    }

    /// Adds another accumulator's gradients.
    pub fn merge(&mut self, other: GradAccumulator) {
        for (name, grad) in other.grads {
            let summed = match self.grads.remove(&name) {
                Some(acc) => acc + grad,
                None => grad,
            };
            self.grads.insert(name, summed);
        }
    }

    /// The global L2 norm when the accumulator holds this worker's slices only (ZeRO-2): `sum`
    /// adds the squares over the workers.
    pub fn sharded_norm(
        &self,
        sum: impl FnOnce(Tensor<1>) -> Result<Tensor<1>, DistError>,
    ) -> Result<Option<Tensor<1>>, DistError> {
        let squares = self.grads.values().map(|g| g.clone().square().sum()).reduce(|a, b| a + b);
        squares.map(|s| sum(s).map(Tensor::sqrt)).transpose()
    }

    /// Scales every gradient so that `norm` (their global norm) is at most `max_norm` (0: no
    /// clipping); returns `norm`.
    pub fn clip_to(&mut self, norm: Option<Tensor<1>>, max_norm: f64) -> Option<Tensor<1>> {
        let norm = norm?;
        if max_norm > 0.0 {
            let coef = ((norm.clone() + 1e-6).recip() * max_norm).clamp_max(1.0); // [1]
            for g in self.grads.values_mut() {
                *g = g.clone() * coef.clone();
            }
        }
        Some(norm)
    }

    /// This worker's slice of every gradient (ZeRO-1, after the full sum).
    pub fn keep_slices(&mut self, shard: (usize, usize)) {
        for g in self.grads.values_mut() {
            *g = slice_of(g.clone(), shard);
        }
    }

    /// The global L2 norm of the accumulated gradients, `[1]` on the device (no host sync).
    pub fn global_norm(&self) -> Option<Tensor<1>> {
        self.grads.values().map(|g| g.clone().square().sum()).reduce(|a, b| a + b).map(|s| s.sqrt())
    }

    /// Scales the gradients so their global norm is at most `max_norm`, as `clip_grad_norm_`
    /// (coefficient `max_norm / (norm + 1e-6)`, clamped at 1). Returns the norm before clipping.
    pub fn clip_global_norm(&mut self, max_norm: f64) -> Option<Tensor<1>> {
        let norm = self.global_norm();
        self.clip_to(norm, max_norm)
    }
}

impl GradAccumulator {
    /// Multiplies every gradient by `factor` (undoing a loss scale).
    pub fn scale(&mut self, factor: f64) {
        for g in self.grads.values_mut() {
            *g = g.clone() * factor;
        }
    }
}

/// Dynamic loss scaling for fp16 training, as `torch.amp.GradScaler` with its defaults: the loss
/// is multiplied by `scale` so small gradients survive in half precision; a step whose
/// unscaled gradients overflow is skipped and the scale halved, and after 2000 clean steps in a
/// row it doubles.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossScaler {
    pub scale: f64,
    pub clean_steps: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self { scale: 65536.0, clean_steps: 0 }
    }
}

impl LossScaler {
    const GROWTH_INTERVAL: u64 = 2000;

    /// Records a step whose gradients were `finite`; returns whether to apply it.
    pub fn update(&mut self, finite: bool) -> bool {
        if !finite {
            self.scale *= 0.5;
            self.clean_steps = 0;
            return false;
        }
        self.clean_steps += 1;
        if self.clean_steps == Self::GROWTH_INTERVAL {
            self.scale *= 2.0;
            self.clean_steps = 0;
        }
        true
    }
}

impl AdamW {
    /// Applies one update with learning rate `lr` to every parameter that has a gradient.
    pub fn step<M: Module>(
        &mut self,
        model: M,
        grads: &GradAccumulator,
        lr: f64,
        cfg: &AdamWConfig,
    ) -> Result<M, DistError> {
        self.step += 1;
        let mut failed = None;
        let model = params::map(model, |name, p| {
            let grad = grads.grads.get(name)?.clone().inner(); // [N]
            self.update(name, p, grad, lr, cfg).map_err(|e| failed = Some(e)).ok()
        });
        failed.map_or(Ok(model), Err)
    }

    /// AdamW on one parameter's values `p` (a whole parameter, or this rank's slice of it) with
    /// their gradient; the moments of `name` are updated in place. Offloaded, the update runs on
    /// the host master and `p` only says where the result goes (and, before the first step of a
    /// parameter without a master, what the master starts from).
    fn update(
        &mut self,
        name: &str,
        p: Tensor<1>,
        grad: Tensor<1>,
        lr: f64,
        cfg: &AdamWConfig,
    ) -> Result<Tensor<1>, DistError> {
        let Some(mut off) = self.offload.take() else { return self.update_here(name, p, grad, lr, cfg) };
        let (device, off_dtype) = (p.device(), off.device_dtype);
        let master = match off.masters.remove(name) {
            Some(master) => master,
            None => off.to_host(p.cast(FloatDType::F32)),
        };
        // The moments start as zeros in host memory (and ones loaded from a checkpoint elsewhere move once).
        let moments = match self.moments.remove(name) {
            Some(m) if m.exp_avg.device() == off.host => m,
            Some(m) => Moments { exp_avg: off.to_host(m.exp_avg), exp_avg_sq: off.to_host(m.exp_avg_sq) },
            None => Moments { exp_avg: off.to_host(master.zeros_like()), exp_avg_sq: off.to_host(master.zeros_like()) },
        };
        self.moments.insert(name.to_owned(), moments);
        let updated = self.update_here(name, master, off.to_host(grad.cast(FloatDType::F32)), lr, cfg);
        // The offload state goes back before any error is returned.
        let updated = updated.inspect(|u| {
            off.masters.insert(name.to_owned(), u.clone());
        });
        self.offload = Some(off);
        Ok(updated?.cast(off_dtype).to_device(&device))
    }

    /// [`AdamW::update`] where `p` and `grad` are: torch's fused kernel, the one transformers
    /// trains with by default (`adamw_torch_fused`), updating `p` (a copy where another handle
    /// shares its values) and the moments of `name` in place.
    fn update_here(
        &mut self,
        name: &str,
        p: Tensor<1>,
        grad: Tensor<1>,
        lr: f64,
        cfg: &AdamWConfig,
    ) -> Result<Tensor<1>, DistError> {
        let AdamWConfig { beta1, beta2, epsilon, weight_decay } = *cfg;
        let moments = self
            .moments
            .remove(name)
            .unwrap_or_else(|| Moments { exp_avg: grad.zeros_like(), exp_avg_sq: grad.zeros_like() });
        let not_libtorch = |reason| DistError::NotLibTorch { index: 0, reason };
        let own = |t: Tensor<1>| bridge::to_tch_exclusive(t).map_err(not_libtorch);
        let (mut values, origin) = own(p)?;
        let (mut exp_avg, plain) = own(moments.exp_avg)?;
        let (mut exp_avg_sq, _) = own(moments.exp_avg_sq)?;
        let grad = bridge::to_tch(grad).map_err(not_libtorch)?.0;
        let settings = AdamWStep {
            step: self.step,
            lr,
            beta1,
            beta2,
            weight_decay: if decays(name) { weight_decay } else { 0.0 },
            eps: epsilon,
        };
        fused_adamw(&mut values, &grad.contiguous(), [&mut exp_avg, &mut exp_avg_sq], &settings)?;
        let (exp_avg, exp_avg_sq) = (bridge::from_tch(exp_avg, plain), bridge::from_tch(exp_avg_sq, plain));
        self.moments.insert(name.to_owned(), Moments { exp_avg, exp_avg_sq });
        Ok(bridge::from_tch(values, origin))
    }

    /// One ZeRO step: `grads` holds this rank's slice of each trainable parameter's gradient;
    /// the rank updates its slices of the parameters (and keeps moments for those only), and the
    /// new slices are gathered (`gather`: every rank's slices, whole) so every rank holds the
    /// whole updated model. `shard` is `(rank, world_size)`.
    pub fn step_sharded<M: Module>(
        &mut self,
        model: M,
        grads: &GradAccumulator,
        (lr, cfg): (f64, &AdamWConfig),
        shard: (usize, usize),
        gather: impl FnOnce(&[Tensor<1>]) -> Result<Vec<Tensor<1>>, DistError>,
    ) -> Result<M, DistError> {
        self.shard = Some(shard);
        self.step += 1;
        let mut current = BTreeMap::new();
        params::visit(&model, None, |p| {
            if grads.grads.contains_key(&p.name) {
                current.insert(p.name, p.flat.inner()); // [N]
            }
        });
        let mut slices = Vec::with_capacity(current.len());
        for (name, flat) in &current {
            let grad = grads.grads[name].clone().inner(); // [c]
            slices.push(self.update(name, slice_of(flat.clone(), shard), grad, lr, cfg)?);
        }
        let gathered = gather(&slices)?; // each [world · c]
        let mut whole: BTreeMap<&str, Tensor<1>> = current
            .iter()
            .zip(gathered)
            .map(|((name, flat), full)| (name.as_str(), full.narrow(0, 0, flat.dims()[0])))
            .collect();
        Ok(params::map(model, |name, _| whole.remove(name)))
    }
}

impl AdamW {
    /// One ZeRO-3 step: `slices` are this rank's slices of the parameters (the values at rest),
    /// `grads` this rank's slices of their gradients; each slice with a gradient is updated in
    /// place, nothing is gathered.
    pub fn step_slices(
        &mut self,
        slices: &mut BTreeMap<String, Tensor<1>>,
        grads: &GradAccumulator,
        (lr, cfg): (f64, &AdamWConfig),
        shard: (usize, usize),
    ) -> Result<(), DistError> {
        self.shard = Some(shard);
        self.step += 1;
        for (name, slice) in slices.iter_mut() {
            if let Some(grad) = grads.grads.get(name) {
                *slice = self.update(name, slice.clone(), grad.clone().inner(), lr, cfg)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use burn::tensor::{Device, TensorData};

    #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
    fn cpu() -> Device {
        Device::libtorch()
    }

    fn accumulator(grads: &[(&str, Vec<f32>)]) -> GradAccumulator {
        let device = cpu();
        GradAccumulator {
            grads: grads
                .iter()
                .map(|(name, v)| {
                    (name.to_string(), Tensor::<1>::from_data(TensorData::new(v.clone(), [v.len()]), &device))
                })
                .collect(),
        }
    }

    /// ‖(3, 4)‖ and ‖(12)‖ give a global norm of 13; clipping to 6.5 halves every gradient,
    /// while per-tensor clipping would have scaled the two tensors differently.
    #[test]
    fn global_norm_clipping_by_hand() {
        let mut acc = accumulator(&[("a.weight", vec![3.0, 4.0]), ("b.weight", vec![12.0])]);
        let norm = acc.clip_global_norm(6.5).unwrap().into_scalar::<f32>();
        assert!((norm - 13.0).abs() < 1e-6);
        let coef = 6.5 / (13.0 + 1e-6);
        let a = crate::model::host(&acc.grads["a.weight"]);
        let b = crate::model::host(&acc.grads["b.weight"]);
        assert!((a[0] - 3.0 * coef).abs() < 1e-6 && (a[1] - 4.0 * coef).abs() < 1e-6);
        assert!((b[0] - 12.0 * coef).abs() < 1e-6);
        // Under the limit nothing changes.
        let mut small = accumulator(&[("a.weight", vec![0.3, 0.4])]);
        small.clip_global_norm(1.0);
        assert_eq!(crate::model::host(&small.grads["a.weight"]), vec![0.3, 0.4]);
    }

    #[test]
    fn loss_scale_halves_on_overflow_and_doubles_after_clean_steps() {
        let mut scaler = LossScaler::default();
        assert!(!scaler.update(false));
        assert_eq!(scaler.scale, 32768.0);
        for _ in 0..1999 {
            assert!(scaler.update(true));
        }
        assert_eq!(scaler.scale, 32768.0);
        assert!(scaler.update(true));
        assert_eq!(scaler.scale, 65536.0);
    }

    /// Four steps on two 37-value parameters (one decayed, one not) with changing learning rates
    /// equal `torch.optim.AdamW`'s, fused and unfused alike (tests/gen/make_adamw_fixture.py).
    #[test]
    fn adamw_steps_equal_torch() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/expected/adamw.json");
        let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let floats = |v: &serde_json::Value| -> Vec<f32> {
            v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
        };
        let tensor = |v: &serde_json::Value| {
            let values = floats(v);
            Tensor::<1>::from_data(TensorData::new(values.clone(), [values.len()]), &cpu())
        };
        let names: Vec<String> =
            fixture["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().into()).collect();
        let cfg = AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            weight_decay: fixture["weight_decay"].as_f64().unwrap(),
        };
        let mut params: Vec<Tensor<1>> = fixture["start"].as_array().unwrap().iter().map(tensor).collect();
        let mut opt = AdamW::default();
        for (step, lr) in fixture["lrs"].as_array().unwrap().iter().enumerate() {
            opt.step += 1;
            for (k, name) in names.iter().enumerate() {
                let grad = tensor(&fixture["grads"][step][k]);
                params[k] = opt.update_here(name, params[k].clone(), grad, lr.as_f64().unwrap(), &cfg).unwrap();
                let ours = crate::model::host(&params[k]);
                for kind in ["fused", "unfused"] {
                    let torch = floats(&fixture[kind][step][k]);
                    let diff = ours.iter().zip(&torch).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                    assert!(diff <= 1e-7, "step {}, {name}, {kind}: differs by {diff}", step + 1);
                }
            }
        }
    }

    /// The kernel writes in place, so values another handle shares (here a clone kept aside, as a
    /// checkpoint snapshot or a reference model would be) are copied first and stay as they were.
    #[test]
    fn an_update_leaves_shared_values_alone() {
        let device = cpu();
        let p = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [3]), &device);
        let kept = p.clone();
        let grad = Tensor::<1>::from_data(TensorData::new(vec![0.5f32, -0.5, 1.0], [3]), &device);
        let cfg = AdamWConfig { beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.0 };
        let mut opt = AdamW { step: 1, ..Default::default() };
        let updated = opt.update_here("w.weight", p, grad, 0.1, &cfg).unwrap();
        assert_eq!(crate::model::host(&kept), vec![1.0, 2.0, 3.0]);
        // The first step moves each value by lr against its gradient's sign.
        let moved = crate::model::host(&updated);
        for (m, want) in moved.iter().zip([0.9f32, 2.1, 2.9]) {
            assert!((m - want).abs() < 1e-5, "{moved:?}");
        }
    }

    #[test]
    fn decay_groups_follow_names() {
        assert!(decays("model.layers.0.mlp.up_proj.weight"));
        assert!(decays("lm_head.weight"));
        assert!(!decays("model.layers.0.self_attn.q_proj.bias"));
        assert!(!decays("model.layers.0.input_layernorm.weight"));
        assert!(!decays("model.layers.0.self_attn.q_norm.weight"));
        assert!(!decays("model.norm.weight"));
        assert!(!decays("model.embed_tokens.weight"));
    }
}
