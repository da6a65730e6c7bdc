"""`Operations` under trio, without a kernel (the middle layer of issue 13): what each FUSE
request answers, the errno of every refusal, and READ at any offset and length compared
byte for byte with the source (property-based), in milliseconds per case."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanfs import shared as sh
from fanfs.format.layout import partition_name
from fanfs.format.reader import PackReader
from fanfs.operations import MountInfo, Operations
from fanfs.shared import SharedState
from fanfs.store import ChunkStore
from tests.conftest import run_fanfs
from tests.treegen import label_text, write_tree

CHUNK = 4096
FILES = {
    "empty.bin": b"",
    "one.txt": b"x",
    "exact.bin": label_text(CHUNK, 1),
    "three.bin": label_text(3 * CHUNK + 17, 2),
    "dir/nested/deep.txt": label_text(2 * CHUNK - 1, 3),
}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_tree(tmp_path_factory.mktemp("ops") / "src", FILES)
    out = src.parent / "p.fan"
    result = run_fanfs("pack", src, out, "-q", "--chunk-size", "4KiB")
    assert result.returncode == 0, result.stderr
    return out


def make_ops(pack: Path, *, noopen: bool = False) -> Operations:
    reader = PackReader(str(pack))
    shared = SharedState(
        processes=1, partitions=len(reader.partitions), chunks=reader.index.chunk_count
    )
    store = ChunkStore(reader, shared, buffer_budget=1 << 20, thread_limit=2)
    return Operations(store, noopen=noopen, info=MountInfo(pack=str(pack)))


@pytest.fixture(scope="module")
def ops(pack: Path) -> Iterator[Operations]:
    operations = make_ops(pack)
    yield operations
    operations.store.reader.close()


def inode_of(ops: Operations, rel: str) -> int:
    async def walk() -> int:
        inode = pyfuse3.ROOT_INODE
        for name in rel.encode().split(b"/"):
            attr = await ops.lookup(inode, name)
            assert attr.st_ino, rel
            inode = attr.st_ino
        return inode

    return trio.run(walk)


def errno_of(coro_fn: object, *args: object) -> int:
    async def call() -> int:
        try:
            await coro_fn(*args)  # type: ignore[operator]
        except pyfuse3.FUSEError as exc:
            return exc.errno
        return 0

    return trio.run(call)


# Format 5: files larger than a chunk (8 KiB here) in blocks of 4 KiB, beside one-chunk files.
BLOCK_FILES = {
    "blocks.bin": label_text(5 * CHUNK + 123, 4),  # 6 blocks
    "two_blocks.bin": label_text(2 * CHUNK + 1, 5),  # 3 blocks (just over a chunk)
    "chunk.bin": label_text(2 * CHUNK, 6),  # exactly one 8 KiB chunk
    "small.txt": label_text(1000, 7),
    "raw.bin": os.urandom(3 * CHUNK + 5),  # incompressible: raw blocks
}


@pytest.fixture(scope="module")
def block_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_tree(tmp_path_factory.mktemp("blocks") / "src", BLOCK_FILES)
    out = src.parent / "p.fan"
    result = run_fanfs(
        "pack", src, out, "-q", "--chunk-size", "8KiB", "--block-size", "4KiB", "--partitions", "2"
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def block_ops(block_pack: Path) -> Iterator[Operations]:
    operations = make_ops(block_pack)
    yield operations
    operations.store.reader.close()


# (mount fixture, its files): 4 KiB chunks; 8 KiB chunks with 4 KiB blocks (format 5).
READ_CASES = {"chunks": ("ops", FILES), "blocks": ("block_ops", BLOCK_FILES)}


@pytest.mark.parametrize("case", sorted(READ_CASES))
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_read_returns_the_source_bytes_at_any_offset_and_length(
    request: pytest.FixtureRequest, case: str, data: st.DataObject
) -> None:
    fixture, files = READ_CASES[case]
    ops: Operations = request.getfixturevalue(fixture)
    rel = data.draw(st.sampled_from(sorted(files)))
    span = max(len(content) for content in files.values()) + CHUNK
    off = data.draw(st.integers(0, span))
    size = data.draw(st.integers(0, span))
    got = trio.run(ops.read, inode_of(ops, rel), off, size)
    assert bytes(got) == files[rel][off : off + size]


def test_a_small_read_inside_a_file_in_blocks_decodes_one_block(block_pack: Path) -> None:
    block_ops = make_ops(block_pack)  # nothing decoded or cached yet
    reader = block_ops.store.reader
    entry = inode_of(block_ops, "blocks.bin") - 1
    assert reader.unit(entry) == CHUNK and reader.index.count[entry] == 6
    assert reader.unit(inode_of(block_ops, "chunk.bin") - 1) == 2 * CHUNK
    counters = block_ops.shared.counters
    before = counters[sh.BYTES_DECODED]
    got = trio.run(block_ops.read, entry + 1, 3 * CHUNK + 100, 200)
    assert bytes(got) == BLOCK_FILES["blocks.bin"][3 * CHUNK + 100 : 3 * CHUNK + 300]
    assert counters[sh.BYTES_DECODED] - before == CHUNK  # one block, not the whole file
    reader.close()


def test_the_buffer_lets_a_chunk_go_once_reads_have_had_all_of_it(tmp_path: Path) -> None:
    # A READ that uses part of a chunk leaves the chunk in the buffer for the READs of the
    # rest; once they have had every page of it (the kernel's page cache holds them now)
    # the buffer lets it go, instead of holding it until its budget evicts it.
    page = os.sysconf("SC_PAGESIZE")
    chunk = 4 * page
    data = label_text(3 * chunk + 17, 8)
    src = write_tree(tmp_path / "src", {"big.bin": data})
    result = run_fanfs("pack", src, tmp_path / "p.fan", "-q", "--chunk-size", str(chunk))
    assert result.returncode == 0, result.stderr
    ops = make_ops(tmp_path / "p.fan")
    store, counters = ops.store, ops.shared.counters
    inode = inode_of(ops, "big.bin")
    first = store.index.first[inode - 1]

    def read(off: int, size: int) -> None:
        assert bytes(trio.run(ops.read, inode, off, size)) == data[off : off + size]

    read(0, 2 * page)  # half of chunk 0: decoded and kept
    assert store.buffer.contains(first)
    read(0, 2 * page)  # the same pages again (the page cache dropped them): they count once
    read(2 * page + 100, 10)  # a part of a page: it does not count
    assert store.buffer.contains(first) and counters[sh.BUFFER_HITS] == 2
    read(2 * page, 2 * page + 10)  # the rest of chunk 0 and the start of chunk 1
    assert not store.buffer.contains(first) and store.buffer.contains(first + 1)
    assert store.buffer.statistics()["cache_bytes"] == chunk
    decoded = counters[sh.BYTES_DECODED]
    read(0, 10)  # asked again: decoded again
    assert counters[sh.BYTES_DECODED] - decoded == chunk
    read(3 * chunk, 17)  # the short last chunk, read whole: never kept
    assert not store.buffer.contains(first + 3)
    store.reader.close()


def test_getattr_reports_the_source_sizes(ops: Operations) -> None:
    for rel, data in FILES.items():
        attr = trio.run(ops.getattr, inode_of(ops, rel))
        assert attr.st_size == len(data), rel


def test_a_missing_name_is_a_cached_negative_entry(ops: Operations) -> None:
    attr = trio.run(ops.lookup, pyfuse3.ROOT_INODE, b"nope")
    assert attr.st_ino == 0 and attr.entry_timeout > 0


@pytest.mark.parametrize(
    ("request_name", "args", "expected"),
    [
        ("lookup", (pyfuse3.ROOT_INODE, b"n" * 256), errno.ENAMETOOLONG),
        ("lookup", ("one.txt", b"x"), errno.ENOTDIR),
        ("getattr", (10_000,), errno.ENOENT),
        ("readlink", ("one.txt",), errno.EINVAL),
        ("opendir", ("one.txt",), errno.ENOTDIR),
        ("open", ("one.txt", os.O_WRONLY), errno.EROFS),
        ("open", ("one.txt", os.O_RDONLY | os.O_TRUNC), errno.EROFS),
        ("open", ("one.txt", os.O_RDWR), errno.EROFS),
        ("open", ("dir", os.O_RDONLY), errno.EISDIR),
        ("getxattr", ("one.txt", b"user.other"), pyfuse3.ENOATTR),
        ("getxattr", ("one.txt", b"security.selinux"), errno.EOPNOTSUPP),
        ("getxattr", ("dir", b"system.posix_acl_access"), errno.EOPNOTSUPP),
        ("getxattr", ("dir", b"trusted.x"), errno.EOPNOTSUPP),
        ("flush", (1,), errno.ENOSYS),
    ],
)
def test_every_refusal_has_its_errno(
    ops: Operations, request_name: str, args: tuple[object, ...], expected: int
) -> None:
    resolved = [inode_of(ops, a) if isinstance(a, str) else a for a in args]
    assert errno_of(getattr(ops, request_name), *resolved) == expected


def test_no_open_mode_answers_enosys_to_open(pack: Path) -> None:
    ops = make_ops(pack, noopen=True)
    assert errno_of(ops.open, inode_of(ops, "one.txt"), os.O_RDONLY) == errno.ENOSYS
    ops.store.reader.close()


def test_a_corrupt_chunk_is_eio_and_counted_and_the_rest_reads(pack: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.fan"
    shutil.copytree(pack, copy)
    ops = make_ops(copy)
    inode = inode_of(ops, "three.bin")
    cid = ops.index.first[inode - 1] + 1
    path = copy / partition_name(int(ops.index.chunk_partition[cid]))
    offset = int(ops.index.chunk_offset[cid])
    with open(path, "r+b") as f:
        f.seek(offset)
        first = f.read(1)
        f.seek(offset)
        f.write(bytes([first[0] ^ 1]))
    assert errno_of(ops.read, inode, CHUNK, CHUNK) == errno.EIO
    assert errno_of(ops.read, inode, CHUNK + 5, 10) == errno.EIO  # remembered: no new decode
    totals = ops.shared.totals()
    assert (totals["data_errors"], totals["corrupt_chunks"], totals["internal_errors"]) == (2, 1, 0)
    # Chunks 0 and 2 of the same file, and other files, still read.
    assert bytes(trio.run(ops.read, inode, 0, CHUNK)) == FILES["three.bin"][:CHUNK]
    assert (
        bytes(trio.run(ops.read, inode, 2 * CHUNK, CHUNK))
        == FILES["three.bin"][2 * CHUNK : 3 * CHUNK]
    )
    assert bytes(trio.run(ops.read, inode_of(ops, "one.txt"), 0, 10)) == b"x"
    ops.store.reader.close()


def test_an_unexpected_exception_is_eio_counted_and_logged_once(
    pack: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ops = make_ops(pack)
    inode = inode_of(ops, "three.bin")

    async def broken(*args: object, **kwargs: object) -> bytes:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ops.store, "chunk", broken)
    monkeypatch.setattr(logging.getLogger("fanfs"), "propagate", True)  # to caplog
    with caplog.at_level("ERROR", logger="fanfs"):
        assert errno_of(ops.read, inode, 0, 10) == errno.EIO
        assert errno_of(ops.read, inode, 0, 10) == errno.EIO
    assert ops.shared.counters[sh.INTERNAL_ERRORS] == 2
    bugs = [r for r in caplog.records if r.getMessage().startswith("internal error in read")]
    assert len(bugs) == 1  # once per request kind and exception type
    assert ops.logged_bugs == {("read", RuntimeError)}
    ops.store.reader.close()


def test_stats_walk_the_memory_once_a_second_and_count_every_request(
    ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader polling `user.fanfs.stats` once a file gets current counters each time, and
    the memory figures walked at most once per MEMORY_STATS_S."""
    import fanfs.operations

    walks: list[int] = []
    clock = [100.0]

    def memory(pid: int) -> dict[str, int]:
        walks.append(pid)
        return {"memory_rss_bytes": len(walks)}

    monkeypatch.setattr(fanfs.operations, "process_tree_memory", memory)
    monkeypatch.setattr(fanfs.operations.time, "monotonic", lambda: clock[0])

    def poll() -> dict[str, Any]:
        raw = trio.run(ops.getxattr, pyfuse3.ROOT_INODE, b"user.fanfs.stats")
        return dict(json.loads(raw))

    first = poll()
    trio.run(ops.lookup, pyfuse3.ROOT_INODE, b"one.txt")
    clock[0] += fanfs.operations.MEMORY_STATS_S * 0.9
    second = poll()
    assert len(walks) == 1 and second["memory_rss_bytes"] == 1
    assert second["lookups"] == first["lookups"] + 1
    clock[0] += fanfs.operations.MEMORY_STATS_S * 0.2
    assert poll()["memory_rss_bytes"] == 2 and len(walks) == 2


def test_stats_are_read_without_stalling_the_process(
    ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`user.fanfs.stats` walks the page tables of the mount's processes for its memory
    figures (tens of ms per GB resident): a worker thread does it, and the trio loop keeps
    serving meanwhile (here: a lookup answered while the walk takes 0.5 s)."""
    import fanfs.operations

    def slow_memory(pid: int) -> dict[str, int]:
        time.sleep(0.5)
        return {"memory_rss_bytes": 7, "memory_pss_bytes": 5, "memory_processes": pid}

    monkeypatch.setattr(fanfs.operations, "process_tree_memory", slow_memory)
    monkeypatch.setattr(ops, "main_pid", 3)
    answered: list[float] = []

    async def main() -> bytes:
        async with trio.open_nursery() as nursery:
            started = trio.current_time()

            async def lookup_meanwhile() -> None:
                await trio.sleep(0.05)
                await ops.lookup(pyfuse3.ROOT_INODE, b"one.txt")
                answered.append(trio.current_time() - started)

            nursery.start_soon(lookup_meanwhile)
            value = await ops.getxattr(pyfuse3.ROOT_INODE, b"user.fanfs.stats")
            answered.append(trio.current_time() - started)
            return value

    stats = json.loads(trio.run(main))
    assert (stats["memory_rss_bytes"], stats["memory_pss_bytes"], stats["memory_processes"]) == (
        7,
        5,
        3,
    )
    assert stats["lookups"] >= 1 and "resident_partitions" in stats
    lookup_s, stats_s = answered
    assert lookup_s < 0.3 and stats_s >= 0.5, answered
