//! `check-gpu`: parse flags, run the library, print, exit 0 ready / 1 warnings / 2 not ready / 3 bad input.

use std::io::Write;
use std::process::ExitCode;

use check_gpu::cli::{self, Args, EXIT_BAD_INPUT};
use check_gpu::render::Style;
use clap::Parser;

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        // --help and --version are not errors: clap prints them.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // Bad flags are bad input, reported on one line like every other error.
        Err(e) => {
            eprintln!("check-gpu: error: {}", cli::flag_error_line(&e.render().to_string()));
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    match cli::run(&args, Style::detect()) {
        Ok(out) => {
            // A closed pipe (`check-gpu | head`) is not an error worth reporting.
            let _ = std::io::stdout().write_all(out.stdout.as_bytes());
            if let Some(e) = &out.error {
                eprintln!("check-gpu: error: {e}");
            }
            ExitCode::from(out.exit_code)
        }
        Err(e) => {
            eprintln!("check-gpu: error: {}", cli::one_line(&e));
            ExitCode::from(e.exit_code())
        }
    }
}
