// The torch operations training needs that tch does not bind, behind c10d.h's C ABI: fused
// AdamW, multi-tensor norms, scaling and copies, RMSNorm's fused backward, torch's autograd asked
// for gradients, and the variable-length attention kernels with their backward.

#include "c10d.h"
#include "shim.h"

#include <array>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

using shim::check_tensor;
using shim::guarded;

namespace {

// The `n` tensors as a list for a multi-tensor operation, checked: defined, dense, one dtype, one
// device.
std::vector<at::Tensor> tensor_list(const c10d_tensor* tensors, size_t n, const char* op) {
  TORCH_CHECK(n == 0 || tensors != nullptr, op, ": null tensor list");
  std::vector<at::Tensor> list;
  for (size_t i = 0; i < n; ++i) {
    check_tensor(tensors[i], op);
    TORCH_CHECK(tensors[i]->scalar_type() == tensors[0]->scalar_type() && tensors[i]->device() == tensors[0]->device(),
                op, ": entry ", i, " is ", tensors[i]->scalar_type(), " on ", tensors[i]->device(), ", entry 0 ",
                tensors[0]->scalar_type(), " on ", tensors[0]->device());
    list.push_back(*tensors[i]);
  }
  return list;
}

}  // namespace

extern "C" int c10d_fused_adamw(const c10d_tensor* params, const c10d_tensor* grads, const c10d_tensor* exp_avgs,
                                const c10d_tensor* exp_avg_sqs, size_t n, double step, double lr, double beta1,
                                double beta2, double weight_decay, double eps) {
  return guarded("fused_adamw", [&] {
    if (n == 0) return;
    // One list per role, each of one dtype and device; the roles must agree with each other too.
    auto p = tensor_list(params, n, "fused_adamw");
    std::vector<std::vector<at::Tensor>> rest;
    for (const c10d_tensor* list : {grads, exp_avgs, exp_avg_sqs}) {
      rest.push_back(tensor_list(list, n, "fused_adamw"));
      TORCH_CHECK(rest.back()[0].scalar_type() == p[0].scalar_type() && rest.back()[0].device() == p[0].device(),
                  "fused_adamw: the lists mix ", rest.back()[0].scalar_type(), " on ", rest.back()[0].device(),
                  " with ", p[0].scalar_type(), " on ", p[0].device());
      for (size_t i = 0; i < n; ++i) {
        TORCH_CHECK(rest.back()[i].sizes() == p[i].sizes(), "fused_adamw: entry ", i, " mixes sizes ",
                    rest.back()[i].sizes(), " and ", p[i].sizes());
      }
    }
    // The kernel reads each parameter's step count from a float tensor on their device (and never
    // writes it: torch.optim increments the counts before the call), so one serves every entry.
    std::vector<at::Tensor> steps(n, at::full({}, step, p[0].options().dtype(at::kFloat)));
    at::_fused_adamw_(p, rest[0], rest[1], rest[2], {}, steps, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  });
}

extern "C" int c10d_foreach_norms(const c10d_tensor* tensors, size_t n, c10d_tensor* out) {
  return guarded("foreach_norms", [&] {
    TORCH_CHECK(out != nullptr, "foreach_norms: null output");
    auto list = tensor_list(tensors, n, "foreach_norms");
    TORCH_CHECK(n > 0, "foreach_norms: no tensors");
    *out = new at::Tensor(at::stack(at::_foreach_norm(list, 2)));
  });
}

extern "C" int c10d_foreach_mul(const c10d_tensor* tensors, size_t n, c10d_tensor scale) {
  return guarded("foreach_mul", [&] {
    auto list = tensor_list(tensors, n, "foreach_mul");
    TORCH_CHECK(scale != nullptr && scale->defined() && scale->numel() == 1, "foreach_mul: the scale must be one value");
    if (n > 0) at::_foreach_mul_(list, scale->reshape({}));  // the op takes a 0-dim tensor
  });
}

extern "C" int c10d_foreach_copy(const c10d_tensor* dst, const c10d_tensor* src, size_t n) {
  return guarded("foreach_copy", [&] {
    if (n == 0) return;
    auto [d, s] = std::make_pair(tensor_list(dst, n, "foreach_copy"), tensor_list(src, n, "foreach_copy"));
    for (size_t i = 0; i < n; ++i) {
      TORCH_CHECK(d[i].sizes() == s[i].sizes(), "foreach_copy: entry ", i, " mixes sizes ", d[i].sizes(), " and ",
                  s[i].sizes());
    }
    at::_foreach_copy_(d, s);
  });
}

extern "C" int c10d_rms_norm_backward(c10d_tensor grad, c10d_tensor input, c10d_tensor rstd, c10d_tensor* out) {
  return guarded("rms_norm_backward", [&] {
    for (const at::Tensor* t : {grad, input, rstd}) {
      TORCH_CHECK(t != nullptr && t->defined(), "rms_norm_backward: a null or undefined tensor");
    }
    TORCH_CHECK(out != nullptr, "rms_norm_backward: null output");
    TORCH_CHECK(input->is_cuda(), "rms_norm_backward: torch's fused kernel is CUDA only, got ", input->device());
    TORCH_CHECK(input->dim() >= 1 && grad->sizes() == input->sizes(), "rms_norm_backward: grad and input differ in shape");
    auto dx = std::get<0>(at::_fused_rms_norm_backward(*grad, *input, {input->size(-1)}, *rstd, std::nullopt,
                                                        {true, false}));
    *out = new at::Tensor(dx);
  });
}

extern "C" int c10d_autograd_grad(const c10d_tensor* outputs, const c10d_tensor* grad_outputs, size_t n_out,
                                  const c10d_tensor* inputs, size_t n_in, c10d_tensor* grads) {
  return guarded("autograd_grad", [&] {
    TORCH_CHECK(grads != nullptr, "autograd_grad: null output");
    // Any layout: autograd takes strided views as they are.
    auto list = [](const c10d_tensor* ts, size_t n) {
      TORCH_CHECK(n == 0 || ts != nullptr, "autograd_grad: null tensor list");
      std::vector<at::Tensor> out;
      for (size_t i = 0; i < n; ++i) {
        TORCH_CHECK(ts[i] != nullptr && ts[i]->defined(), "autograd_grad: a null or undefined tensor");
        out.push_back(*ts[i]);
      }
      return out;
    };
    auto [outs, gouts, ins] = std::make_tuple(list(outputs, n_out), list(grad_outputs, n_out), list(inputs, n_in));
    auto result = torch::autograd::grad(outs, ins, gouts, /*retain_graph=*/false, /*create_graph=*/false);
    for (size_t i = 0; i < n_in; ++i) grads[i] = new at::Tensor(result[i]);
  });
}

namespace {

// The variable-length kernels read their operands with unit stride in the head dimension only:
// they take the rows' and heads' strides, so q, k and v may be views of one joined projection
// (flash attention's packed qkv) and are copied only where that stride is not 1.
at::Tensor unit_last(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

bool half_precision(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

constexpr int64_t causal_from_bottom_right = 2;  // sdp::CustomMaskType of memory-efficient attention

}  // namespace

extern "C" int c10d_varlen_attention(c10d_tensor q, c10d_tensor k, c10d_tensor v, c10d_tensor cu_q, c10d_tensor cu_k,
                                     int64_t max_q, int64_t max_k, c10d_tensor* out, c10d_tensor* saved,
                                     int64_t* saved_max) {
  return guarded("varlen_attention", [&] {
    for (const at::Tensor* t : {q, k, v, cu_q, cu_k}) {
      TORCH_CHECK(t != nullptr && t->defined(), "varlen_attention: a null or undefined tensor");
    }
    TORCH_CHECK(out != nullptr, "varlen_attention: null output");
    TORCH_CHECK((saved == nullptr) == (saved_max == nullptr), "varlen_attention: saved and saved_max go together");
    TORCH_CHECK(q->is_cuda(), "varlen_attention: torch's variable-length kernels are CUDA only, got ", q->device());
    TORCH_CHECK(q->dim() == 3 && k->dim() == 3 && v->dim() == 3, "varlen_attention: q, k, v must be [T, heads, D]");
    TORCH_CHECK(cu_q->scalar_type() == at::kInt && cu_k->scalar_type() == at::kInt &&
                    cu_q->numel() == cu_k->numel(), "varlen_attention: cu_q and cu_k must be int32 of one length");
    auto [qc, kc, vc] = std::make_tuple(unit_last(*q), unit_last(*k), unit_last(*v));
    // What the backward reads besides the operands and the output, as torch's autograd saves it.
    std::array<at::Tensor, 3> keep;
    std::array<int64_t, 2> keep_max{max_q, max_k};
    at::Tensor y;
    if (half_precision(*q)) {
      // Flash attention: grouped key/value heads as they are; `is_causal` aligns each sequence's
      // mask to its last query (bottom right), as torch.nn.attention.bias.causal_lower_right.
      auto r = at::_flash_attention_forward(qc, kc, vc, *cu_q, *cu_k, max_q, max_k, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, /*return_debug_mask=*/false);
      y = std::get<0>(r);
      keep = {std::get<1>(r), std::get<2>(r), std::get<3>(r)};  // log-sum-exp, rng state, unused
    } else {
      // Memory-efficient attention (the one that takes f32): [1, T, heads, D], as many key/value
      // heads as query heads; the log-sum-exp is what its backward reads.
      TORCH_CHECK(k->size(1) == q->size(1), "varlen_attention: ", q->scalar_type(), " needs as many key/value heads (",
                  k->size(1), ") as query heads (", q->size(1), ")");
      bool grad = saved != nullptr || q->requires_grad() || k->requires_grad() || v->requires_grad();
      auto r = at::_efficient_attention_forward(qc.unsqueeze(0), kc.unsqueeze(0), vc.unsqueeze(0), std::nullopt, *cu_q,
                                                *cu_k, max_q, max_k, /*dropout_p=*/0.0, causal_from_bottom_right,
                                                /*compute_log_sumexp=*/grad);
      y = std::get<0>(r).squeeze(0);
      keep = {std::get<1>(r), std::get<2>(r), std::get<3>(r)};  // log-sum-exp, philox seed and offset
      keep_max = {std::get<4>(r).expect_int(), std::get<5>(r).expect_int()};
    }
    if (saved != nullptr) {
      for (size_t i = 0; i < keep.size(); ++i) saved[i] = new at::Tensor(keep[i]);
      saved_max[0] = keep_max[0];
      saved_max[1] = keep_max[1];
    }
    *out = new at::Tensor(y);
  });
}

extern "C" int c10d_varlen_attention_backward(c10d_tensor dy, c10d_tensor q, c10d_tensor k, c10d_tensor v,
                                              c10d_tensor y, const c10d_tensor* saved, const int64_t* saved_max,
                                              c10d_tensor cu_q, c10d_tensor cu_k, int64_t max_q, int64_t max_k,
                                              c10d_tensor* grads) {
  return guarded("varlen_attention_backward", [&] {
    for (const at::Tensor* t : {dy, q, k, v, y, cu_q, cu_k}) {
      TORCH_CHECK(t != nullptr && t->defined(), "varlen_attention_backward: a null or undefined tensor");
    }
    TORCH_CHECK(saved != nullptr && saved_max != nullptr && grads != nullptr, "varlen_attention_backward: null list");
    for (size_t i = 0; i < 3; ++i) TORCH_CHECK(saved[i] != nullptr, "varlen_attention_backward: a null saved tensor");
    auto [qc, kc, vc] = std::make_tuple(unit_last(*q), unit_last(*k), unit_last(*v));
    auto [dyc, yc] = std::make_tuple(unit_last(*dy), unit_last(*y));
    const at::Tensor &lse = *saved[0], &a = *saved[1], &b = *saved[2];
    std::tuple<at::Tensor, at::Tensor, at::Tensor> g;
    // The calls torch's autograd makes (FlashAttentionBackward0, EfficientAttentionBackward0).
    if (half_precision(*q)) {
      g = at::_flash_attention_backward(dyc, qc, kc, vc, yc, lse, *cu_q, *cu_k, max_q, max_k, /*dropout_p=*/0.0,
                                        /*is_causal=*/true, a, b);
    } else {
      auto r = at::_efficient_attention_backward(dyc.unsqueeze(0), qc.unsqueeze(0), kc.unsqueeze(0), vc.unsqueeze(0),
                                                 std::nullopt, yc.unsqueeze(0), *cu_q, *cu_k, saved_max[0],
                                                 saved_max[1], lse, /*dropout_p=*/0.0, a, b, causal_from_bottom_right,
                                                 /*bias_requires_grad=*/false);
      g = {std::get<0>(r).squeeze(0), std::get<1>(r).squeeze(0), std::get<2>(r).squeeze(0)};
    }
    grads[0] = new at::Tensor(std::get<0>(g));
    grads[1] = new at::Tensor(std::get<1>(g));
    grads[2] = new at::Tensor(std::get<2>(g));
  });
}
