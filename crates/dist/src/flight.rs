//! The flight recorder: each rank's latest collective — step, phase, operation, bucket, bytes —
//! written down before the collective starts and again when it returns, so that a job that stops
//! making progress can say which rank stopped where (torch's `TORCH_NCCL_TRACE_BUFFER_SIZE`
//! flight recorder keeps the same facts, for NCCL only).
//!
//! A rank keeps its latest [`Record`] in memory (its own errors quote it) and, when the launcher
//! names a directory in [`DIR_VAR`], also in `rank-<N>` there: one fixed-width line overwritten in
//! place, which the launcher reads when a rank fails or freezes ([`super::launcher`]). A worker that
//! torchrun or SLURM started has no such directory, and reports only its own record.
//!
//! On CUDA a collective returns once NCCL has enqueued it: its record then says "issued", not
//! "left", since whether the kernel completed is unknown here; one that never completes is
//! torch's NCCL watchdog's to end (after the same timeout).

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

/// The variable that names the directory of the ranks' record files.
pub const DIR_VAR: &str = "DPO_TRAIN_FLIGHT_DIR";
/// The width of a record line on disk: rewritten in place, so it never leaves a longer old tail.
const WIDTH: usize = 200;
/// The first field of a record line: the format's version.
const VERSION: &str = "flight1";

/// Where a rank stands relative to its latest collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Entered, not returned: waiting on the peers (or working).
    Entering,
    /// Returned successfully.
    Left,
    /// Handed to an asynchronous backend (NCCL) that has not said whether it completed.
    Issued,
    /// Returned with an error (a timeout, a lost peer).
    Failed,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Entering => "entering",
            State::Left => "left",
            State::Issued => "issued",
            State::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [State::Entering, State::Left, State::Issued, State::Failed].into_iter().find(|st| st.as_str() == s)
    }
}

/// One rank's latest collective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub state: State,
    /// The optimizer step being run (1-based, as the logs count them); 0 before the first.
    pub step: u64,
    /// What the collective is for: "gradient sync", "metrics", "evaluation", ...
    pub phase: String,
    /// c10d's name for it: `all_reduce`, `broadcast`, `all_gather`, `barrier`, `rendezvous`.
    pub op: String,
    /// The bucket, 1-based, and the number of buckets of a bucketed call; 0 of 0 otherwise.
    pub bucket: usize,
    pub buckets: usize,
    /// Payload of this call on this rank.
    pub bytes: u64,
    /// Milliseconds of [`now_ms`]'s clock when the collective was entered, and when the state
    /// last changed.
    pub entered_ms: u64,
    pub changed_ms: u64,
}

impl Record {
    /// "all_reduce bucket 3/7 of step 41 (gradient sync, 25.0 MB)".
    pub fn place(&self) -> String {
        let bucket = if self.buckets > 0 { format!(" bucket {}/{}", self.bucket, self.buckets) } else { String::new() };
        let when = if self.step > 0 { format!("step {}", self.step) } else { "setup".to_owned() };
        let size = if self.bytes > 0 { format!(", {}", mega(self.bytes)) } else { String::new() };
        if self.op == "rendezvous" {
            return "the rendezvous".to_owned();
        }
        format!("{}{bucket} of {when} ({}{size})", self.op, self.phase)
    }

    /// Seconds from entering to the last change (a finished or failed call) or to `now_ms`.
    pub fn waited(&self, now_ms: u64) -> Duration {
        let until = if self.state == State::Entering { now_ms } else { self.changed_ms };
        Duration::from_millis(until.saturating_sub(self.entered_ms))
    }

    fn line(&self) -> String {
        let fields = [
            VERSION.to_owned(),
            self.state.as_str().to_owned(),
            self.step.to_string(),
            self.phase.clone(),
            self.op.clone(),
            self.bucket.to_string(),
            self.buckets.to_string(),
            self.bytes.to_string(),
            self.entered_ms.to_string(),
            self.changed_ms.to_string(),
        ];
        let mut line = fields.join("\t");
        line.truncate(WIDTH - 1);
        format!("{line:<width$}\n", width = WIDTH - 1)
    }

    /// The record in a `rank-<N>` file's text, if it holds a complete one.
    pub fn parse(text: &str) -> Option<Self> {
        let f: Vec<&str> = text.trim_end().split('\t').collect();
        if f.len() != 10 || f[0] != VERSION {
            return None;
        }
        Some(Self {
            state: State::parse(f[1])?,
            step: f[2].parse().ok()?,
            phase: f[3].to_owned(),
            op: f[4].to_owned(),
            bucket: f[5].parse().ok()?,
            buckets: f[6].parse().ok()?,
            bytes: f[7].parse().ok()?,
            entered_ms: f[8].parse().ok()?,
            changed_ms: f[9].parse().ok()?,
        })
    }

    /// Reads rank `rank`'s record from `dir`; `None` when the rank never wrote one.
    pub fn read(dir: &Path, rank: usize) -> Option<Self> {
        let read = || std::fs::read_to_string(file_name(dir, rank)).ok().as_deref().and_then(Self::parse);
        // A read that meets the rank's rewrite half-way fails to parse: the next one does not.
        read().or_else(read)
    }
}

/// `1.2 MB`, `25.0 MB`, `4 kB`: decimal units, as nccl-tests and `ls -h --si`.
fn mega(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000 => format!("{:.1} MB", b as f64 / 1e6),
        b if b >= 1_000 => format!("{:.0} kB", b as f64 / 1e3),
        b => format!("{b} B"),
    }
}

fn file_name(dir: &Path, rank: usize) -> std::path::PathBuf {
    dir.join(format!("rank-{rank}"))
}

/// Milliseconds of `CLOCK_BOOTTIME`: one clock for every process of a node (the launcher compares
/// the ranks' records with it) that no wall-clock step can move.
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1000 + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000
}

/// A rank's recorder. Not `Sync`: one thread issues a rank's collectives, in order.
#[derive(Debug)]
pub struct FlightRecorder {
    file: Option<File>,
    /// Whether records go to the file (a benchmark's timed loop keeps them in memory only).
    to_file: Cell<bool>,
    step: Cell<u64>,
    phase: Cell<&'static str>,
    last: RefCell<Option<Record>>,
}

impl FlightRecorder {
    /// Rank `rank`'s recorder, writing to the directory in [`DIR_VAR`] when it is set and usable
    /// (the record is a diagnostic: a directory that cannot be written only keeps it in memory).
    pub fn from_env(rank: usize) -> Self {
        let dir = std::env::var_os(DIR_VAR).filter(|d| !d.is_empty());
        let file = dir.and_then(|d| File::create(file_name(Path::new(&d), rank)).ok());
        Self { file, to_file: Cell::new(true), step: Cell::new(0), phase: Cell::new("setup"), last: RefCell::new(None) }
    }

    /// Sets the step and phase the next collectives belong to.
    pub fn set_context(&self, step: u64, phase: &'static str) {
        self.step.set(step);
        self.phase.set(phase);
    }

    /// Sets the phase, keeping the step.
    pub fn set_phase(&self, phase: &'static str) {
        self.phase.set(phase);
    }

    /// Records entering `op` (bucket `bucket` of `buckets`, 0 of 0 when not bucketed).
    pub fn enter(&self, op: &'static str, (bucket, buckets): (usize, usize), bytes: u64) {
        let now = now_ms();
        let record = Record {
            state: State::Entering,
            step: self.step.get(),
            phase: self.phase.get().to_owned(),
            op: op.to_owned(),
            bucket,
            buckets,
            bytes,
            entered_ms: now,
            changed_ms: now,
        };
        self.store(record);
    }

    /// Records that the latest collective returned: `Left`, `Issued` (asynchronous) or `Failed`.
    pub fn leave(&self, state: State) {
        let record = self.last.borrow().clone();
        if let Some(mut record) = record {
            record.state = state;
            record.changed_ms = now_ms();
            self.store(record);
        }
    }

    /// Whether records also go to the file (on by default).
    pub fn write_to_file(&self, on: bool) {
        self.to_file.set(on);
    }

    /// The latest record.
    pub fn last(&self) -> Option<Record> {
        self.last.borrow().clone()
    }

    fn store(&self, record: Record) {
        if let Some(file) = self.file.as_ref().filter(|_| self.to_file.get()) {
            // One positioned write of one line: a reader sees the old line or the new one. A
            // failed write loses only the on-disk copy.
            let _ = file.write_at(record.line().as_bytes(), 0);
        }
        *self.last.borrow_mut() = Some(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_its_file_and_says_where_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(file_name(dir.path(), 1)).unwrap();
        let rec = FlightRecorder {
            file: Some(file),
            to_file: Cell::new(true),
            step: Cell::new(0),
            phase: Cell::new("x"),
            last: RefCell::new(None),
        };
        assert_eq!(Record::read(dir.path(), 1), None, "an empty file is no record");
        rec.set_context(41, "gradient sync");
        rec.enter("all_reduce", (3, 7), 25_000_000);
        let entering = Record::read(dir.path(), 1).unwrap();
        assert_eq!(entering.state, State::Entering);
        assert_eq!(entering.place(), "all_reduce bucket 3/7 of step 41 (gradient sync, 25.0 MB)");
        assert_eq!(Some(entering.clone()), rec.last());
        rec.leave(State::Failed);
        let failed = Record::read(dir.path(), 1).unwrap();
        assert_eq!((failed.state, failed.entered_ms), (State::Failed, entering.entered_ms));
        assert_eq!(std::fs::read(file_name(dir.path(), 1)).unwrap().len(), WIDTH);
        // A shorter record overwrites a longer one completely.
        rec.set_context(0, "initial broadcast");
        rec.enter("barrier", (0, 0), 0);
        assert_eq!(Record::read(dir.path(), 1).unwrap().place(), "barrier of setup (initial broadcast)");
        assert_eq!(Record::read(dir.path(), 2), None);
    }

    #[test]
    fn waiting_time_runs_until_the_state_changes() {
        let rec = Record {
            state: State::Entering,
            step: 2,
            phase: "metrics".into(),
            op: "all_reduce".into(),
            bucket: 0,
            buckets: 0,
            bytes: 16,
            entered_ms: 1_000,
            changed_ms: 1_000,
        };
        assert_eq!(rec.waited(31_000), Duration::from_secs(30));
        assert_eq!(rec.place(), "all_reduce of step 2 (metrics, 16 B)");
        let failed = Record { state: State::Failed, changed_ms: 11_000, ..rec };
        assert_eq!(failed.waited(99_000), Duration::from_secs(10));
        assert_eq!(Record::parse("flight1\tentering\t1"), None);
    }
}
