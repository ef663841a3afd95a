//! JSON Lines (streamed line by line; also a `.json` file written as JSON Lines) and a JSON array:
//! each row keeps the line it starts on.

use std::io::BufRead;

use serde_json::Value;

use super::{LineIndex, Rows};
use crate::error::{DataError, RowProblem};

/// One JSON value per non-blank line; blank lines (a trailing newline, `\r\n` endings) are not rows.
pub(super) fn read_json_lines(reader: &mut dyn BufRead, rows: &mut Rows) -> Result<(), DataError> {
    let mut buf = Vec::new();
    for line in 1.. {
        buf.clear();
        if reader.read_until(b'\n', &mut buf).map_err(|e| rows.io_error(e))? == 0 {
            break;
        }
        let mut raw = buf.strip_suffix(b"\n").unwrap_or(&buf);
        raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if line == 1 {
            raw = raw.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(raw);
        }
        let Ok(text) = std::str::from_utf8(raw) else {
            rows.bad_row(line, RowProblem::InvalidUtf8)?;
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Value>(text);
        // Python's constants, tried only where the line is no JSON (the common line pays nothing).
        let parsed = parsed.or_else(|e| python_constants(raw).map_or(Err(e), |f| serde_json::from_slice(&f)));
        match parsed {
            Ok(value) => rows.push_value(line, &value)?,
            Err(source) => {
                let err = DataError::MalformedJson { path: rows.path.clone(), line, source };
                rows.bad(line, err)?;
            }
        }
    }
    Ok(())
}

/// Whether a `.json` file holds JSON Lines: `datasets`' `Dataset.to_json("x.json")` writes them by
/// default, and `datasets` reads them back. It does when its first non-blank line is a whole JSON
/// object and either the file is not one JSON value or that line is all of it (one row, which
/// `datasets`' JSON Lines reader takes; an object over several lines stays an error).
pub(super) fn is_json_lines(bytes: &[u8]) -> bool {
    let start = skip_ws(bytes, 0);
    if bytes.get(start) != Some(&b'{') {
        return false;
    }
    let first = bytes[start..].split(|b| *b == b'\n').next().unwrap_or_default();
    let alone = skip_ws(bytes, start + first.len()) == bytes.len();
    serde_json::from_slice::<serde::de::IgnoredAny>(first).is_ok()
        && (alone || serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err())
}

/// Whether a `.jsonl` file holds a JSON array instead (its first byte past a BOM and white space
/// is `[`), which `datasets` reads too (pyarrow's JSON Lines reader fails, pandas reads it).
pub(super) fn starts_an_array(reader: &mut dyn BufRead) -> std::io::Result<bool> {
    let head = reader.fill_buf()?;
    let head = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
    Ok(head.get(skip_ws(head, 0)) == Some(&b'['))
}

fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
        pos += 1;
    }
    pos
}

/// A top-level JSON array, element by element so that each row knows the line it starts on. A
/// syntax error anywhere stops the read before any row is handed over.
pub(super) fn read_json_array(bytes: &[u8], rows: &mut Rows) -> Result<(), DataError> {
    let path = rows.path.clone();
    let lines = LineIndex::new(bytes);
    let line_of = |offset: usize| lines.line_of(offset);
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(DataError::BadRow { path, line: line_of(e.valid_up_to()), problem: RowProblem::InvalidUtf8 });
    }
    let malformed = |base: usize, source: serde_json::Error| DataError::MalformedJson {
        path: path.clone(),
        line: line_of(base) + source.line().saturating_sub(1),
        source,
    };
    let mut pos = skip_ws(bytes, 0);
    if pos == bytes.len() {
        return Ok(());
    }
    if bytes[pos] != b'[' {
        // Distinguish a syntax error from a well-formed non-array document.
        return match serde_json::from_slice::<Value>(bytes) {
            Ok(_) => Err(DataError::NotAnArray { path: path.clone() }),
            Err(source) => Err(malformed(0, source)),
        };
    }
    pos = skip_ws(bytes, pos + 1);
    let mut out = Vec::new();
    if bytes.get(pos) == Some(&b']') {
        pos = skip_ws(bytes, pos + 1);
    } else {
        loop {
            let line = line_of(pos);
            let mut stream = serde_json::Deserializer::from_slice(&bytes[pos..]).into_iter::<Value>();
            match stream.next() {
                Some(Ok(value)) => out.push((line, value)),
                Some(Err(source)) => return Err(malformed(pos, source)),
                None => return Err(malformed(pos, eof_error())),
            }
            pos = skip_ws(bytes, pos + stream.byte_offset());
            match bytes.get(pos) {
                Some(b',') => pos = skip_ws(bytes, pos + 1),
                Some(b']') => {
                    pos = skip_ws(bytes, pos + 1);
                    break;
                }
                _ => {
                    // Let serde describe what it found instead of `,` or `]`.
                    let source = serde_json::from_slice::<Value>(bytes).err().unwrap_or_else(eof_error);
                    return Err(malformed(0, source));
                }
            }
        }
    }
    if pos != bytes.len() {
        let source = serde_json::from_slice::<Value>(bytes).err().unwrap_or_else(eof_error);
        return Err(malformed(0, source));
    }
    out.into_iter().try_for_each(|(line, value)| rows.push_value(line, &value))
}

/// serde's error for a truncated document.
fn eof_error() -> serde_json::Error {
    // `[` alone is always an EOF error, so `unwrap_err` holds.
    serde_json::from_str::<Value>("[").unwrap_err()
}

/// Python's `json` writes a float that is no number as the bare words `NaN`, `Infinity` and
/// `-Infinity`, and `datasets` reads them (a `score` column of NaN, say); JSON has no such value.
/// `text` with each of them that stands outside a string as `null`, which a column the loss does
/// not read ignores and a text field reports; `None` where `text` has none. Lines keep their
/// breaks, so line numbers hold.
pub(super) fn python_constants(text: &[u8]) -> Option<Vec<u8>> {
    const WORDS: [&[u8]; 3] = [b"NaN", b"Infinity", b"-Infinity"];
    let mut out: Option<Vec<u8>> = None;
    let (mut in_string, mut escaped, mut copied, mut i) = (false, false, 0, 0);
    while i < text.len() {
        let b = text[i];
        if in_string {
            (in_string, escaped) = (escaped || b != b'"', !escaped && b == b'\\');
        } else if b == b'"' {
            in_string = true;
        } else if let Some(word) = WORDS.iter().find(|w| text[i..].starts_with(w)) {
            let alone = |at: Option<&u8>| !at.is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
            if alone(i.checked_sub(1).and_then(|p| text.get(p))) && alone(text.get(i + word.len())) {
                let out = out.get_or_insert_with(|| Vec::with_capacity(text.len()));
                out.extend_from_slice(&text[copied..i]);
                out.extend_from_slice(b"null");
                i += word.len();
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    let mut out = out?;
    out.extend_from_slice(&text[copied..]);
    Some(out)
}
