//! Progress on stderr: a bar on a terminal, plain lines otherwise (CI, files, a worker's pipe).

use std::io::IsTerminal;

use crate::train::Progress;

/// Rank 0's progress.
#[derive(Default)]
pub struct ConsoleProgress {
    bar: Option<indicatif::ProgressBar>,
}

impl ConsoleProgress {
    /// Clears the bar before the summary prints.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Progress for ConsoleProgress {
    fn start(&mut self, stage: &str, start_step: u64, total_steps: u64) {
        self.finish();
        if std::io::stderr().is_terminal() {
            let style = indicatif::ProgressStyle::with_template(
                "{prefix} {bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            let bar = indicatif::ProgressBar::new(total_steps).with_style(style).with_prefix(stage.to_owned());
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
}

/// Progress of the ranks other than 0: nothing.
pub struct Silent;

impl Progress for Silent {
    fn start(&mut self, _stage: &str, _start_step: u64, _total_steps: u64) {}
    fn step(&mut self, _step: u64, _status: &str) {}
    fn line(&mut self, _text: &str) {}
}
