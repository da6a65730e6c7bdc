"""The read-ahead detector (`Prefetcher.observe`) on its own, over many orders.

The FUSE tests show it on a few real mounts; these run thousands of orders through the same
code with a stand-in store, to back the rates docs/architecture.md §9 states: sorted walks
are always found, even split at random between two serving processes, and shuffled epochs
over a directory of realistic size practically never look like one.
"""

from __future__ import annotations

import random
import stat
from typing import Any

import pytest

from fanfs import prefetch as pf
from fanfs.shared import COUNTER_NAMES

FILE_SIZE = 16 * 1024


class _Index:
    def __init__(self, files: int, chunks_per_file: int = 1) -> None:
        self.entry_count = files
        self.count = [chunks_per_file] * files
        self.mode = [stat.S_IFREG | 0o644] * files
        self.size = [FILE_SIZE * chunks_per_file] * files
        self.first = [i * chunks_per_file for i in range(files)]


class _Shared:
    def __init__(self) -> None:
        self.counters = [0] * len(COUNTER_NAMES)


class _Store:
    """What the detector asks of a ChunkStore: sizes, and whether a chunk is pending."""

    def __init__(self, files: int, chunks_per_file: int = 1) -> None:
        self.index = _Index(files, chunks_per_file)
        self.chunk_size = FILE_SIZE
        self.objects = None
        self.shared = _Shared()

    def usize(self, entry: int, chunk_no: int) -> int:
        return FILE_SIZE

    def is_pending(self, cid: int) -> bool:
        return False

    def is_cached(self, cid: int) -> bool:
        return False

    def is_mapped(self, cid: int) -> bool:
        return False


def _prefetcher(store: Any) -> pf.Prefetcher:
    return pf.Prefetcher(store, memory=1 << 30, into="daemon", notify=None)


def _queued_by(prefetcher: pf.Prefetcher, reads: list[tuple[int, int, int]]) -> int:
    """Chunks queued for read-ahead while `reads` (entry, first, last) arrive."""
    queued = 0
    for entry, first, last in reads:
        before = len(prefetcher._jobs)
        prefetcher.observe(entry, first, last)
        queued += len(prefetcher._jobs) - before
    return queued


def test_a_sorted_walk_is_read_ahead_from_its_fourth_file() -> None:
    store = _Store(300)
    prefetcher = _prefetcher(store)
    # The first file starts a stream; three more that continue it confirm the walk.
    assert _queued_by(prefetcher, [(e, 0, 0) for e in range(4)]) > 0
    assert _queued_by(_prefetcher(store), [(e, 0, 0) for e in range(3)]) == 0


@pytest.mark.parametrize("seed", range(20))
def test_a_sorted_walk_split_between_two_processes_is_found_by_both(seed: int) -> None:
    store = _Store(300)
    processes = [_prefetcher(store), _prefetcher(store)]
    rng = random.Random(seed)
    queued = [0, 0]
    for entry in range(300):
        side = rng.random() < 0.5
        queued[side] += _queued_by(processes[side], [(entry, 0, 0)])
    assert min(queued) > 0


def test_shuffled_epochs_over_1000_files_are_not_read_ahead() -> None:
    """100 runs of 3 shuffled epochs each: not one chunk of read-ahead."""
    store = _Store(1000)
    for seed in range(100):
        prefetcher = _prefetcher(store)
        reads = []
        for epoch in range(3):
            order = random.Random(seed * 10 + epoch).sample(range(1000), 1000)
            reads += [(e, 0, 0) for e in order]
        assert _queued_by(prefetcher, reads) == 0, seed


def test_small_directories_are_where_random_orders_can_look_sequential() -> None:
    """The documented limit: over 100 files a shuffled epoch sometimes continues a stream
    three times in a row; a false walk then queues one first window (256 KiB)."""
    store = _Store(100)
    runs = [
        _queued_by(
            _prefetcher(store), [(e, 0, 0) for e in random.Random(s).sample(range(100), 100)]
        )
        for s in range(200)
    ]
    assert 0 < sum(q > 0 for q in runs) < 200
    assert max(runs) <= 3 * (pf.WALK_FIRST_WINDOW // FILE_SIZE + 1) * 2


def test_sequential_chunks_of_a_large_file_are_read_ahead_random_ones_not() -> None:
    store = _Store(1, chunks_per_file=1000)
    assert _queued_by(_prefetcher(store), [(0, k, k) for k in range(5)]) > 0
    random_reads = 0
    for seed in range(50):
        order = random.Random(seed).sample(range(1000), 200)
        random_reads += _queued_by(_prefetcher(store), [(0, k, k) for k in order])
    assert random_reads == 0
