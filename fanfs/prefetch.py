"""`Prefetcher`: reads ahead of unmodified readers, in hint order when told, and fills the
object cache in the background.

What it learns from the READs a serving process sees (DESIGN.md section 6):

- **Sequential reads inside a file** (a large array, a TFRecord or HDF5 shard): a stream per
  file; once CONFIRM reads in a row continue where the last one ended, the next chunks are
  decoded ahead, in a window that doubles up to a quarter of the prefetch memory.
- **Walks over files** (sorted traversal of a directory, shards one after another): entries
  are numbered breadth-first with sorted names, so the files of a directory, and the
  directories of one level, are consecutive ids. A small table of walk streams recognises a
  reader whose next files follow its last ones, three in a row (with a little slack:
  several serving processes each see part of the walk), and reads the next files ahead.
- **Random reads** start streams that never confirm: nothing is read ahead for them.
- **Hints** (clairvoyant mode, fanfs.hints / fanfs.torch): the upcoming order of files; the
  prefetcher keeps a window of them decoded ahead of the position the client reports (or
  that reads reveal).
- **Background fill** (`CacheFiller`): while the shared MinIO object cache has room, the
  node's chunks are decoded into it in storage order (bulk sequential reads of the pack),
  from the job's first LOOKUP or READ, by a process of its own at the lowest CPU priority
  (in cluster mode a thread, from the first READ). A random epoch then hits the cache for
  every object it holds, and the fill uses cores the readers leave idle (the training
  step's compute).

Where prefetched data goes (`into`): "kernel" pushes it into the kernel's page cache with
notify_store, where the reader finds it without a FUSE round trip (and every serving process
shares it); "daemon" keeps it in the serving process's read-ahead buffer. A chunk the kernel
refuses (it does not know the inode yet) goes to the buffer. docs/benchmarks.md has the
measurement behind the default.

Failures never reach readers: `ChunkStore.prefetch` swallows and counts them; the reader that
needs the chunk loads it again and gets its own error. Trio thread only.
"""

from __future__ import annotations

import collections
import logging
import mmap
import queue
import stat
import threading
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import numpy as np
import trio

from fanfs import shared as sh
from fanfs.cache import MinioCache, ObjectCache
from fanfs.compression import CODEC_NONE
from fanfs.format.layout import chunk_usizes
from fanfs.logsetup import LOG_ONCE
from fanfs.store import ChunkStore

log = logging.getLogger(__name__)

# Consecutive continuing reads before a stream reads ahead: a random reader continues by
# chance with probability ~SLACK/N per read, so two in a row practically never happen.
CONFIRM: Final = 3
# Walks over files confirm after three continuing files too: a random order over N files
# continues one of the streams by chance about WALK_STREAMS * SLACK / N of the time, and a
# false walk costs a window. The three must come close together: a stream not continued
# within WALK_GAP file reads starts counting again.
WALK_CONFIRM: Final = 3
WALK_GAP: Final = 2
# A walk's first window: a few small files; it doubles with every file the walk continues.
WALK_FIRST_WINDOW: Final = 256 * 1024
# How far past a stream's frontier a read still continues it: with two serving processes each
# sees every other read or so of a sequential reader. In chunks inside a file (a READ is up
# to 1 MiB, one default chunk), in files for walks.
SLACK: Final = 2
FILE_SLACK: Final = 2
WALK_STREAMS: Final = 8
FILE_STREAMS: Final = 32
# Largest read-ahead window of one stream (a quarter of the prefetch memory if smaller): far
# enough ahead to hide a decode or a peer's round trip, short enough to waste little at the
# end of a walk.
MAX_WINDOW_BYTES: Final = 32 * 1024 * 1024
# Read-ahead work per thread hand-off: decoded bytes of the chunks a worker takes at once.
BATCH_BYTES: Final = 1024 * 1024
# Read-ahead of other nodes' chunks per batch: fetched all at once, so the MPI thread can
# coalesce them (its messages carry up to 4 MiB).
REMOTE_BATCH_BYTES: Final = 4 * 1024 * 1024
# Blocks waiting to be pushed into the page cache after a READ used part of them
# (`push_rest`, `push_mates`): more are dropped.
REST_QUEUE_BYTES: Final = 8 * 1024 * 1024
# A file whose reader comes back to a partly read block before its push has landed
# (RACES_TO_WAIT times: a mapped file faulting page after page, as LMDB with MADV_RANDOM
# does) has the pages after the READ's in its next WAIT_PUSHES partly read blocks pushed
# before the READ is answered (the pages before it follow); then one push is left to land
# on its own again, to see whether the reader still races it.
RACES_TO_WAIT: Final = 2
WAIT_PUSHES: Final = 64
# How long a READ waits for its block's push. The kernel locks each page it stores into,
# and a page another READ is filling stays locked until that READ is answered, maybe by
# this very process: past this, the READ is answered and the file's pushes no longer wait.
PUSH_WAIT_S: Final = 0.02
# Background fill: stored bytes read and decoded per step.
FILL_BATCH_BYTES: Final = 1024 * 1024


class _Ahead:
    """A read-ahead window: what was issued past the reader, in order, and its size."""

    __slots__ = ("ahead", "frontier", "hits", "last", "pending", "seen", "window")

    def __init__(self, position: int, window: int) -> None:
        self.seen = 0  # when it was last continued (walks: the process's file-read count)
        self.last = position  # the reader's furthest position
        self.frontier = position  # the furthest position issued (or read)
        self.hits = 0
        self.window = window  # bytes to keep ahead of the reader once confirmed
        self.pending: collections.deque[tuple[int, int]] = collections.deque()
        self.ahead = 0  # bytes issued past `last`

    def continues(self, position: int, slack: int = SLACK) -> bool:
        # Just after the reader's last position, or just past what was read ahead (a reader
        # served from the page cache skips what was pushed). Not in between: a random order
        # would land there by chance, the more often the larger the window.
        return self.last < position <= self.last + slack or (
            self.frontier < position <= self.frontier + slack
        )

    def advance(self, position: int) -> None:
        self.last = max(self.last, position)
        self.frontier = max(self.frontier, position)
        pending = self.pending
        while pending and pending[0][0] <= self.last:
            self.ahead -= pending.popleft()[1]

    def issued(self, position: int, nbytes: int) -> None:
        self.pending.append((position, nbytes))
        self.ahead += nbytes
        self.frontier = position


class Prefetcher:
    """Read-ahead for one serving process. `observe()` is called for every READ (cheap,
    sync); `run()` is the nursery task that does the work."""

    def __init__(
        self,
        store: ChunkStore,
        *,
        memory: int,
        into: str,
        notify: Callable[[int, int, Any], None] | None,
        workers: int = 2,
        fill: bool = False,
        read_ahead: bool = True,
    ) -> None:
        self.store = store
        # False: only a decoded solid block's other files are pushed (`push_mates`), for a
        # mount with --prefetch off (a balanced plan counts each block decoded once).
        self.read_ahead = read_ahead
        self.index = store.index
        self.chunk_size = store.chunk_size
        self.counters = store.shared.counters
        self.memory = memory
        self.notify = notify if into == "kernel" else None
        self.workers = workers
        self.max_window = max(min(memory // 4, MAX_WINDOW_BYTES), self.chunk_size)
        self.first_window = min(2 * self.chunk_size, self.max_window)
        self._limiter = trio.CapacityLimiter(workers)
        # (entry, chunk, the window that asked, its position there)
        self._jobs: collections.deque[tuple[int, int, _Ahead, int]] = collections.deque()
        self._queued: set[int] = set()
        self._lot = trio.lowlevel.ParkingLot()
        self._files: collections.OrderedDict[int, _Ahead] = collections.OrderedDict()
        self._walks: list[_Ahead] = []
        self._file_reads = 0
        self._hints = np.zeros(0, dtype=np.int64)
        # Position of each entry in the hinted order (-1: not hinted); 4 bytes per entry, so
        # an order of a million files costs 4 MB, not a dict of a million objects.
        self._hint_pos: np.ndarray | None = None
        self._hint_ahead: _Ahead | None = None
        self._fill = fill and isinstance(store.objects, MinioCache)
        self._pusher = (
            None
            if self.notify is None
            else _Pusher(self.notify, store.shared.pushed, self.counters)
        )
        # Per file: times its reader raced a push (`push_rest`), and the pushes left to wait
        # for (0: the next push shows whether the reader still races).
        self._races: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._waits: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._busy = 0  # workers in the middle of a batch
        self._started = trio.Event()

    # -- what readers reveal ---------------------------------------------------------------

    def observe(self, entry: int, first: int, last: int) -> bool:
        """A READ of chunks first..last of `entry` arrived. Returns True if read-ahead was
        queued (the caller then lets the workers start before it serves the READ)."""
        if not self.read_ahead:
            return False
        queued = len(self._jobs)
        if not self._started.is_set():
            self._started.set()
        if self._queued:
            first_cid = self.index.first[entry]
            for cid in range(first_cid + first, first_cid + last + 1):
                self._queued.discard(cid)
        if self.index.count[entry] > 1:
            self._in_file(entry, first, last)
        if first == 0:
            self._walk(entry)
        if self._hint_pos is not None:
            position = int(self._hint_pos[entry])
            if position >= 0:
                self.hint_progress(position)
        return len(self._jobs) > queued

    def _in_file(self, entry: int, first: int, last: int) -> None:
        stream = self._files.get(entry)
        if stream is None or not stream.continues(first, FILE_SLACK):
            stream = self._files[entry] = _Ahead(last, self.first_window)
            if len(self._files) > FILE_STREAMS:
                self._files.popitem(last=False)
            return
        self._files.move_to_end(entry)
        stream.advance(last)
        stream.hits += 1
        if stream.hits < CONFIRM:
            return
        count = self.index.count[entry]
        while stream.ahead < stream.window and stream.frontier + 1 < count:
            chunk_no = stream.frontier + 1
            stream.issued(chunk_no, self._enqueue(entry, chunk_no, stream, chunk_no))
        stream.window = min(stream.window * 2, self.max_window)

    def _walk(self, entry: int) -> None:
        walks = self._walks
        self._file_reads += 1
        for number, stream in enumerate(walks):  # noqa: B007 - used after the loop
            if stream.continues(entry):
                break
        else:
            stream = _Ahead(entry, min(WALK_FIRST_WINDOW, self.max_window))
            stream.seen = self._file_reads
            walks.insert(0, stream)
            del walks[WALK_STREAMS:]
            return
        if number:
            walks.insert(0, walks.pop(number))
        if stream.hits < WALK_CONFIRM and self._file_reads - stream.seen > WALK_GAP:
            stream.hits = 0  # continued, but not in a row: a random order's near miss
        stream.seen = self._file_reads
        stream.advance(entry)
        stream.hits += 1
        if stream.hits < WALK_CONFIRM:
            return
        index = self.index
        candidate = stream.frontier + 1
        # Files only; a bounded scan past directories and empty files.
        limit = min(index.entry_count, candidate + 4096)
        while stream.ahead < stream.window and candidate < limit:
            if stat.S_ISREG(index.mode[candidate]) and index.size[candidate]:
                stream.issued(candidate, self._enqueue_file(candidate, stream, candidate))
            else:
                stream.frontier = candidate
            candidate += 1
        stream.window = min(stream.window * 2, self.max_window)

    # -- hints -----------------------------------------------------------------------------

    def set_hints(self, entries: np.ndarray | list[int]) -> None:
        """A new upcoming order (replaces the previous one; -1 for unknown paths);
        prefetching starts at once."""
        order = np.asarray(entries, dtype=np.int64)
        self._hints = order
        positions = np.full(self.index.entry_count, -1, dtype=np.int32)
        known = np.flatnonzero(order >= 0)
        # Reversed, so an entry hinted twice keeps its first position.
        positions[order[known[::-1]]] = known[::-1]
        self._hint_pos = positions
        self._hint_ahead = _Ahead(-1, self.max_window * 2)
        self.counters[sh.HINT_LISTS] += 1
        self.counters[sh.HINT_ENTRIES] += len(entries)
        self._hint_fill()

    def hint_progress(self, position: int) -> None:
        """The client consumed the hinted order up to `position`."""
        ahead = self._hint_ahead
        if ahead is None or position <= ahead.last:
            return
        ahead.advance(position)
        self._hint_fill()

    def _hint_fill(self) -> None:
        ahead = self._hint_ahead
        if ahead is None:
            return
        hints = self._hints
        while ahead.ahead < ahead.window and ahead.frontier + 1 < len(hints):
            position = ahead.frontier + 1
            entry = int(hints[position])  # -1: a path the mount does not have
            ahead.issued(position, self._enqueue_file(entry, ahead, position) if entry >= 0 else 0)

    # -- the queue -------------------------------------------------------------------------

    def _enqueue_file(self, entry: int, ahead: _Ahead, position: int) -> int:
        """Queue the chunks of `entry` (up to the window's size); returns the bytes queued."""
        total = 0
        for chunk_no in range(self.index.count[entry]):
            total += self._enqueue(entry, chunk_no, ahead, position)
            if total >= ahead.window:
                break
        return total

    def _enqueue(self, entry: int, chunk_no: int, ahead: _Ahead, position: int) -> int:
        usize = self.store.usize(entry, chunk_no)
        cid = self.index.first[entry] + chunk_no
        store = self.store
        if cid in self._queued or store.is_pending(cid):
            return usize
        if self.notify is None:
            if store.is_cached(cid) or store.is_mapped(cid):
                return usize  # a demand read would cost no more than this prefetch
        elif store.was_pushed(cid) or store.shared.pushed[cid]:
            return usize  # in the page cache already (pushed by this process or the filler)
        self._queued.add(cid)
        self._jobs.append((entry, chunk_no, ahead, position))
        self._lot.unpark()
        return usize

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.workers):
                    nursery.start_soon(self._worker)
                if self._fill:
                    nursery.start_soon(self._fill_cache)
        finally:
            if self._pusher is not None:
                self._pusher.stop()

    def push_rest(
        self, entry: int, chunk_no: int, data: bytes | memoryview, start: int, end: int
    ) -> None:
        """A READ used bytes `start:end` of this decoded chunk: a reader seeking inside a
        large file (an HDF5, LMDB or npy file; the kernel asks for what the reader asked).
        Put the rest of the chunk into the page cache, so that the reader's next reads in it
        reach no daemon and decode nothing again. Skipped without the page cache as target,
        without read-ahead, and while REST_QUEUE_BYTES wait already.

        The push is a thread's (`_Pusher`), and a reader that faults the next page at once
        gets there first: a READ for every page, each answered from the buffer. A file where
        that happens (RACES_TO_WAIT) has the pages after the READ's pushed before the READ is
        answered, while nothing else is loading in this process: the trio thread blocks for
        about 100 µs, at most PUSH_WAIT_S. Trio thread only."""
        pusher = self._pusher
        if pusher is None or not self.read_ahead:
            return
        cid = self.index.first[entry] + chunk_no
        if pusher.pending(cid):
            self._raced(entry)
            return
        wait = False
        left = self._waits.get(entry)
        if left == 0:  # the push left to land on its own was not raced
            del self._waits[entry]
        elif left is not None:
            if left > 1 and not self.store.loading:
                self._waits[entry] = left - 1
                wait = True
            elif left == 1:
                self._waits[entry] = 0
        base = chunk_no * self.store.reader.unit(entry)
        parts = _around(data, start, end)
        if not parts:
            return
        if not wait:
            pusher.submit(entry + 1, cid, base, parts, sh.REST_PUSHED)
        elif pusher.submit(entry + 1, cid, base, parts, sh.REST_PUSHED, wait=PUSH_WAIT_S):
            self.counters[sh.REST_WAITED] += 1
        else:  # queue full, or the push blocked: the file's pushes land on their own again
            self._waits.pop(entry, None)

    def _raced(self, entry: int) -> None:
        races = self._races.pop(entry, 0) + 1
        if entry in self._waits or races >= RACES_TO_WAIT:
            self._waits[entry] = WAIT_PUSHES
            self._waits.move_to_end(entry)
            if len(self._waits) > FILE_STREAMS:
                self._waits.popitem(last=False)
            races = 0
        self._races[entry] = races
        if len(self._races) > FILE_STREAMS:
            self._races.popitem(last=False)

    @property
    def pushes(self) -> bool:
        """Whether read-ahead goes into the kernel's page cache (`--prefetch-into kernel`)."""
        return self.notify is not None

    def push_mates(self, mates: list[tuple[int, memoryview]]) -> None:
        """A READ decoded a solid block: put the block's other files (`ChunkStore.block_mates`)
        into the page cache, so that reading them costs no READ and no second decode, in
        whichever serving process the kernel would have asked (each keeps its own decoded
        blocks). Skipped as `push_rest` is."""
        if self._pusher is None:
            return
        first = self.index.first
        for entry, data in mates:
            self._pusher.submit(entry + 1, first[entry], 0, [(0, data)], sh.SOLID_PUSHED)

    @property
    def idle(self) -> bool:
        """Nothing queued, no worker busy, no push pending (tests wait for this)."""
        return not self._jobs and not self._busy and (self._pusher is None or self._pusher.idle)

    async def _worker(self) -> None:
        while True:
            while not self._jobs:
                await self._lot.park()
            self._busy += 1
            try:
                await self._work(*self._next_batch())
            except Exception:  # a bug here must cost read-ahead, never the mount
                log.exception("read-ahead failed (reads are not affected)", extra=LOG_ONCE)
            finally:
                self._busy -= 1

    async def _work(self, local: list[tuple[int, int]], remote: list[tuple[int, int]]) -> None:
        # The store keeps (or holds, for the push) each loaded chunk before it returns: a
        # READ arriving meanwhile finds it rather than load it a second time.
        push = self.notify is not None
        loaded = await self.store.prefetch_local(local, self._limiter, push=push) if local else []
        if remote:
            # All at once: the MPI thread sends the requests queued for one owner as one
            # message, so a batch of read-ahead costs a message per owner, not per chunk.
            async with trio.open_nursery() as nursery:
                for entry, chunk_no in remote:
                    nursery.start_soon(self._fetch_remote, entry, chunk_no, loaded)
        if loaded:
            first = self.index.first
            for entry, chunk_no, _ in loaded:
                mates = self.store.block_mates(first[entry] + chunk_no)
                if mates:
                    self.push_mates(mates)
            await self._push(loaded)

    async def _fetch_remote(
        self, entry: int, chunk_no: int, loaded: list[tuple[int, int, bytes | memoryview]]
    ) -> None:
        data = await self.store.prefetch(
            entry, chunk_no, self._limiter, push=self.notify is not None
        )
        if data is not None:
            loaded.append((entry, chunk_no, data))

    def _next_batch(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Up to BATCH_BYTES of queued chunks that no reader has got to yet."""
        store = self.store
        local: list[tuple[int, int]] = []
        remote: list[tuple[int, int]] = []
        nbytes = 0
        while self._jobs and nbytes < (REMOTE_BATCH_BYTES if remote else BATCH_BYTES):
            entry, chunk_no, ahead, position = self._jobs.popleft()
            cid = self.index.first[entry] + chunk_no
            if cid not in self._queued or position <= ahead.last:
                # A reader got there first (it read the chunk, or passed this position):
                # its own read decoded it, and the kernel keeps it.
                self._queued.discard(cid)
                continue
            self._queued.discard(cid)
            if (
                self.notify is None
                and store.prefetched_bytes + nbytes + self.chunk_size > self.memory
            ):
                # The buffer is full of chunks nobody has read yet: reading further ahead
                # would only evict them.
                self.counters[sh.PREFETCH_ISSUED] += 1
                self.counters[sh.PREFETCH_DROPPED] += 1
                continue
            (local if store.is_local(cid) else remote).append((entry, chunk_no))
            nbytes += store.usize(entry, chunk_no)
        return local, remote

    async def _push(self, loaded: list[tuple[int, int, bytes | memoryview]]) -> None:
        """Push held chunks into the page cache, in a thread: the kernel locks the pages it
        stores into, and a READ of those pages holds them locked until this process answers
        it (from the store's held chunks, on the trio thread)."""
        pushed = await trio.to_thread.run_sync(self._push_all, loaded, limiter=self._limiter)
        first = self.index.first
        for (entry, chunk_no, data), ok in zip(loaded, pushed, strict=True):
            self.store.keep_prefetched(first[entry] + chunk_no, data, pushed=ok)

    def _push_all(self, loaded: list[tuple[int, int, bytes | memoryview]]) -> list[bool]:
        """Worker thread: notify_store each chunk; False where the kernel refused it."""
        notify = self.notify
        assert notify is not None
        results = []
        for entry, chunk_no, data in loaded:
            try:
                notify(entry + 1, chunk_no * self.store.reader.unit(entry), data)
                results.append(True)
            except OSError as exc:  # ENOENT: the kernel has no inode for it yet
                log.debug("cannot push %s into the page cache: %s", self.index.path(entry), exc)
                results.append(False)
        return results

    async def _fill_cache(self) -> None:
        # Cluster mode: in a thread of this process (a forked filler and MPI do not mix).
        await self._started.wait()
        filler = CacheFiller(self.store, self.notify)
        stop = threading.Event()
        try:
            await trio.to_thread.run_sync(filler.run, stop.is_set, abandon_on_cancel=True)
        finally:
            stop.set()


def _around(data: bytes | memoryview, start: int, end: int) -> list[tuple[int, memoryview]]:
    """The pages of `data` outside the pages of `start:end` (a READ's, locked by the kernel
    until it is answered), as (offset, view): those after it first, which a reader faulting
    forward (a value of several pages) needs next."""
    lo = start - start % mmap.PAGESIZE
    hi = min(len(data), -(-end // mmap.PAGESIZE) * mmap.PAGESIZE)
    view = memoryview(data)
    parts = []
    if hi < len(data):
        parts.append((hi, view[hi:]))
    if lo > 0:
        parts.append((0, view[:lo]))
    return parts


class _Pusher:
    """A thread of its own that stores blocks in the kernel's page cache for `push_rest` and
    `push_mates`. Handing it a block costs a queue put, and a READ that waits for it one
    wake-up each way (about 100 µs here, where a trio worker thread's round trip cost about
    300 µs). The thread sets the `pushed` flags and bumps the push counters: it alone writes
    them. Its set of pending chunks is shared with the trio thread under a lock."""

    def __init__(self, notify: Callable[[int, int, Any], None], pushed: Any, counters: Any) -> None:
        self._notify = notify
        self._pushed = pushed
        self._counters = counters
        self._queue: queue.SimpleQueue[_PushJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: set[int] = set()  # chunks queued or being pushed
        self._bytes = 0
        self._thread: threading.Thread | None = None

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._pending

    def pending(self, cid: int) -> bool:
        with self._lock:
            return cid in self._pending

    def submit(
        self,
        inode: int,
        cid: int,
        base: int,
        parts: list[tuple[int, memoryview]],
        counter: int,
        *,
        wait: float = 0.0,
    ) -> bool:
        """Queue `parts` (offsets from `base`) of chunk `cid` of `inode`. With `wait`, block
        up to that many seconds for the push; returns whether it was queued (and, with
        `wait`, its first part done in time). A chunk already pending is not queued again."""
        nbytes = sum(len(part) for _, part in parts)
        with self._lock:
            if cid in self._pending or self._bytes + nbytes > REST_QUEUE_BYTES:
                return False
            self._pending.add(cid)
            self._bytes += nbytes
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fanfs-pusher", daemon=True)
            self._thread.start()
        done = threading.Event() if wait else None
        self._queue.put(_PushJob(inode, cid, base, parts, counter, nbytes, done))
        return done is None or done.wait(wait)

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._push(job)
            except Exception:  # a bug here must cost the push, never the mount
                log.exception("page cache push failed (reads are not affected)", extra=LOG_ONCE)
            finally:
                with self._lock:
                    self._pending.discard(job.cid)
                    self._bytes -= job.nbytes
                if job.done is not None:
                    job.done.set()

    def _push(self, job: _PushJob) -> None:
        for offset, part in job.parts:
            try:
                self._notify(job.inode, job.base + offset, part)
            except OSError as exc:  # ENOENT: the kernel has no inode for it yet
                log.debug("cannot push inode %d into the page cache: %s", job.inode, exc)
                return
            if job.done is not None:
                job.done.set()
        self._pushed[job.cid] = 1
        self._counters[job.counter] += 1


class _PushJob(NamedTuple):
    inode: int
    cid: int
    base: int
    parts: list[tuple[int, memoryview]]
    counter: int
    nbytes: int
    done: threading.Event | None


class CacheFiller:
    """Background fill: decodes this node's chunks in storage order (bulk sequential reads of
    the pack) into the shared MinIO cache, and, given `notify`, pushes each into the kernel's
    page cache too, so that a shuffled epoch finds them with no READ at all. Stops when the
    cache budget is spent (decoded objects kept, plus raw chunks pushed) or every chunk is
    done. Blocking; single-node mounts run it in a process of its own at the lowest CPU
    priority (mount/family.py), so it uses only cores the readers leave idle and never holds a
    serving process's GIL."""

    def __init__(
        self, store: ChunkStore, notify: Callable[[int, int, Any], None] | None = None
    ) -> None:
        self.store = store
        assert store.objects is not None, "the background fill needs an object cache"
        self.objects: ObjectCache = store.objects
        assert isinstance(self.objects, MinioCache)
        self.notify = notify
        self._pushed_raw = 0

    def run(self, stop: Callable[[], bool]) -> None:
        counters = self.store.shared.counters
        order, usizes, owners = self.order()
        csize = self.store.index.chunk_csize
        done = 0
        while done < len(order) and self._room() and not stop():
            batch, stored = [], 0
            while done < len(order) and stored < FILL_BATCH_BYTES:
                cid = int(order[done])
                done += 1
                if self.notify is not None or not self.objects.contains(cid):
                    batch.append((cid, int(usizes[cid]), int(owners[cid])))
                    stored += csize[cid]
            chunks, nbytes, pushed, full = self.fill(batch)
            counters[sh.FILL_CHUNKS] += chunks
            counters[sh.FILL_BYTES] += nbytes
            counters[sh.FILL_PUSHED] += pushed
            if full:
                break
        log.debug("background fill stopped after %d of %d chunks", done, len(order))

    def _room(self) -> bool:
        cached = int(self.objects.statistics()["cache_bytes"])
        return cached + self._pushed_raw < self.objects.budget

    def order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Chunk ids of this node's partitions in storage order, and every chunk's decoded
        size and file (entry id). 4-byte ids and sizes where they fit: at 10 M chunks these
        arrays live as long as the fill."""
        store = self.store
        index = store.index
        ids = np.int32 if index.chunk_count < 2**31 and index.entry_count < 2**31 else np.int64
        partitions = np.asarray(index.chunk_partition)
        local = np.flatnonzero(np.asarray(store.reader.local, dtype=bool)[partitions])
        offsets = np.asarray(index.chunk_offset)[local]
        order = local[np.lexsort((offsets, partitions[local]))].astype(ids)
        del local, offsets
        modes = np.asarray(index.mode)
        counts = np.asarray(index.count)
        files = np.flatnonzero(((modes & 0o170000) == stat.S_IFREG) & (counts > 0))
        reader = store.reader
        # Chunk sizes are at most 64 MiB (format.md section 13).
        usizes = chunk_usizes(
            np.asarray(index.size)[files],
            counts[files],
            reader.chunk_size,
            reader.block_size,
        ).astype(np.uint32)
        # The files' chunk ranges tile the chunk table in entry order (checked at open).
        owners = np.repeat(files.astype(ids), counts[files])
        return order, usizes, owners

    def fill(self, batch: list[tuple[int, int, int]]) -> tuple[int, int, int, bool]:
        """Decode `batch` into the cache (and push it). Corrupt or unreadable chunks are
        skipped (readers get their own error). Returns (chunks cached, their bytes, chunks
        pushed, budget spent)."""
        store = self.store
        objects = self.objects
        first = store.index.first
        chunks = nbytes = pushed = 0
        for cid, usize, entry in batch:
            if store.shared.is_broken(cid):
                continue
            data: bytes | memoryview | None = objects.get(cid)
            if data is None:
                try:
                    data, _ = store.load_and_decode(cid, usize)
                except Exception as exc:
                    log.debug("background fill skips chunk %d: %s", cid, exc)
                    continue
                # A raw chunk served from the partition's mapping (a decoded chunk may be a
                # memoryview too: an unshuffled one).
                if store.index.chunk_codec[cid] == CODEC_NONE and isinstance(data, memoryview):
                    if self.notify is None:
                        continue
                    self._pushed_raw += len(data)
                elif objects.put(cid, data):
                    chunks += 1
                    nbytes += len(data)
                elif not objects.contains(cid):
                    return chunks, nbytes, pushed, True  # no room left for it
            if self.notify is not None and not store.shared.pushed[cid]:
                try:
                    self.notify(entry + 1, (cid - first[entry]) * store.reader.unit(entry), data)
                    store.shared.pushed[cid] = 1
                    pushed += 1
                except OSError:  # the kernel does not know the file (yet): cache only
                    pass
            if not self._room():
                return chunks, nbytes, pushed, True
        return chunks, nbytes, pushed, False


def default_memory(available: int) -> int:
    """--prefetch-memory default: 1/32 of available memory, 64 MiB to 1 GiB."""
    return max(64 << 20, min(available // 32, 1 << 30))


def default_cache_memory(available: int) -> int:
    """--cache-memory default: 1/8 of available memory, at most 32 GiB."""
    return min(available // 8, 32 << 30)
