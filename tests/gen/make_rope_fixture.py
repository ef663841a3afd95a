#!/usr/bin/env python
"""transformers' rotary angles for each RoPE scaling type dpo-train reads (needs transformers).

Run from the repository root (the reference venv, `make ref-venv`):

    .venv/bin/python tests/gen/make_rope_fixture.py

For each case, a `config.json` as a Hub model ships it (the old `rope_scaling` layout or
transformers 5's `rope_parameters`), the model's own rotary module (`LlamaRotaryEmbedding`,
`Qwen2RotaryEmbedding`, ...) is built from it and run on a set of positions: it writes
tests/fixtures/expected/rope.json with the config and the float32 cos and sin, `[L, head_dim]`, as
the attention layers receive them (attention scaling included). The positions reach past 4096,
where dpo-train grows its tables.
"""

import json
from pathlib import Path

import torch
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

OUT = Path(__file__).resolve().parents[1] / "fixtures/expected/rope.json"
POSITIONS = [0, 1, 2, 3, 17, 255, 1000, 4095, 4096, 7777, 12000, 16383]

# The architecture keys every case shares; head_dim and the rope keys vary.
BASE = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16384}

CASES = {
    "linear (old layout)": {"model_type": "llama", "rope_theta": 10000.0,
                            "rope_scaling": {"type": "linear", "factor": 4.0}},
    "linear (rope_parameters)": {"model_type": "llama",
                                 "rope_parameters": {"rope_type": "linear", "factor": 2.5, "rope_theta": 500000.0}},
    "dynamic": {"model_type": "llama", "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "yarn, Qwen2.5's long-context recipe": {
        "model_type": "qwen2", "head_dim": 128, "hidden_size": 512, "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
    "yarn, mscale over mscale_all_dim, betas, no truncation": {
        "model_type": "llama", "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                         "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2,
                         "truncate": False}},
    "yarn, attention_factor given, original length from max_position_embeddings": {
        "model_type": "qwen3", "head_dim": 32,
        "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.25,
                            "rope_theta": 1000000.0}},
    "yarn, factor 1": {"model_type": "mistral", "rope_theta": 10000.0,
                       "rope_scaling": {"type": "yarn", "factor": 1.0, "original_max_position_embeddings": 8192}},
    # How the Qwen and Llama docs turn on long context: `rope_scaling` added to a transformers 5
    # config. It replaces `rope_parameters` whole, their theta included.
    "rope_scaling beside rope_parameters": {
        "model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "rope_theta at the top level and in rope_parameters": {
        "model_type": "llama", "rope_theta": 500.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "empty rope_scaling beside rope_parameters": {
        "model_type": "qwen2", "rope_scaling": {},
        "rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 1000000.0}},
    "partial_rotary_factor with plain RoPE": {"model_type": "qwen3", "head_dim": 32, "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.5},
}

ROTARY = {"llama": LlamaRotaryEmbedding, "mistral": LlamaRotaryEmbedding, "qwen2": Qwen2RotaryEmbedding,
          "qwen3": Qwen3RotaryEmbedding}


def angles(config_json):
    config = AutoConfig.for_model(**json.loads(json.dumps(config_json)))
    rotary = ROTARY[config_json["model_type"]](config)
    x = torch.zeros(1, dtype=torch.float32)
    positions = [p for p in POSITIONS if p < config_json["max_position_embeddings"]]
    cos, sin = rotary(x, torch.tensor([positions]))
    return positions, cos[0].tolist(), sin[0].tolist()


def main():
    torch.manual_seed(0)
    cases = []
    for name, keys in CASES.items():
        config_json = {**BASE, **keys}
        positions, cos, sin = angles(config_json)
        cases.append({"name": name, "config": config_json, "positions": positions, "cos": cos, "sin": sin})
    OUT.write_text(json.dumps({"transformers": __import__("transformers").__version__, "cases": cases}) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
