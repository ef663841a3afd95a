#!/usr/bin/env python
"""TRL's `truncation_mode="keep_end"` on the fixture data: tests/fixtures/expected/tokenized_prefs_keep_end_16.json.

Run from the repository root with the reference venv (trl 1.16.0, transformers 5.23.0):

    .venv/bin/python tests/gen/make_keep_end_fixture.py

TRL 1.16 deprecates keep_end (a FutureWarning, removal announced for 2.0) but still implements it:
`DPOTrainer._prepare_dataset` drops no row for a long prompt (it only does so under keep_start), and
`DataCollatorForPreference.torch_call` cuts each prompt+completion sequence to its last `max_length`
tokens (`ids[-max_length:]`, the masks alike). This records both, in the format of the
`tokenized_<dataset>.json` files make_fixtures.py writes, for tests/tokenize_parity.rs, and
`DPOTrainer.evaluate`'s metrics for models/llama against models/llama-ref (every pair in one batch,
as make_fixtures.py's trl_eval.json), for `dpo-train eval --truncation-mode keep_end` in
tests/eval_cli.rs.
"""

import json
import tempfile
import warnings

from make_fixtures import EXP_DIR, FIX, TOK_DIR, load_llama_pair, load_tokenizer, make_config, read_jsonl

DATASET = "data/prefs.jsonl"
MAX_LENGTH = 16


def main():
    from datasets import Dataset
    from trl import DPOTrainer

    rows = read_jsonl(FIX / DATASET)
    tok = load_tokenizer(TOK_DIR)
    model, ref = load_llama_pair()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # keep_end's deprecation notice
        args = make_config(tmp, len(rows), {"max_length": MAX_LENGTH, "truncation_mode": "keep_end"})
        ds = Dataset.from_list(rows)
        trainer = DPOTrainer(
            model=model, ref_model=ref, args=args, processing_class=tok, train_dataset=ds, eval_dataset=ds
        )
        prepared = trainer.eval_dataset
        feats = [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in prepared]
        batch = trainer.data_collator(feats)
        metrics = trainer.evaluate()
    drop = {"runtime", "samples_per_second", "steps_per_second", "model_preparation_time", "epoch"}
    metrics = {k.removeprefix("eval_"): float(v) for k, v in metrics.items()}
    metrics = dict(sorted((k, v) for k, v in metrics.items() if k not in drop))
    payload = {
        "dataset": DATASET,
        "max_length": MAX_LENGTH,
        "truncation_mode": args.truncation_mode,
        "num_rows": len(rows),
        "num_rows_after_preprocessing": len(prepared),
        "dropped_rows": len(rows) - len(prepared),
        "pad_token_id": tok.pad_token_id,
        "note": "rows: TRL _prepare_dataset output (before truncation), in order; collated: "
        "DataCollatorForPreference output for the whole set as one batch (chosen rows, then rejected rows; "
        "each sequence cut to its last max_length tokens; right-padded)",
        "rows": [
            {
                "prompt_input_ids": list(r["prompt_ids"]),
                "chosen_input_ids": list(r["chosen_ids"]),
                "rejected_input_ids": list(r["rejected_ids"]),
            }
            for r in prepared
        ],
        "collated": {k: batch[k].tolist() for k in ("input_ids", "attention_mask", "completion_mask")},
        "policy_model": "models/llama",
        "ref_model": "models/llama-ref",
        "metrics": metrics,
    }
    out = EXP_DIR / f"tokenized_prefs_keep_end_{MAX_LENGTH}.json"
    out.write_text(json.dumps(payload, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
