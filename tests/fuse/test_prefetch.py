"""Prefetching and caches through a real mount, as a training job sees them.

Read-ahead must follow readers that read in order (inside a file, across a directory) and
leave random readers alone; the shared MinIO cache must give an epoch in a new random order
exactly as many hits as it holds objects; hints must decode files ahead in the hinted order;
memory budgets must hold; a failing prefetch must never reach a reader; and `fanfs stats`
must account for every prefetch.

Readers that must reach the daemon on every read drop the file's pages after reading it
(POSIX_FADV_DONTNEED): the mount keeps its page cache, so a file read once would otherwise be
served by the kernel (a dataset larger than memory behaves this way).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import random
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fanfs.compression import CODEC_ZSTD
from fanfs.errors import UsageError
from fanfs.hints import HintChannel
from fanfs.stats import read_stats
from fanfs.torch import HintedSampler
from tests.conftest import TEST_CHUNK_SIZE, Mount, run_fanfs
from tests.fuse.test_corruption import damage_chunk
from tests.pagecache import drop_from_page_cache
from tests.treegen import write_tree

pytestmark = pytest.mark.fuse

CS = TEST_CHUNK_SIZE
SAMPLE = 16 * 1024  # bytes of every file in samples/ (8-byte aligned: no MinIO padding)
SAMPLES = 200
WALK_FILES = 300
# A directory of a realistic size for random epochs: the smaller it is, the likelier a random
# order has three near-consecutive files in a row somewhere (docs/architecture.md §9).
SHUFFLE_FILES = 1000
BIG_CHUNKS = 20
SHARD_CHUNKS = 128
# A training loop's compute on each chunk it reads, in seconds.
COMPUTE_S = 0.002
# Options under which counts are exact: one serving process, prefetched chunks kept in the
# daemon's buffer (counted when used), no object cache (and so no background fill).
EXACT = ("--prefetch-into", "daemon", "--processes", "1", "--cache-memory", "0")
# Read from disk: the pack is not preloaded, every chunk is decoded in a worker thread.
COLD = (*EXACT, "--preload", "no")
PREFETCH_OUTCOMES = (
    "prefetch_pushed",
    "prefetch_cached",
    "prefetch_buffered",
    "prefetch_dropped",
    "prefetch_failed",
    "prefetch_joined",
)
MOVING = ("prefetch_issued", *PREFETCH_OUTCOMES, "prefetch_used", "fill_chunks", "reads")
WORDS = [b"cat", b"dog", b"bird", b"0.5", b"\n", b"label", b"tensor", b"x"]


def text(n: int, seed: int) -> bytes:
    """`n` bytes of compressible text, distinct for each seed."""
    rng = random.Random(seed)
    out = b" ".join(rng.choices(WORDS, k=n // 3 + 1))[:n]
    assert len(out) == n
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    files = {"walk/w%04d.txt" % i: text(4096 + 37 * i, i) for i in range(WALK_FILES)}
    files.update({"shuffle/s%04d.txt" % i: text(1024 + i, i) for i in range(SHUFFLE_FILES)})
    files.update({"samples/s%04d.txt" % i: text(SAMPLE, 10_000 + i) for i in range(SAMPLES)})
    files.update(
        {
            "big/%s.txt" % name: text(BIG_CHUNKS * CS, seed)
            for seed, name in enumerate(["rand", "seq"])
        }
    )
    files["big/shard.txt"] = text(SHARD_CHUNKS * CS, 2)
    return write_tree(tmp_path_factory.mktemp("prefetch") / "src", files)


def make_pack(src: Path, out: Path) -> Path:
    result = run_fanfs("pack", src, out, "-q", "--chunk-size", "64KiB")
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def pack(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tree, tmp_path_factory.mktemp("packs") / "prefetch.fan")


def stats(mnt: Path) -> dict[str, Any]:
    """`fanfs stats --json MNT`, as a user runs it."""
    result = run_fanfs("stats", "--json", mnt)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def delta(after: dict[str, Any], before: dict[str, Any], key: str) -> int:
    return int(after[key] - before[key])


def settled(s: dict[str, Any]) -> bool:
    """Every issued prefetch has an outcome."""
    return bool(s["prefetch_issued"] == sum(s[k] for k in PREFETCH_OUTCOMES))


def wait_idle(mnt: Path, timeout: float = 30.0) -> dict[str, Any]:
    """Poll until the prefetcher (and background fill) has stopped: every issued prefetch
    accounted for, and nothing moving for 0.3 s. Returns `fanfs stats --json`."""
    deadline = time.monotonic() + timeout
    quiet, previous = 0, None
    while True:
        current = read_stats(str(mnt))
        moved = previous is None or any(current[k] != previous[k] for k in MOVING)
        quiet = 0 if moved or not settled(current) else quiet + 1
        if quiet >= 3:
            return stats(mnt)
        if time.monotonic() > deadline:
            outcomes = {k: current[k] for k in ("prefetch_issued", *PREFETCH_OUTCOMES)}
            pytest.fail(
                "prefetcher not idle after %ds (issued != sum of outcomes?): %s"
                % (timeout, outcomes)
            )
        previous = current
        time.sleep(0.1)


def read_dropping(path: Path, block: int = 1 << 20) -> bytes:
    """Read a whole file, then drop its pages so the next read reaches the daemon again."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while part := os.read(fd, block):
            parts.append(part)
        drop_from_page_cache(fd)
    finally:
        os.close(fd)
    return b"".join(parts)


def names(tree: Path, directory: str) -> list[str]:
    return [directory + "/" + n for n in sorted(os.listdir(tree / directory))]


def preads(path: Path, order: Sequence[int]) -> bytes:
    """Read chunks `order` of `path` one pread each, with the kernel's own read-ahead off
    (POSIX_FADV_RANDOM), so the daemon sees exactly these reads; returns the file's bytes."""
    parts: dict[int, bytes] = {}
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for k in order:
            parts[k] = os.pread(fd, CS, k * CS)
    finally:
        os.close(fd)
    return b"".join(parts[k] for k in sorted(parts))


# 1. Read-ahead follows readers that read in order, inside a file and across a directory, and
# leaves random readers alone.


def test_sequential_reader_is_read_ahead(
    tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """64 KiB reads in order, each reaching the daemon as one READ: once CONFIRM reads have
    continued the first, every later chunk is decoded ahead and the reader gets it from the
    buffer (or joins its decode)."""
    mount = mount_factory(pack, *COLD)
    before = stats(mount.mnt)
    assert (
        preads(mount.mnt / "big/seq.txt", range(BIG_CHUNKS)) == (tree / "big/seq.txt").read_bytes()
    )
    after = wait_idle(mount.mnt)
    assert delta(after, before, "reads") == delta(after, before, "chunk_reads") == BIG_CHUNKS
    issued = delta(after, before, "prefetch_issued")
    # Nothing before the stream is confirmed (chunks 0-2 are read first), nothing past the end.
    assert 0 < issued <= BIG_CHUNKS - 3
    # Every chunk read ahead served the reader: none wasted.
    assert delta(after, before, "prefetch_used") + delta(after, before, "prefetch_joined") == issued
    assert after["prefetch_failed"] == after["data_errors"] == 0


@pytest.mark.parametrize("preload", ["no", "auto"])
def test_sequential_reader_is_read_ahead_behind_kernel_read_ahead(
    preload: str, tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """The usual case: a shard read front to back through the page cache by a loop that
    computes a little on each chunk, the kernel sending READs of up to 1 MiB ahead of the
    reader. The daemon's read-ahead must still get ahead of them, whether the pack is
    preloaded into memory or read from disk. (Read back to back, with no compute between, the
    kernel's READs caught up with the read-ahead on a loaded CI host: 12 chunks of 128 came
    from it, where an idle host serves more than a quarter.)"""
    mount = mount_factory(pack, *EXACT, "--preload", preload)
    before = stats(mount.mnt)
    parts = []
    with open(mount.mnt / "big/shard.txt", "rb", buffering=0) as f:
        while part := f.read(CS):
            parts.append(part)
            time.sleep(COMPUTE_S)
    data = b"".join(parts)
    assert data == (tree / "big/shard.txt").read_bytes()
    after = wait_idle(mount.mnt)
    assert delta(after, before, "reads") > 3  # premise: enough READs for a stream to confirm
    moved = {k: delta(after, before, k) for k in MOVING}
    served = moved["prefetch_used"] + moved["prefetch_joined"]
    assert served >= SHARD_CHUNKS // 4, str(moved)
    assert served == moved["prefetch_issued"], moved


@pytest.mark.parametrize(
    "seed",
    [
        1,
        2,
        3,
        0,
        5,
    ],
)
def test_random_reader_is_not_read_ahead(
    seed: int, tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """Every chunk of a 20-chunk file once, in a seeded random order."""
    mount = mount_factory(pack, *COLD)
    order = random.Random(seed).sample(range(BIG_CHUNKS), BIG_CHUNKS)
    before = stats(mount.mnt)
    assert preads(mount.mnt / "big/rand.txt", order) == (tree / "big/rand.txt").read_bytes()
    after = wait_idle(mount.mnt)
    # Premise: the daemon saw each pread as one READ of one chunk (no kernel read-ahead).
    assert delta(after, before, "reads") == delta(after, before, "chunk_reads") == BIG_CHUNKS
    assert delta(after, before, "prefetch_issued") == 0, order


@pytest.mark.parametrize("preload", ["no", "auto"])
def test_sorted_walk_is_read_ahead(
    preload: str, tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """A directory's files read in sorted order, one after another."""
    mount = mount_factory(pack, *EXACT, "--preload", preload)
    files = names(tree, "walk")
    assert len(files) == WALK_FILES
    before = stats(mount.mnt)
    for rel in files:
        assert read_dropping(mount.mnt / rel) == (tree / rel).read_bytes(), rel
    after = wait_idle(mount.mnt)
    assert delta(after, before, "reads") >= WALK_FILES
    issued = delta(after, before, "prefetch_issued")
    # Files came from the read-ahead (taken from the buffer, or joined while decoding).
    served = delta(after, before, "prefetch_used") + delta(after, before, "prefetch_joined")
    assert 0 < served <= issued < WALK_FILES
    if preload == "no":
        # From disk, a READ joins a prefetch in flight: no file is decoded twice, and the
        # walk is read ahead from its third file on.
        assert served == issued > WALK_FILES // 2
    assert after["prefetch_failed"] == after["data_errors"] == 0


def test_shuffled_epochs_are_not_read_ahead(
    tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """Three epochs over a directory of 1000 files, each in a new seeded random order
    (training without hints): nothing looks like a walk, nothing is read ahead."""
    mount = mount_factory(pack, *EXACT)
    files = names(tree, "shuffle")
    assert len(files) == SHUFFLE_FILES
    before = stats(mount.mnt)
    for seed in (10, 11, 12):
        for rel in random.Random(seed).sample(files, len(files)):
            assert read_dropping(mount.mnt / rel) == (tree / rel).read_bytes(), rel
    after = wait_idle(mount.mnt)
    # The daemon saw the epochs: one READ per file (one page each), dropped after each read.
    assert delta(after, before, "reads") == 3 * len(files)
    assert delta(after, before, "prefetch_issued") == 0


@pytest.mark.parametrize(
    "preload",
    [
        "no",
        "auto",
    ],
)
def test_read_joins_the_prefetch_in_flight(
    preload: str, tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    """A READ for a chunk the prefetcher is decoding waits for that decode (docs/architecture.md
    section 9), whether the pack is preloaded or not. A hint starts the prefetch of a 1 MiB
    lzma chunk (one READ) that takes about 30 ms to decode (a 256 KiB one, 8 ms, was
    sometimes done before the READ arrived on a loaded machine); the READ is sent as soon as `fanfs stats`
    shows the prefetch issued."""
    data = random.Random(9).randbytes(8 * CS).hex().encode()  # compresses to about half
    src = write_tree(tmp_path / "src", {"a.txt": data})
    pack = tmp_path / "pack.fan"
    result = run_fanfs("pack", src, pack, "-q", "--codec", "lzma", "--chunk-size", str(16 * CS))
    assert result.returncode == 0, result.stderr
    mount = mount_factory(pack, *EXACT, "--preload", preload)
    (mount.mnt / "a.txt").stat()  # looked up already: the READ is the only request needed
    deadline = time.monotonic() + 10
    while (
        preload == "auto"
        and stats(mount.mnt)["resident_partitions"] < stats(mount.mnt)["partitions"]
    ):
        assert time.monotonic() < deadline, "the pack was not preloaded"
        time.sleep(0.05)
    before = stats(mount.mnt)
    with HintChannel(str(mount.mnt)) as hints:
        assert hints.send_order(["a.txt"]) == (1, 0)
        while read_stats(str(mount.mnt))["prefetch_issued"] == before["prefetch_issued"]:
            assert time.monotonic() < deadline, "the hint was not prefetched"
        assert read_dropping(mount.mnt / "a.txt") == data
    after = wait_idle(mount.mnt)
    moved = {k: delta(after, before, k) for k in (*MOVING, "bytes_decoded", "chunk_reads")}
    assert moved["chunk_reads"] == moved["prefetch_issued"] == 1, moved
    assert moved["prefetch_joined"] == 1 and moved["bytes_decoded"] == len(data), moved


# 2. The MinIO cache: a random epoch hits exactly as many objects as the cache holds.

K_CACHED = 50


def epoch(mount: Mount, tree: Path, order: Sequence[str]) -> dict[str, int]:
    """Read `order` (dropping pages), check the bytes, return the stats deltas."""
    before = stats(mount.mnt)
    for rel in order:
        assert read_dropping(mount.mnt / rel) == (tree / rel).read_bytes(), rel
    after = stats(mount.mnt)
    # Premise: one READ, of the whole file, per file: hits count files.
    assert delta(after, before, "reads") == delta(after, before, "chunk_reads") == len(order)
    return {k: delta(after, before, k) for k in ("object_hits", "object_inserts", "buffer_hits")}


def test_minio_hits_equal_cache_size_every_epoch(
    tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    files = names(tree, "samples")
    assert len(files) == SAMPLES
    mount = mount_factory(pack, "--prefetch", "off", "--cache-memory", str(K_CACHED * SAMPLE))
    rng = random.Random(3)
    first = epoch(mount, tree, rng.sample(files, len(files)))
    s = stats(mount.mnt)
    assert first["object_hits"] == 0 and first["object_inserts"] == K_CACHED
    assert (s["cache_policy"], s["cache_budget"]) == ("minio", K_CACHED * SAMPLE)
    assert (s["cache_objects"], s["cache_bytes"]) == (K_CACHED, K_CACHED * SAMPLE)
    for _ in range(2):
        later = epoch(mount, tree, rng.sample(files, len(files)))
        assert later == {"object_hits": K_CACHED, "object_inserts": 0, "buffer_hits": 0}
    assert stats(mount.mnt)["cache_objects"] == K_CACHED


def lru_hits(epochs: list[list[str]], capacity: int) -> list[int]:
    """Hits per epoch of a textbook LRU cache of `capacity` objects."""
    cache: OrderedDict[str, None] = OrderedDict()
    hits = []
    for order in epochs:
        count = 0
        for rel in order:
            if rel in cache:
                cache.move_to_end(rel)
                count += 1
            else:
                cache[rel] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
        hits.append(count)
    return hits


def test_lru_thrashes_on_random_epochs(
    tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """Same workload, `--cache-policy lru`: each epoch evicts objects before their next use."""
    files = names(tree, "samples")
    mount = mount_factory(
        pack,
        "--prefetch",
        "off",
        "--cache-policy",
        "lru",
        "--processes",
        "1",
        "--cache-memory",
        str(K_CACHED * SAMPLE),
    )
    rng = random.Random(3)
    orders = [rng.sample(files, len(files)) for _ in range(3)]
    hits = [epoch(mount, tree, order)["object_hits"] for order in orders]
    assert hits == lru_hits(orders, K_CACHED)
    assert hits[0] == 0
    assert all(0 < h <= K_CACHED // 3 for h in hits[1:]), hits  # MinIO gets K_CACHED each
    s = stats(mount.mnt)
    assert (s["cache_policy"], s["cache_objects"], s["cache_bytes"]) == (
        "lru",
        K_CACHED,
        K_CACHED * SAMPLE,
    )


# 3. Hints: the daemon decodes ahead in the order it is told.

HINT_WINDOW_FILES = 32  # 2 x a quarter of --prefetch-memory 1MiB = 512 KiB = 32 files of 16 KiB


@pytest.mark.parametrize(
    "seed",
    [
        5,
        8,
    ],
)
def test_hints_prefetch_in_hint_order(
    seed: int, tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """The daemon keeps the next 32 hinted files decoded, and only those."""
    mount = mount_factory(pack, *EXACT, "--prefetch-memory", "1MiB")
    order = [str(mount.mnt / rel) for rel in names(tree, "samples")]
    random.Random(seed).shuffle(order)
    before = stats(mount.mnt)
    with HintChannel(str(mount.mnt)) as hints:
        assert hints.send_order(order) == (SAMPLES, 0)
    ahead = wait_idle(mount.mnt)
    assert (
        delta(ahead, before, "hint_lists") == 1 and delta(ahead, before, "hint_entries") == SAMPLES
    )
    # The window: the first 32 hinted files, decoded into the buffer before anyone reads.
    assert (
        delta(ahead, before, "prefetch_issued")
        == delta(ahead, before, "prefetch_buffered")
        == HINT_WINDOW_FILES
    )
    assert delta(ahead, before, "reads") == 0
    for path in order[:HINT_WINDOW_FILES]:
        rel = os.path.relpath(path, mount.mnt)
        assert read_dropping(Path(path)) == (tree / rel).read_bytes(), rel
    read = wait_idle(mount.mnt)
    assert delta(read, ahead, "chunk_reads") == HINT_WINDOW_FILES
    assert (
        delta(read, ahead, "buffer_hits")
        == delta(read, ahead, "prefetch_used")
        == HINT_WINDOW_FILES
    )
    # Reading moved the window on: the next files were decoded ahead as well.
    assert delta(read, ahead, "prefetch_buffered") == HINT_WINDOW_FILES
    # A file far down the order is not read ahead.
    far = order[150]
    assert read_dropping(Path(far)) == (tree / os.path.relpath(far, mount.mnt)).read_bytes()
    after = wait_idle(mount.mnt)
    assert delta(after, read, "chunk_reads") == 1 and delta(after, read, "buffer_hits") == 0


def test_hint_channel_reports_missing_paths(
    tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(pack, *EXACT)
    known = ["samples/s0001.txt", str(mount.mnt / "samples/s0002.txt"), "walk/w0000.txt"]
    bogus = [str(mount.mnt / "samples/nope.txt"), "/elsewhere/samples/s0003.txt"]
    with HintChannel(str(mount.mnt)) as hints:
        assert hints.send_order(known + bogus) == (3, 2)
        assert hints.send_order(["samples", "big/seq.txt"]) == (1, 1)  # a directory is not a file
    s = stats(mount.mnt)
    assert (s["hint_lists"], s["hint_entries"]) == (2, 7)


def test_registered_paths_then_indices(
    tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """Paths once, then each epoch's order as indices: the window follows the indices, and an
    index past the registered paths closes the connection with a WARNING."""
    mount = mount_factory(pack, *EXACT, "--prefetch-memory", "1MiB")
    paths = [str(mount.mnt / rel) for rel in names(tree, "samples")] + ["samples/nope.txt"]
    order = list(range(SAMPLES))
    random.Random(3).shuffle(order)
    before = stats(mount.mnt)
    with HintChannel(str(mount.mnt)) as hints:
        assert hints.register(paths) == (SAMPLES, 1)
        hints.send_indices(order)
        ahead = wait_idle(mount.mnt)
        assert delta(ahead, before, "hint_lists") == 1
        assert delta(ahead, before, "prefetch_buffered") == HINT_WINDOW_FILES
        first = paths[order[0]]
        assert read_dropping(Path(first)) == (tree / os.path.relpath(first, mount.mnt)).read_bytes()
        assert delta(wait_idle(mount.mnt), ahead, "prefetch_used") == 1
        with pytest.raises(UsageError) as info:
            hints.send_indices([len(paths)])
    reason = "index %d past the %d registered paths" % (len(paths), len(paths))
    assert str(info.value) == "%s: the mount refused the hints: %s" % (mount.mnt, reason)
    assert any("refused a hint client: " + reason in line for line in mount.log_lines("WARNING"))


def test_no_hint_channel_without_prefetch(pack: Path, mount_factory: Callable[..., Mount]) -> None:
    mount = mount_factory(pack, "--prefetch", "off")
    with pytest.raises(UsageError) as info:
        HintChannel(str(mount.mnt))
    assert str(info.value) == "%s: no fanfs hint channel (No data available)" % mount.mnt


class EpochSampler:
    """Like torch's RandomSampler: a new seeded permutation each epoch."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, random.Random(seed)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(self.rng.sample(range(self.n), self.n))


def test_hinted_sampler_sends_each_epoch(
    tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(pack, *EXACT)
    paths = [str(mount.mnt / rel) for rel in names(tree, "samples")]
    sampler = HintedSampler(EpochSampler(SAMPLES, 5), paths)
    twin = EpochSampler(SAMPLES, 5)
    assert len(sampler) == SAMPLES
    for _ in range(2):
        before = stats(mount.mnt)
        order = list(sampler)
        assert order == list(twin)
        s = stats(mount.mnt)
        assert delta(s, before, "hint_lists") == 1 and delta(s, before, "hint_entries") == SAMPLES
    # A plain list works as the sampler too, and its order is yielded unchanged.
    fixed = HintedSampler([7, 3, 199, 0], paths, mountpoint=str(mount.mnt))
    before = stats(mount.mnt)
    assert list(fixed) == [7, 3, 199, 0]
    ahead = wait_idle(mount.mnt)
    assert delta(ahead, before, "hint_lists") == 1 and delta(ahead, before, "hint_entries") == 4
    # The hinted files are then read from the read-ahead buffer.
    for i in [7, 3, 199, 0]:
        assert read_dropping(Path(paths[i])) == (tree / names(tree, "samples")[i]).read_bytes()
    after = wait_idle(mount.mnt)
    assert delta(after, ahead, "chunk_reads") == delta(after, ahead, "prefetch_used") == 4


# 4. Memory budgets: the object cache never outgrows --cache-memory, and the daemon's memory
# grows by no more than its budgets.

LARGE_FILES = 48  # of 1 MiB: 48 MiB of compressible data


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    files = {"data/f%02d.txt" % i: text(1 << 20, 100 + i) for i in range(LARGE_FILES)}
    src = write_tree(tmp_path_factory.mktemp("large") / "src", files)
    return src, make_pack(src, tmp_path_factory.mktemp("packs") / "large.fan")


def daemon_pids(mount: Mount) -> list[int]:
    """The `fanfs mount -f` process and the processes it forked (serving processes, and the
    background filler while it runs)."""
    assert mount.proc is not None
    main = mount.proc.pid
    pids = [main]
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == main:
            pids.append(int(name))
    return pids


def daemon_memory(mount: Mount) -> int:
    """Bytes of anonymous and shared memory of the daemon's processes, as proportional set
    size: the object cache, which they all map, counts once. The pack's file-backed mapping
    is left out: it is page cache the kernel can drop, not memory the daemon allocated."""
    total = 0
    for pid in daemon_pids(mount):
        try:
            with open("/proc/%d/smaps_rollup" % pid) as f:
                lines = f.readlines()
        except OSError:  # the filler exits once the cache is full
            continue
        for line in lines:
            key, _, value = line.partition(":")
            if key in ("Pss_Anon", "Pss_Shmem"):
                total += int(value.split()[0]) * 1024
    return total


def read_large(mount: Mount, src: Path) -> tuple[dict[str, Any], int]:
    """Read every file of the large tree twice (two epochs: the second maps every cached
    object into the serving processes); returns the stats once idle and the daemon's memory
    growth."""
    stats(mount.mnt)  # the daemon has served a request: its lazy start-up is done
    start = daemon_memory(mount)
    for _ in range(2):
        for i in range(LARGE_FILES):
            rel = "data/f%02d.txt" % i
            assert read_dropping(mount.mnt / rel) == (src / rel).read_bytes(), rel
        after = wait_idle(mount.mnt)
    return after, daemon_memory(mount) - start


def test_cache_budget_holds(large: tuple[Path, Path], mount_factory: Callable[..., Mount]) -> None:
    src, pack = large
    mount = mount_factory(pack, "--cache-memory", "8MiB", "--prefetch-memory", "4MiB")
    s, growth = read_large(mount, src)
    assert s["read_bytes"] > 0
    # Full (every object is a whole 64 KiB chunk; a chunk two processes stored at once
    # leaves its second copy's room unused), and no further.
    assert s["cache_budget"] == 8 << 20
    assert s["cache_objects"] * CS <= s["cache_bytes"] == s["cache_budget"]
    assert s["cache_objects"] >= s["cache_budget"] // CS - 8
    assert s["cache_refused"] > 0
    assert s["buffer_bytes"] <= s["buffer_budget"] == 4 << 20
    budgets = s["cache_budget"] + s["processes"] * s["buffer_budget"]
    assert growth < budgets + (32 << 20), (growth, budgets)


def test_cache_fills_to_the_data_under_a_larger_budget(
    large: tuple[Path, Path], mount_factory: Callable[..., Mount]
) -> None:
    """The same read with room for everything: the 8 MiB budget above is what stopped it,
    and the memory measurement sees the cache."""
    src, pack = large
    mount = mount_factory(pack, "--cache-memory", "64MiB", "--prefetch-memory", "4MiB")
    s, growth = read_large(mount, src)
    assert s["cache_bytes"] >= s["cache_objects"] * CS >= 40 << 20
    assert s["cache_bytes"] <= s["cache_budget"] == 64 << 20
    assert s["cache_refused"] == 0
    assert growth >= 40 << 20
    assert growth < s["cache_budget"] + s["processes"] * s["buffer_budget"] + (32 << 20)


# 5. A failing prefetch never reaches a reader.


def test_failed_prefetch_is_not_the_readers_error(
    tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    files = {"walk/f%02d.txt" % i: text(8192 + 100 * i, 500 + i) for i in range(40)}
    src = write_tree(tmp_path / "src", files)
    pack = make_pack(src, tmp_path / "pack.fan")
    bad = "walk/f20.txt"
    damage_chunk(pack, bad, 0, CODEC_ZSTD)
    mount = mount_factory(pack, *COLD)
    for rel in sorted(files):
        if rel == bad:
            before = stats(mount.mnt)
            with pytest.raises(OSError) as info:
                read_dropping(mount.mnt / rel)
            assert info.value.errno == errno.EIO
            failed_reads = delta(stats(mount.mnt), before, "reads")
        else:
            assert read_dropping(mount.mnt / rel) == files[rel], rel
    s = wait_idle(mount.mnt)
    # The walk was read ahead from its third file on, the damaged file too, before its reader
    # came; the prefetch of the damaged file failed, every other one served the walk.
    assert s["prefetch_issued"] > 20
    assert s["prefetch_failed"] == 1
    assert s["prefetch_used"] + s["prefetch_joined"] == s["prefetch_issued"] - 1
    # Only the damaged file's READs failed (the kernel retries a failed page read once).
    assert 1 <= failed_reads <= 2
    assert s["data_errors"] == failed_reads and s["corrupt_chunks"] == 1
    errors = mount.log_lines("ERROR")
    assert len(errors) == 1 and bad in errors[0], errors
    assert "Traceback" not in mount.log_text()


# 6. `fanfs stats` accounts for every prefetch after a mixed workload.


@pytest.mark.parametrize("into", ["kernel", "daemon"])
def test_stats_consistent_after_mixed_workload(
    into: str, tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(
        pack, "--prefetch-into", into, "--cache-memory", "1MiB", "--prefetch-memory", "8MiB"
    )
    read = 0
    for rel in names(tree, "walk")[:100]:
        data = read_dropping(mount.mnt / rel)
        assert data == (tree / rel).read_bytes(), rel
        read += len(data)
    data = preads(
        mount.mnt / "big/rand.txt", random.Random(6).sample(range(BIG_CHUNKS), BIG_CHUNKS)
    )
    assert data == (tree / "big/rand.txt").read_bytes()
    read += len(data)
    order = names(tree, "samples")
    random.Random(7).shuffle(order)
    with HintChannel(str(mount.mnt)) as hints:
        assert hints.send_order(order) == (SAMPLES, 0)
        for position, rel in enumerate(order[:100]):
            if position % 10 == 0:
                hints.progress(position)
            data = read_dropping(mount.mnt / rel)
            assert data == (tree / rel).read_bytes(), rel
            read += len(data)
    s = wait_idle(mount.mnt)
    assert s["processes"] == min(2, os.cpu_count() or 1)  # the counters of all of them
    assert s["prefetch_issued"] > 0 and s["hint_lists"] == 1
    assert s["prefetch_issued"] == sum(s[k] for k in PREFETCH_OUTCOMES)
    assert s["prefetch_used"] <= s["prefetch_buffered"]
    assert s["object_hits"] + s["buffer_hits"] <= s["chunk_reads"]
    assert s["cache_bytes"] <= s["cache_budget"] == 1 << 20
    assert s["buffer_bytes"] <= s["buffer_budget"] == 8 << 20
    assert s["fill_bytes"] <= s["cache_bytes"]
    assert s["data_errors"] == s["internal_errors"] == s["prefetch_failed"] == 0
    if into == "daemon":
        # Every byte the test read came through exactly one READ.
        assert s["read_bytes"] == read and s["prefetch_pushed"] == 0
    else:
        # Pages pushed into the page cache are read without a READ.
        assert 0 < s["read_bytes"] <= read
    table = run_fanfs("stats", mount.mnt)
    assert table.returncode == 0, table.stderr
    rows = {line[:40].strip(): line[40:].split() for line in table.stdout.splitlines()[1:]}
    assert rows["object cache hits"] == [str(s["object_hits"])]
    assert rows["prefetch: chunks issued"] == [str(s["prefetch_issued"])]


# --- the hint socket's limits (issue 10): a client cannot grow the daemon without bound --------


def refusal(mount: Mount, reason: str) -> str:
    return "%s: the mount refused the hints: %s" % (mount.mnt, reason)


def test_an_order_past_the_limit_is_refused_and_the_mount_serves_on(
    tree: Path, pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """This pack has ~240 entries, so one order holds at most 64 Ki paths (order_limit);
    the daemon refuses the 65537th as it arrives, without keeping the paths."""
    mount = mount_factory(pack, *EXACT)
    limit = 1 << 16
    with HintChannel(str(mount.mnt)) as hints, pytest.raises(UsageError) as info:
        hints.send_order(["samples/s0001.txt"] * (limit + 1))
    assert str(info.value) == refusal(mount, "order longer than the limit of %d paths" % limit)
    with HintChannel(str(mount.mnt)) as hints, pytest.raises(UsageError) as info:
        hints.register(["samples/s0001.txt"] * (limit + 1))
    assert str(info.value) == refusal(mount, "paths longer than the limit of %d paths" % limit)
    with HintChannel(str(mount.mnt)) as hints, pytest.raises(UsageError) as info:
        hints.send_indices([0] * (limit + 1))
    assert str(info.value) == refusal(
        mount, "order of %d indices is longer than the limit of %d" % (limit + 1, limit)
    )
    # Exactly the limit is fine, and the mount serves on.
    with HintChannel(str(mount.mnt)) as hints:
        assert hints.send_order(["samples/s0001.txt"] * limit) == (limit, 0)
    assert (mount.mnt / "samples/s0002.txt").read_bytes() == (
        tree / "samples/s0002.txt"
    ).read_bytes()


def test_a_ninth_hint_connection_is_refused(
    pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(pack, *EXACT)
    with contextlib.ExitStack() as stack:
        channels = [stack.enter_context(HintChannel(str(mount.mnt))) for _ in range(8)]
        for channel in channels:  # each is being served (it answered)
            assert channel.send_order(["samples/s0001.txt"]) == (1, 0)
        extra = stack.enter_context(HintChannel(str(mount.mnt)))
        with pytest.raises(UsageError) as info:
            extra.send_order(["samples/s0001.txt"])
        assert str(info.value) == refusal(mount, "too many hint connections (at most 8)")
    # Closing them frees the slots.
    with HintChannel(str(mount.mnt)) as hints:
        assert hints.send_order(["samples/s0001.txt"]) == (1, 0)


@pytest.mark.parametrize(
    ("request_bytes", "reason"),
    [
        (b"at minus-one\n", "bad number in b'at minus-one'"),
        (b"indices 99999999999999\n", "bad number in b'indices 99999999999999'"),
        (b"gimme\n", "unknown command b'gimme'"),
        (b"x" * 70_000 + b"\n", "line longer than 65536 bytes"),
    ],
    ids=["bad-position", "huge-count", "unknown", "long-line"],
)
def test_a_malformed_hint_request_gets_an_error_line(
    pack: Path, mount_factory: Callable[..., Mount], request_bytes: bytes, reason: str
) -> None:
    mount = mount_factory(pack, *EXACT)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(os.getxattr(mount.mnt, "user.fanfs.hints").decode())
        sock.sendall(request_bytes)
        sock.settimeout(10)
        assert sock.makefile("rb").read() == b"error %s\n" % reason.encode()
    assert (mount.mnt / "samples/s0003.txt").stat().st_size > 0


def test_a_block_read_in_part_goes_whole_into_the_page_cache(
    tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    """A random 4 KiB read inside a file in blocks (format 5) decodes its 64 KiB block, and
    the block goes whole into the page cache: the next reads in it reach no daemon."""
    data = text(40 * 4096 + 123, 77)
    src = write_tree(tmp_path / "src", {"big.bin": data})
    pack = tmp_path / "blocks.fan"
    result = run_fanfs("pack", src, pack, "-q", "--chunk-size", "128KiB", "--block-size", "64KiB")
    assert result.returncode == 0, result.stderr
    mount = mount_factory(pack, "--processes", "1", "--cache-memory", "0")
    path = mount.mnt / "big.bin"
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead
        before = stats(mount.mnt)
        assert os.pread(fd, 4096, 20 * 4096) == data[20 * 4096 : 21 * 4096]  # block 1
        deadline = time.monotonic() + 10
        while read_stats(str(mount.mnt))["rest_pushed"] == before["rest_pushed"]:
            assert time.monotonic() < deadline, "the block was never pushed"
            time.sleep(0.05)
        middle = stats(mount.mnt)
        assert delta(middle, before, "reads") == 1 and delta(middle, before, "rest_pushed") == 1
        for page in (16, 17, 25, 31):  # the rest of block 1 (pages 16..31)
            assert os.pread(fd, 4096, page * 4096) == data[page * 4096 : (page + 1) * 4096]
        assert delta(stats(mount.mnt), middle, "reads") == 0
        # A page of another block still reaches the daemon, with the right bytes.
        assert os.pread(fd, 4096, 35 * 4096) == data[35 * 4096 : 36 * 4096]
        assert delta(stats(mount.mnt), middle, "reads") == 1
    finally:
        os.close(fd)


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_mapped_reader_faulting_page_after_page_reaches_the_daemon_once_a_block(
    tmp_path: Path, mount_factory: Callable[..., Mount], processes: str
) -> None:
    """LMDB maps its file with MADV_RANDOM: each fault asks for one page, and a value spans
    pages in a row. The first faults of the file beat their block's push to the next page
    (a READ per page); from then on, the push lands before the first page's READ is
    answered, and each block costs one READ."""
    blocks = 32
    data = text(blocks * 64 * 1024, 91)
    src = write_tree(tmp_path / "src", {"data.mdb": data})
    pack = tmp_path / "mapped.fan"
    result = run_fanfs("pack", src, pack, "-q", "--chunk-size", "128KiB", "--block-size", "64KiB")
    assert result.returncode == 0, result.stderr
    mount = mount_factory(pack, "--processes", processes, "--cache-memory", "0")
    with (
        open(mount.mnt / "data.mdb", "rb") as f,
        mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m,
    ):
        m.madvise(mmap.MADV_RANDOM)
        before = stats(mount.mnt)
        for block in random.Random(5).sample(range(blocks), blocks):
            start = block * 64 * 1024
            for page in range(16):  # a value of 16 pages, faulted in order
                offset = start + page * 4096
                assert m[offset : offset + 4096] == data[offset : offset + 4096]
        after = stats(mount.mnt)
    # Without waiting for the push, every page of a block but the last few is a READ
    # (about 16 per block); the few races that switch it on cost a READ each. How many
    # pushes had to be waited for depends on the host: on a loaded one the reader is slow
    # enough for most pushes to land on their own (rest_waited 0, one READ a block).
    assert delta(after, before, "reads") <= blocks + 2 * 16, delta(after, before, "rest_waited")
    assert delta(after, before, "rest_pushed") >= blocks - 2
