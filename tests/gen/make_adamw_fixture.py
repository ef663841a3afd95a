#!/usr/bin/env python
"""torch's AdamW on two small parameters for the optimizer parity test (needs only torch).

Run from the repository root:

    .venv/bin/python tests/gen/make_adamw_fixture.py

Two float32 parameters of 37 values (not a multiple of any vector width, so the kernel's scalar
tail runs too), one in the decayed group (weight decay 0.1) and one not, take four steps from
fixed gradients with learning rates 1e-3, 5e-4, 2e-3, 1e-3. It writes
tests/fixtures/expected/adamw.json: the start values, each step's gradients and learning rate, and
the values after every step under `torch.optim.AdamW(fused=True)` (transformers' default optimizer,
`adamw_torch_fused`) and under the unfused single-tensor loop (`foreach=False`).
"""

import json
import math
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parents[1] / "fixtures/expected/adamw.json"
NAMES = ["model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
N = 37
LRS = [1e-3, 5e-4, 2e-3, 1e-3]


def f32(values):
    return torch.tensor(values, dtype=torch.float32)


def start():
    return [f32([math.sin(0.3 * i + k) for i in range(N)]) for k in range(len(NAMES))]


def grads(step):
    # Magnitudes from 1e-4 to about 1, both signs, a zero.
    return [f32([math.cos(0.7 * i * (step + 1) + k) * 10.0 ** (-(i % 5)) if i != 3 else 0.0 for i in range(N)])
            for k in range(len(NAMES))]


def run(**kind):
    params = [torch.nn.Parameter(p.clone()) for p in start()]
    opt = torch.optim.AdamW(
        [{"params": [params[0]], "weight_decay": 0.1}, {"params": [params[1]], "weight_decay": 0.0}],
        lr=LRS[0], betas=(0.9, 0.999), eps=1e-8, **kind)
    after = []
    for step, lr in enumerate(LRS):
        for group in opt.param_groups:
            group["lr"] = lr
        for p, g in zip(params, grads(step)):
            p.grad = g.clone()
        opt.step()
        after.append([p.detach().tolist() for p in params])
    return after


def main():
    torch.manual_seed(0)
    fixture = {
        "torch": torch.__version__,
        "names": NAMES,
        "weight_decay": 0.1,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "lrs": LRS,
        "start": [p.tolist() for p in start()],
        "grads": [[g.tolist() for g in grads(step)] for step in range(len(LRS))],
        "fused": run(fused=True),
        "unfused": run(foreach=False),
    }
    OUT.write_text(json.dumps(fixture) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
