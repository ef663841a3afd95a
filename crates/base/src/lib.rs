//! dpo-base: what every layer may use and which uses nothing of the project: files written
//! atomically ([`fsutil`]) and dates without a time-zone database ([`clock`]).

pub mod clock;
pub mod fsutil;
