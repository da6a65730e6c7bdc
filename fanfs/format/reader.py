"""`PackReader`: open and validate a pack, and hand out stored chunk bytes.

A pack is untrusted input (docs/security.md). At open, before anything is mounted: the
manifest against its schema, the index's size, checksum and structure (format/validate.py),
every dictionary's bounds and checksum (they are copied out of the index whole), and every
local partition: a regular file (never a symlink, FIFO or device) named `part-NNNNN` with
the size the manifest gives. Partition checksums are only checked by `verify_partition`
(fanfs verify, staging), since that reads every byte.

No file of the pack is ever mapped: someone who can write the pack could truncate a mapped
file under the mount (SIGBUS) or change it after it was checked. The index is read into
private memory; partitions are read with `pread`, or copied whole into shared anonymous
memory reserved before the serving processes fork (`reserve_memory`, `load_partition`),
from where chunks are served as memoryviews with no copy.

Never decompresses. Thread-safe: every method only reads immutable state, except
`reserve_memory` (before forking) and `load_partition` (one thread, into memory no reader
uses until the store marks the partition resident).
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Callable, Collection
from typing import Any, Final

from fanfs._memory import populate
from fanfs.errors import DecompressionError, PackFormatError
from fanfs.format.index import Index
from fanfs.format.layout import (
    chunk_length,
    crc32,
    file_chunk_size,
    open_pack_file,
    partition_name,
    raise_open_file_limit,
)
from fanfs.format.validate import check_index, read_manifest

# Reads of whole partitions (verify, preload) go in slices this large.
SCAN_BYTES: Final = 4 * 1024 * 1024


class PackReader:
    """A validated, open pack.

    Attributes:
        path: the pack directory.
        manifest: the decoded manifest.
        index: the loaded `Index`.
        chunk_size: uncompressed size of every chunk but the last of a file in chunks.
        block_size: the same for a file in blocks (format 5; 0: no file is).
        format_version: the pack's format version (1 to 5).
        partitions: the manifest's partition records (position = partition number).
        local: per partition, whether this node opened it.
    """

    def __init__(self, path: str, *, local: Collection[int] | None = None) -> None:
        """Open the pack at `path`. With `local`, only those partitions are opened (the
        others live on other nodes, cluster mode) and only they must be present."""
        self.path = path
        self.manifest: dict[str, Any] = read_manifest(path)
        self.format_version: int = self.manifest["format_version"]
        self.chunk_size: int = self.manifest["chunk_size"]
        self.block_size: int = self.manifest.get("block_size", 0)
        self.partitions: list[dict[str, Any]] = self.manifest["partitions"]
        self.index = Index(path, self.manifest["index"], self.format_version)
        # Position = dictionary id; id 0 means "no dictionary".
        self._dicts: list[bytes | None] = [None]
        for number, meta in enumerate(self.manifest.get("dictionaries", ()), 1):
            self._dicts.append(self._load_dictionary(number, meta))
        check_index(
            path,
            self.index.arrays,
            chunk_size=self.chunk_size,
            block_size=self.block_size,
            partition_sizes=[part["size"] for part in self.partitions],
            dictionaries=len(self._dicts) - 1,
            version=self.format_version,
        )
        # Chunk checksums of format 4 cover the chunk id too (docs/format.md section 8).
        self.crc_binds_chunk = self.format_version >= 4
        self._fds: list[int] = []
        # Per partition: a view of its copy in shared memory, or None (read with pread).
        self._memory: list[memoryview | None] = [None] * len(self.partitions)
        self._memory_at = [0] * len(self.partitions)  # (offsets in `_region`)
        self._region: mmap.mmap | None = None
        # Reads that never wait for the disk (RWF_NOWAIT, Linux 4.14): off where the pack's
        # filesystem refuses them (tests turn them off to model a cold disk).
        self.nowait_reads = hasattr(os, "RWF_NOWAIT")
        raise_open_file_limit(len(self.partitions) + 64)
        self.local = [local is None or n in local for n in range(len(self.partitions))]
        try:
            for number, part in enumerate(self.partitions):
                self._fds.append(
                    self._open_partition(number, part["size"]) if self.local[number] else -1
                )
        except BaseException:
            self.close()
            raise

    def _load_dictionary(self, number: int, meta: dict[str, Any]) -> bytes:
        blob = self.index.arrays["dicts"]
        start, size = meta["offset"], meta["size"]
        data = blob[start : start + size].tobytes()
        if len(data) != size or crc32(data) != meta["crc32"]:
            raise PackFormatError(
                "%s: dictionary %d does not match the index" % (self.path, number)
            )
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

    def _open_partition(self, number: int, size: int) -> int:
        name = partition_name(number)
        fd = open_pack_file(self.path, name, "partition " + name)
        actual = os.fstat(fd).st_size
        if actual != size:
            os.close(fd)
            raise PackFormatError(
                "%s: partition %s is %d bytes, manifest says %d (truncated pack?)"
                % (self.path, name, actual, size)
            )
        return fd

    def close(self) -> None:
        for fd in self._fds:
            if fd >= 0:
                os.close(fd)
        self._fds.clear()
        self.index.close()

    def reserve_memory(self, numbers: Collection[int]) -> int:
        """Reserve shared anonymous memory for copies of the local partitions `numbers`
        (call before forking: every serving process then sees the copies). Returns the
        bytes reserved; raises OSError if the kernel refuses the mapping."""
        sizes = {n: self.partitions[n]["size"] for n in sorted(numbers) if self.local[n]}
        total = sum(sizes.values())
        if not total:
            return 0
        self._region = mmap.mmap(-1, total, flags=mmap.MAP_SHARED)
        whole = memoryview(self._region)
        start = 0
        for number, size in sizes.items():
            self._memory[number] = whole[start : start + size]
            self._memory_at[number] = start
            start += size
        return total

    def map_copy(self, number: int) -> bool:
        """Map the copy of partition `number` (reserved, and loaded by now, possibly by another
        process) into this process's page tables (`populate`), so that serving its chunks
        does not fault its pages in one by one. False if the kernel did not."""
        view = self._memory[number]
        assert view is not None and self._region is not None
        return populate(self._region, self._memory_at[number], len(view))

    def reserved(self, number: int) -> bool:
        return self._memory[number] is not None

    def load_partition(self, number: int, stop: Callable[[], bool]) -> bool:
        """Copy partition `number` into its reserved memory. Blocking: one thread. Returns
        False if `stop()` became true first. Raises OSError (EIO) if the file shrank."""
        view = self._memory[number]
        assert view is not None
        fd = self._fds[number]
        done = 0
        while done < len(view):
            if stop():
                return False
            got = os.preadv(fd, [view[done : done + SCAN_BYTES]], done)
            if got <= 0:
                raise OSError(errno.EIO, "%s shrank while being loaded" % partition_name(number))
            # The copy is what is served: the file's pages need not stay cached too.
            os.posix_fadvise(fd, done, got, os.POSIX_FADV_DONTNEED)
            done += got
        return True

    def read_range(self, number: int, offset: int, length: int) -> bytes:
        """Bytes of a local partition (serving peers in cluster mode). Blocking."""
        if (
            not self.local[number]
            or offset < 0
            or length < 0
            or offset + length > self.partitions[number]["size"]
        ):
            raise KeyError(
                "partition %d has no bytes %d..%d here" % (number, offset, offset + length)
            )
        view = self._memory[number]
        if view is not None:
            return bytes(view[offset : offset + length])
        data = os.pread(self._fds[number], length, offset)
        if len(data) != length:
            raise OSError(errno.EIO, "short read of %d bytes (expected %d)" % (len(data), length))
        return data

    def stored_view(self, chunk: int) -> memoryview:
        """The stored bytes of `chunk` as a view of its partition's copy in memory. Only
        for partitions the store marked resident (their copy is complete)."""
        index = self.index
        view = self._memory[index.chunk_partition[chunk]]
        assert view is not None
        off = index.chunk_offset[chunk]
        return view[off : off + index.chunk_csize[chunk]]

    def read_stored(self, chunk: int) -> bytes:
        """The stored bytes of `chunk` by `pread`. Blocking; call from a worker thread."""
        index = self.index
        length = index.chunk_csize[chunk]
        data = os.pread(self._fds[index.chunk_partition[chunk]], length, index.chunk_offset[chunk])
        if len(data) != length:
            raise OSError(errno.EIO, "short read of %d bytes (expected %d)" % (len(data), length))
        return data

    def unit(self, entry: int) -> int:
        """The uncompressed size of every chunk but the last of file `entry`: the pack's
        chunk size, or its block size for a file stored in blocks. O(1)."""
        index = self.index
        return file_chunk_size(
            index.size[entry], index.count[entry], self.chunk_size, self.block_size
        )

    def read_stored_if_cached(self, chunk: int) -> memoryview | None:
        """The stored bytes of `chunk` if the kernel's page cache holds all of them, read
        without waiting for the disk (RWF_NOWAIT); None if it does not, or if the pack's
        filesystem cannot tell (the caller then reads in a worker thread, which also reports
        any error). Safe on the trio thread."""
        if not self.nowait_reads:
            return None
        index = self.index
        buf = bytearray(index.chunk_csize[chunk])
        try:
            got = os.preadv(
                self._fds[index.chunk_partition[chunk]],
                [buf],
                index.chunk_offset[chunk],
                os.RWF_NOWAIT,
            )
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                self.nowait_reads = False  # not on this filesystem: never ask again
            return None
        return memoryview(buf) if got == len(buf) else None

    def chunk_usize(self, entry: int, chunk_no: int) -> int:
        """Uncompressed size of the `chunk_no`-th chunk of file `entry`."""
        return chunk_length(int(self.index.size[entry]), self.unit(entry), chunk_no)

    def verify_partition(self, number: int) -> bool:
        """Whether partition `number` matches its manifest crc32. Blocking: reads it all."""
        crc = 0
        fd = self._fds[number]
        offset = 0
        while True:
            data = os.pread(fd, SCAN_BYTES, offset)
            if not data:
                break
            crc = crc32(data, crc)
            offset += len(data)
        return crc == self.partitions[number]["crc32"]
