"""The read-only index: entries (files, directories, symlinks), chunks and names.

The index file is a set of little-endian column arrays (layout.ENTRY_COLUMNS,
layout.CHUNK_COLUMNS, the names blob, the dictionaries blob) described in the manifest. `Index`
reads the file into private memory (never a mapping of the pack: it may change under the
mount) and exposes the columns two ways: numpy arrays for bulk work (inspect, statistics) and native
memoryviews for the hot path, where indexing returns a Python int in tens of nanoseconds and
no per-file Python object is ever built at load time.

Entry order: breadth-first, children of a directory contiguous and sorted by name bytes, so
a lookup is a binary search over the parent's child range. Decompresses only the index
itself (version 6: one zstd frame, bounded by the manifest's `usize`).
"""

from __future__ import annotations

import mmap
import os
import queue
import stat
import sys
import threading
from collections.abc import Iterator
from typing import Any, Final

import numpy as np

from fanfs._memory import available_memory
from fanfs._sizes import format_size
from fanfs.compression import zstd_decode_exact
from fanfs.errors import DecompressionError, PackFormatError
from fanfs.format.layout import (
    CHUNK_COLUMNS,
    COLUMN_ALIGN,
    ENTRY_COLUMNS,
    FORMAT_VERSION,
    INDEX_NAME,
    PLAIN_FORMAT_VERSION,
    SOLID_COLUMNS,
    crc32,
    index_columns,
    open_pack_file,
)

ROOT_ID: Final = 0
# numpy dtype -> memoryview format for hot-path access (the host is little-endian, checked).
_NATIVE: Final[dict[str, Any]] = {"<u1": "B", "<u2": "H", "<u4": "I", "<u8": "Q", "<i8": "q"}
# Rows per step of a scan over all entries (small temporaries, reused).
_SCAN_ROWS: Final = 1 << 15
# The index is read in pieces of this size, each checksummed (`_Crc32Behind`) while the next
# is read.
READ_PIECE: Final = 8 << 20


def _read_private(
    pack_dir: str, meta: dict[str, Any], version: int
) -> tuple[mmap.mmap | bytes, int]:
    """The index's columns in anonymous memory of this process, and the crc32 of the file.

    Never a mapping of the file: whoever can write the pack could change or truncate it
    after it was validated (a cycle, or SIGBUS on the next access). Serving processes forked
    later share these pages. An index larger than half the available memory is refused
    rather than risking the node (the OOM killer). A compressed index (version 6) is read
    whole, its crc32 checked, then decompressed into exactly `usize` bytes (`_decompress`);
    `codec` and `usize` are read only from a version-6 manifest, the one that validates them."""
    fd = open_pack_file(pack_dir, INDEX_NAME)
    try:
        size = os.fstat(fd).st_size
        if size != meta["size"]:
            raise PackFormatError(
                "%s: index is %d bytes, manifest says %d (truncated pack?)"
                % (pack_dir, size, meta["size"])
            )
        compressed = version >= 6 and meta["codec"] == "zstd"
        usize = meta["usize"] if compressed else size
        available = available_memory()
        if available and usize + (size if compressed else 0) > available // 2:
            raise PackFormatError(
                "%s: index of %s does not fit in this node's memory (%s available)"
                % (pack_dir, format_size(usize), format_size(available))
            )
        if not size:
            return b"", 0
        buf = mmap.mmap(-1, size)
        view = memoryview(buf)
        crc = _Crc32Behind(view)
        try:
            done = 0
            while done < size:
                got = os.preadv(fd, [view[done : done + READ_PIECE]], done)
                if got <= 0:
                    raise PackFormatError(
                        "%s: index shrank while being read (truncated pack?)" % pack_dir
                    )
                done += got
                crc.advance(done)
        finally:
            checksum = crc.finish()
            view.release()
        if not compressed:
            return buf, checksum
        if checksum != meta["crc32"]:
            raise PackFormatError("%s: index checksum mismatch (corrupt pack)" % pack_dir)
        try:
            return _decompress(pack_dir, buf, usize), checksum
        finally:
            buf.close()
    except OSError as exc:
        raise PackFormatError("%s: cannot read index: %s" % (pack_dir, exc.strerror)) from exc
    finally:
        os.close(fd)


def _decompress(pack_dir: str, stored: mmap.mmap, usize: int) -> mmap.mmap | bytes:
    """The zstd frame `stored` decoded into anonymous memory of exactly `usize` bytes: never
    more is written (a frame that would give more, or less, is a corrupt index)."""
    out = mmap.mmap(-1, usize) if usize else b""
    view = memoryview(out) if usize else memoryview(bytearray())
    source = memoryview(stored)
    try:
        got = zstd_decode_exact(source, view, READ_PIECE)
    except DecompressionError as exc:
        raise PackFormatError(
            "%s: index does not decompress: %s (corrupt pack)" % (pack_dir, exc)
        ) from exc
    finally:
        view.release()
        source.release()
    if got > usize:
        raise PackFormatError(
            "%s: index decompresses to more than the %d bytes the manifest says (corrupt pack)"
            % (pack_dir, usize)
        )
    if got < usize:
        raise PackFormatError(
            "%s: index decompresses to %d bytes, manifest says %d (corrupt pack)"
            % (pack_dir, got, usize)
        )
    return out


class _Crc32Behind:
    """The crc32 of a buffer's first bytes, computed in a thread of its own as a reader fills
    the buffer (`advance`): crc32 and the reads both release the GIL, so on two cores the
    checksum of an index of hundreds of MB costs almost none of its own time. `finish`
    always joins the thread (the mount forks after the index is read: no thread may be
    left running)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._ends: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._crc = 0
        self._thread = threading.Thread(target=self._run, name="fanfs-index-crc32", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        start = 0
        while (end := self._ends.get()) is not None:
            self._crc = crc32(self._view[start:end], self._crc)
            start = end

    def advance(self, end: int) -> None:
        """The buffer's first `end` bytes are in place."""
        self._ends.put(end)

    def finish(self) -> int:
        """Wait for the thread; the crc32 of the bytes advanced over."""
        self._ends.put(None)
        self._thread.join()
        return self._crc


def encode_columns(
    columns: dict[str, np.ndarray],
) -> Iterator[tuple[dict[str, Any], memoryview, bytes]]:
    """Lay out `columns` (in schema order) as one index file: for each column in file order,
    its descriptor, its bytes and the padding after them. One column converted at a time, so
    the writer streams an index of millions of entries without a second copy of it. With the
    solid columns (`skip`, `bsize`) the layout is version 7's, else version 6's."""
    offset = 0
    version = FORMAT_VERSION if "skip" in columns else PLAIN_FORMAT_VERSION
    for name, dtype in index_columns(version):
        data = np.ascontiguousarray(columns[name], dtype=dtype).data.cast("B")
        pad = -len(data) % COLUMN_ALIGN
        yield (
            {"name": name, "dtype": dtype, "offset": offset, "length": len(data)},
            data,
            b"\0" * pad,
        )
        offset += len(data) + pad


class Index:
    """A loaded index. Sync, thread-safe for reads, O(1) or O(log n) per call.

    Attributes:
        entry_count: number of entries (entry ids are 0..entry_count-1; 0 is the root).
        chunk_count: number of stored chunks.
        arrays: numpy view of every column, by name.
    """

    def __init__(self, pack_dir: str, meta: dict[str, Any], version: int = FORMAT_VERSION) -> None:
        """Read the index file of `pack_dir` into private memory and check its columns'
        placement and lengths against `meta` (the manifest's validated `index` object).
        The tree structure is checked by `format.validate.check_index` (PackReader)."""
        if sys.byteorder != "little":
            raise PackFormatError("fanfs packs are little-endian; this host is not")
        self._map, crc = _read_private(pack_dir, meta, version)
        size = len(self._map)
        if crc != meta["crc32"]:
            raise PackFormatError("%s: index checksum mismatch (corrupt pack)" % pack_dir)
        self.entry_count: int = meta["entries"]
        self.chunk_count: int = meta["chunks"]
        rows = {name: self.entry_count for name, _ in ENTRY_COLUMNS}
        rows.update({name: self.chunk_count for name, _ in (*CHUNK_COLUMNS, *SOLID_COLUMNS)})
        self.arrays: dict[str, np.ndarray] = {}
        views: dict[str, memoryview] = {}
        whole = memoryview(self._map)
        for col in meta["columns"]:
            name, start, length, dtype = col["name"], col["offset"], col["length"], col["dtype"]
            itemsize = np.dtype(dtype).itemsize
            if start % COLUMN_ALIGN or start + length > size or length % itemsize:
                raise PackFormatError("%s: index column %s is invalid" % (pack_dir, name))
            if name in rows and length != rows[name] * itemsize:
                raise PackFormatError("%s: index column %s has the wrong length" % (pack_dir, name))
            raw = whole[start : start + length]
            self.arrays[name] = np.frombuffer(raw, dtype=dtype)
            views[name] = raw.cast(_NATIVE[dtype])
        if version < 2:
            # Version 1 has no dictionaries: every chunk refers to none.
            self.arrays["dict"] = np.zeros(self.chunk_count, dtype="<u2")
            self.arrays["dicts"] = np.zeros(0, dtype="<u1")
            views["dict"] = self.arrays["dict"].data.cast("B").cast("H")
        if version < 7:
            # No solid blocks before version 7: every chunk is one of its own.
            for name, _ in SOLID_COLUMNS:
                self.arrays[name] = np.zeros(self.chunk_count, dtype="<u4")
                views[name] = self.arrays[name].data.cast("B").cast("I")
        # Hot-path columns, bound once: attribute loads are cheaper than dict lookups.
        self.parent = views["parent"]
        self.name_off = views["name_off"]
        self.name_len = views["name_len"]
        self.mode = views["mode"]
        self.mtime_ns = views["mtime_ns"]
        self.size = views["size"]
        self.first = views["first"]
        self.count = views["count"]
        self.chunk_partition = views["partition"]
        self.chunk_offset = views["offset"]
        self.chunk_csize = views["csize"]
        self.chunk_codec = views["codec"]
        self.chunk_crc32 = views["crc32"]
        self.chunk_dict = views["dict"]
        self.chunk_skip = views["skip"]
        self.chunk_bsize = views["bsize"]
        self.names = views["names"]

    def close(self) -> None:
        """Drop the column arrays (PackReader.close); the private copy of the index is freed
        with the last view of it that a caller still holds."""
        self.arrays.clear()

    def name(self, entry: int) -> bytes:
        off = self.name_off[entry]
        return bytes(self.names[off : off + self.name_len[entry]])

    def is_dir(self, entry: int) -> bool:
        return stat.S_ISDIR(self.mode[entry])

    def lookup(self, parent: int, name: bytes) -> int | None:
        """Entry id of `name` in directory `parent`, or None. `parent` must be a directory."""
        lo = self.first[parent]
        hi = lo + self.count[parent]
        names, name_off, name_len = self.names, self.name_off, self.name_len
        while lo < hi:
            mid = (lo + hi) >> 1
            off = name_off[mid]
            candidate = names[off : off + name_len[mid]].tobytes()
            if candidate == name:
                return mid
            if candidate < name:
                lo = mid + 1
            else:
                hi = mid
        return None

    def block_key(self, cid: int) -> tuple[int, int, int, int, int, int]:
        """Everything the decode of chunk `cid`'s stored bytes depends on (partition, offset,
        stored size, codec, dictionary, solid block size): rows with equal keys decode to the
        same bytes, so a decoded solid block (format 7) is shared under it."""
        return (
            self.chunk_partition[cid],
            self.chunk_offset[cid],
            self.chunk_csize[cid],
            self.chunk_codec[cid],
            self.chunk_dict[cid],
            self.chunk_bsize[cid],
        )

    def symlink_target(self, entry: int) -> bytes:
        off = self.first[entry]
        return bytes(self.names[off : off + self.size[entry]])

    def path(self, entry: int) -> bytes:
        """The entry's path relative to the pack root (for messages; O(depth))."""
        parts: list[bytes] = []
        while entry != ROOT_ID:
            parts.append(self.name(entry))
            entry = self.parent[entry]
        return b"/".join(reversed(parts))

    def subdir_counts(self) -> np.ndarray:
        """Number of child directories of every entry (for st_nlink), vectorised: int64.

        In blocks, and into zeroed memory that is only touched where a directory's parent
        is: no temporary as long as the index (fresh memory is slow to touch on a VM)."""
        mode, parent = self.arrays["mode"], self.arrays["parent"]
        parents = [np.zeros(0, dtype=parent.dtype)]
        for lo in range(0, self.entry_count, _SCAN_ROWS):
            dirs = np.flatnonzero((mode[lo : lo + _SCAN_ROWS] & 0o170000) == stat.S_IFDIR)
            if lo == ROOT_ID:
                dirs = dirs[dirs != ROOT_ID]  # the root is its own parent; do not count it
            parents.append(parent[dirs + lo])
        counts = np.zeros(self.entry_count, dtype=np.int64)
        found = np.bincount(np.concatenate(parents))
        counts[: len(found)] = found
        return counts
