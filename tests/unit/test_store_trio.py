"""`ChunkStore` under trio, without a kernel or mpirun (the middle layer of issue 13): the
races of the read path (many readers of one chunk, a reader cancelled while it loads, a
peer that fails, a corrupt chunk seen by two serving processes) show up here in
milliseconds instead of in a mount."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

from fanfs import shared as sh
from fanfs.errors import ChecksumError, CorruptDataError, KnownCorruptError, RemoteReadError
from fanfs.format.layout import partition_name
from fanfs.format.reader import PackReader
from fanfs.mount.preload import MAP_POLL_MAX_S, map_preloaded
from fanfs.shared import SHARED_BLOCK_MAX, SHARED_BLOCKS_BYTES, SharedBlocks, SharedState
from fanfs.store import ChunkStore
from tests.conftest import entry_at, open_reader, run_fanfs
from tests.pagecache import drop_from_page_cache
from tests.treegen import label_text, write_tree

CHUNK = 64 * 1024
FILES = {"d%d/f%02d.bin" % (i % 2, i): label_text(3 * CHUNK + 1000, i) for i in range(8)}
READERS = 16


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_tree(tmp_path_factory.mktemp("store") / "src", FILES)
    out = src.parent / "p.fan"
    result = run_fanfs("pack", src, out, "-q", "--partitions", "2", "--chunk-size", "64KiB")
    assert result.returncode == 0, result.stderr
    return out


def expected_chunk(rel: str, chunk_no: int) -> bytes:
    return FILES[rel][chunk_no * CHUNK : (chunk_no + 1) * CHUNK]


def make_store(reader: PackReader, shared: SharedState | None = None, **kw: object) -> ChunkStore:
    """A store over partitions not preloaded, read as from a cold disk: in a worker thread
    (the pack just written is in the page cache, which the store would otherwise read from
    on the trio thread: `test_chunks_in_the_page_cache_are_decoded_without_a_thread`; and an
    idle store reads on the trio thread unless `inline_reads=False`, the default here, so
    that loads overlap as they do in a busy process)."""
    reader.nowait_reads = False
    kw.setdefault("inline_reads", False)
    shared = shared or SharedState(
        processes=2, partitions=len(reader.partitions), chunks=reader.index.chunk_count
    )
    return ChunkStore(reader, shared, buffer_budget=0, thread_limit=4, **kw)  # type: ignore[arg-type]


def in_partition(reader: PackReader, number: int) -> tuple[str, int]:
    """A file and a chunk number of it stored in partition `number`."""
    for rel in FILES:
        first = reader.index.first[entry_at(reader, rel)]
        for k in range(4):
            if reader.index.chunk_partition[first + k] == number:
                return rel, k
    raise AssertionError("no chunk in partition %d" % number)


async def read_all(store: ChunkStore, entry: int, chunk_no: int, n: int) -> list[object]:
    """`n` concurrent readers of one chunk: each gets bytes or the exception it raised."""
    results: list[object] = [None] * n

    async def one(i: int) -> None:
        try:
            results[i] = bytes(await store.chunk(entry, chunk_no, whole=True))
        except Exception as exc:
            results[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return results


def test_concurrent_readers_of_one_chunk_share_one_load(pack: Path) -> None:
    reader = open_reader(pack)
    store = make_store(reader)
    rel = "d1/f03.bin"
    results = trio.run(read_all, store, entry_at(reader, rel), 1, READERS)
    assert results == [expected_chunk(rel, 1)] * READERS
    counters = store.shared.counters
    assert counters[sh.CHUNK_READS] == READERS
    assert counters[sh.THREAD_DECODES] == 1  # one pread and decode for all of them
    assert counters[sh.BYTES_DECODED] == CHUNK


class Peer:
    """A ChunkSource standing in for the MPI path: answers from the pack's own partition
    files once `release` is set, or fails with RemoteReadError while `failing`."""

    def __init__(self, pack: Path) -> None:
        self.pack = pack
        self.calls = 0
        self.failing = False
        self.release = trio.Event()

    async def fetch(self, partition: int, offset: int, length: int) -> bytes:
        self.calls += 1
        await self.release.wait()
        if self.failing:
            raise RemoteReadError("no owner of partition %d answered" % partition)
        data = (self.pack / partition_name(partition)).read_bytes()
        return data[offset : offset + length]


def remote_setup(pack: Path) -> tuple[ChunkStore, Peer, int, str, int]:
    """A store whose partition 1 lives on "another node": (store, peer, entry, rel, chunk
    number) of a chunk there."""
    reader = PackReader(str(pack), local={0})
    peer = Peer(pack)
    store = make_store(reader, remote=peer)
    rel, k = in_partition(reader, 1)
    return store, peer, entry_at(reader, rel), rel, k


def test_remote_readers_share_one_fetch(pack: Path) -> None:
    store, peer, entry, rel, k = remote_setup(pack)

    async def main() -> list[object]:
        async with trio.open_nursery() as nursery:
            results: list[object] = []

            async def readers() -> None:
                results.extend(await read_all(store, entry, k, READERS))

            nursery.start_soon(readers)
            await trio.testing.wait_all_tasks_blocked()
            assert peer.calls == 1  # everyone else joined the first fetch
            peer.release.set()
        return results

    assert trio.run(main) == [expected_chunk(rel, k)] * READERS
    assert peer.calls == 1
    store.reader.close()


def test_a_failed_remote_fetch_fails_its_readers_and_is_not_remembered(pack: Path) -> None:
    store, peer, entry, rel, k = remote_setup(pack)
    peer.failing = True
    peer.release.set()
    results = trio.run(read_all, store, entry, k, 4)
    assert all(isinstance(r, RemoteReadError) for r in results), results
    cid = store.index.first[entry] + k
    assert {str(r) for r in results} == {
        "%s (chunk %d, partition 1, offset %d): no owner of partition 1 answered"
        % (rel, k, store.index.chunk_offset[cid])
    }
    assert peer.calls == 1
    # Transient: the next read asks again, and gets the data once the peer answers.
    peer.failing = False
    assert trio.run(read_all, store, entry, k, 1) == [expected_chunk(rel, k)]
    assert peer.calls == 2
    assert store.shared.counters[sh.CORRUPT_CHUNKS] == 0
    store.reader.close()


def test_a_cancelled_loader_does_not_strand_the_readers_that_joined_it(pack: Path) -> None:
    """The reader that started a fetch is interrupted (a signal, a FUSE INTERRUPT); the
    readers waiting for its flight must load the chunk themselves, not hang or fail."""
    store, peer, entry, rel, k = remote_setup(pack)

    async def main() -> list[object]:
        results: list[object] = []
        async with trio.open_nursery() as nursery:
            first = trio.CancelScope()

            async def owner() -> None:
                with first:
                    await store.chunk(entry, k, whole=True)

            async def joiners() -> None:
                results.extend(await read_all(store, entry, k, 3))

            nursery.start_soon(owner)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(joiners)
            await trio.testing.wait_all_tasks_blocked()
            first.cancel()
            await trio.testing.wait_all_tasks_blocked()
            peer.release.set()
        return results

    assert trio.run(main) == [expected_chunk(rel, k)] * 3
    assert peer.calls == 2  # the cancelled fetch, then one for the three joiners
    store.reader.close()


@pytest.fixture
def damaged(pack: Path, tmp_path: Path) -> tuple[Path, int, str]:
    """A copy of the pack with one stored byte of one chunk flipped: (pack, chunk id, rel)."""
    copy = tmp_path / "damaged.fan"
    shutil.copytree(pack, copy)
    reader = PackReader(str(copy))
    rel = "d0/f04.bin"
    cid = reader.index.first[entry_at(reader, rel)] + 1
    path = copy / partition_name(int(reader.index.chunk_partition[cid]))
    offset = int(reader.index.chunk_offset[cid]) + int(reader.index.chunk_csize[cid]) // 2
    reader.close()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    return copy, cid, rel


@pytest.mark.parametrize("preloaded", [False, True], ids=["pread", "preloaded"])
def test_a_corrupt_chunk_fails_every_reader_and_is_loaded_once(
    damaged: tuple[Path, int, str], preloaded: bool
) -> None:
    copy, cid, rel = damaged
    reader = open_reader(copy)
    shared = SharedState(
        processes=2, partitions=len(reader.partitions), chunks=reader.index.chunk_count
    )
    if preloaded:
        reader.reserve_memory(range(len(reader.partitions)))
        make_store(reader, shared).preload(threading.Event())
    store = make_store(reader, shared)
    entry = entry_at(reader, rel)
    results = trio.run(read_all, store, entry, 1, 4)
    message = "checksum mismatch in %s (chunk 1, partition %d, offset %d)" % (
        rel,
        reader.index.chunk_partition[cid],
        reader.index.chunk_offset[cid],
    )
    assert [type(r) for r in results] == [ChecksumError] * 4, results
    assert {str(r) for r in results} == {message}
    counters = shared.counters
    decodes = counters[sh.THREAD_DECODES] + counters[sh.INLINE_DECODES]
    assert counters[sh.CORRUPT_CHUNKS] == 1 and shared.is_broken(cid)
    # Later reads fail at once from what was remembered: no new load.
    again = trio.run(read_all, store, entry, 1, 2)
    assert [str(r) for r in again] == [message] * 2
    assert counters[sh.THREAD_DECODES] + counters[sh.INLINE_DECODES] == decodes
    # Another serving process (its own store, the same shared state) fails without I/O.
    other = make_store(reader, shared)
    shared.use_slot(1)
    (known,) = trio.run(read_all, other, entry, 1, 1)
    assert isinstance(known, KnownCorruptError)
    assert str(known) == "corrupt data in %s (chunk 1, partition %d, offset %d)" % (
        rel,
        reader.index.chunk_partition[cid],
        reader.index.chunk_offset[cid],
    )
    assert shared.totals()["corrupt_chunks"] == 1
    # The file's other chunks are unaffected.
    assert trio.run(read_all, other, entry, 2, 1) == [expected_chunk(rel, 2)]


def test_counters_do_not_depend_on_the_readers_interleaving(pack: Path) -> None:
    """Every chunk of every file read by two groups of readers in opposite orders: each
    chunk is decoded exactly once per store, and every reader gets the right bytes."""
    reader = open_reader(pack)
    store = make_store(reader)
    work = [(rel, k) for rel in sorted(FILES) for k in range(4)]
    got: dict[tuple[str, int, int], bytes] = {}

    async def group(order: list[tuple[str, int]], tag: int) -> None:
        for rel, k in order:
            got[rel, k, tag] = bytes(await store.chunk(entry_at(reader, rel), k, whole=True))
            await trio.lowlevel.checkpoint()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(group, work, 0)
            nursery.start_soon(group, work[::-1], 1)

    trio.run(main)
    for (rel, k, _), data in got.items():
        assert data == FILES[rel][k * CHUNK : (k + 1) * CHUNK]
    assert len(got) == 2 * len(work)
    # buffer_budget=0: nothing is kept, so a chunk is decoded again only when the two groups
    # did not overlap on it; never more than once per reader.
    assert len(work) <= store.shared.counters[sh.THREAD_DECODES] <= 2 * len(work)


def test_chunks_in_the_page_cache_are_decoded_without_a_thread(pack: Path) -> None:
    """A partition that is not preloaded but is in the kernel's page cache is read without
    waiting for the disk (RWF_NOWAIT) and decoded on the trio thread, as a preloaded one is;
    once the kernel has dropped it, the read goes to a worker thread."""
    reader = open_reader(pack)
    store = make_store(reader)
    reader.nowait_reads = True
    rel = "d0/f02.bin"
    entry = entry_at(reader, rel)
    cid = reader.index.first[entry]
    number = reader.index.chunk_partition[cid]
    fd = os.open(pack / partition_name(number), os.O_RDONLY)
    try:
        os.pread(fd, 1 << 30, 0)  # the whole partition into the page cache
        counters = store.shared.counters
        assert bytes(trio.run(partial(store.chunk, whole=True), entry, 0)) == expected_chunk(rel, 0)
        assert (counters[sh.INLINE_DECODES], counters[sh.THREAD_DECODES]) == (1, 0)
        # Dropped, read again: a worker thread. (Up to three tries: the kernel once had the
        # pages back between the drop, checked with mincore, and the read, in one CI run of
        # many; a store that never leaves the trio thread fails all three.)
        for _ in range(3):
            inline = counters[sh.INLINE_DECODES]
            drop_from_page_cache(fd)
            data = trio.run(partial(store.chunk, whole=True), entry, 0)
            assert bytes(data) == expected_chunk(rel, 0)
            if counters[sh.THREAD_DECODES]:
                break
            assert counters[sh.INLINE_DECODES] == inline + 1
        assert counters[sh.THREAD_DECODES] == 1
    finally:
        os.close(fd)


def test_an_idle_process_reads_from_the_disk_without_a_thread(pack: Path) -> None:
    """A reader's chunk that is not in memory, with nothing else in flight in the process,
    is read and decoded on the trio thread; a reader that comes while a prefetch is in
    flight goes to a worker thread, as does the prefetch itself."""
    reader = open_reader(pack)
    store = make_store(reader, inline_reads=True)
    counters = store.shared.counters
    rel = "d1/f05.bin"
    entry = entry_at(reader, rel)
    assert bytes(trio.run(partial(store.chunk, whole=True), entry, 0)) == expected_chunk(rel, 0)
    assert (counters[sh.INLINE_READS], counters[sh.THREAD_DECODES]) == (1, 0)

    async def during_a_prefetch() -> bytes:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(store.prefetch, push=False), entry, 1, store.limiter)
            while not store.is_pending(reader.index.first[entry] + 1):
                await trio.lowlevel.checkpoint()  # until the prefetch is in its thread
            data = bytes(await store.chunk(entry, 2, whole=True))
        return data

    assert trio.run(during_a_prefetch) == expected_chunk(rel, 2)
    assert (counters[sh.INLINE_READS], counters[sh.THREAD_DECODES]) == (1, 2)
    assert bytes(trio.run(partial(store.chunk, whole=True), entry, 1)) == expected_chunk(rel, 1)
    assert counters[sh.THREAD_DECODES] == 2  # the prefetched chunk was kept: no load at all


def test_slow_disk_reads_go_back_to_threads(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inline reads that average above INLINE_READ_SLOW_NS send the next
    INLINE_READ_BACKOFF reads to worker threads; then one read is tried inline again, and
    a fast one brings the inline reads back."""
    monkeypatch.setattr("fanfs.store.INLINE_READ_BACKOFF", 3)
    reader = open_reader(pack)
    store = make_store(reader, inline_reads=True)
    counters = store.shared.counters
    read_stored = reader.read_stored
    slow = [True]

    def timed_read(chunk: int) -> bytes:
        if slow[0]:
            time.sleep(0.012)  # 3x INLINE_READ_SLOW_NS
        return read_stored(chunk)

    monkeypatch.setattr(reader, "read_stored", timed_read)
    chunks = [(rel, k) for rel in sorted(FILES) for k in range(4)]

    def read(n: int) -> list[int]:
        """Read the next `n` chunks one at a time: (inline reads, thread decodes) after."""
        for rel, k in chunks[:n]:
            got = bytes(trio.run(partial(store.chunk, whole=True), entry_at(reader, rel), k))
            assert got == expected_chunk(rel, k)
        del chunks[:n]
        return [counters[sh.INLINE_READS], counters[sh.THREAD_DECODES]]

    # 12 ms, then an average of 3 and 5.25 ms: off after the second read.
    assert read(2) == [2, 0]
    assert read(3) == [2, 3]  # the back-off
    assert read(1) == [3, 3]  # a probe, slow again
    assert read(3) == [3, 6]
    slow[0] = False
    assert read(1) == [4, 6]  # a fast probe
    assert read(2) == [6, 6]


def test_an_inline_read_error_is_an_error_of_the_file(
    pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk error on the trio thread is the reader's EIO (a CorruptDataError naming the
    file), as in a worker thread."""
    reader = open_reader(pack)
    store = make_store(reader, inline_reads=True)

    def failing(chunk: int) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(reader, "read_stored", failing)
    rel = "d0/f04.bin"
    cid = reader.index.first[entry_at(reader, rel)]
    with pytest.raises(CorruptDataError) as info:
        trio.run(partial(store.chunk, whole=True), entry_at(reader, rel), 0)
    assert str(info.value) == (
        "cannot read the pack: Input/output error in %s (chunk 0, partition %d, offset %d)"
        % (rel, reader.index.chunk_partition[cid], reader.index.chunk_offset[cid])
    )
    assert store.shared.counters[sh.INLINE_READS] == 1


SOLID_FILES = {"s/%02d.txt" % i: label_text(300 + 41 * i, 50 + i) for i in range(24)}


@pytest.fixture(scope="module")
def solid_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_tree(tmp_path_factory.mktemp("solid") / "src", SOLID_FILES)
    out = src.parent / "p.fan"
    args = ("--chunk-size", "16KiB", "--solid-block", "8KiB")
    result = run_fanfs("pack", src, out, "-q", *args)
    assert result.returncode == 0, result.stderr
    return out


def test_block_mates_are_the_other_files_of_a_decoded_block_once(solid_pack: Path) -> None:
    """`block_mates`: after a read decodes a solid block, the block's other files with their
    own bytes, once per block; files already pushed are left out; nothing for a block this
    process has not decoded."""
    reader = open_reader(solid_pack)
    store = make_store(reader)
    index = reader.index
    cids = {rel: index.first[entry_at(reader, rel)] for rel in SOLID_FILES}
    blocks: dict[tuple[int, ...], list[str]] = {}
    for rel, cid in cids.items():
        assert index.chunk_bsize[cid], rel
        blocks.setdefault(index.block_key(cid), []).append(rel)
    members = max(blocks.values(), key=len)
    assert len(members) >= 3 and len(blocks) >= 2
    one, pushed, *_ = members
    assert store.block_mates(cids[one]) == []  # not decoded yet
    store.shared.pushed[cids[pushed]] = 1
    trio.run(partial(store.chunk, whole=True), entry_at(reader, one), 0)
    mates = store.block_mates(cids[one])
    got = {index.path(entry).decode(): bytes(data) for entry, data in mates}
    assert got == {rel: SOLID_FILES[rel] for rel in members if rel not in (one, pushed)}
    assert store.block_mates(cids[one]) == []
    assert store.block_mates(cids[members[-1]]) == []  # the same block: handled


def _solid_blocks(reader: PackReader) -> dict[tuple[int, ...], list[str]]:
    """SOLID_FILES by the solid block that holds each."""
    index = reader.index
    blocks: dict[tuple[int, ...], list[str]] = {}
    for rel in SOLID_FILES:
        cid = index.first[entry_at(reader, rel)]
        assert index.chunk_bsize[cid], rel
        blocks.setdefault(index.block_key(cid), []).append(rel)
    return blocks


def _two_processes(reader: PackReader) -> SharedState:
    """The shared state of a mount of `reader`'s pack served by two processes."""
    index = reader.index
    return SharedState(
        processes=2,
        partitions=len(reader.partitions),
        chunks=index.chunk_count,
        solid_block_bytes=int(index.arrays["bsize"].max()),
    )


def test_a_block_another_process_decoded_is_sliced_from_its_copy(solid_pack: Path) -> None:
    """Serving processes share decoded solid blocks (`SharedBlocks`): a file whose block
    another process decoded reads back from that process's copy with no decode here (counted
    as `solid_shared`); a file of a block no process decoded is decoded."""
    reader = open_reader(solid_pack)
    index = reader.index
    shared = _two_processes(reader)
    blocks = list(_solid_blocks(reader).values())
    (one, mate, *_), other = blocks[0], blocks[1]
    first = make_store(reader, shared)
    trio.run(partial(first.chunk, whole=True), entry_at(reader, one), 0)
    assert shared.counters[sh.SOLID_BYTES] > 0
    shared.use_slot(1)  # as the other serving process, after the fork
    second = make_store(reader, shared)
    got = trio.run(partial(second.chunk, whole=True), entry_at(reader, mate), 0)
    assert bytes(got) == SOLID_FILES[mate]
    assert shared.counters[sh.SOLID_BYTES] == 0
    assert shared.counters[sh.SOLID_HITS] == 1
    assert shared.counters[sh.SOLID_SHARED] == 1
    got = trio.run(partial(second.chunk, whole=True), entry_at(reader, other[0]), 0)
    assert bytes(got) == SOLID_FILES[other[0]]
    assert (
        shared.counters[sh.SOLID_BYTES]
        == index.chunk_bsize[index.first[entry_at(reader, other[0])]]
    )
    assert shared.counters[sh.SOLID_SHARED] == 1


def test_publishing_a_block_is_not_counted_as_its_decode(
    solid_pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`decode_ns` counts a solid block's verifying and decoding, what the plan predicts, not
    keeping and publishing it for the other processes (copies of the block)."""
    reader = open_reader(solid_pack)
    shared = _two_processes(reader)
    published = []

    def slow_publish(key: tuple[int, ...], block: bytes) -> bool:
        end = time.thread_time() + 0.05  # 50 ms of this thread's CPU
        while time.thread_time() < end:
            pass
        published.append(key)
        return True

    assert shared.blocks is not None
    monkeypatch.setattr(shared.blocks, "publish", slow_publish)
    store = make_store(reader, shared)
    one = next(iter(_solid_blocks(reader).values()))[0]
    got = trio.run(partial(store.chunk, whole=True), entry_at(reader, one), 0)
    assert bytes(got) == SOLID_FILES[one] and len(published) == 1
    assert 0 < shared.counters[sh.DECODE_NS] < 25_000_000


def test_a_file_whose_block_is_decoded_is_a_hit_not_a_decode(solid_pack: Path) -> None:
    """Once a read has decoded a solid block, read-ahead of the block's other files slices
    them from it on the trio thread (no thread hand-off, no load), counted as solid hits;
    decode_ns counts the block's decode only, whichever path slices a file (before, each
    prefetched file loaded the stored block again and was timed as a decode in a thread)."""
    reader = open_reader(solid_pack)
    store = make_store(reader)
    counters = store.shared.counters
    (one, *mates), (other, *_) = list(_solid_blocks(reader).values())[:2]
    trio.run(partial(store.chunk, whole=True), entry_at(reader, one), 0)
    decode_ns, threads = counters[sh.DECODE_NS], counters[sh.THREAD_DECODES]
    assert decode_ns > 0 and threads == 1

    async def prefetch(rels: list[str]) -> list[tuple[int, int, bytes | memoryview]]:
        jobs = [(entry_at(reader, rel), 0) for rel in rels]
        return await store.prefetch_local(jobs, trio.CapacityLimiter(2), push=True)

    loaded = trio.run(prefetch, mates)
    assert {reader.index.path(e).decode(): bytes(d) for e, _, d in loaded} == {
        rel: SOLID_FILES[rel] for rel in mates
    }
    assert counters[sh.SOLID_HITS] == len(mates)
    assert (counters[sh.DECODE_NS], counters[sh.THREAD_DECODES]) == (decode_ns, threads)
    index = reader.index
    cid = index.first[entry_at(reader, mates[0])]
    data, ns = store.load_and_decode(cid, len(SOLID_FILES[mates[0]]))
    assert (bytes(data), ns) == (SOLID_FILES[mates[0]], 0)
    cid = index.first[entry_at(reader, other)]
    data, ns = store.load_and_decode(cid, len(SOLID_FILES[other]))
    assert bytes(data) == SOLID_FILES[other] and ns > 0


def test_a_thread_waits_for_the_block_another_thread_is_decoding(solid_pack: Path) -> None:
    """Read-ahead and a READ of two files of one solid block at once: the second waits for the
    first's decode and slices it, rather than decode the block again."""
    reader = open_reader(solid_pack)
    store = make_store(reader)
    index = reader.index
    one, mate, *_ = max(_solid_blocks(reader).values(), key=len)
    cid, mate_cid = (index.first[entry_at(reader, rel)] for rel in (one, mate))
    key = index.block_key(cid)
    assert store._solid.claim(key) is None  # as a decode of the block in flight
    out: list[bytes | memoryview] = []
    waiter = threading.Thread(
        target=lambda: out.append(store.load_and_decode(mate_cid, len(SOLID_FILES[mate]))[0])
    )
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive() and not out
    store._decode_block(cid, reader.read_stored(cid), key)  # the decode in flight ends
    decoded = store._solid.decoded_bytes
    store._solid.release(key)
    waiter.join(5)
    assert [bytes(data) for data in out] == [SOLID_FILES[mate]]
    assert store._solid.decoded_bytes == decoded == index.chunk_bsize[cid]


def test_shared_blocks_give_only_what_another_process_published() -> None:
    """`SharedBlocks`: a slice of a block another process published; None for this process's
    own segment, another key in the same slot, bytes past the block's end, or a segment whose
    lock is held; a block larger than a slot is not published."""
    blocks = SharedBlocks(processes=3, block_bytes=SHARED_BLOCK_MAX)  # 4 slots a process
    key = (0, 4096, 20, 1, 0, 50)
    block = bytes(range(50))
    assert blocks.publish(key, block)
    assert blocks.slice(key, 10, 5) is None  # its own
    blocks.use_slot(2)
    assert blocks.slice(key, 10, 5) == block[10:15]
    assert blocks.slice(key, 45, 5) == block[45:]
    assert blocks.slice(key, 46, 5) is None
    assert blocks.slice((0, 4096, 20, 1, 0, 51), 0, 1) is None
    others = [k for k in ((0, o, 20, 1, 0, 50) for o in range(64)) if k != key]
    clash = next(k for k in others if hash(k) % blocks.slots == hash(key) % blocks.slots)
    blocks.use_slot(0)
    assert blocks.publish(clash, block[::-1])
    assert not blocks.publish(key, bytes(SHARED_BLOCK_MAX + 1))
    blocks.use_slot(1)
    assert blocks.slice(key, 0, 1) is None  # overwritten by the other key
    assert blocks.slice(clash, 0, 3) == block[::-1][:3]
    blocks._locks[0].acquire()
    try:
        assert blocks.slice(clash, 0, 3) is None
        blocks.use_slot(0)
        assert not blocks.publish(key, block)
    finally:
        blocks._locks[0].release()


def _rss_shmem() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("RssShmem:"))
    return int(line.split()[1]) * 1024


def test_shared_blocks_are_in_memory_before_the_first_publish() -> None:
    """A `SharedBlocks` mapping is populated when it is made, before the fork: else each
    publish of a block into a slot not written before takes a page fault per page in the
    decoding thread (a third of a Ruby doc block's decode on the real dataset)."""
    before = _rss_shmem()
    blocks = SharedBlocks(processes=2, block_bytes=128 * 1024)
    assert _rss_shmem() - before >= 2 * SHARED_BLOCKS_BYTES
    del blocks


def _faults_in_child(work: Callable[[], Callable[[], object]]) -> int:
    """The minor page faults a forked process takes in the second step of `work`: `work()`
    (the set-up, untimed) returns the step to count."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            step = work()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            os.write(write_end, str(faults).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        got = os.read(read_end, 64)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and got
    return int(got)


BLOCK = bytes(range(256)) * 512  # 128 KiB


def test_a_forked_process_publishes_into_mapped_pages() -> None:
    """A forked process inherits none of a shared mapping's page tables: without mapping
    its segment first (`SharedBlocks.use_slot`), each page of a block it publishes faults in
    (62-77 us for a 128 KiB block here, against 8 us)."""
    blocks = SharedBlocks(processes=2, block_bytes=len(BLOCK))

    def publish_all() -> None:
        for n in range(8):
            assert blocks.publish((n, 0, 0, 0, 0, 0), BLOCK)

    def mapped() -> Callable[[], object]:
        blocks.use_slot(1)
        return publish_all

    def unmapped() -> Callable[[], object]:
        blocks._own = 1  # (use_slot without its mapping: the faults it saves)
        return publish_all

    # (about 260 unmapped, 30 mapped here: the rest are the child's copy-on-write faults)
    pages = 8 * len(BLOCK) // 4096
    assert _faults_in_child(unmapped) >= pages // 2  # (two blocks may share a slot)
    assert _faults_in_child(mapped) <= pages // 4


def test_a_forked_process_maps_a_partition_copy_before_serving_it(tmp_path: Path) -> None:
    """`PackReader.map_copy` maps a partition's copy, loaded by another process, into this
    one's page tables: reading it afterwards takes no page faults, where reading it unmapped
    takes one per 16 pages or so (fault-around), about a third of serving a raw chunk."""
    src = write_tree(tmp_path / "src", {"noise.bin": os.urandom(4 << 20)})
    result = run_fanfs("pack", src, tmp_path / "p.fan", "-q", "--partitions", "1")
    assert result.returncode == 0, result.stderr
    reader = open_reader(tmp_path / "p.fan")
    numbers = [n for n in range(len(reader.partitions)) if reader.local[n]]
    assert reader.reserve_memory(numbers) > 0
    for n in numbers:
        assert reader.load_partition(n, lambda: False)
    number = max(numbers, key=lambda n: reader.partitions[n]["size"])
    view = reader._memory[number]
    assert view is not None and len(view) >= 4 << 20  # (stored raw)

    def touch() -> None:
        assert sum(view[i] for i in range(0, len(view), 4096)) >= 0

    def mapped() -> Callable[[], object]:
        assert reader.map_copy(number)
        return touch

    # (about 80 unmapped, 14 mapped here: the rest are the child's copy-on-write faults)
    pages = len(view) // 4096
    mapped_faults = _faults_in_child(mapped)
    assert mapped_faults <= pages // 32
    assert _faults_in_child(lambda: touch) >= mapped_faults + pages // 32


def test_serving_processes_map_each_preloaded_partition_once_it_is_resident() -> None:
    """`map_preloaded` (the serving processes but the first): each reserved partition is
    mapped once the first process marks it resident, in the order they become so, and the
    task ends once all are; a kernel that cannot map them ends it at the first refusal."""

    class Reader:
        def __init__(self, resident: bytearray, refuse: bool) -> None:
            self.resident = resident
            self.mapped: list[tuple[int, bytes]] = []  # (partition, the flags then)
            self.refuse = refuse

        def reserved(self, number: int) -> bool:
            return number != 1

        def map_copy(self, number: int) -> bool:
            self.mapped.append((number, bytes(self.resident)))
            return not self.refuse

    class Store:
        def __init__(self, refuse: bool) -> None:
            self.shared = type("Shared", (), {"resident": bytearray(4)})()
            self.reader = Reader(self.shared.resident, refuse)

    async def main(store: Store) -> float:
        async def load() -> None:
            for number, at in ((2, 1.0), (0, 3.0), (3, 40.0)):
                await trio.sleep_until(at)
                store.shared.resident[number] = 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(load)
            await map_preloaded(store)
            done = trio.current_time()
            nursery.cancel_scope.cancel()
        return done

    store = Store(refuse=False)
    done = trio.run(main, store, clock=trio.testing.MockClock(autojump_threshold=0))
    # (the mock clock may run on while a mapping is in its thread: flags may be set since)
    assert [n for n, _ in store.reader.mapped] == [2, 0, 3]
    assert all(flags[n] for n, flags in store.reader.mapped)
    assert 40.0 <= done <= 40.0 + MAP_POLL_MAX_S
    refused = Store(refuse=True)
    trio.run(main, refused, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [n for n, _ in refused.reader.mapped] == [2]  # (0 and 3 became resident later)


def test_a_decode_trace_is_written_only_as_a_new_file(
    pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FANFS_DECODE_TRACE is written by a mount running as root: never through a symlink
    someone left at its path, never over an existing file."""
    monkeypatch.setenv("FANFS_DECODE_TRACE", str(tmp_path / "trace"))
    reader = open_reader(pack)
    store = make_store(reader)
    rel = "d0/f02.bin"
    entry = entry_at(reader, rel)
    assert bytes(trio.run(partial(store.chunk, whole=True), entry, 0)) == expected_chunk(rel, 0)
    path = tmp_path / ("trace.%d" % os.getpid())
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    path.symlink_to(victim)
    assert store.write_decode_trace() is None
    assert victim.read_bytes() == b"keep"
    path.unlink()
    assert store.write_decode_trace() == str(path)
    pairs = np.fromfile(path, dtype=np.int64).reshape(-1, 2)
    assert pairs[:, 0].tolist() == [reader.index.first[entry]] and pairs[0, 1] > 0
    assert store.write_decode_trace() is None  # (it exists now)
