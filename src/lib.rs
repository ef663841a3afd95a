//! dpo-train: Direct Preference Optimization for Hugging Face Llama-family models, on burn with the
//! libtorch backend.
//!
//! Data flows one way, each layer using only the ones before it (`ARCHITECTURE.md`; `make lint`
//! checks it): [`config`] and [`dist`] (the c10d binding) → [`data`] → [`model`] → [`dpo`]
//! (log-probs, losses, metrics) → [`train`] → [`report`] → [`demo`], [`eval`] → [`run`] → [`cli`].

pub mod cli;
pub use dpo_base::clock;
pub use dpo_config as config;
pub use dpo_data as data;
pub mod demo;
pub use dpo_dist as dist;
pub mod dpo;
pub mod eval;
pub use dpo_base::fsutil;
pub mod malloc;
pub use dpo_model as model;
pub mod report;
pub mod run;
pub mod tboard;
pub mod train;
pub mod wandb;

/// The process exit code for an error: 1 when the user's input is at fault (flags, config, data,
/// model files), 2 for failures of the run itself (a full disk, a lost worker).
pub fn exit_code(err: &anyhow::Error) -> u8 {
    let runtime = err.chain().any(|e| {
        matches!(e.downcast_ref(), Some(model::weights::WeightsError::Write { .. }))
            || matches!(e.downcast_ref(), Some(train::checkpoint::CheckpointError::Write { .. }))
    });
    if runtime {
        return 2;
    }
    // A worker refused bad input (exit 1): the launcher says the same, as one process would.
    if err.chain().any(|e| matches!(e.downcast_ref(), Some(dist::LaunchError::RankFailed { code: Some(1), .. }))) {
        return 1;
    }
    let user_input = err.chain().any(|e| {
        e.is::<data::DataError>()
            || e.is::<data::tokenizer::TokenizerError>()
            || e.is::<model::ModelError>()
            || e.is::<model::CompatError>()
            || e.is::<model::AdapterError>()
            || e.is::<model::weights::WeightsError>()
            || e.is::<model::generate::GenerateError>()
            || e.is::<dist::EnvError>()
            || e.is::<config::LossConfigError>()
            || e.is::<eval::EvalError>()
            || e.is::<config::ConfigError>()
            || e.is::<cli::LaunchFlagError>()
            || matches!(e.downcast_ref(), Some(run::claim::ClaimError::Busy { .. }))
            || e.downcast_ref().is_some_and(train::checkpoint::CheckpointError::is_input)
            || e.downcast_ref().is_some_and(train::log::LogError::is_input)
            || matches!(e.downcast_ref(), Some(report::ReportError::Log(l)) if l.is_input())
    });
    if user_input { 1 } else { 2 }
}
