// The C ABI of the shim: process groups over a TCPStore rendezvous, with Gloo (CPU) or, when
// built with USE_C10D_NCCL, NCCL (CUDA) (c10d.cpp); the torch operations tch does not bind
// (ops.cpp); the process's torch settings and state (runtime.cpp). Wrapped by `src/ffi.rs`.
//
// Every function returns 0 on success and a non-zero code on failure; the failure's message is
// then readable from `c10d_last_error()` on the same thread until the next call fails.
// Tensors cross as `at::Tensor*` (tch's `C_tensor`), and collectives work on them in place.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
namespace at { class Tensor; }
typedef at::Tensor* c10d_tensor;
extern "C" {
#else
typedef void* c10d_tensor;
#endif

typedef struct C10dGroup C10dGroup;

enum {
  C10D_OK = 0,
  C10D_ERR_INVALID = 1,   // a bad argument (null pointer, unknown backend, rank out of range)
  C10D_ERR_TORCH = 2,     // a c10::Error (timeouts and lost peers included)
  C10D_ERR_STD = 3,       // another std::exception
  C10D_ERR_UNKNOWN = 4,   // anything else thrown
  C10D_ERR_UNSUPPORTED = 5 // the backend was not compiled in
};

enum { C10D_BACKEND_GLOO = 0, C10D_BACKEND_NCCL = 1 };
enum { C10D_OP_SUM = 0, C10D_OP_AVG = 1 };

// The last failure's message on this thread (never null; empty when none).
const char* c10d_last_error(void);

// 1 when the NCCL backend was compiled in, else 0.
int c10d_has_nccl(void);

// Rendezvous at master_addr:master_port (rank 0 serves the TCPStore) and build the backend.
// `timeout_ms` bounds the rendezvous and every later collective. `device_index` is the CUDA
// device for NCCL (ignored by Gloo). On success `*out` owns the group.
int c10d_group_new(const char* master_addr, uint16_t master_port, int rank, int world_size,
                   int backend, int64_t timeout_ms, int device_index, C10dGroup** out);

// Frees the group (null is a no-op).
void c10d_group_free(C10dGroup* group);

// One collective per tensor: sum (or mean) across ranks, in place.
int c10d_all_reduce(C10dGroup* group, const c10d_tensor* tensors, size_t n, int op);

// One collective per tensor: overwrite with rank `root`'s values, in place.
int c10d_broadcast(C10dGroup* group, const c10d_tensor* tensors, size_t n, int root);

// Blocks until every rank has called it.
int c10d_barrier(C10dGroup* group);

// Gathers `input` from every rank into `output`, preallocated with world_size * numel(input)
// elements of the same dtype and device: rank r's values land at [r * numel, (r + 1) * numel).
int c10d_all_gather(C10dGroup* group, c10d_tensor input, c10d_tensor output);

// Flat all-gather (c10d's `_allgather_base`, torch's `all_gather_into_tensor`): `output` has
// world_size * numel(input) elements of the same dtype and device; rank r's input lands at
// [r * numel, (r + 1) * numel). One collective, no per-rank views.
int c10d_all_gather_flat(C10dGroup* group, c10d_tensor input, c10d_tensor output);

// Flat reduce-scatter (c10d's `_reduce_scatter_base`, torch's `reduce_scatter_tensor`): `input`
// has world_size * numel(output) elements; rank r receives the sum (or mean) over ranks of
// input[r * numel, (r + 1) * numel).
int c10d_reduce_scatter(C10dGroup* group, c10d_tensor input, c10d_tensor output, int op);

// One AdamW step by torch's fused kernel (`torch._fused_adamw_`: `torch.optim.AdamW(fused=True)`,
// transformers' default `adamw_torch_fused`), in place on `n` parameters and their moments, all
// contiguous, of one dtype, on one device (checked: torch's kernel takes one group of each), each
// list entry the same size; `grads` are read only.
// `step` is the update's count (1 for the first), for the bias corrections. tch does not bind the
// op, so it comes through this shim; failures read from `c10d_last_error()` like the collectives'.
int c10d_fused_adamw(const c10d_tensor* params, const c10d_tensor* grads, const c10d_tensor* exp_avgs,
                     const c10d_tensor* exp_avg_sqs, size_t n, double step, double lr, double beta1, double beta2,
                     double weight_decay, double eps);

// The L2 norm of each of `n` tensors (`torch._foreach_norm`, one multi-tensor kernel on CUDA where a
// norm each is a launch each), stacked into a new `[n]` tensor of their dtype `*out` on their device, which
// the caller owns (tch's `Tensor::from_ptr`). The tensors need one dtype and one device.
int c10d_foreach_norms(const c10d_tensor* tensors, size_t n, c10d_tensor* out);

// Multiplies each of `n` tensors in place by the one-element tensor `scale` on their device
// (`torch._foreach_mul_`, as `clip_grad_norm_` scales the gradients), without reading it on the host.
int c10d_foreach_mul(const c10d_tensor* tensors, size_t n, c10d_tensor scale);

// Copies each of `n` tensors `src[i]` into `dst[i]` in place, converting the dtype
// (`torch._foreach_copy_`: multi-tensor kernels on CUDA, where a cast each is a launch each). Each
// list has one dtype and device, and entry i of both one size.
int c10d_foreach_copy(const c10d_tensor* dst, const c10d_tensor* src, size_t n);

// The input gradient of an RMS norm without weight (`torch._fused_rms_norm_backward`, one kernel on
// CUDA, which reads `input` and `grad` in their dtype and works in f32): `rstd` as the forward
// (`torch._fused_rms_norm`) returned it, the norm over the last dimension. CUDA only.
int c10d_rms_norm_backward(c10d_tensor grad, c10d_tensor input, c10d_tensor rstd, c10d_tensor* out);

// The gradients of `n_in` leaf tensors `inputs` (requiring gradients) given the gradients
// `grad_outputs` of the `n_out` tensors `outputs` computed from them (`torch.autograd.grad` with
// `grad_outputs`, the graph freed after): new tensors in `grads[0..n_in]`, which the caller owns.
// tch binds only the form without `grad_outputs`, which needs a scalar output.
int c10d_autograd_grad(const c10d_tensor* outputs, const c10d_tensor* grad_outputs, size_t n_out,
                       const c10d_tensor* inputs, size_t n_in, c10d_tensor* grads);

// Causal attention over variable-length sequences packed end to end, by torch's fused CUDA kernels
// (flash attention in half precision, memory-efficient attention in f32), with no padding: q is
// [Tq, H, D], k and v [Tk, Hkv, D] (Hkv dividing H in half precision, equal to H in f32); sequence
// i's queries are q[cu_q[i]..cu_q[i+1]] and its keys k[cu_k[i]..cu_k[i+1]] (int32 [n+1] on the
// device), each query seeing its sequence's keys up to its own position counted from the last
// (the mask aligned bottom right, so keys before the first query are a visible prefix). max_q and
// max_k are the longest of each. `*out` ([Tq, H, D], the caller's) carries torch's autograd graph
// when the inputs require gradients. With `saved` (3 tensors) and `saved_max` (2 integers), the
// call also hands over what c10d_varlen_attention_backward reads besides the operands and the
// output (the log-sum-exp and the kernel's random state, as torch's autograd saves them); both
// null for inference. CUDA only: torch has no CPU kernel for it.
int c10d_varlen_attention(c10d_tensor q, c10d_tensor k, c10d_tensor v, c10d_tensor cu_q, c10d_tensor cu_k,
                          int64_t max_q, int64_t max_k, c10d_tensor* out, c10d_tensor* saved, int64_t* saved_max);

// The gradients of c10d_varlen_attention's q, k and v (new tensors in `grads[0..3]`, shaped as
// they are) from `dy`, the gradient at its output `y`, given the same operands, sequences and
// the `saved` tensors and `saved_max` integers the call handed over: the kernel's own backward,
// as torch's autograd calls it, without the autograd engine (whose worker thread each call
// would hand over to and wait on).
int c10d_varlen_attention_backward(c10d_tensor dy, c10d_tensor q, c10d_tensor k, c10d_tensor v, c10d_tensor y,
                                   const c10d_tensor* saved, const int64_t* saved_max, c10d_tensor cu_q,
                                   c10d_tensor cu_k, int64_t max_q, int64_t max_k, c10d_tensor* grads);

// The name of CUDA device `device` as torch numbers it (`torch.cuda.get_device_name`), written
// NUL-terminated into `out` (`capacity` bytes). C10D_ERR_STD without CUDA or that device.
int c10d_cuda_device_name(int device, char* out, size_t capacity);

// The most bytes the CUDA caching allocator has handed out on `device` since the last reset (what
// `torch.cuda.max_memory_allocated` reports) into `*peak`, and the most it held from the driver
// (`max_memory_reserved`) into `*reserved`; `reset` != 0 first starts a new mark.
// C10D_ERR_STD in a build without CUDA (the nccl feature off).
int c10d_cuda_peak_allocated(int device, int reset, int64_t* peak, int64_t* reserved);

// Applies `settings` (`PYTORCH_ALLOC_CONF`'s syntax, e.g. "expandable_segments:True") to the CUDA
// caching allocator, as `torch.cuda.memory._set_allocator_settings` does: segments it maps from
// then on follow them. C10D_ERR_STD for settings torch refuses, or in a build without CUDA.
int c10d_cuda_allocator_settings(const char* settings);

// Whether torch's scaled_dot_product_attention may pick cuDNN's kernel
// (`torch.backends.cuda.enable_cudnn_sdp`). Process-wide.
int c10d_sdp_use_cudnn(int enable);
int c10d_set_tf32(int enable);
int c10d_tf32(int* cublas, int* cudnn);

// Whether torch multiplies bf16 (fp16 when `fp16` != 0) matrices on this CPU with oneDNN, whose
// instruction set (capped by ONEDNN_MAX_CPU_ISA) has units for them, rather than in its scalar
// reference gemm: `torch.ops.mkldnn._is_mkldnn_bf16_supported()` (`_fp16_`), into `*out`.
int c10d_cpu_half_gemm_native(int fp16, int* out);

// torch's profiler (Kineto, what `torch.profiler.profile` runs) for this thread's operators, and
// the CUDA kernels of every thread when `with_cuda` != 0; stop writes the Chrome trace to `path`.
int c10d_profiler_start(int with_cuda);
int c10d_profiler_stop(const char* path);

// A copy of `src` (any device) in page-locked host memory, for DMA copies to and from a GPU, into
// `*out` (the caller's). Fails, with nothing allocated, where torch has no accelerator to pin for.
int c10d_pinned_copy(c10d_tensor src, c10d_tensor* out);

// The calling thread's torch state (grad mode, dispatch keys, the profiler's callbacks: what
// `at::ThreadLocalState` holds) captured into `*state`, then entered on another thread until
// `c10d_thread_state_exit` (what torch does for its own worker threads, so that their operators
// run, and are profiled, as the caller's would). Each handle is freed by the function that ends it.
typedef struct c10d_thread_state_t* c10d_thread_state;
typedef struct c10d_thread_guard_t* c10d_thread_guard;
int c10d_thread_state_capture(c10d_thread_state* state);
int c10d_thread_state_enter(c10d_thread_state state, c10d_thread_guard* guard);
void c10d_thread_state_exit(c10d_thread_guard guard);
void c10d_thread_state_free(c10d_thread_state state);

#ifdef __cplusplus
}
#endif
