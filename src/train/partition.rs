//! ZeRO-3 (FSDP's full shard): a model whose parameters live as this rank's slices, gathered
//! whole one part at a time (the embedding, a decoder layer, the final norm with the LM head) just
//! before the part computes, and dropped after; and the per-part gradient step of the segmented
//! backward ([`Segments`]), which reduce-scatters each part's gradients as soon as its backward
//! is done (ZeRO-3, and ZeRO-2 under activation checkpointing).
//!
//! A partitioned model keeps its module tree with "hollow" parameters: one zero broadcast to the
//! parameter's shape (a view of a single element), so shapes, names and `require_grad` stay where
//! every other piece of the trainer looks for them, at no memory.

use std::borrow::Cow;
use std::collections::BTreeMap;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Device, FloatDType, Tensor};

use super::optim::{GradAccumulator, padded, slice_of};
use super::workers::Workers;
use crate::config::CommHook;
use crate::dist::DistError;
use crate::dpo::logps::{DeviceBatch, SequenceScores, Stats, score_hidden};
use crate::model::{Llama, params};

/// What the segmented pass gathers (ZeRO-3) or reduce-scatters at one time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The token embedding.
    Embed,
    /// Decoder layer `i`.
    Layer(usize),
    /// The final norm and the LM head (the embedding, when the head is tied to it).
    Head,
}

/// Every parameter's name, element count and whether it trains, and which part it belongs to.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    entries: BTreeMap<String, (usize, bool)>,
    tied: bool,
}

impl Layout {
    /// The layout of `model` (its values are not read).
    pub fn of(model: &Llama) -> Self {
        let mut entries = BTreeMap::new();
        params::visit(model, None, |p| {
            entries.insert(p.name, (p.dims.iter().product(), p.trains));
        });
        Self { entries, tied: model.lm_head.is_none() }
    }

    /// Whether parameter `name` is computed with in `part`.
    pub fn in_part(&self, name: &str, part: Part) -> bool {
        let embed = name.starts_with("model.embed_tokens.");
        match part {
            Part::Embed => embed,
            Part::Layer(i) => {
                name.strip_prefix("model.layers.").and_then(|r| r.strip_prefix(&format!("{i}."))).is_some()
            }
            Part::Head => name.starts_with("model.norm.") || name.starts_with("lm_head.") || (self.tied && embed),
        }
    }

    /// Whether parameter `name` trains.
    pub fn trains(&self, name: &str) -> bool {
        self.entries.get(name).is_some_and(|e| e.1)
    }

    /// The element count of parameter `name` (0 for a name it does not hold).
    pub fn len_of(&self, name: &str) -> usize {
        self.entries.get(name).map_or(0, |e| e.0)
    }

    /// The trainable parameters of `part` with their element counts, in name order.
    fn trainable(&self, part: Part) -> Vec<(&str, usize)> {
        let entries = self.entries.iter().filter(|(name, (_, trains))| *trains && self.in_part(name, part));
        entries.map(|(name, (len, _))| (name.as_str(), *len)).collect()
    }
}

/// Where the segmented forward and backward ([`super::backprop`]) get each part's parameters,
/// and what becomes of the gradients of each part's backward.
pub trait Segments {
    /// The model's tree: whole, or hollow under ZeRO-3 (its shapes and flags only).
    fn skeleton(&self) -> &Llama;
    /// Whether the pass must run one part at a time.
    fn segmented(&self) -> bool;
    /// Whether parameter `name` belongs to `part` (the gradients of a part's backward are read
    /// for those only).
    fn in_part(&self, name: &str, part: Part) -> bool;
    /// A model whose `part` has its parameters whole.
    fn part(&self, part: Part) -> Result<Cow<'_, Llama>, DistError>;
    /// Takes `fresh`, the whole-parameter gradients of `part`'s backward, into `grads`.
    fn absorb(&self, part: Part, fresh: GradAccumulator, grads: &mut GradAccumulator) -> Result<(), DistError>;
}

/// A model whole in memory whose gradients are summed where they fall.
pub struct Whole<'a>(pub &'a Llama);

impl Segments for Whole<'_> {
    fn skeleton(&self) -> &Llama {
        self.0
    }

    fn segmented(&self) -> bool {
        false
    }

    fn in_part(&self, _: &str, _: Part) -> bool {
        true
    }

    fn part(&self, _: Part) -> Result<Cow<'_, Llama>, DistError> {
        Ok(Cow::Borrowed(self.0))
    }

    fn absorb(&self, _: Part, fresh: GradAccumulator, grads: &mut GradAccumulator) -> Result<(), DistError> {
        grads.merge(fresh);
        Ok(())
    }
}

/// ZeRO-2 under checkpointing (`gathered: None`) and ZeRO-3: each part's gradients are summed
/// over the workers and reduce-scattered right after its backward, so `grads` holds this rank's
/// slices only; ZeRO-3 also gathers each part's parameters from `gathered`.
pub struct Scattered<'a> {
    /// The policy (hollow under ZeRO-3).
    pub model: &'a Llama,
    pub layout: &'a Layout,
    pub gathered: Option<&'a Partitioned>,
    pub workers: Workers<'a>,
    pub hook: CommHook,
    /// Where the zeros of a part without gradients are made.
    pub device: &'a Device,
}

impl Segments for Scattered<'_> {
    fn skeleton(&self) -> &Llama {
        self.gathered.map_or(self.model, Partitioned::hollow)
    }

    fn segmented(&self) -> bool {
        true
    }

    fn in_part(&self, name: &str, part: Part) -> bool {
        self.layout.in_part(name, part)
    }

    fn part(&self, part: Part) -> Result<Cow<'_, Llama>, DistError> {
        match self.gathered {
            Some(p) => p.whole(Some(part), self.workers).map(Cow::Owned),
            None => Ok(Cow::Borrowed(self.model)),
        }
    }

    fn absorb(&self, part: Part, mut fresh: GradAccumulator, grads: &mut GradAccumulator) -> Result<(), DistError> {
        let world = self.workers.world_size();
        // Every rank sends the same parameters in the same order: zeros where a part had none.
        let (names, full): (Vec<&str>, Vec<Tensor<1>>) = self
            .layout
            .trainable(part)
            .into_iter()
            .map(|(name, len)| {
                let g = fresh.grads.remove(name).unwrap_or_else(|| Tensor::zeros([len], self.device));
                (name, padded(g, world))
            })
            .unzip();
        let mine = self.workers.reduce_scatter_flat(&full, self.hook)?;
        grads.merge(GradAccumulator { grads: names.into_iter().map(str::to_owned).zip(mine).collect() });
        Ok(())
    }
}

/// A model partitioned over the workers (ZeRO-3).
pub struct Partitioned {
    /// The module tree with hollow parameters.
    hollow: Llama,
    /// This rank's slice (`[c]`, plain) of every parameter, flattened and padded.
    pub slices: BTreeMap<String, Tensor<1>>,
    pub layout: Layout,
    /// `(rank, world_size)`.
    shard: (usize, usize),
}

impl Partitioned {
    /// Keeps this rank's slices of `model`'s parameters; a frozen parameter that `shared` (the
    /// policy, for the LoRA reference that is its base) holds under the same name is not sliced
    /// again but shared.
    pub fn new(model: Llama, shard: (usize, usize), shared: Option<&Partitioned>) -> Self {
        let layout = Layout::of(&model);
        let mut slices = BTreeMap::new();
        params::visit(&model, None, |p| {
            let reused = shared.filter(|s| !s.layout.entries.get(&p.name).is_some_and(|e| e.1));
            let slice = match reused.and_then(|s| s.slices.get(&p.name)) {
                Some(slice) => slice.clone(),
                // `* 1.0` copies the slice out, so the whole parameter's storage is freed.
                None => slice_of(p.flat().inner(), shard) * 1.0,
            };
            slices.insert(p.name, slice);
        });
        Self { hollow: model.map(&mut Hollow), slices, layout, shard }
    }

    /// The module tree (hollow parameters: shapes only).
    pub fn hollow(&self) -> &Llama {
        &self.hollow
    }

    pub fn shard(&self) -> (usize, usize) {
        self.shard
    }

    /// A model with the parameters of `part` (every part: `None`) gathered whole from every
    /// rank's slices, the rest hollow. Every rank calls it at the same point.
    pub fn whole(&self, part: Option<Part>, workers: Workers) -> Result<Llama, DistError> {
        self.whole_with(part, &BTreeMap::new(), workers)
    }

    /// [`Partitioned::whole`] where `overrides` gives the slices of some parameters (the offloaded
    /// optimizer's fp32 masters, on the device) in place of the ones at rest.
    pub fn whole_with(
        &self,
        part: Option<Part>,
        overrides: &BTreeMap<String, Tensor<1>>,
        workers: Workers,
    ) -> Result<Llama, DistError> {
        let slice = |name: &String| overrides.get(name).unwrap_or(&self.slices[name]);
        let names: Vec<&String> =
            self.slices.keys().filter(|n| part.is_none_or(|part| self.layout.in_part(n, part))).collect();
        // One gather per dtype (a frozen base in half precision beside f32 adapters).
        let mut by_dtype: BTreeMap<String, Vec<&String>> = BTreeMap::new();
        for name in names {
            by_dtype.entry(format!("{:?}", slice(name).dtype())).or_default().push(name);
        }
        let mut values: BTreeMap<&str, Tensor<1>> = BTreeMap::new();
        for names in by_dtype.into_values() {
            let slices: Vec<Tensor<1>> = names.iter().map(|n| slice(n).clone()).collect();
            for (name, full) in names.into_iter().zip(workers.gather_slices(&slices)?) {
                values.insert(name, full.narrow(0, 0, self.layout.len_of(name)));
            }
        }
        Ok(params::replace(self.hollow.clone(), |name, _| values.remove(name)))
    }

    /// The per-step reference's scores (no graph), one part gathered at a time.
    ///
    /// # Shapes
    /// - batch.input_ids: `[R, L]`; every output: `[2B]`
    pub fn score(&self, batch: &DeviceBatch, workers: Workers) -> Result<SequenceScores, DistError> {
        let (ids, at) = (batch.input_ids.clone(), batch.placement(&self.hollow));
        let mut x = self.whole(Some(Part::Embed), workers)?.embed(ids); // [R, L, h]
        for i in 0..self.hollow.num_layers() {
            x = self.whole(Some(Part::Layer(i)), workers)?.layer(i, x, &at);
        }
        let head = self.whole(Some(Part::Head), workers)?;
        let hidden = head.final_norm(x);
        Ok(score_hidden(&head, hidden, batch, Stats::Off))
    }
}

impl Partitioned {
    /// The gathers of [`Partitioned::score`], in its order, without its compute (a rank short of
    /// micro-batches keeps in step).
    pub fn idle(&self, workers: Workers) -> Result<(), DistError> {
        self.whole(Some(Part::Embed), workers)?;
        for i in 0..self.hollow.num_layers() {
            self.whole(Some(Part::Layer(i)), workers)?;
        }
        self.whole(Some(Part::Head), workers)?;
        Ok(())
    }
}

/// Replaces every parameter by one zero broadcast to its shape, keeping its id and whether it
/// trains.
struct Hollow;

impl ModuleMapper for Hollow {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, t, mapper) = param.consume();
        let (tracked, dims, dtype) = (t.is_require_grad(), t.dims(), t.dtype());
        let one = Tensor::<D>::zeros([1; D], &t.device()).cast(FloatDType::from(dtype)).detach();
        let hollow = one.expand(dims);
        Param::from_mapped_value(id, if tracked { hollow.require_grad() } else { hollow }, mapper)
    }
}
