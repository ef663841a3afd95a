#!/usr/bin/env python
"""Reference-number generator for the Rust DPO re-implementation.

Run from the repository root (needs the reference venv: `make ref-venv`, i.e. torch 2.9.0, trl 1.16.0,
transformers 5.23.0, tokenizers, datasets; no network access is needed, everything is built locally):

    .venv/bin/python tests/gen/make_fixtures.py

It (re)generates everything under tests/fixtures/ deterministically (fixed seeds, CPU, float32):

  tests/fixtures/tokenizer/            byte-level BPE tokenizer (GPT-2/Qwen style: ByteLevel pre-tokenizer + decoder,
                                       no normalizer, no post-processor => no BOS/EOS added), trained with `tokenizers`
                                       on an in-script English corpus; specials <|endoftext|>, <|im_start|>, <|im_end|>;
                                       saved by transformers (tokenizer.json, tokenizer_config.json with eos_token
                                       "<|im_end|>", bos_token/pad_token null, Qwen2 ChatML chat_template inline),
                                       plus a legacy special_tokens_map.json written by this script (transformers 5 no
                                       longer writes that file).
  tests/fixtures/models/<name>/        tiny random causal LMs + tokenizer files:
                                       llama (tied, llama3 rope scaling), llama-ref (same config, other seed);
                                       these two are briefly trained (80 / 50 deterministic AdamW steps on the corpus)
                                       so token accuracy is non-zero; the others are purely random:
                                       mistral (untied, sharded safetensors + index), qwen2 (qkv bias, tied, bf16
                                       weights), qwen3 (head_dim 32, q/k norm, untied, fp16 weights).
  tests/fixtures/expected/logits_<name>.json
                                       fp32 logits (transformers, eval mode) of a right-padded batch of 2 sequences,
                                       non-padded positions only.
  tests/fixtures/data/                 preference data: prefs.jsonl/.csv/.json (standard), prefs_conv.jsonl
                                       (conversational), prefs_implicit.jsonl (implicit prompt).
  tests/fixtures/expected/tokenize.json
                                       tokenizer parity (input ids of strings, chat-template renderings and ids).
  tests/fixtures/expected/tokenized_<dataset>.json
                                       TRL 1.16 DPOTrainer-preprocessed ids per row (prompt/chosen/rejected) and the
                                       collated batch (input_ids / attention_mask / completion_mask) for the default
                                       max_length and for the max_length=24 truncation case, plus per-pair summed
                                       completion log-probs of policy and reference (TRL's fused LM head).
  tests/fixtures/expected/trl_eval.json
                                       DPOTrainer(policy=llama, ref=llama-ref).evaluate() metrics for every case
                                       (all loss types, f-divergences, ld_alpha, WPO weighting, truncation, datasets).
"""

import copy
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # reference numbers are CPU float32

import torch  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)

import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

transformers.logging.set_verbosity_error()

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
TOK_DIR = FIX / "tokenizer"
MODELS_DIR = FIX / "models"
EXP_DIR = FIX / "expected"
DATA_DIR = FIX / "data"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_TRAIN_VOCAB = 380  # model vocab = round_up(380, 16) = 384 > tokenizer vocab on purpose
MODEL_MAX_LENGTH = 256

# Qwen2-Instruct's ChatML template (default system message when the first message is not a system one).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# --------------------------------------------------------------------------------------------------------------------
# Corpus and tokenizer
# --------------------------------------------------------------------------------------------------------------------
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A language model assigns a probability to every sequence of tokens.",
    "Direct preference optimization trains a policy from pairs of chosen and rejected answers.",
    "The reference model stays frozen while the policy is updated.",
    "What is the capital of France? The capital of France is Paris.",
    "What color is the sky? The sky is blue on a clear day.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The cat sat on the mat and looked out of the window.",
    "Please write a short poem about the sea and the wind.",
    "The sun rises in the east and sets in the west.",
    "Numbers like 1, 2, 3, 42 and 2024 appear in the text too.",
    "She said: \"Hello there!\" and he answered: \"Hi, how are you?\"",
    "You are a helpful assistant. Answer the question briefly and politely.",
    "The user asked a question and the assistant gave a helpful answer.",
    "In the morning we drink coffee, in the evening we drink tea.",
    "Learning rate, batch size and the number of steps are training settings.",
    "Every token in the completion contributes to the log probability.",
    "A good answer is correct, clear and short; a bad answer is wrong or rude.",
    "The train leaves the station at nine o'clock every morning.",
    "Trees grow slowly, but the forest is older than the town.",
    "He wrote the code, ran the tests and fixed the bugs before lunch.",
    "Mathematics: two plus two is four, and three times three is nine.",
    "The weather today is sunny with a light breeze from the north.",
    "Reading books is a good way to learn new words and ideas.",
]


def build_corpus():
    lines = []
    for rep in range(4):
        for i, line in enumerate(CORPUS):
            lines.append(line)
            lines.append(line.lower())
            lines.append(" " + line)
            if (i + rep) % 3 == 0:
                lines.append(line + "\n" + CORPUS[(i + 1) % len(CORPUS)])
    return lines


def make_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_TRAIN_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(build_corpus(), trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        model_max_length=MODEL_MAX_LENGTH,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(hf_tok, out_dir: Path):
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_jinja_files=False keeps the chat template inline in tokenizer_config.json
    hf_tok.save_pretrained(str(out_dir), save_jinja_files=False)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    # transformers omits unset special tokens; make the nulls explicit for readers (reload-equivalent)
    cfg.setdefault("bos_token", None)
    cfg.setdefault("pad_token", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    stm = {
        "additional_special_tokens": SPECIAL_TOKENS,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": None,
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(stm, indent=2) + "\n")


def load_tokenizer(path):
    return AutoTokenizer.from_pretrained(str(path))


# --------------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------------
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,
    hidden_act="silu",
)


def model_specs(vocab_size, special_ids):
    ids = dict(bos_token_id=None, eos_token_id=special_ids["<|im_end|>"], pad_token_id=None)
    llama_cfg = dict(
        **COMMON,
        **ids,
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    return [
        # The DPO policy/reference pair is briefly trained on the corpus (different seeds and step counts) so that
        # token accuracy is non-zero and the log-ratios are moderate; the other models stay purely random.
        dict(name="llama", cls=LlamaConfig, cfg=llama_cfg, seed=1234, dtype=torch.float32, shard=None, train=80),
        dict(name="llama-ref", cls=LlamaConfig, cfg=llama_cfg, seed=4321, dtype=torch.float32, shard=None, train=50),
        dict(
            name="mistral",
            cls=MistralConfig,
            cfg=dict(
                **COMMON,
                **ids,
                vocab_size=vocab_size,
                tie_word_embeddings=False,
                rms_norm_eps=1e-6,
                rope_theta=1000000.0,
                sliding_window=None,
                head_dim=16,
            ),
            seed=2001,
            dtype=torch.float32,
            shard="200KB",
        ),
        dict(
            name="qwen2",
            cls=Qwen2Config,
            cfg=dict(
                **COMMON,
                **ids,
                vocab_size=vocab_size,
                tie_word_embeddings=True,
                rms_norm_eps=1e-6,
                rope_theta=1000000.0,
                use_sliding_window=False,
                sliding_window=None,
            ),
            seed=2002,
            dtype=torch.bfloat16,
            shard=None,
        ),
        dict(
            name="qwen3",
            cls=Qwen3Config,
            cfg=dict(
                **COMMON,
                **ids,
                vocab_size=vocab_size,
                head_dim=32,
                tie_word_embeddings=False,
                rms_norm_eps=1e-6,
                rope_theta=1000000.0,
                attention_bias=False,
                use_sliding_window=False,
                sliding_window=None,
            ),
            seed=2003,
            dtype=torch.float16,
            shard=None,
        ),
    ]


def build_model(spec, tok_dir: Path, out_dir: Path):
    torch.manual_seed(spec["seed"])
    config = spec["cls"](**spec["cfg"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # RMSNorm weights (input/post-attn/final, q_norm/k_norm)
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):  # qwen2 q/k/v biases (zero-initialised by default)
                p.copy_(0.1 * torch.randn_like(p))
    if spec.get("train"):
        pretrain(model, spec["train"], spec["seed"])
    model.eval()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model = model.to(spec["dtype"])
    kwargs = {}
    if spec["shard"]:
        kwargs["max_shard_size"] = spec["shard"]
    model.save_pretrained(str(out_dir), **kwargs)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tok_dir / f, out_dir / f)
    return out_dir


def pretrain(model, steps, seed, seq_len=32, batch=8, lr=3e-3):
    """A few deterministic AdamW steps of next-token prediction on the in-script corpus (CPU, float32)."""
    tok = load_tokenizer(TOK_DIR)
    texts = list(CORPUS)
    for r in PREFS:
        texts.append(r["prompt"] + r["chosen"])
    stream = []
    for t in texts:
        stream += tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id]
    data = torch.tensor(stream)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=g)
        x = torch.stack([data[i : i + seq_len] for i in starts.tolist()])
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"  pretrain seed={seed} steps={steps} final loss {loss.item():.4f}", flush=True)
    model.eval()


def f32list(t):
    return [float(x) for x in t.detach().to(torch.float32).reshape(-1).tolist()]


def expected_logits(name, model_dir: Path, tok, out_path: Path):
    texts = [
        "The quick brown fox jumps over the lazy dog and runs into the forest.",
        "What is the capital of France?",
    ]
    lens = [13, 9]
    seqs = []
    for text, n in zip(texts, lens):
        ids = tok(text, add_special_tokens=False).input_ids
        assert len(ids) >= n, (text, len(ids))
        seqs.append(ids[:n])
    pad_id = tok.convert_tokens_to_ids("<|im_end|>")
    T = max(lens)
    input_ids = [s + [pad_id] * (T - len(s)) for s in seqs]
    attention_mask = [[1] * len(s) + [0] * (T - len(s)) for s in seqs]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(attention_mask), use_cache=False
        ).logits
    V = out.shape[-1]
    logits = [[f32list(out[b, t]) for t in range(lens[b])] for b in range(len(seqs))]
    payload = {
        "model": name,
        "note": "AutoModelForCausalLM.from_pretrained(dir, dtype=float32).eval(); logits[b][t][v] for t < seq_len[b]",
        "vocab_size": V,
        "pad_token_id": pad_id,
        "seq_lens": lens,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "logits": logits,
    }
    out_path.write_text(json.dumps(payload) + "\n")


# --------------------------------------------------------------------------------------------------------------------
# Preference data
# --------------------------------------------------------------------------------------------------------------------
PREFS = [
    {"prompt": "What is the capital of France?", "chosen": " Paris.", "rejected": " London."},
    {"prompt": "What color is the sky?", "chosen": " The sky is blue on a clear day.", "rejected": " Green."},
    {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
    {
        "prompt": "Write a short poem about the sea.",
        "chosen": " The sea is wide, the wind is free,\nthe waves come home to you and me.",
        "rejected": " Sea.",
    },
    {
        "prompt": "Describe the morning.",
        "chosen": " The sun rises in the east and the birds begin to sing in the trees.",
        "rejected": " The sun rises in the east and the birds begin to sleep in the water.",
    },
    {"prompt": "Say hi.", "chosen": " Hi, how are you?", "rejected": " Go away."},
    {"prompt": "Where do you drink coffee?", "chosen": " At the café 😀 near the station.", "rejected": " Nowhere."},
    {"prompt": "Name a number.", "chosen": " 42", "rejected": " 2024 and 1, 2, 3"},
    {
        "prompt": "Explain preference optimization in one sentence.",
        "chosen": " It trains a policy to prefer chosen answers over rejected ones, relative to a frozen reference model.",
        "rejected": " It is a kind of coffee.",
    },
    {"prompt": "Is water wet?", "chosen": " Yes.", "rejected": " No, water is a tree that grows slowly."},
    {
        "prompt": "The user asked a question about the weather today, the train station, the forest near the town, "
        "the books in the library and the tea in the evening; answer all of it in a few words please:",
        "chosen": " Sunny, nine, old, many, hot.",
        "rejected": " I do not know.",
    },
    {"prompt": "Translate 'hello' to French.", "chosen": " Bonjour.", "rejected": " Hola."},
    {"prompt": "Finish: The cat sat on the", "chosen": " mat.", "rejected": " moon and then wrote the code."},
    {"prompt": "How many legs does a dog have?", "chosen": " Four.", "rejected": " Three, or maybe nine."},
    {
        "prompt": "Give advice.",
        "chosen": "Read books, drink water and sleep well.",
        "rejected": "Never learn anything new.",
    },
    {"prompt": "Multiply three by three.", "chosen": " Nine.", "rejected": " Six"},
    # prompt ending in a space: " time" merges across the boundary, so TRL's common-prefix split drops the prompt's
    # trailing " " token and the completion starts with the merged token
    {"prompt": "Complete the phrase: once upon a ", "chosen": "time.", "rejected": "banana."},
]

PREFS_CONV = [
    {
        "prompt": [{"role": "user", "content": "What is the capital of France?"}],
        "chosen": [{"role": "assistant", "content": "Paris."}],
        "rejected": [{"role": "assistant", "content": "London."}],
    },
    {
        "prompt": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What color is the sky?"},
        ],
        "chosen": [{"role": "assistant", "content": "Blue."}],
        "rejected": [{"role": "assistant", "content": "The sky is green and made of tea."}],
    },
    {
        "prompt": [{"role": "user", "content": "Say hi."}],
        "chosen": [{"role": "assistant", "content": "Hi, how are you?"}],
        "rejected": [{"role": "assistant", "content": "Go away."}],
    },
    {
        "prompt": [
            {"role": "user", "content": "Name a number."},
            {"role": "assistant", "content": "42."},
            {"role": "user", "content": "Another one?"},
        ],
        "chosen": [{"role": "assistant", "content": "2024."}],
        "rejected": [{"role": "assistant", "content": "No."}],
    },
    {
        "prompt": [{"role": "user", "content": "Where is the café?"}],
        "chosen": [{"role": "assistant", "content": "Near the station 😀"}],
        "rejected": [{"role": "assistant", "content": "In the sea."}],
    },
    {
        "prompt": [{"role": "user", "content": "Write one line about the sea."}],
        "chosen": [{"role": "assistant", "content": "The sea is wide and the wind is free."}],
        "rejected": [{"role": "assistant", "content": "Sea."}],
    },
    {
        "prompt": [{"role": "user", "content": "Is water wet?"}],
        "chosen": [{"role": "assistant", "content": "Yes."}],
        "rejected": [{"role": "assistant", "content": "No."}],
    },
    {
        "prompt": [{"role": "user", "content": "Multiply three by three."}],
        "chosen": [{"role": "assistant", "content": "Nine."}],
        "rejected": [{"role": "assistant", "content": "Six, I think, or maybe seven."}],
    },
]

PREFS_IMPLICIT = [
    {"chosen": "Question: What is 2+2? Answer: 4", "rejected": "Question: What is 2+2? Answer: 5"},
    {"chosen": "The sky is blue.", "rejected": "The sky is black."},  # char-level split inside a word
    {"chosen": "Say hi. Hi, how are you?", "rejected": "Say hi. Go away."},
    {
        "chosen": "Where is the café? Near the station 😀",
        "rejected": "Where is the café? In the sea.",
    },
    {"chosen": "Is water wet? Yes.", "rejected": "Is water wet? No."},
    {
        "chosen": "Describe the morning. The sun rises in the east.",
        "rejected": "Describe the morning. It is dark and cold.",
    },
    {"chosen": "Name a number: 42", "rejected": "Name a number: 2024"},
    {
        "chosen": "Finish the sentence: The cat sat on the mat.",
        "rejected": "Finish the sentence: The cat sat on the moon.",
    },
    # one text is a prefix of the other: TRL's extract_prompt loop ends without a break (idx = min_len - 1)
    {"chosen": "Count to three: 1 2 3", "rejected": "Count to three: 1 2 3 4"},
]


def write_data():
    DATA_DIR.mkdir(parents=True, exist_ok=True)

    def jsonl(path, rows):
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")

    jsonl(DATA_DIR / "prefs.jsonl", PREFS)
    with open(DATA_DIR / "prefs.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["prompt", "chosen", "rejected"], lineterminator="\n")
        w.writeheader()
        for r in PREFS:
            w.writerow(r)
    (DATA_DIR / "prefs.json").write_text(json.dumps(PREFS, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    jsonl(DATA_DIR / "prefs_conv.jsonl", PREFS_CONV)
    jsonl(DATA_DIR / "prefs_implicit.jsonl", PREFS_IMPLICIT)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------------------------------------------------
# Tokenizer parity
# --------------------------------------------------------------------------------------------------------------------
TOKENIZE_STRINGS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "line one\nline two\n\nline four",
    "tabs\tand\r\nwindows newlines",
    "Numbers: 1 12 123 1234 2024 3.14159",
    "café 😀",
    "<|im_end|>",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "Ünïcödé — “quotes” and ‘apostrophes’ 日本語",
    "",
]

CONVERSATIONS = [
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
    [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Name a number."},
        {"role": "assistant", "content": "42."},
        {"role": "user", "content": "Another one?"},
    ],
]


def tokenize_parity(tok, out_path):
    strings = []
    for s in TOKENIZE_STRINGS:
        ids = tok(s, add_special_tokens=False).input_ids
        ids_default = tok(s).input_ids
        strings.append(
            {
                "text": s,
                "input_ids": ids,
                "input_ids_add_special_tokens": ids_default,
                "decoded": tok.decode(ids),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    chats = []
    for conv in CONVERSATIONS:
        for agp in (False, True):
            rendered = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=agp)
            ids = tok.apply_chat_template(conv, tokenize=True, return_dict=True, add_generation_prompt=agp)[
                "input_ids"
            ]
            chats.append({"messages": conv, "add_generation_prompt": agp, "rendered": rendered, "input_ids": ids})
    payload = {
        "vocab_size": len(tok),
        "special_token_ids": {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS},
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "bos_token": tok.bos_token,
        "pad_token": tok.pad_token,
        "strings": strings,
        "chat_template": chats,
    }
    out_path.write_text(json.dumps(payload, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------------------------------
# TRL parity
# --------------------------------------------------------------------------------------------------------------------
DATASETS = {
    "prefs": "data/prefs.jsonl",
    "prefs_conv": "data/prefs_conv.jsonl",
    "prefs_implicit": "data/prefs_implicit.jsonl",
}


def trl_cases():
    cases = []
    for lt in [
        "sigmoid",
        "hinge",
        "ipo",
        "exo_pair",
        "nca_pair",
        "robust",
        "bco_pair",
        "sppo_hard",
        "aot",
        "aot_unpaired",
        "apo_zero",
        "apo_down",
        "discopop",
        "sft",
        "sigmoid_norm",
    ]:
        ov = {"loss_type": [lt]}
        if lt == "robust":
            ov["label_smoothing"] = 0.1
        if lt == "exo_pair":
            ov["label_smoothing"] = 1e-3  # TRL raises ValueError for exo_pair with label_smoothing == 0
        cases.append((f"loss_{lt}", "prefs", ov))
    cases += [
        ("sigmoid_label_smoothing_0.2", "prefs", {"loss_type": ["sigmoid"], "label_smoothing": 0.2}),
        ("sigmoid_beta_0.5", "prefs", {"loss_type": ["sigmoid"], "beta": 0.5}),
        ("aot_label_smoothing_0.1", "prefs", {"loss_type": ["aot"], "label_smoothing": 0.1}),
        ("sigmoid_plus_sft", "prefs", {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]}),
        ("fdiv_forward_kl", "prefs", {"loss_type": ["sigmoid"], "f_divergence_type": "forward_kl"}),
        ("fdiv_js_divergence", "prefs", {"loss_type": ["sigmoid"], "f_divergence_type": "js_divergence"}),
        (
            "fdiv_alpha_divergence_0.3",
            "prefs",
            {"loss_type": ["sigmoid"], "f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 0.3},
        ),
        ("fdiv_js_divergence_ipo", "prefs", {"loss_type": ["ipo"], "f_divergence_type": "js_divergence"}),
        ("ld_alpha_0.5", "prefs", {"loss_type": ["sigmoid"], "ld_alpha": 0.5}),
        ("use_weighting", "prefs", {"loss_type": ["sigmoid"], "use_weighting": True}),
        ("discopop_tau_0.2", "prefs", {"loss_type": ["discopop"], "discopop_tau": 0.2}),
        ("max_length_24", "prefs", {"loss_type": ["sigmoid"], "max_length": 24}),
        ("max_length_24_ld_alpha_0.5", "prefs", {"loss_type": ["sigmoid"], "max_length": 24, "ld_alpha": 0.5}),
        ("conversational_sigmoid", "prefs_conv", {"loss_type": ["sigmoid"]}),
        ("implicit_prompt_sigmoid", "prefs_implicit", {"loss_type": ["sigmoid"]}),
        ("max_length_none", "prefs", {"loss_type": ["sigmoid"], "max_length": None}),
        # Options that do not exist in TRL 1.16's DPOConfig are recorded as unsupported (the constructor error).
        ("reference_free", "prefs", {"loss_type": ["sigmoid"], "reference_free": True}),
        ("rpo_alpha_1.0", "prefs", {"loss_type": ["sigmoid"], "rpo_alpha": 1.0}),
        ("invalid_fdiv_with_bco_pair", "prefs", {"loss_type": ["bco_pair"], "f_divergence_type": "forward_kl"}),
        ("exo_pair_without_label_smoothing", "prefs", {"loss_type": ["exo_pair"]}),
    ]
    return cases


def make_config(tmpdir, n_rows, overrides):
    from trl import DPOConfig

    base = dict(
        output_dir=tmpdir,
        use_cpu=True,
        report_to=[],
        bf16=False,
        fp16=False,
        per_device_eval_batch_size=n_rows,
        per_device_train_batch_size=n_rows,
        dataloader_num_workers=0,
        dataloader_drop_last=False,
        gradient_checkpointing=False,
        seed=42,
        data_seed=42,
        disable_tqdm=True,
        save_strategy="no",
        logging_strategy="no",
        beta=0.1,
        max_length=1024,
    )
    base.update(overrides)
    return DPOConfig(**base)


def load_llama_pair():
    policy = AutoModelForCausalLM.from_pretrained(str(MODELS_DIR / "llama"), dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(str(MODELS_DIR / "llama-ref"), dtype=torch.float32)
    return policy, ref


def run_trl():
    from datasets import Dataset
    from trl import DPOTrainer

    import trl

    rows = {k: read_jsonl(FIX / v) for k, v in DATASETS.items()}
    results = []
    tokenized = {}
    for name, ds_key, overrides in trl_cases():
        entry = {"name": name, "dataset": DATASETS[ds_key], "config": overrides}
        print(f"[trl] {name}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                args = make_config(tmp, len(rows[ds_key]), copy.deepcopy(overrides))
                tok = load_tokenizer(TOK_DIR)
                policy, ref = load_llama_pair()
                ds = Dataset.from_list(copy.deepcopy(rows[ds_key]))
                trainer = DPOTrainer(
                    model=policy,
                    ref_model=ref,
                    args=args,
                    processing_class=tok,
                    train_dataset=ds,
                    eval_dataset=ds,
                )
                n_eval = len(trainer.eval_dataset)
                metrics = trainer.evaluate()
            except Exception as e:  # noqa: BLE001
                entry["unsupported"] = f"{type(e).__name__}: {e}"
                print(f"   unsupported: {entry['unsupported'][:200]}", flush=True)
                results.append(entry)
                continue
            entry["num_rows"] = len(rows[ds_key])
            entry["num_rows_after_preprocessing"] = n_eval
            entry["dropped_rows"] = len(rows[ds_key]) - n_eval
            entry["pad_token_id"] = tok.pad_token_id
            drop = {"runtime", "samples_per_second", "steps_per_second", "model_preparation_time", "epoch"}
            clean = {}
            for k, v in metrics.items():
                kk = k[len("eval_"):] if k.startswith("eval_") else k
                if kk in drop:
                    continue
                clean[kk] = float(v)
            entry["metrics"] = dict(sorted(clean.items()))
            results.append(entry)

            # Record TRL's preprocessing output once per dataset (default max_length) and for max_length 24.
            tk_key = None
            if overrides == {"loss_type": ["sigmoid"]}:
                tk_key = ds_key
            elif name == "max_length_24":
                tk_key = "prefs_max_length_24"
            if tk_key is not None:
                tokenized[tk_key] = dump_tokenized(trainer, rows[ds_key], ds_key, args)

    payload = {
        "generator": "tests/gen/make_fixtures.py",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "policy_model": "models/llama",
        "ref_model": "models/llama-ref",
        "tokenizer": "tokenizer",
        "common_args": {
            "use_cpu": True,
            "bf16": False,
            "beta": 0.1,
            "max_length": 1024,
            "per_device_eval_batch_size": "number of rows of the dataset (one eval batch)",
            "seed": 42,
        },
        "accepted_loss_types_trl_1_16": [
            "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
            "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
        ],
        "cases": results,
    }
    (EXP_DIR / "trl_eval.json").write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    for key, val in tokenized.items():
        (EXP_DIR / f"tokenized_{key}.json").write_text(json.dumps(val, ensure_ascii=False) + "\n")
    return results


def completion_logps(model, batch):
    """Per-sequence summed completion log-probs through TRL's fused LM head (DPOTrainer._compute_loss's path)."""
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=labels,
            fused_lm_head=True,
            use_cache=False,
        )
    return out.log_probs.sum(dim=1)


def dump_tokenized(trainer, raw_rows, ds_key, args):
    ds = trainer.eval_dataset
    out_rows = []
    for r in ds:
        out_rows.append(
            {
                "prompt_input_ids": list(r["prompt_ids"]),
                "chosen_input_ids": list(r["chosen_ids"]),
                "rejected_input_ids": list(r["rejected_ids"]),
            }
        )
    # The collated eval batch exactly as DataCollatorForPreference builds it (includes max_length truncation).
    feats = [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in ds]
    batch = trainer.data_collator(feats)
    # Per-sequence summed completion log-probs of policy and reference, computed through TRL's own fused LM head on
    # exactly this batch (same path as DPOTrainer._compute_loss with ld_alpha=None), for debugging the Rust side.
    per_seq = {}
    for tag, m in (("policy", trainer.model), ("ref", trainer.ref_model)):
        m.eval()
        logps = completion_logps(m, batch)
        n = logps.shape[0] // 2
        per_seq[f"{tag}_chosen_logps"] = f32list(logps[:n])
        per_seq[f"{tag}_rejected_logps"] = f32list(logps[n:])
    return {
        "dataset": DATASETS[ds_key],
        "max_length": args.max_length,
        "truncation_mode": args.truncation_mode,
        "num_rows": len(raw_rows),
        "num_rows_after_preprocessing": len(ds),
        "dropped_rows": len(raw_rows) - len(ds),
        "pad_token_id": trainer.processing_class.pad_token_id,
        "note": "rows: TRL _prepare_dataset output (before truncation), in order, after dropping; "
        "collated: DataCollatorForPreference output for the whole eval set as one batch "
        "(first half chosen rows, second half rejected rows; truncated to max_length; right-padded)",
        "rows": out_rows,
        "collated": {
            "input_ids": batch["input_ids"].tolist(),
            "attention_mask": batch["attention_mask"].tolist(),
            "completion_mask": batch["completion_mask"].tolist(),
        },
        "per_pair_logps": per_seq,
    }


# --------------------------------------------------------------------------------------------------------------------
def main():
    torch.manual_seed(0)
    for d in (TOK_DIR, MODELS_DIR, EXP_DIR, DATA_DIR):
        if d.exists():
            shutil.rmtree(d)
    for d in (TOK_DIR, MODELS_DIR, EXP_DIR, DATA_DIR):
        d.mkdir(parents=True)

    hf_tok = make_tokenizer()
    save_tokenizer(hf_tok, TOK_DIR)
    tok = load_tokenizer(TOK_DIR)
    tok_vocab = len(tok)
    model_vocab = int(math.ceil(tok_vocab / 16.0) * 16)
    print(f"tokenizer vocab {tok_vocab} -> model vocab {model_vocab}", flush=True)
    special_ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}

    for spec in model_specs(model_vocab, special_ids):
        out = build_model(spec, TOK_DIR, MODELS_DIR / spec["name"])
        expected_logits(spec["name"], out, tok, EXP_DIR / f"logits_{spec['name']}.json")
        print(f"model {spec['name']}: {sorted(os.listdir(out))}", flush=True)

    write_data()
    tokenize_parity(tok, EXP_DIR / "tokenize.json")
    run_trl()
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
