//! Training: the loop ([`trainer`]), AdamW with global-norm clipping ([`optim`]), the
//! learning-rate schedules ([`schedule`]), the batch plan ([`sampler`]), checkpoints
//! ([`checkpoint`]) and precomputed reference log-probs ([`ref_cache`]).

pub mod checkpoint;
pub mod optim;
pub mod ref_cache;
pub mod sampler;
pub mod schedule;
pub mod trainer;
