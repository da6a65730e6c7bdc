"""Shared fixtures: running the CLI, the edge-case source tree, packs, and real mounts.

Real-mount discipline (STYLE.md B10): every mount runs `fanfs mount -f` in its own process
and session with `fsname=fanfs-test`; readiness is read from /proc/self/mountinfo (never
os.path.ismount); teardown unmounts with `fanfs umount` and checks the daemon's exit status,
and on any failure falls back to SIGUSR1 (stack dump), `fusermount3 -u -z`, terminate, kill.
A session sweeper removes any fanfs-test mount a crashed run left behind. The subprocess
harness itself (waits, lazy unmounts, sweeps) is fanfs/_harness.py, shared with the
integration tests and the benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanfs import _harness as harness
from fanfs.format.index import Index
from fanfs.format.reader import PackReader
from tests.treegen import make_edge_tree

FANFS = harness.FANFS
TEST_FSNAME = "fanfs-test"
MOUNT_WAIT_S = 20.0
# Kill a test mount's server this long after it started (before pytest's 300 s timeout).
WATCHDOG_S = 240.0
NOBODY = 65534  # the second, unprivileged user of the attacker tests


def as_nobody(
    *cmd: str | os.PathLike[str], env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` as user and group nobody (needs root and setpriv)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second user")
    return subprocess.run(
        ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", *map(str, cmd)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
        cwd="/",
    )


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="fanfs-public-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_fanfs(
    *args: str | os.PathLike[str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would; returns the completed process (never raises on exit code)."""
    return subprocess.run(
        [*FANFS, *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False
    )


def fuse_unavailable() -> str | None:
    """Why real FUSE mounts cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 missing"
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        return "pyfuse3 not installed"
    return None


class Mount:
    """A running `fanfs mount -f` daemon. Use as a context manager."""

    def __init__(self, pack: Path, mnt: Path, *extra: str, log: Path | None = None) -> None:
        self.pack, self.mnt, self.extra = pack, mnt, extra
        self.log = log or mnt.parent / (mnt.name + ".log")
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Mount:
        reason = fuse_unavailable()
        if reason and os.environ.get("CI"):
            pytest.fail("FUSE tests cannot run in CI: %s" % reason)
        if reason:
            pytest.skip(reason)
        self.mnt.mkdir(parents=True, exist_ok=True)
        cmd = [
            *FANFS,
            "mount",
            "-f",
            "--log",
            str(self.log),
            "-o",
            "fsname=" + TEST_FSNAME,
            *self.extra,
            str(self.pack),
            str(self.mnt),
        ]
        self.proc = subprocess.Popen(cmd, start_new_session=True)
        # Watchdog: a hung request leaves the test stuck in the kernel, where pytest-timeout
        # cannot reach it; killing the server makes the request fail (ENOTCONN) instead.
        self._watchdog = threading.Timer(WATCHDOG_S, self._kill_server)
        self._watchdog.daemon = True
        self._watchdog.start()
        try:
            self._wait_ready()
        except BaseException:
            self._kill()
            raise
        return self

    def _wait_ready(self) -> None:
        proc = self.proc
        assert proc is not None
        try:
            ready = harness.poll(
                lambda: harness.mount_type(self.mnt) == harness.FSTYPE
                and harness.answers(self.mnt),
                timeout_s=MOUNT_WAIT_S,
                alive=lambda: proc.poll() is None,
            )
        except harness.ProcessExited:
            pytest.fail("fanfs mount exited with %s:\n%s" % (proc.returncode, self.log_text()))
        if not ready:
            pytest.fail("mount did not appear within %ds:\n%s" % (MOUNT_WAIT_S, self.log_text()))

    def _kill_server(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            print(
                "watchdog: killing the fanfs server of %s after %ds" % (self.mnt, WATCHDOG_S),
                file=sys.stderr,
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def mounted(self) -> bool:
        return harness.mount_type(self.mnt) is not None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_lines(self, level: str) -> list[str]:
        return [line for line in self.log_text().splitlines() if " %s " % level in line]

    def unmount(self) -> None:
        """The happy path: `fanfs umount`, then the daemon must exit 0 and the mount be gone."""
        assert self.proc is not None
        result = run_fanfs("umount", self.mnt)
        assert result.returncode == 0, result.stderr
        assert self.proc.wait(10) == 0
        assert harness.mount_type(self.mnt) is None
        self.proc = None

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGUSR1)
        if harness.mount_type(self.mnt) is not None:
            harness.lazy_unmount(self.mnt)
        if self.proc is not None:
            harness.stop_process(self.proc)
        self.proc = None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._watchdog.cancel()
        if exc_type is None and self.proc is not None:
            try:
                self.unmount()
                return
            except BaseException:
                self._kill()
                raise
        self._kill()


@pytest.fixture(scope="session", autouse=True)
def stale_mount_sweeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Unmount test mounts that a crashed run left behind. Other pytest sessions may be
    running: before this session, only dead mounts go; after it, all of its own."""
    base = tmp_path_factory.getbasetemp()
    harness.sweep(base.parent, TEST_FSNAME, only_dead=True)
    yield
    harness.sweep(base, TEST_FSNAME)


@pytest.fixture(scope="session")
def edge_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source tree full of edge cases (see tests/treegen.py)."""
    root = tmp_path_factory.mktemp("edge") / "src"
    make_edge_tree(root, chunk_size=TEST_CHUNK_SIZE)
    return root


# Small chunks so that chunk-boundary cases need only small files.
TEST_CHUNK_SIZE = 64 * 1024


@pytest.fixture(scope="session")
def edge_pack(edge_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("packs") / "edge.fan"
    result = run_fanfs("pack", edge_tree, out, "-q", "--chunk-size", str(TEST_CHUNK_SIZE))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def mount_factory(tmp_path: Path) -> Iterator[object]:
    """Returns `mount(pack, *extra_args) -> Mount` (entered); all are torn down at the end."""
    stack = contextlib.ExitStack()

    def mount(pack: Path, *extra: str, name: str = "mnt") -> Mount:
        return stack.enter_context(Mount(pack, tmp_path / name, *extra))

    with stack:
        yield mount


@pytest.fixture(scope="module")
def edge_mount(edge_pack: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    """One shared mount of the edge pack for read-only checks (mounting costs a second)."""
    with Mount(edge_pack, tmp_path_factory.mktemp("edge-mnt") / "mnt") as mount:
        yield mount


def lookup_path(index: Index, rel: str | bytes) -> int | None:
    """The entry at `rel` (relative to the pack's root) in an index, or None."""
    entry: int | None = 0
    for name in os.fsencode(rel).split(b"/"):
        if entry is None or not index.is_dir(entry):
            return None
        entry = index.lookup(entry, name)
    return entry


def entry_at(reader: PackReader, rel: str | bytes) -> int:
    """The entry at `rel` of an open pack; the test fails if there is none."""
    entry = lookup_path(reader.index, rel)
    assert entry is not None, rel
    return entry


_READERS: list[PackReader] = []


def open_reader(path: str | os.PathLike[str]) -> PackReader:
    """A PackReader that is closed when the test ends (each holds a descriptor and a mapping
    per partition)."""
    reader = PackReader(str(path))
    _READERS.append(reader)
    return reader


@pytest.fixture(autouse=True)
def _close_pack_readers() -> Iterator[None]:
    yield
    while _READERS:
        _READERS.pop().close()
