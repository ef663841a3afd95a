//! One row's fields: JSON values as [`Text`], the checks every format shares, and TRL's
//! `extract_prompt` for implicit-prompt data.

use serde_json::Value;

use super::{Columns, PreferenceRow, Text};
use crate::error::RowProblem;
use crate::tokenizer::Message;

pub(super) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A field as [`Text`]: a string, or a list of `{role, content}` messages (TRL's
/// `is_conversational`: a list whose first element is a dict with `role`).
pub fn text_field(value: &Value, field: &str) -> Result<Text, RowProblem> {
    match value {
        Value::String(s) => Ok(Text::Plain(s.clone())),
        Value::Array(items) => {
            let mut messages = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                let bad = |what| RowProblem::BadMessage { field: field.to_string(), index, what };
                let Value::Object(obj) = item else {
                    if index == 0 {
                        return Err(RowProblem::WrongType {
                            field: field.to_string(),
                            found: "a list of non-messages",
                        });
                    }
                    return Err(bad("must be a `{role, content}` object"));
                };
                let role = match obj.get("role") {
                    Some(Value::String(s)) => s.clone(),
                    None => return Err(bad("`role` is missing")),
                    Some(_) => return Err(bad("`role` must be a string")),
                };
                // Text, null (tool calls) or content parts, as the chat template takes them.
                let content = match obj.get("content") {
                    Some(c @ (Value::String(_) | Value::Null | Value::Array(_))) => c.clone(),
                    None => return Err(bad("`content` is missing")),
                    Some(_) => return Err(bad("`content` must be a string, null or a list of content parts")),
                };
                let extra = obj.iter().filter(|(k, _)| !matches!(k.as_str(), "role" | "content"));
                let extra = extra.map(|(k, v)| (k.clone(), v.clone())).collect();
                messages.push(Message { role, content, extra });
            }
            Ok(Text::Messages(messages))
        }
        Value::Null => Err(RowProblem::Null { field: field.to_string() }),
        other => Err(RowProblem::WrongType { field: field.to_string(), found: json_kind(other) }),
    }
}

/// Validates the three parts of a row; `prompt` is `None` for implicit-prompt data.
pub(super) fn build_row(
    line: usize,
    prompt: Option<Text>,
    chosen: Text,
    rejected: Text,
    cols: &Columns,
) -> Result<PreferenceRow, RowProblem> {
    let mixed = |field: &str, a: &Text, other: &str, b: &Text| RowProblem::MixedKinds {
        field: field.to_string(),
        kind: a.kind(),
        other: other.to_string(),
        other_kind: b.kind(),
    };
    if let Some(p) = &prompt {
        if p.is_messages() != chosen.is_messages() {
            return Err(mixed(&cols.prompt, p, &cols.chosen, &chosen));
        }
        if p.is_messages() && p.is_empty() {
            // transformers refuses to render an empty conversation.
            return Err(RowProblem::Empty { field: cols.prompt.clone() });
        }
    }
    if chosen.is_messages() != rejected.is_messages() {
        return Err(mixed(&cols.chosen, &chosen, &cols.rejected, &rejected));
    }
    for (field, text) in [(&cols.chosen, &chosen), (&cols.rejected, &rejected)] {
        // An empty string trains eos alone, which TRL's trainers append; an empty conversation has
        // nothing to render, and `extract_prompt` fails on an empty string (its `idx` unbound).
        if text.is_empty() && (text.is_messages() || prompt.is_none()) {
            return Err(RowProblem::Empty { field: field.clone() });
        }
    }
    let (prompt, chosen, rejected) = match prompt {
        Some(p) => (p, chosen, rejected),
        None => extract_prompt(chosen, rejected, cols)?,
    };
    Ok(PreferenceRow { line, prompt, chosen, rejected, label: None, template: None })
}

/// Validates an unpaired (KTO) row: its prompt (required: KTO has no implicit prompt) and
/// completion of one kind, neither an empty conversation.
pub(super) fn build_unpaired_row(
    line: usize,
    prompt: Text,
    completion: Text,
    label: bool,
    cols: &Columns,
) -> Result<PreferenceRow, RowProblem> {
    if prompt.is_messages() != completion.is_messages() {
        return Err(RowProblem::MixedKinds {
            field: cols.prompt.clone(),
            kind: prompt.kind(),
            other: super::COMPLETION.to_owned(),
            other_kind: completion.kind(),
        });
    }
    if prompt.is_messages() && prompt.is_empty() {
        return Err(RowProblem::Empty { field: cols.prompt.clone() });
    }
    // An empty string trains eos alone, as `KTOTrainer` appends it.
    if completion.is_empty() && completion.is_messages() {
        return Err(RowProblem::Empty { field: super::COMPLETION.to_owned() });
    }
    let rejected = completion.empty_like();
    Ok(PreferenceRow { line, prompt, chosen: completion, rejected, label: Some(label), template: None })
}

/// TRL 1.16 `trl/data_utils.py` `extract_prompt` (lines 623-632), kept exactly:
///
/// ```python
/// for idx in range(min(len(example["chosen"]), len(example["rejected"]))):
///     if example["chosen"][idx] != example["rejected"][idx]:
///         if example["chosen"][idx - 1] == " ":  # remove space before the prompt
///             idx -= 1
///         break
/// return {"prompt": chosen[:idx], "chosen": chosen[idx:], "rejected": rejected[idx:]}
/// ```
///
/// Strings are split by characters (Python indexes code points), message lists by message. When
/// the loop ends without a difference, `idx` is the last index (`min_len - 1`), not `min_len`.
/// When the first characters already differ, `idx - 1` is Python's `-1` (the last character): a
/// trailing space then gives `idx = -1` and Python's negative slicing; that is mirrored too.
/// Message lists never compare equal to `" "`, and a conversation whose first messages differ has
/// no prompt to render, which is reported as a bad row.
fn extract_prompt(chosen: Text, rejected: Text, cols: &Columns) -> Result<(Text, Text, Text), RowProblem> {
    match (chosen, rejected) {
        (Text::Plain(c), Text::Plain(r)) => {
            let cc: Vec<char> = c.chars().collect();
            let rc: Vec<char> = r.chars().collect();
            let idx = split_index(&cc, &rc, |i| cc[i] == ' ');
            let (p, c, r) = (py_slice_to(&cc, idx), py_slice_from(&cc, idx), py_slice_from(&rc, idx));
            let s = |v: &[char]| v.iter().collect::<String>();
            Ok((Text::Plain(s(p)), Text::Plain(s(c)), Text::Plain(s(r))))
        }
        (Text::Messages(c), Text::Messages(r)) => {
            let idx = split_index(&c, &r, |_| false);
            if idx <= 0 {
                return Err(RowProblem::NoSharedPrompt {
                    chosen: cols.chosen.clone(),
                    rejected: cols.rejected.clone(),
                });
            }
            let n = idx as usize;
            Ok((Text::Messages(c[..n].to_vec()), Text::Messages(c[n..].to_vec()), Text::Messages(r[n..].to_vec())))
        }
        // `build_row` has checked that both have the same kind; keep the pair as it is otherwise.
        (c, r) => Ok((Text::Plain(String::new()), c, r)),
    }
}

/// The `idx` of `extract_prompt`'s loop; `is_space(i)` tests `chosen[i] == " "` for `i >= 0`
/// (with `i = len - 1` standing for Python's index `-1`).
fn split_index<T: PartialEq>(c: &[T], r: &[T], is_space: impl Fn(usize) -> bool) -> isize {
    let n = c.len().min(r.len());
    // Callers reject empty completions, so `n >= 1`.
    let mut idx = n as isize - 1;
    for i in 0..n {
        if c[i] != r[i] {
            let prev = if i == 0 { c.len() - 1 } else { i - 1 };
            idx = if is_space(prev) { i as isize - 1 } else { i as isize };
            break;
        }
    }
    idx
}

/// Python's `v[:idx]` for `idx >= -1`.
fn py_slice_to<T>(v: &[T], idx: isize) -> &[T] {
    let end = if idx < 0 { v.len().saturating_sub(1) } else { (idx as usize).min(v.len()) };
    &v[..end]
}

/// Python's `v[idx:]` for `idx >= -1`.
fn py_slice_from<T>(v: &[T], idx: isize) -> &[T] {
    let start = if idx < 0 { v.len().saturating_sub(1) } else { (idx as usize).min(v.len()) };
    &v[start..]
}
