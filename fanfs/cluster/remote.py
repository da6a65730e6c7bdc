"""`RemoteSource`: stored chunk bytes of partitions this node does not hold.

Runs on the trio thread. A fetch asks an owner through the MPI thread and waits with a
timeout; a slow, frozen or dead owner is marked down (logged once, retried with backoff) and
the fetch goes to the next replica, then to the pack on the shared filesystem (the durable
copy), and only then fails with `RemoteReadError` (EIO). Bytes come back compressed and are
decoded by the caller.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

import trio

from fanfs import shared as sh
from fanfs.errors import MountClosingError, PackFormatError, RemoteReadError
from fanfs.format.layout import open_pack_file, partition_name

log = logging.getLogger(__name__)

# Backoff for a peer that did not answer: first retry after this long, doubling to the max.
BACKOFF_MIN_S: Final = 1.0
BACKOFF_MAX_S: Final = 30.0


class _Pending:
    __slots__ = ("data", "dest", "done", "error")

    def __init__(self, dest: int) -> None:
        self.dest = dest
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: str | None = None


class RemoteSource:
    """Fetches stored bytes from owners. Trio thread only, except `deliver`."""

    def __init__(
        self,
        transport: Any,
        owners: Sequence[tuple[int, ...]],
        *,
        pack_path: str,
        timeout_s: float,
        shared: Any,
        io_limiter: trio.CapacityLimiter,
    ) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.owners = owners
        self.pack_path = pack_path
        self.timeout_s = timeout_s
        self.shared = shared  # counters via shared.counters: this process's row, after any fork
        self._limiter = io_limiter
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._down_until: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._pack_fds: dict[int, int] = {}
        self._pack_lock = threading.Lock()
        self._closing = False

    def attach(self) -> None:
        """Call on the trio thread before the MPI thread starts delivering."""
        self._token = trio.lowlevel.current_trio_token()

    def deliver(self, req_id: int, ok: bool, payload: Any) -> None:
        """MPI thread: hand a response to the trio thread without blocking."""
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._complete, req_id, ok, payload)

    def _complete(self, req_id: int, ok: bool, payload: Any) -> None:
        pending = self._pending.pop(req_id, None)
        if pending is None:
            return  # answered after its timeout: the waiter has moved on
        if ok:
            pending.data = payload
        else:
            pending.error = str(payload)
        pending.done.set()

    def close(self) -> None:
        """The mount is ending: fail every wait for a peer now instead of at its timeout
        (mpirun SIGKILLs ranks one second after SIGTERM)."""
        self._closing = True
        for pending in self._pending.values():
            pending.error = "the mount is shutting down"
            pending.done.set()
        self._pending.clear()

    async def fetch(self, partition: int, offset: int, length: int) -> bytes:
        """Stored bytes of one chunk of `partition`. Raises RemoteReadError."""
        if self._closing:
            raise MountClosingError("the mount is shutting down")
        for dest in self.owners[partition]:
            if dest == self.rank or self._down_until.get(dest, 0.0) > time.monotonic():
                continue
            data = await self._ask(dest, partition, offset, length)
            if data is not None:
                return data
        self.shared.counters[sh.PACK_FALLBACKS] += 1
        return await trio.to_thread.run_sync(
            self._read_pack, partition, offset, length, limiter=self._limiter
        )

    async def _ask(self, dest: int, partition: int, offset: int, length: int) -> bytes | None:
        req_id = next(self._ids)
        pending = self._pending[req_id] = _Pending(dest)
        self.shared.counters[sh.REMOTE_FETCHES] += 1
        self.transport.submit(dest, (req_id, partition, offset, length))
        with trio.move_on_after(self.timeout_s):
            await pending.done.wait()
        self._pending.pop(req_id, None)
        if pending.data is not None and len(pending.data) == length:
            self.shared.counters[sh.REMOTE_BYTES] += length
            self._peer_up(dest)
            return pending.data
        if self._closing:
            raise MountClosingError("the mount is shutting down")
        if pending.error is not None:
            log.warning("rank %d could not serve a request: %s", dest, pending.error)
        else:
            self.shared.counters[sh.REMOTE_TIMEOUTS] += 1
            self._peer_down(dest)
        return None

    def _peer_down(self, dest: int) -> None:
        if self._down_until.get(dest, 0.0) > time.monotonic():
            return  # another request of the same outage timed out: back off once per outage
        backoff = self._backoff.get(dest)
        if backoff is None:
            log.warning(
                "rank %d did not answer within %.1fs: marked down, reading around it "
                "(replicas, then the pack)",
                dest,
                self.timeout_s,
            )
            backoff = BACKOFF_MIN_S
        else:
            backoff = min(backoff * 2, BACKOFF_MAX_S)
        self._backoff[dest] = backoff
        self._down_until[dest] = time.monotonic() + backoff

    def _peer_up(self, dest: int) -> None:
        if self._backoff.pop(dest, None) is not None:
            self._down_until.pop(dest, None)
            log.warning("rank %d answers again", dest)

    def _read_pack(self, partition: int, offset: int, length: int) -> bytes:
        """Worker thread: read from the pack on the shared filesystem."""
        try:
            with self._pack_lock:
                fd = self._pack_fds.get(partition)
                if fd is None:  # a regular file, never through a symlink (security.md)
                    fd = open_pack_file(self.pack_path, partition_name(partition))
                    self._pack_fds[partition] = fd
            data = os.pread(fd, length, offset)
        except (OSError, PackFormatError) as exc:
            raise RemoteReadError(
                "no owner answered and the pack cannot be read: %s" % exc
            ) from exc
        if len(data) != length:
            raise RemoteReadError(
                "no owner answered and the pack is truncated (partition %d)" % partition
            )
        return data

    def peers_down(self) -> list[int]:
        now = time.monotonic()
        return sorted(rank for rank, until in self._down_until.items() if until > now)
