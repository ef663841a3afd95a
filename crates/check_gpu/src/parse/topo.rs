//! Parser for the text of `nvidia-smi topo -m`.
//!
//! The format (NVIDIA driver 450 to 570): a tab-separated header row `GPU0 .. GPUn [NIC0 ..|mlx5_0 ..]
//! CPU Affinity NUMA Affinity [GPU NUMA ID]`, one row per GPU and per NIC, then `Legend:` and,
//! on newer drivers, `NIC Legend:`. Newer drivers underline the header and row labels with ANSI
//! escapes; cells may be `N/A`; affinity cells are sometimes separated by two tabs.

use std::path::Path;

use super::ParseError;
use crate::snapshot::Link;

/// The affinity columns that close the header row.
const AFFINITY_COLUMNS: [&str; 3] = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"];

/// One GPU row of the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopoGpu {
    pub index: u32,
    /// `CPU Affinity`, e.g. `0-15,32-47`; `None` for `N/A`.
    pub cpu_affinity: Option<String>,
    /// `NUMA Affinity` (first node when a range); `None` for `N/A`.
    pub numa_node: Option<u32>,
    /// `GPU NUMA ID` (only set on systems where GPU memory is a NUMA node).
    pub gpu_numa_id: Option<u32>,
}

/// The parsed GPU part of `nvidia-smi topo -m`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopoMatrix {
    pub gpus: Vec<TopoGpu>,
    /// `links[i][j]` between `gpus[i]` and `gpus[j]`.
    pub links: Vec<Vec<Link>>,
    /// NIC names (from the NIC legend, else the NIC column headers).
    pub nics: Vec<String>,
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Splits a row into its non-empty cells. No cell holds a space but the header's affinity
/// columns, which are joined again: a copy whose tabs became spaces puts a single space after a
/// 7-character cell (`112-127 7`), so runs of spaces cannot delimit the cells.
fn cells(line: &str) -> Vec<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = Vec::with_capacity(words.len());
    let mut rest = &words[..];
    while let Some(first) = rest.first() {
        let column = AFFINITY_COLUMNS
            .iter()
            .map(|name| (name, name.split(' ').collect::<Vec<_>>()))
            .find(|(_, parts)| rest.starts_with(parts));
        let (cell, taken) = column.map_or((first.to_string(), 1), |(name, parts)| (name.to_string(), parts.len()));
        out.push(cell);
        rest = &rest[taken..];
    }
    out
}

fn gpu_label(cell: &str) -> Option<u32> {
    cell.strip_prefix("GPU")?.parse().ok()
}

fn na(cell: &str) -> bool {
    cell.eq_ignore_ascii_case("N/A") || cell.eq_ignore_ascii_case("[N/A]")
}

/// Parses the text of `nvidia-smi topo -m`; `path` only names the file in errors.
pub fn parse(text: &str, path: &Path) -> Result<TopoMatrix, ParseError> {
    let err = |line: usize, message: String| ParseError::Topo { path: path.to_path_buf(), line, message };
    let lines: Vec<(usize, String)> = super::lines(text).map(|(i, l)| (i, strip_ansi(l))).collect();

    let mut rest = lines.iter().skip_while(|(_, l)| l.trim().is_empty());
    let Some((header_no, header)) = rest.next() else {
        return Err(err(
            1,
            "expected the header row of `nvidia-smi topo -m` (GPU0 GPU1 ... CPU Affinity), found an empty file".into(),
        ));
    };
    let header = Header::parse(header).ok_or_else(|| {
        let found: String = header.trim().chars().take(40).collect();
        err(
            *header_no,
            format!("expected the header row of `nvidia-smi topo -m` (GPU0 GPU1 ... CPU Affinity), found `{found}`"),
        )
    })?;
    header.check_columns().map_err(|m| err(*header_no, m))?;

    let (mut gpus, mut links, mut nics, mut row_lines) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut last_line = *header_no;
    let mut in_legend = false;
    for (no, line) in rest {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if trimmed.starts_with("Legend") || trimmed.starts_with("NIC Legend") {
            in_legend = true;
            continue;
        }
        if in_legend {
            // `  NIC0: mlx5_0` in the NIC legend; the link legend lines are ignored.
            if let Some((k, v)) = trimmed.split_once(':')
                && k.starts_with("NIC")
                && k[3..].chars().all(|c| c.is_ascii_digit())
            {
                nics.push(v.trim().to_string());
            }
            continue;
        }
        last_line = *no;
        let row = cells(line);
        let Some(label) = row.first().map(String::as_str) else {
            continue;
        };
        let Some(index) = gpu_label(label) else {
            if header.nic_cols.iter().any(|n| n == label) || label.starts_with("NIC") || label.starts_with("mlx") {
                continue;
            }
            return Err(err(*no, format!("expected a `GPU<n>` or NIC row of `nvidia-smi topo -m`, found `{label}`")));
        };
        let (gpu, row_links) = header.gpu_row(index, &row).map_err(|m| err(*no, m))?;
        gpus.push(gpu);
        links.push(row_links);
        row_lines.push(*no);
    }
    // A row out of order is named on its own line; a row missing, after the last one.
    header.check_rows(&gpus).map_err(|(row, m)| err(row.map_or(last_line, |r| row_lines[r]), m))?;
    check_matrix(&gpus, &links, &row_lines).map_err(|(line, m)| err(line, m))?;
    if nics.is_empty() {
        nics = header.nic_cols;
    }
    Ok(TopoMatrix { gpus, links, nics })
}

/// The matrix `nvidia-smi` prints is symmetric with `X` exactly on the diagonal; anything else
/// is an edited or garbled file, whose links the plan would misread. Returns the line and message
/// of the first fault. `N/A` on one side contradicts nothing.
fn check_matrix(gpus: &[TopoGpu], links: &[Vec<Link>], lines: &[usize]) -> Result<(), (usize, String)> {
    for (i, row) in links.iter().enumerate() {
        let (label, line) = (gpus[i].index, lines[i]);
        for (j, &link) in row.iter().enumerate() {
            let col = gpus[j].index;
            if (i == j) != (link == Link::SelfLink) {
                let want = if i == j { "X on the diagonal" } else { "X only on the diagonal" };
                return Err((line, format!("column GPU{col} of `GPU{label}`: expected {want}, found `{link}`")));
            }
            let mirror = links[j][i];
            if j < i && link != mirror && link != Link::Unknown && mirror != Link::Unknown {
                return Err((
                    line,
                    format!(
                        "column GPU{col} of `GPU{label}` is `{link}` but column GPU{label} of `GPU{col}` (line {}) is `{mirror}`: expected the same link both ways",
                        lines[j]
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The header row: device columns (GPUs, then NICs), then affinity columns.
struct Header {
    device_cols: usize,
    affinity_cols: Vec<String>,
    /// `(column, GPU index)` of the GPU columns.
    gpu_cols: Vec<(usize, u32)>,
    nic_cols: Vec<String>,
}

impl Header {
    /// `None` unless the row starts with `GPU0`.
    fn parse(line: &str) -> Option<Self> {
        let header_cells = cells(line);
        let device_cols: Vec<&String> =
            header_cells.iter().take_while(|c| !AFFINITY_COLUMNS.contains(&c.as_str())).collect();
        let affinity_cols = header_cells[device_cols.len()..].to_vec();
        let gpu_cols: Vec<(usize, u32)> =
            device_cols.iter().enumerate().filter_map(|(i, c)| gpu_label(c).map(|g| (i, g))).collect();
        if gpu_cols.first().is_none_or(|&(_, g)| g != 0) {
            return None;
        }
        let nic_cols = device_cols.iter().filter(|c| gpu_label(c).is_none()).map(|c| c.to_string()).collect();
        Some(Self { device_cols: device_cols.len(), affinity_cols, gpu_cols, nic_cols })
    }

    /// A `GPU<index>` row: its links to every GPU column, and its affinities.
    fn gpu_row(&self, index: u32, row: &[String]) -> Result<(TopoGpu, Vec<Link>), String> {
        let label = &row[0];
        if row.len() < 1 + self.device_cols {
            return Err(format!(
                "expected {} link cells after `{label}` (one per column), found {}",
                self.device_cols,
                row.len() - 1
            ));
        }
        let mut links = Vec::with_capacity(self.gpu_cols.len());
        for &(col, gpu) in &self.gpu_cols {
            let cell = &row[1 + col];
            links.push(Link::parse(cell).ok_or_else(|| {
                format!("column GPU{gpu} of `{label}`: expected X, NV#, PIX, PXB, PHB, NODE or SYS, found `{cell}`")
            })?);
        }
        // A row cut short (a truncated file) would leave its last affinities unset or misread.
        let values = &row[1 + self.device_cols..];
        if let Some(missing) = self.affinity_cols.get(values.len()) {
            return Err(format!(
                "`{label}` ends before its `{missing}` cell: expected {} cells after the links, one per column, found {}",
                self.affinity_cols.len(),
                values.len()
            ));
        }
        let mut g = TopoGpu { index, cpu_affinity: None, numa_node: None, gpu_numa_id: None };
        for (name, value) in self.affinity_cols.iter().zip(values) {
            if na(value) {
                continue;
            }
            let first_number = || value.split(['-', ',']).next().and_then(|n| n.trim().parse::<u32>().ok());
            match name.as_str() {
                "CPU Affinity" => {
                    if crate::cpulist::parse(value).is_none() {
                        return Err(format!(
                            "`CPU Affinity` of `{label}`: expected a CPU list like `0-15,32-47`, found `{value}`"
                        ));
                    }
                    g.cpu_affinity = Some(value.clone());
                }
                "NUMA Affinity" => {
                    g.numa_node = Some(first_number().ok_or_else(|| {
                        format!("`NUMA Affinity` of `{label}`: expected a NUMA node number or N/A, found `{value}`")
                    })?);
                }
                _ => g.gpu_numa_id = first_number(),
            }
        }
        Ok((g, links))
    }

    /// Each GPU column once.
    fn check_columns(&self) -> Result<(), String> {
        for (n, &(_, gpu)) in self.gpu_cols.iter().enumerate() {
            if self.gpu_cols[..n].iter().any(|&(_, g)| g == gpu) {
                return Err(format!("column `GPU{gpu}` appears twice in the header"));
            }
        }
        Ok(())
    }

    /// One row per GPU column, in column order; an error names the row at fault (its position
    /// among the GPU rows) where one is.
    fn check_rows(&self, gpus: &[TopoGpu]) -> Result<(), (Option<usize>, String)> {
        if gpus.len() != self.gpu_cols.len() {
            let (want, found) = (self.gpu_cols.len(), gpus.len());
            return Err((None, format!("expected {want} GPU rows (one per GPU column), found {found}")));
        }
        match gpus.iter().zip(&self.gpu_cols).position(|(g, (_, want))| g.index != *want) {
            Some(row) => {
                let (found, want) = (gpus[row].index, self.gpu_cols[row].1);
                Err((
                    Some(row),
                    format!("expected GPU rows in column order, found GPU{found} where GPU{want} was expected"),
                ))
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<TopoMatrix, ParseError> {
        parse(text, Path::new("topo.txt"))
    }

    const T4: &str = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n\
GPU0\t X \tPHB\t0-7\t\tN/A\n\
GPU1\tPHB\t X \t0-7\t\tN/A\n\
\n\
Legend:\n\
\n\
  X    = Self\n\
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n\
  NV#  = Connection traversing a bonded set of # NVLinks\n";

    #[test]
    fn plain_two_gpus() {
        let m = p(T4).expect("parses");
        assert_eq!(m.gpus.len(), 2);
        assert_eq!(m.links[0], vec![Link::SelfLink, Link::Phb]);
        assert_eq!(m.gpus[1].cpu_affinity.as_deref(), Some("0-7"));
        assert_eq!(m.gpus[1].numa_node, None);
    }

    /// A GPU row out of order is named on its own line (the first row here), not the last one's.
    #[test]
    fn a_row_out_of_order_is_named_on_its_line() {
        let text = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n\
GPU1\t X \tPHB\tPHB\t0-7\t0\n\
GPU0\tPHB\t X \tPHB\t0-7\t0\n\
GPU2\tPHB\tPHB\t X \t0-7\t0\n";
        let err = p(text).expect_err("out of order").to_string();
        assert!(err.starts_with("topo.txt:2:"), "{err}");
        assert!(err.ends_with("expected GPU rows in column order, found GPU1 where GPU0 was expected"), "{err}");
    }

    #[test]
    fn ansi_nics_and_gpu_numa_id() {
        let text = "\t\u{1b}[4mGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\u{1b}[0m\n\
\u{1b}[4mGPU0\t\u{1b}[0m X \tNV18\tPIX\t0-55,112-167\t0\t\tN/A\n\
\u{1b}[4mGPU1\t\u{1b}[0mNV18\t X \tNODE\t0-55,112-167\t1\t\t4\n\
\u{1b}[4mNIC0\t\u{1b}[0mPIX\tNODE\t X \t\t\t\t\n\
\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n";
        let m = p(text).expect("parses");
        assert_eq!(m.links[0][1], Link::NvLink(18));
        assert_eq!(m.gpus[0].numa_node, Some(0));
        assert_eq!(m.gpus[1].numa_node, Some(1));
        assert_eq!(m.gpus[1].gpu_numa_id, Some(4));
        assert_eq!(m.gpus[0].gpu_numa_id, None);
        assert_eq!(m.nics, vec!["mlx5_0".to_string()]);
    }

    /// Tabs turned into spaces, as an HGX A100's output was copied into a cluster's docs (driver
    /// 495.29.05): one space after a 7-character CPU list.
    #[test]
    fn old_mlx_columns_and_space_separated() {
        let text = "        GPU0    GPU1    mlx5_0  CPU Affinity    NUMA Affinity\n\
GPU0     X      SYS     PXB     112-127 7\n\
GPU1    SYS      X      SYS     20-39   1\n\
mlx5_0  PXB     SYS      X\n";
        let m = p(text).expect("parses");
        assert_eq!(m.links[1][0], Link::Sys);
        assert_eq!(m.gpus[1].cpu_affinity.as_deref(), Some("20-39"));
        assert_eq!((m.gpus[0].cpu_affinity.as_deref(), m.gpus[0].numa_node), (Some("112-127"), Some(7)));
        assert_eq!(m.nics, vec!["mlx5_0".to_string()]);
    }

    /// A file cut inside its last row: the affinities it lacks are refused, not left unset (or a
    /// cut CPU list taken as the whole).
    #[test]
    fn a_row_cut_before_its_affinities_is_refused() {
        let text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\t0-7\t0\nGPU1\tPHB\t X \t0-7,16\n";
        assert_eq!(
            p(text).expect_err("cut").to_string(),
            "topo.txt:3: `GPU1` ends before its `NUMA Affinity` cell: expected 2 cells after the links, one per column, found 1"
        );
        let none = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\t0-7\t0\nGPU1\tPHB\t X\n";
        assert!(p(none).expect_err("cut").to_string().contains("`GPU1` ends before its `CPU Affinity` cell"));
    }

    #[test]
    fn byte_order_mark_is_skipped() {
        let m = p(&format!("\u{feff}{T4}")).expect("parses");
        assert_eq!(m.gpus.len(), 2);
    }

    #[test]
    fn na_cells() {
        let text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tN/A\tN/A\tN/A\nGPU1\tN/A\t X \tN/A\tN/A\n";
        let m = p(text).expect("parses");
        assert_eq!(m.links[0][1], Link::Unknown);
        assert_eq!(m.gpus[0].cpu_affinity, None);
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            p("").expect_err("empty").to_string(),
            "topo.txt:1: expected the header row of `nvidia-smi topo -m` (GPU0 GPU1 ... CPU Affinity), found an empty file"
        );
        assert_eq!(
            p("hello world\n").expect_err("no header").to_string(),
            "topo.txt:1: expected the header row of `nvidia-smi topo -m` (GPU0 GPU1 ... CPU Affinity), found `hello world`"
        );
        let bad_cell = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\nGPU1\tQQQ\t X \t0-7\n";
        assert_eq!(
            p(bad_cell).expect_err("bad cell").to_string(),
            "topo.txt:3: column GPU0 of `GPU1`: expected X, NV#, PIX, PXB, PHB, NODE or SYS, found `QQQ`"
        );
        let short = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n";
        assert_eq!(
            p(short).expect_err("short").to_string(),
            "topo.txt:2: expected 2 link cells after `GPU0` (one per column), found 1"
        );
        let missing = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\n";
        assert_eq!(
            p(missing).expect_err("missing").to_string(),
            "topo.txt:2: expected 2 GPU rows (one per GPU column), found 1"
        );
        let junk = "\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\nfoo\tbar\n";
        assert_eq!(
            p(junk).expect_err("junk").to_string(),
            "topo.txt:3: expected a `GPU<n>` or NIC row of `nvidia-smi topo -m`, found `foo`"
        );
        let asym = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV12\t0-7\nGPU1\tSYS\t X \t0-7\n";
        assert_eq!(
            p(asym).expect_err("asymmetric").to_string(),
            "topo.txt:3: column GPU0 of `GPU1` is `SYS` but column GPU1 of `GPU0` (line 2) is `NV12`: expected the same link both ways"
        );
        let diag = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\tPIX\tNV12\t0-7\nGPU1\tNV12\t X \t0-7\n";
        assert_eq!(
            p(diag).expect_err("diagonal").to_string(),
            "topo.txt:2: column GPU0 of `GPU0`: expected X on the diagonal, found `PIX`"
        );
        let off = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \t X \t0-7\nGPU1\t X \t X \t0-7\n";
        assert_eq!(
            p(off).expect_err("off-diagonal X").to_string(),
            "topo.txt:2: column GPU1 of `GPU0`: expected X only on the diagonal, found `X`"
        );
        let dup = "\tGPU0\tGPU0\tCPU Affinity\nGPU0\t X \tNV12\t0-7\nGPU0\tNV12\t X \t0-7\n";
        assert_eq!(p(dup).expect_err("dup").to_string(), "topo.txt:1: column `GPU0` appears twice in the header");
        let bad_cpu = "\tGPU0\tCPU Affinity\nGPU0\t X \tzero\n";
        assert!(p(bad_cpu).expect_err("cpu").to_string().starts_with("topo.txt:2: `CPU Affinity` of `GPU0`"));
    }
}
