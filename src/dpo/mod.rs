//! Direct Preference Optimization (Rafailov et al. 2023) as TRL 1.16's `DPOTrainer` computes it:
//! the concatenated [chosen; rejected] forward ([`logps`]), every loss type ([`loss`]) and the
//! logged metrics ([`metrics`]), and the scoring of whole datasets ([`score`]).

pub mod kto;
pub mod logps;
pub mod loss;
pub mod metrics;
mod pair_scores;
pub mod ref_free;
pub mod score;
pub mod shapes;

pub use logps::{DeviceBatch, SequenceScores};

pub use metrics::{MetricSums, Metrics};
