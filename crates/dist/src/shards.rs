//! ZeRO's collectives on per-parameter shards. A parameter's values, flattened and padded with
//! zeros to a multiple of the world size, split into `world` equal slices (FSDP2's per-parameter
//! sharding): rank r owns slice r. Shards of several parameters travel in one bucket, as gradients
//! do ([`ProcessGroup::bucket_bytes`]), through c10d's flat all-gather and reduce-scatter.

use burn::tensor::Tensor;

use super::process_group::{Compression, DistError, ProcessGroup, tch_err};
use dpo_torch::bridge::{self, Origin};

/// The elements of each rank's slice of a parameter of `len` elements: `len / world`, rounded up.
pub fn shard_len(len: usize, world_size: usize) -> usize {
    len.div_ceil(world_size.max(1))
}

/// Consecutive runs of `lens` (elements of 4 bytes) of at most `bucket_bytes`, at least one each.
fn buckets(lens: &[usize], bucket_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < lens.len() {
        let (mut end, mut bytes) = (start + 1, lens[start] * 4);
        while end < lens.len() && bytes + lens[end] * 4 <= bucket_bytes {
            bytes += lens[end] * 4;
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    out
}

fn unwrap_all(tensors: &[Tensor<1>]) -> Result<Vec<(tch::Tensor, Origin)>, DistError> {
    let each = tensors
        .iter()
        .enumerate()
        .map(|(index, t)| bridge::to_tch(t.clone()).map_err(|reason| DistError::NotLibTorch { index, reason }));
    each.collect()
}

impl ProcessGroup {
    /// Every rank's slices gathered: `shards[i]` is this rank's `[c]` slice of parameter i, and
    /// the result's i-th is `[world · c]`, rank r's slice at `[r·c, (r+1)·c)`. Every rank passes
    /// shards of the same lengths, in the same order.
    pub fn all_gather_shards(&self, shards: &[Tensor<1>]) -> Result<Vec<Tensor<1>>, DistError> {
        let err = tch_err("all_gather_shards");
        let world = i64::try_from(self.world_size()).unwrap_or(i64::MAX);
        let local = unwrap_all(shards)?;
        let lens: Vec<usize> = local.iter().map(|(t, _)| t.numel()).collect();
        let groups = buckets(&lens, self.bucket_bytes());
        let mut out = Vec::with_capacity(shards.len());
        for (index, range) in groups.iter().enumerate() {
            let parts: Vec<&tch::Tensor> = local[range.clone()].iter().map(|(t, _)| t).collect();
            let mut input = tch::Tensor::f_cat(&parts, 0).map_err(&err)?; // [B]
            let b = input.size()[0];
            let mut output = tch::Tensor::f_zeros([world * b], (input.kind(), input.device())).map_err(&err)?;
            self.all_gather_into_at(&mut output, &mut input, (index + 1, groups.len()))?;
            let rows = output.f_view([world, b]).map_err(&err)?; // [world, B]: row r is rank r's bucket
            let mut offset = 0;
            for (t, origin) in &local[range.clone()] {
                let c = t.size()[0];
                let full = rows.f_narrow(1, offset, c).and_then(|s| s.f_reshape([world * c])).map_err(&err)?;
                out.push(bridge::from_tch(full, *origin));
                offset += c;
            }
        }
        Ok(out)
    }

    /// This rank's slices of the sums over ranks: `full[i]` is parameter i's padded `[world · c]`
    /// values on every rank, and the result's i-th is slice `rank` (`[c]`) of their sum, each
    /// bucket sent as `compression` says.
    pub fn reduce_scatter_shards(
        &self,
        full: &[Tensor<1>],
        compression: Compression,
    ) -> Result<Vec<Tensor<1>>, DistError> {
        let err = tch_err("reduce_scatter_shards");
        let world = i64::try_from(self.world_size()).unwrap_or(i64::MAX);
        let local = unwrap_all(full)?;
        let lens: Vec<usize> = local.iter().map(|(t, _)| t.numel() / self.world_size().max(1)).collect();
        let groups = buckets(&lens, self.bucket_bytes());
        let mut out = Vec::with_capacity(full.len());
        for (index, range) in groups.iter().enumerate() {
            // Row r of the bucket holds every parameter's slice r, so slice r lands on rank r.
            let rows: Vec<tch::Tensor> = local[range.clone()]
                .iter()
                .map(|(t, _)| t.f_view([world, -1]))
                .collect::<Result<_, _>>()
                .map_err(&err)?;
            let input = tch::Tensor::f_cat(&rows, 1).and_then(|t| t.f_reshape([-1])).map_err(&err)?; // [world · B]
            let kind = input.kind();
            let wire = compression.wire_kind().unwrap_or(kind);
            // Divided before a half-precision cast, as torch's hooks do, so the sum cannot overflow.
            let scale = if wire == kind { 1.0 } else { world as f64 };
            let mut input = input.f_div_scalar(scale).and_then(|t| t.f_to_kind(wire)).map_err(&err)?;
            let b = input.size()[0] / world;
            let mut mine = tch::Tensor::f_zeros([b], (wire, input.device())).map_err(&err)?;
            self.reduce_scatter_sum_at(&mut mine, &mut input, (index + 1, groups.len()))?;
            let mine = mine.f_to_kind(kind).and_then(|t| t.f_mul_scalar(scale)).map_err(&err)?;
            let mut offset = 0;
            for (t, origin) in &local[range.clone()] {
                let c = t.size()[0] / world;
                let slice = mine.f_narrow(0, offset, c).and_then(|s| s.f_contiguous()).map_err(&err)?;
                out.push(bridge::from_tch(slice, *origin));
                offset += c;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_and_buckets() {
        assert_eq!(shard_len(10, 3), 4);
        assert_eq!(shard_len(9, 3), 3);
        assert_eq!(shard_len(1, 4), 1);
        // 4-byte elements: 40-byte buckets hold 10 elements; a larger run is alone.
        assert_eq!(buckets(&[4, 6, 3, 20, 1], 40), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(buckets(&[], 40), Vec::<std::ops::Range<usize>>::new());
    }
}
