//! The C ABI of the shim in `csrc/` (declared in `csrc/c10d.h`): c10d's process groups, and the
//! torch operations tch does not bind (fused AdamW, multi-tensor norms, variable-length attention, the
//! cuDNN switch, the CUDA allocator's peak, the profiler, a thread's torch state).

use std::ffi::{c_char, c_void};

use torch_sys::C_tensor;

/// `C10dGroup`, opaque.
#[repr(C)]
pub struct C10dGroup {
    _private: [u8; 0],
}

pub const BACKEND_GLOO: i32 = 0;
pub const BACKEND_NCCL: i32 = 1;
pub const OP_SUM: i32 = 0;
pub const OP_AVG: i32 = 1;

unsafe extern "C" {
    pub fn c10d_last_error() -> *const c_char;
    pub fn c10d_has_nccl() -> i32;
    pub fn c10d_group_new(
        master_addr: *const c_char,
        master_port: u16,
        rank: i32,
        world_size: i32,
        backend: i32,
        timeout_ms: i64,
        device_index: i32,
        out: *mut *mut C10dGroup,
    ) -> i32;
    pub fn c10d_group_free(group: *mut C10dGroup);
    pub fn c10d_all_reduce(group: *mut C10dGroup, tensors: *const *mut C_tensor, n: usize, op: i32) -> i32;
    pub fn c10d_broadcast(group: *mut C10dGroup, tensors: *const *mut C_tensor, n: usize, root: i32) -> i32;
    pub fn c10d_barrier(group: *mut C10dGroup) -> i32;
    pub fn c10d_all_gather(group: *mut C10dGroup, input: *mut C_tensor, output: *mut C_tensor) -> i32;
    pub fn c10d_all_gather_flat(group: *mut C10dGroup, input: *mut C_tensor, output: *mut C_tensor) -> i32;
    pub fn c10d_reduce_scatter(group: *mut C10dGroup, input: *mut C_tensor, output: *mut C_tensor, op: i32) -> i32;
    pub fn c10d_fused_adamw(
        params: *const *mut C_tensor,
        grads: *const *mut C_tensor,
        exp_avgs: *const *mut C_tensor,
        exp_avg_sqs: *const *mut C_tensor,
        n: usize,
        step: f64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> i32;
    pub fn c10d_foreach_norms(tensors: *const *mut C_tensor, n: usize, out: *mut *mut C_tensor) -> i32;
    pub fn c10d_foreach_mul(tensors: *const *mut C_tensor, n: usize, scale: *mut C_tensor) -> i32;
    pub fn c10d_foreach_copy(dst: *const *mut C_tensor, src: *const *mut C_tensor, n: usize) -> i32;
    pub fn c10d_rms_norm_backward(
        grad: *mut C_tensor,
        input: *mut C_tensor,
        rstd: *mut C_tensor,
        out: *mut *mut C_tensor,
    ) -> i32;
    pub fn c10d_autograd_grad(
        outputs: *const *mut C_tensor,
        grad_outputs: *const *mut C_tensor,
        n_out: usize,
        inputs: *const *mut C_tensor,
        n_in: usize,
        grads: *mut *mut C_tensor,
    ) -> i32;
    pub fn c10d_varlen_attention(
        q: *mut C_tensor,
        k: *mut C_tensor,
        v: *mut C_tensor,
        cu_q: *mut C_tensor,
        cu_k: *mut C_tensor,
        max_q: i64,
        max_k: i64,
        out: *mut *mut C_tensor,
        saved: *mut *mut C_tensor,
        saved_max: *mut i64,
    ) -> i32;
    pub fn c10d_varlen_attention_backward(
        dy: *mut C_tensor,
        q: *mut C_tensor,
        k: *mut C_tensor,
        v: *mut C_tensor,
        y: *mut C_tensor,
        saved: *const *mut C_tensor,
        saved_max: *const i64,
        cu_q: *mut C_tensor,
        cu_k: *mut C_tensor,
        max_q: i64,
        max_k: i64,
        grads: *mut *mut C_tensor,
    ) -> i32;
    pub fn c10d_cuda_peak_allocated(device: i32, reset: i32, peak: *mut i64, reserved: *mut i64) -> i32;
    pub fn c10d_cuda_allocator_settings(settings: *const std::ffi::c_char) -> i32;
    pub fn c10d_cuda_device_name(device: i32, out: *mut std::ffi::c_char, capacity: usize) -> i32;
    pub fn c10d_sdp_use_cudnn(enable: i32) -> i32;
    pub fn c10d_set_tf32(enable: i32) -> i32;
    pub fn c10d_tf32(cublas: *mut i32, cudnn: *mut i32) -> i32;
    pub fn c10d_cpu_half_gemm_native(fp16: i32, out: *mut i32) -> i32;
    pub fn c10d_profiler_start(with_cuda: i32) -> i32;
    pub fn c10d_profiler_stop(path: *const std::ffi::c_char) -> i32;
    pub fn c10d_pinned_copy(src: *mut C_tensor, out: *mut *mut C_tensor) -> i32;
    pub fn c10d_thread_state_capture(state: *mut *mut c_void) -> i32;
    pub fn c10d_thread_state_enter(state: *mut c_void, guard: *mut *mut c_void) -> i32;
    pub fn c10d_thread_state_exit(guard: *mut c_void);
    pub fn c10d_thread_state_free(state: *mut c_void);
}
