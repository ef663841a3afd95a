//! `samples_val.txt` / `samples_test.txt`: side-by-side generations for held-out prompts.
//!
//! For each prompt the file shows the policy's completion, the frozen reference model's
//! completion and the dataset's chosen answer, so a reader can judge what DPO changed, as the
//! generation tables of TRL's `DPOTrainer` (`generate_during_eval`) do.

use std::fmt::Write as _;
use std::path::Path;

use super::log::{LogError, write_atomic};

/// One held-out prompt with three answers to compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub prompt: String,
    /// The trained policy's completion.
    pub policy: String,
    /// The frozen reference model's completion.
    pub reference: String,
    /// The dataset's preferred answer (a KTO row's own completion).
    pub chosen: String,
    /// A KTO row's label: its completion is then shown as `DESIRABLE:` or `UNDESIRABLE:`.
    pub desirable: Option<bool>,
}

/// Width of the rule between samples and under the title.
const RULE_WIDTH: usize = 80;
/// Indentation of each section's text.
const INDENT: &str = "    ";

/// Writes `samples` to `path` as plain text, atomically (`<path>.tmp`, then rename).
///
/// Layout: the title line, a `=` rule, then per sample `[i/n]` with `PROMPT:`, `POLICY:`,
/// `REFERENCE:` and `CHOSEN:` (KTO's rows: `DESIRABLE:` or `UNDESIRABLE:`) sections whose text is indented by four spaces, each sample
/// followed by a `-` rule. Returns the text written.
pub fn write_samples(path: &Path, title: &str, samples: &[Sample]) -> Result<String, LogError> {
    let text = format_samples(title, samples);
    write_atomic(path, text.as_bytes())?;
    Ok(text)
}

fn format_samples(title: &str, samples: &[Sample]) -> String {
    let mut out = String::new();
    // `write!` into a `String` cannot fail.
    let _ = writeln!(out, "Samples: {title} ({} prompts)", samples.len());
    let _ = writeln!(out, "{}", "=".repeat(RULE_WIDTH));
    let n = samples.len();
    for (i, s) in samples.iter().enumerate() {
        let _ = writeln!(out, "\n[{}/{n}]", i + 1);
        let answer = match s.desirable {
            None => "CHOSEN:",
            Some(true) => "DESIRABLE:",
            Some(false) => "UNDESIRABLE:",
        };
        for (label, text) in
            [("PROMPT:", &s.prompt), ("POLICY:", &s.policy), ("REFERENCE:", &s.reference), (answer, &s.chosen)]
        {
            let _ = writeln!(out, "{label}");
            push_indented(&mut out, text);
        }
        let _ = writeln!(out, "\n{}", "-".repeat(RULE_WIDTH));
    }
    out
}

/// Appends `text` with every line indented; an empty text shows as `(empty)`.
fn push_indented(out: &mut String, text: &str) {
    let text = text.trim_end();
    if text.is_empty() {
        out.push_str(INDENT);
        out.push_str("(empty)\n");
        return;
    }
    for line in text.lines() {
        if !line.trim().is_empty() {
            out.push_str(INDENT);
            out.push_str(line.trim_end());
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_has_sections_indentation_and_rules() {
        let samples = [
            Sample {
                prompt: "What is 2+2?".into(),
                policy: "4.\n\nIt is four.".into(),
                reference: String::new(),
                chosen: "Four".into(),
                desirable: None,
            },
            Sample {
                prompt: "Hi".into(),
                policy: "Hello!".into(),
                reference: "Hey".into(),
                chosen: "Hello".into(),
                desirable: None,
            },
        ];
        let text = format_samples("step 120 (final)", &samples);
        let rule = "-".repeat(80);
        let expected = format!(
            "Samples: step 120 (final) (2 prompts)\n{}\n\
             \n[1/2]\nPROMPT:\n    What is 2+2?\nPOLICY:\n    4.\n\n    It is four.\n\
             REFERENCE:\n    (empty)\nCHOSEN:\n    Four\n\n{rule}\n\
             \n[2/2]\nPROMPT:\n    Hi\nPOLICY:\n    Hello!\nREFERENCE:\n    Hey\nCHOSEN:\n    Hello\n\n{rule}\n",
            "=".repeat(80)
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn written_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("samples_val.txt");
        write_samples(&path, "step 1", &[]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("Samples: step 1 (0 prompts)\n"));
        assert!(!dir.path().join("samples_val.txt.tmp").exists());
    }
}
