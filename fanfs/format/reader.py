"""`PackReader`: open and validate a pack, and hand out stored chunk bytes.

Validation at open (manifest magic, version and checksum; index size and checksum; every
partition present with the size the manifest gives; every dictionary's bounds and checksum,
since dictionaries are small and copied out of the index whole) is cheap and catches wrong, truncated or
half-copied packs before anything is mounted. Partition checksums are only checked by
`verify_partition` (fanfs verify, staging), since that reads every byte.

Never decompresses. Thread-safe: every method only reads immutable state.
"""

from __future__ import annotations

import errno
import mmap
import os
import zlib
from collections.abc import Collection
from typing import Any, Final

from fanfs.errors import DecompressionError, PackFormatError
from fanfs.format.index import Index
from fanfs.format.layout import raise_open_file_limit, read_manifest

# Reads of whole partitions (verify, preload) go in slices this large.
SCAN_BYTES: Final = 4 * 1024 * 1024


class PackReader:
    """A validated, open pack.

    Attributes:
        path: the pack directory.
        manifest: the decoded manifest.
        index: the loaded `Index`.
        chunk_size: uncompressed size of every chunk but the last of each file.
        format_version: the pack's format version (1, 2 or 3).
    """

    def __init__(self, path: str, *, local: Collection[int] | None = None) -> None:
        """Open the pack at `path`. With `local`, only those partitions are opened (the
        others live on other nodes, cluster mode) and only they must be present."""
        self.path = path
        self.manifest: dict[str, Any] = read_manifest(path)
        self.format_version: int = self.manifest["format_version"]
        try:
            self.chunk_size: int = int(self.manifest["chunk_size"])
            self.partitions: list[dict[str, Any]] = self.manifest["partitions"]
            self.index = Index(path, self.manifest["index"], self.format_version)
            # Position = dictionary id; id 0 means "no dictionary".
            self._dicts: list[bytes | None] = [None]
            if self.format_version >= 2:
                for number, meta in enumerate(self.manifest["dictionaries"], 1):
                    self._dicts.append(self._load_dictionary(number, meta))
        except (KeyError, TypeError, ValueError) as exc:
            raise PackFormatError("%s: manifest lacks a valid %s" % (path, exc)) from exc
        self._fds: list[int] = []
        self._maps: list[mmap.mmap | None] = []
        # Each partition holds two descriptors: ours for pread and the mapping's own.
        raise_open_file_limit(2 * len(self.partitions) + 64)
        self.local = [local is None or n in local for n in range(len(self.partitions))]
        try:
            for number, part in enumerate(self.partitions):
                if self.local[number]:
                    self._open_partition(part)
                else:
                    self._fds.append(-1)
                    self._maps.append(None)
        except (KeyError, TypeError) as exc:
            self.close()
            raise PackFormatError("%s: manifest has an invalid partition entry (%s)" % (path, exc)) from exc
        except BaseException:
            self.close()
            raise

    def _load_dictionary(self, number: int, meta: dict[str, Any]) -> bytes:
        blob = self.index.arrays["dicts"]
        start, size = int(meta["offset"]), int(meta["size"])
        data = blob[start : start + size].tobytes()
        if meta["id"] != number or start < 0 or len(data) != size or zlib.crc32(data) != meta["crc32"]:
            raise PackFormatError("%s: dictionary %d does not match the index" % (self.path, number))
        return data

    def dictionary(self, dict_id: int) -> bytes | None:
        """The bytes of dictionary `dict_id` (None for 0). O(1), any thread.

        Raises:
            DecompressionError: no such dictionary (a corrupt chunk table).
        """
        if 0 <= dict_id < len(self._dicts):
            return self._dicts[dict_id]
        raise DecompressionError("unknown dictionary id %d" % dict_id)

    @property
    def dictionary_count(self) -> int:
        return len(self._dicts) - 1

    def _open_partition(self, part: dict[str, Any]) -> None:
        file_path = os.path.join(self.path, part["file"])
        try:
            fd = os.open(file_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise PackFormatError("%s: cannot open partition %s: %s" % (self.path, part["file"], exc.strerror)) from exc
        self._fds.append(fd)
        size = os.fstat(fd).st_size
        if size != part["size"]:
            raise PackFormatError(
                "%s: partition %s is %d bytes, manifest says %d (truncated pack?)"
                % (self.path, part["file"], size, part["size"])
            )
        self._maps.append(mmap.mmap(fd, 0, prot=mmap.PROT_READ) if size else None)

    def close(self) -> None:
        for fd in self._fds:
            if fd >= 0:
                os.close(fd)
        self._fds.clear()

    def partition_map(self, number: int) -> mmap.mmap | None:
        """The read-only mapping of a partition (None if it is empty or not local)."""
        return self._maps[number]

    def read_range(self, number: int, offset: int, length: int) -> bytes:
        """Bytes of a local partition (serving peers in cluster mode). Blocking."""
        part_map = self._maps[number]
        if part_map is None or offset + length > len(part_map):
            raise KeyError("partition %d has no bytes %d..%d here" % (number, offset, offset + length))
        return part_map[offset : offset + length]

    def stored_view(self, chunk: int) -> memoryview:
        """The stored bytes of `chunk` as a view into the mapped partition.

        Touching the view may fault pages in from disk: callers on the trio thread use it
        only for partitions known to be resident (see store.py).
        """
        index = self.index
        part_map = self._maps[index.chunk_partition[chunk]]
        off = index.chunk_offset[chunk]
        if part_map is None:
            return memoryview(b"")
        return memoryview(part_map)[off : off + index.chunk_csize[chunk]]

    def read_stored(self, chunk: int) -> bytes:
        """The stored bytes of `chunk` by `pread`. Blocking; call from a worker thread."""
        index = self.index
        length = index.chunk_csize[chunk]
        data = os.pread(self._fds[index.chunk_partition[chunk]], length, index.chunk_offset[chunk])
        if len(data) != length:
            raise OSError(errno.EIO, "short read of %d bytes (expected %d)" % (len(data), length))
        return data

    def chunk_usize(self, entry: int, chunk_no: int) -> int:
        """Uncompressed size of the `chunk_no`-th chunk of file `entry`."""
        return min(self.chunk_size, self.index.size[entry] - chunk_no * self.chunk_size)

    def verify_partition(self, number: int) -> bool:
        """Whether partition `number` matches its manifest crc32. Blocking: reads it all."""
        crc = 0
        fd = self._fds[number]
        offset = 0
        while True:
            data = os.pread(fd, SCAN_BYTES, offset)
            if not data:
                break
            crc = zlib.crc32(data, crc)
            offset += len(data)
        return crc == self.partitions[number]["crc32"]
