"""`SharedState`: the memory every serving process of one mount shares.

A mount may be served by several processes on the same /dev/fuse (forked after the INIT
handshake, see mount/serve.py). They share, through one anonymous MAP_SHARED mapping created before
the fork: the counters (one row per process, summed for statistics), the per-partition
"resident in memory" flags (set by the preloading thread in the first process, read by all), a
bitmap of chunks found corrupt (so a damaged file is logged once per mount and fails at once in
every process), and a byte per chunk pushed into the kernel's page cache (by a prefetcher or
the cache filler, so the others do not push it again). Plain loads and stores on aligned words;
no locks: a counter row has one writer, and a flag or bit only ever goes from 0 to 1. Decoded
solid blocks are shared too, in a mapping of their own behind a lock per process
(`SharedBlocks`)."""

from __future__ import annotations

import mmap
import multiprocessing
from typing import Final

import numpy as np

from fanfs._memory import populate

COUNTER_NAMES: Final = (
    "reads",
    "read_bytes",
    "lookups",
    "chunk_reads",
    "inline_decodes",
    "thread_decodes",
    "buffer_hits",
    "bytes_decoded",
    "data_errors",
    "internal_errors",
    "corrupt_chunks",
    "remote_fetches",
    "remote_bytes",
    "remote_timeouts",
    "pack_fallbacks",
    "read_ns",
    "decode_ns",
    "object_hits",
    "object_inserts",
    "prefetch_issued",
    "prefetch_pushed",
    "prefetch_buffered",
    "prefetch_cached",
    "prefetch_used",
    "prefetch_wasted",
    "prefetch_failed",
    "prefetch_dropped",
    "prefetch_joined",
    "fill_chunks",
    "fill_bytes",
    "fill_pushed",
    "hint_lists",
    "hint_entries",
    "readdirs",
    "dir_opens",
    "xattr_calls",
    "rest_pushed",
    "solid_hits",
    "solid_bytes",
    "inline_reads",
    "solid_pushed",
    "rest_waited",
    "solid_shared",
    # Answered in C by the patched pyfuse3 (FANFS_FAST_COUNTERS, same order, contiguous).
    "fast_opendirs",
    "fast_getxattrs",
    "fast_listxattrs",
    "fast_ioctls",
)
(
    READS,
    READ_BYTES,
    LOOKUPS,
    CHUNK_READS,
    INLINE_DECODES,
    THREAD_DECODES,
    BUFFER_HITS,
    BYTES_DECODED,
    DATA_ERRORS,
    INTERNAL_ERRORS,
    CORRUPT_CHUNKS,
    REMOTE_FETCHES,
    REMOTE_BYTES,
    REMOTE_TIMEOUTS,
    PACK_FALLBACKS,
    READ_NS,
    DECODE_NS,
    OBJECT_HITS,
    OBJECT_INSERTS,
    PREFETCH_ISSUED,
    PREFETCH_PUSHED,
    PREFETCH_BUFFERED,
    PREFETCH_CACHED,
    PREFETCH_USED,
    PREFETCH_WASTED,
    PREFETCH_FAILED,
    PREFETCH_DROPPED,
    PREFETCH_JOINED,
    FILL_CHUNKS,
    FILL_BYTES,
    FILL_PUSHED,
    HINT_LISTS,
    HINT_ENTRIES,
    READDIRS,
    DIR_OPENS,
    XATTR_CALLS,
    REST_PUSHED,
    SOLID_HITS,
    SOLID_BYTES,
    INLINE_READS,
    SOLID_PUSHED,
    REST_WAITED,
    SOLID_SHARED,
    FAST_OPENDIRS,
    FAST_GETXATTRS,
    FAST_LISTXATTRS,
    FAST_IOCTLS,
) = range(len(COUNTER_NAMES))
FAST_COUNTERS: Final = COUNTER_NAMES[FAST_OPENDIRS:]

# Decoded solid blocks each serving process publishes for the others (`SharedBlocks`), per
# process. The kernel hands each READ to whichever serving process is free, so the files of
# one block read in walk order reach several of them before the first one's push of the
# block's other files into the page cache lands; each would decode the block again (run X's
# Ruby docs: every block 1.66x with two processes). Only the blocks read at that moment
# matter, so a few MiB do; blocks above SHARED_BLOCK_MAX (`--solid-block` above 1 MiB, or
# a hostile pack's) are not shared.
SHARED_BLOCKS_BYTES: Final = 4 * 1024 * 1024
SHARED_BLOCK_MAX: Final = 1024 * 1024
# A slot's header: the block's key (`Index.block_key`, six integers), then its length (0:
# empty).
_KEY_WORDS: Final = 6
_HEADER_WORDS: Final = _KEY_WORDS + 1


class SharedBlocks:
    """Decoded solid blocks shared by the serving processes of one mount: each process writes
    only its own segment of `slots` slots (a block goes in the slot its key hashes to), under
    its own lock; the others read a slice of a block under that lock. Every acquire is
    non-blocking, so no process ever waits: a busy segment is a miss (the reader decodes the
    block itself) or a block not published. Created before the fork."""

    def __init__(self, *, processes: int, block_bytes: int) -> None:
        self.processes = processes
        self.slot_bytes = max(1, min(block_bytes, SHARED_BLOCK_MAX))
        self.slots = max(1, SHARED_BLOCKS_BYTES // self.slot_bytes)
        count = processes * self.slots
        self._data_off = count * _HEADER_WORDS * 8
        # Populated now, before the fork: a shared mapping's pages are otherwise allocated
        # at their first write, a page fault each in the publishing thread (the real
        # dataset's Ruby docs: publishing a 128 KiB block took 96 us, a third of its
        # decode; populated, 47 us). Each forked process maps them again (`use_slot`).
        self._map = mmap.mmap(
            -1,
            self._data_off + count * self.slot_bytes,
            flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
        )
        self._view = memoryview(self._map)
        self._headers = self._view[: self._data_off].cast("q")
        # Semaphores in shared memory, inherited by the forked processes (no resource tracker:
        # the fork context unlinks their names at once).
        context = multiprocessing.get_context("fork")
        self._locks = [context.Lock() for _ in range(processes)]
        self._own = 0

    def use_slot(self, slot: int) -> None:
        """Make this process publish in segment `slot` (its counter row's), and map the
        segments into its page tables, writable: a forked process inherits none of a shared
        mapping's, and each page of its first blocks would fault in as they are written
        (MAP_POPULATE populated only the process that created the mapping)."""
        self._own = slot
        populate(self._map, 0, len(self._map), write=True)

    def _slot(self, segment: int, key: tuple[int, ...]) -> int:
        return segment * self.slots + hash(key) % self.slots

    def publish(self, key: tuple[int, ...], block: bytes) -> bool:
        """Put a decoded block in this process's segment (any thread); False if it is too
        large or the segment is busy (another thread of this process, or a reader)."""
        if len(block) > self.slot_bytes:
            return False
        lock = self._locks[self._own]
        if not lock.acquire(False):
            return False
        try:
            slot = self._slot(self._own, key)
            header = slot * _HEADER_WORDS
            headers = self._headers
            headers[header + _KEY_WORDS] = 0
            start = self._data_off + slot * self.slot_bytes
            self._view[start : start + len(block)] = block
            for word, value in enumerate(key):
                headers[header + word] = value
            headers[header + _KEY_WORDS] = len(block)
        finally:
            lock.release()
        return True

    def slice(self, key: tuple[int, ...], skip: int, size: int) -> bytes | None:
        """Bytes `skip` to `skip + size` of the block `key` if another process published it
        (a copy), else None."""
        want = list(key)
        for segment in range(self.processes):
            if segment == self._own:
                continue
            slot = self._slot(segment, key)
            header = slot * _HEADER_WORDS
            lock = self._locks[segment]
            if not lock.acquire(False):
                continue
            try:
                headers = self._headers
                length = headers[header + _KEY_WORDS]
                if (
                    length
                    and skip + size <= length
                    and headers[header : header + _KEY_WORDS].tolist() == want
                ):
                    start = self._data_off + slot * self.slot_bytes + skip
                    return bytes(self._view[start : start + size])
            finally:
                lock.release()
        return None


class SharedState:
    """Counters, resident flags and the corrupt-chunk bitmap of one mount.

    Attributes:
        counters: this process's counter row (memoryview of u64; index with READS, ...).
        resident: one byte per partition, 1 once the partition is known to be in memory.
    """

    def __init__(
        self, *, processes: int, partitions: int, chunks: int, solid_block_bytes: int = 0
    ) -> None:
        self.processes = processes
        # Decoded solid blocks shared among the processes: for a pack with solid blocks (the
        # largest one's size) served by more than one.
        self.blocks = (
            SharedBlocks(processes=processes, block_bytes=solid_block_bytes)
            if solid_block_bytes > 0 and processes > 1
            else None
        )
        self._row = len(COUNTER_NAMES) * 8
        self._counters_size = processes * self._row
        self._resident_off = self._counters_size
        self._broken_off = self._resident_off + partitions
        self._pushed_off = self._broken_off + (chunks + 7) // 8
        size = self._pushed_off + chunks
        self._map = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_SHARED)
        self._view = memoryview(self._map)
        self.resident = self._view[self._resident_off : self._broken_off]
        self._broken = self._view[self._broken_off : self._pushed_off]
        # One byte per chunk (no read-modify-write between processes): 1 once any process
        # pushed the chunk into the kernel's page cache.
        self.pushed = self._view[self._pushed_off : size]
        self.counters = self._view[0 : self._row].cast("Q")

    def use_slot(self, slot: int) -> None:
        """Make this process write counter row `slot` (call once, after fork)."""
        start = slot * self._row
        self.counters = self._view[start : start + self._row].cast("Q")
        if self.blocks is not None:
            self.blocks.use_slot(slot)

    def fast_counters(self) -> memoryview:
        """This process's counters of the answers the patched pyfuse3 gives in C (a writable
        view of FAST_COUNTERS; pass it to pyfuse3.fanfs_set_fast_paths after use_slot)."""
        row = self.counters.cast("B")
        return row[FAST_OPENDIRS * 8 : (FAST_OPENDIRS + len(FAST_COUNTERS)) * 8]

    def totals(self) -> dict[str, int]:
        rows = np.frombuffer(self._map, dtype=np.uint64, count=self._counters_size // 8)
        sums = rows.reshape(self.processes, len(COUNTER_NAMES)).sum(axis=0)
        return {name: int(value) for name, value in zip(COUNTER_NAMES, sums, strict=True)}

    def mark_broken(self, chunk: int) -> bool:
        """Record `chunk` as corrupt; returns True if no process had recorded it yet."""
        byte, bit = divmod(chunk, 8)
        old = self._broken[byte]
        if old & (1 << bit):
            return False
        self._broken[byte] = old | (1 << bit)
        return True

    def is_broken(self, chunk: int) -> bool:
        byte, bit = divmod(chunk, 8)
        return bool(self._broken[byte] & (1 << bit))
