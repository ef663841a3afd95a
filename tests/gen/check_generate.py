"""Greedy completions by transformers' `generate`, the reference for `dpo-train generate`.

Usage: check_generate.py MODEL_DIR PROMPTS_JSON MAX_NEW_TOKENS

PROMPTS_JSON is a list whose items are strings (encoded as `tokenizer(prompt)` encodes them, with
the tokenizer's special tokens) or lists of {role, content} messages (rendered by the chat template
with the generation prompt). Prints {"completions": [...], "without_special_tokens": [...]}: the
second list encodes the string prompts with `add_special_tokens=False`, so a caller can check its
prompts are ones where the special tokens change the answer.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def complete(model, tok, ids, n):
    out = model.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=n,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)


def main():
    model_dir, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with_special, without = [], []
    for p in prompts:
        if isinstance(p, str):
            with_special.append(complete(model, tok, tok(p)["input_ids"], n))
            without.append(complete(model, tok, tok(p, add_special_tokens=False)["input_ids"], n))
        else:
            ids = tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
            with_special.append(complete(model, tok, ids, n))
            without.append(with_special[-1])
    print(json.dumps({"completions": with_special, "without_special_tokens": without}))


if __name__ == "__main__":
    main()
