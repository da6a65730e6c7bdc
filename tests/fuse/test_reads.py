"""Reads through a real mount return the source bytes, however the reader asks.

Every check runs in each mount mode of MODES: the kernel's no-open mode (the default with the
patched pyfuse3), ordinary opens (`--no-noopen`), no preloading, and one serving process.
Reads that must reach the filesystem rather than the kernel page cache drop the file's cached
pages first with POSIX_FADV_DONTNEED, or use O_DIRECT, which hands fanfs the reader's own
offset and length.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TEST_CHUNK_SIZE, Mount, run_fanfs
from tests.pagecache import drop_from_page_cache
from tests.treegen import make_dataset

pytestmark = pytest.mark.fuse

CS = TEST_CHUNK_SIZE
# noopen: the defaults (no-open mode, one serving process per core up to 2, preload).
# open: ordinary OPEN/RELEASE requests. cold: no preload, so every chunk is read from disk and
# decoded in a worker thread (the path a pack larger than memory takes). one-process: a
# single serving process.
MODES = {
    "noopen": (),
    "open": ("--no-noopen",),
    "cold": ("--preload", "no"),
    "one-process": ("--processes", "1"),
    "no-prefetch": ("--prefetch", "off", "--cache-memory", "0"),
}


def stats(mnt: Path) -> dict[str, Any]:
    return json.loads(os.getxattr(mnt, "user.fanfs.stats"))


def assert_clean_log(mount: Mount) -> None:
    text = mount.log_text()
    bad = [
        line
        for line in text.splitlines()
        if any(" %s " % lvl in line for lvl in ("WARNING", "ERROR", "CRITICAL"))
    ]
    assert not bad and "Traceback" not in text, text


@pytest.fixture(scope="module", params=list(MODES))
def mode_mount(
    request: pytest.FixtureRequest, edge_pack: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mount]:
    """The edge pack mounted in one read mode."""
    with Mount(
        edge_pack, tmp_path_factory.mktemp("reads-" + request.param) / "mnt", *MODES[request.param]
    ) as mount:
        yield mount
        assert_clean_log(mount)


@pytest.fixture(scope="module")
def sizes_fds(mode_mount: Mount, edge_tree: Path) -> Iterator[dict[str, tuple[int, int, int]]]:
    """name -> (fd on the mount, O_DIRECT fd on the mount, fd on the source) for every file of
    sizes/; closed before unmount."""
    fds = {}
    try:
        for name in sorted(os.listdir(edge_tree / "sizes")):
            fds[name] = (
                os.open(mode_mount.mnt / "sizes" / name, os.O_RDONLY),
                os.open(mode_mount.mnt / "sizes" / name, os.O_RDONLY | os.O_DIRECT),
                os.open(edge_tree / "sizes" / name, os.O_RDONLY),
            )
        yield fds
    finally:
        for pair in fds.values():
            for fd in pair:
                os.close(fd)


def test_mode_is_as_requested(mode_mount: Mount) -> None:
    s = stats(mode_mount.mnt)
    assert s["noopen"] is ("--no-noopen" not in mode_mount.extra)
    if "--preload" in mode_mount.extra:
        assert s["resident_partitions"] == 0  # nothing preloaded: reads go to disk
    if "--processes" in mode_mount.extra:
        assert s["processes"] == 1


def _interesting(size: int) -> list[int]:
    """Offsets and lengths next to chunk boundaries and EOF."""
    points = {0, 1, size - 1, size, size + 1, size + CS}
    for k in range(1, size // CS + 2):
        points |= {k * CS - 1, k * CS, k * CS + 1}
    return sorted(p for p in points if p >= 0)


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_pread_matches_source(
    sizes_fds: dict[str, tuple[int, int, int]], data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(sizes_fds)), label="file")
    mnt_fd, direct_fd, src_fd = sizes_fds[name]
    size = os.fstat(src_fd).st_size
    offset = data.draw(
        st.one_of(st.sampled_from(_interesting(size)), st.integers(0, size + 2 * CS)),
        label="offset",
    )
    length = data.draw(
        st.one_of(
            st.sampled_from([0, 1, 4095, 4096, 4097, CS - 1, CS, CS + 1, 2 * CS + 3]),
            st.integers(0, 3 * CS),
        ),
        label="length",
    )
    how = data.draw(st.sampled_from(["cached", "dropped", "direct"]), label="how")
    if how == "dropped":
        drop_from_page_cache(mnt_fd)
    fd = direct_fd if how == "direct" else mnt_fd
    assert os.pread(fd, length, offset) == os.pread(src_fd, length, offset)


def _read_in_blocks(path: Path, block: int, flags: int = 0) -> bytes:
    parts = []
    with open(os.open(path, os.O_RDONLY | flags), "rb", buffering=0) as f:
        drop_from_page_cache(f.fileno())
        while chunk := f.read(block):
            assert len(chunk) <= block
            parts.append(chunk)
    return b"".join(parts)


@pytest.mark.parametrize("block", [1, 4095, 65537])
def test_unbuffered_odd_blocks(mode_mount: Mount, edge_tree: Path, block: int) -> None:
    before = stats(mode_mount.mnt)
    checked = 0
    for name in sorted(os.listdir(edge_tree / "sizes")):
        expected = (edge_tree / "sizes" / name).read_bytes()
        if block == 1 and len(expected) > CS + 1:
            continue  # a million one-byte syscalls would prove nothing more
        assert _read_in_blocks(mode_mount.mnt / "sizes" / name, block) == expected, name
        checked += len(expected)
        if block > 1:  # O_DIRECT: fanfs gets exactly these odd offsets and lengths
            assert (
                _read_in_blocks(mode_mount.mnt / "sizes" / name, block, os.O_DIRECT) == expected
            ), name
    after = stats(mode_mount.mnt)
    # The page cache was dropped before each file, so the bytes came through fanfs, unless
    # the prefetcher or the cache filler pushed some into the page cache first (the no-prefetch
    # mode always checks).
    pushed = ("prefetch_pushed", "fill_pushed", "rest_pushed")
    if all(after[k] == before[k] for k in pushed):
        assert after["read_bytes"] - before["read_bytes"] >= checked
    else:
        assert "--prefetch" not in mode_mount.extra


def test_shared_mmap(mode_mount: Mount, edge_tree: Path) -> None:
    for name in ("text_655360", "rand_655360", "text_196625", "rand_196625"):
        expected = (edge_tree / "sizes" / name).read_bytes()
        fd = os.open(mode_mount.mnt / "sizes" / name, os.O_RDONLY)
        try:
            drop_from_page_cache(fd)
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                assert len(m) == len(expected)
                for k in range(1, len(expected) // CS + 1):  # straddle every chunk boundary first
                    assert m[k * CS - 3 : k * CS + 3] == expected[k * CS - 3 : k * CS + 3], (
                        name,
                        k,
                    )
                assert m[:] == expected, name
        finally:
            os.close(fd)


# A tree of our own for the numpy and concurrency checks: .npy files need adding, and a fresh
# mount of it is cold, so concurrent readers really race on the first decode of each chunk.
# Packed with the default chunk size, unlike the edge pack.


@pytest.fixture(scope="module")
def own_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("own") / "src"
    arrays = root / "arrays"
    arrays.mkdir(parents=True)
    # 1.6 MB of compressible floats (two chunks), 720 KB of noise (stored raw), a tiny one
    np.save(arrays / "ramp.npy", np.arange(400_000, dtype="<f4").reshape(400, 1000))
    np.save(arrays / "noise.npy", np.random.default_rng(1).standard_normal((300, 300)))
    np.save(arrays / "small.npy", np.arange(10, dtype="<i8"))
    make_dataset(root / "data", 400, per_dir=100)
    (root / "big").mkdir()
    (root / "big" / "rand").write_bytes(random.Random(7).randbytes(3 * 2**20 + 123))
    (root / "big" / "text").write_bytes(b"tensor label %d\n" * 200_000 % tuple(range(200_000)))
    return root


@pytest.fixture(scope="module")
def own_pack(own_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("own-pack") / "own.fan"
    # Files above the default 1 MiB chunk in blocks (format 5) of 512 KiB: larger than the
    # inline-decode limit, and the kernel asks for them in pieces, so reads go through worker
    # threads and the decoded-chunk cache.
    result = run_fanfs("pack", own_tree, out, "-q", "--block-size", "512KiB")
    assert result.returncode == 0, result.stderr
    return out


def _digests(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


# A reader process: waits for "go" on stdin, reads every file unbuffered in its own random
# order, prints {path: sha256} as JSON.
READER = r"""
import hashlib, json, os, random, sys
root, seed = sys.argv[1], int(sys.argv[2])
names = sys.argv[3:]
random.Random(seed).shuffle(names)
print("ready", flush=True)
sys.stdin.readline()
out = {}
for name in names:
    fd = os.open(os.path.join(root, name), os.O_RDONLY)
    h = hashlib.sha256()
    while block := os.read(fd, 100_000):
        h.update(block)
    os.close(fd)
    out[name] = h.hexdigest()
print(json.dumps(out))
"""


def _concurrent_digests(
    mnt: Path, names: list[str], threads: int, processes: int
) -> list[dict[str, str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(mnt), str(1000 + i), *names],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    results: list[dict[str, str]] = [{} for _ in range(threads)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)

    def reader(i: int) -> None:
        order = list(names)
        random.Random(i).shuffle(order)
        try:
            barrier.wait()
            for name in order:
                with open(mnt / name, "rb") as f:  # buffered, as PIL/numpy/torch open files
                    results[i][name] = hashlib.sha256(f.read()).hexdigest()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    workers = [threading.Thread(target=reader, args=(i,)) for i in range(threads)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for worker in workers:
            worker.start()
        barrier.wait(timeout=30)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0
            results.append(json.loads(out))
    finally:
        for worker in workers:
            worker.join(60)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not errors, errors
    return results


@pytest.mark.parametrize("mode", list(MODES))
def test_fresh_mount_concurrent_readers_and_numpy(
    mode: str, own_tree: Path, own_pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(own_pack, *MODES[mode])
    expected = _digests(own_tree)
    assert len(expected) > 400

    results = _concurrent_digests(mount.mnt, sorted(expected), threads=8, processes=4)
    assert len(results) == 12
    for i, got in enumerate(results):
        bad = sorted(name for name in expected if got.get(name) != expected[name])
        assert not bad, "reader %d got wrong bytes for %s" % (i, bad[:5])

    for name in ("ramp.npy", "noise.npy", "small.npy"):
        source = np.load(own_tree / "arrays" / name)
        mapped = np.load(mount.mnt / "arrays" / name, mmap_mode="r")
        assert isinstance(mapped, np.memmap)
        assert mapped.dtype == source.dtype and mapped.shape == source.shape
        assert np.array_equal(mapped, source), name
        assert np.array_equal(mapped[-1], source[-1]), name
        del mapped
        assert np.array_equal(np.load(mount.mnt / "arrays" / name), source), name

    s = stats(mount.mnt)
    assert s["noopen"] is ("--no-noopen" not in MODES[mode])
    assert (s["data_errors"], s["internal_errors"], s["corrupt_chunks"]) == (0, 0, 0)
    assert s["thread_decodes"] > 0  # premise: the 512 KiB blocks were decoded in worker threads
    assert_clean_log(mount)
