"""`PackWriter`: appends stored chunks to partitions, then writes the index and manifest.

Placement: every chunk goes to the least-filled partition of its set (regular or broadcast)
in the order chunks are added, ties to the lowest number. That balances partitions by stored
bytes to within one chunk, is a pure function of the chunk sizes (so packs are byte-for-byte
deterministic), and spreads each directory over all partitions so any node count gets an even
share. The writer only writes into a directory it is given; pack.py owns the temp-dir rename.

Small chunks are gathered per partition and written in pieces of up to `_buffer_limit`
bytes (64 MiB over all partitions at most): one write per ImageNet-sized file cost the
packer's consumer thread more than everything else it does.

Shared chunks: a chunk added with a `key` (a 64-bit hash of its stored bytes, codec,
dictionary and broadcast set, made by the caller) whose stored bytes equal an earlier keyed
chunk's is not written again: `add_chunk` returns the earlier chunk's place, and the caller's
index row points there (identical files, or identical blocks of one file, are stored once,
as mksquashfs does by default). Equality is checked on the bytes, read back, not trusted to
the hash. The table costs 16 bytes per slot, at most 0.6 full (`_SharedChunks`).

The index (format version 6) is written as its columns are, then, if `index_codec` asks for
it, compressed into one zstd frame, which replaces it when it saves at least INDEX_SAVING of
the pack (`auto`): a pack of small files spends a few percent of its bytes on the index, an
ImageNet-like one a few hundredths of one, and a compressed index costs a decompression at
every mount.
"""

from __future__ import annotations

import heapq
import os
from array import array
from typing import Any, Final

import numpy as np

from fanfs.compression import zstd_compress_file
from fanfs.format.index import encode_columns
from fanfs.format.layout import (
    FORMAT_VERSION,
    INDEX_NAME,
    MANIFEST_NAME,
    PLAIN_FORMAT_VERSION,
    crc32,
    encode_manifest,
    partition_name,
    raise_open_file_limit,
)

# `auto`: the index is stored compressed when that saves at least this share of the pack.
INDEX_SAVING: Final = 0.005
# zstd level of a compressed index (8.4 MB of index: 1.97 MB at 60 MB/s; level 19 gives
# 1.85 MB at 2.4 MB/s).
INDEX_LEVEL: Final = 6
# Write buffers: at most this much over all partitions, and per partition between these.
_BUFFER_TOTAL: Final = 64 * 1024 * 1024
_BUFFER_MIN: Final = 64 * 1024
_BUFFER_MAX: Final = 1024 * 1024


class _Partition:
    __slots__ = ("broadcast", "buffer", "chunks", "crc32", "fd", "size")

    def __init__(self, path: str, broadcast: bool) -> None:
        # Read and write: a shared chunk's earlier copy is read back to compare its bytes.
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.size = 0
        self.crc32 = 0
        self.chunks = 0
        self.broadcast = broadcast
        self.buffer = bytearray()

    def flush(self) -> None:
        _write_all(self.fd, self.buffer)
        self.buffer.clear()


class _SharedChunks:
    """Keyed chunks already written: open addressing with linear probing over two arrays of
    unsigned 64-bit words, key (0 = empty) and place (partition << 48 | offset). 16 bytes a
    slot, grown to twice the slots at 0.6 full: 27 bytes per chunk or less."""

    _OFFSET_BITS: Final = 48

    def __init__(self) -> None:
        self._keys = array("Q", bytes(8 * 4096))
        self._places = array("Q", bytes(8 * 4096))
        self._count = 0

    def find(self, key: int) -> tuple[int, int] | None:
        """(partition, offset) of the chunk added with `key`, if any."""
        keys, mask = self._keys, len(self._keys) - 1
        slot = key & mask
        while keys[slot]:
            if keys[slot] == key:
                place = self._places[slot]
                return place >> self._OFFSET_BITS, place & ((1 << self._OFFSET_BITS) - 1)
            slot = (slot + 1) & mask
        return None

    def add(self, key: int, partition: int, offset: int) -> None:
        if offset >> self._OFFSET_BITS or partition >> (64 - self._OFFSET_BITS):
            return  # beyond what a place holds (256 TiB partitions): not shared, still right
        if (self._count + 1) * 5 > len(self._keys) * 3:
            self._grow()
        self._put(key, partition << self._OFFSET_BITS | offset)
        self._count += 1

    def _put(self, key: int, place: int) -> None:
        keys, mask = self._keys, len(self._keys) - 1
        slot = key & mask
        while keys[slot]:
            slot = (slot + 1) & mask
        keys[slot] = key
        self._places[slot] = place

    def _grow(self) -> None:
        old = zip(self._keys, self._places, strict=True)
        size = 2 * len(self._keys)
        self._keys, self._places = array("Q", bytes(8 * size)), array("Q", bytes(8 * size))
        for key, place in old:
            if key:
                self._put(key, place)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class PackWriter:
    """Writes one pack into an empty directory `out_dir`. Not thread-safe: one caller."""

    def __init__(
        self, out_dir: str, partitions: int, broadcast_partitions: int, index_codec: str = "auto"
    ) -> None:
        raise_open_file_limit(partitions + broadcast_partitions + 64)
        self._dir = out_dir
        self._index_codec = index_codec  # "auto", "zstd" or "none"
        self._parts: list[_Partition] = []
        self._heaps: dict[bool, list[tuple[int, int]]] = {False: [], True: []}
        self._dicts: list[dict[str, Any]] = []
        self._dict_blob = bytearray()
        count = partitions + broadcast_partitions
        self._dirty: set[int] = set()  # partitions with buffered bytes
        self._shared = _SharedChunks()
        self._buffer_limit = min(_BUFFER_MAX, max(_BUFFER_MIN, _BUFFER_TOTAL // max(count, 1)))
        for number in range(partitions + broadcast_partitions):
            broadcast = number >= partitions
            self._parts.append(_Partition(os.path.join(out_dir, partition_name(number)), broadcast))
            self._heaps[broadcast].append((0, number))

    def add_dictionary(self, data: bytes, class_name: str) -> int:
        """Add one zstd dictionary (stored in the index); returns its id (1, 2, ...)."""
        dict_id = len(self._dicts) + 1
        self._dicts.append(
            {
                "id": dict_id,
                "offset": len(self._dict_blob),
                "size": len(data),
                "crc32": crc32(data),
                "class": class_name,
            }
        )
        self._dict_blob += data
        return dict_id

    def add_chunk(
        self, stored: bytes, broadcast: bool, key: int | None = None
    ) -> tuple[int, int, bool]:
        """Append one stored chunk; returns (partition, offset, shared). With a nonzero
        `key` (see the module's docstring), a chunk whose bytes an earlier chunk with that key
        already holds is not written: its place is returned, and shared is True."""
        if key:
            place = self._shared.find(key)
            if place is not None and self._stored_at(*place, len(stored)) == stored:
                return place[0], place[1], True
        number, offset = self._append(stored, broadcast)
        if key and place is None:
            self._shared.add(key, number, offset)
        return number, offset, False

    def _stored_at(self, number: int, offset: int, length: int) -> bytes:
        part = self._parts[number]
        on_disk = part.size - len(part.buffer)
        if offset >= on_disk:
            return bytes(part.buffer[offset - on_disk : offset - on_disk + length])
        if offset + length > on_disk:
            part.flush()
        return os.pread(part.fd, length, offset)

    def _append(self, stored: bytes, broadcast: bool) -> tuple[int, int]:
        heap = self._heaps[broadcast]
        if not heap:
            raise AssertionError("no %s partitions" % ("broadcast" if broadcast else "regular"))
        _, number = heap[0]
        part = self._parts[number]
        offset = part.size
        if len(part.buffer) + len(stored) > self._buffer_limit:
            part.flush()
        if len(stored) >= self._buffer_limit:
            _write_all(part.fd, stored)
        else:
            part.buffer += stored
            self._dirty.add(number)
        part.size += len(stored)
        part.crc32 = crc32(stored, part.crc32)
        part.chunks += 1
        heapq.heapreplace(heap, (part.size, number))
        return number, offset

    def flush(self) -> None:
        """Write out every buffered chunk (the packer calls this while it waits anyway)."""
        for number in self._dirty:
            self._parts[number].flush()
        self._dirty.clear()

    def finish(self, columns: dict[str, np.ndarray], manifest: dict[str, Any]) -> dict[str, Any]:
        """Write index and manifest, fsync everything; returns the completed manifest.

        `manifest` supplies the caller's fields (options, totals); the writer adds format,
        partitions and index descriptors.
        """
        for part in self._parts:
            part.flush()
            os.fsync(part.fd)
            os.close(part.fd)
            part.fd = -1
        columns = {**columns, "dicts": np.frombuffer(bytes(self._dict_blob), dtype=np.uint8)}
        usize, crc, descriptors = self._write_index(columns)
        size, codec = usize, "none"
        if self._index_codec != "none" and usize:
            stored = sum(part.size for part in self._parts) + usize
            zsize, zcrc = self._compress_index(usize)
            if self._index_codec == "zstd" or usize - zsize >= INDEX_SAVING * stored:
                os.replace(self._index_path(".zst"), self._index_path())
                size, crc, codec = zsize, zcrc, "zstd"
            else:
                os.unlink(self._index_path(".zst"))
        manifest = dict(manifest)
        # A pack without solid blocks is written as version 6 (readers of version 6 read it).
        manifest["format_version"] = FORMAT_VERSION if "skip" in columns else PLAIN_FORMAT_VERSION
        manifest["index"] = {
            "file": INDEX_NAME,
            "size": size,
            "crc32": crc,
            "codec": codec,
            "usize": usize,
            "entries": len(columns["parent"]),
            "chunks": len(columns["partition"]),
            "columns": descriptors,
        }
        manifest["partitions"] = [
            {
                "file": partition_name(number),
                "size": part.size,
                "crc32": part.crc32,
                "chunks": part.chunks,
                "broadcast": part.broadcast,
            }
            for number, part in enumerate(self._parts)
        ]
        manifest["dictionaries"] = self._dicts
        # The manifest goes last: a directory without one is never taken for a pack.
        self._write_file(MANIFEST_NAME, encode_manifest(manifest))
        dir_fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return manifest

    def abort(self) -> None:
        """Close partition files after a failure (the caller removes the directory)."""
        for part in self._parts:
            if part.fd >= 0:
                os.close(part.fd)
                part.fd = -1

    def _index_path(self, suffix: str = "") -> str:
        return os.path.join(self._dir, INDEX_NAME + suffix)

    def _compress_index(self, usize: int) -> tuple[int, int]:
        """The index file as one zstd frame (its size in the header) in `index.zst`; returns
        that file's size and crc32. Reads the index back in pieces: never all in memory."""
        out = os.open(self._index_path(".zst"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with open(self._index_path(), "rb") as src, open(out, "wb", closefd=False) as dst:
                zstd_compress_file(src, dst, usize, INDEX_LEVEL, _BUFFER_MAX)
            os.fsync(out)
            size = crc = 0
            while piece := os.pread(out, _BUFFER_MAX, size):
                crc = crc32(piece, crc)
                size += len(piece)
        finally:
            os.close(out)
        return size, crc

    def _write_index(self, columns: dict[str, np.ndarray]) -> tuple[int, int, list[dict[str, Any]]]:
        """Stream the index file column by column; returns its size, crc32, descriptors."""
        fd = os.open(
            os.path.join(self._dir, INDEX_NAME), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644
        )
        size = crc = 0
        descriptors = []
        try:
            for descriptor, data, pad in encode_columns(columns):
                descriptors.append(descriptor)
                for piece in (data, pad):
                    _write_all(fd, piece)
                    crc = crc32(piece, crc)
                    size += len(piece)
            os.fsync(fd)
        finally:
            os.close(fd)
        return size, crc, descriptors

    def _write_file(self, name: str, data: bytes) -> None:
        fd = os.open(os.path.join(self._dir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
