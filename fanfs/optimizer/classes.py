"""Classes of files: extension x top-level directory, rare classes merged, widely spread
extensions collapsed (`build_classes`, `class_of`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# Rare classes: fewer files than this and less than MIN_CLASS_SHARE of the bytes are merged
# into their extension's class, then into the fallback class.
MIN_CLASS_FILES: Final = 32
MIN_CLASS_SHARE: Final = 0.01


# At most this many classes survive (largest first); more would only lengthen the table and
# thin the sample, and the rest merge by extension.
MAX_CLASSES: Final = 32
# An extension found in more top-level directories than this is one class `*/*EXT`: such
# directories split one kind of data (labels of an ImageFolder tree, shards, dates), while a
# few directories may hold different kinds under one extension (train/*.json, ann/*.json).
MAX_EXT_DIRS: Final = 8
FALLBACK_CLASS: Final = "(other)"


@dataclass(frozen=True, slots=True)
class FileRef:
    """One regular file of the dataset: relative path (class rule), path to read, size."""

    rel: bytes
    path: bytes
    size: int


def _parts(rel: bytes) -> tuple[str, str]:
    top, sep, _ = rel.partition(b"/")
    base = rel.rsplit(b"/", 1)[-1]
    ext = os.path.splitext(base)[1].lower()
    if len(ext) > 16:
        ext = b""
    return (top.decode("utf-8", "backslashreplace") if sep else "."), ext.decode(
        "utf-8", "backslashreplace"
    )


def exact_class(rel: bytes) -> str:
    """`top/*.ext`: top-level directory (`.` for files at the root) and lower-case extension."""
    top, ext = _parts(rel)
    return "%s/*%s" % (top, ext)


def class_of(rel: bytes, known: frozenset[str] | set[str]) -> str:
    """The class of `rel` among `known`: exact, else by extension (`*/*.ext`), else fallback."""
    top, ext = _parts(rel)
    name = "%s/*%s" % (top, ext)
    if name in known:
        return name
    name = "*/*" + ext
    return name if name in known else FALLBACK_CLASS


def build_classes(files: Sequence[FileRef]) -> list[str]:
    """The class names for `files` (largest first), rare classes merged as described above."""
    total = sum(f.size for f in files) or 1
    exact: dict[str, list[int]] = {}
    for f in files:
        stats = exact.setdefault(exact_class(f.rel), [0, 0])
        stats[0] += 1
        stats[1] += f.size

    def big(stats: list[int]) -> bool:
        return stats[0] >= MIN_CLASS_FILES or stats[1] >= MIN_CLASS_SHARE * total

    def ext_of(name: str) -> str:
        return name.partition("/*")[2]

    kept = [n for n, st in sorted(exact.items(), key=lambda kv: (-kv[1][1], kv[0])) if big(st)]
    # An extension spread over many top-level directories becomes one class `*/*EXT`; so does
    # the most spread one, and the next, while there are too many classes, rather than the
    # smallest classes (maybe whole kinds of data) falling into `(other)`.
    by_ext: dict[str, list[int]] = {}  # every extension's files and bytes, as `*/*EXT`
    for name, stats in exact.items():
        merged = by_ext.setdefault("*/*" + ext_of(name), [0, 0])
        merged[0] += stats[0]
        merged[1] += stats[1]
    dirs = Counter(ext_of(n) for n in exact)
    collapsed = {"*/*" + ext for ext, count in dirs.items() if count > MAX_EXT_DIRS}
    kept = [n for n in kept if "*/*" + ext_of(n) not in collapsed]
    while len(kept) + len(collapsed) > MAX_CLASSES:
        spread = Counter(ext_of(n) for n in kept)
        ext, count = max(spread.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))
        if count < 2:
            break
        collapsed.add("*/*" + ext)
        kept = [n for n in kept if ext_of(n) != ext]
    # The collapsed extensions rank with the exact classes by their bytes; the rest of the
    # files merge by extension into what room is left, then into the fallback class.
    ranked = kept + [n for n in collapsed if big(by_ext[n]) and n not in kept]
    kept = sorted(ranked, key=lambda n: (-(by_ext[n] if n in collapsed else exact[n])[1], n))[
        :MAX_CLASSES
    ]
    rest: dict[str, list[int]] = {}
    for name, stats in exact.items():
        if name not in kept:
            merged = rest.setdefault("*/*" + ext_of(name), [0, 0])
            merged[0] += stats[0]
            merged[1] += stats[1]
    room = max(MAX_CLASSES - len(kept), 0)
    kept += [
        n
        for n, st in sorted(rest.items(), key=lambda kv: (-kv[1][1], kv[0]))
        if big(st) and n not in kept
    ][:room]
    known = set(kept)
    if any(class_of(f.rel, known) == FALLBACK_CLASS for f in files):
        kept.append(FALLBACK_CLASS)
    return kept
