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
import zlib
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from fanfs.errors import PackFormatError, PackVersionError
from fanfs.format.layout import (
    FORMAT_VERSION,
    INDEX_NAME,
    MAGIC,
    MANIFEST_HEADER,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_CONTAINERS,
    READABLE_VERSIONS,
    chunk_usizes,
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
# Rows examined per numpy pass where a pass needs temporaries as long as the column.
_BLOCK: Final = 1 << 20
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
    index.integer("size")
    index.integer("crc32", 0, _U32)
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
    if len(body) != length or zlib.crc32(body) != crc:
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
