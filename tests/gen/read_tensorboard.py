"""Print what TensorBoard reads from a directory of event files, as JSON.

Usage: python tests/gen/read_tensorboard.py LOG_DIR
Prints {"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text], ...]},
"images": {tag: [[step, width, height, png_bytes], ...]}}, read with TensorBoard's own
EventAccumulator, so tests/tensorboard.rs checks our event files against the reader users run.
"""

import json
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main() -> None:
    acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]}
    texts = {}
    for t in tags["tensors"]:
        texts[t] = [[e.step, np.array(e.tensor_proto.string_val)[0].decode()] for e in acc.Tensors(t)]
    images = {t: [[e.step, e.width, e.height, len(e.encoded_image_string)] for e in acc.Images(t)] for t in tags["images"]}
    print(json.dumps({"scalars": scalars, "texts": texts, "images": images}))


if __name__ == "__main__":
    main()
