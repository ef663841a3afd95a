//! The trainer's view of data parallelism: this process's rank among the workers and the few
//! collective steps a training loop needs, as no-ops when it runs alone.

use std::collections::BTreeMap;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::Tensor;

use super::optim::GradAccumulator;
use crate::config::CommHook;
use crate::dist::{Compression, DistError, ProcessGroup};
use crate::model::params;

/// One process of a job, or the whole job when `group` is `None`.
#[derive(Clone, Copy)]
pub struct Workers<'a> {
    pub group: Option<&'a ProcessGroup>,
}

impl<'a> Workers<'a> {
    /// A lone process.
    pub fn single() -> Self {
        Self { group: None }
    }

    pub fn rank(&self) -> usize {
        self.group.map_or(0, ProcessGroup::rank)
    }

    pub fn world_size(&self) -> usize {
        self.group.map_or(1, ProcessGroup::world_size)
    }

    /// Rank 0 alone writes files and reports progress.
    pub fn is_main(&self) -> bool {
        self.rank() == 0
    }

    /// Names the optimizer step (1-based, 0 before the first) the next collectives belong to,
    /// for the report of a hang.
    pub fn at_step(&self, step: u64) {
        if let Some(g) = self.group {
            g.set_context(step, "step");
        }
    }

    /// Names what the next collectives are for, for the report of a hang.
    fn phase(&self, phase: &'static str) -> Option<&'a ProcessGroup> {
        self.group.inspect(|g| g.set_phase(phase))
    }

    /// Sums the metric `values` over the workers, in place.
    pub fn sum_f64(&self, values: &mut [f64]) -> Result<(), DistError> {
        self.phase("metrics").map_or(Ok(()), |g| g.all_reduce_sum_f64(values))
    }

    /// Whether any worker says yes (Ctrl-C reaches the ranks at different steps: they agree here).
    pub fn any(&self, flag: bool) -> Result<bool, DistError> {
        let mut v = [f64::from(u8::from(flag))];
        self.phase("stop check").map_or(Ok(()), |g| g.all_reduce_sum_f64(&mut v))?;
        Ok(v[0] > 0.0)
    }

    /// Waits for every worker; `phase` names what they meet for ("checkpoint", ...).
    pub fn barrier(&self, phase: &'static str) -> Result<(), DistError> {
        self.phase(phase).map_or(Ok(()), ProcessGroup::barrier)
    }

    /// Sums every worker's accumulated gradients of the trainable parameters, bucketed, in
    /// parameter-name order, each bucket sent as `hook` says. A worker without pairs this step
    /// (the short end of an epoch) contributes zeros.
    pub fn sum_grads<M: Module>(
        &self,
        grads: &mut GradAccumulator,
        model: &M,
        hook: CommHook,
    ) -> Result<(), DistError> {
        let Some(group) = self.phase("gradient sync") else { return Ok(()) };
        // Frozen parameters (a LoRA base) have no gradient to synchronise.
        params::visit(model, None, |p| {
            if p.trains {
                let (n, device) = (p.numel(), p.device());
                grads.grads.entry(p.name).or_insert_with(|| Tensor::zeros([n], &device));
            }
        });
        let names: Vec<String> = grads.grads.keys().cloned().collect();
        let mut tensors: Vec<Tensor<1>> = names.iter().map(|n| grads.grads[n].clone()).collect();
        group.all_reduce_sum_compressed(&mut tensors, compression(hook))?;
        grads.grads = names.into_iter().zip(tensors).collect();
        Ok(())
    }

    /// ZeRO-2: each worker's accumulated gradients, summed over the workers and reduce-scattered:
    /// afterwards `grads` holds this worker's slice (`[c]`) of every trainable parameter's sum.
    pub fn reduce_scatter_grads<M: Module>(
        &self,
        grads: &mut GradAccumulator,
        model: &M,
        hook: CommHook,
    ) -> Result<(), DistError> {
        let world = self.world_size();
        let mut lens = BTreeMap::new();
        params::visit(model, None, |p| {
            if p.trains {
                let (n, device) = (p.numel(), p.device());
                lens.insert(p.name, (n, device));
            }
        });
        // Padded to a multiple of the world size; a worker without pairs this step sends zeros.
        let padded: Vec<(String, Tensor<1>)> = lens
            .into_iter()
            .map(|(name, (n, device))| {
                let g = grads.grads.remove(&name).unwrap_or_else(|| Tensor::zeros([n], &device));
                (name, super::optim::padded(g, world))
            })
            .collect();
        let (names, full): (Vec<String>, Vec<Tensor<1>>) = padded.into_iter().unzip();
        let mine = self.reduce_scatter_flat(&full, hook)?;
        grads.grads = names.into_iter().zip(mine).collect();
        Ok(())
    }

    /// ZeRO: this worker's slice of the sum over the workers of each padded `[world · c]` tensor.
    pub fn reduce_scatter_flat(&self, full: &[Tensor<1>], hook: CommHook) -> Result<Vec<Tensor<1>>, DistError> {
        match self.phase("gradient sync") {
            Some(group) => group.reduce_scatter_shards(full, compression(hook)),
            None => Ok(full.to_vec()),
        }
    }

    /// ZeRO: every worker's updated slices, gathered into whole (padded) parameters.
    pub fn gather_slices(&self, slices: &[Tensor<1>]) -> Result<Vec<Tensor<1>>, DistError> {
        match self.phase("parameter gather") {
            Some(group) => group.all_gather_shards(slices),
            None => Ok(slices.to_vec()),
        }
    }

    /// The sum over the workers of a small tensor (a gradient norm's squares under ZeRO-2).
    pub fn sum_tensor(&self, t: Tensor<1>) -> Result<Tensor<1>, DistError> {
        let Some(group) = self.phase("gradient norm") else { return Ok(t) };
        let mut one = [t];
        group.all_reduce_sum(&mut one)?;
        let [t] = one;
        Ok(t)
    }

    /// Every worker starts from rank 0's parameters.
    pub fn broadcast_params<M: Module>(&self, model: M) -> Result<M, DistError> {
        let Some(group) = self.phase("initial broadcast") else { return Ok(model) };
        let mut mapper = Broadcast { group, error: None };
        let model = model.map(&mut mapper);
        mapper.error.map_or(Ok(model), Err)
    }

    /// The dataset indices this worker handles: every `world_size`-th from its rank.
    pub fn shard(&self, len: usize) -> Vec<usize> {
        shard(len, self.world_size(), self.rank())
    }

    /// Assembles per-item columns computed on each worker's [`Workers::shard`] into columns in
    /// dataset order, on every worker.
    pub fn gather_columns(&self, len: usize, local: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, DistError> {
        let Some(group) = self.phase("scoring pairs") else { return Ok(local) };
        let world = group.world_size();
        local
            .iter()
            .map(|column| {
                let parts = group.all_gather_f32(column)?;
                let mut out = vec![0.0; len];
                for (rank, part) in parts.iter().enumerate() {
                    for (j, index) in shard(len, world, rank).into_iter().enumerate() {
                        out[index] = part[j];
                    }
                }
                Ok(out)
            })
            .collect()
    }
}

/// The wire format of `ddp_comm_hook`.
fn compression(hook: CommHook) -> Compression {
    match hook {
        CommHook::None => Compression::None,
        CommHook::Bf16 => Compression::Bf16,
        CommHook::Fp16 => Compression::Fp16,
    }
}

/// Indices `rank, rank + world, rank + 2·world, ..` below `len`.
pub fn shard(len: usize, world_size: usize, rank: usize) -> Vec<usize> {
    (rank..len).step_by(world_size.max(1)).collect()
}

struct Broadcast<'a> {
    group: &'a ProcessGroup,
    error: Option<DistError>,
}

impl ModuleMapper for Broadcast<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if self.error.is_some() {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let mut slot = [tensor];
        if let Err(e) = self.group.broadcast(&mut slot, 0) {
            self.error = Some(e);
        }
        let [tensor] = slot;
        Param::from_mapped_value(id, tensor, mapper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_indices() {
        let mut all: Vec<usize> = (0..3).flat_map(|r| shard(10, 3, r)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_eq!(shard(10, 3, 1), vec![1, 4, 7]);
    }
}
