//! Offline input: the text of `nvidia-smi topo -m` and the CSV of `nvidia-smi --query-gpu`,
//! turned into the same [`Snapshot`] the live probe produces, so one analysis serves both.

pub mod query;
pub mod topo;

use std::path::{Path, PathBuf};

use crate::snapshot::{Link, Pair, Snapshot, Source};

pub use query::{QueryTable, parse as parse_query};
pub use topo::{TopoMatrix, parse as parse_topo};

/// Errors in offline input files. Each names the file and the 1-based line.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The file could not be read.
    #[error("cannot read `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Malformed `nvidia-smi topo -m` text.
    #[error("{path}:{line}: {message}")]
    Topo { path: PathBuf, line: usize, message: String },
    /// Malformed `nvidia-smi --query-gpu` CSV.
    #[error("{path}:{line}: {message}")]
    Query { path: PathBuf, line: usize, message: String },
    /// The two files describe different machines.
    #[error(
        "{query}:{line}: GPU {index} is not in `{topo}`, which has GPU0-GPU{last}: expected both files from the same machine"
    )]
    Mismatch { query: PathBuf, line: usize, index: u32, topo: PathBuf, last: u32 },
    /// The topo file has a GPU the CSV lacks.
    #[error("{query}:1: expected a row for GPU {index}, which `{topo}` lists")]
    MissingRow { query: PathBuf, index: u32, topo: PathBuf },
}

/// Reads a text file, mapping the error to [`ParseError::Read`].
pub fn read(path: &Path) -> Result<String, ParseError> {
    std::fs::read_to_string(path).map_err(|source| ParseError::Read { path: path.to_path_buf(), source })
}

/// The non-blank lines of `text` with their 1-based numbers, a leading UTF-8 byte-order mark
/// (Windows editors write one) removed.
pub(crate) fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> + Clone {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines().enumerate().map(|(i, l)| (i + 1, l)).filter(|(_, l)| !l.trim().is_empty())
}

/// One offline input: its text and the path used in messages.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub text: &'a str,
    pub path: &'a Path,
}

/// Builds a snapshot from `nvidia-smi topo -m` text, `--query-gpu` CSV, or both.
///
/// GPUs come from the CSV when given (else from the topo rows); NUMA node and CPU affinity
/// from the topo file; pairs from the topo matrix. The CPU count is the union of the CPU
/// affinity lists, i.e. the machine's CPUs.
pub fn offline_snapshot(topo: Option<Input<'_>>, query: Option<Input<'_>>) -> Result<Snapshot, ParseError> {
    let mut snap = Snapshot::new(Source::NvidiaSmi);
    let matrix = topo.map(|t| parse_topo(t.text, t.path)).transpose()?;
    let table = query.map(|q| parse_query(q.text, q.path)).transpose()?;

    if let Some(table) = &table {
        snap.gpus = table.gpus.clone();
        snap.system.driver_version = table.driver_version.clone();
    }
    if let Some(m) = &matrix {
        if let (Some(table), Some(t), Some(q)) = (&table, topo, query) {
            let last = m.gpus.last().map_or(0, |g| g.index);
            for (g, line) in table.gpus.iter().zip(&table.lines) {
                if !m.gpus.iter().any(|tg| tg.index == g.index) {
                    return Err(ParseError::Mismatch {
                        query: q.path.to_path_buf(),
                        line: *line,
                        index: g.index,
                        topo: t.path.to_path_buf(),
                        last,
                    });
                }
            }
            if let Some(missing) = m.gpus.iter().find(|tg| !table.gpus.iter().any(|g| g.index == tg.index)) {
                return Err(ParseError::MissingRow {
                    query: q.path.to_path_buf(),
                    index: missing.index,
                    topo: t.path.to_path_buf(),
                });
            }
        } else {
            snap.gpus =
                m.gpus.iter().map(|tg| crate::snapshot::Gpu { index: tg.index, ..Default::default() }).collect();
        }
        for tg in &m.gpus {
            if let Some(g) = snap.gpus.iter_mut().find(|g| g.index == tg.index) {
                g.numa_node = tg.numa_node;
                g.cpu_affinity = tg.cpu_affinity.clone();
            }
        }
        for i in 0..m.gpus.len() {
            for j in i + 1..m.gpus.len() {
                let link = m.links[i][j];
                let nvlinks = match link {
                    Link::NvLink(n) => Some(n),
                    Link::Unknown => None,
                    _ => Some(0),
                };
                snap.pairs.push(Pair {
                    a: m.gpus[i].index,
                    b: m.gpus[j].index,
                    link,
                    nvlinks,
                    p2p_read: None,
                    p2p_write: None,
                    p2p_nvlink: None,
                });
            }
        }
        let mut cpus: Vec<u32> = m
            .gpus
            .iter()
            .filter_map(|g| g.cpu_affinity.as_deref())
            .filter_map(crate::cpulist::parse)
            .flatten()
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        if !cpus.is_empty() {
            snap.system.cpu_count = u32::try_from(cpus.len()).ok();
        }
    }
    snap.gpus.sort_by_key(|g| g.index);
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPO: &str = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\t X \t8-15\t1\n";
    const CSV: &str = "0, A, G0, B0, 100, 1, 99, 8.0, 4, 4, 16, 16, 550.54.15\n1, A, G1, B1, 100, 1, 99, 8.0, 4, 4, 16, 16, 550.54.15\n";

    #[test]
    fn merges_topo_and_query() {
        let s = offline_snapshot(
            Some(Input { text: TOPO, path: Path::new("t.txt") }),
            Some(Input { text: CSV, path: Path::new("q.csv") }),
        )
        .expect("merges");
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[1].numa_node, Some(1));
        assert_eq!(s.link(0, 1), Link::NvLink(4));
        assert_eq!(s.system.cpu_count, Some(16));
        assert_eq!(s.system.driver_version.as_deref(), Some("550.54.15"));
    }

    #[test]
    fn topo_only_and_query_only() {
        let s = offline_snapshot(Some(Input { text: TOPO, path: Path::new("t.txt") }), None).expect("topo only");
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].name, None);
        let s = offline_snapshot(None, Some(Input { text: CSV, path: Path::new("q.csv") })).expect("csv only");
        assert_eq!(s.link(0, 1), Link::Unknown);
    }

    #[test]
    fn mismatched_files() {
        let three = format!("{CSV}2, A, G2, B2, 100, 1, 99, 8.0, 4, 4, 16, 16, 550.54.15\n");
        let err = offline_snapshot(
            Some(Input { text: TOPO, path: Path::new("t.txt") }),
            Some(Input { text: &three, path: Path::new("q.csv") }),
        )
        .expect_err("mismatch");
        assert_eq!(
            err.to_string(),
            "q.csv:3: GPU 2 is not in `t.txt`, which has GPU0-GPU1: expected both files from the same machine"
        );
        let one = "0, A, G0, B0, 100, 1, 99, 8.0, 4, 4, 16, 16, 550.54.15\n";
        let err = offline_snapshot(
            Some(Input { text: TOPO, path: Path::new("t.txt") }),
            Some(Input { text: one, path: Path::new("q.csv") }),
        )
        .expect_err("missing");
        assert_eq!(err.to_string(), "q.csv:1: expected a row for GPU 1, which `t.txt` lists");
    }
}
