//! torch's profiler around a few training steps, through the shim (tch binds none of it): the
//! Chrome trace `torch.profiler.profile(...).export_chrome_trace` writes, with every operator's
//! host time and, on CUDA, every kernel. Opened in Perfetto or chrome://tracing, it answers
//! where a step's time goes, on the host or on the device.
//!
//! `DPO_TRAIN_PROFILE=<trace.json>` turns it on (rank 0); `DPO_TRAIN_PROFILE_STEPS=<first>-<last>`
//! chooses the optimizer steps, 1-based (default 11-15: after the warm-up of allocators, kernels
//! and caches).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use crate::transfers::Transfers;
use crate::{TorchError, check, ffi};

/// Which steps to profile and where the trace goes.
#[derive(Debug)]
pub struct ProfileWindow {
    path: PathBuf,
    first: u64,
    last: u64,
    cuda: bool,
    /// Where the shim writes the trace before it is renamed to `path`.
    tmp: CString,
    running: bool,
    /// The host-device copies counted when the window opened, and the steps it has seen.
    transfers: Transfers,
    steps: u64,
}

/// A window's trace, written, and the host-device copies of its steps ([`crate::transfers`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Profiled {
    pub path: PathBuf,
    pub steps: u64,
    pub transfers: Transfers,
}

impl Profiled {
    /// The copies a step, e.g. `2 uploads and 3 reads back a step`.
    pub fn per_step(&self) -> String {
        let each = |n: u64| n as f64 / self.steps.max(1) as f64;
        format!("{} uploads and {} reads back a step", each(self.transfers.uploads), each(self.transfers.reads))
    }
}

impl ProfileWindow {
    /// The window the environment asks for, if any; a malformed step range is an error naming
    /// the variable.
    pub fn from_env(cuda: bool) -> Result<Option<Self>, String> {
        let Some(path) = std::env::var_os("DPO_TRAIN_PROFILE").filter(|p| !p.is_empty()) else { return Ok(None) };
        let steps = std::env::var("DPO_TRAIN_PROFILE_STEPS").unwrap_or_else(|_| "11-15".to_owned());
        let (first, last) = parse_steps(&steps)
            .ok_or_else(|| format!("DPO_TRAIN_PROFILE_STEPS=`{steps}`: expected <first>-<last>, e.g. 11-15"))?;
        Self::new(PathBuf::from(path), (first, last), cuda).map(Some)
    }

    /// Steps `first..=last` (1-based) traced into `path`.
    pub fn new(path: PathBuf, (first, last): (u64, u64), cuda: bool) -> Result<Self, String> {
        let tmp = path.with_extension("json.tmp");
        let tmp = CString::new(tmp.as_os_str().as_bytes())
            .map_err(|_| format!("DPO_TRAIN_PROFILE=`{}` holds a NUL byte", path.display()))?;
        Ok(Self { path, first, last, cuda, tmp, running: false, transfers: Transfers::default(), steps: 0 })
    }

    /// Before optimizer step `step` (1-based) runs: starts the profiler at the window's first.
    pub fn before(&mut self, step: u64) -> Result<(), TorchError> {
        if step == self.first && !self.running {
            // The trace's folder is made before the profiler starts: once started, it must be stopped.
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| TorchError::Shim {
                    op: "profiler_start",
                    code: -1,
                    message: format!("cannot create `{}`: {e}", dir.display()),
                })?;
            }
            synchronize(self.cuda);
            // SAFETY: no arguments to keep alive; the shim catches every C++ exception.
            check("profiler_start", unsafe { ffi::c10d_profiler_start(i32::from(self.cuda)) })?;
            self.running = true;
            self.transfers = crate::transfers::counts();
        }
        Ok(())
    }

    /// After step `step` ran (or the loop ended there: `end`): stops at the window's last and
    /// writes the trace. Returns the trace's path and the window's copies when it was written.
    pub fn after(&mut self, step: u64, end: bool) -> Result<Option<Profiled>, TorchError> {
        self.steps += u64::from(self.running);
        if !self.running || (step < self.last && !end) {
            return Ok(None);
        }
        let transfers = crate::transfers::counts().since(self.transfers);
        synchronize(self.cuda); // the step's kernels belong in the trace
        self.running = false;
        // Written beside the trace, then renamed: a trace is whole or absent.
        // SAFETY: `tmp` is a NUL-terminated string alive for the call; the shim catches every C++
        // exception.
        check("profiler_stop", unsafe { ffi::c10d_profiler_stop(self.tmp.as_ptr()) })?;
        let tmp = PathBuf::from(OsString::from_vec(self.tmp.as_bytes().to_vec()));
        std::fs::rename(&tmp, &self.path).map_err(|e| TorchError::Shim {
            op: "profiler_stop",
            code: -1,
            message: format!("cannot write `{}`: {e}", self.path.display()),
        })?;
        Ok(Some(Profiled { path: self.path.clone(), steps: self.steps, transfers }))
    }
}

impl Drop for ProfileWindow {
    /// A window cut short (Ctrl-C, an error) still stops the profiler and keeps what it traced:
    /// one left running crashed the process at exit (a segmentation fault after the last line).
    fn drop(&mut self) {
        if self.running {
            let _ = self.after(self.last, true);
        }
    }
}

/// What a trace holds per profiled window: torch operator calls (every `cpu_op` event, nested
/// ones included, as torch's `key_averages` counts them), the dtype or device conversions of
/// tensors among them (`aten::_to_copy`, what every `.to(dtype)` runs; the 0-dim conversions torch
/// makes of scalar arguments, which stay on the host, are left out: they launch no kernel), and
/// the matrix products (`mm`, `addmm`, `bmm`, `baddbmm`: what `matmul` and `linear` run), each a
/// cuBLAS call on a GPU, whose host time made the largest share of a small model's step there;
/// and the elementwise operators whose tensor operands are not all one dense layout (a
/// broadcast, a strided view, two layouts: [`strided`]), which CUDA runs by its general kernel
/// rather than the vectorised one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceCounts {
    pub operators: u64,
    pub casts: u64,
    pub products: u64,
    pub strided: u64,
    /// The threads that ran operators.
    pub threads: u64,
}

impl TraceCounts {
    /// The counts of the Chrome trace at `path` (as [`ProfileWindow`] writes it).
    pub fn read(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
        let trace: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| format!("`{}` is not a Chrome trace: {e}", path.display()))?;
        let events =
            trace["traceEvents"].as_array().ok_or_else(|| format!("`{}` has no traceEvents", path.display()))?;
        let ops = events.iter().filter(|e| e["cat"] == "cpu_op");
        let mut counts = Self::default();
        let mut threads = std::collections::BTreeSet::new();
        for op in ops {
            threads.insert(op["tid"].to_string());
            counts.operators += 1;
            // A shape is recorded for each input; a 0-dim first input is a scalar's conversion.
            let scalar = op["args"]["Input Dims"][0].as_array().is_some_and(|dims| dims.is_empty());
            counts.casts += u64::from(op["name"] == "aten::_to_copy" && !scalar);
            counts.products += u64::from(PRODUCTS.iter().any(|p| op["name"] == *p));
            counts.strided += u64::from(strided(op));
        }
        counts.threads = threads.len() as u64;
        Ok(counts)
    }
}

/// The operators [`TraceCounts::products`] counts (the ones `matmul` dispatches to, so none twice).
const PRODUCTS: [&str; 5] = ["aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm"];

/// The elementwise operators [`strided`] looks at: torch's `TensorIterator` kernels a layer step
/// makes (arithmetic, activations and their gradients, copies).
const ELEMENTWISE: [&str; 22] = [
    "aten::add",
    "aten::add_",
    "aten::sub",
    "aten::sub_",
    "aten::mul",
    "aten::mul_",
    "aten::div",
    "aten::div_",
    "aten::neg",
    "aten::exp",
    "aten::exp_",
    "aten::log",
    "aten::sigmoid",
    "aten::silu",
    "aten::silu_backward",
    "aten::copy_",
    "aten::where",
    "aten::masked_fill",
    "aten::masked_fill_",
    "aten::clamp",
    "aten::clamp_min",
    "aten::pow",
];

/// Whether `op` (a trace event) is an elementwise operator whose tensor operands differ in shape
/// or strides, or share strides that are not a dense layout: what CUDA's `gpu_kernel` takes by
/// its general path (an offset computed per element, one element a load), not the vectorised one
/// (`iter.is_contiguous()`, after dimensions are reordered and merged). Scalars are left out.
fn strided(op: &serde_json::Value) -> bool {
    if !ELEMENTWISE.iter().any(|n| op["name"] == *n) {
        return false;
    }
    let (dims, strides) = (&op["args"]["Input Dims"], &op["args"]["Input Strides"]);
    let ints = |v: &serde_json::Value| v.as_array().map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect());
    let tensors: Vec<(Vec<i64>, Vec<i64>)> = (0..dims.as_array().map_or(0, Vec::len))
        .filter_map(|i| Some((ints(&dims[i])?, ints(&strides[i])?)))
        .filter(|(d, s): &(Vec<i64>, Vec<i64>)| !d.is_empty() && d.len() == s.len())
        // A dimension of one element has no stride that matters.
        .map(|(d, s)| {
            let s = d.iter().zip(s).map(|(&n, s)| if n == 1 { 0 } else { s }).collect();
            (d, s)
        })
        .collect();
    match tensors.first() {
        None => false,
        Some(first) => tensors.iter().any(|t| t != first) || !dense(&first.0, &first.1),
    }
}

/// Whether `strides` lay a tensor of `sizes` out densely in some order of its dimensions.
fn dense(sizes: &[i64], strides: &[i64]) -> bool {
    let mut by_stride: Vec<(i64, i64)> =
        strides.iter().zip(sizes).filter(|&(_, &n)| n != 1).map(|(&s, &n)| (s, n)).collect();
    by_stride.sort_unstable();
    let mut step = 1;
    by_stride.into_iter().all(|(s, n)| {
        let fits = s == step;
        step *= n;
        fits
    })
}

fn parse_steps(text: &str) -> Option<(u64, u64)> {
    let (a, b) = text.split_once('-')?;
    let (first, last) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (first >= 1 && first <= last).then_some((first, last))
}

fn synchronize(cuda: bool) {
    if cuda {
        for i in 0..tch::Cuda::device_count() {
            tch::Cuda::synchronize(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An elementwise operator over a broadcast, a strided view or two layouts is strided; one
    /// over operands of one dense layout (transposed included) or scalars is not, nor a product.
    #[test]
    fn strided_operands_are_told_from_dense_ones() {
        let op = |name: &str, dims: serde_json::Value, strides: serde_json::Value| serde_json::json!({"name": name, "args": {"Input Dims": dims, "Input Strides": strides}});
        use serde_json::json;
        assert!(strided(&op("aten::mul", json!([[4, 6], [6]]), json!([[6, 1], [1]]))), "a broadcast");
        assert!(strided(&op("aten::silu", json!([[4, 6]]), json!([[12, 1]]))), "every second row");
        assert!(strided(&op("aten::add", json!([[4, 6], [4, 6], []]), json!([[6, 1], [1, 4], []]))), "two layouts");
        assert!(!strided(&op("aten::mul", json!([[4, 6], [4, 6]]), json!([[1, 4], [1, 4]]))), "one layout, transposed");
        assert!(!strided(&op("aten::add_", json!([[1, 4, 6], [1, 4, 6], []]), json!([[99, 6, 1], [24, 6, 1], []]))));
        assert!(!strided(&op("aten::mul", json!([[4, 6], []]), json!([[6, 1], []]))), "a scalar");
        assert!(!strided(&op("aten::mm", json!([[4, 6], [6, 2]]), json!([[1, 4], [2, 1]]))), "a product");
    }

    #[test]
    fn step_ranges_parse_and_bad_ones_do_not() {
        assert_eq!(parse_steps("11-15"), Some((11, 15)));
        assert_eq!(parse_steps("3-3"), Some((3, 3)));
        for bad in ["", "5", "0-2", "4-2", "a-b", "1-"] {
            assert_eq!(parse_steps(bad), None, "{bad}");
        }
    }

    /// Two CPU steps profiled: the trace is Chrome's JSON and holds the operators that ran.
    #[test]
    #[allow(deprecated)] // burn's libtorch device is deprecated upstream; it is this project's backend.
    fn a_window_writes_a_chrome_trace_of_the_operators() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("traces/trace.json"); // the folder is created
        let mut w = ProfileWindow::new(path.clone(), (2, 3), false).unwrap();
        for step in 1..=4 {
            w.before(step).unwrap();
            let a = tch::Tensor::ones([64, 64], (tch::Kind::Float, tch::Device::Cpu));
            let _ = a.matmul(&a).to_kind(tch::Kind::BFloat16);
            let written = w.after(step, false).unwrap();
            assert_eq!(written.is_some(), step == 3, "step {step}");
            if let Some(profiled) = written {
                assert_eq!((profiled.path.as_path(), profiled.steps), (path.as_path(), 2));
            }
        }
        let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let events = trace["traceEvents"].as_array().unwrap();
        let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
        assert!(names.iter().filter(|n| **n == "aten::matmul").count() == 2, "{:?}", &names[..names.len().min(20)]);
        // The counts see the two steps' casts among their operators. (One test: torch's profiler
        // crashes when two threads of a process start it, as parallel tests would.)
        let counts = TraceCounts::read(&path).unwrap();
        assert_eq!(counts.casts, 2, "{counts:?}");
        assert!(counts.operators >= 6, "ones, matmul and the cast in each step at least: {counts:?}");
        assert_eq!(counts.products, 2, "matmul's mm, once a step: {counts:?}");
        assert_eq!(counts.strided, 0, "dense operands: {counts:?}");
        assert!(TraceCounts::read(&dir.path().join("absent.json")).unwrap_err().contains("cannot read"));
        assert!(!path.with_extension("json.tmp").exists());
    }
}
