//! The keys and values of the positions seen so far, per layer, so that generation runs each new
//! token through the model once.

use burn::tensor::Tensor;

/// One layer's keys and values for the positions seen so far.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    kv: Option<(Tensor<4>, Tensor<4>)>,
}

impl LayerCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.dims()[2])
    }

    /// Whether no position is held yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends new keys and values and returns all of them.
    ///
    /// # Shapes
    /// - k, v: `[B, Hkv, S, D]` → `[B, Hkv, T, D]` each
    pub(super) fn append(&mut self, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let (k, v) = match self.kv.take() {
            Some((pk, pv)) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)), // [B, Hkv, T, D]
            None => (k, v),
        };
        self.kv = Some((k.clone(), v.clone()));
        (k, v)
    }
}

/// The KV cache of a whole model, for generation.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(super) layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self { layers: vec![LayerCache::default(); num_layers] }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// Whether no position is held yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
