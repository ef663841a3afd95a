// The process's torch settings and state behind c10d.h's C ABI: CUDA device names, the caching
// allocator's peaks and settings, the profiler, attention and TF32 switches, page-locked copies,
// and torch's thread-local state carried onto another thread.

#include "c10d.h"
#include "shim.h"

#include <cstdio>
#include <set>
#include <string>

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/version.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

using shim::fail;
using shim::guarded;


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
