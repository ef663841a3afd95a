"""Print transformers' float32 logits for a model directory written by dpo-train.

Usage: python tests/gen/check_export.py MODEL_DIR IDS_JSON
IDS_JSON is a JSON list of token-id lists of equal length. Prints {"logits": [[[...]]]}.
MODEL_DIR is a full model, loaded as its config.json says (`dtype="auto"`, transformers 5's
default), which must be float32 (the weights dpo-train writes); or a PEFT adapter, loaded with
`PeftModel.from_pretrained` on the base named by its `base_model_name_or_path`. Used by tests/export.rs and tests/lora.rs to check that
what a training run writes loads in transformers / PEFT with the same logits.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def load(model_dir: str):
    adapter = Path(model_dir) / "adapter_config.json"
    if not adapter.is_file():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        if model.dtype != torch.float32:
            sys.exit(f"{model_dir}/config.json loads the float32 weights as {model.dtype}")
        return model
    from peft import PeftModel

    base_dir = json.loads(adapter.read_text())["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, model_dir)


def main() -> None:
    model_dir, ids = sys.argv[1], json.loads(sys.argv[2])
    model = load(model_dir).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids)).logits
    json.dump({"logits": logits.tolist()}, sys.stdout)


if __name__ == "__main__":
    main()
