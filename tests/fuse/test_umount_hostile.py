"""`fanfs umount` against a daemon that does not answer (issue 10): a frozen (SIGSTOPped)
daemon never hangs the command. `--lazy` detaches at once and asks nothing; the plain form
asks for the daemon's pid within a bound, unmounts anyway, and says it could not wait. A
second user cannot unmount root's mount and is told so at once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fanfs.mountinfo import mounts
from fanfs.umount import QUERY_TIMEOUT_S
from tests.conftest import FANFS, Mount, as_nobody, run_fanfs
from tests.treegen import write_tree

pytestmark = pytest.mark.fuse

# A frozen daemon costs the plain form QUERY_TIMEOUT_S; anything much longer is a hang.
PROMPT_S = QUERY_TIMEOUT_S + 8


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_tree(
        tmp_path_factory.mktemp("umount") / "src", {"a.txt": b"a\n", "d/b.txt": b"b\n"}
    )
    out = src.parent / "p.fan"
    assert run_fanfs("pack", src, out, "-q").returncode == 0
    return out


@pytest.fixture
def frozen(pack: Path, mount_factory: Callable[..., Mount]) -> Iterator[Mount]:
    """A live mount whose serving processes (the whole process group) are stopped; they
    are continued at the end whatever happened, so the mount's teardown can run."""
    mount = mount_factory(pack, "--processes", "2")
    assert (mount.mnt / "a.txt").read_bytes() == b"a\n"
    assert mount.proc is not None
    group = mount.proc.pid  # the mount runs in its own session
    os.killpg(group, signal.SIGSTOP)
    try:
        yield mount
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)


def timed_umount(*args: str | os.PathLike[str]) -> tuple[float, int, str]:
    start = time.monotonic()
    result = run_fanfs("umount", *args, timeout=60)
    return time.monotonic() - start, result.returncode, result.stderr


def assert_daemon_exits_when_continued(mount: Mount) -> None:
    assert mount.proc is not None
    os.killpg(mount.proc.pid, signal.SIGCONT)
    assert mount.proc.wait(20) == 0
    mount.proc = None  # torn down already


@pytest.mark.timeout(90)
def test_lazy_umount_of_a_frozen_daemon_detaches_at_once(frozen: Mount) -> None:
    took, code, err = timed_umount("--lazy", frozen.mnt)
    assert (code, err) == (0, "")
    assert took < 5, "fanfs umount --lazy took %.1fs on a frozen daemon" % took
    assert not frozen.mounted()
    assert_daemon_exits_when_continued(frozen)


@pytest.mark.timeout(90)
def test_plain_umount_of_a_frozen_daemon_is_bounded_and_says_why(frozen: Mount) -> None:
    took, code, err = timed_umount(frozen.mnt)
    assert code == 4
    assert err == (
        "fanfs umount: error: %s unmounted, but its daemon did not answer within %ds (stopped "
        "or hung?), so fanfs could not wait for it to exit; find it with: pgrep -af 'fanfs "
        "mount'\n" % (frozen.mnt, QUERY_TIMEOUT_S)
    )
    assert QUERY_TIMEOUT_S <= took < PROMPT_S, "fanfs umount took %.1fs" % took
    assert not frozen.mounted()
    assert_daemon_exits_when_continued(frozen)


def test_another_user_cannot_unmount_roots_mount(pack: Path, public_dir: Path) -> None:
    mnt = public_dir / "mnt"
    with Mount(pack, mnt, "--processes", "1") as other:
        start = time.monotonic()
        result = as_nobody(*FANFS, "umount", mnt)
        took = time.monotonic() - start
        assert result.returncode == 4, result.stderr
        assert result.stderr.startswith(
            "fanfs umount: error: cannot unmount %s: " % mnt
        ), result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert took < PROMPT_S
        assert other.mounted() and (mnt / "a.txt").read_bytes() == b"a\n"


def test_umount_names_the_namespace_whose_copy_keeps_the_daemon_serving(
    edge_pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """A mount namespace made while the mount is up (unshare, a container, a Slurm job
    container) holds a copy of the mount, which keeps the FUSE connection open: after the
    unmount here the daemon goes on serving the copy. `fanfs umount` says where the copy is."""
    mount = mount_factory(edge_pack)
    assert mount.proc is not None
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "120"])
    try:
        table = "/proc/%d/mountinfo" % holder.pid
        deadline = time.monotonic() + 10
        while not any(m.mountpoint == str(mount.mnt) for m in mounts(table)):
            assert time.monotonic() < deadline, "the namespace never showed the mount"
            time.sleep(0.02)
        result = run_fanfs("umount", mount.mnt)
        assert result.returncode == 4, result.stderr
        assert result.stderr == (
            "fanfs umount: error: unmounted here, but the mount namespace of pid %d still holds a "
            "copy of %s, which keeps the fanfs daemon (pid %d) serving; unmount it there "
            "(nsenter -t %d -m fanfs umount %s) or stop the daemon (kill %d)\n"
            % (holder.pid, mount.mnt, mount.proc.pid, holder.pid, mount.mnt, mount.proc.pid)
        )
        assert mount.proc.poll() is None  # still serving the copy
    finally:
        holder.kill()
        holder.wait()
    # With the namespace gone, so is the last copy: the daemon learns of the unmount.
    assert mount.proc.wait(timeout=30) == 0
    mount.proc = None  # nothing left for the fixture to unmount
