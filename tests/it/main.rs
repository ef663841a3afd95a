//! dpo-train's integration tests, in one binary: one link instead of one per file, and every
//! file's tests share the test threads. Each module is one concern and opens by saying what it
//! checks; `common` holds the helpers and the derived tolerances (`common::bounds`).

mod common;
mod data_errors;
mod data_stream;
mod ddp;
mod demo;
mod dist;
mod eval_cli;
mod export;
mod first_run;
mod generate;
mod gpu_pool;
mod hub_cache;
mod hub_data;
mod kto;
mod kto_parity;
mod lora;
mod model_errors;
mod model_parity;
mod op_counts;
mod padding_free;
mod recipe;
mod ref_free_parity;
mod report;
mod shared_runs;
mod sources;
mod synth;
mod tensorboard;
mod tokenize_parity;
mod train;
mod train_cli;
mod trainer_runs;
mod trl_parity;
mod wandb;
