"""Writes N synthetic preference rows as JSON Lines (for `make bench-1m`): a prompt of 20-120 words,
two completions of 10-150 words, and two columns nobody reads (a score and a source), as hub
datasets carry. Deterministic: the same N gives the same bytes.

usage: python3 benches/big_data.py N OUT.jsonl   (also writes OUT.parquet, with pyarrow)
"""
import json, random, sys
random.seed(0)
words = "the a of to and in is it you that he was for on are with as I his they be at one have this from or had by hot word but what some we can out other were all there when up use your how said an each she which do their time if will way about many then them write would like so these her long make thing see him two has look more day could go come did number sound no most people my over know water than call first who may down side been now find".split()
n = int(sys.argv[1])
with open(sys.argv[2], "w") as f:
    for i in range(n):
        p = " ".join(random.choices(words, k=random.randint(20, 120)))
        c = " ".join(random.choices(words, k=random.randint(10, 150)))
        r = " ".join(random.choices(words, k=random.randint(10, 150)))
        f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r, "score_chosen": 8.0, "source": "synthetic"}) + "\n")

import pyarrow.json as pj, pyarrow.parquet as pq
table = pj.read_json(sys.argv[2], read_options=pj.ReadOptions(block_size=1 << 26))
pq.write_table(table, sys.argv[2].removesuffix(".jsonl") + ".parquet", row_group_size=100_000)
