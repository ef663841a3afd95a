//! The `dpo-train` binary: parse flags, run, and turn an error into one line and an exit code:
//! 0 done, 1 bad input (flags, config, data, model files), 2 a failure of the run, 130 stopped by
//! Ctrl-C or SIGTERM after saving a checkpoint.

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use dpo_train::cli::{Cli, run};

/// Rust's allocations (tokenisation makes millions of small ones from all threads) go to mimalloc;
/// libtorch's tensors keep glibc's allocator, set up by [`dpo_train::malloc`].
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dpo_train::malloc::keep_freed_memory();
    dpo_train::malloc::cuda_segments();
    dpo_train::cli::torch_panic::report_libtorch_panics();
    // A file-size limit (`ulimit -f`) then fails the write with EFBIG, reported as any full disk,
    // instead of killing the process mid-checkpoint.
    // SAFETY: setting a signal's disposition to SIG_IGN has no memory effects.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return flag_error(&err),
    };
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            // A closed pipe (`dpo-train eval ... | head`) is not a failure.
            if err
                .chain()
                .any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
            {
                return ExitCode::SUCCESS;
            }
            // A worker's one-line refusal, already shown, is not said twice.
            let said =
                err.chain().any(|e| e.downcast_ref::<dpo_train::dist::LaunchError>().is_some_and(|e| e.already_said()));
            if !said {
                eprintln!("error: {err:#}");
            }
            ExitCode::from(dpo_train::exit_code(&err))
        }
    }
}

/// `--help` and `--version` print and succeed; a bad flag is one line (with clap's tip, if any)
/// and exit 1, as every other bad input.
fn flag_error(err: &clap::Error) -> ExitCode {
    if matches!(err.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    if let Some(line) = escaped_value_error(err) {
        eprintln!("{line}");
        return ExitCode::from(1);
    }
    let text = err.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("error: invalid arguments");
    match lines.find_map(|l| l.strip_prefix("tip: ")) {
        Some(tip) => eprintln!("{first} ({tip})"),
        None => eprintln!("{first}"),
    }
    ExitCode::from(1)
}

/// A refused value holding a newline or another control character, escaped: clap's own message
/// quotes it as it is, and its first line would cut it short (`invalid value 'x`).
fn escaped_value_error(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let text = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    let value = text(ContextKind::InvalidValue).filter(|v| v.chars().any(char::is_control))?;
    let arg = text(ContextKind::InvalidArg)?;
    let why = std::error::Error::source(err).map(|e| format!(": {e}")).unwrap_or_default();
    Some(format!("error: invalid value '{}' for '{arg}'{why}", value.escape_debug()))
}
