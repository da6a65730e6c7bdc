"""The streaming pack (issue 11): byte-identical output to the pre-streaming code, bounded
memory per file, many source reads in flight, and a bounded `fanfs plan`.

Byte identity is checked three ways: the golden sources of the current format repack to
exactly its committed golden packs (tests/data/make_golden.py's options); the golden-v4
sources repack to golden-v4's index and partitions byte for byte (format 5 changed only the
manifest of a pack without blocks); and the reference tree of tests/reftree.py packs, under
several option sets, to exactly the digests in tests/data/pack-reference.json (recorded by
the pre-streaming code; the manifests again at format 5).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fanfs.pack
from fanfs.cli import main as fanfs_main
from fanfs.compression import CODEC_ZSTD, parse_codec
from fanfs.errors import UsageError
from fanfs.format.layout import PLAIN_FORMAT_VERSION
from fanfs.format.reader import PackReader
from fanfs.pack import PackOptions, run_pack
from fanfs.sample import generate_small
from fanfs.verify import verify_pack
from fanfs.walk import sample_tree, walk_tree
from tests.conftest import lookup_path, run_fanfs
from tests.conftest import open_reader as _open
from tests.data.make_golden import CODECS_V3, CODECS_V6, EXTRA_ARGS, MTIME, PACK_ARGS
from tests.reftree import SCENARIOS, build_reference_tree, pack_digests
from tests.unit.test_format import _read as read_back

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
GOLDEN = DATA_DIR / ("golden-v%d" % PLAIN_FORMAT_VERSION)
GOLDEN_V4 = DATA_DIR / "golden-v4"
REFERENCE = json.loads((DATA_DIR / "pack-reference.json").read_text())


def _pack(src: Path, out: Path, *args: str) -> None:
    assert fanfs_main(["pack", str(src), str(out), *args]) == 0


def _extract_golden(tmp_path_factory: pytest.TempPathFactory, golden: Path) -> Path:
    src = tmp_path_factory.mktemp(golden.name) / "src"
    src.mkdir()
    with tarfile.open(golden / "src.tar.gz") as tar:
        tar.extractall(src, filter="fully_trusted")
        for member in tar.getmembers():  # tarfile leaves symlinks' own mtimes unset
            if member.issym():
                os.utime(src / member.name, (MTIME, MTIME), follow_symlinks=False)
    os.utime(src, (MTIME, MTIME))  # the tar has no entry for the root itself
    return src


@pytest.fixture(scope="module")
def golden_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _extract_golden(tmp_path_factory, GOLDEN)


@pytest.fixture(scope="module")
def golden_v4_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _extract_golden(tmp_path_factory, GOLDEN_V4)


# Packs whose bytes follow the dictionary trainer, which issue 14 changed on purpose (fixed
# training parameters, the dictionary size chosen by measurement): their golden-v4 copies stay
# as packs to read (test_format), and their repacks are checked for determinism instead.
TRAINED = {"auto.fan", "lz4dict.fan"}


# Golden packs and references recorded before shared chunks (up to version 5): `--no-dedup`
# writes them again byte for byte; the default is checked against them below.
NO_DEDUP = ("--no-dedup",)
# Packs recorded before version 6 have their index as its columns.
PLAIN_INDEX = ("--index-codec", "none")


@pytest.mark.parametrize("name", sorted(set(CODECS_V6) - TRAINED))
def test_golden_sources_repack_to_the_golden_bytes(
    golden_src: Path, tmp_path: Path, name: str
) -> None:
    out = tmp_path / name
    _pack(
        golden_src,
        out,
        "--codec",
        *CODECS_V6[name].split(),
        *PACK_ARGS,
        *EXTRA_ARGS.get(name, []),
    )
    assert pack_digests(out, with_manifest=True) == pack_digests(GOLDEN / name, with_manifest=True)


@pytest.mark.parametrize("tree", ["golden brotli", "reference zstd-4k-bcast"])
def test_shared_chunks_are_stored_once_and_read_back_the_same(
    golden_src: Path, reference_src: Path, tmp_path: Path, tree: str
) -> None:
    """Both trees hold chunks with equal bytes: packed by default, each is stored once (the
    same bytes every time), every index row still reads its own file's bytes, and a chunk of
    a broadcast file is never shared with one of a regular partition."""
    src, args = (
        (golden_src, ["--codec", "brotli:5", *PACK_ARGS])
        if tree.startswith("golden")
        else (reference_src, SCENARIOS["zstd-4k-bcast"])
    )
    packs = {}
    for name, extra in (("dedup", ()), ("again", ()), ("plain", NO_DEDUP)):
        packs[name] = tmp_path / name
        _pack(src, packs[name], "-q", *args, *extra)
    assert pack_digests(packs["dedup"], with_manifest=True) == pack_digests(
        packs["again"], with_manifest=True
    )
    shared = json.loads((packs["dedup"] / "fanfs.manifest").read_bytes()[20:])
    plain = json.loads((packs["plain"] / "fanfs.manifest").read_bytes()[20:])
    rows = shared["codec_stats"].pop(fanfs.pack.SHARED_STATS)
    assert rows["chunks"] > 0 and rows["bytes_out"] == 0
    assert fanfs.pack.SHARED_STATS not in plain["codec_stats"]
    parts = [p for p in packs["dedup"].iterdir() if p.name.startswith("part-")]
    stored = sum(p.stat().st_size for p in parts)
    assert shared["totals"]["bytes_out"] == stored < plain["totals"]["bytes_out"]
    assert verify_pack(str(packs["dedup"]), quiet=True) == 0
    dedup_reader, plain_reader = _open(packs["dedup"]), _open(packs["plain"])
    index = plain_reader.index
    assert dedup_reader.index.chunk_count == index.chunk_count
    files = [e for e in range(index.entry_count) if stat.S_ISREG(index.mode[e])]
    for entry in files:  # every chunk's crc32 (bound to its own id) checked as it is read
        assert read_back(dedup_reader, entry) == read_back(plain_reader, entry)

    # Each chunk stays in its own set of partitions (broadcast or regular).
    def broadcast_chunks(reader: PackReader) -> list[bool]:
        sets = [part["broadcast"] for part in reader.partitions]
        return [sets[p] for p in reader.index.arrays["partition"].tolist()]

    assert broadcast_chunks(dedup_reader) == broadcast_chunks(plain_reader)
    assert any(broadcast_chunks(plain_reader))


@pytest.mark.parametrize("name", sorted(set(CODECS_V3) - TRAINED))
def test_format_4_data_bytes_are_unchanged(golden_v4_src: Path, tmp_path: Path, name: str) -> None:
    """Format 5 added blocks for files larger than a chunk: a pack with none (golden-v4's
    4 KiB chunks leave no room for blocks) has format 4's index and partitions, byte for
    byte, and only the manifest differs (version, `block_size`, from version 6 the index's
    `codec` and `usize`), when its index is stored as its columns."""
    out = tmp_path / name
    _pack(
        golden_v4_src,
        out,
        *("--codec", *CODECS_V3[name].split()),
        *(*PACK_ARGS, *NO_DEDUP, *PLAIN_INDEX),
    )
    assert pack_digests(out, with_manifest=False) == pack_digests(
        GOLDEN_V4 / name, with_manifest=False
    )
    manifest = json.loads((out / "fanfs.manifest").read_bytes()[20:])
    assert (manifest["format_version"], manifest["block_size"]) == (PLAIN_FORMAT_VERSION, 0)
    assert manifest["index"]["codec"] == "none"


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_trained_packs_are_the_same_bytes_every_time(
    golden_src: Path, tmp_path: Path, name: str
) -> None:
    digests = []
    for n in range(2):
        out = tmp_path / ("%d-%s" % (n, name))
        _pack(golden_src, out, "--codec", *CODECS_V3[name].split(), *PACK_ARGS)
        # An auto pack's manifest holds the timings measured while planning.
        digests.append(pack_digests(out, with_manifest=False))
    assert digests[0] == digests[1]
    assert any(key.startswith("part-") for key in digests[0])


@pytest.fixture(scope="module")
def reference_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("reference") / "src"
    build_reference_tree(src)
    return src


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_reference_tree_packs_to_the_recorded_bytes(
    reference_src: Path, tmp_path: Path, scenario: str
) -> None:
    out = tmp_path / scenario
    _pack(reference_src, out, "-q", *SCENARIOS[scenario], *NO_DEDUP, *PLAIN_INDEX)
    assert pack_digests(out, with_manifest=not scenario.startswith("auto")) == REFERENCE[scenario]


# --- the reader pool ------------------------------------------------------------------------


def _small_tree(root: Path, files: int, size: int = 3000) -> Path:
    for i in range(files):
        d = root / ("c%d" % (i % 4))
        d.mkdir(parents=True, exist_ok=True)
        (d / ("f%04d.txt" % i)).write_bytes(b"%06d " % i * (size // 7))
    return root


def test_many_reads_in_flight_and_the_same_bytes_whatever_the_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow source (each read takes 20 ms, as on a loaded parallel filesystem) is read by
    --read-threads threads at once, with one compression thread; the pack is the same bytes as
    with one reader thread."""
    src = _small_tree(tmp_path / "src", 240)
    lock = threading.Lock()
    state = {"now": 0, "most": 0}
    real = fanfs.pack.read_chunk

    def slow_read(*args: Any) -> bytes:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.02)
        try:
            return real(*args)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(fanfs.pack, "read_chunk", slow_read)
    start = time.perf_counter()
    _pack(src, tmp_path / "many", "-q", "--jobs", "1", "--read-threads", "16")
    elapsed = time.perf_counter() - start
    assert state["most"] >= 12, state  # 16 threads; a batch per thread at a time
    assert elapsed < 240 * 0.02 / 4, elapsed  # sequential reads alone would take 4.8 s
    state["most"] = 0
    _pack(src, tmp_path / "one", "-q", "--jobs", "2", "--read-threads", "1")
    assert state["most"] == 1
    assert pack_digests(tmp_path / "many", with_manifest=True) == pack_digests(
        tmp_path / "one", with_manifest=True
    )


def test_read_threads_is_validated(tmp_path: Path) -> None:
    src = _small_tree(tmp_path / "src", 2)
    with pytest.raises(UsageError, match="--read-threads"):
        run_pack(PackOptions(str(src), str(tmp_path / "out"), parse_codec("none"), read_threads=-1))


# --- files skipped while packing: the index is rebuilt without them --------------------------


def _failing_reads(
    monkeypatch: pytest.MonkeyPatch, name: bytes, chunk_no: int
) -> Callable[[], int]:
    """Reads of chunk `chunk_no` of the files at `name` or `*/name` fail with EACCES."""
    real = fanfs.pack.read_chunk
    calls = [0]

    def read(path: bytes, rel: bytes, size: int, offset: int, length: int) -> bytes:
        if (rel == name or rel.endswith(b"/" + name)) and offset // 4096 == chunk_no:
            calls[0] += 1
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, rel, size, offset, length)

    monkeypatch.setattr(fanfs.pack, "read_chunk", read)
    return lambda: calls[0]


def test_a_file_skipped_at_its_first_chunk_leaves_the_pack_of_the_tree_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    build_reference_tree(src)
    victim = min(p for p in (src / "train" / "c03").iterdir() if p.stat().st_size > 5000)
    calls = _failing_reads(monkeypatch, b"train/c03/" + victim.name.encode(), 0)
    _pack(src, tmp_path / "skipped", "-q", "--skip-unreadable", "--chunk-size", "4KiB")
    assert calls() == 1
    dir_times = os.stat(victim.parent)
    victim.unlink()
    os.utime(victim.parent, ns=(dir_times.st_atime_ns, dir_times.st_mtime_ns))
    _pack(src, tmp_path / "without", "-q", "--chunk-size", "4KiB")
    skipped = pack_digests(tmp_path / "skipped", with_manifest=False)
    assert skipped == pack_digests(tmp_path / "without", with_manifest=False)
    manifest = _open(tmp_path / "skipped").manifest
    assert manifest["totals"]["skipped"] == 1


def test_a_file_skipped_after_some_chunks_is_gone_and_the_rest_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    build_reference_tree(src)
    _failing_reads(monkeypatch, b"t0002", 1)  # every t0002 of 2 chunks or more
    out = tmp_path / "pack"
    _pack(src, out, "-q", "--skip-unreadable", "--chunk-size", "4KiB", "--broadcast", "val")
    reader = _open(out)
    assert verify_pack(str(out), quiet=True) == 0
    index = reader.index
    for dirpath, dirnames, filenames in os.walk(os.fsencode(src)):
        for name in filenames + dirnames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, os.fsencode(src))
            entry = lookup_path(index, rel)
            if rel.endswith(b"/t0002") and os.path.getsize(path) > 4096:
                assert entry is None, rel
                continue
            assert entry is not None, rel
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    assert read_back(reader, entry) == f.read(), rel


# --- memory per file ------------------------------------------------------------------------

RSS_FILES = 100_000
RSS_BOUND_BYTES_PER_FILE = 400  # the aim: a few hundred bytes per file (issue 11)

_PACK_RSS = """
import resource, sys
from fanfs.cli import main
rc = main(["pack", "-q", "--codec", "lz4", sys.argv[1], sys.argv[2]])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
sys.exit(rc)
"""


def _peak_rss(src: Path, out: Path) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", _PACK_RSS, str(src), str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    shutil.rmtree(out)
    return int(proc.stdout.split()[-1])


@pytest.mark.parametrize("bound", [RSS_BOUND_BYTES_PER_FILE])
def test_peak_memory_per_file_is_bounded(tmp_path: Path, bound: int) -> None:
    """Peak RSS of packing RSS_FILES tiny files, less that of packing 1,000, per file."""
    small, big = tmp_path / "small", tmp_path / "big"
    try:
        generate_small(str(small), 1000, min_size=1, max_size=64)
        generate_small(str(big), RSS_FILES, min_size=1, max_size=64)
        base = _peak_rss(small, tmp_path / "out")
        peak = _peak_rss(big, tmp_path / "out")
    finally:
        shutil.rmtree(big, ignore_errors=True)
    per_file = (peak - base) / (RSS_FILES - 1000)
    print("peak RSS %d MB, base %d MB: %.0f bytes per file" % (peak >> 20, base >> 20, per_file))
    assert per_file < bound, "%.0f bytes per file (%d MB peak, %d MB base)" % (
        per_file,
        peak >> 20,
        base >> 20,
    )


# --- fanfs plan: bounded whatever the tree --------------------------------------------------

PLAN_FILES = 60_000
PLAN_SAMPLE_ENTRIES = 5_000
PLAN_TIME_BOUND_S = 30.0  # generous for a loaded 2-core machine; it takes about 2 s alone


@pytest.fixture(scope="module")
def large_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    root = tmp_path_factory.mktemp("large") / "src"
    total = generate_small(str(root), PLAN_FILES)
    yield root, total
    shutil.rmtree(root, ignore_errors=True)


_PLAN_ARGS = ["--codecs", "lz4", "--sample-bytes", "1MiB", "--read-mbps", "100"]
_PLAN_ARGS += ["--read-latency-ms", "1", "--time-budget", "2"]


@pytest.mark.parametrize("bound_s", [PLAN_TIME_BOUND_S])
def test_plan_of_a_large_tree_is_bounded_and_extrapolated(
    large_tree: tuple[Path, int], bound_s: float, capsys: pytest.CaptureFixture[str]
) -> None:
    root, total = large_tree
    start = time.perf_counter()
    args = ["plan", str(root), "--json", "--sample-entries", str(PLAN_SAMPLE_ENTRIES)]
    assert fanfs_main([*args, *_PLAN_ARGS]) == 0
    assert time.perf_counter() - start < bound_s
    record = json.loads(capsys.readouterr().out)
    walk = record["sample"]["walk"]
    # At most the exact attempt plus the sampled walk (and the last directory's listing).
    assert walk["entries_examined"] <= 2 * PLAN_SAMPLE_ENTRIES + 1000, walk
    assert walk["files_sampled"] < PLAN_FILES / 10, walk
    assert not walk["partial"], walk  # every level reached, no listing cut short
    # Every class directory holds the same number of files: the estimate is exact.
    assert walk["files_estimated"] == PLAN_FILES == record["files"]
    assert abs(walk["bytes_estimated"] - total) < 0.1 * total, (walk, total)
    assert abs(record["bytes"] - total) < 0.1 * total
    assert sum(row["files"] for row in record["classes"]) == pytest.approx(PLAN_FILES, rel=0.01)


def test_plan_table_prints_the_sample_sizes(
    large_tree: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = large_tree
    args = ["plan", str(root), "--sample-entries", str(PLAN_SAMPLE_ENTRIES), *_PLAN_ARGS]
    assert fanfs_main(args) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("walk ")]
    assert len(lines) == 1
    assert re.match(r"^walk +sampled: \d+ files of an estimated 60000 \(", lines[0]), lines


def test_a_tree_within_the_bound_is_walked_whole(reference_src: Path) -> None:
    sample = sample_tree(str(reference_src), max_entries=100_000)
    assert sample.complete and sample.examined < 100_000
    assert sample.files == walk_tree(str(reference_src))
    assert sample.est_files == len(sample.files)


def test_auto_pack_of_a_sampled_tree_codes_unsampled_classes_with_the_default(
    tmp_path: Path,
) -> None:
    """A class no sampled file belongs to (the sampled walk missed its directory) is stored
    with zstd:3, the --codec default."""
    src = tmp_path / "src"
    for d in range(120):
        (src / ("d%03d" % d)).mkdir(parents=True)
        for i in range(20):
            (src / ("d%03d" % d) / ("%02d.a" % i)).write_bytes(b"a%d " % i * 100)
    (src / "d077" / "rare.zzz").write_bytes(b"rare " * 300)
    out = tmp_path / "out"
    _pack(src, out, "-q", "--codec", "auto", "--sample-entries", "300", *_PLAN_ARGS)
    reader = _open(out)
    assert reader.manifest["plan"]["sample"]["walk"]["files_sampled"] < 2400
    entry = lookup_path(reader.index, "d077/rare.zzz")
    assert entry is not None
    classes = {row["class"] for row in reader.manifest["plan"]["classes"]}
    assert not any(c.endswith(".zzz") for c in classes), classes
    assert reader.index.chunk_codec[reader.index.first[entry]] == CODEC_ZSTD
    assert verify_pack(str(out), quiet=True) == 0


def test_auto_pack_reports_a_special_file_once(tmp_path: Path) -> None:
    """The plan profiles the tree the pack walked: its warnings are not printed twice."""
    src = _small_tree(tmp_path / "src", 40)
    os.mkfifo(src / "c0" / "pipe")
    out = tmp_path / "out"
    result = run_fanfs("pack", src, out, "-q", "--codec", "auto", *_PLAN_ARGS)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("skipping c0/pipe: not a regular file") == 1, result.stderr


def test_a_hash_collision_never_shares_a_chunk(tmp_path: Path) -> None:
    """The shared-chunk table trusts only equal bytes: a key met with other bytes stores them
    anew (the first chunk keeps the key), and the table finds every key as it grows."""
    from fanfs.format.writer import PackWriter, _SharedChunks

    writer = PackWriter(str(tmp_path), 1, 0)
    try:
        first = writer.add_chunk(b"alpha" * 100, False, key=7)
        other = writer.add_chunk(b"omega" * 100, False, key=7)
        again = writer.add_chunk(b"alpha" * 100, False, key=7)
        assert first == (0, 0, False)
        assert other == (0, 500, False)
        assert again == (0, 0, True)
        writer.flush()  # the earlier copy is read back from the file once written out
        assert writer.add_chunk(b"omega" * 100, False, key=7) == (0, 1000, False)
        assert writer.add_chunk(b"alpha" * 100, False, key=None) == (0, 1500, False)
    finally:
        writer.abort()
    table = _SharedChunks()
    keys = [(k * 0x9E3779B97F4A7C15) & (2**64 - 1) or 1 for k in range(1, 20_000)]
    for n, key in enumerate(keys):
        table.add(key, n % 300, n * 1000)
    assert [table.find(key) for key in keys] == [(n % 300, n * 1000) for n in range(len(keys))]
    assert table.find(12345) is None
