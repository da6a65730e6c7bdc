"""MPI fixtures: cluster mounts of several ranks on this machine, driven from one pytest process.

Every job is `mpirun --allow-run-as-root --oversubscribe -np N python -m fanfs mount PACK
DIR/mnt{rank} --cache-dir DIR/cache{rank} -o fsname=fanfs-test ...`, started with
`subprocess.Popen(..., start_new_session=True)` (STYLE.md B10: never pytest under mpirun,
never mount in the test process). Each rank logs to DIR/cache{rank}/fanfs.log; mpirun's own
stdout and stderr go to DIR/mpirun.out (a file, not a pipe, so a full pipe never blocks it).

Readiness: every rank passes an MPI barrier after mounting and before serving, but the
fixture still waits (deadline READY_DEADLINE_S, doubling poll step) until every rank's mount
is listed as fuse.fanfs in /proc/self/mountinfo and answers os.statvfs, and fails at once if
mpirun exits. It then records each rank's daemon pid from the root xattr, so that cleanup
never has to ask a frozen or dead mount anything.

Teardown, happy path: SIGCONT to any frozen rank, SIGTERM to mpirun (Open MPI 4.1 delivers it
to the ranks 1 s later and SIGKILLs them 1 s after that; the ranks unmount), wait up to
STOP_WAIT_S, assert that mpirun exited and no rank's mount is left. Failure path (always runs
afterwards, idempotent): SIGCONT, SIGKILL to mpirun's process group, `fusermount3 -u -z` on
every mountpoint still listed, SIGKILL to every rank daemon still alive (each rank has its own
process group; checked by command line, so a reused pid is never hit). Reads through
the mounts run in worker threads with a deadline (`run_with_deadline`), so a read stuck on a
frozen daemon fails the test instead of blocking the thread that must clean up. The waits,
lazy unmounts and process checks are fanfs/_harness.py's, shared with tests/ and tools/.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fanfs import _harness as harness
from fanfs._harness import FANFS, lazy_unmount, mount_type
from fanfs.mountinfo import mounts_under
from tests.conftest import TEST_FSNAME, fuse_unavailable

MPIRUN = "mpirun"
MPIRUN_BASE = (MPIRUN, "--allow-run-as-root", "--oversubscribe")
READY_DEADLINE_S = 60.0
STOP_WAIT_S = 15.0
KILL_WAIT_S = 10.0

T = TypeVar("T")


def mpi_unavailable() -> str | None:
    """Why the MPI integration tests cannot run here, or None."""
    if shutil.which(MPIRUN) is None:
        return "mpirun is not on PATH (install openmpi-bin; tools/setup.sh)"
    reason = fuse_unavailable()
    if reason is not None:
        return reason
    try:
        import mpi4py  # noqa: F401  (import only; MPI is initialised by MPI.*, not here)
    except ImportError:
        return "mpi4py is not installed"
    return None


def require_mpi() -> None:
    """Skip with the reason, but fail in CI: CI must run these tests."""
    reason = mpi_unavailable()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail("MPI integration tests cannot run in CI: %s" % reason)
    pytest.skip(reason)


def fanfs_test_mounts(base: Path) -> list[str]:
    """Mountpoints of fanfs-test mounts at or under `base`."""
    return [entry.mountpoint for entry in mounts_under(str(base), source=TEST_FSNAME)]


class _Probe:
    """os.statvfs(path) in a daemon thread; `ok` once it returned, `failed` if it raised."""

    def __init__(self, path: Path) -> None:
        self.ok = self.failed = False
        threading.Thread(target=self._run, args=(path,), daemon=True, name="statvfs-probe").start()

    def _run(self, path: Path) -> None:
        try:
            os.statvfs(path)
            self.ok = True
        except OSError:
            self.failed = True


def run_with_deadline(fn: Callable[[], T], timeout: float, what: str) -> T:
    """Run `fn` in a worker thread; fail the test if it does not finish within `timeout`.

    A thread stuck in a read on a hung mount is released by the job's cleanup (the daemon is
    killed, pending FUSE requests then fail), so it never outlives the test for long.
    """
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reader")
    future = pool.submit(fn)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        pytest.fail("%s did not finish within %.0fs (a read hung)" % (what, timeout))
    finally:
        pool.shutdown(wait=False)


class MpiJob:
    """One `mpirun ... fanfs mount` job with a mountpoint and a cache dir per rank."""

    def __init__(
        self,
        workdir: Path,
        pack: Path,
        np: int,
        extra: tuple[str, ...],
        *,
        recovery: bool = False,
        cache_dir: bool = True,
        absent: tuple[int, ...] = (),
    ) -> None:
        self.workdir, self.pack, self.np, self.extra = workdir, pack, np, extra
        self.absent = absent  # ranks whose mountpoint is not created (bad-input tests)
        self.recovery, self.with_cache_dir = recovery, cache_dir
        self.mnt = [workdir / ("mnt%d" % r) for r in range(np)]
        self.cache = [workdir / ("cache%d" % r) for r in range(np)]
        self.out_path = workdir / "mpirun.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: dict[int, int] = {}
        self.frozen: set[int] = set()
        self.killed: set[int] = set()
        self.returncode: int | None = None

    # -- start ---------------------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = [*MPIRUN_BASE, "-np", str(self.np)]
        if self.recovery:
            cmd.append("--enable-recovery")
        cmd += [
            *FANFS,
            "mount",
            str(self.pack),
            str(self.workdir / "mnt{rank}"),
            "-o",
            "fsname=" + TEST_FSNAME,
        ]
        if self.with_cache_dir:
            cmd += ["--cache-dir", str(self.workdir / "cache{rank}")]
        return cmd + list(self.extra)

    def start(self) -> MpiJob:
        for rank, mnt in enumerate(self.mnt):
            if rank not in self.absent:
                mnt.mkdir(parents=True, exist_ok=True)
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self) -> None:
        proc = self.proc
        assert proc is not None
        pending = set(range(self.np))
        probes: dict[int, _Probe] = {}

        def all_ready() -> bool:
            for rank in sorted(pending):
                if mount_type(self.mnt[rank]) != harness.FSTYPE:
                    continue
                # statvfs blocks until the daemon serves (after the barrier): probe it in a
                # thread, so a rank stuck before serving cannot block this loop.
                probe = probes.get(rank)
                if probe is None or probe.failed:
                    probes[rank] = _Probe(self.mnt[rank])
                elif probe.ok:
                    pending.discard(rank)
            return not pending

        try:
            ready = harness.poll(
                all_ready,
                timeout_s=READY_DEADLINE_S,
                alive=lambda: proc.poll() is None,
                step_s=0.02,
            )
        except harness.ProcessExited:
            pytest.fail(
                "mpirun exited with %s before every rank mounted:\n%s"
                % (proc.returncode, self.diagnostics())
            )
        if not ready:
            listed = [r for r in range(self.np) if mount_type(self.mnt[r]) is not None]
            self.dump_stacks()
            pytest.fail(
                "ranks %s not ready within %.0fs (listed in mountinfo: %s):\n%s"
                % (sorted(pending), READY_DEADLINE_S, listed, self.diagnostics())
            )
        for rank in range(self.np):
            self.pids[rank] = int(os.getxattr(self.mnt[rank], "user.fanfs.pid"))

    def rank_processes(self) -> list[int]:
        """Pids of the ranks (mpirun's children running fanfs), without asking any mount."""
        if self.proc is None:
            return []
        try:
            with open("/proc/%d/task/%d/children" % (self.proc.pid, self.proc.pid)) as f:
                children = [int(pid) for pid in f.read().split()]
        except OSError:
            return []
        return [pid for pid in children if harness.pid_alive(pid, str(self.workdir))]

    def dump_stacks(self) -> None:
        """SIGUSR1: each rank's faulthandler writes every thread's stack to its log."""
        for pid in self.rank_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)

    # -- observation ---------------------------------------------------------------------

    def stats(self, rank: int) -> dict[str, Any]:
        return json.loads(os.getxattr(self.mnt[rank], "user.fanfs.stats"))

    def log(self, rank: int) -> str:
        path = self.cache[rank] / "fanfs.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log_lines(self, rank: int, level: str) -> list[str]:
        return [line for line in self.log(rank).splitlines() if " %s " % level in line]

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def diagnostics(self) -> str:
        parts = ["$ " + " ".join(self.command()), "--- mpirun output ---", self.output()[-4000:]]
        for rank in range(self.np):
            parts += ["--- rank %d log ---" % rank, self.log(rank)[-6000:]]
        return "\n".join(parts)

    # -- faults --------------------------------------------------------------------------

    def freeze(self, rank: int) -> None:
        self.frozen.add(rank)
        os.kill(self.pids[rank], signal.SIGSTOP)

    def thaw(self, rank: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pids[rank], signal.SIGCONT)
        self.frozen.discard(rank)

    def kill_rank(self, rank: int) -> None:
        """SIGKILL one rank's daemon; its mount stays behind dead (ENOTCONN): unmount it lazily."""
        self.killed.add(rank)
        os.kill(self.pids[rank], signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while harness.pid_alive(self.pids[rank], "fanfs") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not harness.pid_alive(self.pids[rank], "fanfs"), "rank %d survived SIGKILL" % rank
        lazy_unmount(self.mnt[rank])

    # -- stop ----------------------------------------------------------------------------

    def stop(self) -> int:
        """SIGTERM to mpirun (after SIGCONT to frozen ranks); returns its exit status."""
        assert self.proc is not None
        for rank in list(self.frozen):
            self.thaw(rank)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                "mpirun did not exit within %.0fs of SIGTERM:\n%s"
                % (STOP_WAIT_S, self.diagnostics())
            )
        return self.returncode

    def mounted(self) -> list[int]:
        return [rank for rank in range(self.np) if mount_type(self.mnt[rank]) is not None]

    def wait_exit(self, timeout: float) -> int:
        """For jobs expected to end on their own (bad input): mpirun's exit status."""
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(
                "mpirun still running after %.0fs (hang):\n%s" % (timeout, self.diagnostics())
            )
        return self.returncode

    def cleanup(self) -> None:
        """Failure path; idempotent and safe after a clean stop. Never raises.

        Open MPI puts every rank in its own process group, so killing mpirun's group leaves
        the ranks running: they are found (as mpirun's children, before it dies, and by the
        pids their mounts reported) and killed one by one."""
        for rank in list(self.frozen):
            self.thaw(rank)
        ranks = set(self.pids.values()) | set(self.rank_processes())
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(KILL_WAIT_S)
        for mnt in self.mnt:
            if mount_type(mnt) is not None:
                lazy_unmount(mnt)
        for pid in ranks:
            if harness.pid_alive(pid, str(self.workdir)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        harness.sweep(self.workdir, TEST_FSNAME)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item, so fixtures can tell a failed test at teardown."""
    report = yield
    setattr(item, "rep_" + report.when, report)
    return report


@pytest.fixture
def mpi_jobs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., MpiJob]]:
    """`start(pack, np, *extra, recovery=False, ready=True, cache_dir=True, absent=(), name=None,
    prepare=None)` returns a started `MpiJob` (`absent`: ranks whose mountpoint is not created;
    `prepare(workdir)` runs before mpirun).

    With `ready`, waits until every rank has mounted. At the end of a passing test every job
    still running is stopped with SIGTERM and must leave no mount; then, pass or fail, every
    job is cleaned up (group killed, mounts lazily unmounted, daemons killed).
    """
    require_mpi()
    jobs: list[MpiJob] = []

    def start(
        pack: Path,
        np: int,
        *extra: str,
        recovery: bool = False,
        ready: bool = True,
        cache_dir: bool = True,
        absent: tuple[int, ...] = (),
        name: str | None = None,
        prepare: Callable[[Path], None] | None = None,
    ) -> MpiJob:
        workdir = tmp_path / (name or "job%d" % len(jobs))
        workdir.mkdir()
        if prepare is not None:
            prepare(workdir)
        job = MpiJob(
            workdir, pack, np, extra, recovery=recovery, cache_dir=cache_dir, absent=absent
        )
        jobs.append(job)
        job.start()
        if ready:
            job.wait_ready()
        return job

    try:
        yield start
    finally:
        try:
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.passed:
                for job in jobs:
                    if job.proc is not None and job.returncode is None:
                        job.stop()
                        left = job.mounted()
                        assert not left, "mounts of ranks %s left after SIGTERM to mpirun:\n%s" % (
                            left,
                            job.diagnostics(),
                        )
        finally:
            for job in jobs:
                job.cleanup()


@pytest.fixture(scope="session", autouse=True)
def _sweep_own_mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Last resort: no fanfs-test mount under this session's temp dir survives the session."""
    base = tmp_path_factory.getbasetemp()
    yield
    harness.sweep(base, TEST_FSNAME)
