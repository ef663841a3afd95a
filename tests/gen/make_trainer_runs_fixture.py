#!/usr/bin/env python
"""TRL 1.16's KTOTrainer and SFTTrainer over several batches, for the tests of the order and the
per-batch numbers that one-batch fixtures cannot see (needs the reference venv: trl 1.16,
transformers, torch, datasets).

Run from the repository root:

    .venv/bin/python tests/gen/make_trainer_runs_fixture.py

It writes tests/fixtures/expected/trl_trainer_runs.json, in float32 on the CPU with
tests/fixtures/models/llama (KTO's reference: models/llama-ref) and tests/fixtures/tokenizer:

- `kto_eval`: `KTOTrainer.evaluate()` over data/kto.jsonl (17 rows) with
  `per_device_train_batch_size` 8 (the blocks the KL completions rotate in) and
  `per_device_eval_batch_size` 4: each batch's loss under its own KL estimate, `eval_loss` their
  mean weighted by the batches' rows, each metric the mean of the batches' values;
- `kto_train`: three logged steps of KTOTrainer over data/kto.jsonl, 4 rows a step, in KTOConfig's
  default sequential order (each step's rows and their KL completions are the data's next block);
- `sft_train`: two logged steps of SFTTrainer over the prompts and chosen completions of
  data/prefs.jsonl with every fifth row's rejected set to its chosen (`SFTTrainer` keeps such
  rows: they are ordinary prompt-completion rows to it), all 17 rows a step, so the sampler's
  order does not matter; its loss, entropy, mean_token_accuracy and num_tokens.
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# make_fixtures sets the environment every reference number is made in (CPU, float32, offline).
from make_fixtures import EXP_DIR, FIX, ROOT, TOK_DIR, load_llama_pair, load_tokenizer, read_jsonl  # noqa: E402

OUT = EXP_DIR / "trl_trainer_runs.json"

# Settings both trainers share, and their dpo-train keys (the same names).
COMMON = {
    "learning_rate": 1e-3,
    "lr_scheduler_type": "constant",
    "logging_steps": 1,
    "seed": 42,
}
KTO_TRAIN = {"per_device_train_batch_size": 4, "max_steps": 3, "beta": 0.1}
KTO_EVAL = {"per_device_train_batch_size": 8, "per_device_eval_batch_size": 4, "beta": 0.1}
SFT_TRAIN = {"per_device_train_batch_size": 17, "max_steps": 2}
# Rows (0-based) of data/prefs.jsonl whose rejected completion is set to the chosen one.
IDENTICAL_EVERY = 5
LOGGED = ["loss", "grad_norm", "kl", "entropy", "mean_token_accuracy", "num_tokens", "epoch",
          "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected"]


def tokenizer():
    tok = load_tokenizer(TOK_DIR)
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


def base_args(extra):
    return dict(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        report_to=[],
        bf16=False,
        fp16=False,
        save_strategy="no",
        gradient_checkpointing=False,
        disable_tqdm=True,
        **COMMON,
        **extra,
    )


def logged(history):
    return [
        {k: float(v) for k, v in row.items() if k in LOGGED or k == "step"}
        for row in history
        if "loss" in row
    ]


def kto_trainer(args, train_rows, eval_rows=None):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    policy, ref = load_llama_pair()
    return KTOTrainer(
        model=policy,
        ref_model=ref,
        args=KTOConfig(**base_args(args)),
        processing_class=tokenizer(),
        train_dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(eval_rows) if eval_rows is not None else None,
    )


def sft_rows():
    rows = read_jsonl(FIX / "data" / "prefs.jsonl")
    for i, row in enumerate(rows):
        if i % IDENTICAL_EVERY == 0:
            row["rejected"] = row["chosen"]
    return rows


def main():
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    kto_rows = read_jsonl(FIX / "data" / "kto.jsonl")
    out = {"common": COMMON}

    trainer = kto_trainer(KTO_EVAL, kto_rows, kto_rows)
    evaluated = trainer.evaluate()
    out["kto_eval"] = {
        "settings": KTO_EVAL,
        "metrics": {k.removeprefix("eval_"): v for k, v in evaluated.items() if k.removeprefix("eval_") in LOGGED},
    }

    trainer = kto_trainer(KTO_TRAIN, kto_rows)
    trainer.train()
    out["kto_train"] = {"settings": KTO_TRAIN, "logged": logged(trainer.state.log_history)}

    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in sft_rows()]
    trainer = SFTTrainer(
        model=load_llama_pair()[0],
        args=SFTConfig(**base_args(SFT_TRAIN)),
        processing_class=tokenizer(),
        train_dataset=Dataset.from_list(rows),
    )
    trainer.train()
    out["sft_train"] = {
        "settings": SFT_TRAIN,
        "identical_every": IDENTICAL_EVERY,
        "logged": logged(trainer.state.log_history),
    }
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
