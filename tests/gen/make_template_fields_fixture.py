"""Conversations whose chat template reads more than role and content, tokenised by TRL 1.16.

Writes tests/fixtures/template_fields/: a tokenizer (the fixture tokenizer with a chat template
that dumps `tools` with `tojson`, renders a message's `reasoning_content` and `tool_calls`, and
reads the `enable_thinking` keyword), `prefs.jsonl` (rows with `tools` as JSON text and as JSON,
`chat_template_kwargs`, message keys beyond role and content, keys out of sorted order, an
assistant turn of tool calls with `content: null`, content as a list of parts), and
`expected.json`: DPOTrainer._prepare_dataset's prompt/chosen/rejected ids for it (no truncation).
Run with the venv's python from the repository root.
"""

import json
import shutil
import types
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

from datasets import load_dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl.trainer.dpo_trainer import DPOTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/fixtures/template_fields"
TEMPLATE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}[{{ p['type'] }}]{{ p['text'] }}{% endfor %}{% endif %}"
    "{% if m.reasoning_content is defined and m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{% if m.tool_calls is defined and m.tool_calls %}<call>{{ m.tool_calls | tojson }}</call>{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
)


def rows():
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "required": ["city"]}}}
    user = [{"role": "user", "content": "Weather in Paris?"}]
    call = {"name": "weather", "arguments": {"unit": "c", "city": "Paris"}}
    # Every row sets both fields: `datasets` fills a missing one with None, on which TRL's
    # `**example.get("chat_template_kwargs", {})` fails, and `tools` is JSON text in all.
    return [
        {"prompt": user, "chosen": [{"role": "assistant", "content": "Checking.", "tool_calls": [call]}],
         "rejected": [{"role": "assistant", "content": "No idea."}], "tools": json.dumps([tool]),
         "chat_template_kwargs": {"enable_thinking": True}},
        {"prompt": user, "chosen": [{"role": "assistant", "content": "Sunny.", "reasoning_content": "look it up"}],
         "rejected": [{"role": "assistant", "content": "Rain.", "reasoning_content": "guess"}], "tools": "[]",
         "chat_template_kwargs": {"enable_thinking": False}},
        # An assistant turn of tool calls alone (`content: null`, as OpenAI-style data writes it),
        # then the tool's answer and the reply.
        {"prompt": user, "chosen": [{"role": "assistant", "content": None, "tool_calls": [call]},
                                    {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}],
         "rejected": [{"role": "assistant", "content": "No idea."}], "tools": json.dumps([tool]),
         "chat_template_kwargs": {}},
        # Content as a list of parts (the multimodal message format, text only).
        {"prompt": [{"role": "user", "content": [{"type": "text", "text": "Weather in Rome?"}]}],
         "chosen": [{"role": "assistant", "content": [{"type": "text", "text": "Warm."}]}],
         "rejected": [{"role": "assistant", "content": [{"type": "text", "text": "Cold."}]}], "tools": "[]",
         "chat_template_kwargs": {}},
    ]


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    tok_dir = OUT / "tokenizer"
    tok_dir.mkdir(parents=True)
    for name in ["tokenizer.json", "special_tokens_map.json"]:
        shutil.copy(ROOT / "tests/fixtures/tokenizer" / name, tok_dir / name)
    config = json.loads((ROOT / "tests/fixtures/tokenizer/tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    data = OUT / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ds = load_dataset("json", data_files=str(data), split="train")
    args = types.SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    out = DPOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok), ds, tok, args, "train")
    expected = [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in out]
    (OUT / "expected.json").write_text(json.dumps(expected) + "\n")
    print(f"{len(expected)} rows -> {OUT}")


if __name__ == "__main__":
    main()
