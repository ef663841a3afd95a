//! dpo-train's build script: the rpath to libtorch (as `tools/rpath.rs` records it for the other
//! crates), and the commit `dpo-train --version` and `dpo-train env` name.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DPO_C10D_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_DPO_C10D_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    // Built again when HEAD moves (a checkout, a commit on the branch).
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={git_dir}/{reference}");
        }
    }
    // And when the code it builds from changes: a build of edits to a commit names it `-dirty`
    // (as `git describe --dirty`), so a figure measured with it does not claim the commit's code.
    for path in BUILT_FROM {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    let mut diff = Command::new("git");
    diff.args(["diff", "--quiet", "HEAD", "--"]).args(BUILT_FROM);
    let dirty = diff.status().is_ok_and(|s| s.code() == Some(1));
    println!("cargo:rustc-env=DPO_TRAIN_COMMIT={commit}{}", if dirty { "-dirty" } else { "" });
    // The same paths for the test that checks the marker.
    println!("cargo:rustc-env=DPO_TRAIN_BUILT_FROM={}", BUILT_FROM.join(" "));
}

/// The tracked paths dpo-train's binaries are built from.
const BUILT_FROM: [&str; 5] = ["src", "crates", "build.rs", "Cargo.toml", "Cargo.lock"];

/// `git ARGS`'s output, trimmed; `None` outside a checkout or without git.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned()).filter(|s| !s.is_empty())
}
