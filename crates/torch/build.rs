//! Compiles `csrc/` (`c10d.cpp`, `ops.cpp`, `runtime.cpp`), the shim behind this crate (and
//! `dpo-dist`'s process groups), with the recipe of `notes/c10d-probe.md`: the C++11 ABI,
//! `USE_C10D_GLOO`, libtorch's two include folders, and Gloo's headers from the system
//! (`libgloo-dev`; torch exports Gloo's symbols itself).
//!
//! NCCL is compiled in wherever the torch it builds against can use it: a CUDA build of torch
//! (`libtorch_cuda.so` beside `libtorch.so`, as in the PyPI wheel) with the CUDA and NCCL headers
//! of the `nvidia-*` wheels beside it (`make venv` installs them). Then it adds
//! `USE_C10D_NCCL`/`USE_CUDA`, every `site-packages/nvidia/*/include`, and links `torch_cuda` and
//! `c10_cuda`. Otherwise it builds without NCCL and says why in `DPO_TORCH_NCCL`, which
//! `dpo-train env` prints. `DPO_TRAIN_NCCL=0` leaves NCCL out on purpose.
//!
//! It also passes on what it built against (`DPO_TORCH_LIB`, the `libtorch_lib` link metadata
//! for the rpath of the crates above, `tools/rpath.rs`).

use std::path::{Path, PathBuf};

fn main() {
    // torch-sys declares `links = "tch"` and publishes the folder it linked against.
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=DPO_TRAIN_NCCL");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").ok();
    if let Some(lib) = &lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:libtorch_lib={lib}");
        println!("cargo:rustc-env=DPO_TORCH_LIB={lib}");
    }
    build_c10d(lib.as_deref().map(Path::new));
}

/// The shim's sources: process groups, operations, and the process's torch settings and state.
const SOURCES: [&str; 3] = ["csrc/c10d.cpp", "csrc/ops.cpp", "csrc/runtime.cpp"];

/// Compiles the c10d shim into a static library linked into this crate.
fn build_c10d(lib: Option<&Path>) {
    for file in SOURCES.iter().chain(&["csrc/c10d.h", "csrc/shim.h"]) {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let Some(lib) = lib else {
        // torch-sys always publishes its folder on Linux; without it there is nothing to compile against.
        println!("cargo:warning=DEP_TCH_LIBTORCH_LIB is unset: the c10d shim cannot be built");
        return;
    };
    // `<torch>/lib` → `<torch>/include`, the layout of both the wheel and the libtorch zip.
    let root = lib.parent().unwrap_or(lib);
    let include = root.join("include");
    // torch wheels since 2.7 (and this venv's 2.9) use the C++11 ABI; torch-sys honours the same variable.
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_string());

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .std("c++17")
        .files(SOURCES)
        .include("csrc")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .define("USE_C10D_GLOO", None);

    let nccl = nccl_headers(lib, root);
    match &nccl {
        Ok(dirs) => {
            build.define("USE_C10D_NCCL", None).define("USE_CUDA", None);
            for dir in dirs {
                build.include(dir);
            }
            println!("cargo:rustc-env=DPO_TORCH_NCCL=compiled in");
        }
        Err(why) => println!("cargo:rustc-env=DPO_TORCH_NCCL=not compiled in: {why}"),
    }
    build.compile("dpo_c10d");

    println!("cargo:rustc-link-search=native={}", lib.display());
    if nccl.is_ok() {
        println!("cargo:rustc-link-lib=torch_cuda");
        println!("cargo:rustc-link-lib=c10_cuda");
    }
    println!("cargo:rustc-link-lib=torch");
    println!("cargo:rustc-link-lib=torch_cpu");
    println!("cargo:rustc-link-lib=c10");
}

/// The include folders NCCL compiles with, or why it cannot: a CPU build of torch, the headers
/// missing, or `DPO_TRAIN_NCCL=0`.
fn nccl_headers(lib: &Path, torch_root: &Path) -> Result<Vec<PathBuf>, String> {
    if std::env::var("DPO_TRAIN_NCCL").is_ok_and(|v| v == "0") {
        return Err("DPO_TRAIN_NCCL=0".to_owned());
    }
    if !lib.join("libtorch_cuda.so").exists() {
        return Err(format!("{} is a CPU build of torch", lib.display()));
    }
    let dirs = nvidia_include_dirs(torch_root);
    let has = |header: &str| dirs.iter().any(|d| d.join(header).is_file());
    let missing: Vec<&str> = ["cuda_runtime_api.h", "nccl.h"].into_iter().filter(|h| !has(h)).collect();
    if !missing.is_empty() {
        let why = format!(
            "torch is a CUDA build but {} is missing beside it (`make venv` installs the nvidia-* header wheels)",
            missing.join(" and ")
        );
        println!("cargo:warning=NCCL is not compiled in: {why}");
        return Err(why);
    }
    Ok(dirs)
}

/// `site-packages/nvidia/*/include` beside the torch package (the CUDA, NCCL and CCCL headers of
/// the pip wheels). Only these folders go on the path: their subfolders shadow standard headers.
fn nvidia_include_dirs(torch_root: &Path) -> Vec<PathBuf> {
    let Some(site_packages) = torch_root.parent() else { return Vec::new() };
    let nvidia = site_packages.join("nvidia");
    // A header wheel installed later changes the folder: build again.
    println!("cargo:rerun-if-changed={}", nvidia.display());
    let Ok(entries) = std::fs::read_dir(&nvidia) else { return Vec::new() };
    let mut dirs: Vec<PathBuf> =
        entries.filter_map(Result::ok).map(|e| e.path().join("include")).filter(|p| p.is_dir()).collect();
    dirs.sort();
    dirs
}
