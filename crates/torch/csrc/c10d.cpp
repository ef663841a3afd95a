// c10d shim: the only C++ in dpo-train, behind the C ABI of c10d.h. This file: PyTorch's
// distributed process groups (TCPStore rendezvous + ProcessGroupGloo, and ProcessGroupNCCL when
// compiled with USE_C10D_NCCL). ops.cpp has the torch operations training needs that tch does not
// bind (fused AdamW, multi-tensor norms and scaling, variable-length attention), runtime.cpp the
// device, allocator, profiler and thread settings; shim.h how all three report failures.

#include "c10d.h"
#include "shim.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <unistd.h>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef USE_C10D_NCCL
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

using shim::check_tensor;
using shim::fail;
using shim::guarded;

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

const char* c10d_last_error(void) { return shim::last_error.c_str(); }

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
