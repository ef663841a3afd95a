//! A packed row attended by torch's variable-length CUDA kernel ([`Spans`]): the spans laid out
//! as the kernel's sequences, the call, and the graph node that trains through it.
//!
//! The node calls the kernel's own backward on the caller's thread. Through torch's autograd, as
//! before, each layer's backward was handed to the engine's CUDA worker thread and waited on:
//! 1.1 ms of host time a layer in the H200 profile of the 0.5B row (results/gpu/), 27 ms of its
//! 147 ms step, the largest of its gaps between operators, where the kernel and the prefixes'
//! key gradients take a third of that. Should the kernel's backward fail (a build of torch
//! without it), torch's autograd differentiates the call from the kept operands instead, and
//! from then on, with one warning: speed lost, not the run.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn_tch::{LibTorch, TchTensor};
use dpo_torch::TorchError;
use dpo_torch::kernels::{self, VarlenSaved, VarlenSeqs};

use super::{
    Share, Spans, VARLEN_BACKWARD, from_rows, prefix_len, rows_dims, shared, span_keys, takes_grouped_heads, to_rows,
    upload,
};

/// [`Spans`] for the variable-length call.
#[derive(Debug)]
pub(super) struct Varlen {
    seqs: VarlenSeqs,
    /// `[Tk]` the row position of each key, where some span has a prefix; None where the keys are
    /// the row itself.
    keys: Option<tch::Tensor>,
    /// The row positions the spans cover: all of the row, or this path does not apply.
    rows: i64,
}

impl Clone for Varlen {
    fn clone(&self) -> Self {
        let seqs = &self.seqs;
        Varlen {
            seqs: VarlenSeqs {
                cu_q: seqs.cu_q.shallow_clone(),
                cu_k: seqs.cu_k.shallow_clone(),
                max_q: seqs.max_q,
                max_k: seqs.max_k,
            },
            keys: self.keys.as_ref().map(tch::Tensor::shallow_clone),
            rows: self.rows,
        }
    }
}

impl Share for Option<Varlen> {
    fn share(&self) -> Self {
        self.clone()
    }
}

/// The host side of [`Varlen`]: `(cu_q, cu_k, keys, (max_q, max_k))`.
pub(super) type VarlenLayout = (Vec<i32>, Vec<i32>, Option<Vec<i64>>, (i64, i64));

impl Spans {
    /// The variable-length call's layout on the host (see [`Varlen`]); None unless the spans
    /// tile the row in order from position 0 (as `data::batch` lays them out) within int32.
    pub(super) fn varlen_layout(&self) -> Option<VarlenLayout> {
        let (mut cu_q, mut cu_k, mut keys) = (vec![0i32], vec![0i32], Vec::new());
        let (mut max_q, mut max_k, mut end) = (0, 0, 0);
        for s in &self.spans {
            if s.start != end {
                return None;
            }
            end = s.start + s.len;
            max_q = max_q.max(s.len);
            max_k = max_k.max(prefix_len(s) + s.len);
            keys.extend(span_keys(s).map(|t| t as i64));
            cu_q.push(i32::try_from(end).ok()?);
            cu_k.push(i32::try_from(keys.len()).ok()?);
        }
        let keys = self.spans.iter().any(|s| s.prefix.is_some()).then_some(keys);
        Some((cu_q, cu_k, keys, (max_q as i64, max_k as i64)))
    }

    /// The call's sequences on `device` for a row of `rows` positions (made once, then shared
    /// handles); None where the spans do not tile it.
    pub(super) fn varlen_on(&self, device: tch::Device, rows: i64) -> Option<Varlen> {
        let make = || {
            self.varlen_layout().map(|(cu_q, cu_k, keys, (max_q, max_k))| Varlen {
                seqs: VarlenSeqs { cu_q: upload(&cu_q, device), cu_k: upload(&cu_k, device), max_q, max_k },
                keys: keys.map(|k| upload(&k, device)),
                rows: cu_q.last().copied().unwrap_or(0).into(),
            })
        };
        shared(&self.varlen, device, make).filter(|v| v.rows == rows)
    }
}

/// The variable-length kernel's two calls: torch's ([`Torch`]), or a stand-in where torch has
/// none (the CPU's tests).
pub(super) trait VarlenKernel: Clone + Send + std::fmt::Debug + 'static {
    /// What the backward reads of a forward call besides its operands and output.
    type Saved: Clone + Send + std::fmt::Debug + 'static;

    /// Whether k and v go in with fewer heads than q (else repeated to q's).
    fn grouped_heads(&self, q: &tch::Tensor) -> bool {
        takes_grouped_heads(q)
    }

    /// The output `[Tq, H, D]` of q `[Tq, H, D]`, k and v `[Tk, Hkv, D]`, and what the backward
    /// reads of it.
    fn forward(&self, qkv: [&tch::Tensor; 3], seqs: &VarlenSeqs) -> Result<(tch::Tensor, Self::Saved), TorchError>;

    /// [`VarlenKernel::forward`]'s output alone (inference, or under torch's autograd where the
    /// operands require gradients), keeping nothing for a backward.
    fn attend(&self, qkv: [&tch::Tensor; 3], seqs: &VarlenSeqs) -> Result<tch::Tensor, TorchError> {
        self.forward(qkv, seqs).map(|(y, _)| y)
    }

    /// The gradients of q, k and v from `dy`, the gradient at the output `y`.
    fn backward(
        &self,
        dy: &tch::Tensor,
        qkv: [&tch::Tensor; 3],
        y: &tch::Tensor,
        saved: &Self::Saved,
        seqs: &VarlenSeqs,
    ) -> Result<[tch::Tensor; 3], TorchError>;
}

/// torch's kernels through the shim (`dpo_torch::kernels`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Torch;

impl VarlenKernel for Torch {
    type Saved = VarlenSaved;

    fn forward(&self, qkv: [&tch::Tensor; 3], seqs: &VarlenSeqs) -> Result<(tch::Tensor, VarlenSaved), TorchError> {
        kernels::varlen_attention_saving(qkv, seqs)
    }

    fn attend(&self, qkv: [&tch::Tensor; 3], seqs: &VarlenSeqs) -> Result<tch::Tensor, TorchError> {
        kernels::varlen_attention(qkv, seqs)
    }

    fn backward(
        &self,
        dy: &tch::Tensor,
        qkv: [&tch::Tensor; 3],
        y: &tch::Tensor,
        saved: &VarlenSaved,
        seqs: &VarlenSeqs,
    ) -> Result<[tch::Tensor; 3], TorchError> {
        kernels::varlen_attention_backward(dy, qkv, y, saved, seqs)
    }
}

/// q as rows `[S, H, D]` and k and v as the kernel takes them: the prefixes' keys gathered
/// (`[Tk, Hkv, D]`), the heads repeated to q's where the kernel takes no fewer. Also how many
/// times each key/value head was repeated.
///
/// # Shapes
/// - q: `[1, H, S, D]`, k, v: `[1, Hkv, S, D]`
fn operands(kernel: &impl VarlenKernel, [q, k, v]: [&tch::Tensor; 3], varlen: &Varlen) -> ([tch::Tensor; 3], i64) {
    let q = to_rows(q);
    let groups = q.size()[1] / k.size()[1];
    let repeat = if groups > 1 && !kernel.grouped_heads(&q) { groups } else { 1 };
    let [k, v] = [k, v].map(to_rows);
    let [k, v] = match &varlen.keys {
        Some(at) => gathered([k, v], at), // [Tk, Hkv, D] each
        None => [k, v],
    };
    let repeated = |x: tch::Tensor| match repeat > 1 {
        true => x.repeat_interleave_self_int(repeat, 1, None),
        false => x,
    };
    ([q, repeated(k), repeated(v)], repeat)
}

/// The rows `at` of k and v (`[S, Hkv, D]` each): one gather where v's heads follow k's in each
/// row of one buffer (the joined projection's views), as two views of its output; else one each.
/// On a GPU each gather is a kernel and about 85 us of the host's time.
fn gathered([k, v]: [tch::Tensor; 2], at: &tch::Tensor) -> [tch::Tensor; 2] {
    let ([s, hkv, d], stride) = (rows_dims(&k), k.stride());
    let bytes = k.kind().elt_size_in_bytes() as i64;
    let adjacent = v.size() == k.size()
        && v.stride() == stride
        && stride[1..] == [d, 1]
        && stride[0] >= 2 * hkv * d
        && v.data_ptr() as i64 == k.data_ptr() as i64 + hkv * d * bytes;
    // Within k's storage, or not at all (then the two gathers).
    let both = adjacent.then(|| k.f_as_strided([s, 2 * hkv, d], stride.as_slice(), None).ok()).flatten();
    let Some(both) = both else { return [k.index_select(0, at), v.index_select(0, at)] };
    let rows = both.index_select(0, at); // [Tk, 2·Hkv, D]
    [rows.narrow(1, 0, hkv), rows.narrow(1, hkv, hkv)]
}

/// The spans of one packed row by the variable-length `kernel`, for inference (no graph; torch's
/// autograd records it where the inputs require gradients); None where they do not tile the row.
///
/// # Shapes
/// - q: `[1, H, S, D]`, k, v: `[1, Hkv, S, D]` → `[1, H, S, D]`
pub(super) fn attend_varlen(
    qkv: &[tch::Tensor; 3],
    spans: &Spans,
    kernel: &impl VarlenKernel,
) -> Option<Result<tch::Tensor, TorchError>> {
    let varlen = spans.varlen_on(qkv[0].device(), qkv[0].size()[2])?;
    let (operands, _) = operands(kernel, qkv.each_ref(), &varlen);
    Some(kernel.attend(operands.each_ref(), &varlen.seqs).map(|y| from_rows(&y)))
}

/// The graph node of a packed row attended by the variable-length kernel: its backward is the
/// kernel's, then the prefixes' keys summed back onto their row positions (as torch's autograd
/// differentiates the gather: zeros, then `index_add_`) and repeated heads onto theirs.
#[derive(Debug)]
pub(super) struct VarlenAttention<K>(pub(super) K);

/// What [`VarlenAttention`] keeps for its backward. Every handle keeps burn's storage reference
/// (of its input, or of the output burn gets), so burn never writes in place into a tensor kept
/// here.
#[derive(Debug, Clone)]
pub(super) struct Kept<K: VarlenKernel> {
    kernel: K,
    /// The kernel's operands ([`operands`]) and output `[S, H, D]`.
    operands: [TchTensor; 3],
    y: TchTensor,
    saved: K::Saved,
    varlen: Varlen,
    repeat: i64,
}

impl<K: VarlenKernel> VarlenAttention<K> {
    /// The row's output `[1, H, S, D]` and what the backward keeps; None where the spans do not
    /// tile the row.
    pub(super) fn forward(
        &self,
        qkv: [&TchTensor; 3],
        spans: &Spans,
    ) -> Option<Result<(TchTensor, Kept<K>), TorchError>> {
        let varlen = spans.varlen_on(qkv[0].tensor.device(), qkv[0].tensor.size()[2])?;
        let (rows, repeat) = operands(&self.0, qkv.map(|x| &x.tensor), &varlen);
        let gathered = varlen.keys.is_some() || repeat > 1;
        let [q, k, v] = rows;
        let handle = |t: tch::Tensor, of: &TchTensor, own: bool| match own {
            true => TchTensor::new(t),
            false => TchTensor { tensor: t, storage: of.storage.clone() },
        };
        let operands = [handle(q, qkv[0], false), handle(k, qkv[1], gathered), handle(v, qkv[2], gathered)];
        let result = self.0.forward(operands.each_ref().map(|t| &t.tensor), &varlen.seqs).map(|(y, saved)| {
            let out = TchTensor::new(from_rows(&y));
            let y = TchTensor { tensor: y, storage: out.storage.clone() };
            (out, Kept { kernel: self.0.clone(), operands, y, saved, varlen, repeat })
        });
        Some(result)
    }
}

impl<K: VarlenKernel> Kept<K> {
    /// The gradients of the node's q, k and v (`[1, H or Hkv, S, D]`) from `dy`, the gradient at
    /// its output (`[1, H, S, D]`), by the kernel's backward.
    pub(super) fn gradients(&self, dy: &tch::Tensor) -> Result<[tch::Tensor; 3], TorchError> {
        let operands = self.operands.each_ref().map(|t| &t.tensor);
        let grads = self.kernel.backward(&to_rows(dy), operands, &self.y.tensor, &self.saved, &self.varlen.seqs)?;
        Ok(self.onto_inputs(grads))
    }

    /// [`Kept::gradients`] through torch's autograd instead (the forward run again from the
    /// operands as leaves): where the kernel's backward failed.
    pub(super) fn gradients_by_autograd(&self, dy: &tch::Tensor) -> Result<[tch::Tensor; 3], TorchError> {
        let leaves = self.operands.each_ref().map(|t| t.tensor.detach().set_requires_grad(true));
        let y = self.kernel.attend(leaves.each_ref(), &self.varlen.seqs)?;
        let grads = dpo_torch::kernels::autograd_grad(&y, &to_rows(dy), &leaves.each_ref())?;
        let Ok(grads) = <[tch::Tensor; 3]>::try_from(grads) else { unreachable!("one gradient an operand") };
        Ok(self.onto_inputs(grads))
    }

    /// The gradients at the kernel's operands (`[S, H, D]`, `[Tk, H or Hkv, D]` twice) put back
    /// onto the node's inputs: repeated heads summed onto theirs, the prefixes' keys onto their
    /// row positions (k's and v's side by side, one scatter).
    fn onto_inputs(&self, [dq, dk, dv]: [tch::Tensor; 3]) -> [tch::Tensor; 3] {
        let unrepeated = |g: tch::Tensor| match self.repeat > 1 {
            true => {
                let [t, h, d] = rows_dims(&g);
                g.view([t, h / self.repeat, self.repeat, d]).sum_dim_intlist([2i64].as_slice(), false, None)
            }
            false => g,
        };
        let [dk, dv] = [dk, dv].map(unrepeated); // [Tk, Hkv, D]
        let [dk, dv] = match &self.varlen.keys {
            Some(at) => {
                let [_, hkv, d] = rows_dims(&dk);
                let both = tch::Tensor::cat(&[&dk, &dv], 1); // [Tk, 2·Hkv, D]
                let mut rows = tch::Tensor::zeros([dq.size()[0], 2 * hkv, d], (dk.kind(), dk.device()));
                let _ = rows.index_add_(0, at, &both);
                [rows.narrow(1, 0, hkv), rows.narrow(1, hkv, hkv)]
            }
            None => [dk, dv],
        };
        [from_rows(&dq), from_rows(&dk), from_rows(&dv)]
    }
}

impl<K: VarlenKernel> Backward<LibTorch, 3> for VarlenAttention<K> {
    type State = Kept<K>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<LibTorch>(&ops.node);
        // The kernel's backward failing costs speed, not the run: torch's autograd takes over (and
        // does from the forward on, `VARLEN_BACKWARD`). A failure there too is libtorch's.
        let all = ops.state.gradients(&dy.tensor).or_else(|e| {
            VARLEN_BACKWARD.give_up(e);
            ops.state.gradients_by_autograd(&dy.tensor)
        });
        let all = all.unwrap_or_else(|e| dpo_torch::libtorch_failed("the variable-length attention's backward", &e));
        for (parent, grad) in ops.parents.into_iter().zip(all) {
            if let Some(parent) = parent {
                grads.register::<LibTorch>(parent.id, TchTensor::new(grad));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use dpo_data::Span;

    use super::super::tests::{max_diff, tch_bounds, three_spans};
    use super::super::{Spans, attend_spans, from_rows, sdpa_causal, to_rows};
    use super::*;

    /// The kernel's stand-in on the CPU: each sequence's queries attended to its keys with the
    /// mask aligned to the last query (torch's attention on the sequence alone), the backward by
    /// torch's autograd through that again. `grouped`: whether it takes fewer key/value heads;
    /// `broken`: whether its backward fails (as a kernel a build of torch lacks would).
    #[derive(Debug, Clone, Copy)]
    struct StandIn {
        grouped: bool,
        broken: bool,
    }

    impl StandIn {
        fn attend([q, k, v]: [&tch::Tensor; 3], seqs: &VarlenSeqs) -> tch::Tensor {
            let (cu_q, cu_k) = (Vec::<i32>::try_from(&seqs.cu_q).unwrap(), Vec::<i32>::try_from(&seqs.cu_k).unwrap());
            let part = |x: &tch::Tensor, cu: &[i32], i: usize| {
                from_rows(&x.narrow(0, cu[i].into(), (cu[i + 1] - cu[i]).into())) // [1, H, n, D]
            };
            let ys: Vec<_> = (0..cu_q.len() - 1)
                .map(|i| sdpa_causal(&[part(q, &cu_q, i), part(k, &cu_k, i), part(v, &cu_k, i)]))
                .map(|y| to_rows(&y))
                .collect();
            tch::Tensor::cat(&ys, 0)
        }
    }

    impl VarlenKernel for StandIn {
        type Saved = ();

        fn grouped_heads(&self, _: &tch::Tensor) -> bool {
            self.grouped
        }

        fn forward(&self, qkv: [&tch::Tensor; 3], seqs: &VarlenSeqs) -> Result<(tch::Tensor, ()), TorchError> {
            Ok((Self::attend(qkv, seqs), ()))
        }

        fn backward(
            &self,
            dy: &tch::Tensor,
            qkv: [&tch::Tensor; 3],
            _: &tch::Tensor,
            _: &(),
            seqs: &VarlenSeqs,
        ) -> Result<[tch::Tensor; 3], TorchError> {
            if self.broken {
                return Err(TorchError::Shim { op: "stand-in", code: 1, message: "no backward".to_owned() });
            }
            let leaves = qkv.map(|x| x.detach().set_requires_grad(true));
            let y = Self::attend(leaves.each_ref(), seqs);
            let grads = tch::Tensor::run_backward(&[(y * dy).sum(tch::Kind::Float)], &leaves, false, false);
            let [dq, dk, dv] = <[tch::Tensor; 3]>::try_from(grads).unwrap();
            Ok([dq, dk, dv])
        }
    }

    /// The variable-length layout: the row's spans as its sequences, each prefix's keys before
    /// its span's own; spans that do not tile the row from 0 have none.
    #[test]
    fn spans_lay_out_for_the_variable_length_kernel() {
        let (cu_q, cu_k, keys, max) = three_spans().varlen_layout().expect("the spans tile the row");
        assert_eq!((cu_q, cu_k, max), (vec![0, 5, 9, 12], vec![0, 5, 9, 15], (5, 6)));
        assert_eq!(keys.expect("a prefix"), [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 9, 10, 11]);
        let plain = Spans::new(vec![Span { start: 0, len: 2, prefix: None }, Span { start: 2, len: 3, prefix: None }]);
        assert_eq!(plain.varlen_layout(), Some((vec![0, 2, 5], vec![0, 2, 5], None, (3, 3))));
        for gap in [1, 3] {
            let spans =
                Spans::new(vec![Span { start: 0, len: 2, prefix: None }, Span { start: gap, len: 2, prefix: None }]);
            assert_eq!(spans.varlen_layout(), None, "second span at {gap}");
        }
    }

    /// q, k, v `[1, H, 12, D]` requiring gradients (4 query heads on 2 key/value heads) and the
    /// weights of the output's weighted sum; `joined`: views of one `[1, 12, 8, D]` leaf (a
    /// layer's joined projection), else leaves of their own.
    fn operands12(joined: bool) -> ([tch::Tensor; 3], tch::Tensor) {
        let opts = (tch::Kind::Float, tch::Device::Cpu);
        let weights = tch::Tensor::randn([1, 4, 12, 8], opts);
        if joined {
            let rows = tch::Tensor::randn([1, 12, 8, 8], opts).set_requires_grad(true);
            let heads = rows.transpose(1, 2); // [1, 8, 12, D]
            return ([heads.narrow(1, 0, 4), heads.narrow(1, 4, 2), heads.narrow(1, 6, 2)], weights);
        }
        let t = |h| tch::Tensor::randn([1, h, 12, 8], opts).set_requires_grad(true);
        ([t(4), t(2), t(2)], weights)
    }

    /// Keys and values side by side in one buffer are gathered at once, as two views of one
    /// gather; apart, one each: the same rows either way.
    #[test]
    fn keys_and_values_side_by_side_are_gathered_at_once() {
        let at = tch::Tensor::from_slice(&[0i64, 3, 3, 11, 5]);
        for joined in [true, false] {
            let ([_, k, v], _) = operands12(joined);
            let [k, v] = [&k, &v].map(|x| to_rows(&x.detach())); // [12, 2, 8]
            let [gk, gv] = gathered([k.shallow_clone(), v.shallow_clone()], &at);
            assert_eq!(max_diff(&gk, &k.index_select(0, &at)), 0.0, "joined {joined}: keys");
            assert_eq!(max_diff(&gv, &v.index_select(0, &at)), 0.0, "joined {joined}: values");
            let one_gather = gv.data_ptr() as usize - gk.data_ptr() as usize == 2 * 8 * 4;
            assert_eq!(one_gather, joined, "joined {joined}: one gather's views");
        }
    }

    /// The gradients of q, k and v of `Σ y·weights` through torch's autograd.
    fn torch_grads(y: &tch::Tensor, qkv: &[tch::Tensor; 3], weights: &tch::Tensor) -> Vec<tch::Tensor> {
        tch::Tensor::run_backward(&[(y * weights).sum(tch::Kind::Float)], qkv, false, false)
    }

    /// The variable-length path's plumbing (the queries as rows, the prefixes' keys gathered, the
    /// output put back) with the CPU stand-in: equal to the padded batch, forward and gradients.
    #[test]
    fn the_variable_length_path_equals_the_padded_batch() {
        let (qkv, weights) = operands12(false);
        let spans = three_spans();
        let varlen = attend_varlen(&qkv, &spans, &StandIn { grouped: true, broken: false }).expect("tiles").unwrap();
        let padded = attend_spans(&qkv, &spans);
        let (out, grad) = tch_bounds(qkv.each_ref(), &weights, 12);
        assert!(max_diff(&varlen, &padded) <= out, "outputs differ");
        for (a, b) in torch_grads(&varlen, &qkv, &weights).iter().zip(&torch_grads(&padded, &qkv, &weights)) {
            assert!(max_diff(a, b) <= grad, "gradients differ");
        }
        // Spans that leave the row's last positions out are not this path's.
        let short = Spans::new(vec![Span { start: 0, len: 5, prefix: None }, Span { start: 5, len: 4, prefix: None }]);
        assert!(attend_varlen(&qkv, &short, &StandIn { grouped: true, broken: false }).is_none());
    }

    /// The node's own backward (the kernel's, the prefixes' key gradients summed onto their row
    /// positions, repeated heads summed onto theirs) equals torch's autograd through the padded
    /// batch, with the kernel taking grouped heads and with them repeated (CUDA's f32 kernel); its
    /// output too, and it keeps burn's handle on the query's storage. Where the kernel's backward
    /// fails, the gradients through torch's autograd from the kept operands are the same; and with
    /// q, k and v views of one joined projection (keys and values gathered at once).
    #[test]
    fn the_nodes_backward_equals_torch_autograd_through_the_padded_batch() {
        let cases = [(true, false, false), (false, false, false), (true, true, false), (false, true, false)];
        for (grouped, broken, joined) in cases.into_iter().chain([(true, false, true), (false, false, true)]) {
            let (qkv, weights) = operands12(joined);
            let spans = three_spans();
            let inputs = qkv.each_ref().map(|x| TchTensor::new(x.detach()));
            let node = VarlenAttention(StandIn { grouped, broken });
            let (out, kept) = node.forward(inputs.each_ref(), &spans).expect("tiles").unwrap();
            assert!(!inputs[0].can_mut() && !out.can_mut(), "kept handles share burn's storage references");
            let grads = match broken {
                false => kept.gradients(&weights).unwrap(),
                true => {
                    let e = kept.gradients(&weights).expect_err("a broken backward");
                    assert!(e.to_string().contains("no backward"), "{e}");
                    kept.gradients_by_autograd(&weights).unwrap()
                }
            };
            let padded = attend_spans(&qkv, &spans);
            let (bound_out, bound_grad) = tch_bounds(qkv.each_ref(), &weights, 12);
            let case = format!("grouped {grouped}, broken {broken}, joined {joined}");
            assert!(max_diff(&out.tensor, &padded) <= bound_out, "{case}: outputs differ");
            for (i, (a, b)) in grads.iter().zip(&torch_grads(&padded, &qkv, &weights)).enumerate() {
                assert_eq!(a.size(), b.size(), "{case}: gradient {i}'s shape");
                assert!(max_diff(a, b) <= bound_grad, "{case}: gradient {i} differs");
            }
        }
    }
}
