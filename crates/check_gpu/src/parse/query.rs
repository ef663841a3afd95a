//! Parser for `nvidia-smi --query-gpu=... --format=csv` output.
//!
//! The default column order is [`DEFAULT_COLUMNS`]; `,noheader` output must use it. With a
//! header, columns are matched by name, units in brackets (`memory.total [MiB]`) are ignored, and
//! a few optional columns are understood (MIG, persistence, ECC, throttle reasons, power,
//! temperature, utilisation). Values may carry units (`15360 MiB`, `70.00 W`, `0 %`) or not
//! (`,nounits`); `[N/A]` and `N/A` mean unknown.

use std::path::Path;

use super::ParseError;
use crate::snapshot::Gpu;

/// The columns of the documented query, in order.
pub const DEFAULT_COLUMNS: [&str; 13] = [
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "memory.free",
    "compute_cap",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "driver_version",
];

const MIB: u64 = 1024 * 1024;

/// Throttle-reason bits (`nvmlClocksThrottleReason*`) and their names.
pub const THROTTLE_BITS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// Names of the throttle reasons set in an NVML bitmask.
pub fn throttle_names(mask: u64) -> Vec<String> {
    THROTTLE_BITS.iter().filter(|(bit, _)| mask & bit != 0).map(|(_, n)| n.to_string()).collect()
}

/// GPUs and the driver version read from the CSV.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryTable {
    pub gpus: Vec<Gpu>,
    pub driver_version: Option<String>,
    /// 1-based line of each GPU row, for error messages that point back into the file.
    pub lines: Vec<usize>,
}

fn is_na(v: &str) -> bool {
    matches!(v, "" | "[N/A]" | "N/A" | "[Not Supported]" | "Not Supported" | "[Unknown Error]")
}

/// The command whose output `--query` reads.
pub fn query_command() -> String {
    format!("nvidia-smi --query-gpu={} --format=csv", DEFAULT_COLUMNS.join(","))
}

/// Parses the CSV text; `path` only names the file in errors.
pub fn parse(text: &str, path: &Path) -> Result<QueryTable, ParseError> {
    let err = |line: usize, message: String| ParseError::Query { path: path.to_path_buf(), line, message };
    let mut rows = super::lines(text).map(|(i, l)| (i, super::topo::strip_ansi(l))).peekable();
    if let Some((no, _)) = rows.clone().take(3).find(|(_, l)| l.contains("NVSMI LOG")) {
        let message = format!("this is `nvidia-smi -q` output; --query reads the CSV of `{}`", query_command());
        return Err(err(no, message));
    }
    let columns = match rows.peek() {
        Some((no, first)) if split(first).iter().any(|c| is_column_name(c)) => {
            let names: Vec<String> = split(first).iter().map(|c| column_name(c)).collect();
            if !names.iter().any(|c| c == "index") {
                let message = format!("the header lacks `index`, which names each GPU: run `{}`", query_command());
                return Err(err(*no, message));
            }
            rows.next();
            names
        }
        _ => DEFAULT_COLUMNS.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
    };

    let mut table = QueryTable { gpus: Vec::new(), driver_version: None, lines: Vec::new() };
    for (no, line) in rows {
        let values = split(&line);
        if values.len() != columns.len() {
            let message = format!(
                "expected {} comma-separated values ({}), found {}",
                columns.len(),
                columns.join(", "),
                values.len()
            );
            return Err(err(no, message));
        }
        let mut gpu = Gpu::default();
        let mut have_index = false;
        for (col, v) in columns.iter().zip(&values) {
            if is_na(v) {
                continue;
            }
            have_index |= col == "index";
            Cell { col, v, line: no, path }.store(&mut gpu, &mut table.driver_version)?;
        }
        if !have_index {
            return Err(err(no, "column `index`: expected a GPU index, found `[N/A]`".into()));
        }
        check_memory(&gpu).map_err(|m| err(no, m))?;
        if table.gpus.iter().any(|g: &Gpu| g.index == gpu.index) {
            return Err(err(no, format!("column `index`: GPU {} appears twice", gpu.index)));
        }
        table.gpus.push(gpu);
        table.lines.push(no);
    }
    if table.gpus.is_empty() {
        return Err(err(1, "expected at least one GPU row".into()));
    }
    Ok(table)
}

/// `memory.total [MiB]` -> `memory.total`.
fn column_name(cell: &str) -> String {
    cell.split(" [").next().unwrap_or_default().trim().to_ascii_lowercase()
}

/// Whether a cell of the first row is a column name, so that row is a header (no GPU value
/// looks like one).
fn is_column_name(cell: &str) -> bool {
    DEFAULT_COLUMNS.contains(&column_name(cell).as_str())
}

/// Free and used memory beyond the total is a garbled or hand-edited file: planning with it
/// would place a model on memory that does not exist.
fn check_memory(gpu: &Gpu) -> Result<(), String> {
    let Some(total) = gpu.memory_total_bytes else { return Ok(()) };
    for (col, value) in [("memory.used", gpu.memory_used_bytes), ("memory.free", gpu.memory_free_bytes)] {
        if let Some(v) = value.filter(|&v| v > total) {
            return Err(format!("column `{col}`: {} MiB exceeds memory.total, {} MiB", v / MIB, total / MIB));
        }
    }
    Ok(())
}

/// `550.54.15` or `535.104`: a file cut off inside the version (`55`) must not pass, since the
/// RTX 40xx NCCL workaround compares it.
fn is_driver_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    (2..=3).contains(&parts.len()) && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn split(line: &str) -> Vec<String> {
    line.split(',').map(|c| c.trim().to_string()).collect()
}

/// One value of a GPU row, with what an error about it must name.
struct Cell<'a> {
    col: &'a str,
    v: &'a str,
    line: usize,
    path: &'a Path,
}

impl Cell<'_> {
    fn err(&self, message: String) -> ParseError {
        ParseError::Query { path: self.path.to_path_buf(), line: self.line, message }
    }

    fn expected(&self, what: &str) -> ParseError {
        self.err(format!("column `{}`: expected {what}, found `{}`", self.col, self.v))
    }

    /// The number before an optional unit: `15360 MiB`, `70.00 W`, `0 %`.
    fn number(&self) -> &str {
        self.v.split_whitespace().next().unwrap_or(self.v)
    }

    fn int(&self, what: &str) -> Result<u64, ParseError> {
        self.number().parse::<u64>().map_err(|_| self.expected(what))
    }

    fn float(&self, what: &str) -> Result<f64, ParseError> {
        self.number().parse::<f64>().map_err(|_| self.expected(what))
    }

    /// Memory in MiB, as bytes.
    fn mib(&self) -> Result<u64, ParseError> {
        let n = self.int("memory in MiB")?;
        n.checked_mul(MIB).ok_or_else(|| self.err(format!("column `{}`: value `{}` is too large", self.col, self.v)))
    }

    fn small(&self, what: &str) -> Result<u32, ParseError> {
        let n = self.int(what)?;
        u32::try_from(n).map_err(|_| self.err(format!("column `{}`: value `{}` is too large", self.col, self.v)))
    }

    fn flag(&self, yes: &str, no: &str) -> Result<bool, ParseError> {
        if self.v.eq_ignore_ascii_case(yes) {
            Ok(true)
        } else if self.v.eq_ignore_ascii_case(no) {
            Ok(false)
        } else {
            Err(self.expected(&format!("`{yes}` or `{no}`")))
        }
    }

    /// Stores the value in the field its column names; other columns are allowed and ignored.
    fn store(&self, gpu: &mut Gpu, driver_version: &mut Option<String>) -> Result<(), ParseError> {
        let v = self.v;
        match self.col {
            "index" => gpu.index = self.small("a GPU index")?,
            "name" => gpu.name = Some(v.to_string()),
            "uuid" => gpu.uuid = Some(v.to_string()),
            "pci.bus_id" => gpu.pci_bus_id = Some(v.to_string()),
            "memory.total" => gpu.memory_total_bytes = Some(self.mib()?),
            "memory.used" => gpu.memory_used_bytes = Some(self.mib()?),
            "memory.free" => gpu.memory_free_bytes = Some(self.mib()?),
            "compute_cap" => {
                self.float("a compute capability like `8.0`")?;
                gpu.compute_capability = Some(v.to_string());
            }
            "pcie.link.gen.current" => gpu.pcie.gen_current = Some(self.small("a PCIe generation")?),
            "pcie.link.gen.max" => gpu.pcie.gen_max = Some(self.small("a PCIe generation")?),
            "pcie.link.width.current" => gpu.pcie.width_current = Some(self.small("a PCIe link width")?),
            "pcie.link.width.max" => gpu.pcie.width_max = Some(self.small("a PCIe link width")?),
            "driver_version" if !is_driver_version(v) => return Err(self.expected("a version like `550.54.15`")),
            "driver_version" => *driver_version = Some(v.to_string()),
            "mig.mode.current" => gpu.mig_enabled = Some(self.flag("Enabled", "Disabled")?),
            "persistence_mode" => gpu.persistence_mode = Some(self.flag("Enabled", "Disabled")?),
            "ecc.mode.current" => gpu.ecc_enabled = Some(self.flag("Enabled", "Disabled")?),
            "ecc.errors.uncorrected.volatile.total" => gpu.ecc_uncorrected_volatile = Some(self.int("an error count")?),
            "ecc.errors.uncorrected.aggregate.total" => {
                gpu.ecc_uncorrected_aggregate = Some(self.int("an error count")?)
            }
            "retired_pages.pending" => gpu.pending_page_retirement = Some(self.flag("Yes", "No")?),
            "temperature.gpu" => gpu.temperature_c = Some(self.small("degrees C")?),
            "power.draw" => gpu.power_draw_w = Some(self.float("watts")?),
            "power.limit" => gpu.power_limit_w = Some(self.float("watts")?),
            "utilization.gpu" => gpu.utilization_gpu_pct = Some(self.small("a percentage")?),
            "utilization.memory" => gpu.utilization_memory_pct = Some(self.small("a percentage")?),
            "clocks_throttle_reasons.active" | "clocks_event_reasons.active" => {
                let hex = v.trim_start_matches("0x").trim_start_matches("0X");
                let mask = u64::from_str_radix(hex, 16)
                    .map_err(|_| self.expected("a hex bitmask like `0x0000000000000004`"))?;
                gpu.throttle_reasons = Some(throttle_names(mask));
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<QueryTable, ParseError> {
        parse(text, Path::new("q.csv"))
    }

    const HEADER: &str = "index, name, uuid, pci.bus_id, memory.total [MiB], memory.used [MiB], memory.free [MiB], compute_cap, pcie.link.gen.current, pcie.link.gen.max, pcie.link.width.current, pcie.link.width.max, driver_version";

    #[test]
    fn with_header_and_units() {
        let text = format!(
            "{HEADER}\n0, Tesla T4, GPU-1d2a, 00000000:00:04.0, 15360 MiB, 0 MiB, 14930 MiB, 7.5, 1, 3, 16, 16, 535.183.01\n"
        );
        let t = p(&text).expect("parses");
        let g = &t.gpus[0];
        assert_eq!(g.name.as_deref(), Some("Tesla T4"));
        assert_eq!(g.memory_total_bytes, Some(15360 * MIB));
        assert_eq!(g.memory_free_bytes, Some(14930 * MIB));
        assert_eq!(g.pcie.gen_current, Some(1));
        assert_eq!(g.compute_capability_pair(), Some((7, 5)));
        assert_eq!(t.driver_version.as_deref(), Some("535.183.01"));
        assert_eq!(t.lines, vec![2]);
    }

    #[test]
    fn noheader_nounits_and_na() {
        let text = "0, NVIDIA A100-SXM4-80GB, GPU-aa, 00000000:07:00.0, 81920, 4, 81050, 8.0, 4, 4, 16, 16, 550.54.15\n\
1, NVIDIA A100-SXM4-80GB, GPU-bb, 00000000:0F:00.0, 81920, [N/A], [N/A], 8.0, [N/A], 4, [N/A], 16, 550.54.15\n";
        let t = p(text).expect("parses");
        assert_eq!(t.gpus.len(), 2);
        assert_eq!(t.gpus[0].memory_used_bytes, Some(4 * MIB));
        assert_eq!(t.gpus[1].memory_free_bytes, None);
        assert_eq!(t.gpus[1].pcie.width_current, None);
        assert_eq!(t.gpus[1].pcie.width_max, Some(16));
    }

    #[test]
    fn extra_columns() {
        let text = "index, name, memory.free [MiB], mig.mode.current, clocks_throttle_reasons.active, power.draw [W], ecc.errors.uncorrected.volatile.total, retired_pages.pending, some.other\n\
0, NVIDIA A100-PCIE-40GB, 40000 MiB, Enabled, 0x0000000000000048, 35.50 W, 2, Yes, x\n";
        let g = &p(text).expect("parses").gpus[0];
        assert_eq!(g.mig_enabled, Some(true));
        assert_eq!(
            g.throttle_reasons.as_deref(),
            Some(&["hw_slowdown".to_string(), "hw_thermal_slowdown".to_string()][..])
        );
        assert_eq!(g.power_draw_w, Some(35.5));
        assert_eq!(g.ecc_uncorrected_volatile, Some(2));
        assert_eq!(g.pending_page_retirement, Some(true));
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(p("").expect_err("empty").to_string(), "q.csv:1: expected at least one GPU row");
        let short = format!("{HEADER}\n0, Tesla T4, GPU-1\n");
        let msg = p(&short).expect_err("short").to_string();
        assert!(msg.starts_with("q.csv:2: expected 13 comma-separated values (index, name, uuid,"), "{msg}");
        assert!(msg.ends_with("found 3"), "{msg}");
        let bad_mem = format!("{HEADER}\n0, Tesla T4, GPU-1, 0:4.0, lots, 0, 0, 7.5, 1, 3, 16, 16, 535.183.01\n");
        assert_eq!(
            p(&bad_mem).expect_err("mem").to_string(),
            "q.csv:2: column `memory.total`: expected memory in MiB, found `lots`"
        );
        let bad_index = "x, Tesla T4, GPU-1, 0:4.0, 1, 0, 0, 7.5, 1, 3, 16, 16, 535.183.01\n";
        assert_eq!(
            p(bad_index).expect_err("index").to_string(),
            "q.csv:1: column `index`: expected a GPU index, found `x`"
        );
        let dup = "0, T4, G, B, 1, 0, 0, 7.5, 1, 3, 16, 16, 535.183.01\n0, T4, G, B, 1, 0, 0, 7.5, 1, 3, 16, 16, 535.183.01\n";
        assert_eq!(p(dup).expect_err("dup").to_string(), "q.csv:2: column `index`: GPU 0 appears twice");
        let no_index = "name, memory.total\nT4, 1\n";
        assert!(p(no_index).expect_err("no index").to_string().starts_with(
            "q.csv:1: the header lacks `index`, which names each GPU: run `nvidia-smi --query-gpu=index,name,"
        ));
    }

    /// Values no GPU reports: more free or used memory than the total, a count of MiB whose
    /// bytes overflow, a driver version cut off mid-value.
    #[test]
    fn impossible_values_are_refused() {
        let row = |total: &str, used: &str, free: &str, driver: &str| {
            format!("{HEADER}\n0, A100, G, B, {total} MiB, {used} MiB, {free} MiB, 8.0, 4, 4, 16, 16, {driver}\n")
        };
        assert_eq!(
            p(&row("81920", "4", "999999", "550.54.15")).expect_err("free").to_string(),
            "q.csv:2: column `memory.free`: 999999 MiB exceeds memory.total, 81920 MiB"
        );
        assert_eq!(
            p(&row("81920", "81921", "0", "550.54.15")).expect_err("used").to_string(),
            "q.csv:2: column `memory.used`: 81921 MiB exceeds memory.total, 81920 MiB"
        );
        assert_eq!(
            p(&row("81920", "4", "17592186044416", "550.54.15")).expect_err("overflow").to_string(),
            "q.csv:2: column `memory.free`: value `17592186044416 MiB` is too large"
        );
        assert_eq!(
            p(&row("81920", "4", "81000", "55")).expect_err("driver").to_string(),
            "q.csv:2: column `driver_version`: expected a version like `550.54.15`, found `55`"
        );
        for ok in ["535.104", "550.54.15"] {
            assert_eq!(p(&row("81920", "4", "81000", ok)).expect("parses").driver_version.as_deref(), Some(ok));
        }
    }

    #[test]
    fn byte_order_mark_and_nvsmi_log() {
        let t =
            p(&format!("\u{feff}{HEADER}\n0, T4, G, B, 15360 MiB, 0 MiB, 14930 MiB, 7.5, 1, 3, 16, 16, 535.183.01\n"))
                .expect("a BOM is skipped");
        assert_eq!(t.gpus[0].name.as_deref(), Some("T4"));
        let log = "\n==============NVSMI LOG==============\n\nTimestamp : Tue Mar  4 10:12:01 2025\n";
        let msg = p(log).expect_err("nvidia-smi -q").to_string();
        assert!(
            msg.starts_with(
                "q.csv:2: this is `nvidia-smi -q` output; --query reads the CSV of `nvidia-smi --query-gpu=index,"
            ),
            "{msg}"
        );
        assert!(msg.ends_with(",driver_version --format=csv`"), "{msg}");
    }
}
