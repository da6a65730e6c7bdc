"""`fanfs umount MOUNTPOINT [--lazy]`: unmount and wait for the daemon to exit.

Works for live, dead (crashed, ENOTCONN) and frozen (stopped, hung) mounts alike: the daemon
is asked its pid in a child process bounded by a timeout, `--lazy` asks it nothing, and
fusermount3 is bounded too. Never imports pyfuse3.
"""

from __future__ import annotations

import errno
import json
import os
import select
import shutil
import signal
import subprocess
import time
from typing import Final

from fanfs import xattrs
from fanfs.errors import MountSetupError, UsageError
from fanfs.mountinfo import find_mount, mounts

# How long to wait for the daemon to exit after the kernel has let go of the mount.
EXIT_WAIT_S: Final = 10.0
QUERY_TIMEOUT_S: Final = 2  # for the daemon to say its pid (a frozen one never does)
FUSERMOUNT_TIMEOUT_S: Final = 20
# A path lookup in flight holds the mount busy for its duration: a monitor polling the mount's
# xattrs (`fanfs stats --watch`, a node exporter) makes an unmount fail now and then. Busy is
# retried this long before it counts as files held open.
BUSY_RETRY_S: Final = 2.0
BUSY_RETRY_INTERVAL_S: Final = 0.05


def _ask_daemon(mountpoint: str) -> tuple[int | None, int | None] | None:
    """(daemon pid, cluster rank or None) read from the mount's attributes, in a forked
    child so that a frozen daemon cannot hang this command: None if it does not answer
    within QUERY_TIMEOUT_S (the child, blocked in the kernel, is killed)."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # two getxattr calls, the answer down the pipe, _exit
        code = 0
        try:
            os.close(read_fd)
            os.write(write_fd, json.dumps(_query(mountpoint)).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    answer = None
    try:
        ready, _, _ = select.select([read_fd], [], [], QUERY_TIMEOUT_S)
        if ready:
            answer = os.read(read_fd, 4096)
        else:
            os.kill(child, signal.SIGKILL)  # a request to FUSE yields to a fatal signal
    finally:
        os.close(read_fd)
        os.waitpid(child, 0)
    if not answer:
        return None
    pid, rank = json.loads(answer)
    return pid, rank


def _query(mountpoint: str) -> tuple[int | None, int | None]:
    try:
        pid: int | None = int(os.getxattr(mountpoint, xattrs.PID))
    except (OSError, ValueError):
        pid = None
    try:
        rank = json.loads(os.getxattr(mountpoint, xattrs.STATS)).get("rank")
    except (OSError, ValueError, AttributeError):
        rank = None
    return pid, rank if isinstance(rank, int) else None


def umount(mountpoint: str, *, lazy: bool = False) -> str | None:
    """Unmount; returns a note for the user, if any (a cluster rank's daemon outlives its
    mount until the job ends). `lazy` detaches at once and asks the daemon nothing."""
    entry = find_mount(mountpoint)
    if entry is None:
        raise UsageError("%s is not mounted" % mountpoint)
    if entry.fstype != "fuse.fanfs":
        raise UsageError("%s is not a fanfs mount (it is %s)" % (mountpoint, entry.fstype))
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise MountSetupError("fusermount3 not found (install the fuse3 package)")
    answer = None if lazy else _ask_daemon(mountpoint)
    pid, rank = answer or (None, None)
    cmd = [tool, "-u"] + (["-z"] if lazy else []) + [os.path.abspath(mountpoint)]
    deadline = time.monotonic() + BUSY_RETRY_S
    while (message := _fusermount(cmd, mountpoint, tool)) is not None:
        if "busy" not in message.lower():
            raise MountSetupError("cannot unmount %s: %s" % (mountpoint, message))
        if time.monotonic() >= deadline:
            raise MountSetupError(
                "%s is busy (files are open); close them, or use --lazy" % mountpoint
            )
        time.sleep(BUSY_RETRY_INTERVAL_S)
    if not lazy and answer is None:
        raise MountSetupError(
            "%s unmounted, but its daemon did not answer within %ds (stopped or hung?), so "
            "fanfs could not wait for it to exit; find it with: pgrep -af 'fanfs mount'"
            % (mountpoint, QUERY_TIMEOUT_S)
        )
    if rank is not None:
        # It stops serving its partitions to the other ranks now, but MPI lets its process
        # exit only with the job (MPI_Finalize waits for every rank).
        return (
            "%s unmounted; its cluster daemon (rank %d%s) exits when the job ends (SIGTERM to "
            "mpirun; under Slurm, scancel or the job's end: docs/cluster.md)"
            % (mountpoint, rank, ", pid %d" % pid if pid else "")
        )
    if pid is not None and not lazy:
        _wait_exit(pid, mountpoint)
    return None


def _fusermount(cmd: list[str], mountpoint: str, tool: str) -> str | None:
    """Run `fusermount3 -u`: None once unmounted, else the last line of its complaint."""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=False, timeout=FUSERMOUNT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise MountSetupError(
            "%s: %s -u did not finish within %ds; detach it with: fanfs umount --lazy %s"
            % (mountpoint, os.path.basename(tool), FUSERMOUNT_TIMEOUT_S, mountpoint)
        ) from None
    if proc.returncode == 0:
        return None
    stderr = proc.stderr.strip()
    return stderr.splitlines()[-1] if stderr else "exit %d" % proc.returncode


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting for its parent counts as exited)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise


def _wait_exit(pid: int, mountpoint: str) -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.02)
    holder = _copy_elsewhere(mountpoint)
    if holder is not None:
        # A mount namespace made while the mount was up (unshare, a container, a job
        # container) holds a copy of it, and a copy keeps the FUSE connection open: the
        # daemon never learns of this unmount.
        raise MountSetupError(
            "unmounted here, but the mount namespace of pid %d still holds a copy of %s, which "
            "keeps the fanfs daemon (pid %d) serving; unmount it there (nsenter -t %d -m "
            "fanfs umount %s) or stop the daemon (kill %d)"
            % (holder, mountpoint, pid, holder, mountpoint, pid)
        )
    raise MountSetupError(
        "unmounted, but the fanfs daemon (pid %d) did not exit within %ds" % (pid, EXIT_WAIT_S)
    )


def _copy_elsewhere(mountpoint: str) -> int | None:
    """A process of another mount namespace whose table still has a fanfs mount at
    `mountpoint` (the first found), or None."""
    try:
        ours = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return None
    seen = {ours}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ns = os.readlink("/proc/%s/ns/mnt" % name)
            if ns in seen:
                continue
            seen.add(ns)
            table = mounts("/proc/%s/mountinfo" % name)
        except OSError:
            continue
        if any(m.mountpoint == mountpoint and m.fstype == "fuse.fanfs" for m in table):
            return int(name)
    return None
