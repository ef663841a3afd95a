// c10d shim: the only C++ in dpo-train. It exposes PyTorch's distributed process groups (TCPStore
// rendezvous + ProcessGroupGloo, and ProcessGroupNCCL when compiled with USE_C10D_NCCL) through the
// C ABI declared in c10d.h, and the torch operations training needs that tch does not bind (fused
// AdamW, multi-tensor norms and scaling, variable-length attention). Every exception is caught here and turned into a status code plus a
// thread-local message, so nothing unwinds into Rust.

#include "c10d.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <cstring>
#include <exception>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <torch/torch.h>
#include <torch/version.h>
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

struct C10dGroup {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  int rank = 0;
  int world_size = 1;
  int kind = C10D_BACKEND_GLOO;
  int device_index = 0;
};

namespace {

thread_local std::string last_error;

int fail(int code, std::string message) {
  last_error = std::move(message);
  return code;
}

// Runs `body`, mapping every exception to a status code and a message.
template <typename F>
int guarded(const char* what, F&& body) {
  try {
    body();
    return C10D_OK;
  } catch (const c10::Error& e) {
    return fail(C10D_ERR_TORCH, std::string(what) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(C10D_ERR_STD, std::string(what) + ": " + e.what());
  } catch (...) {
    return fail(C10D_ERR_UNKNOWN, std::string(what) + ": unknown C++ exception");
  }
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The Gloo transport device: loopback when the master is local (single-node runs), the interface
// named by GLOO_SOCKET_IFNAME when set (as torch.distributed does), else this host's address.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (is_loopback(master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Every rank sets its key and waits for all the others'; on a timeout the error names the ranks
// whose keys are missing (c10d's own wait says only how many workers joined).
void check_in(c10d::Store& store, const std::string& addr, uint16_t port, int rank, int world_size,
              std::chrono::milliseconds timeout) {
  const std::string prefix = "dpo_train/joined/";
  store.set(prefix + std::to_string(rank), std::vector<uint8_t>{'1'});
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const c10::Error& e) {
    std::string missing;
    try {
      for (int r = 0; r < world_size; ++r) {
        if (!store.check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    } catch (const c10::Error&) {
      // Rank 0 serves the store and gave up first: only it could say who was missing.
      TORCH_CHECK(false, "the rendezvous store at ", addr, ":", port, " (rank 0) went away while rank ", rank,
                  " waited for the others: ", e.what_without_backtrace());
    }
    // Everyone arrived just as the wait gave up: the original error says what happened.
    if (missing.empty()) throw;
    TORCH_CHECK(false, "rank(s) ", missing, " of ", world_size, " never joined the rendezvous at ", addr, ":", port,
                " within ", timeout.count() / 1000.0, " s");
  }
}

// Checks a tensor pointer before a collective touches it.
void check_tensor(const at::Tensor* t, const char* name) {
  TORCH_CHECK(t != nullptr, name, " is a null tensor pointer");
  TORCH_CHECK(t->defined(), name, " is an undefined tensor");
  TORCH_CHECK(t->is_contiguous(), name, " must be contiguous for an in-place collective");
}

// Checks a flat collective's pair: same dtype and device, and `big` has world_size times the
// elements of `small`.
void check_flat(const C10dGroup* group, const at::Tensor* small, const at::Tensor* big, const char* op) {
  check_tensor(small, op);
  check_tensor(big, op);
  TORCH_CHECK(big->numel() == small->numel() * group->world_size, op, ": the larger buffer has ", big->numel(),
              " elements, expected world size ", group->world_size, " x ", small->numel());
  TORCH_CHECK(big->scalar_type() == small->scalar_type(), op, ": the buffers' dtypes differ (",
              big->scalar_type(), ", ", small->scalar_type(), ")");
  TORCH_CHECK(big->device() == small->device(), op, ": the buffers are on ", big->device(), " and ",
              small->device());
}

// The tensor a collective runs on: `t` itself, except that a Gloo group is handed a device
// tensor's host copy (with its values when `with_values`; `land` writes it back). Two ranks
// sharing one GPU run over Gloo, since NCCL refuses them, and Gloo's own device support covers
// only some collectives; this covers every one, at the price of the copies (a check, not a fast
// path).
at::Tensor host_side(const C10dGroup* group, const at::Tensor& t, bool with_values) {
  if (group->kind != C10D_BACKEND_GLOO || t.is_cpu()) return t;
  return with_values ? t.to(at::kCPU) : at::empty(t.sizes(), t.options().device(at::kCPU));
}

// Writes a collective's result back where the caller holds it (nothing to do unless staged).
void land(at::Tensor& dst, const at::Tensor& ran_on) {
  if (!ran_on.is_same(dst)) dst.copy_(ran_on);
}

}  // namespace

extern "C" {

const char* c10d_last_error(void) { return last_error.c_str(); }

int c10d_has_nccl(void) {
#ifdef USE_C10D_NCCL
  return 1;
#else
  return 0;
#endif
}

int c10d_group_new(const char* master_addr, uint16_t master_port, int rank, int world_size,
                   int backend, int64_t timeout_ms, int device_index, C10dGroup** out) {
  if (out == nullptr || master_addr == nullptr) {
    return fail(C10D_ERR_INVALID, "c10d_group_new: null argument");
  }
  *out = nullptr;
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return fail(C10D_ERR_INVALID, "c10d_group_new: rank " + std::to_string(rank) +
                                      " is not in [0, world size " + std::to_string(world_size) + ")");
  }
  if (timeout_ms <= 0) {
    return fail(C10D_ERR_INVALID, "c10d_group_new: the timeout must be positive");
  }
#ifndef USE_C10D_NCCL
  if (backend == C10D_BACKEND_NCCL) {
    return fail(C10D_ERR_UNSUPPORTED,
                "c10d_group_new: the NCCL backend was not compiled in (see `dpo-train env`)");
  }
#endif
  if (backend != C10D_BACKEND_GLOO && backend != C10D_BACKEND_NCCL) {
    return fail(C10D_ERR_INVALID, "c10d_group_new: unknown backend " + std::to_string(backend));
  }
  std::string addr(master_addr);
  auto timeout = std::chrono::milliseconds(timeout_ms);
  auto group = std::make_unique<C10dGroup>();
  int rc = guarded("rendezvous", [&] {
    c10d::TCPStoreOptions opts;
    opts.port = master_port;
    opts.isServer = rank == 0;
    opts.numWorkers = static_cast<std::size_t>(world_size);
    // Ranks check in by key below instead, so that a rank that never comes can be named.
    opts.waitWorkers = false;
    opts.timeout = timeout;
    group->store = c10::make_intrusive<c10d::TCPStore>(addr, opts);
  });
  if (rc != C10D_OK) return rc;
  rc = guarded("rendezvous", [&] { check_in(*group->store, addr, master_port, rank, world_size, timeout); });
  if (rc != C10D_OK) return rc;
  group->rank = rank;
  group->world_size = world_size;
  group->kind = backend;
  group->device_index = device_index;
  // Gloo announces its connections on stdout ("[Gloo] Rank 0 is connected to ..."); stdout
  // carries the program's results, so the construction writes to stderr instead.
  std::cout.flush();
  std::fflush(stdout);
  int saved_stdout = dup(STDOUT_FILENO);
  if (saved_stdout >= 0) dup2(STDERR_FILENO, STDOUT_FILENO);
  rc = guarded("process group", [&] {
    if (backend == C10D_BACKEND_GLOO) {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(gloo_device(addr));
      group->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(group->store, rank, world_size, opts);
    }
#ifdef USE_C10D_NCCL
    if (backend == C10D_BACKEND_NCCL) {
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(group->store, rank, world_size, opts);
      // Build the communicator now, so a missing peer fails here rather than at the first step.
      pg->eagerConnectSingleDevice(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)));
      group->backend = pg;
    }
#endif
  });
  std::cout.flush();
  std::fflush(stdout);
  if (saved_stdout >= 0) {
    dup2(saved_stdout, STDOUT_FILENO);
    close(saved_stdout);
  }
  if (rc != C10D_OK) return rc;
  *out = group.release();
  return C10D_OK;
}

void c10d_group_free(C10dGroup* group) {
  if (group == nullptr) return;
  // Destructors must not throw into Rust; a failed shutdown only loses the clean NCCL teardown.
  try {
    if (group->backend) group->backend->shutdown();
  } catch (...) {
  }
  try {
    delete group;
  } catch (...) {
  }
}

int c10d_all_reduce(C10dGroup* group, const c10d_tensor* tensors, size_t n, int op) {
  if (group == nullptr || (tensors == nullptr && n > 0)) {
    return fail(C10D_ERR_INVALID, "c10d_all_reduce: null argument");
  }
  if (op != C10D_OP_SUM && op != C10D_OP_AVG) {
    return fail(C10D_ERR_INVALID, "c10d_all_reduce: unknown op " + std::to_string(op));
  }
  return guarded("all_reduce", [&] {
    for (size_t i = 0; i < n; ++i) {
      check_tensor(tensors[i], "all_reduce input");
      // Gloo has no AVG, so both backends sum and then divide: the same numerics everywhere.
      std::vector<at::Tensor> one = {host_side(group, *tensors[i], true)};
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;
      group->backend->allreduce(one, opts)->wait();
      land(*tensors[i], one[0]);
      if (op == C10D_OP_AVG) tensors[i]->div_(group->world_size);
    }
  });
}

int c10d_broadcast(C10dGroup* group, const c10d_tensor* tensors, size_t n, int root) {
  if (group == nullptr || (tensors == nullptr && n > 0)) {
    return fail(C10D_ERR_INVALID, "c10d_broadcast: null argument");
  }
  if (root < 0 || root >= group->world_size) {
    return fail(C10D_ERR_INVALID, "c10d_broadcast: root " + std::to_string(root) +
                                      " is not in [0, world size " + std::to_string(group->world_size) + ")");
  }
  return guarded("broadcast", [&] {
    for (size_t i = 0; i < n; ++i) {
      check_tensor(tensors[i], "broadcast tensor");
      std::vector<at::Tensor> one = {host_side(group, *tensors[i], group->rank == root)};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      group->backend->broadcast(one, opts)->wait();
      land(*tensors[i], one[0]);
    }
  });
}

int c10d_barrier(C10dGroup* group) {
  if (group == nullptr) return fail(C10D_ERR_INVALID, "c10d_barrier: null group");
  return guarded("barrier", [&] {
    c10d::BarrierOptions opts;
    if (group->kind == C10D_BACKEND_NCCL) opts.device_ids = {group->device_index};
    group->backend->barrier(opts)->wait();
  });
}

int c10d_all_gather(C10dGroup* group, c10d_tensor input, c10d_tensor output) {
  if (group == nullptr) return fail(C10D_ERR_INVALID, "c10d_all_gather: null group");
  return guarded("all_gather", [&] {
    check_tensor(input, "all_gather input");
    check_tensor(output, "all_gather output");
    const int64_t n = input->numel();
    TORCH_CHECK(output->numel() == n * group->world_size, "all_gather output has ", output->numel(),
                " elements, expected world size ", group->world_size, " x ", n);
    TORCH_CHECK(output->scalar_type() == input->scalar_type(), "all_gather output dtype ",
                output->scalar_type(), " differs from the input's ", input->scalar_type());
    TORCH_CHECK(output->device() == input->device(), "all_gather output is on ", output->device(),
                ", the input on ", input->device());
    at::Tensor flat_in = host_side(group, *input, true).reshape({n});
    at::Tensor out = host_side(group, *output, false);
    at::Tensor flat_out = out.reshape({n * group->world_size});
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < group->world_size; ++r) outs[0].push_back(flat_out.narrow(0, r * n, n));
    std::vector<at::Tensor> ins = {flat_in};
    group->backend->allgather(outs, ins)->wait();
    land(*output, out);
  });
}

int c10d_all_gather_flat(C10dGroup* group, c10d_tensor input, c10d_tensor output) {
  if (group == nullptr) return fail(C10D_ERR_INVALID, "c10d_all_gather_flat: null group");
  return guarded("all_gather", [&] {
    check_flat(group, input, output, "all_gather");
    at::Tensor out = host_side(group, *output, false);
    at::Tensor in = host_side(group, *input, true);
    group->backend->_allgather_base(out, in)->wait();
    land(*output, out);
  });
}

int c10d_reduce_scatter(C10dGroup* group, c10d_tensor input, c10d_tensor output, int op) {
  if (group == nullptr) return fail(C10D_ERR_INVALID, "c10d_reduce_scatter: null group");
  if (op != C10D_OP_SUM && op != C10D_OP_AVG) {
    return fail(C10D_ERR_INVALID, "c10d_reduce_scatter: unknown op " + std::to_string(op));
  }
  return guarded("reduce_scatter", [&] {
    check_flat(group, output, input, "reduce_scatter");
    at::Tensor out = host_side(group, *output, false);
    at::Tensor in = host_side(group, *input, true);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    group->backend->_reduce_scatter_base(out, in, opts)->wait();
    land(*output, out);
    // As all_reduce: sum, then divide, the same numerics on both backends.
    if (op == C10D_OP_AVG) output->div_(group->world_size);
  });
}

}  // extern "C"

namespace {

// The `n` tensors as a list for a multi-tensor operation, checked: defined, one dtype, one device.
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

extern "C" int c10d_cuda_device_name(int device, char* out, size_t capacity) {
#ifdef USE_C10D_NCCL
  return guarded("cuda_device_name", [&] {
    TORCH_CHECK(out != nullptr && capacity > 0, "null output");
    auto count = static_cast<int>(c10::cuda::device_count());
    TORCH_CHECK(device >= 0 && device < count, "no CUDA device ", device, " (torch sees ", count, ")");
    // libtorch_cuda's accessor: this shim links no CUDA runtime of its own.
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    std::snprintf(out, capacity, "%s", prop->name);
  });
#else
  (void)device;
  (void)out;
  (void)capacity;
  return fail(C10D_ERR_STD, "cuda_device_name: this build has no CUDA (the nccl feature is off)");
#endif
}

extern "C" int c10d_cuda_peak_allocated(int device, int reset, int64_t* peak, int64_t* reserved) {
#ifdef USE_C10D_NCCL
  return guarded("cuda_peak_allocated", [&] {
    TORCH_CHECK(peak != nullptr && reserved != nullptr, "null output");
    auto index = static_cast<c10::DeviceIndex>(device);
    if (reset != 0) {
      c10::cuda::CUDACachingAllocator::resetPeakStats(index);
    }
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *peak = stats.allocated_bytes[aggregate].peak;
    *reserved = stats.reserved_bytes[aggregate].peak;
  });
#else
  (void)device;
  (void)reset;
  (void)peak;
  (void)reserved;
  return fail(C10D_ERR_STD, "cuda_peak_allocated: this build has no CUDA (the nccl feature is off)");
#endif
}

extern "C" int c10d_cuda_allocator_settings(const char* settings) {
#ifdef USE_C10D_NCCL
  return guarded("cuda_allocator_settings", [&] {
    TORCH_CHECK(settings != nullptr, "null settings");
    // torch 2.9 parses them into the CUDA allocator's config; 2.10 on, this names the
    // device-generic parser, which CUDA's reads.
    c10::cuda::CUDACachingAllocator::setAllocatorSettings(settings);
  });
#else
  (void)settings;
  return fail(C10D_ERR_STD, "cuda_allocator_settings: this build has no CUDA (the nccl feature is off)");
#endif
}

extern "C" int c10d_profiler_start(int with_cuda) {
  return guarded("profiler_start", [&] {
    using torch::profiler::impl::ActivityType;
    torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                 /*report_input_shapes=*/true);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (with_cuda != 0) {
      activities.insert(ActivityType::CUDA);
    }
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  });
}

extern "C" int c10d_profiler_stop(const char* path) {
  return guarded("profiler_stop", [&] {
    TORCH_CHECK(path != nullptr, "null path");
    auto result = torch::autograd::profiler::disableProfiler();
    TORCH_CHECK(result != nullptr, "the profiler was not running");
    result->save(path);
  });
}

extern "C" int c10d_sdp_use_cudnn(int enable) {
  return guarded("sdp_use_cudnn", [&] { at::globalContext().setSDPUseCuDNN(enable != 0); });
}

// TF32 for f32 matrix products (cuBLAS) and convolutions and recurrent layers (cuDNN), as
// transformers' `tf32`, by torch's precision settings (the `allow_tf32` flags warn from 2.9 on);
// torch 2.10 turned their string arguments into enums.
static void set_cuda_precision(const std::string& op, const std::string& precision) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
  at::globalContext().setFloat32Precision(at::str2backend("cuda"), at::str2op(op), at::str2precision(precision));
#else
  at::globalContext().setFloat32Precision("cuda", op, precision);
#endif
}

static bool cuda_precision_is_tf32(const std::string& op) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
  auto p = at::globalContext().float32Precision(at::str2backend("cuda"), at::str2op(op));
  return at::precision2str(p) == "tf32";
#else
  return at::globalContext().float32Precision("cuda", op) == "tf32";
#endif
}

extern "C" int c10d_set_tf32(int enable) {
  return guarded("set_tf32", [&] {
    for (const char* op : {"matmul", "conv", "rnn"}) {
      set_cuda_precision(op, enable != 0 ? "tf32" : "ieee");
    }
  });
}

extern "C" int c10d_cpu_half_gemm_native(int fp16, int* out) {
  return guarded("cpu_half_gemm_native", [&] {
    TORCH_CHECK(out != nullptr, "cpu_half_gemm_native: null output");
    const char* name = fp16 != 0 ? "mkldnn::_is_mkldnn_fp16_supported" : "mkldnn::_is_mkldnn_bf16_supported";
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<bool()>();
    *out = op.call() ? 1 : 0;
  });
}

extern "C" int c10d_tf32(int* cublas, int* cudnn) {
  return guarded("tf32", [&] {
    TORCH_CHECK(cublas != nullptr && cudnn != nullptr, "tf32: null output");
    *cublas = cuda_precision_is_tf32("matmul") ? 1 : 0;
    *cudnn = cuda_precision_is_tf32("conv") ? 1 : 0;
  });
}

extern "C" int c10d_pinned_copy(c10d_tensor src, c10d_tensor* out) {
  return guarded("pinned_copy", [&] {
    TORCH_CHECK(src != nullptr && src->defined(), "pinned_copy: a null or undefined tensor");
    TORCH_CHECK(out != nullptr, "pinned_copy: null output");
    // `pinned_memory(true)` without a device: torch picks the current accelerator's host
    // allocator (Tensor.pin_memory(device) is deprecated since 2.5 and refuses a CPU device).
    auto host = at::empty(src->sizes(), src->options().device(at::kCPU).pinned_memory(true));
    host.copy_(*src);
    *out = new at::Tensor(std::move(host));
  });
}

extern "C" int c10d_thread_state_capture(c10d_thread_state* state) {
  return guarded("thread_state_capture", [&] {
    TORCH_CHECK(state != nullptr, "thread_state_capture: null output");
    *state = reinterpret_cast<c10d_thread_state>(new at::ThreadLocalState());
  });
}

extern "C" int c10d_thread_state_enter(c10d_thread_state state, c10d_thread_guard* guard) {
  return guarded("thread_state_enter", [&] {
    TORCH_CHECK(state != nullptr && guard != nullptr, "thread_state_enter: a null handle");
    auto* captured = reinterpret_cast<at::ThreadLocalState*>(state);
    *guard = reinterpret_cast<c10d_thread_guard>(new at::ThreadLocalStateGuard(*captured));
  });
}

extern "C" void c10d_thread_state_exit(c10d_thread_guard guard) {
  delete reinterpret_cast<at::ThreadLocalStateGuard*>(guard);
}

extern "C" void c10d_thread_state_free(c10d_thread_state state) {
  delete reinterpret_cast<at::ThreadLocalState*>(state);
}
