"""The index checks as they were before they ran in blocks (fanfs/format/validate.py at
19b9c9e): the reference `test_validate_blocks.py` compares the blocked checks with, on
every forgery, the same verdict and the same message. Kept verbatim; not used by fanfs."""

from __future__ import annotations

import stat
from collections.abc import Mapping
from typing import Any

import numpy as np

from fanfs.errors import PackFormatError
from fanfs.format.layout import chunk_usizes, file_chunk_sizes
from fanfs.format.validate import (
    _DOT,
    _KNOWN_CODECS,
    _KNOWN_CODECS_BY_VERSION,
    _MAX_BYTES,
    _MAX_SHUFFLE_NIBBLE,
    _SLASH,
    MAX_LINK_TARGET,
    _fail,
)

_BLOCK = 1 << 20


def _first_bad(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


class _IndexCheck:
    """The structural checks of one index (see the module docstring)."""

    def __init__(
        self,
        pack: str,
        arrays: Mapping[str, np.ndarray],
        *,
        chunk_size: int,
        block_size: int,
        partition_sizes: list[int],
        dictionaries: int,
        version: int,
    ) -> None:
        self.pack = pack
        self.a = arrays
        self.chunk_size = chunk_size
        self.block_size = block_size
        self.partition_sizes = partition_sizes
        self.dictionaries = dictionaries
        self.version = version
        self.n = len(arrays["parent"])
        self.chunks = len(arrays["partition"])
        kind = arrays["mode"] & stat.S_IFMT(0o177777)
        self.is_dir = kind == stat.S_IFDIR
        self.is_reg = kind == stat.S_IFREG
        self.is_lnk = kind == stat.S_IFLNK

    def fail(self, column: str, row: int, message: str) -> PackFormatError:
        return _fail(self.pack, "index: %s[%d] %s" % (column, row, message))

    def run(self) -> None:
        self.kinds()
        self.tree()
        self.names()
        self.files()
        self.chunk_table()

    def kinds(self) -> None:
        bad = _first_bad(~(self.is_dir | self.is_reg | self.is_lnk))
        if bad is not None:
            raise self.fail(
                "mode",
                bad,
                "= 0o%o is not a directory, regular file or symlink" % self.a["mode"][bad],
            )
        if not self.is_dir[0] or self.a["parent"][0] != 0 or self.a["name_len"][0] != 0:
            raise _fail(self.pack, "index: entry 0 is not a root directory (parent 0, empty name)")
        for column, mask in (("size", self.is_dir), ("count", self.is_lnk)):
            bad = _first_bad(mask & (self.a[column] != 0))
            if bad is not None:
                raise self.fail(
                    column,
                    bad,
                    "= %d, expected 0 for a %s"
                    % (self.a[column][bad], "directory" if column == "size" else "symlink"),
                )

    def tree(self) -> None:
        """Breadth-first order: parents come first (so the tree has no cycle), and every
        directory's children are exactly the run of entries naming it as parent."""
        parent = self.a["parent"]
        n = self.n
        for start in range(1, n, _BLOCK):
            rows = np.arange(start, min(n, start + _BLOCK), dtype=np.int64)
            bad = _first_bad(parent[rows] >= rows)
            if bad is not None:
                row = int(rows[bad])
                raise self.fail(
                    "parent",
                    row,
                    "= %d is not an earlier entry (a cycle or a forward reference)" % parent[row],
                )
        if n > 2:
            bad = _first_bad(parent[2:] < parent[1:-1])
            if bad is not None:
                raise self.fail(
                    "parent",
                    bad + 2,
                    "= %d is below the previous entry's parent (not breadth-first)"
                    % parent[bad + 2],
                )
        kids = parent[1:]
        run_starts = (
            np.flatnonzero(np.diff(kids, prepend=np.int64(-1)) != 0) + 1
            if n > 1
            else np.zeros(0, np.int64)
        )
        owners = parent[run_starts].astype(np.int64)
        lengths = np.diff(np.append(run_starts, n))
        bad = _first_bad(~self.is_dir[owners])
        if bad is not None:
            raise self.fail("parent", int(run_starts[bad]), "= %d is not a directory" % owners[bad])
        first, count = self.a["first"], self.a["count"]
        bad = _first_bad((first[owners] != run_starts) | (count[owners] != lengths))
        if bad is not None:
            d = int(owners[bad])
            raise self.fail(
                "first",
                d,
                "= %d, count = %d, but its children are entries %d..%d"
                % (first[d], count[d], run_starts[bad], run_starts[bad] + lengths[bad] - 1),
            )
        claimed = self.is_dir & (count != 0)
        if int(np.count_nonzero(claimed)) != len(owners):
            has_kids = np.zeros(n, dtype=bool)
            has_kids[owners] = True
            lonely = _first_bad(claimed & ~has_kids)
            assert lonely is not None
            raise self.fail(
                "count", lonely, "= %d, but no entry names it as parent" % count[lonely]
            )
        bad = _first_bad(self.is_dir & (count == 0) & (first != 0))
        if bad is not None:
            raise self.fail("first", bad, "= %d, expected 0 for an empty directory" % first[bad])

    def names(self) -> None:
        """Canonical layout: each entry's name, then a symlink's target, back to back."""
        a = self.a
        name_len, name_off = a["name_len"], a["name_off"]
        blob = a["names"]
        bad = _first_bad(name_len[1:] == 0)
        if bad is not None:
            raise self.fail("name_len", bad + 1, "= 0 (only the root has an empty name)")
        bad = _first_bad(name_len > 255)
        if bad is not None:
            raise self.fail("name_len", bad, "= %d exceeds 255" % name_len[bad])
        bad = _first_bad(self.is_lnk & ((a["size"] == 0) | (a["size"] > MAX_LINK_TARGET)))
        if bad is not None:
            raise self.fail(
                "size",
                bad,
                "= %d is not a symlink target length (1..%d)" % (a["size"][bad], MAX_LINK_TARGET),
            )
        span = name_len.astype(np.uint64) + np.where(self.is_lnk, a["size"], 0).astype(np.uint64)
        ends = np.cumsum(span, dtype=np.uint64)
        starts = ends - span
        bad = _first_bad(name_off != starts)
        if bad is not None:
            raise self.fail(
                "name_off",
                bad,
                "= %d, expected %d (names are stored back to back in entry order)"
                % (name_off[bad], starts[bad]),
            )
        if int(ends[-1]) != len(blob):
            raise _fail(
                self.pack,
                "index: the names blob is %d bytes, its entries use %d"
                % (len(blob), int(ends[-1])),
            )
        target = name_off + name_len
        bad = _first_bad(self.is_lnk & (a["first"] != target))
        if bad is not None:
            raise self.fail(
                "first",
                bad,
                "= %d, expected %d (a symlink's target follows its name)"
                % (a["first"][bad], target[bad]),
            )
        # Bytes that may not appear: '/' and NUL in a name, NUL in a target.
        for lo in range(0, len(blob), 16 * _BLOCK):
            piece = blob[lo : lo + 16 * _BLOCK]
            positions = np.flatnonzero((piece == _SLASH) | (piece == 0)).astype(
                np.uint64
            ) + np.uint64(lo)
            if not len(positions):
                continue
            owner = np.searchsorted(starts, positions, side="right").astype(np.int64) - 1
            in_name = positions < target[owner]
            nul = blob[positions.astype(np.int64)] == 0
            bad = _first_bad(in_name | nul)
            if bad is not None:
                e = int(owner[bad])
                what = "name" if in_name[bad] else "symlink target"
                raise self.fail(
                    "names", e, "(%s) contains %s" % (what, "NUL" if nul[bad] else "'/'")
                )
        short = np.flatnonzero((name_len == 1) | (name_len == 2))
        if len(short):
            off = name_off[short].astype(np.int64)
            dots = (blob[off] == _DOT) & (
                (name_len[short] == 1) | (blob[np.minimum(off + 1, len(blob) - 1)] == _DOT)
            )
            bad = _first_bad(dots)
            if bad is not None:
                raise self.fail("names", int(short[bad]), "is '.' or '..'")

    def files(self) -> None:
        """Each file has ceil(size / chunk_size) chunks, or ceil(size / block_size) blocks,
        and the files' chunk ranges tile the chunk table in entry order (chunk id <-> (file,
        chunk number) is a bijection)."""
        a = self.a
        files = np.flatnonzero(self.is_reg)
        sizes = a["size"][files]
        bad = _first_bad(sizes >= _MAX_BYTES)
        if bad is not None:
            raise self.fail("size", int(files[bad]), "= %d is too large" % sizes[bad])
        counts = a["count"][files].astype(np.uint64)
        # The unit each count implies (blocks only where the count is too large for chunks);
        # a count that is right for neither unit fails here.
        units = file_chunk_sizes(sizes, counts, self.chunk_size, self.block_size)
        bad = _first_bad(counts != (sizes + units - np.uint64(1)) // units)
        if bad is not None:
            e = int(files[bad])
            expected = "%d chunks of %d" % (-(-int(sizes[bad]) // self.chunk_size), self.chunk_size)
            if self.block_size:
                expected += " or %d blocks of %d" % (
                    -(-int(sizes[bad]) // self.block_size),
                    self.block_size,
                )
            raise self.fail(
                "count",
                e,
                "= %d, but a file of %d bytes has %s" % (counts[bad], sizes[bad], expected),
            )
        ends = np.cumsum(counts, dtype=np.uint64)
        bad = _first_bad(a["first"][files] != ends - counts)
        if bad is not None:
            e = int(files[bad])
            raise self.fail(
                "first",
                e,
                "= %d, expected %d (files' chunks are consecutive in entry order)"
                % (a["first"][e], ends[bad] - counts[bad]),
            )
        used = int(ends[-1]) if len(ends) else 0
        if used != self.chunks:
            raise _fail(
                self.pack,
                "index: files use %d chunks, the chunk table has %d" % (used, self.chunks),
            )
        self._counts, self._sizes = counts, sizes

    def usizes(self) -> np.ndarray:
        """Decoded size of every chunk: the file's unit, but the remainder for its last."""
        return chunk_usizes(self._sizes, self._counts, self.chunk_size, self.block_size)

    def chunk_table(self) -> None:
        a = self.a
        if not self.chunks:
            return
        partition = a["partition"]
        bad = _first_bad(partition >= len(self.partition_sizes))
        if bad is not None:
            raise self.fail(
                "partition",
                bad,
                "= %d, but the pack has %d partitions"
                % (partition[bad], len(self.partition_sizes)),
            )
        offset, csize = a["offset"], a["csize"].astype(np.uint64)
        bad = _first_bad(offset >= _MAX_BYTES)
        if bad is not None:
            raise self.fail("offset", bad, "= %d is too large" % offset[bad])
        limits = np.asarray(self.partition_sizes, dtype=np.uint64)[partition]
        bad = _first_bad(offset + csize > limits)
        if bad is not None:
            raise self.fail(
                "offset",
                bad,
                "= %d with csize %d ends past the %d bytes of partition %d"
                % (offset[bad], csize[bad], limits[bad], partition[bad]),
            )
        codec = a["codec"]
        codec_id, nibble = codec & 0x0F, codec >> 4
        known = np.isin(codec_id, _KNOWN_CODECS_BY_VERSION.get(self.version, _KNOWN_CODECS))
        shuffle_ok = (
            nibble == 0
            if self.version < 3
            else (nibble <= _MAX_SHUFFLE_NIBBLE) & ((nibble == 0) | (codec_id != 0))
        )
        bad = _first_bad(~(known & shuffle_ok))
        if bad is not None:
            raise self.fail(
                "codec",
                bad,
                "= %d is not a codec byte of format version %d" % (codec[bad], self.version),
            )
        usize = self.usizes()
        raw = codec == 0
        bad = _first_bad((raw & (csize != usize)) | (~raw & ((csize == 0) | (csize > usize))))
        if bad is not None:
            raise self.fail(
                "csize",
                bad,
                "= %d does not fit a chunk of %d bytes with codec %d"
                % (csize[bad], usize[bad], codec[bad]),
            )
        dict_id = a["dict"]
        dict_codecs = (2,) if self.version < 3 else (1, 2)
        bad = _first_bad(
            (dict_id > self.dictionaries) | ((dict_id != 0) & ~np.isin(codec_id, dict_codecs))
        )
        if bad is not None:
            raise self.fail(
                "dict",
                bad,
                "= %d is not a dictionary of this pack for codec %d (%d dictionaries)"
                % (dict_id[bad], codec[bad], self.dictionaries),
            )


def reference_check_index(pack: str, arrays: Mapping[str, np.ndarray], **options: Any) -> None:
    _IndexCheck(pack, arrays, **options).run()
