//! Finds and queries the NCCL library the trainer would load: `dlopen("libnccl.so.2")` and
//! `int ncclGetVersion(int*)`. Codes from 2.9 on are `X*10000 + Y*100 + Z`, before `X*1000 + Y*100 + Z`
//! (`NCCL_VERSION_CODE` in `nccl.h`).

use std::ffi::c_int;
use std::path::{Path, PathBuf};

use crate::snapshot::Nccl;

/// The soname the trainer loads.
pub const SONAME: &str = "libnccl.so.2";

/// Decodes an `ncclGetVersion` code: `22105` -> `2.21.5`, `2708` -> `2.7.8`.
pub fn decode_version(code: i32) -> String {
    if code >= 20900 {
        format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100)
    }
}

/// Where to look, in order: `NCCL_HOME/lib{,64}`, each `LD_LIBRARY_PATH` entry, the project
/// venv's `nvidia/nccl/lib` (`DPO_TRAIN_VENV`, default `./.venv`), then common system dirs.
pub fn candidates(nccl_home: Option<&str>, ld_library_path: Option<&str>, venv: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(home) = nccl_home.filter(|h| !h.is_empty()) {
        out.push(Path::new(home).join("lib").join(SONAME));
        out.push(Path::new(home).join("lib64").join(SONAME));
    }
    for dir in ld_library_path.unwrap_or("").split(':').filter(|d| !d.is_empty()) {
        out.push(Path::new(dir).join(SONAME));
    }
    let lib = venv.join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python")))
                .collect()
        })
        .unwrap_or_default();
    pythons.sort();
    for py in pythons {
        out.push(py.join("site-packages/nvidia/nccl/lib").join(SONAME));
    }
    for dir in
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/cuda/lib64", "/usr/lib64", "/usr/lib"]
    {
        out.push(Path::new(dir).join(SONAME));
    }
    out
}

/// Loads one library and asks its version.
fn query(path: &Path) -> Result<i32, String> {
    type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: loading NCCL runs only its static initialisers, which do not touch the GPU; the
    // library stays loaded while the symbol is used below.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    // SAFETY: `ncclGetVersion` has had this signature since NCCL 2.0 (`nccl.h`).
    let get: libloading::Symbol<'_, GetVersion> = unsafe { lib.get(b"ncclGetVersion\0") }.map_err(|e| e.to_string())?;
    let mut code: c_int = 0;
    // SAFETY: the function writes one int through the valid pointer we pass.
    let rc = unsafe { get(&mut code) };
    if rc != 0 {
        return Err(format!("ncclGetVersion returned error {rc}"));
    }
    Ok(code)
}

/// Probes NCCL using the process environment.
pub fn probe() -> Nccl {
    let venv = std::env::var_os("DPO_TRAIN_VENV").map_or_else(|| PathBuf::from(".venv"), PathBuf::from);
    let home = std::env::var("NCCL_HOME").ok();
    let ld = std::env::var("LD_LIBRARY_PATH").ok();
    probe_in(&candidates(home.as_deref(), ld.as_deref(), &venv))
}

/// Tries each existing candidate, then the system loader by soname.
pub fn probe_in(paths: &[PathBuf]) -> Nccl {
    let mut info = Nccl { searched: paths.iter().map(|p| p.display().to_string()).collect(), ..Nccl::default() };
    let mut last_error = None;
    for p in paths.iter().filter(|p| p.is_file()) {
        match query(p) {
            Ok(code) => {
                info.path = Some(p.display().to_string());
                info.version_code = Some(code);
                info.version = Some(decode_version(code));
                return info;
            }
            Err(e) => last_error = Some(format!("{}: {e}", p.display())),
        }
    }
    info.searched.push(format!("{SONAME} (system loader)"));
    match query(Path::new(SONAME)) {
        Ok(code) => {
            info.path = Some(format!("{SONAME} (system loader)"));
            info.version_code = Some(code);
            info.version = Some(decode_version(code));
        }
        Err(e) => info.error = Some(last_error.unwrap_or(e)),
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_encodings() {
        assert_eq!(decode_version(22105), "2.21.5");
        assert_eq!(decode_version(21803), "2.18.3");
        assert_eq!(decode_version(2708), "2.7.8");
    }

    #[test]
    fn candidate_order() {
        let venv = std::env::temp_dir().join(format!("check-gpu-venv-{}", std::process::id()));
        std::fs::create_dir_all(venv.join("lib/python3.12")).expect("temp venv");
        let c = candidates(Some("/opt/nccl"), Some("/a:/b"), &venv);
        assert_eq!(c[0], PathBuf::from("/opt/nccl/lib/libnccl.so.2"));
        assert_eq!(c[1], PathBuf::from("/opt/nccl/lib64/libnccl.so.2"));
        assert_eq!(c[2], PathBuf::from("/a/libnccl.so.2"));
        assert_eq!(c[3], PathBuf::from("/b/libnccl.so.2"));
        assert_eq!(c[4], venv.join("lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"));
        let _ = std::fs::remove_dir_all(&venv);
    }

    #[test]
    fn missing_library_is_reported_not_fatal() {
        let info = probe_in(&[PathBuf::from("/nonexistent/libnccl.so.2")]);
        if info.version.is_none() {
            assert!(info.error.is_some());
        }
        assert_eq!(info.searched[0], "/nonexistent/libnccl.so.2");
    }
}
