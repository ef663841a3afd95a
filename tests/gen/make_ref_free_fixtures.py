#!/usr/bin/env python
"""Reference numbers for the reference-free preference losses (SimPO, CPO, AlphaPO, ORPO).

Run from the repository root with the reference venv (trl 1.16.0, transformers 5.23.0, torch 2.9.0):

    .venv/bin/python tests/gen/make_ref_free_fixtures.py

It reads the committed fixtures (tests/fixtures/{tokenizer,models,data}, made by make_fixtures.py) and writes
tests/fixtures/expected/trl_ref_free.json: for every case, TRL 1.16's `CPOTrainer` or `ORPOTrainer`
(`trl.experimental`) `evaluate()` metrics on the whole dataset in one eval batch (CPU, float32), and, once per
dataset and trainer family, the rows its `tokenize_row` produced (prompt ids, and each side's prompt and
completion ids), and for the cases of GRAD_CASES the loss and every parameter's gradient norm and sum of one
training batch of every row. dpo-train maps the trainers' settings onto its keys as follows:

    CPOConfig(loss_type="sigmoid")          -> loss_type = "cpo"
    CPOConfig(loss_type="simpo")            -> loss_type = "simpo"
    CPOConfig(loss_type="alphapo", alpha=a) -> loss_type = "alphapo", alpha = a   (TRL sets cpo_alpha = 0)
    ORPOConfig(beta=b)                      -> loss_type = "orpo", beta = b
"""

import copy
import json
import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

transformers.logging.set_verbosity_error()

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
DATASETS = {"prefs": "data/prefs.jsonl", "prefs_conv": "data/prefs_conv.jsonl", "prefs_implicit": "data/prefs_implicit.jsonl"}

# Cases whose training gradients are recorded too (the whole dataset as one training batch).
GRAD_CASES = {"cpo", "simpo", "alphapo_0.25", "orpo", "orpo_conversational"}

# (case name, trainer, dataset, model, TRL config overrides, dpo-train keys)
CASES = [
    ("cpo", "cpo", "prefs", "llama", {"loss_type": "sigmoid"}, {"loss_type": "cpo"}),
    ("cpo_beta_0.5_ls_0.1", "cpo", "prefs", "llama", {"loss_type": "sigmoid", "beta": 0.5, "label_smoothing": 0.1},
     {"loss_type": "cpo", "beta": 0.5, "label_smoothing": 0.1}),
    ("cpo_alpha_0", "cpo", "prefs", "llama", {"loss_type": "sigmoid", "cpo_alpha": 0.0},
     {"loss_type": "cpo", "cpo_alpha": 0.0}),
    ("simpo", "cpo", "prefs", "llama", {"loss_type": "simpo"}, {"loss_type": "simpo"}),
    ("simpo_pure_gamma_1", "cpo", "prefs", "llama", {"loss_type": "simpo", "cpo_alpha": 0.0, "simpo_gamma": 1.0, "beta": 2.0},
     {"loss_type": "simpo", "cpo_alpha": 0.0, "simpo_gamma": 1.0, "beta": 2.0}),
    ("alphapo_0.25", "cpo", "prefs", "llama", {"loss_type": "alphapo", "alpha": 0.25},
     {"loss_type": "alphapo", "alpha": 0.25}),
    ("cpo_alpha_-0.1", "cpo", "prefs", "llama", {"loss_type": "sigmoid", "alpha": -0.1},
     {"loss_type": "cpo", "alpha": -0.1}),
    ("orpo", "orpo", "prefs", "llama", {}, {"loss_type": "orpo"}),
    ("orpo_beta_0.5", "orpo", "prefs", "llama", {"beta": 0.5}, {"loss_type": "orpo", "beta": 0.5}),
    ("cpo_max_length_96", "cpo", "prefs", "llama", {"loss_type": "sigmoid", "max_length": 96},
     {"loss_type": "cpo", "max_length": 96}),
    ("orpo_max_length_96", "orpo", "prefs", "llama", {"max_length": 96}, {"loss_type": "orpo", "max_length": 96}),
    ("cpo_conversational", "cpo", "prefs_conv", "llama", {"loss_type": "sigmoid"}, {"loss_type": "cpo"}),
    ("orpo_conversational", "orpo", "prefs_conv", "llama", {}, {"loss_type": "orpo"}),
    ("simpo_implicit", "cpo", "prefs_implicit", "llama", {"loss_type": "simpo"}, {"loss_type": "simpo"}),
    ("simpo_qwen2", "cpo", "prefs", "qwen2", {"loss_type": "simpo"}, {"loss_type": "simpo"}),
    ("orpo_qwen2", "orpo", "prefs", "qwen2", {}, {"loss_type": "orpo"}),
    ("cpo_qwen3", "cpo", "prefs", "qwen3", {"loss_type": "sigmoid"}, {"loss_type": "cpo"}),
    ("orpo_qwen3", "orpo", "prefs", "qwen3", {}, {"loss_type": "orpo"}),
]


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def trainer_for(kind, tmp, n_rows, overrides, model, tok, ds):
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    base = dict(
        output_dir=tmp, use_cpu=True, report_to=[], bf16=False, fp16=False, per_device_eval_batch_size=n_rows,
        per_device_train_batch_size=n_rows, dataloader_num_workers=0, dataloader_drop_last=False, seed=42,
        disable_tqdm=True, save_strategy="no", logging_strategy="no", beta=0.1, max_length=1024,
    )
    base.update(overrides)
    config, trainer = (CPOConfig, CPOTrainer) if kind == "cpo" else (ORPOConfig, ORPOTrainer)
    return trainer(model=model, args=config(**base), processing_class=tok, train_dataset=ds, eval_dataset=ds)


def gradients(trainer):
    """The loss of one training batch of every row (the trainer's collator, `get_batch_loss_metrics` in training
    mode, dropout off as the trainers' default) and each parameter's gradient norm and sum."""
    feats = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    batch = trainer.data_collator(feats)
    model = trainer.model
    model.train()
    model.zero_grad()
    loss, _ = trainer.get_batch_loss_metrics(model, batch, train_eval="train")
    loss.backward()
    grads = {
        name: {"norm": p.grad.double().norm().item(), "sum": p.grad.double().sum().item()}
        for name, p in model.named_parameters()
        if p.grad is not None
    }
    return {"loss": loss.item(), "grads": grads}


def main():
    from datasets import Dataset

    import trl

    tok = AutoTokenizer.from_pretrained(str(FIX / "tokenizer"))
    # The fixture tokenizer has no pad token; DPOTrainer pads with eos, these trainers need one set.
    tok.pad_token = tok.pad_token or tok.eos_token
    rows = {k: read_jsonl(FIX / v) for k, v in DATASETS.items()}
    cases, tokenized = [], {}
    for name, kind, ds_key, model_name, overrides, ours in CASES:
        print(f"[trl] {name}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            model = AutoModelForCausalLM.from_pretrained(str(FIX / "models" / model_name), dtype=torch.float32)
            ds = Dataset.from_list(copy.deepcopy(rows[ds_key]))
            trainer = trainer_for(kind, tmp, len(rows[ds_key]), copy.deepcopy(overrides), model, tok, ds)
            metrics = trainer.evaluate()
            clean = {}
            for k, v in metrics.items():
                k = k.removeprefix("eval_")
                if k in {"runtime", "samples_per_second", "steps_per_second", "model_preparation_time", "epoch"}:
                    continue
                clean[k] = float(v)
            cases.append({
                "name": name, "trainer": kind, "dataset": DATASETS[ds_key], "model": f"models/{model_name}",
                "trl_config": overrides, "config": ours, "num_rows": len(trainer.eval_dataset),
                "metrics": dict(sorted(clean.items())),
            })
            if name in GRAD_CASES:
                cases[-1]["train_step"] = gradients(trainer)
            key = f"{ds_key}_max_length_{trainer.args.max_length}"
            if key not in tokenized:
                tokenized[key] = [
                    {
                        "prompt": list(r["prompt_input_ids"]),
                        "chosen_prompt": [t for t, l in zip(r["chosen_input_ids"], r["chosen_labels"]) if l == -100],
                        "chosen": [t for t, l in zip(r["chosen_input_ids"], r["chosen_labels"]) if l != -100],
                        "rejected_prompt": [t for t, l in zip(r["rejected_input_ids"], r["rejected_labels"]) if l == -100],
                        "rejected": [t for t, l in zip(r["rejected_input_ids"], r["rejected_labels"]) if l != -100],
                    }
                    for r in trainer.eval_dataset
                ]
    payload = {
        "generator": "tests/gen/make_ref_free_fixtures.py",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "tokenizer": "tokenizer",
        "note": "metrics: evaluate() without the eval_ prefix, the whole dataset in one batch; tokenized: "
        "tokenize_row's rows (CPO and ORPO share it) per dataset and max_length, the prompt and each side's "
        "prompt/completion split by the labels",
        "cases": cases,
        "tokenized": tokenized,
    }
    out = FIX / "expected" / "trl_ref_free.json"
    out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
