"""`fanfs mount PACK MOUNTPOINT`: single node (checks, then serve in the foreground or as a
daemon) or one rank of a cluster mount (MPI start-up and staging by `cluster_start`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Iterator

from fanfs.cluster.topology import detect_launch
from fanfs.format.reader import PackReader
from fanfs.logsetup import setup_logging
from fanfs.mount.daemon import daemonize
from fanfs.mount.kernel import import_pyfuse3
from fanfs.mount.options import MountConfig, config_from_args, default_logfile
from fanfs.mount.serve import serve
from fanfs.mountinfo import check_mountpoint

# The logger of the whole `fanfs mount` command, whichever module of it writes: the log says
# "fanfs.mount: mounted ...", as it always has.
log = logging.getLogger("fanfs.mount")


def mount_from_args(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    launch = detect_launch()
    if config.cluster or (config.cluster is None and launch is not None and launch[1] > 1):
        return _cluster_from_config(config, launch[0] if launch else 0)
    check_mountpoint(config.mountpoint)
    with _serving_modules_imported():
        reader = PackReader(config.pack)
    pyfuse3 = import_pyfuse3()
    if config.foreground:
        setup_logging(debug=config.debug, logfile=config.logfile)
        return serve(reader, config, pyfuse3, on_ready=lambda: None)
    logfile = config.logfile or default_logfile(config.mountpoint)
    return daemonize(reader, config, pyfuse3, logfile)


@contextlib.contextmanager
def _serving_modules_imported() -> Iterator[None]:
    """Import what serving needs (pyfuse3, trio, the FUSE operations, the prefetcher: a few
    tenths of a second from a cold page cache) in a thread, while the body reads and checks
    the index, which mostly waits for the disk or runs numpy without the GIL. Joined before
    the body's outcome is known: the daemon forks next, and no thread may be running then. A
    failed import is left for `import_pyfuse3` (after the pack's checks, as before) to report."""

    def run() -> None:
        with contextlib.suppress(ImportError):
            import fanfs.cache
            import fanfs.hints
            import fanfs.operations  # noqa: F401

    thread = threading.Thread(target=run, name="fanfs-imports", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


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
    pyfuse3 = import_pyfuse3()
    node = cluster_start(config)
    assert node.reader is not None
    return serve(node.reader, config, pyfuse3, on_ready=lambda: None, cluster=node)
