#!/usr/bin/env python
"""Reference numbers for KTO (TRL 1.16's `KTOTrainer`).

Run from the repository root with the reference venv (trl 1.16.0, transformers 5.23.0, torch 2.9.0):

    .venv/bin/python tests/gen/make_kto_fixtures.py

It writes two unpaired datasets derived from the committed preference fixtures (tests/fixtures/data/kto.jsonl
and kto_conv.jsonl, and kto.jsonl's rows as `datasets` writes them to kto.parquet and kto.csv: row i keeps its rejected completion, labelled false, where i % 3 == 1, and its chosen one,
labelled true, elsewhere), then tests/fixtures/expected/trl_kto.json: for every case, `KTOTrainer.evaluate()`
metrics on the whole dataset in one eval batch (CPU, float32, policy models/llama against models/llama-ref, or
a model against a copy of itself), with `per_device_train_batch_size` = the row count, so that the KL
completions rotate over the whole set; the rows `_prepare_dataset` produced (prompt, completion and KL
completion ids, label); and for the cases of GRAD_CASES the loss and every parameter's gradient norm and sum of
one training batch of every row (`_compute_loss` in training mode). Paired data goes through TRL's automatic
unpairing, which dpo-train does with `unpair = true`.
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
DATASETS = {
    "kto": "data/kto.jsonl",
    "kto_conv": "data/kto_conv.jsonl",
    "prefs": "data/prefs.jsonl",
    "prefs_conv": "data/prefs_conv.jsonl",
}
GRAD_CASES = {"kto", "kto_weights", "kto_conversational", "kto_unpaired_prefs", "apo_zero_unpaired"}

# (case name, dataset, policy, reference, TRL config overrides, dpo-train keys)
CASES = [
    ("kto", "kto", "llama", "llama-ref", {}, {"loss_type": "kto"}),
    ("kto_beta_0.5", "kto", "llama", "llama-ref", {"beta": 0.5}, {"loss_type": "kto", "beta": 0.5}),
    ("kto_weights", "kto", "llama", "llama-ref", {"desirable_weight": 1.33, "undesirable_weight": 0.7},
     {"loss_type": "kto", "desirable_weight": 1.33, "undesirable_weight": 0.7}),
    ("kto_max_length_48", "kto", "llama", "llama-ref", {"max_length": 48}, {"loss_type": "kto", "max_length": 48}),
    ("kto_conversational", "kto_conv", "llama", "llama-ref", {}, {"loss_type": "kto"}),
    ("kto_unpaired_prefs", "prefs", "llama", "llama-ref", {}, {"loss_type": "kto", "unpair": True}),
    ("kto_unpaired_prefs_conv", "prefs_conv", "llama", "llama-ref", {}, {"loss_type": "kto", "unpair": True}),
    ("kto_qwen2", "kto", "qwen2", "qwen2", {}, {"loss_type": "kto"}),
    ("kto_qwen3", "kto", "qwen3", "qwen3", {}, {"loss_type": "kto"}),
    # KTOTrainer's other loss: no KL estimate (TRL's calculate_KL is False).
    ("apo_zero_unpaired", "kto", "llama", "llama-ref", {"loss_type": "apo_zero_unpaired"},
     {"loss_type": "apo_zero_unpaired"}),
    ("apo_zero_unpaired_prefs_conv", "prefs_conv", "llama", "llama-ref", {"loss_type": "apo_zero_unpaired", "beta": 0.5},
     {"loss_type": "apo_zero_unpaired", "unpair": True, "beta": 0.5}),
]


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_unpaired(src, dst):
    rows = []
    for i, r in enumerate(read_jsonl(FIX / src)):
        desirable = i % 3 != 1
        rows.append({"prompt": r["prompt"], "completion": r["chosen"] if desirable else r["rejected"], "label": desirable})
    (FIX / dst).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return rows


def gradients(trainer):
    """The loss of one training batch of every row and each parameter's gradient norm and sum."""
    feats = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    batch = trainer.data_collator(feats)
    model = trainer.model
    model.train()
    model.zero_grad()
    loss = trainer._compute_loss(model, batch, return_outputs=False)
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
    from trl import KTOConfig, KTOTrainer

    kto_rows = write_unpaired("data/prefs.jsonl", "data/kto.jsonl")
    # The same rows as `datasets` writes Parquet and CSV (booleans as True/False).
    Dataset.from_list(kto_rows).to_parquet(str(FIX / "data/kto.parquet"))
    Dataset.from_list(kto_rows).to_csv(str(FIX / "data/kto.csv"), index=False)
    write_unpaired("data/prefs_conv.jsonl", "data/kto_conv.jsonl")
    tok = AutoTokenizer.from_pretrained(str(FIX / "tokenizer"))
    tok.pad_token = tok.pad_token or tok.eos_token
    rows = {k: read_jsonl(FIX / v) for k, v in DATASETS.items()}
    cases, tokenized = [], {}
    for name, ds_key, policy_name, ref_name, overrides, ours in CASES:
        print(f"[trl] {name}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            model = AutoModelForCausalLM.from_pretrained(str(FIX / "models" / policy_name), dtype=torch.float32)
            ref = AutoModelForCausalLM.from_pretrained(str(FIX / "models" / ref_name), dtype=torch.float32)
            ds = Dataset.from_list(copy.deepcopy(rows[ds_key]))
            n = len(rows[ds_key]) * (2 if "chosen" in rows[ds_key][0] else 1)
            args = dict(
                output_dir=tmp, use_cpu=True, report_to=[], bf16=False, fp16=False, per_device_eval_batch_size=n,
                per_device_train_batch_size=n, dataloader_num_workers=0, dataloader_drop_last=False, seed=42,
                disable_tqdm=True, save_strategy="no", logging_strategy="no", beta=0.1, max_length=1024,
                gradient_checkpointing=False,
            )
            args.update(overrides)
            trainer = KTOTrainer(model=model, ref_model=ref, args=KTOConfig(**args), processing_class=tok,
                                 train_dataset=ds, eval_dataset=ds)
            metrics = trainer.evaluate()
            clean = {}
            for k, v in metrics.items():
                k = k.removeprefix("eval_")
                if k in {"runtime", "samples_per_second", "steps_per_second", "model_preparation_time", "epoch"}:
                    continue
                clean[k] = float(v)
            cases.append({
                "name": name, "dataset": DATASETS[ds_key], "model": f"models/{policy_name}",
                "ref_model": f"models/{ref_name}", "trl_config": overrides, "config": ours,
                "num_rows": len(trainer.eval_dataset), "metrics": dict(sorted(clean.items())),
            })
            if name in GRAD_CASES:
                cases[-1]["train_step"] = gradients(trainer)
            key = f"{ds_key}_max_length_{trainer.args.max_length}"
            if key not in tokenized:
                tokenized[key] = [
                    {"prompt": list(r["prompt_ids"]), "completion": list(r["completion_ids"]),
                     "kl_completion": list(r.get("KL_completion_ids") or []), "label": bool(r["label"])}
                    for r in trainer.eval_dataset
                ]
    payload = {
        "generator": "tests/gen/make_kto_fixtures.py",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "tokenizer": "tokenizer",
        "note": "metrics: evaluate() without the eval_ prefix, the whole dataset in one batch, its KL completions "
        "rotated over the whole set; tokenized: _prepare_dataset's rows per dataset and max_length (completions "
        "before the collator's cut to max_length)",
        "cases": cases,
        "tokenized": tokenized,
    }
    out = FIX / "expected" / "trl_kto.json"
    out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
