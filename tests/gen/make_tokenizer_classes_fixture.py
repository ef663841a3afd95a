#!/usr/bin/env python
"""Tokenizers whose class transformers 5 rebuilds, and the ids transformers gives with them.

Run from the repository root: .venv/bin/python tests/gen/make_tokenizer_classes_fixture.py

transformers 5 takes only the vocabulary, merges and post-processor from `tokenizer.json` when the
tokenizer's class has its own pipeline (`LlamaTokenizer`: no normalizer, a Metaspace pre-tokenizer
prepending "▁" to the first section only unless `legacy`; `Qwen2Tokenizer`: NFC, Qwen's split
regex, byte-level), so a Llama-2-style `tokenizer.json` (Prepend + Replace normalizer) tokenises
otherwise than the file says. It writes:

  tests/fixtures/tokenizers/llama-sp/          SentencePiece-style BPE (byte fallback, "▁" normaliser,
                                               `<s>` post-processor), `tokenizer_class` LlamaTokenizer,
                                               `legacy` false (Llama-2, TinyLlama), a Llama-2 chat template
  tests/fixtures/tokenizers/llama-sp-legacy/   the same, `legacy` true
  tests/fixtures/tokenizers/llama-sp-no-prefix/ the same, `add_prefix_space` false
  tests/fixtures/tokenizers/llama-bytelevel/   tests/fixtures/tokenizer's byte-level files labelled
                                               LlamaTokenizer (transformers loads them as they are)
  tests/fixtures/expected/tokenizer_classes.json
      per directory (and tests/fixtures/models/qwen2, which transformers reads as Qwen2Tokenizer
      whatever its files say): the class transformers chose, and for each text its ids with and
      without special tokens and their decoding; the chat template's ids for one conversation.
"""

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "tokenizers"

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

TEXTS = [
    "Hello world",
    "The year 2024 has 365 days.",
    "<s>[INST] What is 7 + 5? [/INST] 12</s> and after",
    "  two  spaces and a tab\there",
    "line one\nline two\n\n",
    "café naïve ünïcode 東京",
    "</s>starts with a special token",
]

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
]


def corpus():
    rows = [json.loads(line) for line in open(FIX / "data" / "prefs.jsonl")]
    return [r[k] for r in rows for k in ("prompt", "chosen", "rejected")] * 20


def sentencepiece_style():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    special = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=special, limit_alphabet=60)
    tok.train_from_iterator(corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def write_llama(name, tok, extra):
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "model_max_length": 256,
        "chat_template": LLAMA2_TEMPLATE,
    }
    config.update(extra)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def expected(path):
    tok = AutoTokenizer.from_pretrained(str(path))
    cases = []
    for text in TEXTS:
        with_special = tok(text)["input_ids"]
        cases.append(
            {
                "text": text,
                "input_ids": tok(text, add_special_tokens=False)["input_ids"],
                "input_ids_add_special_tokens": with_special,
                "decoded": tok.decode(with_special),
            }
        )
    chat = tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    if isinstance(chat, dict):
        chat = chat["input_ids"]
    return {
        "dir": str(path.relative_to(ROOT)),
        "class": type(tok).__name__,
        "strings": cases,
        "messages": CONVERSATION,
        "chat_input_ids": list(chat),
    }


def main():
    sp = sentencepiece_style()
    dirs = [
        write_llama("llama-sp", sp, {"legacy": False}),
        write_llama("llama-sp-legacy", sp, {"legacy": True}),
        write_llama("llama-sp-no-prefix", sp, {"legacy": False, "add_prefix_space": False}),
    ]
    byte_level = OUT / "llama-bytelevel"
    shutil.rmtree(byte_level, ignore_errors=True)
    byte_level.mkdir(parents=True)
    shutil.copy(FIX / "tokenizer" / "tokenizer.json", byte_level / "tokenizer.json")
    config = json.loads((FIX / "tokenizer" / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "LlamaTokenizer"
    (byte_level / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    dirs += [byte_level, FIX / "models" / "qwen2"]
    out = FIX / "expected" / "tokenizer_classes.json"
    out.write_text(json.dumps([expected(d) for d in dirs], indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
