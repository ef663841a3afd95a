//! `check-gpu`: parse flags, run the library, print, exit 0 ready / 1 warnings / 2 not ready / 3 bad input.

use std::io::Write;
use std::process::ExitCode;

use check_gpu::cli::{self, Args, EXIT_BAD_INPUT};
use check_gpu::render::Style;
use clap::Parser;

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            // --help and --version are not errors; bad flags are bad input.
            let code = if e.use_stderr() { EXIT_BAD_INPUT } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli::run(&args, Style::detect()) {
        Ok(out) => {
            // A closed pipe (`check-gpu | head`) is not an error worth reporting.
            let _ = std::io::stdout().write_all(out.stdout.as_bytes());
            ExitCode::from(out.exit_code)
        }
        Err(e) => {
            eprintln!("check-gpu: error: {}", cli::one_line(&e));
            ExitCode::from(e.exit_code())
        }
    }
}
