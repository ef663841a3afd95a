//! The build script of the crates whose binaries, tests and benches link libtorch: records an
//! rpath to the folder torch-sys linked against (passed on by `dpo-torch` as
//! `DEP_DPO_C10D_LIBTORCH_LIB`), so they run without `LD_LIBRARY_PATH`.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DPO_C10D_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_DPO_C10D_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
