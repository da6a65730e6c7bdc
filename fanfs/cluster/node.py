"""One node of a cluster mount: MPI start-up, staging, then the ordinary mount with remote reads.

Every rank runs `cluster_start` (under mpirun/srun, in the foreground). Start-up failures
are agreed on collectively, so one rank's bad mountpoint stops every rank with its message
instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import trio

from fanfs.cluster.remote import RemoteSource
from fanfs.cluster.staging import StageResult, _agree, stage
from fanfs.errors import FanfsError, MountSetupError
from fanfs.format.reader import PackReader
from fanfs.mountinfo import check_mountpoint
from fanfs.runtime import check_writable_by_owner_only

log = logging.getLogger(__name__)


class ClusterNode:
    """The cluster parts a mount of one rank needs; handed to `mount.serve`."""

    def __init__(self, transport: Any, staged: StageResult, config: Any) -> None:
        self.transport = transport
        self.staged = staged
        self.config = config
        self.remote: RemoteSource | None = None
        self.reader: PackReader | None = None

    def make_remote(self, shared: Any, limiter: trio.CapacityLimiter) -> RemoteSource:
        self.remote = RemoteSource(
            self.transport,
            self.staged.owners,
            pack_path=self.config.pack,
            timeout_s=self.config.remote_timeout_s,
            shared=shared,
            io_limiter=limiter,
        )
        return self.remote

    def before_serving(self, error: FanfsError | None) -> None:
        """Collective: every rank has mounted once this returns (so `fanfs wait` on any node
        means all), or every rank raises the first rank's mount failure."""
        _agree(self.transport, error)

    async def run(self) -> None:
        """Start the MPI thread; stop it when cancelled (the mount is ending)."""
        assert self.remote is not None and self.reader is not None
        self.remote.attach()
        self.transport.start(self.reader.read_range, self.remote.deliver)
        try:
            await trio.sleep_forever()
        finally:
            self.transport.stop()

    def shutdown(self) -> None:
        """Called on SIGTERM/SIGINT: no reader may keep the unmount waiting for a peer."""
        if self.remote is not None:
            self.remote.close()

    def statistics(self) -> dict[str, Any]:
        stats: dict[str, Any] = {
            "rank": self.transport.rank,
            "ranks": self.transport.size,
            "local_partitions": sorted(self.staged.local),
            "staged_bytes_from_pack": self.staged.shared_fs_bytes,
            "stage_seconds": round(self.staged.stage_s, 3),
        }
        stats.update(self.transport.statistics())
        if self.remote is not None:
            stats["peers_down"] = self.remote.peers_down()
        return stats


def expand_rank(path: str | None, rank: int) -> str | None:
    """`{rank}` in a path becomes the rank (one machine, several ranks: own dirs each)."""
    return None if path is None else path.replace("{rank}", str(rank))


def cluster_start(config: Any) -> ClusterNode:
    """Collective: MPI start-up, agreed checks, staging, the pack opened on every rank.
    Returns this rank's node, ready for `mount.serve`."""
    from fanfs.cluster.transport import Transport

    transport = Transport(config.coalesce_window_s)
    log.info("rank %d of %d on %s", transport.rank, transport.size, socket.gethostname())
    error: FanfsError | None = None
    try:
        check_mountpoint(config.mountpoint)
        if not config.cache_dir:
            raise MountSetupError(
                "cluster mode needs --cache-dir (node-local storage for this node's share)"
            )
        os.makedirs(config.cache_dir, mode=0o700, exist_ok=True)
        check_writable_by_owner_only(config.cache_dir, "--cache-dir")
    except FanfsError as exc:
        error = exc
    except OSError as exc:
        error = MountSetupError("cannot use --cache-dir %s: %s" % (config.cache_dir, exc.strerror))
    _agree(transport, error)
    staged = stage(
        transport,
        pack=config.pack,
        cache_dir=config.cache_dir or "",
        replicas=config.replicas,
        groups=config.stage_groups,
        copy=config.stage != "none",
    )
    node = ClusterNode(transport, staged, config)
    try:
        node.reader = PackReader(staged.data_dir, local=staged.local)
    except FanfsError as exc:
        error = exc
    _agree(transport, error)
    assert node.reader is not None
    return node
