"""Mount and unmount as users do them: background mounts, signals, busy and dead mounts,
option pass-through. Every test leaves nothing mounted and no daemon running."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import FANFS, TEST_FSNAME, Mount, run_fanfs

pytestmark = pytest.mark.fuse

PR_SET_CHILD_SUBREAPER = 36


def mountinfo(mnt: Path) -> list[str] | None:
    """The fields of the topmost /proc/self/mountinfo line for `mnt`, or None."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(mnt):
                found = fields
    return found


def fstype(mnt: Path) -> str | None:
    fields = mountinfo(mnt)
    return fields[fields.index("-") + 1] if fields else None


def proc_state(pid: int) -> str | None:
    """The state letter of `pid` (R, S, Z ...), or None if /proc/PID is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return None


def clean_log(log: Path) -> None:
    text = log.read_text(errors="replace")
    assert not [
        line for line in text.splitlines() if " WARNING " in line or " ERROR " in line
    ], text
    assert "Traceback" not in text, text


def no_errno(code: int, fn: Callable[..., object], *args: object) -> None:
    with pytest.raises(OSError) as info:
        fn(*args)
    assert info.value.errno == code, (fn, args, info.value)


def json_stats(mnt: Path) -> dict[str, int]:
    return json.loads(os.getxattr(mnt, "user.fanfs.stats"))


def live_group_members(pgid: int) -> list[int]:
    """Processes of process group `pgid` that have not exited (zombies do not count)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(name))
    return found


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `predicate` with a doubling step until it holds or `timeout` passes."""
    deadline, step = time.monotonic() + timeout, 0.005
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
        step = min(step * 2, 0.2)
    return True


@contextlib.contextmanager
def adopt_orphans() -> Iterator[None]:
    """Make this process the subreaper of its descendants for a while, so that a daemon whose
    parent exits becomes our child: we can then reap it and read its exit status (this
    machine's init never reaps orphans, which would leave a zombie in /proc forever)."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def stop_daemon(pid: int) -> None:
    """Failure-path cleanup of a background daemon (run after its mount was detached): give
    it a moment to exit, then kill its whole session (it calls setsid) and reap what we can."""
    with adopt_orphans():
        members = live_group_members(pid)
        wait_until(lambda: proc_state(pid) in ("Z", None), timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        for member in {pid, *members}:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(member, 0)


# One serving process forks its cache filler before the kernel's INIT, while the command
# still waits on its status pipe: the command must return all the same.
@pytest.mark.parametrize("processes", [(), ("--processes", "1")], ids=["default", "one-process"])
def test_background_mount_and_umount(
    edge_pack: Path, edge_tree: Path, tmp_path: Path, processes: tuple[str, ...]
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    pid = None
    with adopt_orphans():
        result = run_fanfs(
            "mount",
            "-o",
            "fsname=" + TEST_FSNAME,
            "--log",
            log,
            *processes,
            edge_pack,
            mnt,
            timeout=60,
        )
    try:
        assert (result.returncode, result.stderr, result.stdout) == (0, "", "")
        # Usable the moment the command returns: no polling.
        assert sorted(os.listdir(mnt)) == sorted(os.listdir(edge_tree))
        assert (mnt / "sizes" / "text_100").read_bytes() == (
            edge_tree / "sizes" / "text_100"
        ).read_bytes()
        assert fstype(mnt) == "fuse.fanfs"
        pid = int(os.getxattr(mnt, "user.fanfs.pid"))
        assert proc_state(pid) in ("S", "R")

        result = run_fanfs("umount", mnt, timeout=60)
        assert (result.returncode, result.stderr, result.stdout) == (0, "", "")
        assert mountinfo(mnt) is None
        assert os.listdir(mnt) == []
        # `fanfs umount` waited for the daemon: it has exited already (a zombie until reaped).
        assert proc_state(pid) in ("Z", None)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not os.path.exists("/proc/%d" % pid)
        pid = None
        text = log.read_text()
        assert (
            " INFO fanfs.mount: mounted " in text and " INFO fanfs.mount: unmounted " in text
        ), text
        clean_log(log)
    finally:
        if mountinfo(mnt) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False, capture_output=True)
        if pid is not None:
            stop_daemon(pid)


@pytest.mark.parametrize(
    ("option", "code", "message"),
    [
        ("no_such_option", 4, "cannot mount"),
        # libfuse accepts max_read but then fails the kernel's INIT handshake; fanfs refuses
        # it up front as a usage error (DESIGN.md section 4).
        ("max_read=4096", 2, "-o max_read=4096 is not supported"),
    ],
)
def test_mount_that_cannot_serve_is_an_error(
    option: str, code: int, message: str, edge_pack: Path, tmp_path: Path
) -> None:
    """An option libfuse rejects: `fanfs mount` fails with one line and its exit code, and
    nothing stays mounted."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    with adopt_orphans():
        result = run_fanfs(
            "mount",
            "-o",
            "fsname=%s,%s" % (TEST_FSNAME, option),
            "--log",
            log,
            edge_pack,
            mnt,
            timeout=60,
        )
    # the daemon's pid, from its log lines ("date time PID LEVEL ...")
    fields = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    pids = {int(f[2]) for f in fields if len(f) > 3 and f[2].isdigit()}
    try:
        lines = result.stderr.splitlines()
        assert (result.returncode, len(lines), result.stdout) == (code, 1, ""), result.stderr
        assert lines[0].startswith("fanfs mount: error: ") and message in lines[0]
        assert mountinfo(mnt) is None
    finally:
        if mountinfo(mnt) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False, capture_output=True)
        for pid in pids:  # the daemon, adopted above: make sure it is gone and reaped
            stop_daemon(pid)


STARTUP_PROBERS = 4
STARTUP_WINDOW_S = 0.3


def _probe_start_up(edge_pack: Path, mnt: Path, log: Path) -> str | None:
    """Mount while threads call statvfs on the mountpoint in a loop; returns None if every
    prober got an answer after the mount appeared, else what went wrong."""
    mnt.mkdir()
    stop = threading.Event()
    started = [0.0] * STARTUP_PROBERS  # start time of each prober's last answered call

    def probe(k: int) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            with contextlib.suppress(OSError):
                os.statvfs(mnt)
            started[k] = t0

    threads = [
        threading.Thread(target=probe, args=(k,), daemon=True) for k in range(STARTUP_PROBERS)
    ]
    for thread in threads:
        thread.start()
    # two serving processes whatever the core count: their start is the window under test
    cmd = [
        *FANFS,
        "mount",
        "-f",
        "--processes",
        "2",
        "--log",
        str(log),
        "-o",
        "fsname=" + TEST_FSNAME,
    ]
    proc = subprocess.Popen([*cmd, str(edge_pack), str(mnt)], start_new_session=True)
    problem = None
    try:
        if not wait_until(lambda: fstype(mnt) is not None or proc.poll() is not None, 20):
            return "the mount did not appear"
        if proc.poll() is not None:
            return "the daemon exited with %s" % proc.returncode
        # Keep probing through the start of the other serving processes: until every prober
        # has had a call answered that began STARTUP_WINDOW_S after the mount appeared.
        appeared = time.monotonic()
        if not wait_until(lambda: min(started) > appeared + STARTUP_WINDOW_S, timeout=5):
            stuck = sum(t <= appeared for t in started)
            problem = "%d of %d statvfs calls sent while the mount came up were never answered" % (
                stuck,
                STARTUP_PROBERS,
            )
    finally:
        stop.set()
        for thread in threads:
            thread.join(2)
        stuck = sum(thread.is_alive() for thread in threads)
        if stuck:
            problem = problem or "%d of %d statvfs calls were never answered" % (
                stuck,
                STARTUP_PROBERS,
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # fails the stuck requests (ENOTCONN)
            for thread in threads:
                thread.join(10)
        if proc.poll() is None:  # fusermount3 -u: a clean unmount, cheaper than fanfs umount
            result = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True)
            if result.returncode and problem is None:
                problem = "fusermount3 -u failed: %s" % result.stderr
        if mountinfo(mnt) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if problem is None and proc.returncode != 0:
        problem = "the daemon exited with %s" % proc.returncode
    return problem


def test_requests_during_start_up_are_answered(edge_pack: Path, tmp_path: Path) -> None:
    """A timing test (it probes for STARTUP_WINDOW_S after the mount appears): requests that
    reach a mount while it comes up (the INIT handshake, the start of the other serving
    processes) must all be answered. An unanswered request leaves
    its caller in uninterruptible sleep until the daemon dies, so the probes run in threads
    and the daemon is started directly, not through the fixture (whose readiness check would
    itself hang). Several attempts, since the window is short."""
    for attempt in range(8):
        name = "mnt%d" % attempt
        problem = _probe_start_up(edge_pack, tmp_path / name, tmp_path / (name + ".log"))
        assert problem is None, "attempt %d: %s" % (attempt, problem)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_unmounts_cleanly(
    sig: signal.Signals, edge_pack: Path, edge_tree: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(edge_pack)
    proc = mount.proc
    assert proc is not None
    assert (mount.mnt / "sizes" / "text_100").read_bytes() == (
        edge_tree / "sizes" / "text_100"
    ).read_bytes()
    proc.send_signal(sig)
    assert proc.wait(10) == 0
    mount.proc = None  # exited; nothing left for the fixture to unmount
    assert mountinfo(mount.mnt) is None
    assert os.listdir(mount.mnt) == []
    assert "received %s, unmounting" % sig.name in mount.log_text()
    clean_log(mount.log)


def test_busy_umount_fails_and_lazy_succeeds(
    edge_pack: Path, edge_tree: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(edge_pack)
    mnt, proc = mount.mnt, mount.proc
    assert proc is not None
    expected = (edge_tree / "sizes" / "text_196625").read_bytes()
    # an open file, and a process whose working directory is inside the mount
    sitter = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        cwd=mnt / "deep",
        stdin=subprocess.PIPE,
    )
    try:
        with open(mnt / "sizes" / "text_196625", "rb", buffering=0) as f:
            result = run_fanfs("umount", mnt, timeout=60)
            assert (result.returncode, result.stderr) == (
                4,
                "fanfs umount: error: %s is busy (files are open); close them, or use --lazy\n"
                % mnt,
            )
            # the failed attempt changed nothing
            assert fstype(mnt) == "fuse.fanfs" and proc.poll() is None
            assert sorted(os.listdir(mnt)) == sorted(os.listdir(edge_tree))

            result = run_fanfs("umount", "--lazy", mnt, timeout=60)
            assert (result.returncode, result.stderr) == (0, "")
            assert mountinfo(mnt) is None
            # Detached, but the open file keeps working until closed: the daemon still serves.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            assert f.read() == expected
            assert proc.poll() is None
    finally:
        assert sitter.stdin is not None
        sitter.stdin.close()
        sitter.wait(10)
    # The last user gone, the kernel releases the connection and the daemon exits cleanly.
    assert proc.wait(10) == 0
    mount.proc = None
    assert os.listdir(mnt) == []
    clean_log(mount.log)


def test_umount_waits_out_a_monitor_polling_the_mount(
    edge_pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    """A path lookup in flight holds a mount busy: a monitor reading its stats xattr every few
    milliseconds made a plain unmount fail most of the time. `fanfs umount` retries busy for
    2 s, which waits such a monitor out."""
    mount = mount_factory(edge_pack)
    poller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\n"
            "while True:\n"
            "    try:\n"
            "        os.getxattr(%r, 'user.fanfs.stats')\n"
            "    except OSError:\n"
            "        break\n"
            "    time.sleep(0.002)\n" % str(mount.mnt),
        ]
    )
    try:
        time.sleep(0.2)
        assert poller.poll() is None  # it is polling the live mount
        mount.unmount()  # `fanfs umount` exits 0, the daemon 0, and the mount is gone
        assert poller.wait(10) == 0  # and the monitor saw it go
    finally:
        poller.kill()
        poller.wait()


def test_umount_of_what_is_not_a_fanfs_mount(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    missing = tmp_path / "missing"
    for path in (plain, missing):
        result = run_fanfs("umount", path)
        assert (result.returncode, result.stderr, result.stdout) == (
            2,
            "fanfs umount: error: %s is not mounted\n" % path,
            "",
        )
    # A mount that is not FUSE is refused before fusermount is run (a tmpfs of our own, so
    # that a wrong unmount would harm nothing).
    other = tmp_path / "tmpfs"
    other.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "fanfs-test-tmpfs", str(other)], check=True
    )
    try:
        result = run_fanfs("umount", "--lazy", other)
        assert result.returncode == 2
        assert result.stderr.startswith("fanfs umount: error: %s is not a " % other)
        assert result.stderr.endswith(" mount (it is tmpfs)\n") and result.stderr.count("\n") == 1
        assert fstype(other) == "tmpfs"
    finally:
        while mountinfo(other) is not None:
            subprocess.run(["umount", str(other)], check=True)


@pytest.mark.parametrize("lazy", [False, True], ids=["plain", "lazy"])
def test_dead_mount_is_reported_and_cleaned(
    lazy: bool, edge_pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(edge_pack)
    mnt, proc = mount.mnt, mount.proc
    assert proc is not None
    pgid = proc.pid  # the fixture starts the daemon in its own session
    servers = live_group_members(pgid)
    info = json_stats(mnt)
    # The serving processes, and the background filler of the object cache.
    assert proc.pid in servers and len(servers) == info["processes"] + info["filler"]
    assert info["filler"]  # on by default: its death with the first process is checked too
    try:
        with adopt_orphans():  # the other serving processes become ours to reap
            proc.kill()
            assert proc.wait(10) == -signal.SIGKILL
        mount.proc = None
        # The other serving processes die with the first one ...
        assert wait_until(lambda: not live_group_members(pgid)), live_group_members(pgid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        for pid in servers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    # ... leaving a dead mount, visibly so: still listed, and every request fails with
    # ENOTCONN instead of the mount silently turning into the empty mountpoint directory.
    assert fstype(mnt) == "fuse.fanfs"
    no_errno(errno.ENOTCONN, os.statvfs, mnt)
    no_errno(errno.ENOTCONN, os.listdir, mnt)
    no_errno(errno.ENOTCONN, os.listdir, mnt / "sizes")
    no_errno(errno.ENOTCONN, (mnt / "sizes" / "text_100").read_bytes)

    result = run_fanfs("umount", *(["--lazy"] if lazy else []), mnt, timeout=60)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")
    assert mountinfo(mnt) is None
    assert os.listdir(mnt) == []
    result = run_fanfs("umount", mnt)
    assert (result.returncode, result.stderr) == (
        2,
        "fanfs umount: error: %s is not mounted\n" % mnt,
    )


def test_mount_options_pass_through(edge_pack: Path, mount_factory: Callable[..., Mount]) -> None:
    # -o may be repeated and comma-separated; `rw` is ignored (the mount is always read-only).
    mount = mount_factory(edge_pack, "-o", "allow_other,rw", "-o", "noatime")
    fields = mountinfo(mount.mnt)
    assert fields is not None
    sep = fields.index("-")
    mount_options = fields[5].split(",")
    fs_type, source, super_options = fields[sep + 1], fields[sep + 2], fields[sep + 3].split(",")
    assert (fs_type, source) == ("fuse.fanfs", TEST_FSNAME)
    assert "ro" in mount_options and "rw" not in mount_options
    assert "noatime" in mount_options
    assert "allow_other" in super_options
    assert "default_permissions" in super_options
    assert os.statvfs(mount.mnt).f_flag & os.ST_RDONLY
    no_errno(errno.EROFS, os.open, mount.mnt / "sizes" / "text_100", os.O_WRONLY)


def test_mount_help() -> None:
    result = run_fanfs("mount", "--help")
    assert (result.returncode, result.stderr) == (0, "")
    out = result.stdout
    assert out.startswith("usage: fanfs mount ")
    for needle in (
        "PACK",
        "MOUNTPOINT",
        "--foreground",
        "-o OPT",
        "allow_other",
        "--no-noopen",
        "--log",
        "exit codes",
        "4 mount setup failed",
    ):
        assert needle.lower() in out.lower(), needle


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--prefetch-memory", "100KiB"],
            "--prefetch-memory must be at least 1MiB (to stop prefetching: --prefetch off)",
        ),
        (
            ["--cache-memory", "lots"],
            "invalid size 'lots' (expected a number with an optional unit such as 4MiB)",
        ),
    ],
)
def test_bad_cache_and_prefetch_sizes_are_usage_errors(
    args: list[str], message: str, edge_pack: Path, tmp_path: Path
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_fanfs("mount", *args, edge_pack, mnt)
    assert (result.returncode, result.stderr, result.stdout) == (
        2,
        "fanfs mount: error: %s\n" % message,
        "",
    )
    assert mountinfo(mnt) is None
