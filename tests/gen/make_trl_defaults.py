#!/usr/bin/env python
"""TRL's DPOConfig defaults, for the parity test `tests/first_run.rs::defaults_are_trls`.

Run from the repository root with the reference venv (`make ref-venv`):

    .venv/bin/python tests/gen/make_trl_defaults.py

It writes tests/fixtures/expected/trl_config_defaults.json: for every DPOConfig / TrainingArguments key
dpo-train also has, the value TRL 1.16 uses when the user does not set it (the dataclass default, with
`bf16` resolved as TRL's `__post_init__` does: `not fp16`). dpo-train's `TrainConfig::default()` must
give the same values.
"""

import dataclasses
import json
import pathlib

import trl
from trl import DPOConfig

# The keys both programs have (dpo-train's own keys, such as `sft_steps`, are not TRL's).
SHARED = [
    "beta", "loss_type", "loss_weights", "label_smoothing", "f_divergence_type", "f_alpha_divergence_coef",
    "ld_alpha", "discopop_tau", "use_weighting", "precompute_ref_log_probs", "max_length", "learning_rate",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "lr_scheduler_type",
    "warmup_steps", "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "num_train_epochs", "max_steps", "seed", "logging_steps", "save_steps", "save_total_limit", "eval_on_start",
    "eval_steps", "gradient_checkpointing", "bf16", "fp16", "ddp_timeout", "run_name",
]


def default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


def main():
    fields = {f.name: f for f in dataclasses.fields(DPOConfig)}
    out = {}
    for key in SHARED:
        value = default(fields[key])
        if key == "bf16" and value is None:
            value = not default(fields["fp16"])  # trl/trainer/base_config.py __post_init__
        if hasattr(value, "value"):  # enums (lr_scheduler_type, f_divergence_type)
            value = value.value
        out[key] = value
    path = pathlib.Path("tests/fixtures/expected/trl_config_defaults.json")
    path.write_text(json.dumps({"_trl_version": trl.__version__, **out}, indent=2) + "\n")
    print(f"wrote {path} ({len(out)} keys, TRL {trl.__version__})")


if __name__ == "__main__":
    main()
