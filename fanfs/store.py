"""`ChunkStore`: decoded bytes of a file's chunks, for the FUSE read path.

Owns the decision of where a chunk is decoded: inline on the trio thread when its partition is
resident (copied into the mount's memory by `preload`) and the chunk is small (a thread
hand-off costs more than the decode, DESIGN.md section 4), otherwise in a worker thread under a
`CapacityLimiter` (cold disk, large chunks). Verifies every stored chunk's crc32 before
decoding; a chunk that fails once is remembered as broken and fails again at once without new
I/O.

Where decoded chunks are kept (cache.py has the policies):
- the mount's object cache (MinIO by default, shared by the serving processes): every decoded
  chunk while it has room;
- this process's read-ahead buffer, an LRU of `buffer_budget` bytes: chunks read only in part (the
  kernel asks for a large file 128 KiB to 1 MiB at a time) and chunks the prefetcher decoded
  that neither the object cache nor the kernel's page cache took.

The prefetcher (prefetch.py) sits above the store and data flows one way, down: it asks
(`prefetch`, `prefetch_local`) and reports what the kernel took (`keep_prefetched`); the
store never imports or calls it. The read-ahead interface is the section "Read-ahead" of
`ChunkStore`. A prefetch shares the single-flight map with demand reads but never reports
its failures to them: a reader that waited for a failed prefetch loads the chunk itself and
gets its own error. What a prefetch loaded is kept (or held for the push into the page
cache) by the store before the call returns, so a READ arriving meanwhile finds it.

Never raises FUSEError and never logs failures: it raises `CorruptDataError` with the file
named, and operations.py translates and logs once. Sync methods are O(1); `chunk()` is async
and a checkpoint only when it has to go to a thread.
"""

from __future__ import annotations

import array
import collections
import logging
import mmap
import os
import threading
import time
from typing import Final, Protocol, cast

import numpy as np
import trio

from fanfs import shared as sh
from fanfs.cache import LruCache, ObjectCache
from fanfs.compression import CODEC_NONE, decompress
from fanfs.errors import ChecksumError, CorruptDataError, FanfsError, KnownCorruptError
from fanfs.format.layout import chunk_crc
from fanfs.format.reader import PackReader
from fanfs.runtime import DECODE_TRACE_ENV
from fanfs.shared import SharedState

log = logging.getLogger(__name__)

# Decode time (`decode_ns`) is the decoding thread's CPU time, what the plan's decode budget
# counts: a worker thread's wall time would include waiting for the GIL once the codec has
# released it, up to the 5 ms switch interval while the trio thread serves requests.
_cpu_ns: Final = time.thread_time_ns
# Largest chunk decoded on the trio thread. 256 KiB of zstd decodes in about 250 us here,
# about what a thread hand-off costs; larger chunks go to a worker thread.
INLINE_MAX_BYTES: Final = 256 * 1024
# What the kernel asks a READ for is whole pages of its page cache (`ChunkStore.used`).
PAGE: Final = mmap.PAGESIZE
# Chunks pushed into the kernel's page cache that are remembered (to count a later READ of one
# as a wasted prefetch).
PUSHED_MEMORY: Final = 65536
# Decoded solid blocks (format 7) a serving process keeps: the small files of a block are
# stored in walk order, so they are read together (a directory, an epoch in storage order, the
# background fill), and each would otherwise decode the whole block again.
SOLID_CACHE_BYTES: Final = 16 * 1024 * 1024
# How long a thread waits for another thread of its process to decode a solid block it
# wants (a block decodes in well under a millisecond) before decoding it itself.
SOLID_WAIT_S: Final = 1.0
# A serving process with no other chunk in flight reads a chunk that is not in memory itself,
# with a blocking `pread` on the trio thread, and decodes it there: a thread hand-off (150-400
# us here) costs more than a local SSD's read, and no other request of the process waits
# (the others' requests go to the other serving processes). While those reads are slow (an
# exponential average above INLINE_READ_SLOW_NS: a disk that seeks, a network filesystem),
# the next INLINE_READ_BACKOFF go to worker threads again, which can overlap them. (1 ms
# was too low: this VM's disk averaged above it under 4 readers, and every back-off cost.)
INLINE_READ_SLOW_NS: Final = 4_000_000
INLINE_READ_BACKOFF: Final = 256


class SolidBlocks:
    """Decoded solid blocks by everything their decode depends on (`Index.block_key`): an
    `LruCache` of `budget` bytes behind a lock, so that worker-thread decodes share it with
    the trio thread, and the blocks being decoded (`claim`), so that a thread that wants a block
    another is decoding waits for it rather than decode it too. Counts the blocks' bytes it
    was given (`decoded_bytes`) and the slices taken from another process's block
    (`shared_hits`)."""

    def __init__(self, budget: int) -> None:
        self.decoded_bytes = 0
        self.shared_hits = 0
        self._lock = threading.Lock()
        self._lru = LruCache(budget)
        self._decoding: dict[tuple[int, ...], threading.Event] = {}

    def get(self, key: tuple[int, ...]) -> bytes | None:
        with self._lock:
            return cast("bytes | None", self._lru.get(key))  # only `put` fills it

    def put(self, key: tuple[int, ...], block: bytes) -> None:
        with self._lock:
            self.decoded_bytes += len(block)
            self._lru.put(key, block)

    def claim(self, key: tuple[int, ...]) -> threading.Event | None:
        """None if the caller is to decode block `key` (then `release` it, decoded or not);
        else the event another thread's decode of it sets when it ends."""
        with self._lock:
            event = self._decoding.get(key)
            if event is None:
                self._decoding[key] = threading.Event()
            return event

    def release(self, key: tuple[int, ...]) -> None:
        with self._lock:
            self._decoding.pop(key).set()

    def count_shared(self) -> None:
        with self._lock:
            self.shared_hits += 1


# Block mates (`ChunkStore.block_mates`): the files of a solid block other than the one read,
# sliced from the decoded block for the prefetcher to push into the page cache, so that they
# are read with no READ and no second decode, whichever serving process the kernel would ask.
# At most MATES_MAX per block (a block of 128 KiB holds about 20 files of real text; a
# hostile pack could declare a million); the per-process table that finds them is built on
# the first solid block decoded (24 bytes per solid chunk), and not at all for a pack with
# more than MATES_MAX_SOLID_CHUNKS of them; MATES_DONE blocks are remembered as handled.
MATES_MAX: Final = 1024
MATES_MAX_SOLID_CHUNKS: Final = 8 * 1024 * 1024
MATES_DONE: Final = 65536


class ChunkSource(Protocol):
    """Where stored bytes of partitions this node does not hold come from (cluster mode)."""

    async def fetch(self, partition: int, offset: int, length: int) -> bytes:
        """Stored bytes; raises a FanfsError (EIO) if no copy can be reached."""
        ...


class _Flight:
    """One chunk being loaded and decoded (for a reader or the prefetcher), and its outcome."""

    __slots__ = ("claimed", "data", "done", "error", "prefetch")

    def __init__(self, prefetch: bool) -> None:
        self.done = trio.Event()
        self.data: bytes | memoryview | None = None
        self.error: FanfsError | None = None
        self.prefetch = prefetch
        self.claimed = False  # a reader took a prefetch's data while it was in flight


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
        buffer_budget: int,
        thread_limit: int,
        objects: ObjectCache | None = None,
        remote: ChunkSource | None = None,
        inline_reads: bool = True,
    ) -> None:
        self.reader = reader
        self.remote = remote
        self.objects = objects
        self.limiter = trio.CapacityLimiter(thread_limit)
        self.index = reader.index
        self.chunk_size = reader.chunk_size
        self.shared = shared
        self._limiter = self.limiter
        self._local = reader.local
        self._crc_binds = reader.crc_binds_chunk
        self._resident = shared.resident
        for number, part in enumerate(reader.partitions):
            if part["size"] == 0:
                self._resident[number] = 1
        self._broken: dict[int, CorruptDataError] = {}
        self.buffer = LruCache(buffer_budget)
        # The pages of each buffered chunk that READs have had so far (`used`), as bits.
        self._used: dict[int, int] = {}
        # Chunks in the buffer that the prefetcher put there and no reader has read yet.
        self._prefetched: dict[int, int] = {}
        self.prefetched_bytes = 0
        self._pushed: collections.OrderedDict[int, None] = collections.OrderedDict()
        # Prefetched chunks on their way into the page cache (readers take them from here;
        # None once one has).
        self._holding: dict[int, bytes | memoryview] = {}
        self._taken: set[int] = set()  # held chunks a reader has already used
        self._inflight: dict[int, _Flight] = {}
        self._solid = SolidBlocks(SOLID_CACHE_BYTES)
        self._bsize = self.index.chunk_bsize
        self._inline_reads = inline_reads
        self._read_ns_avg = 0.0  # of the reads made inline
        # Solid chunks sorted by stored offset, their ids and files (block_mates); None
        # until the first use, () when there are too many.
        self._mate_table: tuple[np.ndarray, np.ndarray, np.ndarray] | tuple[()] | None = None
        self._mates_done: collections.OrderedDict[tuple[int, ...], None] = collections.OrderedDict()
        self._threaded_reads_left = 0  # reads that go to a thread before the next inline one
        # With FANFS_DECODE_TRACE set (a path prefix), each decode's (chunk id, CPU ns) in
        # order, written at unmount (`write_decode_trace`): what decode_ns sums, chunk by
        # chunk, for a benchmark to charge to each class without asking the mount between
        # reads (a stats request after each file of a shuffled epoch added 16% to its decode).
        # 16 bytes a decode, kept until unmount: a benchmark's aid, not for a long mount.
        self._trace_prefix = os.environ.get(DECODE_TRACE_ENV) or None
        self._trace: array.array[int] | None = array.array("q") if self._trace_prefix else None

    def statistics(self) -> dict[str, int | str]:
        """The object cache, this process's buffer, and the mount-wide partition residency."""
        stats: dict[str, int | str] = {
            "buffer_bytes": self.buffer.statistics()["cache_bytes"],
            "buffer_budget": self.buffer.budget,
            "resident_partitions": sum(self._resident),
            "partitions": len(self._resident),
        }
        if self.objects is not None:
            stats.update(self.objects.statistics())
        return stats

    def usize(self, entry: int, chunk_no: int) -> int:
        return self.reader.chunk_usize(entry, chunk_no)

    def is_local(self, cid: int) -> bool:
        return bool(self._local[self.index.chunk_partition[cid]])

    def is_mapped(self, cid: int) -> bool:
        """A raw chunk of a partition resident in memory: served from the mapping with no
        decode, so the daemon has nothing to gain from reading it ahead."""
        return self.index.chunk_codec[cid] == CODEC_NONE and bool(
            self._resident[self.index.chunk_partition[cid]]
        )

    def is_cached(self, cid: int) -> bool:
        return self.objects is not None and self.objects.contains(cid)

    def is_pending(self, cid: int) -> bool:
        """Buffered, being loaded or pushed, or known broken: nothing for a prefetch to do."""
        return (
            self.buffer.contains(cid)
            or cid in self._inflight
            or cid in self._holding
            or cid in self._broken
        )

    @property
    def loading(self) -> bool:
        """Whether this process has a chunk load in flight (a READ's or a prefetch's)."""
        return bool(self._inflight)

    def was_pushed(self, cid: int) -> bool:
        return cid in self._pushed

    async def chunk(self, entry: int, chunk_no: int, *, whole: bool) -> bytes | memoryview:
        """Decoded bytes of chunk `chunk_no` of file `entry`.

        Args:
            whole: the caller needs the whole chunk now, so buffering it would not help.

        Raises:
            CorruptDataError: checksum mismatch, undecodable data or an I/O error (also on
                every later call for the same chunk, without new I/O).
        """
        cid = self.index.first[entry] + chunk_no
        counters = self.shared.counters
        counters[sh.CHUNK_READS] += 1
        if self.objects is not None:
            data = self.objects.get(cid)
            if data is not None:
                counters[sh.OBJECT_HITS] += 1
                return data
        data = self.buffer.get(cid)
        if data is not None:
            counters[sh.BUFFER_HITS] += 1
            if self._prefetched.pop(cid, None) is not None:
                self.prefetched_bytes -= len(data)
                counters[sh.PREFETCH_USED] += 1
            return data
        data = self._holding.get(cid)
        if data is not None:
            if cid not in self._taken:
                self._taken.add(cid)
                counters[sh.PREFETCH_JOINED] += 1
            return data
        if self._pushed and self._pushed.pop(cid, 0) is None:
            # The prefetcher put this chunk in the page cache, and the kernel asks anyway:
            # evicted before use, or pushed too late.
            counters[sh.PREFETCH_WASTED] += 1
        self._check_broken(entry, cid)
        usize = self.usize(entry, chunk_no)
        data = self._solid_hit(cid, usize)
        if data is not None:
            self._keep(cid, data, whole=whole)
            return data
        if (
            self._resident[self.index.chunk_partition[cid]]
            and usize <= INLINE_MAX_BYTES
            and cid not in self._inflight  # else join the prefetch (or READ) loading it
        ):
            counters[sh.INLINE_DECODES] += 1
            try:
                data, ns = self._timed_decode(cid, self.reader.stored_view(cid), usize)
            except CorruptDataError as exc:
                raise self._broken_error(entry, cid, exc) from exc
            counters[sh.DECODE_NS] += ns
            self._count_decoded(cid, usize)
        else:
            data = await self._single_flight(entry, cid, usize)
        self._keep(cid, data, whole=whole)
        return data

    def _solid_hit(self, cid: int, usize: int) -> bytes | None:
        """Chunk `cid` sliced from its solid block if this process has decoded the block or
        another published it (counted in solid_hits): no I/O, no decode, and no time in
        decode_ns, which counts verifying and decoding. None otherwise."""
        if not self._bsize[cid]:
            return None
        data, _ = self._solid_slice(cid, None, usize)
        if data is not None:
            counters = self.shared.counters
            counters[sh.SOLID_HITS] += 1
            counters[sh.SOLID_SHARED] = self._solid.shared_hits
        return data

    def _decoded(self, cid: int, usize: int) -> bytes | memoryview | None:
        """Chunk `cid` if it is decoded already, for a prefetch: in the object cache, or a
        slice of a decoded solid block (`_solid_hit`; the prefetcher asks for a block's
        files one after another, and each used to load the block's stored bytes again and
        slice it in a worker thread, timed as a decode)."""
        cached = self.objects.get(cid) if self.objects is not None else None
        return cached if cached is not None else self._solid_hit(cid, usize)

    def _keep(self, cid: int, data: bytes | memoryview, *, whole: bool) -> None:
        # Raw chunks of resident partitions are views of the mapping: nothing to keep. (Other
        # memoryviews, such as a raw chunk received from a peer, are data of their own.)
        if self.is_mapped(cid):
            return
        if self.objects is not None and self.objects.put(cid, data):
            self.shared.counters[sh.OBJECT_INSERTS] += 1
        elif not whole:
            self._buffer_put(cid, data)

    def _buffer_put(self, cid: int, data: bytes | memoryview) -> bool:
        evictions = self.buffer.evictions
        stored = self.buffer.put(cid, data)
        if self.buffer.evictions != evictions and self._prefetched:
            # Prefetched chunks the LRU dropped unread were wasted work.
            for old in [c for c in self._prefetched if not self.buffer.contains(c)]:
                self.prefetched_bytes -= self._prefetched.pop(old)
                self.shared.counters[sh.PREFETCH_WASTED] += 1
        if self.buffer.evictions != evictions and self._used:
            for old in [c for c in self._used if not self.buffer.contains(c)]:
                del self._used[old]
        return stored

    def used(self, cid: int, start: int, end: int, size: int) -> None:
        """A READ answered bytes `start:end` of chunk `cid` (`size` bytes decoded). The
        buffer keeps a chunk that a READ used part of, for the READs of the rest; once READs
        have had every page of it, it lets it go: the kernel's page cache holds what they
        got. Kept to the budget instead, such chunks were 210 of the buffer's 364 MiB after
        a shuffled epoch of the real dataset, read through them once (docs/benchmarks.md).
        Pages, not bytes, are counted, so that READs of the same pages (the page cache
        dropped them) do not count twice. Trio thread only."""
        if not self.buffer.contains(cid):
            return
        pages = -(-size // PAGE)
        first = -(-start // PAGE)  # (a page counts once a READ had all of it)
        last = pages if end >= size else end // PAGE
        if last <= first:
            return
        got = self._used.get(cid, 0) | ((1 << (last - first)) - 1) << first
        if got != (1 << pages) - 1:
            self._used[cid] = got
            return
        self._used.pop(cid, None)
        self.buffer.discard(cid)

    # -- Read-ahead: what prefetch.py calls (with usize, is_local, is_mapped, is_cached,
    # is_pending, was_pushed and prefetched_bytes above). Nothing here calls up.

    def _keep_loaded(self, cid: int, data: bytes | memoryview, *, push: bool) -> None:
        """A prefetch loaded `data`: held while it is pushed to the kernel (readers take it
        from here), or kept at once (the caller does not push)."""
        if push:
            self._holding[cid] = data
        else:
            self.keep_prefetched(cid, data, pushed=False)

    def keep_prefetched(self, cid: int, data: bytes | memoryview, *, pushed: bool) -> None:
        """Keep a chunk the prefetcher decoded. `pushed`: the kernel's page cache took it."""
        counters = self.shared.counters
        if self._holding.pop(cid, None) is not None and cid in self._taken:
            # A reader took it while it was being pushed (counted as joined).
            self._taken.discard(cid)
            if self.objects is None or self.is_mapped(cid) or not self.objects.put(cid, data):
                return
            counters[sh.OBJECT_INSERTS] += 1
            return
        objects = self.objects
        mapped = self.is_mapped(cid) or (objects is not None and objects.contains(cid))
        cached = not mapped and objects is not None and objects.put(cid, data)
        if cached:
            counters[sh.OBJECT_INSERTS] += 1
        if pushed:
            counters[sh.PREFETCH_PUSHED] += 1
            self.shared.pushed[cid] = 1
            self._pushed[cid] = None
            if len(self._pushed) > PUSHED_MEMORY:
                self._pushed.popitem(last=False)
        elif cached or (mapped and self.is_cached(cid)):
            counters[sh.PREFETCH_CACHED] += 1
        elif not mapped and self._buffer_put(cid, data):
            counters[sh.PREFETCH_BUFFERED] += 1
            self._prefetched[cid] = len(data)
            self.prefetched_bytes += len(data)
        else:
            counters[sh.PREFETCH_DROPPED] += 1

    async def prefetch(
        self, entry: int, chunk_no: int, limiter: trio.CapacityLimiter, *, push: bool
    ) -> bytes | memoryview | None:
        """Load and decode a chunk ahead of its readers, in `limiter`'s threads (or from a
        peer), and keep it (`push`: hold it, and return it for the caller to push into the
        page cache, then report with `keep_prefetched`). Returns None if there is nothing to
        push: not pushing, already present, or the load failed (counted in prefetch_failed,
        logged at DEBUG only: the reader that needs the chunk loads it again and reports its
        own error)."""
        cid = self.index.first[entry] + chunk_no
        if self.is_pending(cid) or self.shared.is_broken(cid):
            return None
        self.shared.counters[sh.PREFETCH_ISSUED] += 1
        usize = self.usize(entry, chunk_no)
        cached = self._decoded(cid, usize)
        if cached is not None:  # only the kernel push is left to do
            self._keep_loaded(cid, cached, push=push)
            return cached if push else None
        flight = self._inflight[cid] = _Flight(prefetch=True)
        try:
            flight.data = await self._load(cid, usize, limiter)
            self._count_decoded(cid, usize)
        except FanfsError as exc:
            flight.error = exc
            self.shared.counters[sh.PREFETCH_FAILED] += 1
            log.debug("prefetch of %s failed: %s", self._where(entry, cid), exc)
        finally:
            del self._inflight[cid]
            flight.done.set()
        if flight.claimed:  # a reader waited for it and takes it
            if flight.data is not None:
                self.shared.counters[sh.PREFETCH_JOINED] += 1
                # Cache it now: the reader runs later, and a new prefetch of the chunk in
                # between would find it nowhere and load it again.
                self._keep(cid, flight.data, whole=True)
            return None
        if flight.data is None:
            return None
        self._keep_loaded(cid, flight.data, push=push)
        return flight.data if push else None

    async def prefetch_local(
        self, jobs: list[tuple[int, int]], limiter: trio.CapacityLimiter, *, push: bool
    ) -> list[tuple[int, int, bytes | memoryview]]:
        """`prefetch` for a batch of chunks of local partitions, decoded in one thread call
        (a thread hand-off costs about as much as decoding a 100 kB chunk). Returns
        (entry, chunk, data) of the chunks to push: with `push`, those that were loaded and
        that no reader took (held until `keep_prefetched`); without, none."""
        counters = self.shared.counters
        out: list[tuple[int, int, bytes | memoryview]] = []
        flights: list[tuple[int, int, int, int, _Flight]] = []
        for entry, chunk_no in jobs:
            cid = self.index.first[entry] + chunk_no
            if self.is_pending(cid) or self.shared.is_broken(cid):
                continue
            counters[sh.PREFETCH_ISSUED] += 1
            cached = self._decoded(cid, self.usize(entry, chunk_no))
            if cached is not None:
                out.append((entry, chunk_no, cached))
                continue
            flight = self._inflight[cid] = _Flight(prefetch=True)
            flights.append((entry, chunk_no, cid, self.usize(entry, chunk_no), flight))
        if not flights:
            return self._keep_all_loaded(out, push=push)
        outcomes: list[tuple[bytes | memoryview | None, FanfsError | None]] = []
        try:
            counters[sh.THREAD_DECODES] += len(flights)
            outcomes, ns = await trio.to_thread.run_sync(
                self._decode_many,
                [(cid, usize) for _, _, cid, usize, _ in flights],
                limiter=limiter,
            )
            counters[sh.DECODE_NS] += ns
        finally:
            for number, (entry, chunk_no, cid, usize, flight) in enumerate(flights):
                del self._inflight[cid]
                if number < len(outcomes):
                    flight.data, flight.error = outcomes[number]
                flight.done.set()
                if flight.error is not None:
                    counters[sh.PREFETCH_FAILED] += 1
                    log.debug("prefetch of %s failed: %s", self._where(entry, cid), flight.error)
                elif flight.data is not None:
                    self._count_decoded(cid, usize)
                    if flight.claimed:
                        counters[sh.PREFETCH_JOINED] += 1
                        self._keep(cid, flight.data, whole=True)  # see prefetch()
                    else:
                        out.append((entry, chunk_no, flight.data))
        return self._keep_all_loaded(out, push=push)

    def _keep_all_loaded(
        self, loaded: list[tuple[int, int, bytes | memoryview]], *, push: bool
    ) -> list[tuple[int, int, bytes | memoryview]]:
        first = self.index.first
        for entry, chunk_no, data in loaded:
            self._keep_loaded(first[entry] + chunk_no, data, push=push)
        return loaded if push else []

    def _decode_many(
        self, chunks: list[tuple[int, int]]
    ) -> tuple[list[tuple[bytes | memoryview | None, FanfsError | None]], int]:
        """Worker thread: `load_and_decode` each chunk; failures are returned, not raised."""
        outcomes: list[tuple[bytes | memoryview | None, FanfsError | None]] = []
        total = 0
        for cid, usize in chunks:
            try:
                data, ns = self.load_and_decode(cid, usize)
            except FanfsError as exc:
                outcomes.append((None, exc))
                continue
            outcomes.append((data, None))
            total += ns
        return outcomes, total

    async def _single_flight(self, entry: int, cid: int, usize: int) -> bytes | memoryview:
        # Concurrent readers of one chunk (N loader workers, kernel read-ahead, the
        # prefetcher) wait for the first one's fetch and decode instead of repeating it.
        while True:
            flight = self._inflight.get(cid)
            if flight is not None:
                flight.claimed = True
                await flight.done.wait()
            else:
                flight = self._inflight[cid] = _Flight(prefetch=False)
                try:
                    flight.data = await self._load(cid, usize, self._limiter)
                    self._count_decoded(cid, usize)
                except CorruptDataError as exc:
                    flight.error = self._broken_error(entry, cid, exc)
                except FanfsError as exc:  # transient (remote): not remembered
                    flight.error = type(exc)("%s: %s" % (self._where(entry, cid), exc))
                finally:
                    del self._inflight[cid]
                    flight.done.set()
            if flight.data is not None:
                return flight.data
            if flight.error is not None and not flight.prefetch:
                raise flight.error
            # A failed prefetch, or a reader that was cancelled (interrupted): load it here.

    async def _load(
        self, cid: int, usize: int, limiter: trio.CapacityLimiter
    ) -> bytes | memoryview:
        index = self.index
        partition = index.chunk_partition[cid]
        counters = self.shared.counters
        if self._local[partition]:
            if usize <= INLINE_MAX_BYTES and not self._resident[partition]:
                # Not preloaded, but maybe in the kernel's page cache (a pack larger than the
                # preload budget, `--preload no`): then decoded here, as a resident chunk is,
                # without a thread hand-off that costs more than the decode.
                cached = self.reader.read_stored_if_cached(cid)
                if cached is not None:
                    counters[sh.INLINE_DECODES] += 1
                    data, ns = self._timed_decode(cid, cached, usize)
                    counters[sh.DECODE_NS] += ns
                    return data
                if self._idle_for_inline_read(cid):
                    return self._read_inline(cid, usize)
            counters[sh.THREAD_DECODES] += 1
            data, ns = await trio.to_thread.run_sync(
                self.load_and_decode, cid, usize, limiter=limiter
            )
            counters[sh.DECODE_NS] += ns
            return data
        if self.remote is None:
            raise CorruptDataError("partition %d is not on this node" % partition)
        stored = await self.remote.fetch(partition, index.chunk_offset[cid], index.chunk_csize[cid])
        if usize <= INLINE_MAX_BYTES:
            counters[sh.INLINE_DECODES] += 1
            data, ns = self._timed_decode(cid, stored, usize)
            counters[sh.DECODE_NS] += ns
            return data
        counters[sh.THREAD_DECODES] += 1
        data, ns = await trio.to_thread.run_sync(
            self._timed_decode, cid, stored, usize, limiter=limiter
        )
        counters[sh.DECODE_NS] += ns
        return data

    def block_mates(self, cid: int) -> list[tuple[int, memoryview]]:
        """The other files stored in chunk `cid`'s solid block, as (entry, a view of their
        bytes in the block this process has decoded): for the prefetcher to push into the page
        cache. Once per block per process (MATES_DONE), without the files already pushed;
        [] if `cid` is no slice of a solid block or its block is not decoded here."""
        if not self._bsize[cid]:
            return []
        index = self.index
        key = index.block_key(cid)
        if key in self._mates_done:
            return []
        block = self._solid.get(key)
        if block is None:
            return []
        self._mates_done[key] = None
        if len(self._mates_done) > MATES_DONE:
            self._mates_done.popitem(last=False)
        pushed = self.shared.pushed
        view = memoryview(block)
        out = []
        for mate, entry in self._mates_of(cid, key):
            if not pushed[mate]:
                skip = index.chunk_skip[mate]
                out.append((entry, view[skip : skip + int(index.size[entry])]))
        return out

    def _mates_of(self, cid: int, key: tuple[int, ...]) -> list[tuple[int, int]]:
        """(chunk, file) of the files of one chunk, other than `cid`'s, whose chunk has block
        key `key` (at most MATES_MAX)."""
        if self._mate_table is None:
            self._mate_table = self._build_mate_table()
        if not self._mate_table:
            return []
        offsets, cids, entries = self._mate_table
        offset = self.index.chunk_offset[cid]
        lo = int(np.searchsorted(offsets, offset, side="left"))
        hi = min(int(np.searchsorted(offsets, offset, side="right")), lo + 2 * MATES_MAX)
        block_key = self.index.block_key
        mates = []
        for mate, entry in zip(cids[lo:hi].tolist(), entries[lo:hi].tolist(), strict=True):
            if mate != cid and entry >= 0 and block_key(mate) == key:
                mates.append((mate, entry))
                if len(mates) == MATES_MAX:
                    break
        return mates

    def _build_mate_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | tuple[()]:
        """The solid chunks sorted by stored offset, with the regular file of one chunk each
        is (-1 if none): what `_mates_of` searches."""
        index = self.index
        solid = np.flatnonzero(np.asarray(self._bsize))
        if len(solid) > MATES_MAX_SOLID_CHUNKS:
            return ()
        offsets = np.asarray(index.chunk_offset)[solid]
        order = np.argsort(offsets, kind="stable")
        offsets, solid = offsets[order], solid[order]
        # Directories use `first` and `count` for their children: only regular files of one
        # chunk own a chunk here.
        mode = np.asarray(index.mode)
        files = np.flatnonzero(((mode & 0o170000) == 0o100000) & (np.asarray(index.count) == 1))
        firsts = np.asarray(index.first)[files]
        by_chunk = np.argsort(firsts, kind="stable")
        firsts, files = firsts[by_chunk], files[by_chunk]
        pos = np.minimum(np.searchsorted(firsts, solid), max(len(firsts) - 1, 0))
        if len(firsts):
            entries = np.where(firsts[pos] == solid, files[pos], -1)
        else:
            entries = np.full(len(solid), -1)
        return offsets, solid, entries

    def _idle_for_inline_read(self, cid: int) -> bool:
        """Whether a reader's load of `cid`, the only chunk in flight in this process, may
        read the disk on the trio thread (INLINE_READ_SLOW_NS). A prefetch never does: it
        must overlap with the reader, not hold it up."""
        if not self._inline_reads or len(self._inflight) != 1:
            return False
        flight = self._inflight.get(cid)
        if flight is None or flight.prefetch:
            return False
        if self._threaded_reads_left:
            self._threaded_reads_left -= 1
            return False
        return True

    def _read_inline(self, cid: int, usize: int) -> bytes | memoryview:
        """Read and decode a chunk of a local partition on the trio thread (blocking)."""
        counters = self.shared.counters
        counters[sh.INLINE_READS] += 1
        counters[sh.INLINE_DECODES] += 1
        start = time.perf_counter_ns()
        stored = self._read_stored(cid)
        read_ns = time.perf_counter_ns() - start
        average = self._read_ns_avg = 0.75 * self._read_ns_avg + 0.25 * read_ns
        if average > INLINE_READ_SLOW_NS:
            log.debug(
                "pack reads average %.1f ms: the next %d go to worker threads",
                average / 1e6,
                INLINE_READ_BACKOFF,
            )
            self._threaded_reads_left = INLINE_READ_BACKOFF
            # The next inline read is a probe: one fast read brings the average back under.
            self._read_ns_avg = INLINE_READ_SLOW_NS
        data, ns = self._timed_decode(cid, stored, usize)
        counters[sh.DECODE_NS] += ns
        return data

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

    def load_and_decode(self, cid: int, usize: int) -> tuple[bytes | memoryview, int]:
        """Worker thread: fetch (mapping or pread) and decode one chunk; returns the data and
        the decode time in ns. Touches no state."""
        if self._resident[self.index.chunk_partition[cid]]:
            stored: bytes | memoryview = self.reader.stored_view(cid)
        else:
            stored = self._read_stored(cid)
        return self._timed_decode(cid, stored, usize)

    def _read_stored(self, cid: int) -> bytes:
        """`PackReader.read_stored` (blocking), a failure as the reader's EIO."""
        try:
            return self.reader.read_stored(cid)
        except OSError as exc:
            raise CorruptDataError("cannot read the pack: %s" % exc.strerror) from exc

    def _timed_decode(
        self, cid: int, stored: bytes | memoryview, usize: int
    ) -> tuple[bytes | memoryview, int]:
        """Verify and decode stored bytes; returns the data and the CPU ns that took (what
        decode_ns counts): for a file in a solid block, its block's decode if this call
        decoded it, else 0 (a slice of a block decoded already is a hit, as `_solid_hit`
        is; timed as decodes, the prefetcher's hits on the real dataset's Ruby docs, 1,200
        to 2,000 of them, came to a third of the class's decode_ns). Pure but for the
        solid-block cache (which locks): safe in any thread."""
        index = self.index
        if self._bsize[cid]:
            data, ns = self._solid_slice(cid, stored, usize)
            assert data is not None
        else:
            start = _cpu_ns()
            if chunk_crc(stored, cid, self._crc_binds) != index.chunk_crc32[cid]:
                raise ChecksumError("checksum mismatch")
            data = decompress(
                index.chunk_codec[cid], stored, usize, self.reader.dictionary(index.chunk_dict[cid])
            )
            ns = _cpu_ns() - start
        if self._trace is not None and ns:
            self._trace.extend((cid, ns))  # (one call: atomic under the GIL in any thread)
        return data, ns

    def write_decode_trace(self) -> str | None:
        """Write the decode trace (FANFS_DECODE_TRACE) to its prefix + "." + this process's
        pid: native int64 pairs (chunk id, CPU ns). Returns the path, or None untraced or
        if it could not be written (logged: the unmount goes on). A new file only, not
        through a symlink: the mount runs as root, and the prefix may name a directory
        others can write."""
        if self._trace is None:
            return None
        path = "%s.%d" % (self._trace_prefix, os.getpid())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with open(fd, "wb") as f:
                self._trace.tofile(f)
        except OSError as exc:
            log.warning("decode trace not written: %s: %s", path, exc.strerror)
            return None
        return path

    def _count_decoded(self, cid: int, usize: int) -> None:
        """Count a chunk decoded (trio thread): its own bytes, or for a slice of a solid
        block the blocks' bytes this process has decoded so far (its counter row is its own)."""
        counters = self.shared.counters
        if self._bsize[cid]:
            counters[sh.SOLID_BYTES] = self._solid.decoded_bytes
            counters[sh.SOLID_SHARED] = self._solid.shared_hits
        else:
            counters[sh.BYTES_DECODED] += usize

    def _solid_slice(
        self, cid: int, stored: bytes | memoryview | None, usize: int
    ) -> tuple[bytes | None, int]:
        """A slice of a solid block (a copy: the object cache counts what it holds), from the
        decoded block if this process has it or another published it (`SharedBlocks`), from
        another thread's decode of it once done, else decoded from `stored` (verified
        first); None if no process has it and no `stored` is given. And the CPU ns spent
        decoding the block (0 unless this call decoded it). Blocks are shared by stored
        location: the rows sharing it were written from the same bytes, and the first to
        decode them checked them."""
        index = self.index
        key = index.block_key(cid)
        skip = index.chunk_skip[cid]
        block = self._solid.get(key)
        ns = 0
        if block is None:
            published = self.shared.blocks
            if published is not None:
                data = published.slice(key, skip, usize)
                if data is not None:
                    self._solid.count_shared()
                    return data, 0
            if stored is None:
                return None, 0
            busy = self._solid.claim(key)
            if busy is not None:
                busy.wait(SOLID_WAIT_S)
                block = self._solid.get(key)
                if block is None:  # its decode failed, or is slow: decode it here
                    block, ns = self._decode_block(cid, stored, key)
            else:
                try:
                    block, ns = self._decode_block(cid, stored, key)
                finally:
                    self._solid.release(key)
        return block[skip : skip + usize], ns

    def _decode_block(
        self, cid: int, stored: bytes | memoryview, key: tuple[int, ...]
    ) -> tuple[bytes, int]:
        """Verify and decode a solid block, keep it and publish it to the other processes;
        returns it and the CPU ns verifying and decoding it took (what `decode_ns` counts, as
        for any chunk, and what the plan predicts). Keeping and publishing it are copies of
        the block, about 8 us for 128 KiB, not decoding: timed with them, the real dataset's
        PNG blocks decoded 1.15x the plan's prediction in a shuffled epoch, 1.01x without."""
        index = self.index
        start = _cpu_ns()
        if chunk_crc(stored, cid, self._crc_binds) != index.chunk_crc32[cid]:
            raise ChecksumError("checksum mismatch")
        block = bytes(
            decompress(
                index.chunk_codec[cid],
                stored,
                self._bsize[cid],
                self.reader.dictionary(index.chunk_dict[cid]),
            )
        )
        ns = _cpu_ns() - start
        self._solid.put(key, block)
        if self.shared.blocks is not None:
            self.shared.blocks.publish(key, block)
        return block, ns

    def _where(self, entry: int, cid: int) -> str:
        index = self.index
        chunk_no = cid - index.first[entry]
        return "%s (chunk %d, partition %d, offset %d)" % (
            index.path(entry).decode("utf-8", "backslashreplace"),
            chunk_no,
            index.chunk_partition[cid],
            index.chunk_offset[cid],
        )

    def preload(self, stop: threading.Event) -> int:
        """Copy every partition the reader reserved memory for into it, marking each
        resident once its copy is complete. Blocking: run in its own thread. Returns the
        bytes loaded. A partition that shrinks while it is copied stays on disk (its reads
        then fail with EIO where its bytes are gone)."""
        total = 0
        reader = self.reader
        for number in range(len(self._resident)):
            if self._resident[number] or not reader.reserved(number):
                continue
            try:
                if not reader.load_partition(number, stop.is_set):
                    return total
            except OSError as exc:
                log.warning(
                    "partition %d changed while it was being loaded (%s); serving it from the pack",
                    number,
                    exc,
                )
                continue
            self._resident[number] = 1
            total += reader.partitions[number]["size"]
        return total
