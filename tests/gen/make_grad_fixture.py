#!/usr/bin/env python
"""TRL's training gradients for the gradient parity test (needs the reference venv: trl, torch).

Run from the repository root after make_fixtures.py:

    .venv/bin/python tests/gen/make_grad_fixture.py

It builds TRL 1.16's DPOTrainer exactly as make_fixtures.py does for its sigmoid case (policy
tests/fixtures/models/llama, reference models/llama-ref, data/prefs.jsonl, beta 0.1, float32, CPU),
collates every pair into one training batch with TRL's collator, runs `compute_loss` in training
mode and backpropagates it. It writes tests/fixtures/expected/trl_grads.json: the loss, the
collated batch, the reference's sequence log-probs, and for every parameter the L2 norm and the sum
of its gradient (both independent of the [out, in] / [in, out] layout).
"""

import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (  # noqa: E402
    EXP_DIR,
    FIX,
    TOK_DIR,
    completion_logps,
    load_llama_pair,
    load_tokenizer,
    make_config,
    read_jsonl,
)


def main():
    from datasets import Dataset
    from trl import DPOTrainer

    import trl

    torch.manual_seed(0)
    rows = read_jsonl(FIX / "data/prefs.jsonl")
    with tempfile.TemporaryDirectory() as tmp:
        args = make_config(tmp, len(rows), {"loss_type": ["sigmoid"]})
        policy, ref = load_llama_pair()
        ds = Dataset.from_list(rows)
        trainer = DPOTrainer(
            model=policy, ref_model=ref, args=args, processing_class=load_tokenizer(TOK_DIR), train_dataset=ds
        )
        feats = [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in trainer.train_dataset]
        batch = trainer.data_collator(feats)
        model = trainer.model
        model.train()
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
        ref_logps = completion_logps(trainer.ref_model, batch)
        grads = {
            name: {"norm": p.grad.double().norm().item(), "sum": p.grad.double().sum().item()}
            for name, p in model.named_parameters()
            if p.grad is not None
        }
    payload = {
        "generator": "tests/gen/make_grad_fixture.py",
        "versions": {"trl": trl.__version__, "torch": torch.__version__},
        "policy_model": "models/llama",
        "ref_model": "models/llama-ref",
        "dataset": "data/prefs.jsonl",
        "beta": 0.1,
        "loss": loss.item(),
        "input_ids": batch["input_ids"].tolist(),
        "completion_mask": batch["completion_mask"].tolist(),
        "ref_logps": ref_logps.tolist(),
        "grads": grads,
    }
    (EXP_DIR / "trl_grads.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"loss {loss.item():.6f}, {len(grads)} gradients", flush=True)


if __name__ == "__main__":
    sys.exit(main())
