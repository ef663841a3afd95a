"""Print transformers' float32 logits for a model directory written by dpo-train.

Usage: python tests/gen/check_export.py MODEL_DIR IDS_JSON
IDS_JSON is a JSON list of token-id lists of equal length. Prints {"logits": [[[...]]]}.
Used by tests/export.rs to check that `final/` loads in transformers with the same logits.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    model_dir, ids = sys.argv[1], json.loads(sys.argv[2])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids)).logits
    json.dump({"logits": logits.tolist()}, sys.stdout)


if __name__ == "__main__":
    main()
