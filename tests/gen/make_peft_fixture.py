#!/usr/bin/env python
"""PEFT reference numbers for the LoRA tests (needs the reference venv: peft, transformers, torch).

Run from the repository root after make_fixtures.py:

    .venv/bin/python tests/gen/make_peft_fixture.py

It writes, deterministically (seed 0, CPU, float32):

  tests/fixtures/adapters/llama-lora/   a PEFT LoRA adapter (r=4, lora_alpha=8, every projection) on
                                        tests/fixtures/models/llama, saved by `save_pretrained`, with
                                        `init_lora_weights=False` so that B is random and the adapter
                                        changes the logits; `base_model_name_or_path` is rewritten to
                                        the relative path `../../models/llama`.
  tests/fixtures/expected/logits_llama-lora.json
                                        fp32 logits of the adapted model (PeftModel, eval mode) and of
                                        the base with the adapter disabled, for two token sequences.
  tests/fixtures/adapters/llama-layers/ an adapter whose target_modules name single layers' modules
                                        and trailing parts of names, as PEFT matches them, and
  tests/fixtures/expected/logits_llama-layers.json
                                        its last-position logits and the modules PEFT adapted.
"""

import json
import shutil
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
BASE = ROOT / "models" / "llama"
OUT = ROOT / "adapters" / "llama-lora"
IDS = [[11, 45, 201, 7, 99, 3, 150, 42], [300, 2, 17, 17, 88, 120, 5, 64]]


def fixture_lora_config(**extra) -> LoraConfig:
    """r=4, lora_alpha=8 on every projection, B random (`init_lora_weights=False`): an adapter that
    changes the logits from the start."""
    return LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
        **extra,
    )


def save_fixture_adapter(model, out: Path, base: str) -> None:
    """`save_pretrained` into `out` (replaced), the base named by the relative path `base`."""
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(str(out))
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = base
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "README.md").unlink(missing_ok=True)


def main() -> None:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)
    config = fixture_lora_config()
    save_fixture_adapter(get_peft_model(base, config), OUT, "../../models/llama")

    # Reload from disk, as a user would, and record the logits.
    base = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(OUT)).eval()
    ids = torch.tensor(IDS)
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            disabled = model(input_ids=ids).logits
    payload = {"input_ids": IDS, "logits": adapted.tolist(), "base_logits": disabled.tolist()}
    (ROOT / "expected" / "logits_llama-lora.json").write_text(json.dumps(payload) + "\n")
    print(f"wrote {OUT} and expected/logits_llama-lora.json")
    layered()


LAYERED = ROOT / "adapters" / "llama-layers"
# Modules as PEFT matches them: a projection in every layer, one in some layers only (PEFT
# saves `all-linear` as such full names), and a trailing part of a name.
LAYERED_TARGETS = ["v_proj", "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "mlp.up_proj"]


def layered() -> None:
    """tests/fixtures/adapters/llama-layers/ (r=4, B random, the targets above) and
    expected/logits_llama-layers.json: the adapted model's last-position logits for IDS."""
    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)
    config = fixture_lora_config()
    config.target_modules = set(LAYERED_TARGETS)
    save_fixture_adapter(get_peft_model(base, config), LAYERED, "../../models/llama")
    base = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(LAYERED)).eval()
    with torch.no_grad():
        adapted = model(input_ids=torch.tensor(IDS)).logits[:, -1]
    adapters = sorted(n for n, _ in model.named_parameters() if "lora_A" in n)
    payload = {"input_ids": IDS, "last_logits": adapted.tolist(), "adapted": adapters}
    (ROOT / "expected" / "logits_llama-layers.json").write_text(json.dumps(payload) + "\n")
    print(f"wrote {LAYERED} and expected/logits_llama-layers.json")


if __name__ == "__main__":
    main()
