//! Tokenised splits kept on disk, so that the other ranks of a run and a resumed run read the ids
//! instead of tokenising again (a big dataset then never keeps a rank at a collective while
//! another tokenises). An entry is keyed by everything the ids depend on: the data files' bytes,
//! the tokenizer's files, the columns, the split, `skip_bad_rows` (and then the data's path, which
//! the skipped rows' reasons name), `max_length`, and the program that tokenised them; a changed
//! input changes the key, so nothing stale is reused.
//!
//! An entry is one file, written atomically: a magic line, the [`DataSummary`] as JSON, then per
//! pair its line (an unpaired row's label in the top bits) and three lengths, then the ids, all little-endian, and last the SHA-256 of all
//! that. [`load`] checks the sum, the lengths and every id against the tokenizer's vocabulary
//! before anything is used: a damaged entry (a flipped byte, a truncated file) is reported, never
//! read, and tokenised again.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::load::{LoadOptions, hub};
use super::prepare::{DataSummary, Prepared};
use super::tokenize::{TokenizedPair, Truncation};

const MAGIC: &[u8; 8] = b"DPOTOK03";

/// A pair's line word: bit 63 marks an unpaired (KTO) row, bit 62 holds its label.
const UNPAIRED: u64 = 1 << 63;
const DESIRABLE: u64 = 1 << 62;

/// The trailing SHA-256.
const SUM: u64 = 32;

/// The files of a tokenizer directory that tokenisation reads.
const TOKENIZER_FILES: [&str; 4] =
    ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"];

/// The cache entry for `data` (a file or a dataset directory) read with `opts`, tokenised by the
/// tokenizer in `tokenizer_dir` and cut as `truncation` says: `<dir>/<sha256 of the inputs>.tokens`.
pub fn entry(
    dir: &Path,
    data: &Path,
    opts: &LoadOptions,
    tokenizer_dir: &Path,
    truncation: impl Into<Truncation>,
) -> std::io::Result<PathBuf> {
    let Truncation { max_length, keep_end, rows } = truncation.into();
    let mut hash = Sha256::new();
    let files = if data.is_dir() {
        let split = opts.split.as_deref().unwrap_or("train");
        hub::split_files(data, split, opts.config.as_deref()).map_err(std::io::Error::other)?
    } else {
        vec![data.to_path_buf()]
    };
    for file in &files {
        hash.update(file.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        hash_file(&mut hash, file)?;
    }
    // Skipped rows are reported by the path they were read at: a copy elsewhere is its own entry.
    if opts.skip_bad_rows {
        let at = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
        hash.update(at.as_os_str().as_encoded_bytes());
    }
    for name in TOKENIZER_FILES {
        let path = tokenizer_dir.join(name);
        if path.is_file() {
            hash.update(name.as_bytes());
            hash_file(&mut hash, &path)?;
        }
    }
    // The program: another build may tokenise differently.
    let exe = std::env::current_exe().and_then(std::fs::metadata).ok();
    let built = exe.map(|m| (m.len(), m.modified().ok()));
    let c = &opts.columns;
    let settings = format!(
        "{}|{:?}|{}|{}|{}|{:?}|{}|{:?}|{max_length:?}|{keep_end}|{rows:?}|{built:?}",
        String::from_utf8_lossy(MAGIC),
        files.len(),
        c.prompt,
        c.chosen,
        c.rejected,
        // The split only chooses among a directory's files.
        opts.split.as_ref().filter(|_| data.is_dir()),
        opts.skip_bad_rows,
        opts.rows,
    );
    hash.update(settings.as_bytes());
    let key: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(dir.join(format!("{key}.tokens")))
}

fn hash_file(hash: &mut Sha256, path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    hash.update(file.metadata()?.len().to_le_bytes());
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        hash.update(&buf[..n]);
    }
}

/// Writes `prepared` to `path` (atomically), its checksum last.
pub fn store(path: &Path, prepared: &Prepared) -> std::io::Result<()> {
    dpo_base::fsutil::write_atomic_with(path, |tmp| {
        let mut out =
            Summed { inner: BufWriter::with_capacity(1 << 20, std::fs::File::create(tmp)?), sum: Sha256::new() };
        out.write_all(MAGIC)?;
        let summary = serde_json::to_vec(&prepared.summary)?;
        out.write_all(&(summary.len() as u64).to_le_bytes())?;
        out.write_all(&summary)?;
        out.write_all(&(prepared.pairs.len() as u64).to_le_bytes())?;
        for p in &prepared.pairs {
            let label = match p.label {
                None => 0,
                Some(desirable) => UNPAIRED | if desirable { DESIRABLE } else { 0 },
            };
            out.write_all(&(p.line as u64 | label).to_le_bytes())?;
            for ids in [&p.prompt_ids, &p.chosen_ids, &p.rejected_ids] {
                out.write_all(&(ids.len() as u32).to_le_bytes())?;
            }
        }
        for p in &prepared.pairs {
            for ids in [&p.prompt_ids, &p.chosen_ids, &p.rejected_ids] {
                ids.iter().try_for_each(|id| out.write_all(&id.to_le_bytes()))?;
            }
        }
        let Summed { mut inner, sum } = out;
        inner.write_all(&sum.finalize())?;
        inner.into_inner().map_err(|e| e.into_error())?.sync_all()
    })
}

/// A writer that sums what goes through it.
struct Summed<W> {
    inner: W,
    sum: Sha256,
}

impl<W: Write> Write for Summed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// What [`load`] found at an entry's path.
#[derive(Debug)]
pub enum Loaded {
    /// No entry (or one of an older format, which is rebuilt without a word).
    Missing,
    /// A damaged entry, and what is wrong with it: never used, it is tokenised again.
    Damaged(String),
    Hit(Prepared),
}

/// The entry at `path`, verified whole: its checksum, its lengths against the file's size, and
/// every id below `vocab_size` (the tokenizer that will read them). It is read as a stream: the
/// entry of a big dataset is never held twice.
pub fn load(path: &Path, vocab_size: usize) -> Loaded {
    let Ok(file) = std::fs::File::open(path) else { return Loaded::Missing };
    let Ok(size) = file.metadata().map(|m| m.len()) else { return Loaded::Missing };
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut magic = [0u8; 8];
    if input.read_exact(&mut magic).is_err() || &magic != MAGIC {
        return if magic.starts_with(b"DPOTOK") {
            Loaded::Missing
        } else {
            Loaded::Damaged("not a cache entry".into())
        };
    }
    let Some(body_len) = size.checked_sub(MAGIC.len() as u64 + SUM) else {
        return Loaded::Damaged("shorter than its checksum".into());
    };
    let mut sum = Sha256::new();
    sum.update(magic);
    let mut body = Hashing { inner: (&mut input).take(body_len), sum };
    let parsed = parse(&mut body, body_len);
    // A parse that stopped early still sums the rest.
    let _ = std::io::copy(&mut body, &mut std::io::sink());
    let computed = body.sum.finalize();
    let mut stored = [0u8; SUM as usize];
    if input.read_exact(&mut stored).is_err() || computed.as_slice() != stored {
        return Loaded::Damaged("its checksum does not match its contents".into());
    }
    match parsed {
        None => Loaded::Damaged("its lengths do not match its size".into()),
        Some(prepared) => match first_bad_id(&prepared.pairs, vocab_size) {
            Some(id) => Loaded::Damaged(format!("id {id} is not below the tokenizer's vocabulary of {vocab_size}")),
            None => Loaded::Hit(prepared),
        },
    }
}

/// A reader that sums what goes through it.
struct Hashing<R> {
    inner: R,
    sum: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }
}

/// The pairs and summary of an entry's `size`-byte body (after the magic, before the checksum);
/// `None` when its lengths do not add up to its size.
fn parse(input: &mut impl Read, size: u64) -> Option<Prepared> {
    let summary_len = usize::try_from(read_u64(input)?).ok().filter(|&l| (l as u64) < size)?;
    let mut summary = vec![0u8; summary_len];
    input.read_exact(&mut summary).ok()?;
    let summary: DataSummary = serde_json::from_slice(&summary).ok()?;
    let n = read_u64(input)?;
    let heads_at = 8 + summary_len as u64 + 8;
    if n.checked_mul(20).and_then(|bytes| bytes.checked_add(heads_at)).is_none_or(|end| end > size) {
        return None;
    }
    let n = usize::try_from(n).ok()?;
    let mut heads = Vec::with_capacity(n);
    for _ in 0..n {
        let word = read_u64(input)?;
        let label = (word & UNPAIRED != 0).then_some(word & DESIRABLE != 0);
        let line = usize::try_from(word & !(UNPAIRED | DESIRABLE)).ok()?;
        let mut lens = [0usize; 3];
        for len in &mut lens {
            *len = read_u32(input)? as usize;
        }
        heads.push((line, label, lens));
    }
    let ids: u64 = heads.iter().map(|(_, _, lens)| lens.iter().map(|&l| l as u64).sum::<u64>()).sum();
    if heads_at + 20 * n as u64 + 4 * ids != size {
        return None;
    }
    let mut pairs = Vec::with_capacity(n);
    for (line, label, [p, c, r]) in heads {
        let mut ids = |len| read_ids(input, len);
        pairs.push(TokenizedPair { line, prompt_ids: ids(p)?, chosen_ids: ids(c)?, rejected_ids: ids(r)?, label });
    }
    Some(Prepared { pairs, summary })
}

/// The first id at or above `vocab_size`.
fn first_bad_id(pairs: &[TokenizedPair], vocab_size: usize) -> Option<u32> {
    let all = pairs.iter().flat_map(|p| p.prompt_ids.iter().chain(&p.chosen_ids).chain(&p.rejected_ids));
    all.copied().find(|&id| id as usize >= vocab_size)
}

fn read_u64(input: &mut impl Read) -> Option<u64> {
    let mut b = [0u8; 8];
    input.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

fn read_u32(input: &mut impl Read) -> Option<u32> {
    let mut b = [0u8; 4];
    input.read_exact(&mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

fn read_ids(input: &mut impl Read, len: usize) -> Option<Vec<u32>> {
    let mut bytes = vec![0u8; len * 4];
    input.read_exact(&mut bytes).ok()?;
    Some(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}
