"""Empty completions, tokenised by TRL 1.16: a plain-text row whose `chosen` or `rejected` is ""
trains on the eos token alone, which DPOTrainer and KTOTrainer append to every completion and
CPOTrainer/ORPOTrainer's `tokenize_row` add as an id.

Writes tests/fixtures/empty_completion/: `prefs.jsonl` (paired rows), `unpaired.jsonl` (KTO rows)
and `expected.json`: `DPOTrainer._prepare_dataset`'s and `CPOTrainer.tokenize_row`'s
prompt/chosen/rejected ids for the pairs, `KTOTrainer._prepare_dataset`'s prompt/completion ids for
the unpaired rows (no truncation; the fixture tokenizer). Run with the venv's python from the
repository root.
"""

import json
import types
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

from datasets import load_dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl.experimental.cpo import CPOTrainer  # noqa: E402
from trl.trainer.dpo_trainer import DPOTrainer  # noqa: E402
from trl.trainer.kto_trainer import KTOTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/fixtures/empty_completion"

PAIRS = [
    {"prompt": "Say nothing.", "chosen": "", "rejected": " Something."},
    {"prompt": "Say something.", "chosen": " Something.", "rejected": ""},
    {"prompt": "", "chosen": " From nothing.", "rejected": ""},
]
UNPAIRED = [
    {"prompt": "Say nothing.", "completion": "", "label": True},
    {"prompt": "Say something.", "completion": " Something.", "label": False},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write_jsonl(OUT / "prefs.jsonl", PAIRS)
    write_jsonl(OUT / "unpaired.jsonl", UNPAIRED)
    tok = AutoTokenizer.from_pretrained(ROOT / "tests/fixtures/tokenizer")
    args = types.SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    pairs = load_dataset("json", data_files=str(OUT / "prefs.jsonl"), split="train")
    dpo = DPOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok), pairs, tok, args, "train")
    # tokenize_row reads only these attributes of the trainer.
    cpo_self = types.SimpleNamespace(
        processing_class=tok, is_encoder_decoder=False, max_length=10**6, truncation_mode="keep_start",
        label_pad_token_id=-100,
    )
    cpo_self.build_tokenized_answer = types.MethodType(CPOTrainer.build_tokenized_answer, cpo_self)
    cpo = [CPOTrainer.tokenize_row(cpo_self, row) for row in pairs]
    unpaired = load_dataset("json", data_files=str(OUT / "unpaired.jsonl"), split="train")
    kto_args = types.SimpleNamespace(**vars(args), max_prompt_length=None, max_completion_length=None)
    kto = KTOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok, calculate_KL=False), unpaired, tok, kto_args, "train")
    expected = {
        "dpo": [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in dpo],
        "cpo": [
            {
                "prompt_ids": r["prompt_input_ids"],
                "chosen_ids": r["chosen_input_ids"][len(r["chosen_labels"]) - sum(l != -100 for l in r["chosen_labels"]):],
                "rejected_ids": r["rejected_input_ids"][len(r["rejected_labels"]) - sum(l != -100 for l in r["rejected_labels"]):],
            }
            for r in cpo
        ],
        "kto": [{k: r[k] for k in ("prompt_ids", "completion_ids")} for r in kto],
    }
    (OUT / "expected.json").write_text(json.dumps(expected) + "\n")
    print(json.dumps(expected))


if __name__ == "__main__":
    main()
