"""`SharedState`: the memory every serving process of one mount shares.

A mount may be served by several processes on the same /dev/fuse (forked after the INIT
handshake, see mount/serve.py). They share, through one anonymous MAP_SHARED mapping created before
the fork: the counters (one row per process, summed for statistics), the per-partition
"resident in memory" flags (set by the preloading thread in the first process, read by all), a
bitmap of chunks found corrupt (so a damaged file is logged once per mount and fails at once in
every process), and a byte per chunk pushed into the kernel's page cache (by a prefetcher or
the cache filler, so the others do not push it again). Plain loads and stores on aligned words;
no locks: a counter row has one writer, and a flag or bit only ever goes from 0 to 1."""

from __future__ import annotations

import mmap
from typing import Final

import numpy as np

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
    FAST_OPENDIRS,
    FAST_GETXATTRS,
    FAST_LISTXATTRS,
    FAST_IOCTLS,
) = range(len(COUNTER_NAMES))
FAST_COUNTERS: Final = COUNTER_NAMES[FAST_OPENDIRS:]


class SharedState:
    """Counters, resident flags and the corrupt-chunk bitmap of one mount.

    Attributes:
        counters: this process's counter row (memoryview of u64; index with READS, ...).
        resident: one byte per partition, 1 once the partition is known to be in memory.
    """

    def __init__(self, *, processes: int, partitions: int, chunks: int) -> None:
        self.processes = processes
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
