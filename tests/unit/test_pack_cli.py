"""`fanfs pack` as a user runs it: every bad input is one clear line and an exit code.

Each failing run must print exactly one line on stderr (no traceback), leave no OUT and no
temporary `.OUT.fanfs-tmp-PID` directory behind. Unreadable files need a user for whom
`open` really fails, so those tests run the pack as `nobody` through setpriv.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fanfs._sizes import format_size
from fanfs.compression import parse_codec
from fanfs.errors import PackInputError
from fanfs.pack import PackOptions, read_chunk, run_pack
from fanfs.walk import TreeWalk
from tests.conftest import FANFS, lookup_path, run_fanfs
from tests.conftest import open_reader as _open
from tests.treegen import label_text as _text
from tests.treegen import write_tree as _write_tree

RunAs = Callable[..., "subprocess.CompletedProcess[str]"]


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (asserting there is exactly one)."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _leftovers(parent: Path) -> list[str]:
    return sorted(
        glob.glob(str(parent / ".*.fanfs-tmp-*")) + glob.glob(str(parent / "*.fanfs-old-*"))
    )


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = _write_tree(
        tmp_path / "src",
        {"a.txt": _text(300_000, 1), "sub/r.bin": random.Random(2).randbytes(5000)},
    )
    os.symlink("a.txt", root / "link")
    return root


# --- SRC and OUT ------------------------------------------------------------------------------


def test_src_missing(tmp_path: Path) -> None:
    result = run_fanfs("pack", tmp_path / "nope", tmp_path / "out")
    assert result.returncode == 2
    assert _error_line(result) == "fanfs pack: error: source %s does not exist" % (
        tmp_path / "nope"
    )
    assert not (tmp_path / "out").exists()


def test_src_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    result = run_fanfs("pack", tmp_path / "file", tmp_path / "out")
    assert result.returncode == 2
    assert _error_line(result) == "fanfs pack: error: source %s is not a directory" % (
        tmp_path / "file"
    )
    assert not (tmp_path / "out").exists()


def test_out_not_empty_without_force(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious").write_bytes(b"keep me")
    result = run_fanfs("pack", src, out)
    assert result.returncode == 2
    assert _error_line(result) == (
        "fanfs pack: error: output %s exists and is not empty (use --force to replace it)" % out
    )
    assert [p.name for p in out.iterdir()] == ["precious"]
    assert _leftovers(tmp_path) == []


def test_out_replaced_with_force(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    old_src = _write_tree(tmp_path / "old", {"old.txt": b"old"})
    assert run_fanfs("pack", old_src, out, "-q").returncode == 0
    (out / "stray").write_bytes(b"x")
    result = run_fanfs("pack", src, out, "-q", "--force")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert "stray" not in os.listdir(out)
    index = _open(out).index
    assert lookup_path(index, "old.txt") is None
    assert lookup_path(index, "a.txt") is not None and lookup_path(index, "sub/r.bin") is not None
    assert _leftovers(tmp_path) == []


def test_out_empty_directory_is_used(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = run_fanfs("pack", src, out, "-q")
    assert (result.returncode, result.stderr) == (0, "")
    assert lookup_path(_open(out).index, "a.txt") is not None


@pytest.mark.parametrize("kind", ["file", "symlink_to_dir", "dangling_symlink"])
def test_out_is_not_a_directory(src: Path, tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    if kind == "file":
        out.write_bytes(b"x")
    elif kind == "symlink_to_dir":
        (tmp_path / "real").mkdir()
        os.symlink(tmp_path / "real", out)
    else:
        os.symlink(tmp_path / "nowhere", out)
    result = run_fanfs("pack", src, out)
    assert result.returncode == 2
    assert _error_line(result) == "fanfs pack: error: output %s exists and is not a directory" % out
    assert os.path.islink(out) or out.read_bytes() == b"x"


@pytest.mark.parametrize("where", ["inside", "same", "deep_inside"])
def test_out_inside_src(src: Path, where: str) -> None:
    out = {"inside": src / "out", "same": src, "deep_inside": src / "sub" / "out"}[where]
    result = run_fanfs("pack", src, out, "--force")
    assert result.returncode == 2
    assert _error_line(result) == "fanfs pack: error: output %s is inside the source %s" % (
        out,
        src,
    )
    assert sorted(os.listdir(src)) == ["a.txt", "link", "sub"]


def test_src_inside_out_is_refused_even_with_force(tmp_path: Path) -> None:
    # Replacing OUT would delete the very tree being packed.
    out = tmp_path / "out"
    src = _write_tree(out / "dataset", {"x.txt": b"the only copy\n"})
    result = run_fanfs("pack", src, out, "--force", "-q")
    assert (src / "x.txt").read_bytes() == b"the only copy\n", "fanfs pack deleted its own source"
    assert result.returncode == 2
    assert "inside" in _error_line(result)


def test_out_parent_missing(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "no" / "such" / "out"
    result = run_fanfs("pack", src, out)
    assert result.returncode == 2
    assert _error_line(result) == "fanfs pack: error: cannot create %s: %s does not exist" % (
        out,
        out.parent,
    )
    assert not (tmp_path / "no").exists()


# --- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--codec", "gzip"],
            "unknown codec 'gzip' (choose none, lz4, lz4hc[:LEVEL], zstd[:LEVEL], brotli[:LEVEL] or lzma[:LEVEL], optionally +shuf2|4|8)",
        ),
        (["--codec", "lz4:3"], "codec lz4 takes no level (got 'lz4:3')"),
        (
            ["--chunk-size", "4x"],
            "invalid size '4x' (expected a number with an optional unit such as 4MiB)",
        ),
        (["--chunk-size", "1KiB"], "--chunk-size must be between 4KiB and 64MiB"),
        (["--chunk-size", "65MiB"], "--chunk-size must be between 4KiB and 64MiB"),
        (
            ["--block-size", "1MiB"],
            "--block-size must be 0 or between 4KiB and half the chunk size (512.0 KiB)",
        ),
        (
            ["--chunk-size", "8KiB", "--block-size", "2KiB"],
            "--block-size must be 0 or between 4KiB and half the chunk size (4.0 KiB)",
        ),
        (
            ["--solid-block", "2KiB"],
            "--solid-block must be 0 or between 4KiB and the chunk size (1.0 MiB)",
        ),
        (
            ["--chunk-size", "64KiB", "--solid-block", "128KiB"],
            "--solid-block must be 0 or between 4KiB and the chunk size (64.0 KiB)",
        ),
        (["--partitions", "0"], "--partitions must be between 1 and 4096"),
        (["--partitions", "4097"], "--partitions must be between 1 and 4096"),
    ],
)
def test_invalid_option(src: Path, tmp_path: Path, args: list[str], message: str) -> None:
    # Every --codec message is checked in test_compression; here, that the CLI prints them.
    result = run_fanfs("pack", src, tmp_path / "out", *args)
    assert result.returncode == 2
    assert _error_line(result) == "fanfs pack: error: " + message
    assert not (tmp_path / "out").exists()
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("jobs", ["-1", "-8"])
def test_negative_jobs_is_a_usage_error(src: Path, tmp_path: Path, jobs: str) -> None:
    result = run_fanfs("pack", src, tmp_path / "out", "--jobs", jobs)
    line = _error_line(result)
    assert result.returncode == 2
    assert line.startswith("fanfs pack: error: ") and "--jobs" in line
    assert not (tmp_path / "out").exists()
    assert _leftovers(tmp_path) == []


def test_absurd_chunk_size_is_a_usage_error(src: Path, tmp_path: Path) -> None:
    result = run_fanfs("pack", src, tmp_path / "out", "--chunk-size", "9" * 400)
    line = _error_line(result)
    assert result.returncode == 2
    assert line.startswith("fanfs pack: error: ")
    assert not (tmp_path / "out").exists()


def test_valid_boundaries_are_accepted(src: Path, tmp_path: Path) -> None:
    # (4096 partitions is valid too, but fsyncing 4096 files takes seconds.)
    for i, args in enumerate(
        (
            ["--chunk-size", "4KiB", "--partitions", "1"],
            ["--chunk-size", "64MiB", "--partitions", "3"],
        )
    ):
        out = tmp_path / ("out%d" % i)
        result = run_fanfs("pack", src, out, "-q", *args)
        assert (result.returncode, result.stderr) == (0, "")
        assert len(_open(out).partitions) == int(args[3])


# --- output -----------------------------------------------------------------------------------


def test_quiet_prints_nothing(src: Path, tmp_path: Path) -> None:
    result = run_fanfs("pack", src, tmp_path / "out", "-q")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_summary_table(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_fanfs("pack", src, out, "--partitions", "2")
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[0] == "packed 2 files, 2 directories, 1 symlinks into %s (2 partitions)" % out
    assert lines[1].split() == ["codec", "chunks", "bytes", "in", "bytes", "out", "ratio"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert list(rows) == ["none", "zstd", "total"]  # sorted codecs, then the total
    bytes_in = 300_000 + 5000
    bytes_out = sum(os.path.getsize(p) for p in glob.glob(str(out / "part-*")))
    assert bytes_out < bytes_in
    expected_total = [
        "2",
        *format_size(bytes_in).split(),
        *format_size(bytes_out).split(),
        "%.2fx" % (bytes_in / bytes_out),
    ]
    assert rows["total"] == expected_total
    assert rows["none"] == ["1", "4.9", "KiB", "4.9", "KiB", "1.00x"]  # the random file, stored raw
    assert rows["zstd"][:3] == ["1", *format_size(300_000).split()]


# --- special and unreadable files -------------------------------------------------------------


def test_sockets_and_fifos_are_skipped_with_a_warning(src: Path, tmp_path: Path) -> None:
    os.mkfifo(src / "sub" / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(src / "sock"))
        out = tmp_path / "out"
        result = run_fanfs("pack", src, out, "-q")
    finally:
        sock.close()
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        "fanfs: warning: skipping sock: not a regular file, directory or symlink",
        "fanfs: warning: skipping sub/fifo: not a regular file, directory or symlink",
    ]
    reader = _open(out)
    assert (
        lookup_path(reader.index, "sock") is None and lookup_path(reader.index, "sub/fifo") is None
    )
    assert reader.index.entry_count == 5  # root, a.txt, link, sub, sub/r.bin
    assert reader.manifest["totals"]["files"] == 2


def _nobody() -> tuple[int, int] | None:
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return pw.pw_uid, pw.pw_gid


@pytest.fixture
def as_nobody() -> Iterator[tuple[Path, RunAs]]:
    """(a world-readable scratch dir, run(*args) -> CompletedProcess running fanfs as nobody)."""
    ids = _nobody()
    if os.geteuid() != 0:
        pytest.skip("needs root to run a pack as another user")
    if shutil.which("setpriv") is None or ids is None:
        pytest.skip("needs setpriv and a 'nobody' user to make a file unreadable to the packer")
    uid, gid = ids
    # pytest's tmp_path is 0700 root: nobody could not even reach SRC.
    base = Path(tempfile.mkdtemp(prefix="fanfs-test-nobody-", dir="/tmp"))
    os.chmod(base, 0o755)
    (base / "outdir").mkdir()
    os.chown(base / "outdir", uid, gid)

    def run(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
        cmd = [
            "setpriv",
            "--reuid=%d" % uid,
            "--regid=%d" % gid,
            "--clear-groups",
            *FANFS,
            *map(str, args),
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd="/")

    try:
        yield base, run
    finally:
        shutil.rmtree(base)


def _nobody_tree(base: Path) -> Path:
    root = _write_tree(
        base / "src",
        {
            "ok.txt": b"fine\n",
            "sub/locked": b"secret\n",
            "sub/also_ok": b"ok\n",
            "big.txt": _text(200_000, 3),
        },
    )
    os.chmod(root / "sub" / "locked", 0)
    return root


def test_unreadable_file_is_an_error(as_nobody: tuple[Path, RunAs]) -> None:
    base, run = as_nobody
    src = _nobody_tree(base)
    out = base / "outdir" / "pack"
    result = run("pack", src, out, "-q")
    assert result.returncode == 2
    assert _error_line(result) == (
        "fanfs pack: error: cannot read sub/locked: Permission denied"
        " (use --skip-unreadable to skip it)"
    )
    assert not out.exists()
    assert os.listdir(base / "outdir") == []  # no temporary directory either


def test_unreadable_file_skipped_with_skip_unreadable(as_nobody: tuple[Path, RunAs]) -> None:
    base, run = as_nobody
    src = _nobody_tree(base)
    out = base / "outdir" / "pack"
    result = run("pack", src, out, "-q", "--skip-unreadable")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "fanfs: warning: skipping unreadable sub/locked: Permission denied"
    ]
    reader = _open(out)
    assert lookup_path(reader.index, "sub/locked") is None
    for name in ("ok.txt", "sub/also_ok", "big.txt"):
        assert lookup_path(reader.index, name) is not None, name
    assert reader.manifest["totals"]["files"] == 3
    assert reader.manifest["totals"]["skipped"] == 1
    assert os.listdir(base / "outdir") == ["pack"]


def test_unreadable_directory(as_nobody: tuple[Path, RunAs]) -> None:
    base, run = as_nobody
    src = _nobody_tree(base)
    os.chmod(src / "sub" / "locked", 0o644)
    os.chmod(src / "sub", 0)
    out = base / "outdir" / "pack"
    result = run("pack", src, out, "-q")
    assert result.returncode == 2
    assert _error_line(result) == (
        "fanfs pack: error: cannot read sub: Permission denied (use --skip-unreadable to skip it)"
    )
    assert os.listdir(base / "outdir") == []
    result = run("pack", src, out, "-q", "--skip-unreadable")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "fanfs: warning: skipping unreadable sub: Permission denied"
    ]
    index = _open(out).index
    assert lookup_path(index, "sub") is None and lookup_path(index, "ok.txt") is not None


def test_unsearchable_directory(as_nobody: tuple[Path, RunAs]) -> None:
    # r-- but no x: names can be listed but not stat'ed. Still "cannot read", exit 2, and
    # skippable with --skip-unreadable; never a raw "[Errno 13] ... b'...'" with exit 1.
    base, run = as_nobody
    src = _nobody_tree(base)
    os.chmod(src / "sub" / "locked", 0o644)
    os.chmod(src / "sub", 0o644)
    out = base / "outdir" / "pack"
    result = run("pack", src, out, "-q")
    line = _error_line(result)
    assert result.returncode == 2, line
    assert line.startswith("fanfs pack: error: cannot read sub") and "--skip-unreadable" in line
    assert os.listdir(base / "outdir") == []
    result = run("pack", src, out, "-q", "--skip-unreadable")
    assert result.returncode == 0, result.stderr
    assert result.stderr and all(
        line.startswith("fanfs: warning: skipping unreadable sub")
        for line in result.stderr.splitlines()
    )
    index = _open(out).index
    assert lookup_path(index, "sub/locked") is None and lookup_path(index, "ok.txt") is not None


def test_out_parent_not_writable(as_nobody: tuple[Path, RunAs]) -> None:
    # Like a missing parent: refused up front (before walking a possibly huge SRC), as a
    # usage error naming OUT, not the hidden temporary directory fanfs would have made.
    base, run = as_nobody
    src = _nobody_tree(base)
    os.chmod(src / "sub" / "locked", 0o644)
    (base / "readonly").mkdir(mode=0o755)
    out = base / "readonly" / "pack"
    result = run("pack", src, out, "-q")
    line = _error_line(result)
    assert result.returncode == 2, line
    assert line.startswith("fanfs pack: error: ") and str(out) in line
    assert ".fanfs-tmp-" not in line
    assert os.listdir(base / "readonly") == []


# --- files changing under the packer ----------------------------------------------------------


def _read(path: Path, size: int, chunk_no: int, chunk_size: int = 4096) -> bytes:
    """What a reader thread does for one chunk of a file walked with `size` bytes."""
    offset = chunk_no * chunk_size
    return read_chunk(
        os.fsencode(path), path.name.encode(), size, offset, min(chunk_size, size - offset)
    )


@pytest.mark.parametrize(("before", "after"), [(100, 150), (100, 40), (5000, 0), (5000, 6000)])
def test_file_changing_size_is_detected(tmp_path: Path, before: int, after: int) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(before))
    os.truncate(path, after)
    message = "file changed while being packed: f.bin (size was %d, now %d)" % (before, after)
    with pytest.raises(
        PackInputError, match="^%s$" % message.replace("(", r"\(").replace(")", r"\)")
    ):
        _read(path, before, 0)


def test_file_growing_in_its_last_chunk_is_detected_in_every_chunk(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(10_000))
    with open(path, "ab") as f:
        f.write(b"more")
    for chunk_no in range(3):
        with pytest.raises(PackInputError, match=r"^file changed while being packed: f\.bin "):
            _read(path, 10_000, chunk_no)


def test_unchanged_file_reads_fine(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = _text(10_000, 1)
    path.write_bytes(data)
    assert _read(path, 10_000, 2) == data[8192:]


def test_file_changing_during_a_pack_fails_cleanly(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walk = TreeWalk.walk

    def walk_then_grow(self: TreeWalk) -> TreeWalk:
        tree = walk(self)
        with open(src / "sub" / "r.bin", "ab") as f:
            f.write(b"appended")
        return tree

    monkeypatch.setattr(TreeWalk, "walk", walk_then_grow)
    out = tmp_path / "out"
    opts = PackOptions(src=str(src), out=str(out), codec=parse_codec("zstd:3"), quiet=True, jobs=2)
    with pytest.raises(
        PackInputError,
        match=r"^file changed while being packed: sub/r.bin \(size was 5000, now 5008\)$",
    ):
        run_pack(opts)
    assert not out.exists()
    assert _leftovers(tmp_path) == []


# --- interruption -----------------------------------------------------------------------------


@pytest.mark.parametrize("existing", [False, True], ids=["new_out", "force_over_old_pack"])
def test_interrupted_pack_leaves_nothing(tmp_path: Path, existing: bool) -> None:
    # brotli:11 at ~0.5 MB/s with one thread: 16 MiB would take half a minute, so the pack
    # is certainly still running when it is interrupted after its first stored chunk.
    src = tmp_path / "src"
    src.mkdir()
    block = _text(1024 * 1024, 7)
    for i in range(16):
        (src / ("f%02d.txt" % i)).write_bytes(block)
    out = tmp_path / "out"
    if existing:  # interrupting a --force repack must keep the old pack, intact
        old = _write_tree(tmp_path / "old", {"old.txt": b"old pack\n"})
        assert run_fanfs("pack", old, out, "-q").returncode == 0
        before = {p.name: p.read_bytes() for p in out.iterdir()}
    cmd = [
        *FANFS,
        "pack",
        str(src),
        str(out),
        "--codec",
        "brotli:11",
        "--jobs",
        "1",
        "--chunk-size",
        "256KiB",
        *(["--force"] if existing else []),
    ]
    # Ctrl-C as at a terminal: a test run started in the background (`cmd &` in a script)
    # ignores SIGINT, and a child would inherit that and never see the interrupt.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        tmp = tmp_path / (".out.fanfs-tmp-%d" % proc.pid)
        deadline = time.monotonic() + 30
        while _stored_bytes(tmp) == 0:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "pack never started writing"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert (stdout, stderr) == ("", "fanfs pack: interrupted\n")
    if existing:
        assert sorted(os.listdir(tmp_path)) == ["old", "out", "src"]  # no temporary directory
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert sorted(os.listdir(tmp_path)) == ["src"]  # no OUT, no temporary directory


def _stored_bytes(tmp: Path) -> int:
    total = 0
    for part in glob.glob(str(tmp / "part-*")):
        with contextlib.suppress(FileNotFoundError):  # the packer may remove it
            total += os.stat(part).st_size
    return total
