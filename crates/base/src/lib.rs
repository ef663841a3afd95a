//! dpo-base: what every layer may use and which uses nothing of the project: files written
//! atomically ([`fsutil`]), dates without a time-zone database ([`clock`]), and Hugging Face Hub
//! names found in the local hub cache ([`hub`]).

pub mod clock;
pub mod fsutil;
pub mod hub;
