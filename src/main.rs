//! The `dpo-train` binary: parse flags, run, and turn an error into one line and an exit code.

use std::process::ExitCode;

use clap::Parser;
use dpo_train::cli::{Cli, run};

fn main() -> ExitCode {
    dpo_train::malloc::keep_freed_memory();
    let cli = Cli::parse();
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
            eprintln!("error: {err:#}");
            ExitCode::from(dpo_train::exit_code(&err))
        }
    }
}
