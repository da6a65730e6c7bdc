"""`fanfs mount PACK MOUNTPOINT`: lifecycle of one mount daemon.

Steps, each a function: validate the mountpoint and the pack (before anything is mounted,
so errors are one line and an exit code); fork the daemon (before any thread exists) unless
`-f`; `pyfuse3.init`; tell the waiting parent the mount is ready; run `pyfuse3.main` in a
nursery with the signal handler, the partition preloader and the read-ahead tuner; unmount
cleanly on SIGINT/SIGTERM/fusermount -u. A crash leaves the mount dead (ENOTCONN) rather than
silently showing the empty mountpoint; `fanfs umount` clears it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import faulthandler
import fcntl
import hashlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from fanfs._memory import available_memory
from fanfs._sizes import format_size, parse_size
from fanfs.cluster.topology import detect_launch
from fanfs.errors import FanfsError, MountSetupError, UsageError
from fanfs.format.reader import PackReader
from fanfs.logsetup import setup_logging
from fanfs.mountinfo import check_mountpoint
from fanfs.runtime import runtime_dir
from fanfs.shared import SharedState

log = logging.getLogger(__name__)

# Kernel read-ahead for the mount, in KiB: files of 1 MiB and more then arrive in one READ
# instead of eight (DESIGN.md section 4).
READ_AHEAD_KB: Final = 1024
# --preload auto: copy partitions into the mount's memory at start-up, in partition order,
# up to this share of the node's available memory; the others are read on demand (pread in
# worker threads). The copies are the daemon's own memory (not page cache the kernel may
# drop), hence a share that leaves the training job most of the node.
PRELOAD_MEMORY_SHARE: Final = 0.25
# Serving processes by default: two use both cores of a small node and most of the gain on a
# large one (each process is one trio thread; DESIGN.md section 4).
DEFAULT_PROCESSES: Final = 2
# How long the first process waits for the others to exit after the unmount.
REAP_WAIT_S: Final = 5.0
PR_SET_PDEATHSIG: Final = 1
MAX_PROCESSES: Final = 64


@dataclass(frozen=True, slots=True)
class MountConfig:
    pack: str
    mountpoint: str
    foreground: bool = False
    options: tuple[str, ...] = ()
    logfile: str | None = None
    debug: bool = False
    prefetch: bool = True
    prefetch_memory: int = 0  # 0: prefetch.default_memory
    prefetch_into: str = "kernel"
    cache_memory: int = -1  # -1: prefetch.default_cache_memory
    cache_policy: str = "minio"
    preload: str = "auto"
    noopen: bool = True
    fast_paths: bool = True
    thread_limit: int = 8
    processes: int = 0  # 0: DEFAULT_PROCESSES, bounded by the CPU count
    cluster: bool | None = None  # None: detect an MPI launch
    cache_dir: str | None = None
    replicas: int = 1
    stage: str = "copy"
    stage_groups: int = 0
    remote_timeout_s: float = 5.0
    coalesce_window_s: float = 0.0005


def config_from_args(args: argparse.Namespace) -> MountConfig:
    if not 0 <= args.processes <= MAX_PROCESSES:
        raise UsageError("--processes must be between 1 and %d (0: automatic)" % MAX_PROCESSES)
    options = tuple(o for group in args.options for o in group.split(",") if o)
    if args.prefetch_memory != "auto" and parse_size(args.prefetch_memory) < 1 << 20:
        raise UsageError(
            "--prefetch-memory must be at least 1MiB (to stop prefetching: --prefetch off)"
        )
    return MountConfig(
        pack=os.path.abspath(args.pack),
        mountpoint=os.path.abspath(args.mountpoint),
        foreground=args.foreground,
        options=options,
        logfile=args.log,
        debug=args.debug,
        prefetch=args.prefetch == "on",
        prefetch_memory=parse_size(args.prefetch_memory) if args.prefetch_memory != "auto" else 0,
        prefetch_into=args.prefetch_into,
        cache_memory=parse_size(args.cache_memory) if args.cache_memory != "auto" else -1,
        cache_policy=args.cache_policy,
        preload=_preload_option(args.preload),
        noopen=args.noopen,
        fast_paths=args.fast_paths,
        processes=args.processes,
        cluster=args.cluster,
        cache_dir=os.path.abspath(args.cache_dir) if args.cache_dir else None,
        replicas=args.replicas,
        stage=args.stage,
        stage_groups=args.stage_groups,
        remote_timeout_s=args.remote_timeout,
        coalesce_window_s=args.coalesce_window / 1000,
    )


def _preload_option(value: str) -> str:
    """`auto`, `yes`, `no`, or a memory budget such as `8GiB` (normalised to bytes)."""
    value = value.strip().lower()
    if value in ("auto", "yes", "no"):
        return value
    return str(parse_size(value))


def _import_pyfuse3() -> Any:
    try:
        import pyfuse3
    except ImportError as exc:
        raise MountSetupError("pyfuse3 is not installed (%s); run tools/setup.sh" % exc) from exc
    if not os.path.exists("/dev/fuse"):
        raise MountSetupError("/dev/fuse does not exist: FUSE is not available on this machine")
    return pyfuse3


def _mount_digest(mountpoint: str, length: int) -> str:
    return hashlib.sha1(mountpoint.encode(errors="surrogateescape")).hexdigest()[:length]


def _default_logfile(mountpoint: str) -> str:
    name = "mount%s-%s.log" % (mountpoint.replace("/", "-"), _mount_digest(mountpoint, 8))
    return os.path.join(runtime_dir(), name)


def _hints_socket_path(mountpoint: str, cache_dir: str | None) -> str:
    """Where the hint socket of a mount lives, outside the dataset namespace: the cache dir
    in cluster mode, else the runtime directory (a short name: socket paths are limited to
    107 bytes)."""
    if cache_dir:
        return os.path.join(cache_dir, "hints.sock")
    return os.path.join(runtime_dir(), "hints-%s.sock" % _mount_digest(mountpoint, 12))


def mount_from_args(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    launch = detect_launch()
    if config.cluster or (config.cluster is None and launch is not None and launch[1] > 1):
        return _cluster_from_config(config, launch[0] if launch else 0)
    check_mountpoint(config.mountpoint)
    reader = PackReader(config.pack)
    pyfuse3 = _import_pyfuse3()
    if config.foreground:
        setup_logging(debug=config.debug, logfile=config.logfile)
        return serve(reader, config, pyfuse3, on_ready=lambda: None)
    logfile = config.logfile or _default_logfile(config.mountpoint)
    return _daemonize(reader, config, pyfuse3, logfile)


def _cluster_from_config(config: MountConfig, rank: int) -> int:
    """Cluster mode: always in the foreground (the launcher owns the process), one serving
    process, `{rank}` expanded in paths so ranks on one machine get their own."""
    from fanfs.cluster.node import cluster_start, expand_rank

    log_pattern = config.logfile or (
        os.path.join(config.cache_dir, "fanfs.log") if config.cache_dir else None
    )
    cache_dir = expand_rank(config.cache_dir, rank)
    # Each rank logs to its own node-local file: mpirun stops reading the ranks' stderr when
    # it shuts a job down, and a daemon must not die writing its last log lines there.
    logfile = expand_rank(config.logfile, rank) or (
        os.path.join(cache_dir, "fanfs.log") if cache_dir else None
    )
    config = dataclasses.replace(
        config,
        mountpoint=expand_rank(config.mountpoint, rank) or config.mountpoint,
        cache_dir=cache_dir,
        logfile=logfile,
        foreground=True,
        processes=1,
    )
    if logfile:
        os.makedirs(os.path.dirname(logfile), exist_ok=True)
        if rank == 0:
            print("fanfs mount: cluster mode; each rank logs to %s" % log_pattern, file=sys.stderr)
    setup_logging(debug=config.debug, logfile=config.logfile, prefix="rank %d: " % rank)
    pyfuse3 = _import_pyfuse3()
    node = cluster_start(config)
    assert node.reader is not None
    return serve(node.reader, config, pyfuse3, on_ready=lambda: None, cluster=node)


def _daemonize(reader: PackReader, config: MountConfig, pyfuse3: Any, logfile: str) -> int:
    """Fork; the parent returns once the child has mounted (or failed, with its message)."""
    setup_logging(debug=config.debug, logfile=logfile)  # a bad log path fails here, in one line
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as status_pipe:
            status = status_pipe.read().decode(errors="replace")
        if status.startswith("ok"):
            return 0
        told, _, message = status.partition(" ")
        if not told.isdigit():
            message, told = "the mount daemon died during start-up; see %s" % logfile, "4"
        print("fanfs mount: error: %s" % message.strip(), file=sys.stderr)
        return int(told)
    os.close(read_fd)
    os.setsid()
    pipe = [write_fd]  # emptied once the parent has been told; the fd number is then reused
    code = 1
    try:
        _detach_stdio()

        def ready() -> None:
            os.write(pipe.pop(), b"ok\n")
            os.close(write_fd)

        code = serve(reader, config, pyfuse3, on_ready=ready)
    except FanfsError as exc:
        log.error("%s", exc)
        _report(pipe, exc.exit_code, str(exc))
        code = exc.exit_code
    except BaseException as exc:
        log.exception("mount daemon failed")
        _report(pipe, 1, "internal error: %s (see %s)" % (exc, logfile))
    finally:
        logging.shutdown()
        os._exit(code)


def _report(pipe: list[int], code: int, message: str) -> None:
    """Tell the waiting parent why start-up failed (unless it was already told "ok")."""
    if pipe:
        fd = pipe.pop()
        os.write(fd, ("%d %s\n" % (code, message)).encode())
        os.close(fd)


def _detach_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


# Mount options that pyfuse3/libfuse accept but that break the mount (DESIGN.md section 4).
_REFUSED_OPTIONS: Final = ("max_read", "direct_io")


def _mount_options(pyfuse3: Any, config: MountConfig) -> set[str]:
    for option in config.options:
        if option.split("=")[0] in _REFUSED_OPTIONS:
            raise UsageError(
                "-o %s is not supported by fanfs (it breaks the mount or shared mmap)" % option
            )
    # nosuid, nodev: the daemon answers with its own uid (root on a cluster node), so a
    # setuid file or a device node in an untrusted pack must not take effect.
    options = set(pyfuse3.default_options) | {"ro", "nosuid", "nodev", "subtype=fanfs"}
    if not any(o.startswith("fsname=") for o in config.options):
        options.add("fsname=fanfs")
    options.update(o for o in config.options if o not in ("rw",))
    for allowed in ("suid", "dev"):  # an explicit -o suid or -o dev (the user's decision)
        if allowed in options:
            options.discard("no" + allowed)
    return options


def preload_partitions(reader: PackReader, config: MountConfig, available: int) -> list[int]:
    """The local partitions to copy into memory at start-up: all with `--preload yes`, none
    with `no`, else those that fit, in partition order, in the budget (`--preload SIZE`, or
    PRELOAD_MEMORY_SHARE of `available`)."""
    local = [n for n, part in enumerate(reader.partitions) if reader.local[n] and part["size"]]
    if config.preload in ("yes", "no"):
        return local if config.preload == "yes" else []
    budget = (
        int(config.preload) if config.preload != "auto" else int(available * PRELOAD_MEMORY_SHARE)
    )
    chosen, used = [], 0
    for number in local:
        size = reader.partitions[number]["size"]
        if used + size <= budget:
            chosen.append(number)
            used += size
    return chosen


def _reserve_preload(reader: PackReader, config: MountConfig) -> int:
    """Reserve shared memory for the partitions to preload (before any fork); 0 if none."""
    available = available_memory()
    numbers = preload_partitions(reader, config, available)
    wanted = sum(reader.partitions[n]["size"] for n in numbers)
    if config.preload == "yes" and available and wanted > available // 2:
        log.warning(
            "--preload yes: %s of partitions is more than half of the %s available",
            format_size(wanted),
            format_size(available),
        )
    try:
        return reader.reserve_memory(numbers)
    except OSError as exc:
        log.warning(
            "cannot reserve %s to preload partitions (%s); serving them from the pack",
            format_size(wanted),
            exc.strerror,
        )
        return 0


def _enable_faulthandler(config: MountConfig) -> None:
    """Fatal-signal tracebacks and SIGUSR1 stack dumps go to the log (stderr is /dev/null
    in a background daemon)."""
    stream = sys.stderr
    for handler in logging.getLogger("fanfs").handlers:
        if isinstance(handler, logging.FileHandler):
            stream = handler.stream
    faulthandler.enable(file=stream, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)


def serving_processes(pyfuse3: Any, config: MountConfig) -> int:
    """How many processes serve the mount: several need pyfuse3 with fanfs patch level 2."""
    if getattr(pyfuse3, "FANFS_PATCH_LEVEL", 0) < 2:
        if config.processes not in (0, 1):
            log.warning(
                "serving with 1 process: pyfuse3 lacks the fanfs patch (run tools/setup.sh)"
            )
        return 1
    cpus = os.cpu_count() or 1
    return max(1, min(config.processes or DEFAULT_PROCESSES, cpus))


def serve(
    reader: PackReader, config: MountConfig, pyfuse3: Any, *, on_ready: Any, cluster: Any = None
) -> int:
    """Mount, serve until unmounted or signalled, unmount. Returns the exit status.

    With several serving processes, the first runs the INIT handshake alone, then forks the
    others; all of them then read requests from the same (non-blocking) /dev/fuse fd, and the
    kernel hands each request to whichever is free. The first process preloads, owns the
    unmount, and reaps the others; they die with it (PR_SET_PDEATHSIG).
    """
    _enable_faulthandler(config)
    # Until trio's signal receiver runs (and between the handshake and the fork), a SIGTERM
    # or SIGINT is only remembered: raising KeyboardInterrupt inside trio.run's machinery
    # could leave a serving process hung instead of stopped.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _remember_signal)
    ops, store = _build_operations(reader, config, pyfuse3, cluster)
    preload = _reserve_preload(reader, config) > 0
    _mount_kernel(pyfuse3, ops, config, cluster)
    # Ready means the kernel's INIT handshake is done (libfuse then calls ops.init()): a
    # mount the kernel refuses must fail here, not look mounted and hang its readers.
    ops.init_callbacks.append(on_ready)
    slot, family = _serve_until_unmounted(pyfuse3, ops, store, config, cluster, preload)
    # A second Ctrl-C while unmounting must not turn a clean exit into a crash.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if slot:
        pyfuse3.close(unmount=False)
        os._exit(0)
    pyfuse3.close(unmount=True)
    family.reap()
    log.info("unmounted %s; statistics: %s", config.mountpoint, ops.statistics())
    return 0


def memory_budgets(config: MountConfig) -> tuple[int, int]:
    """(object cache, prefetch memory) in bytes: the options, or defaults from the node's
    available memory."""
    from fanfs.prefetch import default_cache_memory, default_memory

    available = available_memory() or 4 << 30
    cache = config.cache_memory if config.cache_memory >= 0 else default_cache_memory(available)
    return cache, config.prefetch_memory or default_memory(available)


def _build_operations(
    reader: PackReader, config: MountConfig, pyfuse3: Any, cluster: Any
) -> tuple[Any, Any]:
    from fanfs.cache import MinioCache, make_cache
    from fanfs.operations import MountInfo, Operations
    from fanfs.store import ChunkStore

    processes = serving_processes(pyfuse3, config)
    chunks = reader.index.chunk_count
    cache_memory, prefetch_memory = memory_budgets(config)
    objects = make_cache(config.cache_policy, cache_memory, chunks=chunks, processes=processes)
    # The background filler of a single-node mount is a process of its own, with its own row
    # of counters (cluster mounts fill in a thread: see _fork_filler).
    filler = config.prefetch and cluster is None and isinstance(objects, MinioCache)
    rows = processes + (1 if filler else 0)
    shared = SharedState(processes=rows, partitions=len(reader.partitions), chunks=chunks)
    store = ChunkStore(
        reader,
        shared,
        buffer_budget=prefetch_memory,
        thread_limit=config.thread_limit,
        objects=objects,
    )
    if cluster is not None:
        store.remote = cluster.make_remote(shared, store.limiter)
    noopen = config.noopen and bool(getattr(pyfuse3, "FANFS_NOOPEN_READ", False))
    totals = reader.manifest.get("totals", {})
    info = MountInfo(
        pack=config.pack,
        mountpoint=config.mountpoint,
        noopen=noopen,
        fast_paths=config.fast_paths and getattr(pyfuse3, "FANFS_PATCH_LEVEL", 0) >= 4,
        processes=processes,
        bytes_in=int(totals.get("bytes_in", 0)),
        files=int(totals.get("files", 0)),
        prefetch="off" if not config.prefetch else config.prefetch_into,
        prefetch_memory=prefetch_memory,
        filler=filler,
        hints=_hints_socket_path(config.mountpoint, config.cache_dir) if config.prefetch else None,
    )
    ops = Operations(
        store, noopen=noopen, info=info, extra_stats=cluster.statistics if cluster else None
    )
    return ops, store


def _mount_kernel(pyfuse3: Any, ops: Any, config: MountConfig, cluster: Any) -> None:
    """pyfuse3.init; in cluster mode every rank agrees that all mounted (or all fail)."""
    error: FanfsError | None = None
    try:
        pyfuse3.init(ops, config.mountpoint, _mount_options(pyfuse3, config))
    except RuntimeError as exc:
        error = MountSetupError("cannot mount %s: %s" % (config.mountpoint, exc))
    except FanfsError as exc:
        error = exc
    if cluster is not None:
        cluster.before_serving(error)
    if error is not None:
        raise error
    info = ops.info
    log.info(
        "mounted %s at %s (%d files, %s, serving processes: %d, no-open mode %s, fast paths %s)",
        config.pack,
        config.mountpoint,
        info.files,
        format_size(info.bytes_in),
        info.processes,
        "on" if info.noopen else "off",
        "on" if info.fast_paths else "off",
    )
    objects = ops.store.objects
    log.info(
        "object cache: %s, %s; prefetch: %s, %s",
        objects.policy if objects else "off",
        format_size(objects.budget if objects else 0),
        info.prefetch,
        format_size(info.prefetch_memory),
    )


def _serve_until_unmounted(
    pyfuse3: Any, ops: Any, store: Any, config: MountConfig, cluster: Any, preload: bool
) -> tuple[int, _Family]:
    """Run the serving loop(s); returns this process's slot and, in the first, its children."""
    import trio

    slot, family = 0, _Family()
    try:
        if ops.info.processes > 1:
            # Stop right inside INIT, before this loop can read (and, once terminating,
            # drop) any later request; the forked processes serve those.
            ops.init_callbacks.append(pyfuse3.terminate)
            trio.run(pyfuse3.main)
            _check_initialized(pyfuse3, ops, config)
            ops.init_callbacks.clear()
            _nonblocking_session(pyfuse3)
            slot, family.servers = _fork_servers(ops.info.processes)
            store.shared.use_slot(slot)
            pyfuse3.fanfs_session_reset()
        else:
            _nonblocking_session(pyfuse3)
        if ops.info.fast_paths:
            pyfuse3.fanfs_set_fast_paths(True, True, store.shared.fast_counters())
        if slot == 0 and ops.info.filler:
            family.filler = _fork_filler(
                pyfuse3, store, ops.info.processes, push=config.prefetch_into == "kernel"
            )
        trio.run(_main, pyfuse3, ops, config, preload and slot == 0, slot == 0, cluster, family)
        _check_initialized(pyfuse3, ops, config)
    except FanfsError:
        raise
    except BaseException:
        log.critical(
            "mount of %s is going down after an unexpected error", config.mountpoint, exc_info=True
        )
        pyfuse3.close(unmount=False)
        if slot:
            os._exit(1)
        raise
    return slot, family


def _fork_filler(pyfuse3: Any, store: Any, slot: int, *, push: bool) -> int:
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


def _nonblocking_session(pyfuse3: Any) -> None:
    """With the fanfs pyfuse3 patch, make /dev/fuse non-blocking (several processes share
    it; a lost race is EAGAIN, not a stuck loop) and, from patch level 3, read queued
    requests without an epoll round trip each."""
    level = getattr(pyfuse3, "FANFS_PATCH_LEVEL", 0)
    if level < 2:
        return
    fd = pyfuse3.fanfs_session_fd()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    if level >= 3:
        pyfuse3.fanfs_set_eager_receive(True)


def _check_initialized(pyfuse3: Any, ops: Any, config: MountConfig) -> None:
    if not ops.initialized:
        pyfuse3.close(unmount=True)
        raise MountSetupError(
            "the kernel did not complete the mount of %s (FUSE INIT failed; see the log)"
            % config.mountpoint
        )


def _fork_servers(processes: int) -> tuple[int, list[int]]:
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


def _exit_text(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return (
        "was killed by %s" % signal.Signals(-code).name
        if code < 0
        else "exited with status %d" % code
    )


@dataclasses.dataclass(slots=True)
class _Family:
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


async def _watch_family(family: _Family, mountpoint: str) -> None:
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


async def _main(
    pyfuse3: Any,
    ops: Any,
    config: MountConfig,
    preload: bool,
    first: bool,
    cluster: Any,
    family: _Family,
) -> None:
    import trio

    store = ops.store
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_handle_signals, pyfuse3, cluster)
        if first and (family.servers or family.filler):
            nursery.start_soon(_watch_family, family, config.mountpoint)
        if cluster is not None:
            nursery.start_soon(cluster.run)
        if first:
            nursery.start_soon(_tune_read_ahead, config.mountpoint)
        if preload:
            nursery.start_soon(_preload, store)
        if config.prefetch:
            _start_prefetcher(nursery, pyfuse3, ops, config, first)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def _start_prefetcher(
    nursery: Any, pyfuse3: Any, ops: Any, config: MountConfig, first: bool
) -> None:
    """This process's prefetcher; the first process also fills the object cache in the
    background and serves the hint socket."""
    from fanfs.prefetch import Prefetcher

    # The first process of a cluster mount fills the object cache in a thread; a single-node
    # mount has a filler process (_fork_filler).
    prefetcher = Prefetcher(
        ops.store,
        memory=ops.info.prefetch_memory,
        into=config.prefetch_into,
        notify=pyfuse3.notify_store,
        fill=first and not ops.info.filler,
    )
    ops.prefetcher = prefetcher
    nursery.start_soon(prefetcher.run)
    if first:
        _start_hints(nursery, prefetcher, ops, config)


def _start_hints(nursery: Any, prefetcher: Any, ops: Any, config: MountConfig) -> None:
    """Bind the hint socket now, before the kernel's first request is answered: a client
    that sees the mount finds the socket."""
    from fanfs.hints import bind_hint_socket, serve_hints

    path = ops.info.hints
    try:
        listener = bind_hint_socket(path)
    except OSError as exc:
        log.warning("no hint socket at %s (%s); sampler hints are off", path, exc.strerror or exc)
        ops.info.hints = None
        return
    nursery.start_soon(serve_hints, listener, prefetcher, ops.index, config.mountpoint)


_EARLY_SIGNALS: list[int] = []


def _remember_signal(signum: int, frame: object) -> None:
    _EARLY_SIGNALS.append(signum)


async def _handle_signals(pyfuse3: Any, cluster: Any) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        # A signal that came before this receiver (during start-up, or while another
        # serving process already answered requests) was kept by _remember_signal.
        signum = _EARLY_SIGNALS[0] if _EARLY_SIGNALS else None
        if signum is None:
            async for received in signals:
                signum = received
                break
        if signum is None:
            return
        log.info("received %s, unmounting", signal.Signals(signum).name)
        if cluster is not None:
            cluster.shutdown()
        pyfuse3.terminate()


async def _preload(store: Any) -> None:
    import trio

    stop = threading.Event()
    try:
        loaded = await trio.to_thread.run_sync(store.preload, stop, abandon_on_cancel=True)
        log.info("preloaded %s of partitions into memory", format_size(loaded))
    except OSError as exc:
        log.warning("preloading partitions failed (%s); serving from the pack", exc)
    finally:
        stop.set()


async def _tune_read_ahead(mountpoint: str) -> None:
    import trio

    def tune() -> None:
        dev = os.stat(mountpoint).st_dev
        path = "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(dev), os.minor(dev))
        with open(path, "w") as f:
            f.write(str(READ_AHEAD_KB))

    try:
        await trio.to_thread.run_sync(tune, abandon_on_cancel=True)
    except OSError as exc:
        log.debug("cannot raise read-ahead of %s: %s", mountpoint, exc)
