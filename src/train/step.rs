//! One optimizer step, nanoGPT's inner loop: this rank's micro-batches of the step, each forward
//! and backward with its loss scaled by its share of the whole step (over every rank), the
//! gradient sum over the ranks, fp16 loss-scale bookkeeping, clipping by the global norm, and the
//! AdamW update.
//!
//! Scaling each micro-batch's loss by its share of the step makes the gradients summed over
//! micro-batches and ranks equal those of one batch holding every pair of the step.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::thread::ScopedJoinHandle;

use burn::tensor::{Device, FloatDType, Tensor};

use super::backprop::{Checkpointing, forward_backward, idle_pass};
use super::checkpoint::TrainerState;
use super::context::{Objective, Run};
use super::optim::{AdamW, AdamWConfig, GradAccumulator, slice_of};
use super::partition::{Layout, Partitioned, Scattered, Segments, Whole};
use super::references::References;
use super::sampler::{RankStep, Sampler, rank_step, shard_step};
use super::window::Window;
use super::workers::Workers;
use crate::config::Sharding;
use crate::data::{self, Packing, TokenizedPair};
use crate::dist::{DistError, EnvError};
use crate::dpo::logps::{DeviceBatch, Stats};
use crate::dpo::loss::{PairScores, dpo_loss};
use crate::model::{Llama, params};

/// What a stage fixes for all of its steps.
pub struct StepPlan {
    pub objective: Objective,
    pub sampler: Sampler,
    pub adamw: AdamWConfig,
    /// The autodiff twin of the run's device.
    pub train_device: Device,
    /// Recompute each layer's activations in the backward (`gradient_checkpointing`).
    pub checkpointing: bool,
    /// LoRA dropout is on: its masks are seeded by (seed, step, micro-batch, rank).
    pub dropout: bool,
    /// What the workers partition (`none` for a lone process).
    pub sharding: Sharding,
    /// The policy's parameters by part (the per-part reduce-scatter's order).
    pub layout: Layout,
    /// The run's plain device.
    pub device: Device,
    /// How a micro-batch's sequences are laid out (`padding_free`, `prefix_sharing`).
    pub packing: Packing,
    /// A per-step reference scores each micro-batch on a thread of its own while the policy's
    /// forward runs ([`overlaps_reference`]).
    pub overlap_reference: bool,
}

/// The variable that turns the reference's thread on (`1`) or off (`0`) whatever the device.
pub const OVERLAP_VAR: &str = "DPO_TRAIN_OVERLAP_REFERENCE";

/// [`OVERLAP_VAR`]'s setting (`None` where unset or empty), read where a command starts.
pub fn overlap_setting() -> Result<Option<bool>, EnvError> {
    crate::dist::switch(OVERLAP_VAR)
}

/// Whether a per-step reference scores beside the policy: as `setting` says, else on a CUDA
/// device, where a small model's step is bound by the host launching kernels one after another
/// and a second thread launches the reference's (on the same stream, so nothing on the device
/// changes order). The CPU's cores already run each operator, so it stays off there.
pub fn overlaps_reference(setting: Option<bool>, device: &Device) -> bool {
    setting.unwrap_or_else(|| dpo_torch::allocator::cuda_index(device).is_some())
}

impl StepPlan {
    /// Whether gradients leave each part's backward reduce-scattered (ZeRO-3 always, ZeRO-2 when
    /// checkpointing makes the backward go one layer at a time); every rank then runs the same
    /// number of passes, in step.
    fn per_part(&self) -> bool {
        self.sharding == Sharding::Zero3 || (self.sharding == Sharding::Zero2 && self.checkpointing)
    }
}

/// What a step changes: the policy, the optimizer and the loop's state.
pub struct Trained {
    /// The policy; under ZeRO-3 its tree with hollow parameters (the values are in `parts`).
    pub policy: Llama,
    /// ZeRO-3: this rank's slices of the policy.
    pub parts: Option<Partitioned>,
    pub optimizer: AdamW,
    pub state: TrainerState,
}

impl Trained {
    /// The policy with every parameter whole: under ZeRO-3 gathered from every rank's slices
    /// (every rank calls it at the same point). Offloaded, trained parameters are in the compute
    /// dtype, which computes exactly what their masters would.
    pub fn whole_policy(&self, workers: Workers) -> Result<Cow<'_, Llama>, DistError> {
        match &self.parts {
            Some(parts) => parts.whole(None, workers).map(Cow::Owned),
            None => Ok(Cow::Borrowed(&self.policy)),
        }
    }

    /// What checkpoints and `final/` hold: [`Trained::whole_policy`] with the trained parameters
    /// at their fp32 values. Offloaded under mixed precision those are the host masters, moved to
    /// `device` (and gathered under ZeRO) for the duration. Every rank calls it at the same point.
    pub fn master_policy(&self, workers: Workers, device: &Device) -> Result<Cow<'_, Llama>, DistError> {
        let Some(off) = self.optimizer.masters.as_ref().filter(|o| o.device_dtype != FloatDType::F32) else {
            return self.whole_policy(workers);
        };
        let mut masters: BTreeMap<String, Tensor<1>> =
            off.masters.iter().map(|(name, m)| (name.clone(), m.clone().to_device(device))).collect();
        if let Some(parts) = &self.parts {
            return parts.whole_with(None, &masters, workers).map(Cow::Owned);
        }
        if off.shard.is_some() {
            let (names, slices): (Vec<String>, Vec<Tensor<1>>) = masters.into_iter().unzip();
            let lens = self.layout_lens(&names);
            let whole = workers.gather_slices(&slices)?.into_iter().zip(lens).map(|(t, n)| t.narrow(0, 0, n));
            masters = names.into_iter().zip(whole).collect();
        }
        Ok(Cow::Owned(params::map(self.policy.clone(), |name, _| masters.remove(name))))
    }

    /// The element counts of the policy's parameters `names`.
    fn layout_lens(&self, names: &[String]) -> Vec<usize> {
        let mut lens = BTreeMap::new();
        params::visit(&self.policy, None, |p| {
            let n = p.numel();
            lens.insert(p.name, n);
        });
        names.iter().map(|n| lens.get(n).copied().unwrap_or(0)).collect()
    }

    /// The fp32 values of the trained parameters (this rank's slices under `sharding`) become the
    /// optimizer's masters (on the host under `offload_optimizer`, else resident on the device;
    /// see [`super::optim::Masters`]), and the device keeps the parameters in the compute dtype.
    /// Done once, after ZeRO-3 partitioned the policy.
    pub fn split_masters(&mut self, sharding: Sharding, shard: (usize, usize)) -> Result<(), DistError> {
        let Some(off) = self.optimizer.masters.as_mut() else { return Ok(()) };
        let dtype = off.device_dtype;
        if let Some(parts) = self.parts.as_mut() {
            off.shard = Some(shard);
            for (name, slice) in parts.slices.iter_mut().filter(|(name, _)| parts.layout.trains(name)) {
                off.masters.insert(name.clone(), off.master_of(slice.clone(), false)?);
                *slice = slice.clone().cast(dtype);
            }
            return Ok(());
        }
        off.shard = (sharding != Sharding::None).then_some(shard);
        let sliced = off.shard.is_some();
        let mut values = BTreeMap::new();
        params::visit(&self.policy, None, |p| {
            if p.trains && off.holds(&p.name) {
                let flat = p.flat().inner();
                let shard = off.shard.map_or(flat.clone(), |shard| slice_of(flat, shard));
                values.insert(p.name, shard);
            }
        });
        let masters: BTreeMap<String, Tensor<1>> = values
            .into_iter()
            .map(|(name, v)| Ok((name, off.master_of(v, sliced)?)))
            .collect::<Result<_, DistError>>()?;
        let policy = self.policy.clone();
        self.policy = params::map(policy, |name, old| masters.contains_key(name).then(|| old.cast(dtype)));
        off.masters = masters;
        Ok(())
    }
}

/// How a step went.
pub struct StepReport {
    /// The global gradient norm before clipping, on the device (read back on logging steps).
    pub grad_norm: Option<Tensor<1>>,
    /// `false` when fp16 gradients overflowed and the update was skipped.
    pub applied: bool,
}

/// Runs optimizer step `t.state.step` at learning rate `lr`; `refs` is the reference of a DPO
/// stage. The step's metrics go into `window`.
pub fn optimizer_step(
    plan: &StepPlan,
    run: &Run,
    mut t: Trained,
    refs: Option<&References>,
    window: &mut Window,
    lr: f64,
) -> anyhow::Result<(Trained, StepReport)> {
    let (cfg, data, workers) = (run.cfg, run.data, run.rt.workers);
    // Dropout masks follow (seed, step): the same on every rank, and after a resume. (The
    // generator is process-wide: a run without dropout leaves it alone.)
    if plan.dropout {
        run.rt.device.seed(cfg.seed.wrapping_add(t.state.step));
    }
    let mine = rank_step(&plan.sampler, t.state.step, workers.world_size(), workers.rank())?;
    let pairs = plan.sampler.micro_batches(t.state.step).concat(); // every rank's, in single-device order
    let all_pairs: Vec<&TokenizedPair> = pairs.iter().map(|&i| &data.train[i]).collect();
    // SFT's loss is a token mean over the whole step: each micro-batch divides by the step's count.
    let step_tokens = match plan.objective {
        Objective::Sft => {
            let all: Vec<TokenizedPair> = all_pairs.iter().map(|p| (*p).clone()).collect();
            let batch = data::collate_chosen(&all, data.tokenizer.pad_id(), run.plan.truncation, Packing::Packed);
            batch.labels.len() as f64
        }
        Objective::Dpo => 0.0,
    };
    t.state.num_tokens += all_pairs.iter().map(|p| pair_tokens(p, cfg.max_length, plan.objective)).sum::<f64>();

    let mut grads = GradAccumulator::default();
    let loss_scale = t.state.loss_scaler.map_or(1.0, |s| s.scale);
    for (micro, ids) in mine.micro_batches.iter().enumerate() {
        let mut chunk: Vec<TokenizedPair> = ids.iter().map(|&i| data.train[i].clone()).collect();
        if cfg.loss.kl_rows() {
            // KTO's KL rows borrow completions within the micro-batch (TRL's per-device batch).
            chunk = data::kto::with_kl(&chunk, chunk.len(), Some(cfg.max_length));
        }
        let recompute = (plan.checkpointing || plan.per_part()).then(|| Checkpointing {
            dropout_seed: plan
                .dropout
                .then(|| cfg.seed ^ (t.state.step << 20) ^ ((micro as u64) << 8) ^ workers.rank() as u64),
        });
        let share = chunk.len() as f64 / mine.step_pairs as f64;
        let scale = match plan.objective {
            Objective::Sft => loss_scale,
            Objective::Dpo => share * loss_scale,
        };
        let pass = MicroBatch { ids, chunk: &chunk, recompute, scale, step_tokens };
        micro_batch(plan, run, &t, refs, &pass, &mut grads, window)?;
    }
    for _ in mine.micro_batches.len()..passes(plan, &mine, &pairs, workers.world_size()) {
        // A rank short of micro-batches meets the others' collectives without computing.
        if let (Objective::Dpo, Some(refs)) = (plan.objective, refs) {
            refs.idle_rows(run)?;
        }
        idle_pass(policy_segments(plan, run, &t).as_ref(), &mut grads)?;
    }

    let (mut t, grad_norm, applied) = apply(plan, run, t, grads, lr)?;
    window.steps += 1;
    t.state.step += 1;
    t.state.epoch = plan.sampler.epoch_at(t.state.step, workers.world_size());
    Ok((t, StepReport { grad_norm, applied }))
}

/// The step's gradients summed over the workers (reduce-scattered under ZeRO-2 and ZeRO-3), unscaled
/// (fp16), clipped by their global norm and applied by AdamW (on this worker's slices under ZeRO);
/// the norm, and whether the step was applied.
fn apply(
    plan: &StepPlan,
    run: &Run,
    mut t: Trained,
    mut grads: GradAccumulator,
    lr: f64,
) -> anyhow::Result<(Trained, Option<Tensor<1>>, bool)> {
    let (cfg, workers) = (run.cfg, run.rt.workers);
    let slices = matches!(plan.sharding, Sharding::Zero2 | Sharding::Zero3);
    if plan.per_part() {
        // Reduce-scattered part by part in the backward already.
    } else if slices {
        workers.reduce_scatter_grads(&mut grads, &t.policy, cfg.ddp_comm_hook)?;
    } else {
        workers.sum_grads(&mut grads, &t.policy, cfg.ddp_comm_hook)?;
    }
    let norm_of =
        |g: &GradAccumulator| if slices { g.sharded_norm(|s| workers.sum_tensor(s)) } else { g.global_norm() };
    let applied = match t.state.loss_scaler.as_mut() {
        Some(scaler) => {
            grads.scale(1.0 / scaler.scale)?;
            // A host sync, as torch's GradScaler: an overflowing step must not be applied.
            let finite = norm_of(&grads)?.is_none_or(|n| crate::model::host(&n)[0].is_finite());
            scaler.update(finite)
        }
        None => true,
    };
    let norm = norm_of(&grads)?;
    let grad_norm = grads.clip_to(norm, cfg.max_grad_norm)?;
    let shard = (workers.rank(), workers.world_size());
    if let (true, Some(parts)) = (applied, t.parts.as_mut()) {
        t.optimizer.step_slices(&mut parts.slices, &grads, (lr, &plan.adamw), shard)?;
    } else if applied {
        t.policy = match plan.sharding {
            Sharding::None | Sharding::Zero3 => t.optimizer.step(t.policy, &grads, lr, &plan.adamw)?,
            stage => {
                if stage == Sharding::Zero1 {
                    grads.keep_slices(shard);
                }
                t.optimizer.step_sharded(t.policy, &grads, (lr, &plan.adamw), shard, |s| workers.gather_slices(s))?
            }
        };
    }
    Ok((t, grad_norm, applied))
}

/// How many passes this rank runs in a step whose pairs are `pairs`: its micro-batches, or,
/// where collectives run inside each pass (per-part ZeRO), rank 0's count (the most: a short
/// chunk fills the low ranks first), the passes it lacks being idle ones.
fn passes(plan: &StepPlan, mine: &RankStep, pairs: &[usize], world: usize) -> usize {
    match plan.per_part() {
        true => shard_step(pairs, plan.sampler.micro_batch, world, 0).len().max(mine.micro_batches.len()),
        false => mine.micro_batches.len(),
    }
}

/// Where a pass of the policy gets its parts: the policy whole, or per part (ZeRO-3, and ZeRO-2
/// under checkpointing).
fn policy_segments<'a>(plan: &'a StepPlan, run: &'a Run, t: &'a Trained) -> Box<dyn Segments + 'a> {
    match plan.per_part() {
        false => Box::new(Whole(&t.policy)),
        true => Box::new(Scattered {
            model: &t.policy,
            layout: &plan.layout,
            gathered: t.parts.as_ref(),
            workers: run.rt.workers,
            hook: run.cfg.ddp_comm_hook,
            device: &plan.device,
        }),
    }
}

/// One micro-batch of a step.
struct MicroBatch<'a> {
    /// Indices of its training pairs, and the pairs.
    ids: &'a [usize],
    chunk: &'a [TokenizedPair],
    recompute: Option<Checkpointing>,
    /// What its loss is multiplied by before the backward (its share, the fp16 loss scale).
    scale: f64,
    /// SFT: completion tokens in the whole step.
    step_tokens: f64,
}

/// The forward and backward of one micro-batch, its gradients added to `grads`.
fn micro_batch(
    plan: &StepPlan,
    run: &Run,
    t: &Trained,
    refs: Option<&References>,
    pass: &MicroBatch,
    grads: &mut GradAccumulator,
    window: &mut Window,
) -> Result<(), DistError> {
    let (pad_id, truncation) = (run.data.tokenizer.pad_id(), run.plan.truncation);
    let segments = policy_segments(plan, run, t);
    let policy = segments.as_ref();
    match (plan.objective, refs) {
        (Objective::Sft, _) => {
            let batch = data::collate_chosen(pass.chunk, pad_id, truncation, plan.packing);
            let device_batch = DeviceBatch::new(&batch, None, &plan.train_device);
            // Each micro-batch's loss is its share of the step's token mean.
            let stats = Stats::Metrics { wpo: false };
            let (scores, nll) =
                forward_backward(policy, &device_batch, stats, pass.recompute, pass.scale, grads, |scores| {
                    -scores.token_logps.clone().sum() / pass.step_tokens.max(1.0)
                })?;
            window.count(&batch, device_batch.computed_tokens());
            window.losses.push(nll);
            if let Some(s) = scores.stats {
                let sums = Tensor::cat(vec![s.entropy.sum(), s.top1.sum(), s.tokens.sum()], 0); // [3]
                window.token_stats.push((window.steps, sums));
            }
        }
        (Objective::Dpo, Some(refs)) => std::thread::scope(|scope| -> Result<(), DistError> {
            let loss_cfg = &run.cfg.loss;
            let batch = data::collate(pass.chunk, pad_id, truncation, plan.packing);
            let device_batch = DeviceBatch::new(&batch, loss_cfg.ld_alpha, &plan.train_device);
            let pending = match plan.overlap_reference.then(|| refs.whole_rows(&device_batch)).flatten() {
                Some(work) => RefRows::Pending(dpo_torch::threads::spawn_scoped(scope, work)?),
                None => RefRows::Ready(refs.train_rows(pass.ids, &device_batch, run)?),
            };
            let mut ref_rows = None;
            let (scores, loss) = forward_backward(
                policy,
                &device_batch,
                Stats::Metrics { wpo: loss_cfg.use_weighting },
                pass.recompute,
                pass.scale,
                grads,
                |scores| {
                    let rows = ref_rows.insert(pending.wait());
                    dpo_loss(&PairScores::from_scores(&device_batch, scores, rows), loss_cfg)
                },
            )?;
            let Some(ref_rows) = ref_rows else { unreachable!("a micro-batch's loss reads the reference's rows") };
            window.count(&batch, device_batch.computed_tokens());
            window.pending.push((window.steps, device_batch, scores, ref_rows, loss));
            Ok(())
        })?,
        (Objective::Dpo, None) => unreachable!("DPO stages prepare their references"),
    }
    Ok(())
}

/// A micro-batch's reference log-probs (`[2B]`, on the device): at hand, or being scored on
/// another thread.
enum RefRows<'scope> {
    Ready(Tensor<1>),
    Pending(ScopedJoinHandle<'scope, Tensor<1>>),
}

impl RefRows<'_> {
    fn wait(self) -> Tensor<1> {
        match self {
            Self::Ready(rows) => rows,
            // A panic there (a libtorch failure) is this thread's.
            Self::Pending(work) => work.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        }
    }
}

/// Input tokens of a pair's sequences after truncation (TRL's `num_tokens` counts every one).
fn pair_tokens(pair: &TokenizedPair, max_length: usize, objective: Objective) -> f64 {
    let p = pair.prompt_ids.len();
    let chosen = (p + pair.chosen_ids.len()).min(max_length);
    let rejected = (p + pair.rejected_ids.len()).min(max_length);
    // KTO's KL sequences are not counted (TRL counts the rows' attention masks).
    match (objective, pair.label) {
        (Objective::Sft, _) | (Objective::Dpo, Some(_)) => chosen as f64,
        (Objective::Dpo, None) => (chosen + rejected) as f64,
    }
}
