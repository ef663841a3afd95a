//! A cadence in optimizer steps as transformers reads `logging_steps`, `eval_steps` and
//! `save_steps`: a whole number of steps, or a number in (0, 1), that share of the stage's steps
//! (every ⌈total × share⌉, as `Trainer._inner_training_loop` sets it once it knows `max_steps`).

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::keys::FlagValue;

/// Every how many optimizer steps something happens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Steps {
    /// Every this many steps (0: the key's "never").
    Every(u64),
    /// Every ⌈total × share⌉ steps of a stage of `total`; the share is in (0, 1).
    Share(f64),
}

impl Steps {
    /// The cadence in a stage of `total` optimizer steps.
    pub fn of(self, total: u64) -> u64 {
        match self {
            Self::Every(n) => n,
            Self::Share(share) => (total as f64 * share).ceil() as u64,
        }
    }

    /// `x` read as transformers reads it: whole numbers are steps, (0, 1) a share; anything else
    /// (1.5, a negative number, NaN) is refused, as transformers refuses a fraction past 1.
    pub fn from_number(x: f64) -> Result<Self, String> {
        if x > 0.0 && x < 1.0 {
            Ok(Self::Share(x))
        } else if x >= 0.0 && x.fract() == 0.0 && x <= u64::MAX as f64 {
            Ok(Self::Every(x as u64))
        } else {
            Err(format!("must be a whole number of steps, or a share of the training steps in (0, 1), got {x}"))
        }
    }
}

impl fmt::Display for Steps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Every(n) => write!(f, "{n}"),
            Self::Share(share) => write!(f, "{share}"),
        }
    }
}

impl Serialize for Steps {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Self::Every(n) => s.serialize_u64(n),
            Self::Share(share) => s.serialize_f64(share),
        }
    }
}

impl<'de> Deserialize<'de> for Steps {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Number;
        impl Visitor<'_> for Number {
            type Value = Steps;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of steps, or a share of the training steps in (0, 1)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Steps, E> {
                Ok(Steps::Every(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Steps, E> {
                u64::try_from(n).map(Steps::Every).map_err(|_| E::custom(format!("must be at least 0, got {n}")))
            }
            fn visit_f64<E: de::Error>(self, x: f64) -> Result<Steps, E> {
                Steps::from_number(x).map_err(E::custom)
            }
        }
        d.deserialize_any(Number)
    }
}

impl FlagValue for Steps {
    const KIND: &'static str = "STEPS";
    fn parse_flag(text: &str) -> Result<toml::Value, String> {
        let text = text.trim();
        match text.parse::<i64>() {
            Ok(n) => Ok(toml::Value::Integer(n)),
            Err(_) => text.parse::<f64>().map(toml::Value::Float).map_err(|_| {
                format!("expected a whole number of steps, or a share of the training steps in (0, 1), got `{text}`")
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Steps;

    /// Whole numbers are steps, (0, 1) a share rounded up as transformers rounds it; other
    /// fractions are refused; a value reads back as it was written.
    #[test]
    fn steps_and_shares_read_as_transformers_reads_them() {
        assert_eq!(Steps::from_number(10.0), Ok(Steps::Every(10)));
        assert_eq!(Steps::from_number(0.0), Ok(Steps::Every(0)));
        assert_eq!(Steps::from_number(0.1).map(|s| s.of(25)), Ok(3));
        assert_eq!(Steps::from_number(0.5).map(|s| s.of(4)), Ok(2));
        assert_eq!(Steps::Every(7).of(1000), 7);
        for bad in [1.5, -2.0, f64::NAN, f64::INFINITY] {
            let err = Steps::from_number(bad).unwrap_err();
            assert!(err.starts_with("must be a whole number of steps, or a share"), "{err}");
        }
        #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq)]
        struct Key {
            k: Steps,
        }
        for (text, want) in
            [("k = 10", Steps::Every(10)), ("k = 0.25", Steps::Share(0.25)), ("k = 3.0", Steps::Every(3))]
        {
            let read: Key = toml::from_str(text).unwrap();
            assert_eq!(read.k, want, "{text}");
            assert_eq!(toml::from_str::<Key>(&toml::to_string(&read).unwrap()).unwrap(), read);
        }
        let negative = toml::from_str::<Key>("k = -1").unwrap_err().to_string();
        assert!(negative.contains("must be at least 0, got -1"), "{negative}");
    }
}
