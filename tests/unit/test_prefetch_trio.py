"""The prefetcher under trio, driven through `Operations.read` as the kernel would drive it,
without a kernel (the middle layer of issue 13): a sequential reader's chunks are decoded
ahead exactly once and handed over (into the daemon's buffer, or pushed into the page cache
through a recording `notify`), and a hinted order is decoded ahead in that order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest
import trio
import trio.testing

from fanfs import shared as sh
from fanfs.format.reader import PackReader
from fanfs.operations import MountInfo, Operations
from fanfs.prefetch import Prefetcher
from fanfs.shared import SharedState
from fanfs.store import ChunkStore
from tests.conftest import run_fanfs
from tests.treegen import label_text, write_tree

CHUNK = 4096
BIG = label_text(40 * CHUNK, 7)
SMALL = {"small/s%03d.txt" % i: label_text(1000 + i, 100 + i) for i in range(60)}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_tree(tmp_path_factory.mktemp("prefetch") / "src", {"big.bin": BIG, **SMALL})
    out = src.parent / "p.fan"
    result = run_fanfs("pack", src, out, "-q", "--chunk-size", "4KiB", "--partitions", "1")
    assert result.returncode == 0, result.stderr
    return out


class Pushes:
    """A recording stand-in for pyfuse3.notify_store."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bytes]] = []

    def __call__(self, inode: int, offset: int, data: object) -> None:
        self.calls.append((inode, offset, bytes(data)))  # type: ignore[call-overload]


@pytest.fixture
def setup(
    pack: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Operations, Prefetcher, Pushes]]:
    into = request.param
    reader = PackReader(str(pack))
    reader.nowait_reads = False  # a cold disk: every load in a worker thread
    shared = SharedState(processes=1, partitions=1, chunks=reader.index.chunk_count)
    store = ChunkStore(reader, shared, buffer_budget=8 << 20, thread_limit=2)
    ops = Operations(store, noopen=True, info=MountInfo(pack=str(pack)))
    pushes = Pushes()
    ops.prefetcher = Prefetcher(store, memory=8 << 20, into=into, notify=pushes)
    yield ops, ops.prefetcher, pushes
    reader.close()


async def lookup(ops: Operations, rel: str) -> int:
    inode = pyfuse3.ROOT_INODE
    for name in rel.encode().split(b"/"):
        inode = (await ops.lookup(inode, name)).st_ino
        assert inode, rel
    return inode


async def settle(ops: Operations) -> None:
    """Let the workers finish what they queued (they decode and push in worker threads,
    which `wait_all_tasks_blocked` does not wait for): until nothing is queued, no worker is
    busy and every chunk issued has landed somewhere."""
    c = ops.shared.counters
    landed = (
        sh.PREFETCH_BUFFERED,
        sh.PREFETCH_PUSHED,
        sh.PREFETCH_CACHED,
        sh.PREFETCH_FAILED,
        sh.PREFETCH_DROPPED,
    )
    prefetcher = ops.prefetcher
    assert prefetcher is not None
    with trio.move_on_after(30):  # a bound for a loaded machine, not a timing
        # Queued but not taken yet counts too: a worker may not have run since the READ.
        while not prefetcher.idle or c[sh.PREFETCH_ISSUED] > sum(c[k] for k in landed):  # noqa: ASYNC110
            await trio.sleep(0.005)
    await trio.testing.wait_all_tasks_blocked()


def decodes(ops: Operations) -> int:
    counters = ops.shared.counters
    return counters[sh.THREAD_DECODES] + counters[sh.INLINE_DECODES]


@pytest.mark.parametrize("setup", ["daemon"], indirect=True)
def test_a_sequential_reader_is_served_from_read_ahead(
    setup: tuple[Operations, Prefetcher, Pushes],
) -> None:
    ops, prefetcher, _ = setup

    async def main() -> bytes:
        inode = await lookup(ops, "big.bin")
        got = bytearray()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(prefetcher.run)
            for k in range(40):
                got += await ops.read(inode, k * CHUNK, CHUNK)
                await settle(ops)  # the workers' turn
            nursery.cancel_scope.cancel()
        return bytes(got)

    assert trio.run(main) == BIG
    counters = ops.shared.counters
    assert counters[sh.PREFETCH_BUFFERED] >= 30  # all but the first few, which confirm the stream
    assert counters[sh.PREFETCH_USED] == counters[sh.PREFETCH_BUFFERED]  # none wasted
    assert decodes(ops) == 40  # every chunk decoded exactly once, by a reader or ahead of it


@pytest.mark.parametrize("setup", ["kernel"], indirect=True)
def test_read_ahead_into_the_page_cache_pushes_the_right_bytes_once(
    setup: tuple[Operations, Prefetcher, Pushes],
) -> None:
    ops, prefetcher, pushes = setup

    async def main() -> int:
        inode = await lookup(ops, "big.bin")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(prefetcher.run)
            for k in range(4):  # enough to confirm a sequential stream
                await ops.read(inode, k * CHUNK, CHUNK)
                await settle(ops)
            nursery.cancel_scope.cancel()
        return inode

    inode = trio.run(main)
    assert pushes.calls, "nothing was read ahead"
    offsets = [offset for _, offset, _ in pushes.calls]
    assert len(set(offsets)) == len(offsets)  # never pushed twice
    for pushed_inode, offset, data in pushes.calls:
        assert pushed_inode == inode
        assert offset % CHUNK == 0 and offset >= 4 * CHUNK
        assert data == BIG[offset : offset + CHUNK]
    assert ops.shared.counters[sh.PREFETCH_PUSHED] == len(pushes.calls)


@pytest.mark.parametrize("setup", ["daemon"], indirect=True)
def test_a_hinted_order_is_decoded_ahead_in_that_order(
    setup: tuple[Operations, Prefetcher, Pushes],
) -> None:
    ops, prefetcher, _ = setup
    order = sorted(SMALL, reverse=True)  # not the storage order

    async def main() -> list[bytes]:
        inodes = [await lookup(ops, rel) for rel in order]
        prefetcher.set_hints([inode - 1 for inode in inodes])
        got = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(prefetcher.run)
            for position, inode in enumerate(inodes):
                got.append(bytes(await ops.read(inode, 0, 1 << 20)))
                await settle(ops)
                if position == 0:  # the first READ starts the prefetcher: the window fills
                    assert ops.shared.counters[sh.PREFETCH_BUFFERED] > 0
            nursery.cancel_scope.cancel()
        return got

    assert trio.run(main) == [SMALL[rel] for rel in order]
    counters = ops.shared.counters
    assert counters[sh.PREFETCH_USED] == len(order) - 1  # all but the first were ready
    assert decodes(ops) == len(order)
