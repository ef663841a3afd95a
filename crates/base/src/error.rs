//! Errors as one line.

/// One line: the error and its causes, joined by `: `.
/// A link that repeats the next one inside its own text (`a libloading error occurred: X`,
/// then `X`) is dropped.
pub fn one_line(err: &dyn std::error::Error) -> String {
    let mut chain = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(c) = cur {
        chain.push(c.to_string());
        cur = c.source();
    }
    let kept: Vec<&str> = chain
        .iter()
        .enumerate()
        .filter(|(i, text)| *i == 0 || chain.get(i + 1).is_none_or(|next| !text.contains(next.as_str())))
        .map(|(_, t)| t.as_str())
        .collect();
    kept.join(": ")
}
