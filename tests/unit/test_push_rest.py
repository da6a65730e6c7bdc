"""A block read in part is pushed into the page cache around the READ's pages, under trio and
without a kernel (a recording `notify` in the pusher's thread): a reader that comes back to
the block before its push lands does not push it again, a reader that keeps doing so (a
mapped LMDB faulting page after page) gets the next pushes before its READs are answered,
and a push that blocks (a page another READ holds locked) is waited for no longer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest
import trio

from fanfs import prefetch as pf
from fanfs import shared as sh
from fanfs.format.reader import PackReader
from fanfs.operations import MountInfo, Operations
from fanfs.prefetch import Prefetcher
from fanfs.shared import SharedState
from fanfs.store import ChunkStore
from tests.conftest import run_fanfs
from tests.treegen import label_text, write_tree

PAGE = 4096
BLOCK = 64 * 1024
DATA = label_text(16 * BLOCK + 123, 11)  # blocks 0-15 and a short block 16


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_tree(tmp_path_factory.mktemp("rest") / "src", {"big.bin": DATA})
    out = src.parent / "p.fan"
    result = run_fanfs(
        "pack",
        src,
        out,
        "-q",
        "--chunk-size",
        "128KiB",
        "--block-size",
        "64KiB",
        "--partitions",
        "1",
    )
    assert result.returncode == 0, result.stderr
    return out


class GatedPushes:
    """A recording stand-in for pyfuse3.notify_store that holds each push until `gate` is set
    (as the kernel holds one on a page that another READ has locked)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bytes]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, inode: int, offset: int, data: object) -> None:
        self.gate.wait()
        self.calls.append((inode, offset, bytes(data)))  # type: ignore[call-overload]


@pytest.fixture
def setup(pack: Path) -> Iterator[tuple[Operations, Prefetcher, GatedPushes]]:
    reader = PackReader(str(pack))
    shared = SharedState(processes=1, partitions=1, chunks=reader.index.chunk_count)
    store = ChunkStore(reader, shared, buffer_budget=8 << 20, thread_limit=2)
    ops = Operations(store, noopen=True, info=MountInfo(pack=str(pack)))
    pushes = GatedPushes()
    ops.prefetcher = Prefetcher(store, memory=8 << 20, into="kernel", notify=pushes)
    yield ops, ops.prefetcher, pushes
    pushes.gate.set()
    reader.close()


async def big_inode(ops: Operations) -> int:
    return (await ops.lookup(pyfuse3.ROOT_INODE, b"big.bin")).st_ino


async def read_page(ops: Operations, inode: int, page: int) -> None:
    assert await ops.read(inode, page * PAGE, PAGE) == DATA[page * PAGE : (page + 1) * PAGE]


async def race_block_zero(ops: Operations, pushes: GatedPushes) -> int:
    """Read the first pages of big.bin's block 0 while its push is held: the reader beats
    the push RACES_TO_WAIT times, and the file's next pushes are waited for. Returns the
    file's inode."""
    inode = await big_inode(ops)
    pushes.gate.clear()
    for page in range(pf.RACES_TO_WAIT + 1):
        await read_page(ops, inode, page)
    return inode


async def settle(prefetcher: Prefetcher) -> None:
    with trio.move_on_after(30):  # a bound for a loaded machine, not a timing
        while not prefetcher.idle:  # noqa: ASYNC110 - the pusher is a plain thread
            await trio.sleep(0.005)
    assert prefetcher.idle


def pushed_ranges(pushes: GatedPushes, inode: int) -> list[tuple[int, int]]:
    """(start, end) of each push, after checking its bytes against the file's."""
    ranges = []
    for pushed_inode, offset, data in pushes.calls:
        assert pushed_inode == inode
        assert data == DATA[offset : offset + len(data)]
        ranges.append((offset, offset + len(data)))
    return sorted(ranges)


def test_a_block_read_in_part_is_pushed_around_the_pages_read(
    setup: tuple[Operations, Prefetcher, GatedPushes],
) -> None:
    ops, prefetcher, pushes = setup

    async def main() -> int:
        inode = await big_inode(ops)
        # Pages 21-22 of block 1 (pages 16-31), the second starting mid-page.
        got = await ops.read(inode, 21 * PAGE, 2 * PAGE - 100)
        assert got == DATA[21 * PAGE : 23 * PAGE - 100]
        await read_page(ops, inode, 63)  # the last page of block 3
        await settle(prefetcher)
        return inode

    inode = trio.run(main)
    # The READ's own pages stay out: the kernel holds them locked until it is answered.
    assert pushed_ranges(pushes, inode) == [
        (BLOCK, 21 * PAGE),
        (23 * PAGE, 2 * BLOCK),
        (3 * BLOCK, 63 * PAGE),
    ]
    assert ops.shared.counters[sh.REST_PUSHED] == 2
    assert ops.shared.counters[sh.REST_WAITED] == 0


def test_a_reader_that_races_the_push_gets_the_next_before_its_reply(
    setup: tuple[Operations, Prefetcher, GatedPushes],
) -> None:
    ops, prefetcher, pushes = setup
    counters = ops.shared.counters

    async def main() -> int:
        inode = await race_block_zero(ops, pushes)
        assert counters[sh.REST_PUSHED] == 0
        pushes.gate.set()
        await settle(prefetcher)
        assert len(pushes.calls) == 1  # block 0 pushed once, not once per READ
        # The pages after the READ's in the file's next partly read block (the ones a reader
        # faulting forward needs next) are in the page cache before the READ returns.
        await read_page(ops, inode, 2 * BLOCK // PAGE + 5)
        assert (inode, 2 * BLOCK + 6 * PAGE) in [call[:2] for call in pushes.calls]
        assert counters[sh.REST_WAITED] == 1
        await settle(prefetcher)
        assert len(pushes.calls) == 3
        return inode

    inode = trio.run(main)
    assert pushed_ranges(pushes, inode) == [
        (PAGE, BLOCK),
        (2 * BLOCK, 2 * BLOCK + 5 * PAGE),
        (2 * BLOCK + 6 * PAGE, 3 * BLOCK),
    ]


def test_after_waiting_pushes_one_is_left_to_land_on_its_own_again(
    setup: tuple[Operations, Prefetcher, GatedPushes],
) -> None:
    ops, prefetcher, pushes = setup
    counters = ops.shared.counters

    async def main() -> None:
        inode = await race_block_zero(ops, pushes)
        pushes.gate.set()
        await settle(prefetcher)
        # Pages of blocks 2, 8 and 14 in turn (too far apart for read-ahead), never raced.
        reads = [16 * (2 + 6 * (k % 3)) + k // 3 for k in range(pf.WAIT_PUSHES + 2)]
        for page in reads:
            await read_page(ops, inode, page)
            await settle(prefetcher)
        # The file's pushes were waited for but for the last one of WAIT_PUSHES, which
        # landed on its own; nobody raced it, so the next did too.
        assert counters[sh.REST_WAITED] == pf.WAIT_PUSHES - 1

    trio.run(main)


def test_a_push_that_blocks_holds_up_a_read_no_longer_than_the_bound(
    setup: tuple[Operations, Prefetcher, GatedPushes],
) -> None:
    ops, prefetcher, pushes = setup
    counters = ops.shared.counters

    async def main() -> None:
        inode = await race_block_zero(ops, pushes)
        # Every push now blocks in the kernel: the READ is answered after PUSH_WAIT_S, and
        # the file's pushes are no longer waited for.
        start = time.monotonic()
        await read_page(ops, inode, 20)
        await read_page(ops, inode, 40)
        assert time.monotonic() - start < 5.0  # one wait of PUSH_WAIT_S, not a hang
        assert counters[sh.REST_WAITED] == 0
        pushes.gate.set()
        await settle(prefetcher)
        assert counters[sh.REST_PUSHED] == 3  # blocks 0, 1 and 2, each once

    trio.run(main)
