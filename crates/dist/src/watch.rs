//! The launcher's view of a job that stops making progress: whether each worker is running,
//! stopped or gone (`/proc/<pid>/stat`), where its flight record ([`super::flight`]) last saw it,
//! and the one line per rank printed when the job ends badly.
//!
//! c10d ends a collective that waits longer than the timeout (`ddp_timeout`) on its own; the
//! watchdog here covers what it cannot see: a rank frozen (SIGSTOP, a stopped container) for that
//! long, and a rank stuck in one collective past it.

use std::path::Path;
use std::time::{Duration, Instant};

use super::flight::{Record, State, now_ms};

/// How often the watchdog reads the flight records.
const RECORD_POLL: Duration = Duration::from_secs(1);
/// How long past the timeout a rank may sit in one collective before the launcher ends the job:
/// c10d's own timeout fires first and says more.
const COLLECTIVE_GRACE: Duration = Duration::from_secs(5);

/// Whether a worker process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Running,
    /// Stopped by a signal (SIGSTOP, SIGTSTP) or held by a debugger.
    Stopped,
    /// Exited: `exit code 1`, `killed by signal 9`.
    Exited(String),
}

/// Whether the live process `pid` is stopped: state `T` or `t` in `/proc/<pid>/stat` (the field
/// after the parenthesised command name, which may itself hold spaces and parentheses).
pub fn is_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next());
    matches!(state, Some('T' | 't'))
}

/// One rank's line in the report: where it is and what it is doing.
pub fn rank_line(rank: usize, live: &Liveness, record: Option<&Record>, now_ms: u64) -> String {
    let Some(record) = record else {
        let what = match live {
            Liveness::Running => "running, has not reached the rendezvous".to_owned(),
            Liveness::Stopped => "stopped before reaching the rendezvous".to_owned(),
            Liveness::Exited(how) => format!("exited ({how}) before reaching the rendezvous"),
        };
        return format!("rank {rank}: {what}");
    };
    let (place, secs) = (record.place(), record.waited(now_ms).as_secs());
    let since_left = now_ms.saturating_sub(record.changed_ms) / 1000;
    let what = match (record.state, live) {
        (State::Entering, Liveness::Running) => format!("waiting in {place} for {secs} s"),
        (State::Entering, Liveness::Stopped) => format!("stopped, last seen entering {place}"),
        (State::Entering, Liveness::Exited(how)) => format!("exited ({how}) while in {place}"),
        (State::Left, Liveness::Running) => format!("running, {since_left} s since it left {place}"),
        (State::Left, Liveness::Stopped) => format!("stopped, last seen leaving {place}"),
        (State::Left, Liveness::Exited(how)) => format!("exited ({how}), last seen leaving {place}"),
        (State::Issued, Liveness::Running) => format!("running, {since_left} s since it issued {place} to NCCL"),
        (State::Issued, Liveness::Stopped) => format!("stopped, last seen issuing {place} to NCCL"),
        (State::Issued, Liveness::Exited(how)) => format!("exited ({how}), last seen issuing {place} to NCCL"),
        (State::Failed, Liveness::Exited(how)) => format!("gave up after waiting {secs} s in {place} ({how})"),
        (State::Failed, _) => format!("gave up after waiting {secs} s in {place}"),
    };
    format!("rank {rank}: {what}")
}

/// The report: one line per rank of this node, in rank order.
pub fn report(dir: &Path, ranks: &[(usize, Liveness)]) -> Vec<String> {
    let now = now_ms();
    ranks.iter().map(|(rank, live)| rank_line(*rank, live, Record::read(dir, *rank).as_ref(), now)).collect()
}

/// Notices a worker frozen for the timeout, or one stuck in a collective past it.
#[derive(Debug)]
pub struct Watchdog {
    timeout: Duration,
    /// Per worker: since when it has been seen stopped.
    stopped_since: Vec<Option<Instant>>,
    next_records: Instant,
}

impl Watchdog {
    pub fn new(workers: usize, timeout: Duration) -> Self {
        Self { timeout, stopped_since: vec![None; workers], next_records: Instant::now() + RECORD_POLL }
    }

    /// Why the job must end now, if it must: `ranks` holds each running worker's index, rank
    /// and pid.
    pub fn check(&mut self, dir: &Path, ranks: &[(usize, usize, u32)]) -> Option<String> {
        let now = Instant::now();
        for &(index, rank, pid) in ranks {
            let slot = &mut self.stopped_since[index];
            *slot = if is_stopped(pid) { Some(slot.unwrap_or(now)) } else { None };
            if slot.is_some_and(|since| now - since >= self.timeout) {
                return Some(format!("rank {rank} has been stopped for {} s (ddp_timeout)", self.timeout.as_secs()));
            }
        }
        if now < self.next_records {
            return None;
        }
        self.next_records = now + RECORD_POLL;
        // Saturating: `--timeout` takes any u64 of seconds.
        let limit = self.timeout.saturating_add(COLLECTIVE_GRACE);
        let unix_now = now_ms();
        ranks.iter().find_map(|&(_, rank, _)| {
            // A rendezvous may take the timeout twice (connecting, then waiting for the others);
            // c10d ends it and names the missing ranks.
            let record = Record::read(dir, rank).filter(|r| r.state == State::Entering && r.op != "rendezvous")?;
            (record.waited(unix_now) >= limit).then(|| {
                format!("rank {rank} has waited in {} for {} s", record.place(), record.waited(unix_now).as_secs())
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: State) -> Record {
        Record {
            state,
            step: 41,
            phase: "gradient sync".into(),
            op: "all_reduce".into(),
            bucket: 3,
            buckets: 7,
            bytes: 2_000_000,
            entered_ms: 10_000,
            changed_ms: 12_000,
        }
    }

    #[test]
    fn each_rank_says_where_it_is() {
        let now = 40_000;
        let line = |live: Liveness, state: Option<State>| rank_line(1, &live, state.map(record).as_ref(), now);
        let place = "all_reduce bucket 3/7 of step 41 (gradient sync, 2.0 MB)";
        assert_eq!(
            line(Liveness::Stopped, Some(State::Entering)),
            format!("rank 1: stopped, last seen entering {place}")
        );
        assert_eq!(line(Liveness::Running, Some(State::Entering)), format!("rank 1: waiting in {place} for 30 s"));
        assert_eq!(line(Liveness::Running, Some(State::Left)), format!("rank 1: running, 28 s since it left {place}"));
        let exited = Liveness::Exited("exit code 1".into());
        assert_eq!(
            line(exited.clone(), Some(State::Failed)),
            format!("rank 1: gave up after waiting 2 s in {place} (exit code 1)")
        );
        assert_eq!(line(exited, None), "rank 1: exited (exit code 1) before reaching the rendezvous");
        assert_eq!(line(Liveness::Stopped, None), "rank 1: stopped before reaching the rendezvous");
    }

    #[test]
    fn this_process_is_not_stopped() {
        assert!(!is_stopped(std::process::id()));
        assert!(!is_stopped(u32::MAX), "no such process");
    }
}
