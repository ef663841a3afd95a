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
use crate::model::params;
use dpo_torch::kernels::{AdamWEntry, AdamWStep, foreach_copy, foreach_mul, foreach_norms, fused_adamw};
use dpo_torch::{bridge, tch_err};

/// AdamW hyper-parameters (the learning rate comes from the schedule at each step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
    pub weight_decay: f64,
}

/// Whether a parameter is decayed, from its name: transformers' `get_decay_parameter_names`,
/// whose patterns (`bias`, `layernorm`, `rmsnorm`, `(^|\.)norm($|\.)`, `_norm($|\.)`, searched in
/// the lowercased name) leave out biases and norms; embeddings and the head are decayed.
pub fn decays(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let norm_at = |at: usize| at == 0 || name[..at].ends_with('.') || name[..at].ends_with('_');
    let norm = name.match_indices("norm").any(|(at, _)| {
        let after = &name[at + 4..];
        norm_at(at) && (after.is_empty() || after.starts_with('.'))
    });
    !(norm || ["bias", "layernorm", "rmsnorm"].iter().any(|p| name.contains(p)))
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
    /// The fp32 masters of the trained parameters where the device keeps those in another dtype
    /// (or, offloaded, elsewhere): on the host under `offload_optimizer`, else on the device.
    pub masters: Option<Masters>,
}

/// The fp32 masters of the trained parameters (this rank's slices under ZeRO), kept apart from
/// the parameters the device computes with, which are in `device_dtype`:
///
/// - offloaded (`offload_optimizer`, DeepSpeed's ZeRO-Offload): the masters and the moments in
///   host memory, page-locked when the device is a GPU so the copies each way go by DMA; the
///   update runs on the host, in place (burn's libtorch operations write into a tensor nobody else
///   holds, so the pinned buffers stay), and the new values go back to the device cast.
/// - resident (mixed precision on the device, `resident`): the masters and moments on the device,
///   updated with every other parameter by one fused call, the compute-dtype parameters then
///   rewritten by one multi-tensor copy (DeepSpeed's bf16 optimizer, apex's O2): the weights are
///   cast once a step, not at each use. Chosen where the step would hold every weight's
///   compute-dtype copy anyway (no recomputation), so it costs no peak memory.
#[derive(Debug, Clone)]
pub struct Masters {
    /// Where the masters live: libtorch's CPU device when offloaded (on a CPU-only machine, the
    /// training device itself), the training device when resident.
    pub host: Device,
    /// The masters stay on the training device and are updated with every other parameter.
    pub resident: bool,
    /// The dtype the device keeps trained parameters in: the compute dtype (half the bytes of an
    /// fp32 copy under mixed precision).
    pub device_dtype: FloatDType,
    /// Page-lock host tensors (the device is a GPU).
    pub pin: bool,
    /// fp32 masters by parameter name: whole (`[N]`), or this rank's slices (`[c]`) under ZeRO,
    /// `shard` being `(rank, world_size)`.
    pub masters: BTreeMap<String, Tensor<1>>,
    pub shard: Option<(usize, usize)>,
    /// Wall time of the copies so far (gradients to the host, new values back, each after the
    /// device's queued work is done, so the wait for the backward pass is not counted), and
    /// their bytes: what the offload costs beside the host's update.
    pub copies: CopyTally,
}

/// The offloaded optimizer's copies, summed over the run.
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyTally {
    pub seconds: f64,
    pub to_host_bytes: u64,
    pub to_device_bytes: u64,
}

impl Masters {
    /// Whether torch can page-lock host memory for `device` here (a one-value probe).
    pub fn try_pin(device: &Device) -> Result<(), dpo_torch::TorchError> {
        crate::model::pinned_copy(Tensor::<1>::zeros([1], device)).map(drop)
    }

    /// `t` in host memory: page-locked when `pin` (copied by DMA), else libtorch's plain copy.
    /// A pin that fails (pinned memory exhausted) falls back to the plain copy, said once.
    pub fn to_host(&self, t: Tensor<1>) -> Tensor<1> {
        if self.pin {
            match crate::model::pinned_copy(t.clone()) {
                Ok(host) => return host,
                Err(e) => {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| eprintln!("warning: {e}: this copy and later ones may use pageable memory"));
                }
            }
        }
        t.to_device(&self.host)
    }

    /// Whether the trained parameter `name` gets a master (and its compute-dtype copy on the
    /// device). Offloaded, every one does. Resident, all but the embedding, which stays in f32: its
    /// gradient sums the rows of repeated tokens, which a compute-dtype backward would round, and
    /// a use casts only the rows looked up (and, tied, the head's weight once a pass).
    pub fn holds(&self, name: &str) -> bool {
        !self.resident || name != crate::model::hf::EMBEDDING
    }

    /// `t` made a master: moved where the masters live. A `slice` of a parameter that stays on its
    /// device is copied into storage of its own, which would else keep the whole parameter alive;
    /// a whole one is taken as it is (the parameter's compute-dtype copy replaces it).
    pub fn master_of(&self, t: Tensor<1>, slice: bool) -> Result<Tensor<1>, DistError> {
        if !slice || (self.host != t.device() || self.pin) {
            return Ok(self.to_host(t));
        }
        let (t, origin) = bridge::to_tch(t).map_err(not_libtorch)?;
        let mut copy = t.f_empty_like().map_err(tch_err("empty_like"))?;
        copy.f_copy_(&t).map_err(tch_err("copy_"))?;
        Ok(bridge::from_tch(copy, origin))
    }
}

/// Waits for `t`'s device to finish its queued work (a CUDA device; the CPU has none) and
/// returns the moment it did.
fn synchronized(t: &Tensor<1>) -> std::time::Instant {
    if let Ok((t, _)) = bridge::to_tch(t.clone())
        && let tch::Device::Cuda(i) = t.device()
    {
        tch::Cuda::synchronize(i64::try_from(i).unwrap_or(0));
    }
    std::time::Instant::now()
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

/// Whole parameters' bytes a ZeRO-1/2 step gathers at a time ([`AdamW::step_sharded`]).
pub const GATHER_CHUNK_BYTES: usize = 64 << 20;

/// How many of `slices` (from the first) the next gather takes: as many as fit in
/// [`GATHER_CHUNK_BYTES`] once whole (`world` slices each), at least one.
fn gather_chunk_end(slices: &[Tensor<1>], world: usize) -> usize {
    let mut bytes = 0;
    let fits = slices.iter().take_while(|s| {
        bytes += s.dims()[0] * world * s.dtype().size();
        bytes <= GATHER_CHUNK_BYTES
    });
    fits.count().max(1).min(slices.len())
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
        let Some(norms) = self.norms()? else { return Ok(None) };
        sum(norms.square().sum()).map(|s| Some(s.sqrt()))
    }

    /// Scales every gradient so that `norm` (their global norm) is at most `max_norm` (0: no
    /// clipping), by `clip_grad_norm_`'s coefficient `max_norm / (norm + 1e-6)` clamped at 1, read
    /// on the device; returns `norm`.
    pub fn clip_to(&mut self, norm: Option<Tensor<1>>, max_norm: f64) -> Result<Option<Tensor<1>>, DistError> {
        let Some(norm) = norm else { return Ok(None) };
        if max_norm > 0.0 {
            self.scale_by(((norm.clone() + 1e-6).recip() * max_norm).clamp_max(1.0))?; // [1]
        }
        Ok(Some(norm))
    }

    /// This worker's slice of every gradient (ZeRO-1, after the full sum).
    pub fn keep_slices(&mut self, shard: (usize, usize)) {
        for g in self.grads.values_mut() {
            *g = slice_of(g.clone(), shard);
        }
    }

    /// The global L2 norm of the accumulated gradients, `[1]` on the device (no host sync): the
    /// norm of the per-gradient norms, as `clip_grad_norm_` computes it.
    pub fn global_norm(&self) -> Result<Option<Tensor<1>>, DistError> {
        Ok(self.norms()?.map(|n| n.square().sum().sqrt()))
    }

    /// Scales the gradients so their global norm is at most `max_norm`, as `clip_grad_norm_`
    /// (coefficient `max_norm / (norm + 1e-6)`, clamped at 1). Returns the norm before clipping.
    pub fn clip_global_norm(&mut self, max_norm: f64) -> Result<Option<Tensor<1>>, DistError> {
        let norm = self.global_norm()?;
        self.clip_to(norm, max_norm)
    }

    /// Multiplies every gradient by `factor` (undoing a loss scale).
    pub fn scale(&mut self, factor: f64) -> Result<(), DistError> {
        let Some(device) = self.grads.values().next().map(Tensor::device) else { return Ok(()) };
        self.scale_by(Tensor::full([1], factor, &device))
    }

    /// The L2 norm of each gradient in name order, `[n]`, by one multi-tensor call (`None`: no
    /// gradients).
    fn norms(&self) -> Result<Option<Tensor<1>>, DistError> {
        if self.grads.is_empty() {
            return Ok(None);
        }
        let handles: Vec<_> =
            self.grads.values().map(|g| bridge::to_tch(g.clone())).collect::<Result<_, _>>().map_err(not_libtorch)?;
        // The shim takes contiguous tensors (a no-op for the flat gradients here).
        let origin = handles[0].1;
        let tensors: Vec<tch::Tensor> = handles
            .into_iter()
            .map(|(t, _)| t.f_contiguous())
            .collect::<Result<_, _>>()
            .map_err(tch_err("contiguous"))?;
        Ok(Some(bridge::from_tch(foreach_norms(&tensors)?, origin)))
    }

    /// Multiplies every gradient in place by the one-element `factor`, by one multi-tensor call
    /// (a gradient another handle shares is copied first).
    fn scale_by(&mut self, factor: Tensor<1>) -> Result<(), DistError> {
        let grads = std::mem::take(&mut self.grads);
        let mut names = Vec::with_capacity(grads.len());
        let mut owned = Vec::with_capacity(grads.len());
        for (name, g) in grads {
            names.push(name);
            owned.push(bridge::to_tch_exclusive(g)?);
        }
        let mut tensors: Vec<tch::Tensor> = owned.iter().map(|(t, _)| t.shallow_clone()).collect();
        foreach_mul(&mut tensors, &bridge::to_tch(factor).map_err(not_libtorch)?.0)?;
        self.grads =
            names.into_iter().zip(owned).map(|(name, (t, origin))| (name, bridge::from_tch(t, origin))).collect();
        Ok(())
    }
}

/// A tensor that is not libtorch's, as an error of the shim's callers.
fn not_libtorch(reason: String) -> DistError {
    DistError::NotLibTorch { index: 0, reason }
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

/// AdamW updates waiting for torch's multi-tensor kernel, in the groups it takes: one call per
/// weight decay, dtype and device, where a call per parameter made a launch and its host time each.
/// Then the copies of resident masters into their compute-dtype parameters, one multi-tensor call.
#[derive(Debug, Default)]
struct Queue {
    groups: Vec<((bool, tch::Kind, tch::Device), Vec<AdamWEntry>)>,
    /// `(parameter, master)`: the master's new values go into the parameter, cast.
    copies: Vec<(tch::Tensor, tch::Tensor)>,
}

impl Queue {
    fn push(&mut self, decayed: bool, entry: AdamWEntry) {
        let key = (decayed, entry.param.kind(), entry.param.device());
        match self.groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, entries)) => entries.push(entry),
            None => self.groups.push((key, vec![entry])),
        }
    }

    /// Queues the copy of `master`'s new values into `p` (cast to `p`'s dtype, in place, once the
    /// updates ran); returns `p`'s handle.
    fn copy_into(&mut self, p: Tensor<1>, master: Tensor<1>) -> Result<Tensor<1>, DistError> {
        let (param, origin) = bridge::to_tch_exclusive(p)?;
        let (source, _) = bridge::to_tch(master).map_err(not_libtorch)?;
        self.copies.push((param.shallow_clone(), source));
        Ok(bridge::from_tch(param, origin))
    }

    /// Runs the queued updates, in place. The shim checks a group before its kernel writes; a
    /// group that fails leaves the earlier ones applied, and its error ends the run.
    fn run(self, step: u64, lr: f64, cfg: &AdamWConfig) -> Result<(), DistError> {
        for ((decayed, _, _), mut entries) in self.groups {
            let weight_decay = if decayed { cfg.weight_decay } else { 0.0 };
            let settings = AdamWStep { step, lr, beta1: cfg.beta1, beta2: cfg.beta2, weight_decay, eps: cfg.epsilon };
            fused_adamw(&mut entries, &settings)?;
        }
        if self.copies.is_empty() {
            return Ok(());
        }
        let (mut params, masters): (Vec<_>, Vec<_>) = self.copies.into_iter().unzip();
        Ok(foreach_copy(&mut params, &masters)?)
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
        let (mut queue, mut failed) = (Queue::default(), None);
        let model = params::map_owned(
            model,
            |name| grads.grads.contains_key(name),
            |name, p| {
                let (n, device) = (p.dims()[0], p.device());
                let grad = grads.grads[name].clone().inner(); // [N]
                // A failed parameter gets zeros of its size: the step returns the error, not the model.
                self.update(&mut queue, name, p, grad, (lr, cfg)).unwrap_or_else(|e| {
                    failed = Some(e);
                    Tensor::zeros([n], &device)
                })
            },
        );
        failed.map_or(Ok(()), Err)?;
        queue.run(self.step, lr, cfg)?;
        Ok(model)
    }

    /// AdamW on one parameter's values `p` (a whole parameter, or this rank's slice of it) with
    /// their gradient: queued, the returned tensor and the moments of `name` holding the update
    /// once `queue` runs. With masters, `p` is the compute-dtype copy: it only says where the
    /// result goes (and, before the first step of a parameter without a master, what the master
    /// starts from); offloaded, the master's update runs on the host at once.
    fn update(
        &mut self,
        queue: &mut Queue,
        name: &str,
        p: Tensor<1>,
        grad: Tensor<1>,
        settings: (f64, &AdamWConfig),
    ) -> Result<Tensor<1>, DistError> {
        let Some(mut masters) = self.masters.take() else { return self.enqueue(queue, name, p, grad, settings.1) };
        let updated = if !masters.resident {
            self.update_offloaded(&mut masters, name, p, grad, settings)
        } else if let Some(master) = masters.masters.remove(name) {
            // Resident: the master's update is queued with every other parameter's, and so is the
            // copy of its new values into `p`.
            self.enqueue(queue, name, master, grad, settings.1).and_then(|master| {
                masters.masters.insert(name.to_owned(), master.clone());
                queue.copy_into(p, master)
            })
        } else {
            // A parameter that stays in f32 beside resident masters (see [`Masters::holds`]).
            self.enqueue(queue, name, p, grad, settings.1)
        };
        // The masters go back before any error is returned.
        self.masters = Some(masters);
        updated
    }

    /// [`AdamW::update`] with masters on the host: the gradient goes there, the master and the
    /// moments are updated there now, and the new values come back in `p`'s dtype.
    fn update_offloaded(
        &mut self,
        off: &mut Masters,
        name: &str,
        p: Tensor<1>,
        grad: Tensor<1>,
        (lr, cfg): (f64, &AdamWConfig),
    ) -> Result<Tensor<1>, DistError> {
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
        let mut now = Queue::default();
        let grad = grad.cast(FloatDType::F32);
        let started = synchronized(&grad);
        let grad = off.to_host(grad);
        off.copies.seconds += started.elapsed().as_secs_f64();
        off.copies.to_host_bytes += 4 * grad.dims()[0] as u64;
        let updated = self.enqueue(&mut now, name, master, grad, cfg);
        let updated = updated.and_then(|u| now.run(self.step, lr, cfg).map(|()| u))?;
        off.masters.insert(name.to_owned(), updated.clone());
        let half = updated.cast(off_dtype);
        let started = std::time::Instant::now();
        let back = half.to_device(&device);
        let _ = synchronized(&back);
        off.copies.seconds += started.elapsed().as_secs_f64();
        off.copies.to_device_bytes += (burn::tensor::DType::from(off_dtype).size() * back.dims()[0]) as u64;
        Ok(back)
    }

    /// Queues [`AdamW::update`] where `p` and `grad` are, for torch's fused kernel (the one
    /// transformers trains with by default, `adamw_torch_fused`): it will update `p` (a copy where
    /// another handle shares its values) and the moments of `name` in place. Returns `p`'s handle.
    fn enqueue(
        &mut self,
        queue: &mut Queue,
        name: &str,
        p: Tensor<1>,
        grad: Tensor<1>,
        cfg: &AdamWConfig,
    ) -> Result<Tensor<1>, DistError> {
        let moments = self
            .moments
            .remove(name)
            .unwrap_or_else(|| Moments { exp_avg: grad.zeros_like(), exp_avg_sq: grad.zeros_like() });
        let own = |t: Tensor<1>| bridge::to_tch_exclusive(t);
        let (param, origin) = own(p)?;
        let (exp_avg, plain) = own(moments.exp_avg)?;
        let (exp_avg_sq, _) = own(moments.exp_avg_sq)?;
        let grad = bridge::to_tch(grad).map_err(not_libtorch)?.0.f_contiguous().map_err(tch_err("contiguous"))?;
        // burn's handles share the storage the kernel writes into.
        let handle = |t: &tch::Tensor, origin| bridge::from_tch(t.shallow_clone(), origin);
        let moments = Moments { exp_avg: handle(&exp_avg, plain), exp_avg_sq: handle(&exp_avg_sq, plain) };
        self.moments.insert(name.to_owned(), moments);
        let values = handle(&param, origin);
        queue.push(decays(name) && cfg.weight_decay != 0.0, AdamWEntry { param, grad, exp_avg, exp_avg_sq });
        Ok(values)
    }

    /// One ZeRO step: `grads` holds this rank's slice of each trainable parameter's gradient;
    /// the rank updates its slices of the parameters (and keeps moments for those only), and the
    /// new slices are gathered (`gather`: every rank's slices, whole) so every rank holds the
    /// whole updated model. `shard` is `(rank, world_size)`.
    ///
    /// The gather goes [`GATHER_CHUNK_BYTES`] of parameters at a time, each chunk's new values
    /// replacing the old ones before the next is gathered: the model is never held twice (a
    /// second full copy was the peak of a ZeRO-1/2 step under checkpointing). The chunks follow
    /// the parameters' sizes alone, so every rank calls `gather` on the same ones.
    pub fn step_sharded<M: Module>(
        &mut self,
        model: M,
        grads: &GradAccumulator,
        (lr, cfg): (f64, &AdamWConfig),
        shard: (usize, usize),
        mut gather: impl FnMut(&[Tensor<1>]) -> Result<Vec<Tensor<1>>, DistError>,
    ) -> Result<M, DistError> {
        self.shard = Some(shard);
        self.step += 1;
        let mut current = BTreeMap::new();
        params::visit(&model, None, |p| {
            if grads.grads.contains_key(&p.name) {
                let flat = p.flat().inner(); // [N]
                current.insert(p.name, flat);
            }
        });
        let (mut queue, mut slices) = (Queue::default(), Vec::with_capacity(current.len()));
        for (name, flat) in &current {
            let grad = grads.grads[name].clone().inner(); // [c]
            slices.push(self.update(&mut queue, name, slice_of(flat.clone(), shard), grad, (lr, cfg))?);
        }
        queue.run(self.step, lr, cfg)?;
        let names: Vec<String> = current.keys().cloned().collect();
        let (mut model, mut start) = (model, 0);
        while start < names.len() {
            let end = gather_chunk_end(&slices, shard.1);
            let chunk: Vec<Tensor<1>> = slices.drain(..end).collect();
            let gathered = gather(&chunk)?; // each [world · c]
            let mut whole: BTreeMap<&str, Tensor<1>> = BTreeMap::new();
            for (name, full) in names[start..start + end].iter().zip(gathered) {
                // The old values go with this entry and the model's (nothing else holds them).
                let len = current.remove(name).map_or(0, |old| old.dims()[0]);
                whole.insert(name.as_str(), full.narrow(0, 0, len));
            }
            model = params::map(model, |name, _| whole.remove(name));
            start += end;
        }
        Ok(model)
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
        let mut queue = Queue::default();
        // Handed over, not cloned, so the kernel writes into the slices at rest.
        for (name, slice) in std::mem::take(slices) {
            let slice = match grads.grads.get(&name) {
                Some(grad) => self.update(&mut queue, &name, slice, grad.clone().inner(), (lr, cfg))?,
                None => slice,
            };
            slices.insert(name, slice);
        }
        queue.run(self.step, lr, cfg)
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

    #[test]
    fn a_pin_that_fails_falls_back_to_a_plain_copy() {
        // Without an accelerator pinning fails (issue 39: tch's `pin_memory` panicked instead).
        let (host, device_dtype) = (cpu(), FloatDType::F32);
        let off = Masters {
            host,
            resident: false,
            device_dtype,
            pin: true,
            masters: Default::default(),
            shard: None,
            copies: Default::default(),
        };
        let t = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, -2.5, 3.0], [3]), &cpu());
        assert_eq!(crate::model::host(&off.to_host(t)), [1.0, -2.5, 3.0]);
    }

    /// ‖(3, 4)‖ and ‖(12)‖ give a global norm of 13; clipping to 6.5 halves every gradient,
    /// while per-tensor clipping would have scaled the two tensors differently.
    #[test]
    fn global_norm_clipping_by_hand() {
        let mut acc = accumulator(&[("a.weight", vec![3.0, 4.0]), ("b.weight", vec![12.0])]);
        let norm = acc.clip_global_norm(6.5).unwrap().unwrap().into_scalar::<f32>();
        // f32: three squares summed (γ_2), a square root and the per-tensor norms' combination
        // (2u more); the coefficient's division and each product add 2u of the value.
        let u = f32::EPSILON / 2.0;
        assert!((norm - 13.0).abs() <= 5.0 * u * 13.0, "{norm}");
        let coef = 6.5 / (13.0 + 1e-6);
        let a = crate::model::host(&acc.grads["a.weight"]);
        let b = crate::model::host(&acc.grads["b.weight"]);
        let close = |got: f32, want: f32| (got - want).abs() <= 7.0 * u * want;
        assert!(close(a[0], 3.0 * coef) && close(a[1], 4.0 * coef) && close(b[0], 12.0 * coef), "{a:?} {b:?}");
        // Under the limit nothing changes.
        let mut small = accumulator(&[("a.weight", vec![0.3, 0.4])]);
        small.clip_global_norm(1.0).unwrap();
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
            // Both parameters in one queue: two groups (decayed, not), one kernel call each.
            let mut queue = Queue::default();
            let lr = lr.as_f64().unwrap();
            for (k, name) in names.iter().enumerate() {
                let grad = tensor(&fixture["grads"][step][k]);
                let p = std::mem::replace(&mut params[k], Tensor::zeros([1], &cpu()));
                params[k] = opt.update(&mut queue, name, p, grad, (lr, &cfg)).unwrap();
            }
            assert_eq!(queue.groups.len(), if cfg.weight_decay == 0.0 { 1 } else { 2 });
            queue.run(opt.step, lr, &cfg).unwrap();
            // The same elementwise formula in another order (torch's unfused loop, or its fused
            // kernel on another CPU path): each step rounds the moments, their bias corrections,
            // the root, the quotient and the update about ten times (10u of the step η·|d|, with
            // |d| ≤ √t) and the parameter twice (2u·|p|); the differences add up over the steps.
            let u = f64::from(f32::EPSILON) / 2.0;
            let step_bound = |t: usize, p_max: f64| {
                (1..=t).map(|t| 10.0 * u * lr * (t as f64).sqrt() + 2.0 * u * p_max).sum::<f64>()
            };
            for (k, name) in names.iter().enumerate() {
                let ours = crate::model::host(&params[k]);
                let p_max = ours.iter().fold(0f32, |m, x| m.max(x.abs()));
                let bound = step_bound(step + 1, f64::from(p_max)) as f32;
                for kind in ["fused", "unfused"] {
                    let torch = floats(&fixture[kind][step][k]);
                    let diff = ours.iter().zip(&torch).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                    assert!(diff <= bound, "step {}, {name}, {kind}: differs by {diff} (bound {bound:e})", step + 1);
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
        let (mut opt, mut queue) = (AdamW { step: 1, ..Default::default() }, Queue::default());
        let updated = opt.update(&mut queue, "w.weight", p, grad, (0.1, &cfg)).unwrap();
        queue.run(1, 0.1, &cfg).unwrap();
        assert_eq!(crate::model::host(&kept), vec![1.0, 2.0, 3.0]);
        // The first step moves each value by lr against its gradient's sign.
        // The first step is lr·g/(|g| + ε): ε/|g| of lr off the sign, and the update's
        // roundings (4u of the value).
        let moved = crate::model::host(&updated);
        for (m, want) in moved.iter().zip([0.9f32, 2.1, 2.9]) {
            assert!((m - want).abs() <= 0.1 * 1e-8 / 0.5 + 4.0 * f32::EPSILON / 2.0 * want, "{moved:?}");
        }
    }

    /// A step writes into the parameters' own storage when the model holds the only handle (no
    /// copy of every parameter a step), and the values move.
    #[test]
    fn a_step_updates_a_model_in_place() {
        use burn::module::Param;
        let device = cpu();
        let values = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [3]), &device);
        let weight = Param::from_tensor(values(vec![1.0, 2.0, 3.0]));
        let address = |w: &Param<Tensor<1>>| bridge::to_tch(w.val()).unwrap().0.data_ptr() as usize;
        let before = address(&weight);
        // A bare parameter is named by an empty path.
        let grads = GradAccumulator { grads: [(String::new(), values(vec![0.5, -0.5, 1.0]))].into() };
        let cfg = AdamWConfig { beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.01 };
        let mut opt = AdamW::default();
        let weight = opt.step(weight, &grads, 0.1, &cfg).unwrap();
        assert_eq!(address(&weight), before);
        // p·(1 − lr·λ) − lr·g/(|g| + ε): as above, with the decay's product rounded too.
        let moved = crate::model::host(&weight.val());
        for (m, want) in moved.iter().zip([0.899f32, 2.098, 2.897]) {
            assert!((m - want).abs() <= 0.1 * 1e-8 / 0.5 + 6.0 * f32::EPSILON / 2.0 * want, "{moved:?}");
        }
    }

    /// Resident masters: the step updates the fp32 master exactly as plain fp32 AdamW updates the
    /// same values, and writes its bf16 rounding into the parameter's own storage; a parameter
    /// without a master (the embedding) is updated as a plain one.
    #[test]
    fn resident_masters_update_in_f32_and_write_the_copy_in_place() {
        use burn::module::Param;
        let device = cpu();
        let values = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [3]), &device);
        let start = vec![1.0f32, 2.0, 3.0];
        let weight = Param::from_tensor(values(start.clone()).cast(FloatDType::BF16));
        let address = |w: &Param<Tensor<1>>| bridge::to_tch(w.val()).unwrap().0.data_ptr() as usize;
        let before = address(&weight);
        let grads = GradAccumulator { grads: [(String::new(), values(vec![0.5, -0.5, 1.0]))].into() };
        let cfg = AdamWConfig { beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.01 };
        let masters = Masters {
            host: device.clone(),
            resident: true,
            device_dtype: FloatDType::BF16,
            pin: false,
            masters: [(String::new(), values(start.clone()))].into(),
            shard: None,
            copies: CopyTally::default(),
        };
        let mut opt = AdamW { masters: Some(masters), ..Default::default() };
        let mut plain = AdamW::default();
        let (mut weight, mut reference) = (weight, Param::from_tensor(values(start)));
        for _ in 0..3 {
            weight = opt.step(weight, &grads, 0.1, &cfg).unwrap();
            reference = plain.step(reference, &grads, 0.1, &cfg).unwrap();
        }
        let master = crate::model::host(&opt.masters.as_ref().unwrap().masters[""]);
        assert_eq!(master, crate::model::host(&reference.val()), "the master is plain AdamW's");
        assert_eq!(address(&weight), before, "the copy is written in place");
        let copy = crate::model::host(&weight.val().cast(FloatDType::F32));
        let rounded = crate::model::host(&reference.val().cast(FloatDType::BF16).cast(FloatDType::F32));
        assert_eq!(copy, rounded, "the parameter is the master's bf16 rounding");
        // Without a master, the parameter itself is updated.
        let mut opt = AdamW {
            masters: Some(Masters { masters: Default::default(), ..opt.masters.unwrap() }),
            ..Default::default()
        };
        let lone = opt.step(Param::from_tensor(values(vec![1.0, 2.0, 3.0])), &grads, 0.1, &cfg).unwrap();
        let first = AdamW::default().step(Param::from_tensor(values(vec![1.0, 2.0, 3.0])), &grads, 0.1, &cfg).unwrap();
        assert_eq!(crate::model::host(&lone.val()), crate::model::host(&first.val()));
    }

    #[test]
    fn decay_groups_follow_names() {
        assert!(decays("model.layers.0.mlp.up_proj.weight"));
        assert!(decays("lm_head.weight"));
        assert!(!decays("model.layers.0.self_attn.q_proj.bias"));
        assert!(!decays("model.layers.0.input_layernorm.weight"));
        assert!(!decays("model.layers.0.self_attn.q_norm.weight"));
        assert!(!decays("model.norm.weight"));
        // transformers decays the embedding (a tied head's too), and names without a norm word.
        assert!(decays("model.embed_tokens.weight"));
        assert!(decays("model.layers.0.mlp.normalizer.weight") && decays("model.enorm.weight"));
        assert!(
            !decays("model.layers.0.attn_norm.weight") && !decays("norm.weight") && !decays("model.RMSNorm.weight")
        );
    }
}
