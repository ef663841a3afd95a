//! The sources themselves: no `unwrap` or `expect` outside tests in any file that calls libtorch
//! (through tch or the bridge to it), so a libtorch error reaches the user as an error naming the
//! operation, never as a panic of ours (burn's own infallible operations are `cli::torch_panic`'s).

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's lines before its test module (`#[cfg(test)]` followed by `mod`).
fn non_test_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("mod "))
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// `file:line: code` for each `.unwrap()` / `.expect(` outside comments in `lines`, where the file
/// calls libtorch at all.
fn panics_near_libtorch(path: &Path, lines: &[&str]) -> Vec<String> {
    let calls_torch = lines.iter().any(|l| l.contains("tch::") || l.contains("to_tch"));
    if !calls_torch {
        return Vec::new();
    }
    let code = |l: &&str| !l.trim_start().starts_with("//");
    let panics = |l: &str| l.contains(".unwrap()") || l.contains(".expect(");
    (lines.iter().enumerate())
        .filter(|(_, l)| code(l) && panics(l))
        .map(|(i, l)| format!("{}:{}: {}", path.display(), i + 1, l.trim()))
        .collect()
}

#[test]
fn no_unwrap_or_expect_beside_a_libtorch_call_outside_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for krate in fs::read_dir(root.join("crates")).unwrap().flatten() {
        rust_files(&krate.path().join("src"), &mut files);
    }
    let scanned = files.iter().filter(|f| fs::read_to_string(f).unwrap().contains("tch::")).count();
    // The scan must see the files that call libtorch, or it proves nothing.
    assert!(scanned >= 5, "only {scanned} files call tch: is the layout still src/ and crates/*/src?");
    let found: Vec<String> =
        files.iter().flat_map(|f| panics_near_libtorch(f, &non_test_lines(&fs::read_to_string(f).unwrap()))).collect();
    assert!(found.is_empty(), "unwrap/expect in files that call libtorch:\n{}", found.join("\n"));
}

#[test]
fn the_scan_finds_what_it_looks_for() {
    let text = "use tch::Tensor;\nfn f(t: &Tensor) -> Tensor {\n    t.f_abs().unwrap()\n}\n// .expect( in a comment\n\
                #[cfg(test)]\nmod tests {\n    fn g() { None::<u8>.unwrap(); }\n}\n";
    let found = panics_near_libtorch(Path::new("x.rs"), &non_test_lines(text));
    assert_eq!(found, ["x.rs:3: t.f_abs().unwrap()"]);
    let no_torch = "fn f() { None::<u8>.unwrap(); }\n";
    assert!(panics_near_libtorch(Path::new("y.rs"), &non_test_lines(no_torch)).is_empty());
}
