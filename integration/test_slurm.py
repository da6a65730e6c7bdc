"""The Slurm recipe of docs/cluster.md, run for real (issue 13): a slurmctld and two slurmd
nodes on this machine, started and stopped by this module, and the batch script
integration/slurm/fanfs-job.sh that users copy, submitted with sbatch.

The cluster (integration/slurm/slurm.conf.in says why each setting): munged, slurmctld
(proctrack/cgroup where the host has cgroup v1's freezer; proctrack/linuxproc elsewhere,
or with FANFS_SLURM_PROCTRACK=linuxproc), and one slurmd per node, each node in its own UTS
and mount namespace (`unshare`) with its own hostname, its own /etc/hosts and a private
tmpfs as node-local disk at ROOT/local. So the recipe's MNT and CACHE are the same path on
every node yet node-local, as on a real cluster; ROOT/shared plays the shared parallel
filesystem. A node's mounts are seen in /proc/SLURMD_PID/mountinfo and its files through
/proc/SLURMD_PID/root. Each node's first process is integration/slurm/node.py, which also
lets go of the node's copies of the host's FUSE mounts (see there) before it execs slurmd.

What is checked (docs/cluster.md, "Slurm", gives the why of each):
- a FUSE mount made on the host before the cluster started still unmounts cleanly;
- a batch job mounts on every node (one cluster daemon per node, an MPI rank each), waits,
  runs a reader step that compares every file's bytes with the source on every node, and
  unmounts: the mounts of one step serve the next steps, and the job leaves no mount and
  no process behind;
- a job cancelled with scancel while it runs (after a second reader step, started from
  outside the batch script with `srun --jobid --overlap`) leaves no mount and no process:
  every daemon got SIGTERM from Slurm and unmounted;
- a pack that cannot be mounted ends the job at once;
- a script that ends without unmounting leaves nothing either (Slurm's SIGTERM);
- what the recipe avoids: a daemonizing `srun fanfs mount` step, whose daemon dies with its
  step (proctrack/cgroup: the next step gets ENOTCONN) or escapes the job
  (proctrack/linuxproc); a step without --overlap beside a running one (it cannot
  start); SIGTERM to the mount step's srun, which SIGKILLs the daemons and leaves dead
  mounts;
- docs/cluster.md shows the recipe unchanged.

Outside CI the tests skip, with the reason, where Slurm is not installed or cannot start;
under CI=true they fail instead. Teardown kills every process in the nodes' namespaces
(the namespaces and their mounts then vanish), then slurmctld and munged, and removes ROOT,
whether the tests passed or not.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fanfs.mountinfo import mounts_under
from integration.conftest import mpi_unavailable
from tests.conftest import Mount, run_fanfs
from tests.treegen import make_dataset

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

HERE = Path(__file__).parent / "slurm"
RECIPE = HERE / "fanfs-job.sh"
READER = HERE / "read_check.py"
NODES = ("node1", "node2")
TOOLS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel")
TOOLS += ("scontrol", "sinfo", "unshare", "nsenter", "setpriv", "fusermount3")
START_DEADLINE_S = 60.0
JOB_DEADLINE_S = 120.0
GONE_DEADLINE_S = 20.0  # after a job ends: its step daemons and processes exit
FILES = 240
CGROUP_ROOT = Path("/sys/fs/cgroup")
FANFS_CMD = (sys.executable, "-m", "fanfs")


def slurm_unavailable() -> str | None:
    """Why a Slurm test cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (Slurm daemons, namespaces, mounts)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return (
            "not on PATH: %s (tools/setup.sh installs slurmctld, slurmd, slurm-client, munge)"
            % (", ".join(missing))
        )
    if not (Path(sys.executable).parent / "fanfs").exists():
        return "no fanfs command next to %s (pip install -e .)" % sys.executable
    return mpi_unavailable()


def choose_proctrack() -> str:
    """proctrack/cgroup where cgroup v1's freezer is mounted (the test machines), else
    proctrack/linuxproc; FANFS_SLURM_PROCTRACK=cgroup|linuxproc chooses by hand."""
    chosen = os.environ.get("FANFS_SLURM_PROCTRACK")
    if chosen is None:
        chosen = "cgroup" if (CGROUP_ROOT / "freezer" / "tasks").exists() else "linuxproc"
    return "proctrack/" + chosen


def skip_or_fail(reason: str) -> None:
    """Skip with the reason, but fail in CI: CI must run these tests."""
    if os.environ.get("CI"):
        pytest.fail("Slurm integration tests cannot run in CI: %s" % reason)
    pytest.skip(reason)


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("0.0.0.0", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink("/proc/%d/ns/mnt" % pid)
    except OSError:
        return None


def _argv(pid: int) -> list[str]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    return " ".join(_argv(pid))


def _is_fanfs(argv: list[str]) -> bool:
    """`fanfs ...` or `python -m fanfs ...`."""
    pairs = itertools.pairwise(argv)
    return any(os.path.basename(arg) == "fanfs" for arg in argv[:2]) or ("-m", "fanfs") in pairs


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return "(%s)" % exc


class SlurmCluster:
    """munged, slurmctld and one namespaced slurmd per node, all under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "etc" / "slurm.conf"
        self.shared = root / "shared"
        self.local = root / "local"  # a private tmpfs in each node's namespace
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.proctrack = choose_proctrack()
        self.node_ns: dict[str, str] = {}
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "PMIX_", "PMI_", "OMPI_"))
        }
        self.env["SLURM_CONF"] = str(self.conf)
        # The job's steps run the venv's fanfs; sbatch passes this environment on.
        self.env["PATH"] = "%s:%s" % (Path(sys.executable).parent, self.env.get("PATH", ""))

    # -- start ---------------------------------------------------------------------------

    def write_config(self) -> None:
        for sub in ("etc", "state", "log", "shared", "local"):
            (self.root / sub).mkdir()
        (self.root / "munge").mkdir(mode=0o700)
        (self.root / "run").mkdir(mode=0o755)  # munged wants its socket's directory public
        for node in NODES:
            (self.root / "spool" / node).mkdir(parents=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        cpus = os.cpu_count() or 1
        nodes = "\n".join(
            "NodeName=%s NodeHostname=%s NodeAddr=127.0.0.%d Port=%d CPUs=%d RealMemory=1024"
            " State=UNKNOWN" % (node, node, i + 2, port, cpus)
            for i, (node, port) in enumerate(zip(NODES, node_ports, strict=True))
        )
        template = string.Template((HERE / "slurm.conf.in").read_text())
        self.conf.write_text(
            template.substitute(
                root=self.root,
                ctld_host=socket.gethostname().split(".")[0],
                ctld_port=ctld_port,
                nodes=nodes,
                proctrack=self.proctrack,
            )
        )
        # Slurm reads cgroup.conf from slurm.conf's directory.
        (self.root / "etc" / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=%s\nCgroupAutomount=no\n" % CGROUP_ROOT
        )
        hosts = ["127.0.0.1 localhost %s" % socket.gethostname()]
        hosts += ["127.0.0.%d %s" % (i + 2, node) for i, node in enumerate(NODES)]
        (self.root / "etc" / "hosts").write_text("\n".join(hosts) + "\n")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        """Start a daemon in the foreground, in its own session. It gets SIGKILL should this
        test process die before its teardown (`setpriv --pdeathsig`, kept across the execs)."""
        with open(self.root / "log" / (name + ".out"), "wb") as out:
            self.procs[name] = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", "--", *cmd],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def _check_alive(self, what: str) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    "%s exited with %s while %s:\n%s"
                    % (name, proc.returncode, what, self.diagnostics())
                )

    def _poll(
        self, what: str, ready: Callable[[], bool], deadline_s: float = START_DEADLINE_S
    ) -> None:
        deadline, step = time.monotonic() + deadline_s, 0.05
        while not ready():
            self._check_alive(what)
            if time.monotonic() > deadline:
                raise RuntimeError("timed out %s:\n%s" % (what, self.diagnostics()))
            time.sleep(step)
            step = min(step * 2, 0.5)

    def start(self) -> None:
        self.write_config()
        run, munge = self.root / "run", self.root / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--key-file=%s" % (munge / "munge.key"),
                "--socket=%s" % (run / "munge.socket"),
                "--pid-file=%s" % (run / "munged.pid"),
                "--seed-file=%s" % (munge / "munged.seed"),
                "--log-file=%s" % (self.root / "log" / "munged.log"),
            ],
        )
        self._poll("starting munged", lambda: (run / "munge.socket").exists())
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for node in NODES:
            # unshare and node.py exec (no fork for these namespaces): the Popen pid is the
            # node's slurmd.
            self._spawn(
                node,
                [
                    "unshare",
                    "--uts",
                    "--mount",
                    "--propagation",
                    "slave",
                    "--",
                    sys.executable,
                    str(HERE / "node.py"),
                    node,
                    str(self.root / "etc" / "hosts"),
                    str(self.local),
                    str(self.conf),
                ],
            )
        self._poll("waiting for every node to be idle", self._all_idle)
        for node in NODES:
            ns = _mnt_ns(self.procs[node].pid)
            assert ns is not None and ns != _mnt_ns(os.getpid()), node
            self.node_ns[node] = ns

    def _all_idle(self) -> bool:
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return all(states.get(node) == "idle" for node in NODES)

    # -- use -----------------------------------------------------------------------------

    def slurm(
        self, *cmd: str | os.PathLike[str], check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        result = subprocess.run(
            [str(c) for c in cmd],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
            cwd=self.shared,
        )
        if check and result.returncode != 0:
            pytest.fail(
                "%s exited %d:\n%s%s"
                % (" ".join(map(str, cmd)), result.returncode, result.stdout, result.stderr)
            )
        return result

    def sbatch(self, *args: str | os.PathLike[str], env: dict[str, str]) -> str:
        """Submit the recipe with `args` (sbatch options, then the command); the job id."""
        before = dict(self.env)
        self.env.update(env)
        try:
            out = self.slurm("sbatch", "--parsable", "-o", self.shared / "job-%j.out", *args).stdout
        finally:
            self.env = before
        return out.strip().split(";")[0]

    def job_fields(self, job: str) -> dict[str, str]:
        out = self.slurm("scontrol", "-o", "show", "job", job, check=False).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def steps(self, job: str) -> list[str]:
        """Names of the job's running steps."""
        out = self.slurm("squeue", "-h", "-s", "-j", job, "-o", "%j", check=False).stdout
        return out.split()

    def wait_job_end(self, job: str, deadline_s: float = JOB_DEADLINE_S) -> dict[str, str]:
        """The job's record once it has ended and every node has finished cleaning up."""
        deadline = time.monotonic() + deadline_s
        while True:
            fields = self.job_fields(job)
            state = fields.get("JobState", "")
            if state not in ("", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return fields
            self._check_alive("job %s ran" % job)
            if time.monotonic() > deadline:
                self.slurm("scancel", job, check=False)
                pytest.fail(
                    "job %s still %s after %.0fs:\n%s"
                    % (job, state, deadline_s, self.diagnostics(job))
                )
            time.sleep(0.25)

    # -- observe a node ------------------------------------------------------------------

    def node_path(self, node: str, path: Path) -> Path:
        """`path` as the node sees it (its private tmpfs and mounts included)."""
        return Path("/proc/%d/root" % self.procs[node].pid) / path.relative_to("/")

    def node_mounts(self, node: str, base: Path) -> list[str]:
        table = "/proc/%d/mountinfo" % self.procs[node].pid
        return ["%s %s" % (m.mountpoint, m.fstype) for m in mounts_under(str(base), table=table)]

    def on_node(self, node: str, *cmd: str | os.PathLike[str]) -> None:
        """Run `cmd` in the node's mount namespace, as a site's epilog would (cleanup)."""
        subprocess.run(
            ["nsenter", "-t", str(self.procs[node].pid), "-m", *map(str, cmd)],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def node_processes(self, node: str) -> list[str]:
        """Every process in the node's namespace except its slurmd."""
        slurmd = self.procs[node].pid
        return [
            "%d %s" % (pid, _cmdline(pid))
            for pid in _pids()
            if pid != slurmd and _mnt_ns(pid) == self.node_ns[node]
        ]

    def diagnostics(self, job: str | None = None) -> str:
        parts = []
        if job is not None:
            parts += ["--- job %s output ---" % job, _tail(self.shared / ("job-%s.out" % job))]
        for name in ("slurmctld", *NODES):
            log = "slurmd-%s.log" % name if name in NODES else "slurmctld.log"
            parts += ["--- %s ---" % log, _tail(self.root / "log" / log)]
        for name in self.procs:
            parts += ["--- %s.out ---" % name, _tail(self.root / "log" / (name + ".out"), 1000)]
        return "\n".join(parts)

    def reset(self) -> None:
        """Between tests: cancel every job, then detach any mount and end any process a
        failed test left on a node, so the next test starts on idle, clean nodes."""
        self.slurm("scancel", "--user=root", check=False)
        deadline = time.monotonic() + START_DEADLINE_S
        while self.slurm("squeue", "-h", "-o", "%i", check=False).stdout.strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        for node in NODES:
            for mount in reversed(self.node_mounts(node, self.local)):
                mountpoint, fstype = mount.rsplit(" ", 1)
                if fstype.startswith("fuse"):
                    self.on_node(node, "fusermount3", "-u", "-z", mountpoint)
            for line in self.node_processes(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split()[0]), signal.SIGKILL)
        self._poll("waiting for every node to be idle again", self._all_idle)

    # -- stop ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill everything this cluster started; never raises. Idempotent."""
        for node in NODES:
            ns = self.node_ns.get(node)
            proc = self.procs.get(node)
            if ns is None and proc is not None:
                ns = _mnt_ns(proc.pid)
            if ns is None:
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                victims = [pid for pid in _pids() if _mnt_ns(pid) == ns]
                if not victims:
                    break
                for pid in victims:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                if proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(0.1)
                time.sleep(0.05)
        if self.proctrack == "proctrack/cgroup":
            # The nodes' (now empty) cgroups: slurmstepd removes a step's own when it ends,
            # but not what a killed slurmd leaves. rmdir never removes a cgroup in use.
            for node in NODES:
                top = CGROUP_ROOT / "freezer" / ("slurm_" + node)
                for dirpath, _, _ in sorted(os.walk(top), reverse=True):
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)
        for name in ("slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            # slurmctld's helper (slurmscriptd) shares its session: take the whole group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


@pytest.fixture(scope="module")
def mount_before_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    """A single-node fanfs mount on the host, made before the cluster starts: each node's
    namespace then starts with a copy of it (integration/slurm/node.py)."""
    base = tmp_path_factory.mktemp("before-cluster")
    make_dataset(base / "src", 20)
    result = run_fanfs("pack", base / "src", base / "pack", "-q")
    assert result.returncode == 0, result.stderr
    with Mount(base / "pack", base / "mnt") as mount:
        yield mount


@pytest.fixture(scope="module")
def slurm(mount_before_cluster: Mount) -> Iterator[SlurmCluster]:
    reason = slurm_unavailable()
    if reason is not None:
        skip_or_fail(reason)
    # Not under pytest's base temp: munged refuses a socket whose ancestors are not
    # searchable by every user, and pytest-of-root is mode 0700.
    root = Path(tempfile.mkdtemp(prefix="fanfs-slurm-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root)
    try:
        try:
            cluster.start()
        except RuntimeError as exc:
            skip_or_fail("the Slurm test cluster did not start: %s" % exc)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def dataset(slurm: SlurmCluster) -> dict[str, Path]:
    """A pack on the 'shared filesystem', the sha256 of every source file, and the recipe's
    PACK, MNT, CACHE (MNT and CACHE node-local)."""
    src, pack = slurm.shared / "src", slurm.shared / "imagenet.fan"
    make_dataset(src / "train", FILES, per_dir=80)
    result = run_fanfs("pack", src, pack, "-q", "--partitions", "8", "--chunk-size", "65536")
    assert result.returncode == 0, result.stderr
    expected = {
        str(path.relative_to(src)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(src.rglob("*"))
        if path.is_file()
    }
    manifest = slurm.shared / "expected.json"
    manifest.write_text(json.dumps(expected))
    results = slurm.shared / "results"
    results.mkdir()
    return {
        "pack": pack,
        "mnt": slurm.local / "imagenet",
        "cache": slurm.local / "fanfs-cache",
        "expected": manifest,
        "results": results,
    }


@pytest.fixture(autouse=True)
def _clean_nodes(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each cluster test, pass or fail: no job, mount or stray process left."""
    yield
    if "slurm" in request.fixturenames:
        cluster: SlurmCluster = request.getfixturevalue("slurm")
        try:
            cluster.reset()
        except RuntimeError as exc:
            pytest.fail(str(exc))


def recipe_env(data: dict[str, Path]) -> dict[str, str]:
    return {"PACK": str(data["pack"]), "MNT": str(data["mnt"]), "CACHE": str(data["cache"])}


def reader_command(data: dict[str, Path]) -> list[str]:
    return [
        sys.executable,
        str(READER),
        str(data["mnt"]),
        str(data["expected"]),
        str(data["results"]),
    ]


def check_reads(slurm: SlurmCluster, data: dict[str, Path], job: str) -> str:
    """One step of `job` ran the reader on every node, and each read every file right, some
    of them from the other node; returns that step's id."""
    found = {}
    for path in data["results"].glob("%s.*.json" % job):
        result = json.loads(path.read_text())
        found[(result["step"], result["host"])] = result
    steps = {step for step, _ in found}
    hosts = sorted(host for _, host in found)
    assert len(steps) == 1 and hosts == sorted(NODES), "reader results %s:\n%s" % (
        sorted(found),
        slurm.diagnostics(job),
    )
    for result in found.values():
        assert result["files"] == FILES, result
        assert (result["wrong"], result["missing"], result["extra"]) == ([], [], []), result
        stats = result["stats"]
        assert stats["ranks"] == len(NODES), stats
        # Each node holds only its share: the rest came from the other node over MPI.
        assert stats["remote_fetches"] > 0, stats
    ranks = sorted(result["stats"]["rank"] for result in found.values())
    assert ranks == list(range(len(NODES)))
    return steps.pop()


def assert_nothing_left(slurm: SlurmCluster, data: dict[str, Path], job: str) -> None:
    """No node has a mount under its local disk, no process of the job is left anywhere."""
    deadline = time.monotonic() + GONE_DEADLINE_S
    while True:
        mounts = {node: slurm.node_mounts(node, slurm.local) for node in NODES}
        procs = {node: slurm.node_processes(node) for node in NODES}
        fanfs = [
            "%d %s" % (pid, _cmdline(pid))
            for pid in _pids()
            if _is_fanfs(_argv(pid)) and str(slurm.root) in _cmdline(pid)
        ]
        # Only the nodes' own tmpfs may remain mounted there.
        mounts = {node: [m for m in found if "fuse" in m] for node, found in mounts.items()}
        if not any(mounts.values()) and not any(procs.values()) and not fanfs:
            break
        if time.monotonic() > deadline:
            pytest.fail(
                "job %s left mounts %s, processes %s, fanfs processes %s:\n%s"
                % (job, mounts, procs, fanfs, slurm.diagnostics(job))
            )
        time.sleep(0.25)
    # This test process's own namespace never saw the nodes' mounts.
    assert [m for m in mounts_under(str(slurm.root)) if "fuse" in m.fstype] == []


def node_log(slurm: SlurmCluster, data: dict[str, Path], node: str, since: int = 0) -> str:
    """The node's fanfs log (it lives on across jobs in the node's cache dir), from `since`."""
    path = slurm.node_path(node, data["cache"] / "fanfs.log")
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(since)
        return f.read().decode(errors="replace")


def log_sizes(slurm: SlurmCluster, data: dict[str, Path]) -> dict[str, int]:
    return {node: len(node_log(slurm, data, node).encode()) for node in NODES}


def test_a_mount_made_before_the_cluster_still_unmounts(
    slurm: SlurmCluster, mount_before_cluster: Mount
) -> None:
    """The nodes do not hold on to FUSE mounts of the host: unmounting one made before the
    cluster started still ends its daemon (with a copy left in a node's namespace, the
    daemon would never see its connection end)."""
    for node in NODES:
        assert slurm.node_mounts(node, mount_before_cluster.mnt) == [], node
    mount_before_cluster.unmount()  # fanfs umount; the daemon exits 0 within 10 s


def test_batch_recipe_mounts_reads_across_steps_and_unmounts(
    slurm: SlurmCluster, dataset: dict[str, Path]
) -> None:
    """sbatch fanfs-job.sh: the mount step serves the wait step and the reader step on every
    node, the unmount step ends it cleanly, and the job ends COMPLETED with nothing left."""
    since = log_sizes(slurm, dataset)
    job = slurm.sbatch(
        "--nodes=%d" % len(NODES),
        "--time=3",
        RECIPE,
        *reader_command(dataset),
        env=recipe_env(dataset),
    )
    fields = slurm.wait_job_end(job)
    output = _tail(slurm.shared / ("job-%s.out" % job))
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), slurm.diagnostics(job)
    check_reads(slurm, dataset, job)
    assert output.count("read_check on") == len(NODES), output
    assert_nothing_left(slurm, dataset, job)
    for node in NODES:
        log = node_log(slurm, dataset, node, since[node])
        assert "unmounted %s" % dataset["mnt"] in log, log[-3000:]
        assert " ERROR " not in log and "Traceback" not in log, log[-3000:]
        # Stopped by the unmount step, not by a signal.
        assert "received SIGTERM" not in log, log[-3000:]


def test_scancel_leaves_no_mount_and_no_process(
    slurm: SlurmCluster, dataset: dict[str, Path]
) -> None:
    """A job whose user step never ends: a second reader step started from outside reads the
    mount step's mounts; scancel then ends everything and each daemon unmounts on SIGTERM."""
    since = log_sizes(slurm, dataset)
    job = slurm.sbatch(
        "--nodes=%d" % len(NODES),
        "--time=3",
        RECIPE,
        "sleep",
        "600",
        env=recipe_env(dataset),
    )
    deadline = time.monotonic() + JOB_DEADLINE_S
    while "sleep" not in slurm.steps(job):  # fanfs wait has passed on every node
        fields = slurm.job_fields(job)
        if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
            pytest.fail("job %s ended early: %s\n%s" % (job, fields, slurm.diagnostics(job)))
        if time.monotonic() > deadline:
            slurm.slurm("scancel", job, check=False)
            pytest.fail("job %s never reached its sleep step:\n%s" % (job, slurm.diagnostics(job)))
        time.sleep(0.25)
    for node in NODES:
        assert slurm.node_mounts(node, dataset["mnt"]) == ["%s fuse.fanfs" % dataset["mnt"]]
    reader = slurm.slurm(
        "srun",
        "--jobid",
        job,
        "--overlap",
        "--nodes=%d" % len(NODES),
        "--ntasks-per-node=1",
        *reader_command(dataset),
        timeout=JOB_DEADLINE_S,
    )
    assert reader.stdout.count("read_check on") == len(NODES), reader.stdout
    check_reads(slurm, dataset, job)

    slurm.slurm("scancel", job)
    fields = slurm.wait_job_end(job)
    assert fields["JobState"] == "CANCELLED", fields
    assert_nothing_left(slurm, dataset, job)
    for node in NODES:
        log = node_log(slurm, dataset, node, since[node])
        # This job's daemon was told by Slurm and unmounted before any SIGKILL.
        assert log.count("received SIGTERM, unmounting") == 1, log[-3000:]
        after = log.split("received SIGTERM, unmounting")[1]
        assert "unmounted %s" % dataset["mnt"] in after, log[-3000:]


def test_mounts_that_cannot_start_end_the_job_at_once(
    slurm: SlurmCluster, dataset: dict[str, Path]
) -> None:
    """A pack that is not there: every daemon exits with the same one-line error, the recipe
    sees its mount step gone and ends the job (not after fanfs wait's 30 minutes)."""
    env = recipe_env(dataset)
    env["PACK"] = str(slurm.shared / "no-such.fan")
    started = time.monotonic()
    job = slurm.sbatch("--nodes=%d" % len(NODES), "--time=3", RECIPE, "true", env=env)
    fields = slurm.wait_job_end(job)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "1:0"), slurm.diagnostics(job)
    assert time.monotonic() - started < 60
    output = _tail(slurm.shared / ("job-%s.out" % job))
    assert "fanfs-job: the mounts did not come up" in output, output
    assert_nothing_left(slurm, dataset, job)


def test_a_daemon_started_by_a_short_step_is_not_the_jobs(
    slurm: SlurmCluster, dataset: dict[str, Path]
) -> None:
    """Why the recipe keeps its mount step running: `srun fanfs mount` as a step of its own
    (single-node mode, which daemonizes) returns once mounted, and its step ends. Under
    proctrack/cgroup Slurm then kills the daemon with the step, and the next step finds a
    dead mount ("Transport endpoint is not connected"). Under proctrack/linuxproc the daemon
    has left the step's process tree, so Slurm loses track of it: it outlives even scancel,
    mounted, on a node the job has left."""
    job = slurm.sbatch(
        "--nodes=1", "--nodelist=%s" % NODES[0], "--time=3", "--wrap", "sleep 600", env={}
    )
    deadline = time.monotonic() + JOB_DEADLINE_S
    while slurm.job_fields(job).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, slurm.diagnostics(job)
        time.sleep(0.25)
    mnt = slurm.local / "short-step"
    step = ("srun", "--jobid", job, "--overlap", "--nodes=1", "--ntasks=1")
    slurm.slurm(*step, "mkdir", "-p", mnt)
    node = NODES[0]

    def daemons() -> list[str]:
        return [p for p in slurm.node_processes(node) if _is_fanfs(p.split()[1:])]

    try:
        cache = slurm.local / "short-cache"
        slurm.slurm(*step, "fanfs", "mount", dataset["pack"], mnt, "--cache-dir", cache)
        deadline = time.monotonic() + GONE_DEADLINE_S
        if slurm.proctrack == "proctrack/cgroup":
            while daemons():  # killed with its step
                assert time.monotonic() < deadline, daemons()
                time.sleep(0.1)
            ls = slurm.slurm(*step, "ls", mnt, check=False)
            assert "Transport endpoint is not connected" in ls.stderr, ls.stderr
            assert slurm.node_mounts(node, mnt) == ["%s fuse.fanfs" % mnt]
            slurm.slurm("scancel", job)
            assert slurm.wait_job_end(job)["JobState"] == "CANCELLED"
        else:
            # The step has ended; the daemon is still serving.
            listing = slurm.slurm(*step, "ls", mnt / "train").stdout.split()
            assert len(listing) == FILES // 80, listing
            slurm.slurm("scancel", job)
            assert slurm.wait_job_end(job)["JobState"] == "CANCELLED"
            # Slurm is done with the job on the node once only the daemon is left there.
            while (left := slurm.node_processes(node)) != daemons():
                assert daemons() and time.monotonic() < deadline, left
                time.sleep(0.25)
            assert slurm.node_mounts(node, mnt) == ["%s fuse.fanfs" % mnt]
            os.statvfs(slurm.node_path(node, mnt))  # alive and serving
    finally:
        slurm.on_node(node, *FANFS_CMD, "umount", mnt)  # live or dead alike
    assert_nothing_left(slurm, dataset, job)


def test_steps_share_a_node_only_with_overlap(slurm: SlurmCluster) -> None:
    """Why every step of the recipe says --overlap: a running step that did not holds its
    job's memory on the node (memory is scheduled here), and a second step without
    --overlap cannot start beside it; with --overlap it can."""
    job = slurm.sbatch("--nodes=1", "--time=3", "--wrap", "sleep 600", env={})
    step = ("srun", "--jobid", job, "--nodes=1", "--ntasks=1")
    deadline = time.monotonic() + JOB_DEADLINE_S
    while slurm.job_fields(job).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, slurm.diagnostics(job)
        time.sleep(0.25)
    with open(slurm.shared / "holder.out", "wb") as out:
        holder = subprocess.Popen(
            [*step, "sleep", "600"], stdout=out, stderr=subprocess.STDOUT, env=slurm.env
        )
    try:
        while "sleep" not in slurm.steps(job):
            assert holder.poll() is None and time.monotonic() < deadline, slurm.diagnostics(job)
            time.sleep(0.25)
        busy = slurm.slurm(*step, "--immediate=2", "true", check=False)
        assert busy.returncode != 0 and "Requested nodes are busy" in busy.stderr, busy.stderr
        slurm.slurm(*step, "--overlap", "--immediate=2", "true")
    finally:
        slurm.slurm("scancel", job, check=False)
        holder.wait(JOB_DEADLINE_S)


NO_UNMOUNT_RECIPE = """#!/bin/bash
srun --ntasks-per-node=1 mkdir -p "$MNT"
srun --overlap --mpi=pmix --ntasks-per-node=1 fanfs mount "$PACK" "$MNT" --cache-dir "$CACHE" &
srun --overlap --ntasks-per-node=1 fanfs wait "$MNT" --timeout 60
"""

OLD_RECIPE = """#!/bin/bash
srun --ntasks-per-node=1 mkdir -p "$MNT"
srun --overlap --mpi=pmix --ntasks-per-node=1 fanfs mount "$PACK" "$MNT" --cache-dir "$CACHE" &
MOUNTS=$!
srun --overlap --ntasks-per-node=1 fanfs wait "$MNT" --timeout 60
kill -TERM $MOUNTS; wait $MOUNTS
"""


def test_a_script_that_ends_without_unmounting_leaves_nothing(
    slurm: SlurmCluster, dataset: dict[str, Path]
) -> None:
    """A batch script that exits (or dies) while its mount step still runs: Slurm ends the
    job's steps with SIGTERM, and every daemon unmounts."""
    script = slurm.shared / "no-unmount.sh"
    script.write_text(NO_UNMOUNT_RECIPE)
    since = log_sizes(slurm, dataset)
    job = slurm.sbatch("--nodes=%d" % len(NODES), "--time=3", script, env=recipe_env(dataset))
    assert slurm.wait_job_end(job)["JobState"] == "COMPLETED", slurm.diagnostics(job)
    assert_nothing_left(slurm, dataset, job)
    for node in NODES:
        log = node_log(slurm, dataset, node, since[node])
        assert log.count("received SIGTERM, unmounting") == 1, log[-3000:]
        assert "unmounted %s" % dataset["mnt"] in log.split("received SIGTERM")[1], log[-3000:]


def test_sigterm_to_srun_kills_the_daemons_and_leaves_dead_mounts(
    slurm: SlurmCluster, dataset: dict[str, Path]
) -> None:
    """Why the recipe ends with an unmount step: the stop this page used to give, SIGTERM to
    the mount step's srun, makes srun kill its tasks with SIGKILL (Slurm 22.05). No daemon
    unmounts; every node keeps a dead mount (ENOTCONN) until someone detaches it."""
    script = slurm.shared / "old-recipe.sh"
    script.write_text(OLD_RECIPE)
    since = log_sizes(slurm, dataset)
    mnt = dataset["mnt"]
    job = slurm.sbatch("--nodes=%d" % len(NODES), "--time=3", script, env=recipe_env(dataset))
    try:
        slurm.wait_job_end(job)
        assert "forcing job termination" in _tail(slurm.shared / ("job-%s.out" % job))
        for node in NODES:
            assert slurm.node_mounts(node, mnt) == ["%s fuse.fanfs" % mnt], node
            with pytest.raises(OSError) as dead:
                os.statvfs(slurm.node_path(node, mnt))
            assert dead.value.errno == errno.ENOTCONN, dead.value
            log = node_log(slurm, dataset, node, since[node])
            assert "mounted %s" % dataset["pack"] in log and "unmounted" not in log, log[-3000:]
    finally:
        for node in NODES:
            slurm.on_node(node, *FANFS_CMD, "umount", "--lazy", mnt)
    assert_nothing_left(slurm, dataset, job)


def test_docs_show_the_tested_recipe() -> None:
    """docs/cluster.md shows fanfs-job.sh byte for byte: what users copy is what runs here."""
    docs = (Path(__file__).parent.parent / "docs" / "cluster.md").read_text()
    assert "```sh\n%s```\n" % RECIPE.read_text() in docs
