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


def generate_small(
    root: str,
    files: int,
    *,
    classes: int = 100,
    min_size: int = 1024,
    max_size: int = 4096,
    seed: int = 0,
) -> int:
    """Many small files fast, ImageNet-shaped: `train/cNNNN/NNNNNNN.jpg` in `classes`
    directories, sizes uniform in [min_size, max_size], half random bytes, half compressible
    text (for scale tests and `tools/bench_pack.py`). Returns the total bytes written."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    words = b"tensor label image class batch epoch loss 0.125 "
    text = (words * ((1 << 20) // len(words) + 1))[: 1 << 20]
    sizes = rng.integers(min_size, max_size + 1, files).tolist()
    offsets = rng.integers(0, (1 << 20) - max_size, files).tolist()
    base = os.fsencode(root) + b"/train"
    dirs = [b"%s/c%04d" % (base, c) for c in range(classes)]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    total = 0
    for i, (size, off) in enumerate(zip(sizes, offsets, strict=True)):
        data = (pool if i & 1 else text)[off : off + size]
        fd = os.open(b"%s/%07d.jpg" % (dirs[i % classes], i), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        total += size
    return total
