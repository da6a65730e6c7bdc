"""`fanfs umount MOUNTPOINT [--lazy]`: unmount and wait for the daemon to exit.

Works for live and dead (crashed, ENOTCONN) mounts alike. Never imports pyfuse3.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time
from typing import Final

from fanfs.errors import MountSetupError, UsageError
from fanfs.mountinfo import find_mount

# How long to wait for the daemon to exit after the kernel has let go of the mount.
EXIT_WAIT_S: Final = 10.0


def _daemon_pid(mountpoint: str) -> int | None:
    try:
        return int(os.getxattr(mountpoint, "user.fanfs.pid"))
    except (OSError, ValueError):
        return None


def _cluster_rank(mountpoint: str) -> int | None:
    """The MPI rank serving `mountpoint`, or None for a single-node mount."""
    try:
        rank = json.loads(os.getxattr(mountpoint, "user.fanfs.stats")).get("rank")
    except (OSError, ValueError):
        return None
    return rank if isinstance(rank, int) else None


def umount(mountpoint: str, *, lazy: bool = False) -> str | None:
    """Unmount; returns a note for the user, if any (a cluster rank's daemon outlives its
    mount until the job ends)."""
    entry = find_mount(mountpoint)
    if entry is None:
        raise UsageError("%s is not mounted" % mountpoint)
    if entry.fstype != "fuse.fanfs":
        raise UsageError("%s is not a fanfs mount (it is %s)" % (mountpoint, entry.fstype))
    pid = _daemon_pid(mountpoint)
    rank = _cluster_rank(mountpoint)
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise MountSetupError("fusermount3 not found (install the fuse3 package)")
    cmd = [tool, "-u"] + (["-z"] if lazy else []) + [os.path.abspath(mountpoint)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "exit %d" % proc.returncode
        if "busy" in message.lower():
            raise MountSetupError("%s is busy (files are open); close them, or use --lazy" % mountpoint)
        raise MountSetupError("cannot unmount %s: %s" % (mountpoint, message))
    if rank is not None:
        # It stops serving its partitions to the other ranks now, but MPI lets its process
        # exit only with the job (MPI_Finalize waits for every rank).
        return (
            "%s unmounted; its cluster daemon (rank %d%s) exits when the job ends (stop the job "
            "with SIGTERM to mpirun or srun: docs/cluster.md)"
            % (mountpoint, rank, ", pid %d" % pid if pid else "")
        )
    if pid is not None and not lazy:
        _wait_exit(pid)
    return None


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting for its parent counts as exited)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise


def _wait_exit(pid: int) -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.02)
    raise MountSetupError("unmounted, but the fanfs daemon (pid %d) did not exit within %ds" % (pid, EXIT_WAIT_S))
