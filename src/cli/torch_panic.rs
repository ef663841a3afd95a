//! A libtorch error where nothing can return it: burn's tensor operations (and the autodiff
//! operations this project adds to them) have infallible signatures, so burn-tch, and tch's
//! methods it calls, panic on one. Such a panic becomes one line naming the libtorch operation and
//! the function of ours that called it, and exit 2 (a failure of the run), where it was a Rust
//! panic with a backtrace and exit 101. Our own direct libtorch calls return errors instead (the
//! sources are scanned for that in `tests/it/sources.rs`). Any other panic is a bug of ours and keeps
//! Rust's report.

use std::any::Any;
use std::backtrace::Backtrace;

/// The exit code of a run that failed (see `main.rs`).
const FAILED: i32 = 2;

/// Installs the hook for this process (the binary's `main`, before anything runs).
pub fn report_libtorch_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| match libtorch_message(info.payload()) {
        Some(message) => {
            eprintln!("error: {}", describe(&message, &Backtrace::force_capture().to_string()));
            std::process::exit(FAILED);
        }
        None => default(info),
    }));
}

/// libtorch's message in a panic's payload: a [`dpo_torch::LibtorchPanic`] (its first line), or
/// tch's panic text ([`torch_message`]). `None` for another panic.
pub fn libtorch_message(payload: &(dyn Any + Send)) -> Option<String> {
    match payload.downcast_ref::<dpo_torch::LibtorchPanic>() {
        Some(p) => Some(p.0.lines().next().unwrap_or_default().trim().to_owned()),
        None => torch_message(&payload_text(payload)),
    }
}

/// A panic's message (`panic!` with a literal or a formatted string).
pub fn payload_text(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => String::new(),
    }
}

/// libtorch's message in a panic of tch (`... Err value: Torch("MESSAGE\nException raised from
/// ...")`, the string in its `Debug` form): its first line, unescaped. `None` for another panic.
pub fn torch_message(panic: &str) -> Option<String> {
    let rest = &panic[panic.find("Torch(\"")? + "Torch(\"".len()..];
    let end = ["\\n", "Exception raised from", "\")"].iter().filter_map(|stop| rest.find(stop)).min();
    let first = rest[..end.unwrap_or(rest.len())].replace("\\\"", "\"").replace("\\\\", "\\");
    Some(first.trim().trim_end_matches('.').to_owned())
}

/// `libtorch failed in `OP` (called from PLACE): MESSAGE`, the operation being the innermost tch
/// method on the panicking stack (`f_` dropped) and the place the nearest frame of this project's
/// sources above it (`file:line` where the binary has line tables, else the function's path);
/// either is left out where the backtrace has neither.
pub fn describe(message: &str, backtrace: &str) -> String {
    let frames = frames(backtrace);
    let is_tch = |(symbol, at): &(&str, Option<&str>)| {
        let in_tch = at.is_some_and(|a| a.contains("/tch-") && a.contains("/src/wrappers/tensor"));
        in_tch || symbol.trim_start_matches('<').starts_with("tch::wrappers::tensor")
    };
    let tch = frames.iter().position(is_tch);
    let op = tch.map(|i| last_segment(frames[i].0).trim_start_matches("f_").to_owned());
    let ours = tch.and_then(|i| frames[i..].iter().find(|f| is_ours(f))).map(|&(symbol, at)| match at {
        Some(at) => at.split_once("/crates/").map_or(at.trim_start_matches("./"), |(_, rest)| rest).to_owned(),
        None => strip_hash(symbol).to_owned(),
    });
    let mut line = String::from("libtorch failed");
    if let Some(op) = op {
        line += &format!(" in `{op}`");
    }
    if let Some(place) = ours {
        line += &format!(" (called from {place})");
    }
    format!("{line}: {message}")
}

/// A backtrace's frames as (symbol, `at` location if the binary has line tables).
fn frames(backtrace: &str) -> Vec<(&str, Option<&str>)> {
    let mut frames: Vec<(&str, Option<&str>)> = Vec::new();
    for line in backtrace.lines().map(str::trim) {
        if let Some(at) = line.strip_prefix("at ") {
            if let Some(last) = frames.last_mut() {
                last.1.get_or_insert(at);
            }
        } else if let Some((n, symbol)) = line.split_once(": ")
            && n.chars().all(|c| c.is_ascii_digit())
        {
            frames.push((symbol, None));
        }
    }
    frames
}

/// Whether a frame is in this project's sources (its crates are `dpo_*` and `check_gpu`; its files
/// are neither a registry crate's nor the standard library's).
fn is_ours(&(symbol, at): &(&str, Option<&str>)) -> bool {
    match at {
        Some(at) => !at.contains("/.cargo/registry/") && !at.starts_with("/rustc/") && !at.contains("/git/checkouts/"),
        None => {
            let s = symbol.trim_start_matches('<');
            s.starts_with("dpo_") || s.starts_with("check_gpu::")
        }
    }
}

/// `a::b::<impl X>::name::h0123abcd` → `name`.
fn last_segment(symbol: &str) -> &str {
    let s = strip_hash(symbol);
    s.rsplit("::").next().unwrap_or(s)
}

/// A symbol without rustc's trailing `::h<16 hex digits>`.
fn strip_hash(symbol: &str) -> &str {
    match symbol.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => head,
        _ => symbol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Mutex, OnceLock};

    /// The payload and backtrace of panics on threads named `libtorch-panic-probe`, recorded by a
    /// hook that leaves every other thread's panic to the hook before it.
    fn recorded() -> &'static Mutex<Option<(String, String)>> {
        static SEEN: OnceLock<Mutex<Option<(String, String)>>> = OnceLock::new();
        SEEN.get_or_init(|| {
            let before = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if std::thread::current().name() == Some("libtorch-panic-probe") {
                    let bt = Backtrace::force_capture().to_string();
                    *recorded().lock().unwrap() = Some((payload_text(info.payload()), bt));
                } else {
                    before(info);
                }
            }));
            Mutex::new(None)
        })
    }

    /// What the issue saw (tch's `pin_memory` with a CPU device on torch ≥ 2.5) described from a real
    /// panic of tch: the operation, our caller and libtorch's first line.
    #[test]
    fn a_real_tch_panic_is_one_line_naming_the_operation() {
        recorded();
        let probe = std::thread::Builder::new().name("libtorch-panic-probe".into());
        let joined = probe
            .spawn(|| {
                let t = tch::Tensor::zeros([2], (tch::Kind::Float, tch::Device::Cpu));
                t.pin_memory(tch::Device::Cpu)
            })
            .unwrap()
            .join();
        assert!(joined.is_err(), "pin_memory(Cpu) did not fail");
        let (payload, backtrace) = recorded().lock().unwrap().take().expect("the panic was recorded");
        let message = torch_message(&payload).expect("a libtorch panic");
        assert!(!message.contains('\n') && !message.contains("Exception raised"), "{message}");
        let line = describe(&message, &backtrace);
        let want = "libtorch failed in `pin_memory` (called from src/cli/torch_panic.rs:";
        assert!(line.starts_with(want), "{line}\n{backtrace}");
        assert!(line.ends_with(&message), "{line}");
    }

    /// A graph node's backward that cannot return libtorch's error (the attention's, the RMS
    /// norm's on CUDA) panics with it typed: the hook's message is its first line.
    #[test]
    fn a_backward_nodes_libtorch_failure_is_recognised() {
        let error = dpo_torch::TorchError::Shim {
            op: "autograd_grad",
            code: 2,
            message: "autograd_grad: CUDA out of memory. Tried to allocate 2.00 GiB\nmore".into(),
        };
        let fail = || dpo_torch::libtorch_failed("the attention's backward", &error);
        let payload =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(fail)).expect_err("libtorch_failed returned");
        let message = libtorch_message(&*payload).expect("a libtorch panic");
        let want = "the attention's backward: c10d `autograd_grad` failed (code 2): autograd_grad: CUDA out of memory. Tried to allocate 2.00 GiB";
        assert_eq!(message, want);
        assert_eq!(libtorch_message(&"index out of bounds"), None);
    }

    #[test]
    fn other_panics_are_not_libtorch_ones() {
        assert_eq!(torch_message("index out of bounds: the len is 3 but the index is 7"), None);
        let m = torch_message(
            r#"called `Result::unwrap()` on an `Err` value: Torch("CUDA out of memory. Tried to allocate 2.00 GiB\nException raised from malloc")"#,
        );
        assert_eq!(m.as_deref(), Some("CUDA out of memory. Tried to allocate 2.00 GiB"));
        // Without symbols (a stripped binary), the message alone.
        assert_eq!(describe("boom", "   0: <unknown>\n   1: <unknown>"), "libtorch failed: boom");
        // A binary without line tables (`strip --strip-debug`): the symbols name both.
        let symbols = "   7: core::result::unwrap_failed::h0011223344556677\n   8: tch::wrappers::tensor_generated::<impl \
                       tch::wrappers::tensor::Tensor>::pin_memory::h8899aabbccddeeff\n   9: \
                       dpo_model::pinned_copy::h0123456789abcdef\n  10: std::rt::lang_start::h0123456789abcdef";
        assert_eq!(
            describe("boom", symbols),
            "libtorch failed in `pin_memory` (called from dpo_model::pinned_copy): boom"
        );
    }
}
