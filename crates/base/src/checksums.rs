//! A directory's checksums file (`checksums.json`): the length and CRC-32C of each file it covers,
//! written once the files are, and checked by whoever reads one of them back. A bit flipped on
//! disk inside a tensor file still parses, so without it a resume trains on from damaged weights
//! or moments without a word. CRC-32C (what storage systems check blocks with) runs at memory
//! speed: writing it costs one read of files still in the page cache.
//!
//! ```json
//! { "algorithm": "crc32c", "files": { "model.safetensors": { "bytes": 3356, "crc32c": "9a3f05c1" } } }
//! ```

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The checksums file's name, in the directory whose files it covers.
pub const FILE: &str = "checksums.json";
const ALGORITHM: &str = "crc32c";

#[derive(Serialize, Deserialize)]
struct Manifest {
    algorithm: String,
    files: BTreeMap<String, Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    bytes: u64,
    crc32c: String,
}

impl Entry {
    fn of(bytes: u64, crc: u32) -> Self {
        Self { bytes, crc32c: format!("{crc:08x}") }
    }
}

/// A file that differs from what the checksums file says of it, or a checksums file that cannot
/// be read.
#[derive(Debug, thiserror::Error)]
#[error("`{path}` {message}")]
pub struct ChecksumError {
    pub path: PathBuf,
    pub message: String,
}

/// `crc` (CRC-32C, 0 to start) continued over `bytes`.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// Writes `dir/checksums.json` over the files of `dir` that `covered` takes (by name), atomically.
pub fn write(dir: &Path, covered: impl Fn(&str) -> bool) -> std::io::Result<()> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != FILE && covered(&name) && entry.file_type()?.is_file() {
            files.insert(name, entry_of_file(&entry.path())?);
        }
    }
    let manifest = Manifest { algorithm: ALGORITHM.to_owned(), files };
    let json = serde_json::to_string_pretty(&manifest).map_err(std::io::Error::other)? + "\n";
    crate::fsutil::write_atomic(&dir.join(FILE), json.as_bytes())
}

fn entry_of_file(path: &Path) -> std::io::Result<Entry> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 8 << 20];
    let (mut crc, mut bytes) = (0u32, 0u64);
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(Entry::of(bytes, crc));
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        bytes += n as u64;
    }
}

/// Checks `contents`, read from `path`, against the checksums file beside it. Passes where there
/// is none (a directory this project did not write, or a checkpoint from before it wrote one); a
/// checksums file that does not list the file is refused, as its callers read only files of the
/// kinds the writer covers.
pub fn check(path: &Path, contents: &[u8]) -> Result<(), ChecksumError> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let manifest_path = dir.join(FILE);
    let fail = |path: &Path, message: String| ChecksumError { path: path.to_owned(), message };
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(fail(&manifest_path, format!("cannot be read: {e}"))),
    };
    let manifest: Manifest = serde_json::from_str(&text)
        .map_err(|e| fail(&manifest_path, format!("is not a checksums file of this project: {e}")))?;
    if manifest.algorithm != ALGORITHM {
        let message = format!("names algorithm `{}`; this build checks `{ALGORITHM}`", manifest.algorithm);
        return Err(fail(&manifest_path, message));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // The writer covers every file of the kinds its readers check: one it does not list is a
    // damaged checksums file (a name changed, an entry lost), not a file to pass unchecked.
    let unlisted =
        format!("lists no `{name}`, which it was written to cover (delete it to load the directory unchecked)");
    let expected = manifest.files.get(&name).ok_or_else(|| fail(&manifest_path, unlisted))?;
    let digits = expected.crc32c.len() == 8 && expected.crc32c.bytes().all(|b| b.is_ascii_hexdigit());
    let crc = digits.then(|| u32::from_str_radix(&expected.crc32c, 16).ok()).flatten();
    let not_hex = format!(
        "is not a checksums file of this project: `{name}`'s CRC-32C `{}` is not 8 hexadecimal digits",
        expected.crc32c
    );
    let crc = crc.ok_or_else(|| fail(&manifest_path, not_hex))?;
    let (bytes, found) = (contents.len() as u64, crc32c::crc32c(contents));
    if bytes == expected.bytes && found == crc {
        return Ok(());
    }
    let what = match bytes == expected.bytes {
        true => format!("CRC-32C is {found:08x}, not the {crc:08x}"),
        false => format!("length is {bytes} bytes, not the {}", expected.bytes),
    };
    let message = format!(
        "is damaged: its {what} that {FILE} recorded when it was written (to load it as it is, delete `{}`)",
        manifest_path.display()
    );
    Err(fail(path, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C's check value (RFC 3720's test vector): the crate computes the Castagnoli
    /// polynomial, the one the file names.
    #[test]
    fn crc32c_is_castagnolis() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn a_changed_byte_or_length_is_named_and_the_rest_passes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.bin"), b"weights").unwrap();
        std::fs::write(dir.path().join("b.txt"), b"edited freely").unwrap();
        write(dir.path(), |name| name.ends_with(".bin")).unwrap();
        let a = dir.path().join("a.bin");
        check(&a, b"weights").unwrap();
        // Not covered, so not listed: a reader of such a file finds the list damaged.
        let unlisted = check(&dir.path().join("b.txt"), b"anything").unwrap_err().to_string();
        assert!(unlisted.contains("checksums.json` lists no `b.txt`, which it was written to cover"), "{unlisted}");
        let flipped = check(&a, b"weighTs").unwrap_err().to_string();
        assert!(flipped.contains("a.bin` is damaged: its CRC-32C is "), "{flipped}");
        assert!(flipped.contains("to load it as it is, delete"), "{flipped}");
        let cut = check(&a, b"weigh").unwrap_err().to_string();
        assert!(cut.contains("its length is 5 bytes, not the 7 that checksums.json recorded"), "{cut}");
    }

    /// A CRC that is not 8 hex digits is the checksums file's damage, not the tensor file's; the
    /// digits' case does not matter.
    #[test]
    fn a_damaged_crc_names_the_checksums_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.bin");
        std::fs::write(&a, b"weights").unwrap();
        write(dir.path(), |_| true).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        let crc = format!("{:08x}", crc32c::crc32c(b"weights"));
        // `+` is one of the 8 characters `from_str_radix` alone would take.
        let signed = format!("+{}", &crc[1..]);
        for (written, ok) in [
            (crc.to_uppercase(), true),
            (format!("z{}", &crc[1..]), false),
            (crc[1..].to_owned(), false),
            (signed, false),
        ] {
            std::fs::write(dir.path().join(FILE), text.replace(&crc, &written)).unwrap();
            match ok {
                true => check(&a, b"weights").unwrap(),
                false => {
                    let err = check(&a, b"weights").unwrap_err().to_string();
                    assert!(err.contains(&format!("checksums.json` is not a checksums file of this project: `a.bin`'s CRC-32C `{written}` is not 8 hexadecimal digits")), "{err}");
                }
            }
        }
    }

    #[test]
    fn no_checksums_file_passes_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.bin");
        check(&a, b"anything").unwrap();
        std::fs::write(dir.path().join(FILE), "{").unwrap();
        let err = check(&a, b"anything").unwrap_err().to_string();
        assert!(err.contains("checksums.json` is not a checksums file of this project"), "{err}");
    }
}
