//! Compiles `csrc/c10d.cpp`, the shim behind this crate (and `dpo-dist`'s process groups), with the recipe of
//! `notes/c10d-probe.md`: the C++11 ABI, `USE_C10D_GLOO`, libtorch's two include folders, and Gloo's
//! headers from the system (`libgloo-dev`; torch exports Gloo's symbols itself). With the `nccl`
//! feature it adds `USE_C10D_NCCL`/`USE_CUDA`, every `site-packages/nvidia/*/include`, and links
//! `torch_cuda` and `c10_cuda`.

use std::path::{Path, PathBuf};

fn main() {
    // torch-sys declares `links = "tch"` and publishes the folder it linked against; it is passed
    // on (as `DEP_DPO_C10D_LIBTORCH_LIB`) to the crates whose binaries record an rpath to it
    // (`tools/rpath.rs`).
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").ok();
    if let Some(lib) = &lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:libtorch_lib={lib}");
    }
    build_c10d(lib.as_deref().map(Path::new));
}

/// Compiles the c10d shim into a static library linked into the `dpo-train` crate.
fn build_c10d(lib: Option<&Path>) {
    println!("cargo:rerun-if-changed=csrc/c10d.cpp");
    println!("cargo:rerun-if-changed=csrc/c10d.h");
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
        .file("csrc/c10d.cpp")
        .include("csrc")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .define("USE_C10D_GLOO", None);

    let nccl = std::env::var_os("CARGO_FEATURE_NCCL").is_some();
    if nccl {
        build.define("USE_C10D_NCCL", None).define("USE_CUDA", None);
        for dir in nvidia_include_dirs(root) {
            build.include(dir);
        }
    }
    build.compile("dpo_c10d");

    println!("cargo:rustc-link-search=native={}", lib.display());
    if nccl {
        println!("cargo:rustc-link-lib=torch_cuda");
        println!("cargo:rustc-link-lib=c10_cuda");
    }
    println!("cargo:rustc-link-lib=torch");
    println!("cargo:rustc-link-lib=torch_cpu");
    println!("cargo:rustc-link-lib=c10");
}

/// `site-packages/nvidia/*/include` beside the torch package (the CUDA, NCCL and CCCL headers of
/// the pip wheels). Only these folders go on the path: their subfolders shadow standard headers.
fn nvidia_include_dirs(torch_root: &Path) -> Vec<PathBuf> {
    let Some(site_packages) = torch_root.parent() else { return Vec::new() };
    let nvidia = site_packages.join("nvidia");
    let Ok(entries) = std::fs::read_dir(&nvidia) else {
        println!("cargo:warning=no {} folder: the nccl feature needs the nvidia-* wheels", nvidia.display());
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> =
        entries.filter_map(Result::ok).map(|e| e.path().join("include")).filter(|p| p.is_dir()).collect();
    dirs.sort();
    dirs
}
