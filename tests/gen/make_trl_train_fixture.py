#!/usr/bin/env python
"""TRL's logged training rows for the training-trajectory parity test (needs the reference venv:
trl, transformers, torch).

Run from the repository root after make_fixtures.py:

    .venv/bin/python tests/gen/make_trl_train_fixture.py

TRL 1.16's DPOTrainer trains tests/fixtures/models/llama (reference: models/llama-ref) in float32
on the CPU for 2 epochs over 17 copies of the first row of data/prefs.jsonl (identical rows, so
the order TRL's sampler draws them in does not matter), 2 rows a micro-batch and 2 micro-batches
a step (9 micro-batches an epoch: every epoch ends on a step of one micro-batch), with settings
whose meaning is transformers' own: `weight_decay` on every parameter but biases and norms (the
tied embedding too), `lr_scheduler_type = "constant"`, which takes no warm-up even with
`warmup_steps` set, gradient clipping, and `epoch` counted in micro-batches. It writes
tests/fixtures/expected/trl_train.json: the settings and each step's logged row (loss,
grad_norm, learning_rate, epoch and the rewards), and TRL's evaluation of the untrained model
against models/llama-ref over data/prefs.jsonl in batches of 8 (each metric the mean of the
batches' values).
"""

import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import EXP_DIR, FIX, TOK_DIR, load_llama_pair, load_tokenizer, make_config, read_jsonl  # noqa: E402

ROWS = 17
SETTINGS = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "num_train_epochs": 2,
    "learning_rate": 5e-3,
    "weight_decay": 0.5,
    "lr_scheduler_type": "constant",
    "warmup_steps": 2,
    "max_grad_norm": 1.0,
    "logging_steps": 1,
}
EVAL_BATCH = 8
LOGGED = ["loss", "grad_norm", "learning_rate", "epoch", "rewards/chosen", "rewards/rejected", "rewards/margins"]


def llama_trainer(args, rows, eval_rows=None):
    """TRL's DPOTrainer of models/llama against models/llama-ref over `rows`."""
    from datasets import Dataset
    from trl import DPOTrainer

    policy, ref = load_llama_pair()
    evaluated = Dataset.from_list(eval_rows) if eval_rows is not None else None
    return DPOTrainer(
        model=policy,
        ref_model=ref,
        args=args,
        processing_class=load_tokenizer(TOK_DIR),
        train_dataset=Dataset.from_list(rows),
        eval_dataset=evaluated,
    )


def main():
    torch.manual_seed(0)
    rows = [read_jsonl(FIX / "data/prefs.jsonl")[0]] * ROWS
    with tempfile.TemporaryDirectory() as tmp:
        args = make_config(tmp, ROWS, {"loss_type": ["sigmoid"], "logging_strategy": "steps", **SETTINGS})
        trainer = llama_trainer(args, rows)
        trainer.train()
        logged = [
            {"step": h["step"], **{k: h[k] for k in LOGGED}} for h in trainer.state.log_history if "loss" in h
        ]
    # Evaluation in batches of 8 over data/prefs.jsonl's 17 pairs: TRL's metrics are the means of
    # the three batches' values (the last of one pair), its loss the mean over the pairs.
    pairs = read_jsonl(FIX / "data/prefs.jsonl")
    with tempfile.TemporaryDirectory() as tmp:
        args = make_config(tmp, len(pairs), {"loss_type": ["sigmoid"], "per_device_eval_batch_size": EVAL_BATCH})
        trainer = llama_trainer(args, pairs, eval_rows=pairs)
        skip = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch")
        evaluated = {k[len("eval_") :]: v for k, v in trainer.evaluate().items() if k not in skip}
    out = {"rows": ROWS, "settings": SETTINGS, "logged": logged, "eval_batch": EVAL_BATCH, "evaluated": evaluated}
    (EXP_DIR / "trl_train.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {len(logged)} steps to {EXP_DIR / 'trl_train.json'}")


if __name__ == "__main__":
    main()
