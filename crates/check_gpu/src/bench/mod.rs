//! `check-gpu --bench`: what the plan assumes, measured. The collectives run in `dpo-train`
//! (the c10d process group training uses: NCCL on GPUs, Gloo on CPU processes), which prints one
//! [`Bench`] as JSON; check-gpu runs it ([`run`]), compares it with the link's nominal peak
//! ([`peak`]) and the planner turns it into a communication time per optimizer step.
//!
//! Bandwidths follow nccl-tests (`doc/PERFORMANCE.md` and `src/*.cu`'s `GetBw` functions):
//! `algbw = S / t` in GB/s (1e9 bytes), and `busbw = algbw × 2(n−1)/n` for all-reduce,
//! `algbw × (n−1)/n` for all-gather and reduce-scatter, where `S` is the whole array (the
//! all-reduce buffer, the gathered output, the scattered input). Bus bandwidth is comparable
//! with the hardware's per-direction peak whatever the number of ranks.

pub mod run;

use serde::{Deserialize, Serialize};

/// Bytes per GB in every bandwidth here (nccl-tests divides by 1.0E9).
const GB: f64 = 1e9;
/// Smallest size measured unless the largest is smaller (nccl-tests' range starts lower, but
/// below 1 MiB the time is latency, not bandwidth, and gradients travel in 25 MiB buckets).
pub const DEFAULT_MIN_BYTES: u64 = 1 << 20;
/// Largest size measured on GPUs (1 GiB, past where NCCL's bus bandwidth levels off).
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// Largest size measured over CPU processes: Gloo moves about 1 GB/s, so 1 GiB buffers (and
/// all-gather's N of them per process) would take minutes and several GiB of memory.
pub const DEFAULT_CPU_MAX_BYTES: u64 = 64 << 20;
/// The largest size `--bench-max-bytes` accepts.
pub const MAX_BENCH_BYTES: u64 = 64 << 30;
/// DDP's gradient bucket (`bucket_cap_mb=25`), which dpo-train's `sum_grads` uses too: the
/// message size that gradient all-reduces actually have.
pub const GRADIENT_BUCKET_BYTES: u64 = 25 << 20;

/// A collective measured, with nccl-tests' bus-bandwidth factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
}

impl Collective {
    /// Every collective, in the order they are measured and shown.
    pub const ALL: [Collective; 3] = [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter];

    /// `all_reduce`, `all_gather`, `reduce_scatter`.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
        }
    }

    /// `busbw / algbw` for `world_size` ranks: each element crosses `2(n−1)` links in an
    /// all-reduce (n−1 additions, n−1 copies) over `n` links in parallel, half of that in the
    /// other two. 0 for fewer than two ranks (nothing crosses a link).
    pub fn bus_factor(self, world_size: usize) -> f64 {
        if world_size < 2 {
            return 0.0;
        }
        let n = world_size as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter => (n - 1.0) / n,
        }
    }
}

/// One (collective, size) point. `bytes` follows nccl-tests' "size": the whole buffer
/// (all_reduce), the gathered output (all_gather), the scattered input (reduce_scatter).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub op: Collective,
    #[serde(deserialize_with = "at_least_one")]
    pub bytes: u64,
    /// Mean time per call, in seconds.
    #[serde(deserialize_with = "a_time")]
    pub seconds: f64,
    /// Every rank's result equalled the expected values.
    pub correct: bool,
}

/// A count read back (a snapshot's): 0 bytes or ranks measured nothing, and the plan must not
/// divide by it. serde_json places the error at the value.
fn at_least_one<'de, D: serde::Deserializer<'de>, T: Deserialize<'de> + PartialOrd + From<u8> + std::fmt::Display>(
    d: D,
) -> Result<T, D::Error> {
    let n = T::deserialize(d)?;
    match n >= T::from(1) {
        true => Ok(n),
        false => Err(serde::de::Error::custom(format!("a count of bytes or ranks must be at least 1, found {n}"))),
    }
}

/// A measured time read back: a positive, finite number of seconds.
fn a_time<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let s = f64::deserialize(d)?;
    match s > 0.0 && s.is_finite() {
        true => Ok(s),
        false => Err(serde::de::Error::custom(format!("`seconds` must be a time above 0, found {s}"))),
    }
}

impl Measurement {
    /// Algorithm bandwidth `bytes / seconds` in GB/s (1e9 bytes); 0 for a time that is not a
    /// positive number (a broken measurement must not show as infinitely fast).
    pub fn algbw(&self) -> f64 {
        if self.seconds > 0.0 && self.seconds.is_finite() { self.bytes as f64 / self.seconds / GB } else { 0.0 }
    }

    /// Bus bandwidth in GB/s: `algbw × bus_factor(world_size)`.
    pub fn busbw(&self, world_size: usize) -> f64 {
        self.algbw() * self.op.bus_factor(world_size)
    }
}

/// One device's own speeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceSpeed {
    /// `cuda:0`, `cpu`.
    pub device: String,
    /// Device-to-device copy: bytes copied per second (each byte is read once and written once),
    /// in GB/s (1e9 bytes).
    pub copy_gbps: f64,
    /// Dense matrix multiply throughput, 1e12 floating-point operations per second (`2·m·n·k`
    /// per product).
    pub matmul_tflops: f64,
    /// The matmul's element type, e.g. `bf16`.
    pub matmul_dtype: String,
}

/// What `dpo-train bench-comm` prints: one JSON object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bench {
    /// `nccl` or `gloo`.
    pub backend: String,
    #[serde(deserialize_with = "at_least_one")]
    pub world_size: usize,
    /// One entry per rank, in rank order.
    pub devices: Vec<DeviceSpeed>,
    pub collectives: Vec<Measurement>,
}

impl Bench {
    /// The measurements of one collective, in size order.
    pub fn of(&self, op: Collective) -> Vec<&Measurement> {
        let mut v: Vec<&Measurement> = self.collectives.iter().filter(|m| m.op == op).collect();
        v.sort_by_key(|m| m.bytes);
        v
    }

    /// The measurement of `op` whose size is nearest `bytes` on a log scale (sizes grow ×4).
    pub fn nearest(&self, op: Collective, bytes: u64) -> Option<&Measurement> {
        let distance = |m: &&Measurement| (m.bytes.max(1) as f64 / bytes.max(1) as f64).ln().abs();
        self.of(op).into_iter().min_by(|a, b| distance(a).total_cmp(&distance(b)))
    }

    /// Bus bandwidth of `op` at the measured size nearest `bytes`, in GB/s.
    pub fn busbw_at(&self, op: Collective, bytes: u64) -> Option<f64> {
        self.nearest(op, bytes).map(|m| m.busbw(self.world_size))
    }

    /// The highest bus bandwidth of `op` over all sizes, in GB/s.
    pub fn peak_busbw(&self, op: Collective) -> Option<f64> {
        self.of(op).iter().map(|m| m.busbw(self.world_size)).max_by(f64::total_cmp)
    }

    /// The measurement of `op` at its largest size.
    pub fn largest(&self, op: Collective) -> Option<&Measurement> {
        self.of(op).into_iter().last()
    }

    /// Checks what the measuring side reported before anything is computed from it.
    pub fn validate(&self, expected_world_size: usize) -> Result<(), String> {
        if self.world_size != expected_world_size {
            return Err(format!("reported world size {}, expected {expected_world_size}", self.world_size));
        }
        if self.collectives.is_empty() {
            return Err("reported no collective measurement".to_string());
        }
        if let Some(m) = self.collectives.iter().find(|m| !(m.seconds > 0.0 && m.seconds.is_finite())) {
            return Err(format!("reported {} at {} bytes taking {} s", m.op.name(), m.bytes, m.seconds));
        }
        Ok(())
    }
}

/// A bench as check-gpu keeps it in a snapshot: the result and which GPUs it measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    /// Indices (NVML, PCI bus order) of the GPUs measured, in rank order; empty for CPU processes.
    pub gpus: Vec<u32>,
    #[serde(flatten)]
    pub bench: Bench,
}

/// The sizes measured: `min`, ×4, ... while below `max`, then `max` itself, so the largest size
/// measured is always the one asked for (1 MiB..1 GiB gives 1, 4, 16, 64, 256 MiB and 1 GiB;
/// 1 MiB..512 MiB ends 256 MiB, 512 MiB). A `min` above `max` measures `max` alone; 0 counts
/// as 1. The measuring side may round a size down to a multiple of `world_size ×` the element
/// size; `Measurement::bytes` is what it actually moved.
pub fn sizes(min_bytes: u64, max_bytes: u64) -> Vec<u64> {
    let max = max_bytes.max(1);
    let mut size = min_bytes.clamp(1, max);
    let mut v = Vec::new();
    while size < max {
        v.push(size);
        size = size.saturating_mul(4);
    }
    v.push(max);
    v
}

/// Parses a byte count: `1073741824`, `256M`, `1G`, `512MiB`, `64k` (binary units, as
/// nccl-tests' `-b`/`-e` read them), from 1 byte to [`MAX_BENCH_BYTES`].
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let err = || format!("invalid size `{text}`: expected bytes such as `1073741824`, `256M` or `1G` (binary units)");
    let t = text.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(err()),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let value: f64 = digits.trim().parse().map_err(|_| err())?;
    let bytes = (value * (1u64 << shift) as f64).round();
    if !(1.0..=MAX_BENCH_BYTES as f64).contains(&bytes) {
        return Err(format!("size `{text}` is out of range: expected 1 byte to 64G"));
    }
    Ok(bytes as u64)
}

/// `1 MiB`, `256 MiB`, `1 GiB`, `512 B`: sizes of the table, exact when they are whole units.
pub fn size_label(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    if bytes >= 1 << 20 { format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64) } else { format!("{bytes} B") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(op: Collective, bytes: u64, seconds: f64) -> Measurement {
        Measurement { op, bytes, seconds, correct: true }
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// Factors from nccl-tests' PERFORMANCE.md summary: AllReduce 2(n−1)/n, ReduceScatter and
    /// AllGather (n−1)/n.
    #[test]
    fn bus_factors() {
        assert_eq!(Collective::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(8), 1.75);
        assert_eq!(Collective::AllGather.bus_factor(8), 0.875);
        assert_eq!(Collective::ReduceScatter.bus_factor(4), 0.75);
        assert_eq!(Collective::AllReduce.bus_factor(1), 0.0);
        assert_eq!(Collective::AllReduce.name(), "all_reduce");
        assert_eq!(serde_json::to_string(&Collective::ReduceScatter).expect("json"), "\"reduce_scatter\"");
    }

    /// Worked by hand with nccl-tests' `GetBw`: `S / 1e9 / t`, times the factor.
    #[test]
    fn bandwidths_worked_by_hand() {
        // 1 GiB all-reduce over 8 GPUs in 10 ms: 1073741824 / 1e9 / 0.01 = 107.3741824 GB/s,
        // × 14/8 = 187.9048192 GB/s.
        let ar = m(Collective::AllReduce, 1 << 30, 0.01);
        assert!(close(ar.algbw(), 107.374_182_4, 1e-9), "{}", ar.algbw());
        assert!(close(ar.busbw(8), 187.904_819_2, 1e-9), "{}", ar.busbw(8));
        // The sendrecv line of an 8×A100 nccl-tests run (1073741824 B, 5503.4 us, algbw 195.10):
        // factor 1, so algbw is all there is to check. Its time is printed to 0.1 us and algbw to
        // 0.01 GB/s, so the two agree to 0.01.
        let sr = m(Collective::AllGather, 1_073_741_824, 5503.4e-6);
        assert!(close(sr.algbw(), 195.10, 0.01), "{}", sr.algbw());
        // 64 MiB all-gather output over 4 ranks in 2 ms: 33.554432 GB/s, × 3/4 = 25.165824.
        let ag = m(Collective::AllGather, 64 << 20, 0.002);
        assert!(close(ag.busbw(4), 25.165_824, 1e-9), "{}", ag.busbw(4));
        // A time that is not positive reads as no bandwidth, not infinity.
        assert_eq!(m(Collective::AllReduce, 1, 0.0).algbw(), 0.0);
        assert_eq!(m(Collective::AllReduce, 1, f64::NAN).busbw(2), 0.0);
    }

    #[test]
    fn size_ladder() {
        let mib = 1u64 << 20;
        assert_eq!(
            sizes(DEFAULT_MIN_BYTES, DEFAULT_MAX_BYTES),
            vec![mib, 4 * mib, 16 * mib, 64 * mib, 256 * mib, 1024 * mib]
        );
        assert_eq!(sizes(mib, 512 * mib), vec![mib, 4 * mib, 16 * mib, 64 * mib, 256 * mib, 512 * mib]);
        assert_eq!(sizes(mib, 1000), vec![1000]);
        assert_eq!(sizes(0, 3), vec![1, 3]);
        assert_eq!(sizes(5, 5), vec![5]);
        assert_eq!(sizes(1, u64::MAX).last(), Some(&u64::MAX), "no overflow at the top");
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("256M"), Ok(256 << 20));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("64k"), Ok(64 << 10));
        assert_eq!(parse_bytes("1.5G"), Ok(3 << 29));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("100B"), Ok(100));
        assert!(parse_bytes("lots").expect_err("bad").starts_with("invalid size `lots`: expected bytes"));
        assert!(parse_bytes("1X").is_err());
        assert!(parse_bytes("-1M").expect_err("negative").contains("out of range"));
        assert!(parse_bytes("65G").expect_err("too big").contains("out of range"));
        assert!(parse_bytes("0").is_err());
        assert_eq!(size_label(1 << 30), "1 GiB");
        assert_eq!(size_label(25 << 20), "25 MiB");
        assert_eq!(size_label(1000), "1000 B");
    }

    #[test]
    fn nearest_size_and_peaks() {
        let mib = 1u64 << 20;
        let b = Bench {
            backend: "nccl".into(),
            world_size: 2,
            devices: Vec::new(),
            collectives: vec![
                m(Collective::AllReduce, 64 * mib, 0.004),
                m(Collective::AllReduce, 16 * mib, 0.002),
                m(Collective::AllGather, 16 * mib, 0.001),
            ],
        };
        // 25 MiB is nearer 16 MiB than 64 MiB on a log scale (25/16 = 1.56 < 64/25 = 2.56).
        assert_eq!(b.nearest(Collective::AllReduce, GRADIENT_BUCKET_BYTES).map(|m| m.bytes), Some(16 * mib));
        assert!(close(b.busbw_at(Collective::AllReduce, 25 * mib).expect("bw"), 16.0 * mib as f64 / 0.002 / GB, 1e-9));
        assert!(close(b.peak_busbw(Collective::AllReduce).expect("peak"), 64.0 * mib as f64 / 0.004 / GB, 1e-9));
        assert_eq!(b.largest(Collective::AllReduce).map(|m| m.bytes), Some(64 * mib));
        assert_eq!(b.busbw_at(Collective::ReduceScatter, mib), None);
        assert_eq!(b.validate(2), Ok(()));
        assert_eq!(b.validate(4), Err("reported world size 2, expected 4".to_string()));
        let bad = Bench { collectives: vec![m(Collective::AllGather, 8, 0.0)], ..b };
        assert_eq!(bad.validate(2), Err("reported all_gather at 8 bytes taking 0 s".to_string()));
    }
}
