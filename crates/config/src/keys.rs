//! How each config key is typed on the command line ([`FlagValue`]) and documented ([`KeyDoc`]).

use std::path::PathBuf;

use super::loss::{FDivergence, LossType};
use super::{CommHook, LrScaling, SamplingStrategy, SaveStrategy, SchedulerType, Sharding};

/// How a value of a key is typed on the command line.
pub trait FlagValue {
    /// Converts the flag's text into the TOML value the file would hold.
    fn parse_flag(text: &str) -> Result<toml::Value, String>;
    /// A short name of the expected type, for `--help`.
    const KIND: &'static str;
    /// A bare flag (`--bf16`) means `true`.
    const IS_BOOL: bool = false;
}

macro_rules! flag_value {
    ($($t:ty => $kind:literal, $parse:expr;)*) => {$(
        impl FlagValue for $t {
            const KIND: &'static str = $kind;
            fn parse_flag(text: &str) -> Result<toml::Value, String> {
                $parse(text)
            }
        }
    )*};
}

fn int(text: &str) -> Result<toml::Value, String> {
    text.trim().parse::<i64>().map(toml::Value::Integer).map_err(|_| format!("expected an integer, got `{text}`"))
}
fn float(text: &str) -> Result<toml::Value, String> {
    text.trim().parse::<f64>().map(toml::Value::Float).map_err(|_| format!("expected a number, got `{text}`"))
}
fn string(text: &str) -> Result<toml::Value, String> {
    Ok(toml::Value::String(text.to_owned()))
}

flag_value! {
    f64 => "NUM", float;
    u64 => "INT", int;
    usize => "INT", int;
    i64 => "INT", int;
    String => "TEXT", string;
    PathBuf => "PATH", string;
    LossType => "TYPE", string;
    FDivergence => "TYPE", string;
    SchedulerType => "TYPE", string;
    LrScaling => "TYPE", string;
    CommHook => "TYPE", string;
    SaveStrategy => "TYPE", string;
    SamplingStrategy => "TYPE", string;
    Sharding => "STAGE", string;
}

impl FlagValue for bool {
    const KIND: &'static str = "BOOL";
    const IS_BOOL: bool = true;
    fn parse_flag(text: &str) -> Result<toml::Value, String> {
        flag_bool(text).map(toml::Value::Boolean).ok_or_else(|| format!("expected true or false, got `{text}`"))
    }
}

/// A boolean flag's value as transformers' `HfArgumentParser` reads one (`--bf16 True`):
/// yes/no, true/false, t/f, y/n, 1/0, in any case.
pub fn flag_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "yes" | "true" | "t" | "y" | "1" => Some(true),
        "no" | "false" | "f" | "n" | "0" => Some(false),
        _ => None,
    }
}

impl<T: FlagValue> FlagValue for Option<T> {
    const KIND: &'static str = T::KIND;
    const IS_BOOL: bool = T::IS_BOOL;
    fn parse_flag(text: &str) -> Result<toml::Value, String> {
        T::parse_flag(text)
    }
}

impl<T: FlagValue> FlagValue for Vec<T> {
    const KIND: &'static str = "LIST";
    fn parse_flag(text: &str) -> Result<toml::Value, String> {
        text.split(',').map(|item| T::parse_flag(item.trim())).collect::<Result<Vec<_>, _>>().map(toml::Value::Array)
    }
}

/// Which struct a key belongs to: the run's, or the loss's ([`super::LossConfig`], flattened into
/// [`super::TrainConfig`] with TRL's flat key names; `eval`'s flags are this section's keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Run,
    Loss,
}

/// One documented key.
#[derive(Debug, Clone, Copy)]
pub struct KeyDoc {
    pub name: &'static str,
    pub kind: &'static str,
    pub doc: &'static str,
    /// `bool` keys may be given as a bare flag (`--bf16`).
    pub is_bool: bool,
    pub section: Section,
}
