"""Running `fanfs mount` as a subprocess: one harness for the tests (tests/conftest.py), the
MPI integration tests (integration/conftest.py) and the benchmarks (tools/). Never imported
by fanfs itself.

Presence and readiness come from /proc/self/mountinfo, never os.path.ismount (it says True
for a dead mount). A wait polls with a doubling step and ends at once when the process that
should mount has exited. Cleanup escalates: a lazy unmount, then SIGTERM, then SIGKILL, each
bounded in time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Final

from fanfs.mountinfo import find_mount, mounts_under

# How to run the fanfs of this interpreter as a command.
FANFS: Final = (sys.executable, "-m", "fanfs")
# The filesystem type of a fanfs mount in /proc/self/mountinfo.
FSTYPE: Final = "fuse.fanfs"
# Bound on fusermount3 -u -z: it returns at once unless the machine is in trouble.
LAZY_UNMOUNT_TIMEOUT_S: Final = 30.0


class ProcessExited(Exception):
    """The process a wait depended on has exited."""


def mount_type(path: str | os.PathLike[str]) -> str | None:
    """Filesystem type of the mount at exactly `path`, or None."""
    entry = find_mount(os.fspath(path))
    return None if entry is None else entry.fstype


def answers(path: str | os.PathLike[str]) -> bool:
    """The filesystem at `path` answers a request (statvfs), so its daemon serves."""
    try:
        os.statvfs(path)
    except OSError:
        return False
    return True


def is_dead(path: str | os.PathLike[str]) -> bool:
    """A mount whose daemon is gone: requests fail with ENOTCONN (or the like)."""
    try:
        os.statvfs(path)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED, errno.ECONNREFUSED)
    return False


def poll(
    ready: Callable[[], bool],
    *,
    timeout_s: float,
    alive: Callable[[], bool] | None = None,
    step_s: float = 0.01,
    max_step_s: float = 0.5,
) -> bool:
    """Call `ready` until it returns True (then True) or `timeout_s` has passed (False),
    sleeping a doubling step in between. Raises ProcessExited as soon as `alive` (checked
    before each call) returns False."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive is not None and not alive():
            raise ProcessExited()
        if ready():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(step_s)
        step_s = min(step_s * 2, max_step_s)


def lazy_unmount(path: str | os.PathLike[str]) -> None:
    """`fusermount3 -u -z path`, bounded; whatever it says."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            ["fusermount3", "-u", "-z", os.fspath(path)],
            check=False,
            capture_output=True,
            timeout=LAZY_UNMOUNT_TIMEOUT_S,
        )


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; returns once the process is reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pid_alive(pid: int, needle: str | None = None) -> bool:
    """`pid` is a live process (not a zombie) and, with `needle`, its command line contains
    it (so a pid reused by another program does not count)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if needle is None:
            return state != "Z"
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return False
    return state != "Z" and needle in cmdline


def serving_pids(mountpoint: str | os.PathLike[str]) -> list[int]:
    """The processes holding /dev/fuse open whose arguments include `mountpoint`: the
    daemon's serving processes and its cache filler (never this process)."""
    target = os.fsencode(os.fspath(mountpoint))
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            with open(os.path.join(entry.path, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")
            if target in argv and _holds_fuse(os.path.join(entry.path, "fd")):
                pids.append(int(entry.name))
    return sorted(pids)


def _holds_fuse(fd_dir: str) -> bool:
    for fd in os.scandir(fd_dir):
        with contextlib.suppress(OSError):
            if os.readlink(fd.path) == "/dev/fuse":
                return True
    return False


def sweep(base: str | os.PathLike[str], source: str, *, only_dead: bool = False) -> list[str]:
    """Lazily unmount the mounts of `source` (their fsname) under `base`, not `base` itself;
    with `only_dead`, only those whose daemon is gone (another run's live mounts stay).
    Returns the mountpoints it unmounted."""
    swept = []
    for entry in mounts_under(os.fspath(base), source=source):
        if entry.mountpoint == os.fspath(base) or (only_dead and not is_dead(entry.mountpoint)):
            continue
        lazy_unmount(entry.mountpoint)
        swept.append(entry.mountpoint)
    return swept
