#!/usr/bin/env python
"""Preference datasets as the Hugging Face hub ships them, written by `datasets`, and TRL's reading of them.

Run from the repository root after tests/gen/make_fixtures.py (it uses that script's tokenizer, models and rows):

    .venv/bin/python tests/gen/make_hub_fixtures.py

It writes, under tests/fixtures/hub/:

  ultrafeedback/data/{train-0000[01]-of-00002,test-00000-of-00001}.parquet
      trl-lib/ultrafeedback_binarized's shape: `chosen` / `rejected` conversations whose shared leading messages are
      the prompt (no prompt column), plus `score_chosen`, `score_rejected` and a `messages` column; the train split
      sharded in two (Dataset.to_parquet per shard, as `push_to_hub` lays them out).
  hh/{train,test}.jsonl.gz
      Anthropic/hh-rlhf's shape: plain-text `chosen` / `rejected` with the prompt implicit, gzipped JSON Lines.
  standard/{train,test}/000[01].parquet
      explicit `prompt` / `chosen` / `rejected` strings plus an `id` column, one directory per split.

and tests/fixtures/expected/trl_hub.json: for each dataset and split, the rows `datasets.load_dataset(<dir>)` gives
(the hub resolution TRL's scripts rely on), TRL 1.16's tokenised ids per row, and DPOTrainer(policy=llama,
ref=llama-ref).evaluate() metrics (sigmoid loss, beta 0.1, max_length 1024).
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (  # noqa: E402
    EXP_DIR,
    FIX,
    PREFS,
    PREFS_CONV,
    PREFS_IMPLICIT,
    TOK_DIR,
    load_llama_pair,
    load_tokenizer,
    make_config,
)

HUB = FIX / "hub"


def ultrafeedback_rows():
    rows = []
    for i, r in enumerate(PREFS_CONV):
        rows.append(
            {
                "chosen": r["prompt"] + r["chosen"],
                "rejected": r["prompt"] + r["rejected"],
                "score_chosen": 8.0 - i * 0.5,
                "score_rejected": 3.0 + i * 0.25,
                "messages": r["prompt"] + r["chosen"],
            }
        )
    return rows


def hh_rows():
    return [{"chosen": r["chosen"], "rejected": r["rejected"]} for r in PREFS_IMPLICIT]


def standard_rows():
    return [{"id": f"row-{i}", **r} for i, r in enumerate(PREFS)]


def write_parquet(rows, paths):
    """Shards `rows` over `paths` in order (contiguous, as datasets' `shard(contiguous=True)`)."""
    from datasets import Dataset

    ds = Dataset.from_list(rows)
    for k, path in enumerate(paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        ds.shard(num_shards=len(paths), index=k, contiguous=True).to_parquet(str(path))


def write_jsonl_gz(rows, path):
    from datasets import Dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_json(str(path), lines=True, compression="gzip", force_ascii=False)


def write_datasets():
    uf = ultrafeedback_rows()
    write_parquet(uf[:6], [HUB / "ultrafeedback/data/train-00000-of-00002.parquet",
                           HUB / "ultrafeedback/data/train-00001-of-00002.parquet"])
    write_parquet(uf[6:], [HUB / "ultrafeedback/data/test-00000-of-00001.parquet"])
    hh = hh_rows()
    write_jsonl_gz(hh[:6], HUB / "hh/train.jsonl.gz")
    write_jsonl_gz(hh[6:], HUB / "hh/test.jsonl.gz")
    st = standard_rows()
    n = len(st) - 5
    write_parquet(st[:n], [HUB / "standard/train/0000.parquet", HUB / "standard/train/0001.parquet"])
    write_parquet(st[n:], [HUB / "standard/test/0000.parquet"])


def trl_eval(ds):
    from trl import DPOTrainer

    with tempfile.TemporaryDirectory() as tmp:
        args = make_config(tmp, len(ds), {"loss_type": ["sigmoid"]})
        policy, ref = load_llama_pair()
        trainer = DPOTrainer(
            model=policy,
            ref_model=ref,
            args=args,
            processing_class=load_tokenizer(TOK_DIR),
            train_dataset=ds,
            eval_dataset=ds,
        )
        rows = [
            {"prompt_ids": list(r["prompt_ids"]), "chosen_ids": list(r["chosen_ids"]),
             "rejected_ids": list(r["rejected_ids"])}
            for r in trainer.eval_dataset
        ]
        metrics = trainer.evaluate()
    drop = {"runtime", "samples_per_second", "steps_per_second", "model_preparation_time", "epoch"}
    clean = {k.removeprefix("eval_"): float(v) for k, v in metrics.items() if k.removeprefix("eval_") not in drop}
    return rows, dict(sorted(clean.items()))


def main():
    from datasets import load_dataset

    import datasets
    import trl

    if HUB.exists():
        shutil.rmtree(HUB)
    write_datasets()
    cases = []
    for name in ("ultrafeedback", "hh", "standard"):
        for split in ("train", "test"):
            print(f"[hub] {name}/{split}", flush=True)
            ds = load_dataset(str(HUB / name), split=split)
            tokenized, metrics = trl_eval(ds)
            cases.append(
                {
                    "dataset": f"hub/{name}",
                    "split": split,
                    "columns": ds.column_names,
                    "num_rows": len(ds),
                    "rows": tokenized,
                    "metrics": metrics,
                }
            )
    payload = {
        "generator": "tests/gen/make_hub_fixtures.py",
        "versions": {"trl": trl.__version__, "datasets": datasets.__version__},
        "policy_model": "models/llama",
        "ref_model": "models/llama-ref",
        "loss_type": ["sigmoid"],
        "beta": 0.1,
        "max_length": 1024,
        "cases": cases,
    }
    (EXP_DIR / "trl_hub.json").write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
