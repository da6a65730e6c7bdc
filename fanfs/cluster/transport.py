"""The only module that imports mpi4py: start-up collectives and the MPI thread.

Importing mpi4py initialises MPI, so this module is imported only in cluster mode. Before
the mount serves, the main thread uses the collectives (broadcast of the index, barriers,
gathers). After that every MPI call happens in one dedicated thread, `Transport._run`:
it sends coalesced request batches (one message per owner per window), answers peers'
requests from this node's partitions, and hands responses to the trio side through
`deliver`, a callback that must be thread-safe and must not block (trio's
`TrioToken.run_sync_soon`). Nothing here ever waits without a bound: receives are
non-blocking (improbe + irecv), sends are isends tested later, and errors towards a dead
peer fail the requests instead of aborting the job (MPI.ERRORS_RETURN).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from fanfs.errors import ClusterInitError

log = logging.getLogger(__name__)

try:
    import mpi4py

    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ClusterInitError("mpi4py is not installed (%s); run tools/setup.sh" % exc) from exc

TAG_REQUEST: Final = 11
TAG_RESPONSE: Final = 12
# Broadcasts of large blobs go in pieces this large (MPI counts are 32-bit ints).
BCAST_PIECE: Final = 64 * 1024 * 1024
# A batch is sent when its oldest request is this old or it asks for this many bytes.
BATCH_MAX_BYTES: Final = 4 * 1024 * 1024
# Polling of the MPI thread (MPI has no fd to wait on): every POLL_MIN_S while messages
# moved in the last HOT_S (a remote fetch then costs tens of microseconds of polling, not
# milliseconds), backing off to POLL_MAX_S when the node is idle (1000 wake-ups a second).
POLL_MIN_S: Final = 0.00005
HOT_S: Final = 0.05
POLL_MAX_S: Final = 0.001

# (request id, partition, offset, length)
Request = tuple[int, int, int, int]
# deliver(request id, ok, payload: bytes if ok else an error message)
Deliver = Callable[[int, bool, Any], None]
# serve(partition, offset, length) -> stored bytes; raises OSError/KeyError if not here
Serve = Callable[[int, int, int], bytes]


class Transport:
    """MPI for one rank. Collectives from the main thread before `start()`; afterwards only
    `submit()` (any thread) and `statistics()`."""

    def __init__(self, coalesce_window_s: float) -> None:
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise ClusterInitError(
                "the MPI library gives no thread support (need MPI_THREAD_SERIALIZED)"
            )
        self.comm = MPI.COMM_WORLD
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self.window_s = coalesce_window_s
        self._outbox: collections.deque[tuple[float, int, Request]] = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counters = collections.Counter[str]()

    # -- start-up collectives (main thread) ------------------------------------------------

    def bcast_blob(self, data: bytes | None, root: int = 0) -> bytes:
        """Broadcast a byte string of any size from `root`."""
        length = self.comm.bcast(len(data) if data is not None else 0, root=root)
        buf = bytearray(length) if data is None or self.rank != root else bytearray(data)
        for start in range(0, length, BCAST_PIECE):
            piece = memoryview(buf)[start : start + BCAST_PIECE]
            self.comm.Bcast([piece, MPI.BYTE], root=root)
        return bytes(buf)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        return self.comm.gather(obj, root=root)

    def barrier(self) -> None:
        self.comm.Barrier()

    # -- the MPI thread ---------------------------------------------------------------------

    def start(self, serve: Serve, deliver: Deliver) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(serve, deliver), name="fanfs-mpi", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def submit(self, dest: int, request: Request) -> None:
        """Queue a request for `dest` (thread-safe, never blocks)."""
        self._outbox.append((time.monotonic(), dest, request))
        self._wake.set()

    def statistics(self) -> dict[str, int]:
        return dict(self.counters)

    def _run(self, serve: Serve, deliver: Deliver) -> None:
        sends: list[Any] = []
        recvs: list[tuple[int, int, Any]] = []
        idle = POLL_MIN_S
        last_activity = 0.0
        while not self._stop.is_set():
            busy = self._flush_outbox(sends, deliver)
            busy |= self._poll_incoming(recvs)
            busy |= self._finish_receives(recvs, sends, serve, deliver)
            sends[:] = [req for req in sends if not _test(req)]
            now = time.monotonic()
            if busy or recvs:
                last_activity = now
                idle = POLL_MIN_S
                continue
            if now - last_activity < HOT_S:
                idle = POLL_MIN_S
            wait = idle
            if self._outbox:  # a batch is filling: wake when its window closes
                wait = min(wait, max(0.0, self._outbox[0][0] + self.window_s - time.monotonic()))
            self._wake.wait(wait)
            self._wake.clear()
            idle = min(idle * 2, POLL_MAX_S)

    def _flush_outbox(self, sends: list[Any], deliver: Deliver) -> bool:
        outbox = self._outbox
        if not outbox:
            return False
        oldest = outbox[0][0]
        queued = sum(item[2][3] for item in outbox)
        if time.monotonic() - oldest < self.window_s and queued < BATCH_MAX_BYTES:
            return False
        batches: dict[int, list[Request]] = collections.defaultdict(list)
        while outbox:
            _, dest, request = outbox.popleft()
            batches[dest].append(request)
        for dest, batch in batches.items():
            try:
                sends.append(self.comm.isend(batch, dest=dest, tag=TAG_REQUEST))
            except MPI.Exception as exc:
                for request in batch:
                    deliver(request[0], False, "send to rank %d failed: %s" % (dest, exc))
                continue
            self.counters["messages_sent"] += 1
            self.counters["requests_sent"] += len(batch)
        return True

    def _poll_incoming(self, recvs: list[tuple[int, int, Any]]) -> bool:
        status = MPI.Status()
        found = False
        while True:
            message = self.comm.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
            if message is None:
                return found
            recvs.append((status.Get_source(), status.Get_tag(), message.irecv()))
            found = True

    def _finish_receives(
        self, recvs: list[tuple[int, int, Any]], sends: list[Any], serve: Serve, deliver: Deliver
    ) -> bool:
        done = False
        for item in list(recvs):
            source, tag, request = item
            complete, payload = request.test()
            if not complete:
                continue
            recvs.remove(item)
            done = True
            self.counters["messages_received"] += 1
            if tag == TAG_REQUEST:
                sends.append(self._answer(source, payload, serve))
            elif tag == TAG_RESPONSE:
                for req_id, ok, data in payload:
                    if ok:
                        self.counters["bytes_received"] += len(data)
                    deliver(req_id, ok, data)
        return done

    def _answer(self, source: int, batch: list[Request], serve: Serve) -> Any:
        replies: list[tuple[int, bool, bytes | str]] = []
        for req_id, partition, offset, length in batch:
            try:
                data = serve(partition, offset, length)
                replies.append((req_id, True, data))
                self.counters["bytes_served"] += len(data)
            except (OSError, KeyError, ValueError) as exc:
                replies.append(
                    (
                        req_id,
                        False,
                        "rank %d cannot serve partition %d: %s" % (self.rank, partition, exc),
                    )
                )
        self.counters["requests_served"] += len(batch)
        try:
            return self.comm.isend(replies, dest=source, tag=TAG_RESPONSE)
        except MPI.Exception:
            return None


def _test(request: Any) -> bool:
    if request is None:
        return True
    try:
        return bool(request.Test())
    except MPI.Exception:
        return True
