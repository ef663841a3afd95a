//! Python's `json.dumps` over minijinja values (`ensure_ascii`, `indent`, `separators`,
//! `sort_keys`), for the `tojson` filter transformers gives chat templates.

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};

/// `json.dumps`'s options.
pub(super) struct JsonOpts {
    pub ensure_ascii: bool,
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

/// `value` as `json.dumps(value, **opts)` writes it.
pub(super) fn dumps(value: &Value, opts: &JsonOpts) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    py_json(value, opts, 0, &mut out)?;
    Ok(out)
}

fn py_json(value: &Value, opts: &JsonOpts, level: usize, out: &mut String) -> Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = value.as_i64() {
                let _ = write!(out, "{i}");
            } else {
                let f = f64::try_from(value.clone())?;
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else if f.fract() == 0.0 && f.abs() < 1e16 {
                    let _ = write!(out, "{f:.1}");
                } else {
                    let _ = write!(out, "{f}");
                }
            }
        }
        ValueKind::String => py_json_str(value.as_str().unwrap_or_default(), opts, out),
        ValueKind::Map => {
            let mut items = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let key = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => key.to_string(),
                };
                items.push((key, item));
            }
            if opts.sort_keys {
                items.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if items.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, v)) in items.iter().enumerate() {
                py_json_sep(opts, level + 1, i == 0, out);
                py_json_str(k, opts, out);
                out.push_str(&opts.key_sep);
                py_json(v, opts, level + 1, out)?;
            }
            py_json_close(opts, level, out);
            out.push('}');
        }
        _ => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                py_json_sep(opts, level + 1, i == 0, out);
                py_json(v, opts, level + 1, out)?;
            }
            py_json_close(opts, level, out);
            out.push(']');
        }
    }
    Ok(())
}

fn py_json_sep(opts: &JsonOpts, level: usize, first: bool, out: &mut String) {
    match &opts.indent {
        Some(ind) => {
            if !first {
                out.push_str(&opts.item_sep);
            }
            out.push('\n');
            out.push_str(&ind.repeat(level));
        }
        None => {
            if !first {
                out.push_str(&opts.item_sep);
            }
        }
    }
}

fn py_json_close(opts: &JsonOpts, level: usize, out: &mut String) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        out.push_str(&ind.repeat(level));
    }
}

fn py_json_str(s: &str, opts: &JsonOpts, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if opts.ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
