"""Validation of an untrusted pack: the manifest's schema and the index's structure.

A pack sits on a filesystem that many people can write, and the mount runs as root
(docs/security.md). So every field a reader uses is checked once, at open, before anything
is allocated in proportion to it or looked up through it: the manifest against its schema
(`check_manifest`), and every index column against the tree structure the writer produces
(`check_index`), vectorised with numpy so that a pack of millions of files costs no per-file
Python work. After these checks:

- partition files are exactly `part-NNNNN` for partition N (no path from the pack is ever
  joined to a directory);
- the entries form a tree in breadth-first order: `parent[e] < e`, so walking up from any
  entry ends at the root; every directory's children are exactly the run of entries that
  name it as parent, and the names sit in the canonical layout of the names blob, each 1..255
  bytes without `/` or NUL and neither `.` nor `..`;
- every regular file has exactly ceil(size / chunk_size) chunks, or (version 5) exactly
  ceil(size / block_size) blocks, and the files' chunk ranges tile the chunk table in entry
  order, so a chunk id names one (file, chunk number);
- every chunk lies inside its partition, decodes to at most the chunk size, has a known
  codec byte and an existing dictionary, and a raw chunk is exactly its decoded size.

What is not checked: that names within a directory are sorted (a lookup is a binary search:
an unsorted directory makes some of its names unfindable, nothing more), partition and chunk
checksums (verify reads every byte; the mount checks each chunk before it decodes it), and
whether a chunk decodes (a bounded decoder finds out on read).

Each failure raises `PackFormatError` with one line naming the field and the first bad row.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Final

import numpy as np

from fanfs.errors import PackFormatError, PackVersionError
from fanfs.format.layout import (
    FORMAT_VERSION,
    INDEX_CODECS,
    INDEX_NAME,
    MAGIC,
    MANIFEST_HEADER,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_CONTAINERS,
    READABLE_VERSIONS,
    chunk_usizes,
    crc32,
    file_chunk_sizes,
    index_columns,
    open_pack_file,
    partition_name,
)

# Chunk sizes a pack may declare (`fanfs pack --chunk-size`): 4 KiB to 64 MiB.
MIN_CHUNK_SIZE: Final = 4 * 1024
MAX_CHUNK_SIZE: Final = 64 * 1024 * 1024
# Regular plus broadcast partitions (each set at most MAX_PARTITIONS in pack.py).
MAX_PARTITION_FILES: Final = 2 * 4096
MAX_DICTIONARIES: Final = 0xFFFF  # the chunk column `dict` is u16
# Longest symlink target Linux stores (PATH_MAX - 1); the kernel's FUSE readlink caps it too.
MAX_LINK_TARGET: Final = 4095
_U32: Final = 0xFFFFFFFF
# Larger than any real file or partition, small enough that sums of two stay inside u64/i64.
_MAX_BYTES: Final = 1 << 60
_KNOWN_CODECS_BY_VERSION: Final = {1: (0, 1, 2, 3), 2: (0, 1, 2, 3, 4)}
_KNOWN_CODECS: Final = (0, 1, 2, 3, 4)
_MAX_SHUFFLE_NIBBLE: Final = 3  # shuffles of 2, 4 and 8 bytes
# Rows per step of a check (_IndexCheck): small enough that a step's temporaries stay in the
# CPU cache, large enough that numpy's per-call cost stays small against the work.
_BLOCK: Final = 1 << 15
_S_IFMT: Final = 0o170000  # the file type bits of st_mode
_SLASH: Final = 0x2F
_DOT: Final = 0x2E


def _fail(pack: str, message: str) -> PackFormatError:
    return PackFormatError("%s: %s" % (pack, message))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Schema:
    """Typed access to one JSON object of the manifest, naming the field on failure."""

    def __init__(self, pack: str, obj: object, where: str) -> None:
        if not isinstance(obj, dict):
            raise _fail(
                pack,
                "manifest field %s is %s, expected an object" % (where or "(top)", _short(obj)),
            )
        self.pack, self.obj, self.where = pack, obj, where

    def _name(self, key: str) -> str:
        return "%s.%s" % (self.where, key) if self.where else key

    def get(self, key: str) -> Any:
        if key not in self.obj:
            raise _fail(self.pack, "manifest lacks the field %s" % self._name(key))
        return self.obj[key]

    def integer(self, key: str, low: int = 0, high: int = _MAX_BYTES) -> int:
        value = self.get(key)
        # JSON true/false are ints to Python; a pack never has them where numbers belong.
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise _fail(
                self.pack,
                "manifest field %s is %s, expected an integer in %d..%d"
                % (self._name(key), _short(value), low, high),
            )
        return value

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise _fail(
                self.pack,
                "manifest field %s is %s, expected a string" % (self._name(key), _short(value)),
            )
        return value

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise _fail(
                self.pack,
                "manifest field %s is %s, expected true or false"
                % (self._name(key), _short(value)),
            )
        return value

    def items(self, key: str, high: int) -> list[Any]:
        value = self.get(key)
        if not isinstance(value, list) or len(value) > high:
            raise _fail(
                self.pack,
                "manifest field %s is %s, expected a list of at most %d items"
                % (self._name(key), _short(value), high),
            )
        return value

    def sub(self, key: str) -> _Schema:
        return _Schema(self.pack, self.get(key), self._name(key))


def check_manifest(pack: str, manifest: dict[str, Any], version: int) -> None:
    """Check every manifest field a reader, `inspect` or staging uses (docs/format.md §2)."""
    top = _Schema(pack, manifest, "")
    top.text("created_by")
    chunk_size = top.integer("chunk_size", MIN_CHUNK_SIZE, MAX_CHUNK_SIZE)
    if version >= 5:
        # At most half a chunk, so that a file's chunk count tells blocks from chunks.
        block_size = top.integer("block_size", 0, chunk_size // 2)
        if 0 < block_size < MIN_CHUNK_SIZE:
            raise _fail(
                pack,
                "manifest field block_size is %d, expected 0 or %d..%d"
                % (block_size, MIN_CHUNK_SIZE, chunk_size // 2),
            )
    options = top.sub("options")
    options.text("codec")
    options.integer("partitions", 0, MAX_PARTITION_FILES)
    options.integer("chunk_size", 0, _MAX_BYTES)
    for number, glob in enumerate(options.items("broadcast", 1 << 16)):
        if not isinstance(glob, str):
            raise _fail(
                pack,
                "manifest field options.broadcast[%d] is %s, expected a string"
                % (number, _short(glob)),
            )
    totals = top.sub("totals")
    for key in ("files", "dirs", "symlinks", "bytes_in", "bytes_out", "skipped"):
        totals.integer(key)
    stats = top.sub("codec_stats")
    for name in stats.obj:
        row = stats.sub(name)
        for key in ("chunks", "bytes_in", "bytes_out"):
            row.integer(key)

    index = top.sub("index")
    if index.text("file") != INDEX_NAME:
        raise _fail(
            pack,
            "manifest field index.file is %s, expected %r"
            % (_short(index.obj["file"]), INDEX_NAME),
        )
    size = index.integer("size")
    index.integer("crc32", 0, _U32)
    if version >= 6:
        # The index file may be one zstd frame; `usize` is what it decompresses to, the
        # space the columns' offsets refer to (bounded by memory at open, `Index`).
        codec = index.text("codec")
        if codec not in INDEX_CODECS:
            raise _fail(
                pack,
                "manifest field index.codec is %s, expected one of %s"
                % (_short(codec), ", ".join(INDEX_CODECS)),
            )
        usize = index.integer("usize")
        if codec == "none" and usize != size:
            raise _fail(
                pack,
                "manifest field index.usize is %d, expected the index size %d (codec none)"
                % (usize, size),
            )
    index.integer("entries", 1, _U32)
    index.integer("chunks", 0, _MAX_BYTES)
    expected = index_columns(version)
    columns = index.items("columns", len(expected))
    if len(columns) != len(expected):
        raise _fail(
            pack,
            "manifest field index.columns lists %d columns, expected %d"
            % (len(columns), len(expected)),
        )
    for number, ((name, dtype), raw) in enumerate(zip(expected, columns, strict=True)):
        column = _Schema(pack, raw, "index.columns[%d]" % number)
        if column.text("name") != name or column.text("dtype") != dtype:
            raise _fail(
                pack,
                "manifest field index.columns[%d] is %s %s, expected %s %s"
                % (number, _short(raw.get("name")), _short(raw.get("dtype")), name, dtype),
            )
        column.integer("offset")
        column.integer("length")

    parts = top.items("partitions", MAX_PARTITION_FILES)
    if not parts:
        raise _fail(pack, "manifest field partitions is empty")
    for number, raw in enumerate(parts):
        part = _Schema(pack, raw, "partitions[%d]" % number)
        name = part.text("file")
        if name != partition_name(number):
            # Never a path: the file of partition N is always part-NNNNN inside the pack.
            raise _fail(
                pack,
                "manifest field partitions[%d].file is %s, expected %r"
                % (number, _short(name), partition_name(number)),
            )
        part.integer("size")
        part.integer("crc32", 0, _U32)
        part.integer("chunks")
        part.flag("broadcast")

    if version >= 2:
        from fanfs.compression import DICT_MAX_BYTES

        for number, raw in enumerate(top.items("dictionaries", MAX_DICTIONARIES)):
            entry = _Schema(pack, raw, "dictionaries[%d]" % number)
            entry.integer("id", number + 1, number + 1)
            entry.integer("offset")
            entry.integer("size", 1, DICT_MAX_BYTES)
            entry.integer("crc32", 0, _U32)
            entry.text("class")
        plan = top.get("plan")
        if plan is not None and not isinstance(plan, dict):
            raise _fail(
                pack, "manifest field plan is %s, expected an object or null" % _short(plan)
            )


def _first_bad(mask: np.ndarray) -> int | None:
    return int(mask.argmax()) if mask.any() else None


def _spans(stop: int, start: int = 0) -> Iterator[tuple[int, int]]:
    """Row ranges of at most _BLOCK rows that cover rows start..stop-1 in order."""
    for lo in range(start, stop, _BLOCK):
        yield lo, min(stop, lo + _BLOCK)


class _FirstBad:
    """The first bad row of each of several checks made in one blocked pass, with the values
    its message names. Raising for the first check, in the checks' order, that found one
    reports what running each check over every row before the next would: the same check,
    the same row, the same values."""

    def __init__(self, checks: int) -> None:
        self.rows: list[int | None] = [None] * checks
        self.values: list[tuple[int, ...]] = [()] * checks

    def note(
        self,
        check: int,
        lo: int,
        mask: np.ndarray,
        *values: np.ndarray,
        rows: np.ndarray | None = None,
    ) -> None:
        """Record `check`'s first bad row in `mask`, a block of rows lo.. (or of the rows
        `rows`), and the `values` at it, unless an earlier block had one."""
        if self.rows[check] is not None:
            return
        bad = _first_bad(mask)
        if bad is not None:
            self.rows[check] = lo + bad if rows is None else int(rows[bad])
            self.values[check] = tuple(int(value[bad]) for value in values)

    def any(self) -> bool:
        return any(row is not None for row in self.rows)


def _codec_bytes(version: int, codecs: tuple[int, ...], *, any_shuffle: bool) -> np.ndarray:
    """For each of the 256 codec bytes, whether its codec id is in `codecs` and (unless
    `any_shuffle`) its shuffle nibble is one format `version` allows: a table looked up per
    chunk instead of computing this per chunk."""
    codec = np.arange(256, dtype=np.uint8)
    codec_id, nibble = codec & 0x0F, codec >> 4
    if any_shuffle:
        return np.isin(codec_id, codecs)
    shuffle_ok = (
        nibble == 0
        if version < 3
        else (nibble <= _MAX_SHUFFLE_NIBBLE) & ((nibble == 0) | (codec_id != 0))
    )
    return np.isin(codec_id, codecs) & shuffle_ok


class _IndexCheck:
    """The structural checks of one index (see the module docstring).

    The checks walk the columns in blocks of _BLOCK rows, so that their temporaries stay
    small and are reused: a temporary as long as a column of ten million rows is fresh
    memory, and on a VM the first touch of memory costs more than the check itself
    (docs/benchmarks.md). Checks that read the same columns share one pass (`_FirstBad`) and
    still fail as if each had run over every row before the next. No check indexes with a
    value that an earlier check has not validated, and none allocates in proportion to one.
    Running sums are checked as differences (name_off[e+1] - name_off[e] is entry e's span):
    the same first bad row as comparing with a prefix sum, without the slow cumsum."""

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

    def fail(self, column: str, row: int, message: str) -> PackFormatError:
        return _fail(self.pack, "index: %s[%d] %s" % (column, row, message))

    def kind(self, lo: int, hi: int) -> np.ndarray:
        """The file type bits of the modes of entries lo..hi-1."""
        return self.a["mode"][lo:hi] & _S_IFMT

    def run(self) -> None:
        """Every check; the first that fails raises, in this order: kinds, tree, names,
        name_bytes, files_and_chunks. The last (about half the work) runs in a thread of
        its own meanwhile: numpy releases the GIL, so on two cores the checks take about
        half the time. It never indexes with an unchecked value, so it is safe to run on an
        index the others are still to refuse; its failure is raised only if theirs pass."""
        failed: list[BaseException] = []

        def files_and_chunks() -> None:
            try:
                self.files_and_chunks()
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=files_and_chunks, name="fanfs-check-files", daemon=True)
        thread.start()
        try:
            self.kinds()
            self.tree()
            self.names()
            self.name_bytes()
        finally:
            thread.join()
        if failed:
            raise failed[0]

    def kinds(self) -> None:
        a = self.a
        size, count = a["size"], a["count"]
        found = _FirstBad(3)  # an unknown kind, a directory's size, a symlink's count
        for lo, hi in _spans(self.n):
            kind = self.kind(lo, hi)
            is_dir, is_lnk = kind == stat.S_IFDIR, kind == stat.S_IFLNK
            found.note(0, lo, ~(is_dir | is_lnk | (kind == stat.S_IFREG)))
            found.note(1, lo, is_dir & (size[lo:hi] != 0))
            found.note(2, lo, is_lnk & (count[lo:hi] != 0))
        bad = found.rows[0]
        if bad is not None:
            raise self.fail(
                "mode", bad, "= 0o%o is not a directory, regular file or symlink" % a["mode"][bad]
            )
        if self.kind(0, 1)[0] != stat.S_IFDIR or a["parent"][0] != 0 or a["name_len"][0] != 0:
            raise _fail(self.pack, "index: entry 0 is not a root directory (parent 0, empty name)")
        for column, bad in (("size", found.rows[1]), ("count", found.rows[2])):
            if bad is not None:
                raise self.fail(
                    column,
                    bad,
                    "= %d, expected 0 for a %s"
                    % (a[column][bad], "directory" if column == "size" else "symlink"),
                )

    def tree(self) -> None:
        """Breadth-first order: parents come first (so the tree has no cycle), and every
        directory's children are exactly the run of entries naming it as parent."""
        parent, first, count = self.a["parent"], self.a["first"], self.a["count"]
        n = self.n
        # A forward reference, a parent below the previous entry's, an empty directory
        # whose first is not 0.
        found = _FirstBad(3)
        claimed = 0  # directories whose count says they have children
        # The entries that start a run of children: entry 1, and every entry whose parent
        # differs from the previous entry's.
        starts = [np.zeros(0, np.int64)]
        for lo, hi in _spans(n):
            is_dir, empty = self.kind(lo, hi) == stat.S_IFDIR, count[lo:hi] == 0
            claimed += int(np.count_nonzero(is_dir & ~empty))
            found.note(2, lo, is_dir & empty & (first[lo:hi] != 0))
            if hi == 1:
                continue
            lo = max(lo, 1)
            here, before = parent[lo:hi], parent[lo - 1 : hi - 1]
            found.note(0, lo, here >= np.arange(lo, hi, dtype=np.int64))
            down, new_run = here < before, here != before
            if lo == 1:
                down[0], new_run[0] = False, True
            found.note(1, lo, down)
            if found.rows[0] is None and found.rows[1] is None:
                starts.append(np.flatnonzero(new_run) + lo)
        for bad, problem in (
            (found.rows[0], "is not an earlier entry (a cycle or a forward reference)"),
            (found.rows[1], "is below the previous entry's parent (not breadth-first)"),
        ):
            if bad is not None:
                raise self.fail("parent", bad, "= %d %s" % (parent[bad], problem))
        run_starts = np.concatenate(starts)
        owners = parent[run_starts].astype(np.int64)
        lengths = np.diff(np.append(run_starts, n))
        bad = _first_bad((self.a["mode"][owners] & _S_IFMT) != stat.S_IFDIR)
        if bad is not None:
            raise self.fail("parent", int(run_starts[bad]), "= %d is not a directory" % owners[bad])
        bad = _first_bad((first[owners] != run_starts) | (count[owners] != lengths))
        if bad is not None:
            d = int(owners[bad])
            raise self.fail(
                "first",
                d,
                "= %d, count = %d, but its children are entries %d..%d"
                % (first[d], count[d], run_starts[bad], run_starts[bad] + lengths[bad] - 1),
            )
        if claimed != len(owners):
            has_kids = np.zeros(n, dtype=bool)
            has_kids[owners] = True
            lonely = _first_bad((self.kind(0, n) == stat.S_IFDIR) & (count != 0) & ~has_kids)
            assert lonely is not None
            raise self.fail(
                "count", lonely, "= %d, but no entry names it as parent" % count[lonely]
            )
        bad = found.rows[2]
        if bad is not None:
            raise self.fail("first", bad, "= %d, expected 0 for an empty directory" % first[bad])

    def names(self) -> None:
        """Canonical layout: each entry's name, then a symlink's target, back to back."""
        a = self.a
        name_len, name_off, size, first = a["name_len"], a["name_off"], a["size"], a["first"]
        # An empty name (but the root's), a name too long, a symlink target's length, a name
        # not where the one before it ends, a symlink target not right after its name.
        found = _FirstBad(5)
        end = np.zeros(1, np.uint64)  # where the entry before this block ends in the blob
        for lo, hi in _spans(self.n):
            length, is_lnk = name_len[lo:hi], self.kind(lo, hi) == stat.S_IFLNK
            empty = length == 0
            if lo == 0:
                empty[0] = False
            found.note(0, lo, empty)
            found.note(1, lo, length > 255)
            off = name_off[lo:hi]
            ends = off + length  # where each name ends (and its symlink target starts)
            if is_lnk.any():
                target = size[lo:hi]
                found.note(2, lo, is_lnk & ((target == 0) | (target > MAX_LINK_TARGET)))
                found.note(4, lo, is_lnk & (first[lo:hi] != ends), ends)
                ends += np.where(is_lnk, target, 0)
            # Each entry starts where the one before it ends (entry 0 at 0).
            starts = np.concatenate((end, ends[:-1]))
            found.note(3, lo, off != starts, starts)
            end = ends[-1:]
        if found.rows[0] is not None:
            raise self.fail("name_len", found.rows[0], "= 0 (only the root has an empty name)")
        bad = found.rows[1]
        if bad is not None:
            raise self.fail("name_len", bad, "= %d exceeds 255" % name_len[bad])
        bad = found.rows[2]
        if bad is not None:
            raise self.fail(
                "size",
                bad,
                "= %d is not a symlink target length (1..%d)" % (size[bad], MAX_LINK_TARGET),
            )
        bad = found.rows[3]
        if bad is not None:
            raise self.fail(
                "name_off",
                bad,
                "= %d, expected %d (names are stored back to back in entry order)"
                % (name_off[bad], found.values[3][0]),
            )
        if int(end[0]) != len(a["names"]):
            raise _fail(
                self.pack,
                "index: the names blob is %d bytes, its entries use %d"
                % (len(a["names"]), int(end[0])),
            )
        bad = found.rows[4]
        if bad is not None:
            raise self.fail(
                "first",
                bad,
                "= %d, expected %d (a symlink's target follows its name)"
                % (first[bad], found.values[4][0]),
            )

    def name_bytes(self) -> None:
        """Bytes that may not appear: '/' and NUL in a name, NUL in a target; and no name is
        '.' or '..'. Runs after `names`: entry e's name starts at name_off[e], inside the
        blob, and the name_offs are sorted."""
        a = self.a
        name_len, name_off, blob = a["name_len"], a["name_off"], a["names"]
        for lo, hi in _spans(len(blob)):
            piece = blob[lo:hi]
            hits = np.flatnonzero((piece == _SLASH) | (piece == 0))
            if not len(hits):
                continue
            positions = hits.astype(np.uint64) + np.uint64(lo)
            owner = np.searchsorted(name_off, positions, side="right").astype(np.int64) - 1
            in_name = positions < name_off[owner] + name_len[owner]
            nul = piece[hits] == 0
            bad = _first_bad(in_name | nul)
            if bad is not None:
                e = int(owner[bad])
                what = "name" if in_name[bad] else "symlink target"
                raise self.fail(
                    "names", e, "(%s) contains %s" % (what, "NUL" if nul[bad] else "'/'")
                )
        last = len(blob) - 1
        for lo, hi in _spans(self.n):
            length = name_len[lo:hi]
            short = np.flatnonzero((length == 1) | (length == 2))
            if not len(short):
                continue
            off = name_off[lo:hi][short].astype(np.int64)
            dots = (blob[off] == _DOT) & (
                (length[short] == 1) | (blob[np.minimum(off + 1, last)] == _DOT)
            )
            bad = _first_bad(dots)
            if bad is not None:
                raise self.fail("names", lo + int(short[bad]), "is '.' or '..'")

    def files_and_chunks(self) -> None:
        """Each file has ceil(size / chunk_size) chunks, or ceil(size / block_size) blocks,
        and the files' chunk ranges tile the chunk table in entry order (chunk id <-> (file,
        chunk number) is a bijection); then the chunk table (`_ChunkCheck`). One pass: each
        block of entries, then the chunks of its files while the files check out."""
        a = self.a
        size, count, first = a["size"], a["count"], a["first"]
        found = _FirstBad(3)  # a size too large, a wrong count, a chunk range out of place
        chunks = _ChunkCheck(self)
        end = np.zeros(1, np.uint64)  # where the chunks of the files before this block end
        for lo, hi in _spans(self.n):
            is_reg = self.kind(lo, hi) == stat.S_IFREG
            rows: np.ndarray | None = None  # the files' entry ids, unless all of lo..hi-1
            if is_reg.all():
                sizes, counts, firsts = size[lo:hi], count[lo:hi], first[lo:hi]
            else:
                rows = np.flatnonzero(is_reg) + lo
                if not len(rows):
                    continue
                sizes, counts, firsts = size[rows], count[rows], first[rows]
            found.note(0, lo, sizes >= _MAX_BYTES, rows=rows)
            if (counts == 1).all():
                # One chunk each (most files of most datasets): 1..chunk_size bytes; each
                # chunk decodes to its file's size.
                wrong = sizes - np.uint64(1) >= np.uint64(self.chunk_size)
                found.note(1, lo, wrong, counts, sizes, rows=rows)
                usizes = sizes
            else:
                wide = counts.astype(np.uint64)
                # The unit each count implies (blocks only where the count is too large for
                # chunks); a count that is right for neither unit fails here.
                if self.block_size:
                    units = file_chunk_sizes(sizes, wide, self.chunk_size, self.block_size)
                    wrong = wide != (sizes + units - np.uint64(1)) // units
                else:
                    unit = np.uint64(self.chunk_size)
                    wrong = wide != (sizes + (unit - np.uint64(1))) // unit
                found.note(1, lo, wrong, counts, sizes, rows=rows)
                usizes = None
            # Each file's chunks start where the previous file's end.
            starts = np.concatenate((end, firsts[:-1] + counts[:-1]))
            found.note(2, lo, firsts != starts, starts, rows=rows)
            done, end = int(end[0]), firsts[-1:] + counts[-1:]
            if found.any() or int(end[0]) > self.chunks:
                continue  # reported below: the chunks are not looked at
            if usizes is None:
                usizes = chunk_usizes(sizes, wide, self.chunk_size, self.block_size)
            for start, stop in _spans(int(end[0]), done):
                chunks.check(start, stop, usizes[start - done : stop - done])
        bad = found.rows[0]
        if bad is not None:
            raise self.fail("size", bad, "= %d is too large" % size[bad])
        bad = found.rows[1]
        if bad is not None:
            chunk_count, file_size = found.values[1]
            expected = "%d chunks of %d" % (-(-file_size // self.chunk_size), self.chunk_size)
            if self.block_size:
                expected += " or %d blocks of %d" % (
                    -(-file_size // self.block_size),
                    self.block_size,
                )
            raise self.fail(
                "count",
                bad,
                "= %d, but a file of %d bytes has %s" % (chunk_count, file_size, expected),
            )
        bad = found.rows[2]
        if bad is not None:
            raise self.fail(
                "first",
                bad,
                "= %d, expected %d (files' chunks are consecutive in entry order)"
                % (first[bad], found.values[2][0]),
            )
        if int(end[0]) != self.chunks:
            raise _fail(
                self.pack,
                "index: files use %d chunks, the chunk table has %d" % (int(end[0]), self.chunks),
            )
        chunks.report()


class _ChunkCheck:
    """The chunk table's checks, made on the chunks of one block of files at a time
    (`_IndexCheck.files_and_chunks`): every chunk inside an existing partition, with a known
    codec byte, a stored size that fits its decoded size, and an existing dictionary."""

    def __init__(self, index: _IndexCheck) -> None:
        a = index.a
        self.index = index
        self.partition, self.offset, self.csize, self.codec, self.dict_id = (
            a[name] for name in ("partition", "offset", "csize", "codec", "dict")
        )
        # Version 7's solid blocks (all 0 before: every chunk decodes to its own size).
        self.skip, self.bsize = a["skip"], a["bsize"]
        self.chunk_size = np.uint64(index.chunk_size)
        self.limits = np.asarray(index.partition_sizes, dtype=np.uint64)
        version = index.version
        self.unknown = ~_codec_bytes(
            version, _KNOWN_CODECS_BY_VERSION.get(version, _KNOWN_CODECS), any_shuffle=False
        )
        self.refuses_dict = ~_codec_bytes(
            version, (2,) if version < 3 else (1, 2), any_shuffle=True
        )
        # A partition that does not exist, an offset too large, a chunk ending past its
        # partition, an unknown codec byte, a stored size that does not fit its decoded
        # size, a dictionary that does not exist or not for its codec, a slice that does
        # not lie inside its block (or a block larger than a chunk).
        self.found = _FirstBad(7)

    def check(self, start: int, stop: int, usize: np.ndarray) -> None:
        """Chunks start..stop-1, which decode to `usize` bytes each."""
        found, limits = self.found, self.limits
        part, off = self.partition[start:stop], self.offset[start:stop]
        stored, byte = self.csize[start:stop], self.codec[start:stop]
        found.note(0, start, part >= len(limits))
        found.note(1, start, off >= _MAX_BYTES)
        # Clipped: a partition that does not exist is reported above, never looked up.
        limit = limits[0] if len(limits) == 1 else limits.take(np.minimum(part, len(limits) - 1))
        found.note(2, start, off + stored > limit)
        found.note(3, start, self.unknown.take(byte))
        decoded = usize
        if self.index.version >= 7:
            # A slice of a solid block: skip + usize <= bsize <= chunk_size, and the stored
            # bytes decode to bsize; a chunk of its own (bsize 0) has skip 0.
            bsize = self.bsize[start:stop].astype(np.uint64)
            skip = self.skip[start:stop].astype(np.uint64)
            solid = bsize > 0
            found.note(
                6,
                start,
                np.where(solid, (skip + usize > bsize) | (bsize > self.chunk_size), skip > 0),
                skip,
                bsize,
                usize,
            )
            decoded = np.where(solid, bsize, usize)
        # A raw chunk is exactly its decoded size; any other is 1..that size.
        found.note(
            4, start, (stored > decoded) | (stored < np.where(byte == 0, decoded, 1)), decoded
        )
        ids = self.dict_id[start:stop]
        if self.index.dictionaries:
            refused = (ids > self.index.dictionaries) | ((ids != 0) & self.refuses_dict.take(byte))
        else:
            refused = ids != 0
        found.note(5, start, refused)

    def report(self) -> None:
        """Raise PackFormatError for the first check, in order, that found a bad chunk."""
        index, rows = self.index, self.found.rows
        partition, offset, csize, codec = self.partition, self.offset, self.csize, self.codec
        bad = rows[0]
        if bad is not None:
            raise index.fail(
                "partition",
                bad,
                "= %d, but the pack has %d partitions" % (partition[bad], len(self.limits)),
            )
        bad = rows[1]
        if bad is not None:
            raise index.fail("offset", bad, "= %d is too large" % offset[bad])
        bad = rows[2]
        if bad is not None:
            raise index.fail(
                "offset",
                bad,
                "= %d with csize %d ends past the %d bytes of partition %d"
                % (offset[bad], csize[bad], self.limits[partition[bad]], partition[bad]),
            )
        bad = rows[3]
        if bad is not None:
            raise index.fail(
                "codec",
                bad,
                "= %d is not a codec byte of format version %d" % (codec[bad], index.version),
            )
        # A slice outside its block before its stored size, which depends on the block.
        bad = rows[6]
        if bad is not None:
            skip, bsize, usize = self.found.values[6]
            if bsize == 0:
                message = "= %d, but the chunk is not in a solid block (bsize 0)" % skip
            else:
                message = "= %d: %d bytes from there do not fit a block of %d bytes" % (
                    skip,
                    usize,
                    bsize,
                )
                if bsize > self.chunk_size:
                    message = "= %d: the block of %d bytes is larger than a chunk (%d)" % (
                        skip,
                        bsize,
                        self.chunk_size,
                    )
            raise index.fail("skip", bad, message)
        bad = rows[4]
        if bad is not None:
            raise index.fail(
                "csize",
                bad,
                "= %d does not fit a chunk of %d bytes with codec %d"
                % (csize[bad], self.found.values[4][0], codec[bad]),
            )
        bad = rows[5]
        if bad is not None:
            raise index.fail(
                "dict",
                bad,
                "= %d is not a dictionary of this pack for codec %d (%d dictionaries)"
                % (self.dict_id[bad], codec[bad], index.dictionaries),
            )


def check_index(
    pack: str,
    arrays: Mapping[str, np.ndarray],
    *,
    chunk_size: int,
    block_size: int = 0,
    partition_sizes: list[int],
    dictionaries: int,
    version: int,
) -> None:
    """Check the structure of a loaded index (column lengths already checked). Raises
    PackFormatError naming the first bad field and row."""
    _IndexCheck(
        pack,
        arrays,
        chunk_size=chunk_size,
        block_size=block_size,
        partition_sizes=partition_sizes,
        dictionaries=dictionaries,
        version=version,
    ).run()


def read_manifest(pack_dir: str) -> dict[str, Any]:
    """Read `pack_dir/fanfs.manifest` and check it against its schema (`check_manifest`);
    raises PackFormatError/PackVersionError."""
    if not os.path.isdir(pack_dir):
        raise PackFormatError("%s: not a fanfs pack (no such directory)" % pack_dir)
    if not os.path.lexists(os.path.join(pack_dir, MANIFEST_NAME)):
        raise PackFormatError("%s: not a fanfs pack (no %s)" % (pack_dir, MANIFEST_NAME))
    fd = open_pack_file(pack_dir, MANIFEST_NAME, "manifest")
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + MANIFEST_HEADER.size)
    except OSError as exc:
        raise PackFormatError("%s: cannot read manifest: %s" % (pack_dir, exc.strerror)) from exc
    if raw[: len(MAGIC)] != MAGIC[: len(raw)] or not raw:
        raise PackFormatError("%s: not a fanfs pack (bad magic in %s)" % (pack_dir, MANIFEST_NAME))
    if len(raw) < MANIFEST_HEADER.size:
        raise PackFormatError("%s: manifest is truncated or corrupt" % pack_dir)
    _, version, length, crc = MANIFEST_HEADER.unpack_from(raw)
    if version not in READABLE_VERSIONS:
        raise PackVersionError(
            "%s: pack format version %d is not supported (this fanfs reads version %d)"
            % (pack_dir, version, FORMAT_VERSION)
        )
    body = raw[MANIFEST_HEADER.size :]
    if len(body) != length or crc32(body) != crc:
        raise PackFormatError("%s: manifest is truncated or corrupt" % pack_dir)
    if body.count(b"{") + body.count(b"[") > MAX_MANIFEST_CONTAINERS:
        raise PackFormatError(
            "%s: manifest has more than %d JSON objects and arrays"
            % (pack_dir, MAX_MANIFEST_CONTAINERS)
        )
    try:
        manifest: dict[str, Any] = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # RecursionError: nesting deeper than the interpreter's stack (a hostile manifest).
        raise PackFormatError("%s: manifest is not valid JSON: %s" % (pack_dir, exc)) from exc
    if not isinstance(manifest, dict) or manifest.get("format_version") != version:
        raise PackFormatError(
            "%s: manifest does not match its header's format version %d" % (pack_dir, version)
        )
    check_manifest(pack_dir, manifest, version)
    return manifest
