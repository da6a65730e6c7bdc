"""The index checks run in blocks (fanfs/format/validate.py) give the verdict and the message
of the checks they replaced (tests/unit/_validate_reference.py) on every golden pack and on
thousands of seeded forgeries of their indexes, at block sizes that put block boundaries
everywhere: one row per block, a few, and the production size."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fanfs.errors import PackFormatError
from fanfs.format import validate
from fanfs.format.reader import PackReader
from tests.unit._validate_reference import reference_check_index

DATA = Path(__file__).resolve().parents[1] / "data"
# Every format version, dictionaries (zstd and lz4), the shuffle, blocks, several codecs.
BASES = [
    DATA / name
    for name in (
        "golden-v1/zstd.fan",
        "golden-v2/auto.fan",
        "golden-v3/shuffle.fan",
        "golden-v4/lz4dict.fan",
        "golden-v4/brotli.fan",
        "golden-v5/auto.fan",
        "golden-v5/blocks.fan",
        "golden-v5/lzma.fan",
    )
]
BLOCKS = (1, 3, 7, validate._BLOCK)
FORGERIES_PER_PACK = 200


def verdict(check: Callable[..., None], arrays: dict[str, np.ndarray], options: Any) -> str:
    try:
        check("PACK", arrays, **options)
    except PackFormatError as exc:
        return str(exc)
    return "ok"


def load(pack: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    reader = PackReader(str(pack))
    try:
        arrays = {name: column.copy() for name, column in reader.index.arrays.items()}
        options = {
            "chunk_size": reader.chunk_size,
            "block_size": reader.block_size,
            "partition_sizes": [part["size"] for part in reader.partitions],
            "dictionaries": reader.dictionary_count,
            "version": reader.format_version,
        }
    finally:
        reader.close()
    return arrays, options


def forge(rng: random.Random, arrays: dict[str, np.ndarray]) -> str:
    """Change one to three values of the index columns (not the blobs) in place; returns
    what was changed."""
    done = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        name = rng.choice([n for n in arrays if n not in ("names", "dicts") and len(arrays[n])])
        column = arrays[name]
        row = rng.randrange(len(column))
        info = np.iinfo(column.dtype)
        old = int(column[row])
        choice = rng.randrange(6)
        if choice == 0:
            new = old + rng.choice((-1, 1))
        elif choice == 1:
            new = int(column[rng.randrange(len(column))])
        elif choice == 2:
            new = rng.choice((0, 1, info.max, 0o40755, 0o100644, 0o120777, 255, 256, 4095))
        elif choice == 3:
            new = rng.randint(info.min, info.max)
        elif choice == 4:
            new = old + rng.randint(-300, 300)
        else:
            other = rng.randrange(len(column))
            column[row], column[other] = column[other], column[row]
            done.append("%s[%d] <-> [%d]" % (name, row, other))
            continue
        new = min(max(new, int(info.min)), int(info.max))
        column[row] = new
        done.append("%s[%d] %d -> %d" % (name, row, old, new))
    return "; ".join(done)


@pytest.mark.parametrize("pack", BASES, ids=lambda p: "%s/%s" % (p.parent.name, p.name))
def test_blocked_checks_agree_with_the_reference(
    pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrays, options = load(pack)
    rng = random.Random("%s/%s" % (pack.parent.name, pack.name))
    for block in BLOCKS:
        monkeypatch.setattr(validate, "_BLOCK", block)
        assert verdict(validate.check_index, arrays, options) == "ok"
    refused = 0
    for case in range(FORGERIES_PER_PACK):
        forged = {name: column.copy() for name, column in arrays.items()}
        what = forge(rng, forged)
        want = verdict(reference_check_index, forged, options)
        refused += want != "ok"
        for block in BLOCKS:
            monkeypatch.setattr(validate, "_BLOCK", block)
            got = verdict(validate.check_index, forged, options)
            assert got == want, "case %d (%s), block %d" % (case, what, block)
    assert refused > FORGERIES_PER_PACK // 2


def test_forged_blobs_agree_with_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names with '/', NUL, '.' and '..', names moved and resized, symlink targets."""
    arrays, options = load(DATA / "golden-v5" / "zstd.fan")
    rng = random.Random(11)
    for case in range(300):
        forged = {name: column.copy() for name, column in arrays.items()}
        blob = forged["names"]
        for _ in range(rng.choice((1, 2))):
            entry = rng.randrange(1, len(forged["name_len"]))
            off, length = int(forged["name_off"][entry]), int(forged["name_len"][entry])
            choice = rng.randrange(4)
            if choice == 0:
                blob[off + rng.randrange(length)] = rng.choice((0x2F, 0, 0x2E))
            elif choice == 1:
                blob[off : off + length] = 0x2E
                forged["name_len"][entry] = rng.choice((1, 2, 3))
            elif choice == 2:
                blob[rng.randrange(len(blob))] = rng.choice((0x2F, 0))
            else:
                forged["name_len"][entry] = max(1, length + rng.choice((-1, 1)))
        want = verdict(reference_check_index, forged, options)
        for block in BLOCKS:
            monkeypatch.setattr(validate, "_BLOCK", block)
            assert verdict(validate.check_index, forged, options) == want, (case, block)
