"""The serving-process family: how many processes serve a mount, the fork of the other
serving processes after INIT and of the background cache filler, and the first process's
watch over them (a dead serving process takes the mount down) and reaping at unmount.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import time
from typing import Any, Final

from fanfs.mount.options import MountConfig

# The logger of the whole `fanfs mount` command, whichever module of it writes: the log says
# "fanfs.mount: mounted ...", as it always has.
log = logging.getLogger("fanfs.mount")


# Serving processes by default: two on a small node (both cores of the 2-core machines where
# it was measured: DESIGN.md section 4), one more per 8 usable cores, at most this many. Each
# process is one trio thread serving up to ~30k requests/s; an idle one costs no CPU, only its
# read-ahead buffer, whose default is a share of one node-wide budget (mount.serve).
MAX_DEFAULT_PROCESSES: Final = 8
# How long the first process waits for the others to exit after the unmount.
REAP_WAIT_S: Final = 5.0
PR_SET_PDEATHSIG: Final = 1


def serving_processes(pyfuse3: Any, config: MountConfig) -> int:
    """How many processes serve the mount: several need pyfuse3 with fanfs patch level 2."""
    if getattr(pyfuse3, "FANFS_PATCH_LEVEL", 0) < 2:
        if config.processes not in (0, 1):
            log.warning(
                "serving with 1 process: pyfuse3 lacks the fanfs patch (run tools/setup.sh)"
            )
        return 1
    cpus = usable_cpus()
    return max(1, min(config.processes or default_processes(cpus), cpus))


def default_processes(cpus: int) -> int:
    """Serving processes for a node with `cpus` usable cores: 2 + cpus // 8 (2 up to 7
    cores, 4 at 16, 6 at 32), at most MAX_DEFAULT_PROCESSES (from 48 cores), never more
    than cpus."""
    return max(1, min(cpus, 2 + cpus // 8, MAX_DEFAULT_PROCESSES))


def usable_cpus() -> int:
    """The cores this process may run on (a Slurm job or a cgroup may grant fewer than the
    node has)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fork_servers(processes: int) -> tuple[int, list[int]]:
    """Fork processes-1 servers; returns (this process's slot, pids of the forked ones)."""
    parent = os.getpid()
    children = []
    for slot in range(1, processes):
        pid = os.fork()
        if pid == 0:
            _die_with_parent(parent)
            return slot, []
        children.append(pid)
    return 0, children


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def fork_filler(pyfuse3: Any, store: Any, slot: int, *, push: bool) -> int:
    """Fork the background filler of the MinIO cache (prefetch.CacheFiller): lowest CPU
    priority, its own counter row; it starts at the mount's first LOOKUP or READ and exits
    when the cache is full, the node's chunks are all in it, or the mount ends. Called before
    any thread exists (fork and threads do not mix)."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        _die_with_parent(parent)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        os.nice(19)
        store.shared.use_slot(slot)
        # It keeps the FUSE descriptor only to push what it decodes into the page cache
        # (notify_store writes to it); it never reads requests from it.
        notify = pyfuse3.notify_store if push else None
        _run_filler(store, parent, notify)
    except BaseException:
        log.exception("background cache fill failed (the mount is not affected)")
        code = 1
    finally:
        os._exit(code)


def _run_filler(store: Any, parent: int, notify: Any) -> None:
    from fanfs.prefetch import CacheFiller

    def orphaned() -> bool:
        return os.getppid() != parent

    # Start with the job: its first LOOKUP or READ (a loader lists its dataset before it
    # reads; the filler then gets that head start).
    while not _job_started(store.shared.totals()):
        if orphaned():
            return
        time.sleep(0.05)
    CacheFiller(store, notify).run(orphaned)


def _job_started(totals: dict[str, int]) -> bool:
    return bool(totals["reads"] or totals["lookups"])


def _exit_text(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return (
        "was killed by %s" % signal.Signals(-code).name
        if code < 0
        else "exited with status %d" % code
    )


@dataclasses.dataclass(slots=True)
class Family:
    """The first serving process's children: the other serving processes and the filler."""

    servers: list[int] = dataclasses.field(default_factory=list)
    filler: int = 0

    def collect(self) -> list[str]:
        """Reap the children that have exited, so none is left a zombie (the filler ends
        once the cache is full); returns what happened to each serving process that exited
        with a status other than 0 (0 is an unmount, seen before this process's own loop
        has ended)."""
        deaths = []
        for pid in [*self.servers, self.filler]:
            if not pid:
                continue
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if not done:
                continue
            if pid == self.filler:
                self.filler = 0
                log.debug("background fill process %d %s", pid, _exit_text(status))
                continue
            self.servers.remove(pid)
            if status:
                deaths.append("serving process %d %s" % (pid, _exit_text(status)))
        return deaths

    def kill(self) -> None:
        for pid in [*self.servers, self.filler]:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def reap(self) -> None:
        """At unmount: stop the filler, wait for the other serving processes (the unmount
        ends them), kill stragglers after REAP_WAIT_S."""
        if self.filler:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.filler, signal.SIGTERM)
        deadline = time.monotonic() + REAP_WAIT_S
        while (self.servers or self.filler) and time.monotonic() < deadline:
            self.collect()
            time.sleep(0.01)
        self.kill()
        self.collect()


async def watch_family(family: Family, mountpoint: str) -> None:
    """First process: reap children as they exit, and if another serving process dies, take
    the whole mount down at once. The requests the kernel had handed to it would otherwise
    wait forever (no other process can answer them, and the kernel keeps the connection open
    while any process holds /dev/fuse). Once every process holding it has exited, the kernel
    aborts the connection: waiting readers get ENOTCONN, and `fanfs umount` clears the mount."""
    import trio

    with trio.open_signal_receiver(signal.SIGCHLD) as signals:
        while True:
            deaths = family.collect()  # also those from before the receiver existed
            if deaths:
                log.critical(
                    "%s; taking the mount of %s down so that no reader waits for the requests "
                    "it held (readers get ENOTCONN; clear it with fanfs umount %s)",
                    "; ".join(deaths),
                    mountpoint,
                    mountpoint,
                )
                family.kill()
                logging.shutdown()
                os._exit(1)
            await signals.__anext__()
