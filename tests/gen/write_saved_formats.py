"""Writes preference data in the formats `datasets` writes or reads beyond JSON/CSV/Parquet, and
what `datasets` reads from each, for `tests/it/hub_data.rs`
(`files_datasets_writes_read_as_datasets_reads_them`).

    python tests/gen/write_saved_formats.py OUT_DIR

OUT_DIR/<case> is the data (a file or a directory), OUT_DIR/expected.json maps each case (and
split) to the rows `datasets` gives for it: prompt, chosen, rejected as loaded.
"""

import json
import sys
from pathlib import Path

import datasets
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

datasets.disable_progress_bars()
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)

plain = [
    {"prompt": f"Question {i}?", "chosen": f" good {i}\twith a tab", "rejected": f" bad {i}", "score": i * 0.5}
    for i in range(5)
]
plain[3]["chosen"] = ' quoted "text", commas\nand a newline'


def turn(role, content, **extra):
    return {"role": role, "content": content, **extra}


conversations = [
    {
        "prompt": [turn("system", "Be brief.", name=None), turn("user", f"Hi {i}", name="ana")],
        "chosen": [turn("assistant", f"Hello {i}", name=None)],
        "rejected": [turn("assistant", f"Go away {i}", name="bot")],
    }
    for i in range(3)
]

expected = {}


def rows(ds):
    return [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in ds]


# `Dataset.save_to_disk`: one dataset, no splits (conversational, a message field beside
# role/content); `DatasetDict.save_to_disk`: a directory per split.
one = datasets.Dataset.from_list(conversations)
one.save_to_disk(out / "saved")
expected["saved"] = rows(datasets.load_from_disk(out / "saved"))
both = datasets.DatasetDict(
    {"train": datasets.Dataset.from_list(plain[:4]), "test": datasets.Dataset.from_list(plain[4:])}
)
both.save_to_disk(out / "saved_dict", num_shards={"train": 2, "test": 1})
loaded = datasets.load_from_disk(out / "saved_dict")
for split in ("train", "test"):
    expected[f"saved_dict:{split}"] = rows(loaded[split])

# Arrow's file format (pyarrow's), which `datasets`' Arrow reader also takes.
table = pa.Table.from_pylist(plain)
with pa.ipc.new_file(out / "file.arrow", table.schema) as writer:
    writer.write_table(table, max_chunksize=2)
expected["file.arrow"] = rows(datasets.load_dataset("arrow", data_files=str(out / "file.arrow"), split="train"))

# Compressed Arrow (pandas' `to_feather` writes lz4; zstd) and Parquet (brotli, lz4).
pd.DataFrame(plain).to_feather(out / "feather_lz4.arrow")
with pa.ipc.new_stream(out / "zstd.arrow", table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
    w.write_table(table)
for codec in ("brotli", "lz4"):
    pq.write_table(table, out / f"{codec}.parquet", compression=codec)
for name in ("feather_lz4.arrow", "zstd.arrow"):
    expected[name] = rows(datasets.load_dataset("arrow", data_files=str(out / name), split="train"))
for name in ("brotli.parquet", "lz4.parquet"):
    expected[name] = rows(datasets.load_dataset("parquet", data_files=str(out / name), split="train"))

# pandas' categorical columns: dictionary-encoded in Parquet's Arrow schema.
frame = pd.DataFrame(plain).astype({"prompt": "category", "rejected": "category"})
frame.to_parquet(out / "categorical.parquet")
assert pa.types.is_dictionary(pq.read_schema(out / "categorical.parquet").field("prompt").type)
expected["categorical.parquet"] = rows(datasets.load_dataset("parquet", data_files=str(out / "categorical.parquet"), split="train"))

# Dictionary-encoded fields inside the messages (`role`, and `name` beside it).
dict_str = pa.dictionary(pa.int8(), pa.string())
message = pa.list_(pa.struct([("role", dict_str), ("content", pa.string()), ("name", dict_str)]))
nested = pa.table({k: pa.array([r[k] for r in conversations], type=message) for k in ("prompt", "chosen", "rejected")})
pq.write_table(nested, out / "nested_dict.parquet")
expected["nested_dict.parquet"] = rows(datasets.load_dataset("parquet", data_files=str(out / "nested_dict.parquet"), split="train"))

# Tab-separated values and `.ndjson`, by their extensions.
pd.DataFrame(plain).to_csv(out / "prefs.tsv", sep="\t", index=False)
with open(out / "prefs.ndjson", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in plain)
for name in ("prefs.tsv", "prefs.ndjson"):
    expected[name] = rows(datasets.load_dataset(str(out), data_files=name, split="train"))

(out / "expected.json").write_text(json.dumps(expected, indent=1))

# Cells pandas' read_csv (under `datasets`) reads as missing, quoted or not, and spellings it keeps
# as text: OUT_DIR/expected_missing.json maps each file to its rows as `datasets` loads them, None
# where a cell reads as missing.
from pandas._libs.parsers import STR_NA_VALUES  # noqa: E402

kept = ["na", "NONE", "none", "Nan", " NA", "NA ", "nil", "N/a", "NaT", "-", "0", "undefined", "#N/A N/A "]
cells = sorted(STR_NA_VALUES) + kept
missing = {}
for name, sep in (("missing.csv", ","), ("missing.tsv", "\t")):
    lines = [sep.join(["prompt", "chosen", "rejected"])]
    for i, cell in enumerate(cells):
        row = [f"question {i}", f"good {i}", f"bad {i}"]
        row[i % 3] = f'"{cell}"' if i % 2 else cell
        lines.append(sep.join(row))
    (out / name).write_text("\n".join(lines) + "\n")
    missing[name] = rows(datasets.load_dataset(str(out), data_files=name, split="train"))
(out / "expected_missing.json").write_text(json.dumps(missing, indent=1))
