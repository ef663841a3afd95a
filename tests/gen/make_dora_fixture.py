#!/usr/bin/env python
"""PEFT reference numbers for the DoRA test (needs the reference venv: peft, transformers, torch).

Run from the repository root after make_fixtures.py:

    .venv/bin/python tests/gen/make_dora_fixture.py

It writes, deterministically (seed 0, CPU, float32):

  tests/fixtures/adapters/qwen2-dora/   a PEFT DoRA adapter (r=4, lora_alpha=8, every projection) on
                                        tests/fixtures/models/qwen2 (q/k/v biases, so the bias-free
                                        base output DoRA rescales is exercised), saved by
                                        `save_pretrained`, with `init_lora_weights=False` (B random)
                                        and each magnitude moved off its start (x (1 + 0.2 sin i)), so
                                        that DoRA's column scale is not 1; `base_model_name_or_path`
                                        is rewritten to the relative path `../../models/qwen2`.
  tests/fixtures/expected/dora.json     for two token sequences: the fp32 logits of the adapted model
                                        reloaded from disk (eval mode), and, in training mode, the
                                        gradient of `sum(logits * w)` (w[i] = sin(0.37 i) over the
                                        flattened logits) for every adapter tensor: its L2 norm and
                                        its sum, keyed `{module}.{lora_A|lora_B|lora_magnitude_vector}`.
"""

import json
import sys
from pathlib import Path

import torch
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_peft_fixture import fixture_lora_config, save_fixture_adapter  # noqa: E402

ROOT = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
BASE = ROOT / "models" / "qwen2"
OUT = ROOT / "adapters" / "qwen2-dora"
IDS = [[11, 45, 201, 7, 99, 3, 150, 42], [300, 2, 17, 17, 88, 120, 5, 64]]
PREFIX = "base_model.model."


def load_base():
    return AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)


def save_adapter():
    model = get_peft_model(load_base(), fixture_lora_config(use_dora=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_magnitude_vector" in name:
                i = torch.arange(p.numel(), dtype=torch.float32)
                p.mul_(1.0 + 0.2 * torch.sin(i))
    save_fixture_adapter(model, OUT, "../../models/qwen2")


def key(name):
    # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight -> model.layers.0.self_attn.q_proj.lora_A
    name = name[len(PREFIX):] if name.startswith(PREFIX) else name
    return name.replace(".default.weight", "").replace(".default", "")


def main() -> None:
    torch.manual_seed(0)
    save_adapter()
    # Reload from disk, as a user would.
    model = PeftModel.from_pretrained(load_base(), str(OUT), is_trainable=True)
    ids = torch.tensor(IDS)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    model.train()
    out = model(input_ids=ids).logits
    w = torch.sin(0.37 * torch.arange(out.numel(), dtype=torch.float32)).reshape(out.shape)
    (out * w).sum().backward()
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            g = p.grad.double()
            grads[key(name)] = {"norm": g.norm().item(), "sum": g.sum().item()}
    assert len(grads) == 2 * 7 * 3, len(grads)
    payload = {"input_ids": IDS, "logits": logits.tolist(), "grads": grads}
    (ROOT / "expected" / "dora.json").write_text(json.dumps(payload) + "\n")
    print(f"wrote {OUT} and expected/dora.json ({len(grads)} gradients)")


if __name__ == "__main__":
    main()
