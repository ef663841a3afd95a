//! Progress on stderr: a bar on a terminal, plain lines otherwise (CI, files, a worker's pipe).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, ProgressBar, ProgressStyle};

use crate::train::Progress;

/// Rank 0's progress.
#[derive(Default)]
pub struct ConsoleProgress {
    bar: Option<ProgressBar>,
    reading: Option<Reading>,
}

/// A data file being read: a bar of bytes on a terminal, else a line after
/// [`FIRST_READING_LINE`] and every [`READING_EVERY`] from then on.
struct Reading {
    bar: Option<ProgressBar>,
    next_line: Instant,
}

const READING_EVERY: Duration = Duration::from_secs(10);
/// A log says soon what is being read (and that Ctrl-C will find it reading); a file read sooner,
/// or a bad row found sooner, prints no line.
const FIRST_READING_LINE: Duration = Duration::from_secs(1);

impl ConsoleProgress {
    /// Clears the bars before the summary (or an error) prints.
    pub fn finish(&mut self) {
        let reading = self.reading.take().and_then(|r| r.bar);
        for bar in self.bar.take().into_iter().chain(reading) {
            bar.finish_and_clear();
        }
    }
}

impl Drop for ConsoleProgress {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Progress for ConsoleProgress {
    fn start(&mut self, stage: &str, start_step: u64, total_steps: u64) {
        super::interrupt::training_began();
        self.finish();
        if std::io::stderr().is_terminal() {
            let style =
                ProgressStyle::with_template("{prefix} {bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::new(total_steps).with_style(style).with_prefix(stage.to_owned());
            bar.set_position(start_step);
            self.bar = Some(bar);
        } else {
            eprintln!("{stage}: steps {start_step}..{total_steps}");
        }
    }

    fn step(&mut self, step: u64, status: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(step);
            bar.set_message(status.to_owned());
        }
    }

    fn line(&mut self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn reading(&mut self, what: &str, done: u64, total: u64) {
        if done >= total {
            if let Some(bar) = self.reading.take().and_then(|r| r.bar) {
                bar.finish_and_clear();
            }
            return;
        }
        let reading = self.reading.get_or_insert_with(|| {
            let bar = std::io::stderr().is_terminal().then(|| {
                let style = ProgressStyle::with_template(
                    "{prefix} {bar:30} {bytes}/{total_bytes} [{elapsed_precise} < {eta_precise}]",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar());
                ProgressBar::new(total).with_style(style).with_prefix(what.to_owned())
            });
            Reading { bar, next_line: Instant::now() + FIRST_READING_LINE }
        });
        match &reading.bar {
            Some(bar) => bar.set_position(done),
            None if Instant::now() >= reading.next_line => {
                let pct = 100.0 * done as f64 / total.max(1) as f64;
                eprintln!("{what}: {pct:.0}% ({} of {})", HumanBytes(done), HumanBytes(total));
                reading.next_line = Instant::now() + READING_EVERY;
            }
            None => {}
        }
    }
}

/// Progress of the ranks other than 0: nothing (but the stage's start, which Ctrl-C's message needs).
pub struct Silent;

impl Progress for Silent {
    fn start(&mut self, _stage: &str, _start_step: u64, _total_steps: u64) {
        super::interrupt::training_began();
    }
    fn step(&mut self, _step: u64, _status: &str) {}
    fn line(&mut self, _text: &str) {}
}
