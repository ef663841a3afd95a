#!/usr/bin/env python3
"""Measures the activation bytes transformers' eager autograd keeps for a Llama/Qwen2 decoder
layer, the fixture crates/check_gpu/src/memory.rs's activation formula is tested against
(crates/check_gpu/tests/fixtures/activation_bytes.json).

For each shape it builds a small random-weight model (CPU, nothing downloaded) with 1 and with 2
decoder layers, runs the forward on `rows x seq` token ids (no attention mask: full sequences,
so sdpa takes its causal, GQA-native path) followed by the log-softmax a DPO loss takes of the
fp32 logits, and counts the bytes of every tensor autograd saves for the backward
(`torch.autograd.graph.saved_tensors_hooks`), once per storage (by `data_ptr`), leaving out the
parameters (counted by the estimate's weight terms). One layer's bytes are the difference of the
two runs; the head's (embedding ids, final norm, LM head, fp32 log-softmax) are the one-layer run
less one layer. With gradient checkpointing (`use_reentrant=True`, so the saved inputs pass
through the hooks) a layer keeps only what its checkpoint saves.

Run from the repository root: `.venv/bin/python crates/check_gpu/tests/gen/activation_bytes.py`
(writes the fixture; `--print` prints it instead).
"""

import json
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

OUT = "crates/check_gpu/tests/fixtures/activation_bytes.json"

# The config keys of a shape, in SHAPES' order after the model type; the fixture uses the same names.
KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
# (model_type, hidden, intermediate, heads, kv heads, head_dim, vocab)
SHAPES = [
    ("llama", 256, 688, 8, 8, 32, 1000),
    ("llama", 256, 1024, 8, 2, 32, 4096),
    ("llama", 384, 1536, 6, 2, 64, 2048),
    ("llama", 512, 768, 16, 4, 32, 3000),
    ("llama", 192, 512, 4, 1, 64, 8192),
    ("qwen2", 256, 1408, 4, 2, 64, 2048),
    ("qwen2", 448, 1216, 7, 1, 64, 5000),
]
# (rows, seq): the rows are chosen and rejected together, 2b.
BATCHES = [(2, 64), (4, 128)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build(kind, *dims, layers, dtype, checkpointing):
    common = dict(
        zip(KEYS, dims),
        num_hidden_layers=layers,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    model = model.to(dtype).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    return model


def saved_bytes(model, rows, seq):
    """Bytes of the distinct storages autograd saves in one forward, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    ids = torch.randint(0, model.config.vocab_size, (rows, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=ids, use_cache=False).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        out = logp.gather(-1, ids.unsqueeze(-1)).sum()
    del out, logp, logits
    return sum(seen.values())


def measure(shape, dtype_name, rows, seq, checkpointing):
    torch.manual_seed(0)
    dtype = DTYPES[dtype_name]
    one, two = (saved_bytes(build(*shape, layers=n, dtype=dtype, checkpointing=checkpointing), rows, seq) for n in (1, 2))
    tokens = rows * seq
    return (two - one) / tokens, (one - (two - one)) / tokens


def main():
    torch.set_num_threads(2)
    cases = []
    for shape in SHAPES:
        kind, dims = shape[0], shape[1:]
        for dtype_name in DTYPES:
            for rows, seq in BATCHES:
                layer, head = measure(shape, dtype_name, rows, seq, False)
                kept, _ = measure(shape, dtype_name, rows, seq, True)
                cases.append(
                    dict(
                        model_type=kind,
                        **dict(zip(KEYS, dims)),
                        dtype=dtype_name,
                        rows=rows,
                        seq_len=seq,
                        layer_bytes_per_token=layer,
                        head_bytes_per_token=head,
                        checkpointed_layer_bytes_per_token=kept,
                    )
                )
                print(*shape, dtype_name, rows, seq, layer, head, kept, file=sys.stderr)
    doc = dict(
        generator="crates/check_gpu/tests/gen/activation_bytes.py",
        torch=torch.__version__,
        transformers=transformers.__version__,
        what="bytes autograd saves per token (rows*seq), per decoder layer and for the head, parameters left out",
        cases=cases,
    )
    text = json.dumps(doc, indent=1) + "\n"
    if "--print" in sys.argv:
        print(text, end="")
    else:
        with open(OUT, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
