//! Training: the loop ([`trainer`]), AdamW with global-norm clipping ([`optim`]) and the
//! learning-rate schedules ([`schedule`]).

pub mod optim;
pub mod schedule;
