//! On/off switches read from the environment: one reading for every layer's variables.

/// A switch variable whose value is neither `1` nor `0`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{var}` is `{value}`, not a {}", SWITCH)]
pub struct BadSwitch {
    pub var: &'static str,
    pub value: String,
}

/// What a switch variable takes.
pub const SWITCH: &str = "switch: 1 (on) or 0 (off)";

/// Switch `var` as set: `1` on, `0` off, `None` where it is unset or empty.
pub fn switch(var: &'static str) -> Result<Option<bool>, BadSwitch> {
    match std::env::var(var).ok().as_deref() {
        None | Some("") => Ok(None),
        Some("1") => Ok(Some(true)),
        Some("0") => Ok(Some(false)),
        Some(other) => Err(BadSwitch { var, value: other.to_owned() }),
    }
}
