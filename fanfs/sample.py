"""A built-in sample dataset shaped like a training set, for the demo, tests and benchmarks.

ImageFolder-like: `train/<class>/img_NNNNN.jpg` (incompressible JPEG-like bytes),
`train/<class>/feat_NNNNN.npy` (float32 features rounded to fp16 precision, compressible
about 2x), `annotations/<class>.json` (small JSON records) and a `val/` split. Deterministic
for a given seed and file count. Never imports trio, pyfuse3 or mpi4py.
"""

from __future__ import annotations

import json
import os

import numpy as np

JPEG_HEADER = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"


def _jpeg_like(rng: np.random.Generator, size: int) -> bytes:
    return (
        JPEG_HEADER
        + rng.integers(0, 256, size - len(JPEG_HEADER) - 2, dtype=np.uint8).tobytes()
        + b"\xff\xd9"
    )


def _features(rng: np.random.Generator, size: int) -> bytes:
    count = max(1, (size - 128) // 4)
    values = np.cumsum(rng.normal(0, 1, count)).astype(np.float16).astype(np.float32)
    header = (
        b"\x93NUMPY\x01\x00v\x00"
        + ("{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % count).encode().ljust(117)
        + b"\n"
    )
    return header + values.tobytes()


def generate(
    root: str, files: int = 4000, *, classes: int = 20, mean_size: int = 100_000, seed: int = 0
) -> int:
    """Write the sample under `root` (created); returns the total bytes written."""
    rng = np.random.default_rng(seed)
    total = 0
    val_every = 10
    for i in range(files):
        cls = "class_%03d" % (i % classes)
        split = "val" if i % val_every == val_every - 1 else "train"
        size = int(rng.integers(mean_size // 2, mean_size * 3 // 2))
        if i % 4 == 3:
            name, data = "feat_%05d.npy" % i, _features(rng, size)
        else:
            name, data = "img_%05d.jpg" % i, _jpeg_like(rng, size)
        directory = os.path.join(root, split, cls)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
        total += len(data)
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    for c in range(classes):
        records = [
            {
                "id": i,
                "class": c,
                "bbox": [int(v) for v in rng.integers(0, 512, 4)],
                "label": "class_%03d" % c,
            }
            for i in range(c, files, classes)
        ]
        data = json.dumps(records, indent=1).encode()
        with open(os.path.join(root, "annotations", "class_%03d.json" % c), "wb") as f:
            f.write(data)
        total += len(data)
    return total
