"""`ChunkStore`: decoded bytes of a file's chunks, for the FUSE read path.

Owns the decision of where a chunk is decoded: inline on the trio thread when its partition is
resident in memory and the chunk is small (a thread hand-off costs more than the decode,
DESIGN.md section 4), otherwise in a worker thread under a `CapacityLimiter` (cold disk,
large chunks). Verifies every stored chunk's crc32 before decoding; a chunk that fails once
is remembered as broken and fails again at once without new I/O. Keeps a small byte-budgeted
LRU of decoded chunks for reads that cover only part of a chunk (the kernel asks for a large
file 128 KiB to 1 MiB at a time).

Never raises FUSEError and never logs failures: it raises `CorruptDataError` with the file
named, and operations.py translates and logs once. Sync methods are O(1); `chunk()` is async
and a checkpoint only when it has to go to a thread.
"""

from __future__ import annotations

import collections
import logging
import mmap
import threading
import zlib
from typing import Final, Protocol

import trio

from fanfs import shared as sh
from fanfs.compression import decompress
from fanfs.errors import ChecksumError, CorruptDataError, FanfsError, KnownCorruptError
from fanfs.format.reader import PackReader
from fanfs.shared import SharedState

log = logging.getLogger(__name__)

# Largest chunk decoded on the trio thread. 256 KiB of zstd decodes in about 250 us here,
# about what a thread hand-off costs; larger chunks go to a worker thread.
INLINE_MAX_BYTES: Final = 256 * 1024
# Pages per madvise/touch step while preloading partitions.
PRELOAD_STEP_BYTES: Final = 64 * 1024 * 1024
MADV_POPULATE_READ: Final = 22  # Linux >= 5.14; Python 3.11's mmap module lacks the name


class ChunkSource(Protocol):
    """Where stored bytes of partitions this node does not hold come from (cluster mode)."""

    async def fetch(self, partition: int, offset: int, length: int) -> bytes:
        """Stored bytes; raises a FanfsError (EIO) if no copy can be reached."""
        ...


class _Flight:
    """One chunk being decoded in a worker thread, and its outcome."""

    __slots__ = ("data", "done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.data: bytes | memoryview | None = None
        self.error: FanfsError | None = None


class ChunkStore:
    """Decoded chunks of a `PackReader`'s files, for one serving process of a mount.

    Trio thread only, except `preload()`, which runs in its own thread. Counters, resident
    flags and the corrupt-chunk bitmap live in `shared` (all serving processes see them).
    """

    def __init__(
        self,
        reader: PackReader,
        shared: SharedState,
        *,
        cache_bytes: int,
        thread_limit: int,
        remote: ChunkSource | None = None,
    ) -> None:
        self.reader = reader
        self.remote = remote
        self.limiter = trio.CapacityLimiter(thread_limit)
        self.index = reader.index
        self.chunk_size = reader.chunk_size
        self.shared = shared
        self._limiter = self.limiter
        self._local = reader.local
        self._resident = shared.resident
        for number, part in enumerate(reader.partitions):
            if part["size"] == 0:
                self._resident[number] = 1
        self._broken: dict[int, CorruptDataError] = {}
        self._cache: collections.OrderedDict[int, bytes | memoryview] = collections.OrderedDict()
        self._cache_budget = cache_bytes
        self._cache_bytes = 0
        self._inflight: dict[int, _Flight] = {}

    def statistics(self) -> dict[str, int]:
        """This process's cache state and the mount-wide partition residency."""
        return {
            "cache_bytes": self._cache_bytes,
            "cache_entries": len(self._cache),
            "resident_partitions": sum(self._resident),
            "partitions": len(self._resident),
        }

    async def chunk(self, entry: int, chunk_no: int, *, whole: bool) -> bytes | memoryview:
        """Decoded bytes of chunk `chunk_no` of file `entry`.

        Args:
            whole: the caller needs the whole chunk now, so caching it would not help.

        Raises:
            CorruptDataError: checksum mismatch, undecodable data or an I/O error (also on
                every later call for the same chunk, without new I/O).
        """
        cid = self.index.first[entry] + chunk_no
        counters = self.shared.counters
        counters[sh.CHUNK_READS] += 1
        data = self._cache.get(cid)
        if data is not None:
            self._cache.move_to_end(cid)
            counters[sh.CACHE_HITS] += 1
            return data
        self._check_broken(entry, cid)
        usize = min(self.chunk_size, self.index.size[entry] - chunk_no * self.chunk_size)
        if self._resident[self.index.chunk_partition[cid]] and usize <= INLINE_MAX_BYTES:
            counters[sh.INLINE_DECODES] += 1
            try:
                data = self._decode(cid, self.reader.stored_view(cid), usize)
            except CorruptDataError as exc:
                raise self._broken_error(entry, cid, exc) from exc
            counters[sh.BYTES_DECODED] += usize
        else:
            data = await self._single_flight(entry, cid, usize)
        # Raw chunks of resident partitions are views of the mapping: nothing to cache.
        if not whole and not isinstance(data, memoryview):
            self._insert(cid, data)
        return data

    async def _single_flight(self, entry: int, cid: int, usize: int) -> bytes | memoryview:
        # Concurrent readers of one chunk (N loader workers, kernel read-ahead) wait for the
        # first one's fetch and decode instead of repeating it.
        flight = self._inflight.get(cid)
        if flight is not None:
            await flight.done.wait()
        else:
            flight = self._inflight[cid] = _Flight()
            try:
                flight.data = await self._load(cid, usize)
                self.shared.counters[sh.BYTES_DECODED] += usize
            except CorruptDataError as exc:
                flight.error = self._broken_error(entry, cid, exc)
            except FanfsError as exc:  # transient (remote): not remembered
                flight.error = type(exc)("%s: %s" % (self._where(entry, cid), exc))
            finally:
                del self._inflight[cid]
                flight.done.set()
        if flight.error is not None:
            raise flight.error
        if flight.data is None:  # the first reader was cancelled (interrupted): try again
            return await self._single_flight(entry, cid, usize)
        return flight.data

    async def _load(self, cid: int, usize: int) -> bytes | memoryview:
        index = self.index
        partition = index.chunk_partition[cid]
        if self._local[partition]:
            self.shared.counters[sh.THREAD_DECODES] += 1
            return await trio.to_thread.run_sync(self._load_and_decode, cid, usize, limiter=self._limiter)
        if self.remote is None:
            raise CorruptDataError("partition %d is not on this node" % partition)
        stored = await self.remote.fetch(partition, index.chunk_offset[cid], index.chunk_csize[cid])
        if usize <= INLINE_MAX_BYTES:
            self.shared.counters[sh.INLINE_DECODES] += 1
            return self._decode(cid, stored, usize)
        self.shared.counters[sh.THREAD_DECODES] += 1
        return await trio.to_thread.run_sync(self._decode, cid, stored, usize, limiter=self._limiter)

    def _check_broken(self, entry: int, cid: int) -> None:
        broken = self._broken.get(cid)
        if broken is not None:
            raise broken
        if self.shared.is_broken(cid):
            # Another serving process found it corrupt and logged it.
            raise KnownCorruptError("corrupt data in %s" % self._where(entry, cid))

    def _broken_error(self, entry: int, cid: int, exc: CorruptDataError) -> CorruptDataError:
        """Remember `cid` as broken; the error names the file. Trio thread only."""
        message = "%s in %s" % (exc, self._where(entry, cid))
        error: CorruptDataError
        if self.shared.mark_broken(cid):
            self.shared.counters[sh.CORRUPT_CHUNKS] += 1
            error = type(exc)(message)
        else:
            error = KnownCorruptError(message)
        self._broken[cid] = error
        return error

    def _load_and_decode(self, cid: int, usize: int) -> bytes | memoryview:
        """Worker thread: fetch (mapping or pread) and decode one chunk. Touches no state."""
        if self._resident[self.index.chunk_partition[cid]]:
            stored: bytes | memoryview = self.reader.stored_view(cid)
        else:
            try:
                stored = self.reader.read_stored(cid)
            except OSError as exc:
                raise CorruptDataError("cannot read the pack: %s" % exc.strerror) from exc
        return self._decode(cid, stored, usize)

    def _decode(self, cid: int, stored: bytes | memoryview, usize: int) -> bytes | memoryview:
        """Verify and decode stored bytes. Pure: safe in any thread."""
        index = self.index
        if zlib.crc32(stored) != index.chunk_crc32[cid]:
            raise ChecksumError("checksum mismatch")
        return decompress(index.chunk_codec[cid], stored, usize, self.reader.dictionary(index.chunk_dict[cid]))

    def _where(self, entry: int, cid: int) -> str:
        index = self.index
        chunk_no = cid - index.first[entry]
        return "%s (chunk %d, partition %d, offset %d)" % (
            index.path(entry).decode("utf-8", "backslashreplace"),
            chunk_no,
            index.chunk_partition[cid],
            index.chunk_offset[cid],
        )

    def _insert(self, cid: int, data: bytes | memoryview) -> None:
        if cid in self._cache or len(data) > self._cache_budget:
            return
        self._cache[cid] = data
        self._cache_bytes += len(data)
        while self._cache_bytes > self._cache_budget:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old)

    def preload(self, stop: threading.Event) -> int:
        """Fault every partition into memory, marking each resident when done. Blocking:
        run in its own thread. Returns the bytes preloaded."""
        total = 0
        for number in range(len(self._resident)):
            part_map = self.reader.partition_map(number)
            if part_map is None or self._resident[number] or not self._local[number]:
                continue
            for start in range(0, len(part_map), PRELOAD_STEP_BYTES):
                if stop.is_set():
                    return total
                length = min(PRELOAD_STEP_BYTES, len(part_map) - start)
                _populate(part_map, start, length)
            self._resident[number] = 1
            total += len(part_map)
        return total


def _populate(part_map: mmap.mmap, start: int, length: int) -> None:
    try:
        part_map.madvise(MADV_POPULATE_READ, start, length)
    except OSError:
        # Older kernels: ask for read-ahead, then touch one byte per page to map it.
        part_map.madvise(mmap.MADV_WILLNEED, start, length)
        view = memoryview(part_map)[start : start + length]
        for off in range(0, length, mmap.PAGESIZE):
            view[off]
        view.release()
