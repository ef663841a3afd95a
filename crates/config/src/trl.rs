//! The keys of TRL 1.16's `DPOConfig` and transformers' `TrainingArguments`, and of the
//! `ModelConfig` and `ScriptArguments` TRL's `trl dpo` script reads beside them, that dpo-train
//! has no key of its own for (read from `trl/trainer/dpo_config.py`, `trl/trainer/model_config.py`,
//! `trl/scripts/utils.py` and `transformers/training_args.py`). A TRL config or command line that
//! sets one is never told "unknown key": the key is accepted where its value changes nothing here
//! (then dropped), translated where it is another name for one of ours, and refused by name, with
//! the reason, otherwise.

/// What a config that sets the key gets.
#[derive(Debug, Clone, Copy)]
pub enum Treatment {
    /// Changes nothing in dpo-train whatever its value (a data-loader, logging or hub knob, or a
    /// setting of a feature that is off): accepted and dropped.
    Inert,
    /// Accepted at these values (TOML literals, TRL's default first), which change nothing here;
    /// any other value is refused with the reason.
    Only(&'static [&'static str], &'static str),
    /// Refused at any value, with the reason.
    Never(&'static str),
    /// Another name of one of dpo-train's keys (TRL's script calls the data `dataset_name`,
    /// transformers 5 gradient checkpointing `activation_checkpointing`).
    Rename(&'static str),
    /// Accepted at these values (TOML literals), each meaning what [`translate`] says.
    Means(&'static [&'static str], &'static str),
    /// Changes nothing unless the config also sets this other key, and is refused beside it with
    /// the reason.
    InertWithout(&'static str, &'static str),
}

use Treatment::{Inert, InertWithout, Means, Never, Only, Rename};

const FALSE: &[&str] = &["false"];
const NOT_IMPLEMENTED: &str = "not implemented";

/// Every such key, `DPOConfig`'s first.
pub const TRL_KEYS: &[(&str, Treatment)] = &[
    ("model_init_kwargs", Never("models load from their directory's config.json; the precision is `bf16`/`fp16`")),
    // No model code is run at any value (llama, mistral, qwen2 and qwen3 are built in), and a model
    // of another type is refused where it loads, naming the types there are.
    ("trust_remote_code", Inert),
    ("router_aux_loss_coef", Never("mixture-of-experts models are not supported")),
    ("pad_to_multiple_of", Inert),
    ("precompute_ref_batch_size", Inert),
    ("activation_offloading", Only(FALSE, "activations are not offloaded (`gradient_checkpointing` saves them)")),
    ("sync_ref_model", Only(FALSE, "TR-DPO's reference syncing is not implemented")),
    ("ref_model_mixup_alpha", Inert),
    ("ref_model_sync_steps", Inert),
    ("pad_token", Never("deprecated in TRL 1.16: padding uses the tokenizer's pad token (eos when it has none)")),
    (
        "lr_scheduler_kwargs",
        Never("only cosine_with_min_lr's `min_lr_rate` or `min_lr` is read (also as the key `min_lr_rate`)"),
    ),
    ("optim", Only(&["\"adamw_torch_fused\"", "\"adamw_torch\""], "the optimizer is AdamW (adamw_torch)")),
    ("optim_args", Never("AdamW takes `adam_beta1`, `adam_beta2`, `adam_epsilon` and `weight_decay`")),
    ("optim_target_modules", Never("only GaLore-style optimizers use it, and they are not implemented")),
    ("average_tokens_across_devices", Inert),
    ("label_smoothing_factor", Only(&["0.0"], "DPO's smoothing is `label_smoothing`")),
    ("bf16_full_eval", Only(FALSE, "evaluation runs in the training precision")),
    ("fp16_full_eval", Only(FALSE, "evaluation runs in the training precision")),
    // transformers 5's name for it; `gradient_checkpointing` is its deprecated alias there.
    ("activation_checkpointing", Rename("gradient_checkpointing")),
    ("activation_checkpointing_kwargs", Inert),
    ("gradient_checkpointing_kwargs", Inert),
    ("torch_compile", Only(FALSE, "torch.compile is not used")),
    ("torch_compile_backend", Inert),
    ("torch_compile_mode", Inert),
    ("use_liger_kernel", Only(FALSE, "Liger kernels are not used")),
    ("liger_kernel_config", Inert),
    ("use_cache", Inert),
    ("neftune_noise_alpha", Never("NEFTune's embedding noise is not implemented")),
    ("torch_empty_cache_steps", Inert),
    ("auto_find_batch_size", Only(FALSE, "batch sizes are as configured (`check-gpu` finds ones that fit)")),
    ("logging_strategy", Only(&["\"steps\""], "logging is every `logging_steps`")),
    ("log_on_each_node", Inert),
    ("logging_nan_inf_filter", Inert),
    ("include_num_input_tokens_seen", Only(&["\"no\"", "false"], "the tokens seen are not logged")),
    ("log_level", Inert),
    ("log_level_replica", Inert),
    ("disable_tqdm", Inert),
    ("project", Inert),
    ("trackio_space_id", Inert),
    ("trackio_bucket_id", Inert),
    ("trackio_static_space_id", Inert),
    // `"no"` also sets `eval_steps = 0` (see `translate`); `"steps"` without `eval_file` reads
    // the training dataset's test split, as TRL's script (see `Layered`).
    (
        "eval_strategy",
        Means(
            &["\"steps\"", "\"no\""],
            "`\"no\"` evaluates never (`eval_steps = 0`); `\"steps\"` every `eval_steps`, on `eval_file`, else on the `dataset_test_split` of a dataset directory or Hub name `train_file`, as TRL's script",
        ),
    ),
    ("prediction_loss_only", Inert),
    ("eval_do_concat_batches", Inert),
    ("eval_use_gather_object", Inert),
    ("eval_accumulation_steps", Inert),
    ("include_for_metrics", Inert),
    ("batch_eval_metrics", Inert),
    ("save_only_model", Only(FALSE, "checkpoints hold the optimizer state, so that a run resumes")),
    ("save_on_each_node", Only(FALSE, "checkpoints are written once")),
    ("enable_jit_checkpoint", Only(FALSE, NOT_IMPLEMENTED)),
    ("push_to_hub", Only(FALSE, "dpo-train does not upload")),
    ("hub_token", Inert),
    ("hub_private_repo", Inert),
    ("hub_model_id", Inert),
    ("hub_strategy", Inert),
    ("hub_always_push", Inert),
    ("hub_revision", Inert),
    ("load_best_model_at_end", Only(FALSE, "final/ holds the last step's model")),
    // transformers' rotation then keeps the best checkpoint besides the newest (a review's run
    // lost its best, step 6 of 20, to dpo-train's).
    (
        "metric_for_best_model",
        InertWithout(
            "save_total_limit",
            "transformers keeps the best checkpoint besides the newest, dpo-train's rotation the newest only; unset one of them",
        ),
    ),
    ("greater_is_better", Inert),
    ("ignore_data_skip", Only(FALSE, "a resumed run skips the batches it has trained on")),
    ("restore_callback_states_from_checkpoint", Inert),
    ("full_determinism", Only(FALSE, NOT_IMPLEMENTED)),
    ("use_cpu", Only(FALSE, "run on the CPU with `--devices cpu`")),
    ("accelerator_config", Never("dpo-train's launcher sets up the workers (`--gpus`)")),
    ("parallelism_config", Never("dpo-train's launcher sets up the workers (`--gpus`)")),
    ("dataloader_drop_last", Only(FALSE, NOT_IMPLEMENTED)),
    ("dataloader_num_workers", Inert),
    ("dataloader_pin_memory", Inert),
    ("dataloader_persistent_workers", Inert),
    ("dataloader_prefetch_factor", Inert),
    ("dataloader_multiprocessing_context", Inert),
    ("dataloader_in_order", Inert),
    ("remove_unused_columns", Inert),
    ("label_names", Inert),
    ("length_column_name", Inert),
    ("ddp_find_unused_parameters", Inert),
    ("ddp_broadcast_buffers", Inert),
    ("ddp_static_graph", Inert),
    ("ddp_backend", Inert),
    ("fsdp_config", Never("use `sharding` and `offload_optimizer`")),
    ("deepspeed", Never("use `sharding` (the ZeRO stages) and `offload_optimizer`")),
    ("debug", Only(&["\"\""], NOT_IMPLEMENTED)),
    ("skip_memory_metrics", Inert),
    ("do_train", Inert),
    ("do_eval", Inert),
    ("do_predict", Inert),
    ("resume_from_checkpoint", Never("resume with `dpo-train train --resume [RUN_DIR]`")),
    ("local_rank", Inert),
    // TRL's `ScriptArguments` (the `trl dpo` script's data flags).
    ("dataset_name", Rename("train_file")),
    ("dataset_streaming", Inert),
    ("ignore_bias_buffers", Inert),
    // TRL's `ModelConfig`.
    (
        "model_revision",
        Only(&["\"main\""], "the Hugging Face cache's `main` is read: pass another revision's snapshot directory"),
    ),
    ("dtype", Inert),
    ("torch_dtype", Inert),
    ("attn_implementation", Inert),
    (
        "use_peft",
        Means(
            &["true", "false"],
            "`true` trains LoRA adapters, at `lora_r = 16` (TRL's ModelConfig default) unless `lora_r` is set; `false` trains the whole model (a `lora_r` beside it is ignored, as TRL ignores it)",
        ),
    ),
    ("lora_task_type", Only(&["\"CAUSAL_LM\""], "adapters are trained for causal language modelling")),
    ("lora_modules_to_save", Never(NOT_IMPLEMENTED)),
    ("lora_target_parameters", Never(NOT_IMPLEMENTED)),
    ("load_in_8bit", Only(FALSE, "quantised models are not supported")),
    ("load_in_4bit", Only(FALSE, "quantised models are not supported")),
    ("bnb_4bit_quant_type", Inert),
    ("use_bnb_nested_quant", Inert),
    ("bnb_4bit_quant_storage", Inert),
    // TRL's `DatasetMixtureConfig` (`trl dpo --config` recipes with `datasets:`).
    (
        "datasets",
        Only(
            &["[]"],
            "TRL's dataset mixture is not read: give one dataset (`dataset_name`, `--data`), a directory of its files, or the mixture saved as one file",
        ),
    ),
    ("streaming", Only(FALSE, "the data is read from files and its tokenised form cached, not streamed from the Hub")),
    (
        "test_split_size",
        Never("no test split is cut from the training data: give one (`eval_file`, or `dataset_test_split`)"),
    ),
    // Keys earlier TRLs' DPOConfig had, which recipes written for them still set (TRL 1.16's
    // parser refuses them as unknown): refused with what 1.16 says instead.
    ("max_prompt_length", Never(BOTH_ENDS)),
    ("max_completion_length", Never(BOTH_ENDS)),
    (
        "rpo_alpha",
        Never(
            "removed from TRL's DPOConfig before 1.16: RPO is `loss_type = [\"sigmoid\", \"sft\"]` with `loss_weights = [1.0, ALPHA]`",
        ),
    ),
    (
        "generate_during_eval",
        Never("removed from TRL's DPOConfig before 1.16: held-out samples go to samples_val.txt (`num_samples`)"),
    ),
];

/// What replaces the prompt's and the completion's own lengths.
const BOTH_ENDS: &str = "removed from TRL's DPOConfig before 1.16: `max_length` bounds prompt and completion together, and `truncation_mode` says which end an over-long sequence keeps";

/// TRL's `ModelConfig.lora_r`, which `use_peft = true` trains at when `lora_r` is not set.
const TRL_LORA_R: i64 = 16;

/// Accepts or refuses each TRL key of `table` that dpo-train has no key for; the accepted ones
/// leave the table (`eval_strategy = "no"` becomes `eval_steps = 0`; `save_strategy` is a key of
/// dpo-train's own, with TRL's meaning). An error is the key and a one-line message.
pub fn accept_trl_keys(table: &mut toml::Table) -> Result<(), (String, String)> {
    scheduler_kwargs(table).map_err(|m| ("lr_scheduler_kwargs".to_owned(), m))?;
    for (key, treatment) in TRL_KEYS {
        let Some(value) = table.get(*key) else { continue };
        match treatment {
            Inert => {}
            Only(values, reason) => {
                if !values.iter().any(|v| same(value, v)) {
                    let message = format!("`{key} = {value}` is not supported by dpo-train: {reason}");
                    return Err(((*key).to_owned(), message));
                }
            }
            Never(reason) => {
                return Err(((*key).to_owned(), format!("`{key}` is not supported by dpo-train: {reason}")));
            }
            InertWithout(other, reason) if table.contains_key(*other) => {
                let message = format!("`{key}` with `{other}` is not supported by dpo-train: {reason}");
                return Err(((*key).to_owned(), message));
            }
            InertWithout(..) => {}
            Rename(ours) if table.contains_key(*ours) => {
                return Err(((*key).to_owned(), format!("`{key}` and `{ours}` name one setting: set one of them")));
            }
            Rename(ours) => {
                let value = value.clone();
                table.remove(*key);
                table.insert((*ours).to_owned(), value);
                continue;
            }
            Means(values, what) => {
                if !values.iter().any(|v| same(value, v)) {
                    let message = format!("`{key} = {value}` is not supported by dpo-train: {what}");
                    return Err(((*key).to_owned(), message));
                }
            }
        }
        let value = table.remove(*key);
        translate(key, value, table);
    }
    Ok(())
}

/// transformers' `lr_scheduler_kwargs` of `cosine_with_min_lr` (a table, or the JSON text a
/// command line gives): `min_lr_rate` as the key of that name, `min_lr` as its fraction of
/// `learning_rate` (TRL's default 1e-6 where unset); other arguments are left for the refusal.
fn scheduler_kwargs(table: &mut toml::Table) -> Result<(), String> {
    let args = match table.get("lr_scheduler_kwargs") {
        Some(toml::Value::Table(t)) => t.clone(),
        Some(toml::Value::String(text)) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(map)) => {
                map.into_iter().filter_map(|(k, v)| Some((k, toml::Value::Float(v.as_f64()?)))).collect()
            }
            _ => return Ok(()),
        },
        _ => return Ok(()),
    };
    let number = |v: &toml::Value| v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
    let rate = match (args.len(), args.get("min_lr_rate"), args.get("min_lr")) {
        (0, ..) => None,
        (1, Some(rate), None) => number(rate),
        (1, None, Some(min_lr)) => {
            let lr = table.get("learning_rate").and_then(number).unwrap_or(1e-6);
            number(min_lr).map(|m| m / lr)
        }
        _ => return Ok(()),
    };
    if let (Some(rate), Some(set)) = (rate, table.get("min_lr_rate").and_then(number))
        && rate != set
    {
        return Err(format!("gives min_lr_rate {rate} and `min_lr_rate` is {set}: set one of them"));
    }
    table.remove("lr_scheduler_kwargs");
    if let Some(rate) = rate {
        table.insert("min_lr_rate".to_owned(), toml::Value::Float(rate));
    }
    Ok(())
}

/// TRL's names in dpo-train's keys: `eval_strategy = "no"` is `eval_steps = 0`, and `use_peft =
/// true` is LoRA at TRL's rank unless `lora_r` is set (`false`: no LoRA).
fn translate(key: &str, value: Option<toml::Value>, table: &mut toml::Table) {
    let Some(value) = value else { return };
    match key {
        "eval_strategy" if value.as_str() == Some("no") => {
            table.insert("eval_steps".to_owned(), toml::Value::Integer(0));
        }
        "use_peft" if value.as_bool() == Some(true) => {
            table.entry("lora_r").or_insert(toml::Value::Integer(TRL_LORA_R));
        }
        // TRL trains the whole model without `use_peft`, whatever `lora_r` says.
        "use_peft" => {
            table.remove("lora_r");
        }
        _ => {}
    }
}

/// The key of dpo-train's own that a TRL key sets where a config gives it: its other name, or
/// what [`translate`] and [`scheduler_kwargs`] make of it (a config setting `dataset_name` set
/// `train_file`, and the effective config says so). Not `use_peft`: the rank it gives is TRL's
/// default, which an adapter continued at its own rank is not refused for.
pub fn own_key(key: &str) -> Option<&'static str> {
    match key {
        "eval_strategy" => Some("eval_steps"),
        "lr_scheduler_kwargs" => Some("min_lr_rate"),
        _ => TRL_KEYS.iter().find_map(|(k, t)| match t {
            Rename(ours) if *k == key => Some(*ours),
            _ => None,
        }),
    }
}

/// Whether `key` is one of the TRL keys above.
pub fn is_trl_key(key: &str) -> bool {
    TRL_KEYS.iter().any(|(k, _)| *k == key)
}

/// A TRL key's value as given on the command line (`--eval_strategy steps`): a TOML literal
/// where the text is one (`true`, `0`, `"x"`), a boolean for Python's `True` / `False`, else
/// the text as a string (`no` stays a string: `eval_strategy` takes it).
pub fn flag_value(text: &str) -> toml::Value {
    if let Some(b) = ["false", "true"].iter().position(|b| text.eq_ignore_ascii_case(b)) {
        return toml::Value::Boolean(b == 1);
    }
    let literal = format!("v = {text}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v"));
    literal.filter(|v| !v.is_table()).unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// Whether `value` equals the TOML literal `literal` (an integer equals the same float).
fn same(value: &toml::Value, literal: &str) -> bool {
    let Ok(parsed) = format!("v = {literal}").parse::<toml::Table>() else { return false };
    let Some(want) = parsed.get("v") else { return false };
    match (value, want) {
        (toml::Value::Integer(i), toml::Value::Float(f)) | (toml::Value::Float(f), toml::Value::Integer(i)) => {
            *i as f64 == *f
        }
        _ => value == want,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    /// transformers' way to set cosine_with_min_lr's floor, as a table or a command line's JSON.
    #[test]
    fn scheduler_kwargs_give_min_lr_rate() {
        let mut t = table("lr_scheduler_kwargs = { min_lr_rate = 0.2 }\n");
        accept_trl_keys(&mut t).unwrap();
        assert_eq!(t, table("min_lr_rate = 0.2\n"));
        let mut t = table("learning_rate = 2e-6\nlr_scheduler_kwargs = '{\"min_lr\": 1e-7}'\n");
        accept_trl_keys(&mut t).unwrap();
        assert!((t["min_lr_rate"].as_float().unwrap() - 0.05).abs() < 1e-15, "{t:?}");
        let mut t = table("min_lr_rate = 0.1\nlr_scheduler_kwargs = { min_lr_rate = 0.2 }\n");
        assert!(accept_trl_keys(&mut t).unwrap_err().1.contains("set one of them"));
        let mut t = table("lr_scheduler_kwargs = { num_cycles = 2 }\n");
        assert!(accept_trl_keys(&mut t).unwrap_err().1.contains("only cosine_with_min_lr's"));
    }

    /// The best checkpoint transformers' rotation would keep and dpo-train's would not.
    #[test]
    fn a_best_metric_with_a_rotation_is_refused() {
        let mut t = table("metric_for_best_model = \"eval_loss\"\ngreater_is_better = false\nbeta = 0.1\n");
        accept_trl_keys(&mut t).unwrap();
        assert_eq!(t, table("beta = 0.1\n"));
        let mut t = table("metric_for_best_model = \"eval_loss\"\nsave_total_limit = 1\n");
        let (key, message) = accept_trl_keys(&mut t).unwrap_err();
        assert_eq!(key, "metric_for_best_model");
        assert_eq!(
            message,
            "`metric_for_best_model` with `save_total_limit` is not supported by dpo-train: transformers keeps the best checkpoint besides the newest, dpo-train's rotation the newest only; unset one of them"
        );
    }

    #[test]
    fn inert_and_default_values_are_accepted_and_dropped() {
        let mut t = table("dataloader_num_workers = 4\nsync_ref_model = false\noptim = \"adamw_torch\"\nbeta = 0.1\n");
        accept_trl_keys(&mut t).unwrap();
        assert_eq!(t, table("beta = 0.1\n"));
        // `save_strategy` is dpo-train's own key (TRL's meaning): it stays for the config to read.
        let mut t = table("eval_strategy = \"no\"\nsave_strategy = \"no\"\nlabel_smoothing_factor = 0\n");
        accept_trl_keys(&mut t).unwrap();
        assert_eq!(t, table("eval_steps = 0\nsave_strategy = \"no\"\n"));
    }

    #[test]
    fn other_values_are_refused_by_name() {
        let refused = |text: &str| accept_trl_keys(&mut table(text)).unwrap_err();
        assert_eq!(
            refused("sync_ref_model = true\n"),
            (
                "sync_ref_model".to_owned(),
                "`sync_ref_model = true` is not supported by dpo-train: TR-DPO's reference syncing is not implemented"
                    .to_owned()
            )
        );
        assert!(refused("optim = \"sgd\"\n").1.starts_with("`optim = \"sgd\"` is not supported by dpo-train"));
        assert!(refused("deepspeed = \"ds.json\"\n").1.starts_with("`deepspeed` is not supported by dpo-train: use"));
        // An earlier TRL's key (an alignment-handbook recipe's) gets what TRL 1.16 has instead.
        let (key, message) = refused("max_prompt_length = 512\n");
        assert_eq!(key, "max_prompt_length");
        assert!(message.contains("removed from TRL's DPOConfig before 1.16: `max_length` bounds"), "{message}");
    }

    #[test]
    fn trl_script_names_become_ours() {
        let mut t = table("dataset_name = \"trl-lib/ultrafeedback_binarized\"\nuse_peft = true\n");
        accept_trl_keys(&mut t).unwrap();
        assert_eq!(t, table("train_file = \"trl-lib/ultrafeedback_binarized\"\nlora_r = 16\n"));
        let mut t = table("use_peft = true\nlora_r = 32\n");
        accept_trl_keys(&mut t).unwrap();
        assert_eq!(t, table("lora_r = 32\n"));
        let mut t = table("use_peft = false\nlora_r = 32\n");
        accept_trl_keys(&mut t).unwrap();
        assert_eq!(t, table(""));
        let both = accept_trl_keys(&mut table("dataset_name = \"a\"\ntrain_file = \"b\"\n")).unwrap_err();
        assert_eq!(both.1, "`dataset_name` and `train_file` name one setting: set one of them");
        let bad = accept_trl_keys(&mut table("use_peft = \"yes\"\n")).unwrap_err();
        assert!(
            bad.1.starts_with("`use_peft = \"yes\"` is not supported by dpo-train: `true` trains LoRA"),
            "{}",
            bad.1
        );
    }

    #[test]
    fn flag_text_is_a_literal_or_a_string() {
        assert_eq!(flag_value("true"), toml::Value::Boolean(true));
        assert_eq!(flag_value("False"), toml::Value::Boolean(false));
        assert_eq!(flag_value("no"), toml::Value::String("no".into()));
        assert_eq!(flag_value("0"), toml::Value::Integer(0));
        assert_eq!(flag_value("steps"), toml::Value::String("steps".into()));
        assert_eq!(flag_value("trl-lib/x"), toml::Value::String("trl-lib/x".into()));
    }

    #[test]
    fn no_trl_key_is_also_ours() {
        for (key, _) in TRL_KEYS {
            assert!(!super::super::KEYS.iter().any(|k| k.name == *key), "{key} is a key of dpo-train's");
        }
    }
}
