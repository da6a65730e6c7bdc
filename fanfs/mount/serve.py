"""`serve`: mount, serve until unmounted or signalled, unmount. Builds the store and the
FUSE operations, mounts, forks the serving family, and runs the trio loop that wires
signals, the family watch, the MPI thread, read-ahead tuning, preload, the prefetcher and
the hint socket.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any, Final

from fanfs._memory import available_memory, process_tree_memory
from fanfs.errors import FanfsError
from fanfs.format.reader import PackReader
from fanfs.mount.family import Family, fork_filler, fork_servers, serving_processes, watch_family
from fanfs.mount.kernel import check_initialized, mount_kernel, nonblocking_session, tune_read_ahead
from fanfs.mount.options import MountConfig, hints_socket_path
from fanfs.mount.preload import map_preloaded, reserve_preload, run_preload
from fanfs.mount.signals import enable_faulthandler, handle_signals, remember_signal
from fanfs.shared import SharedState

# The least read-ahead buffer a serving process gets by default (its share of the node's).
MIN_DEFAULT_PREFETCH: Final = 16 << 20

# The logger of the whole `fanfs mount` command, whichever module of it writes: the log says
# "fanfs.mount: mounted ...", as it always has.
log = logging.getLogger("fanfs.mount")


def serve(
    reader: PackReader, config: MountConfig, pyfuse3: Any, *, on_ready: Any, cluster: Any = None
) -> int:
    """Mount, serve until unmounted or signalled, unmount. Returns the exit status.

    With several serving processes, the first runs the INIT handshake alone, then forks the
    others; all of them then read requests from the same (non-blocking) /dev/fuse fd, and the
    kernel hands each request to whichever is free. The first process preloads, owns the
    unmount, and reaps the others; they die with it (PR_SET_PDEATHSIG).
    """
    enable_faulthandler(config)
    # Until trio's signal receiver runs (and between the handshake and the fork), a SIGTERM
    # or SIGINT is only remembered: raising KeyboardInterrupt inside trio.run's machinery
    # could leave a serving process hung instead of stopped.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, remember_signal)
    ops, store = build_operations(reader, config, pyfuse3, cluster)
    preload = reserve_preload(reader, config) > 0
    mount_kernel(pyfuse3, ops, config, cluster)
    # Ready means the kernel's INIT handshake is done (libfuse then calls ops.init()): a
    # mount the kernel refuses must fail here, not look mounted and hang its readers.
    ops.init_callbacks.append(on_ready)
    slot, family = serve_until_unmounted(pyfuse3, ops, store, config, cluster, preload)
    # A second Ctrl-C while unmounting must not turn a clean exit into a crash.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    store.write_decode_trace()
    if slot:
        pyfuse3.close(unmount=False)
        os._exit(0)
    pyfuse3.close(unmount=True)
    family.reap()
    stats = ops.statistics(process_tree_memory(os.getpid()))
    log.info("unmounted %s; statistics: %s", config.mountpoint, stats)
    return 0


def memory_budgets(config: MountConfig, processes: int) -> tuple[int, int]:
    """(object cache, prefetch memory per serving process) in bytes: the options, or
    defaults from the node's available memory (the read-ahead default is one node-wide
    budget shared by the `processes` serving processes, so more processes take no more)."""
    from fanfs.prefetch import default_cache_memory, default_memory

    available = available_memory() or 4 << 30
    cache = config.cache_memory if config.cache_memory >= 0 else default_cache_memory(available)
    if config.prefetch_memory:
        return cache, config.prefetch_memory
    return cache, max(MIN_DEFAULT_PREFETCH, default_memory(available) // processes)


def build_operations(
    reader: PackReader, config: MountConfig, pyfuse3: Any, cluster: Any
) -> tuple[Any, Any]:
    from fanfs.cache import MinioCache, make_cache
    from fanfs.operations import MountInfo, Operations
    from fanfs.store import ChunkStore

    processes = serving_processes(pyfuse3, config)
    chunks = reader.index.chunk_count
    cache_memory, prefetch_memory = memory_budgets(config, processes)
    objects = make_cache(config.cache_policy, cache_memory, chunks=chunks, processes=processes)
    # The background filler of a single-node mount is a process of its own, with its own row
    # of counters (cluster mounts fill in a thread: see fork_filler).
    filler = config.prefetch and cluster is None and isinstance(objects, MinioCache)
    rows = processes + (1 if filler else 0)
    bsizes = reader.index.arrays["bsize"]
    shared = SharedState(
        processes=rows,
        partitions=len(reader.partitions),
        chunks=chunks,
        solid_block_bytes=int(bsizes.max()) if len(bsizes) else 0,
    )
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
        hints=hints_socket_path(config.mountpoint, config.cache_dir) if config.prefetch else None,
    )
    ops = Operations(
        store, noopen=noopen, info=info, extra_stats=cluster.statistics if cluster else None
    )
    planned = _solid_plan_nodes(reader.manifest)
    if planned is not None:
        ranks = cluster.transport.size if cluster is not None else 1
        if config.prefetch_into != "kernel":
            log.warning(
                "this pack's plan counts each solid block decoded once an epoch, its other "
                "files pushed into the page cache; with --prefetch-into memory a shuffled "
                "epoch decodes a block for each file read"
            )
        elif ranks > planned:
            log.warning(
                "this pack's plan counts each solid block decoded once an epoch on %d node%s; "
                "on %d a shuffled epoch decodes it on each node that reads one of its files "
                "(pack with --nodes %d)",
                planned,
                "" if planned == 1 else "s",
                ranks,
                ranks,
            )
    return ops, store


def _solid_plan_nodes(manifest: dict[str, Any]) -> int | None:
    """The nodes a balanced plan with solid classes was made for (`fanfs pack --nodes`), from
    the manifest's informational `plan` (untrusted: anything malformed reads as no plan)."""
    plan = manifest.get("plan")
    if not isinstance(plan, dict) or plan.get("mode") != "balanced":
        return None
    classes = plan.get("classes")
    if not isinstance(classes, list):
        return None
    if not any(isinstance(row, dict) and row.get("solid") is True for row in classes):
        return None
    settings = plan.get("settings")
    nodes = settings.get("nodes", 1) if isinstance(settings, dict) else 1
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1 else 1


def serve_until_unmounted(
    pyfuse3: Any, ops: Any, store: Any, config: MountConfig, cluster: Any, preload: bool
) -> tuple[int, Family]:
    """Run the serving loop(s); returns this process's slot and, in the first, its children."""
    import trio

    slot, family = 0, Family()
    try:
        if ops.info.processes > 1:
            # Stop right inside INIT, before this loop can read (and, once terminating,
            # drop) any later request; the forked processes serve those.
            ops.init_callbacks.append(pyfuse3.terminate)
            trio.run(pyfuse3.main)
            check_initialized(pyfuse3, ops, config)
            ops.init_callbacks.clear()
            nonblocking_session(pyfuse3)
            slot, family.servers = fork_servers(ops.info.processes)
            store.shared.use_slot(slot)
            pyfuse3.fanfs_session_reset()
        else:
            nonblocking_session(pyfuse3)
        if ops.info.fast_paths:
            pyfuse3.fanfs_set_fast_paths(True, True, store.shared.fast_counters())
            # After the INIT-only loop and the fork: a loop that stops inside INIT must not
            # leave requests read in its idle wait and never served.
            if getattr(pyfuse3, "FANFS_PATCH_LEVEL", 0) >= 6:
                pyfuse3.fanfs_set_idle_wait(True)
        if slot == 0 and ops.info.filler:
            family.filler = fork_filler(
                pyfuse3, store, ops.info.processes, push=config.prefetch_into == "kernel"
            )
        trio.run(_main, pyfuse3, ops, config, preload, slot == 0, cluster, family)
        check_initialized(pyfuse3, ops, config)
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


async def _main(
    pyfuse3: Any,
    ops: Any,
    config: MountConfig,
    preload: bool,
    first: bool,
    cluster: Any,
    family: Family,
) -> None:
    import trio

    store = ops.store
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle_signals, pyfuse3, cluster)
        if first and (family.servers or family.filler):
            nursery.start_soon(watch_family, family, config.mountpoint)
        if cluster is not None:
            nursery.start_soon(cluster.run)
        if first:
            nursery.start_soon(tune_read_ahead, config.mountpoint)
        if preload:
            # The first process copies the partitions in; the others map each copy once
            # it is complete (a forked process has none of a shared mapping's pages mapped).
            nursery.start_soon(run_preload if first else map_preloaded, store)
        if config.prefetch:
            _start_prefetcher(nursery, pyfuse3, ops, config, first)
        elif config.prefetch_into == "kernel" and ops.store.index.arrays["bsize"].any():
            _start_mates_pusher(nursery, pyfuse3, ops)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def _start_prefetcher(
    nursery: Any, pyfuse3: Any, ops: Any, config: MountConfig, first: bool
) -> None:
    """This process's prefetcher; the first process also fills the object cache in the
    background and serves the hint socket."""
    from fanfs.prefetch import Prefetcher

    # The first process of a cluster mount fills the object cache in a thread; a single-node
    # mount has a filler process (fork_filler).
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


def _start_mates_pusher(nursery: Any, pyfuse3: Any, ops: Any) -> None:
    """With --prefetch off, a pack with solid blocks still has a decoded block's other files
    pushed into the page cache (no read-ahead, no fill, no hints): without it a shuffled
    epoch decodes a block for nearly every file read (2.2-4.8x the default pack's decode
    on the real dataset, whose balanced plan counts each block decoded once)."""
    from fanfs.prefetch import Prefetcher

    pusher = Prefetcher(
        ops.store,
        memory=ops.info.prefetch_memory,
        into="kernel",
        notify=pyfuse3.notify_store,
        workers=1,
        read_ahead=False,
    )
    ops.prefetcher = pusher
    nursery.start_soon(pusher.run)


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
