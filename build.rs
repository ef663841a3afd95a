//! Links the binaries against the libtorch that torch-sys found (the torch wheel in the venv when
//! `LIBTORCH_USE_PYTORCH=1`) and records an rpath to it, so `target/release/dpo-train` runs without
//! `LD_LIBRARY_PATH`.

fn main() {
    // torch-sys declares `links = "tch"` and publishes the folder it linked against.
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
