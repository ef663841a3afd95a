//! dpo-base: what every layer may use and which uses nothing of the project: files written
//! atomically ([`fsutil`]) and checked against their checksums ([`checksums`]), dates without a
//! time-zone database ([`clock`]), Hugging Face Hub names found in the local hub cache
//! ([`hub`]), on/off switches read from the environment ([`env`]), and an error with its causes
//! as one line ([`error`]).

pub mod checksums;
pub mod clock;
pub mod env;
pub mod error;
pub mod fsutil;
pub mod hub;
