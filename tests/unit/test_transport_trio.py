"""`Transport` (the MPI thread and the start-up collectives) without mpirun or an MPI
library: the module is loaded against a scripted stand-in for mpi4py, and the ranks of one
job are Transports in this process, joined by an in-memory wire that pickles every message
as mpi4py does. Covered: a batch of requests coalesced into one message per owner and
answered in one message; a refusal; a send to a dead peer failing its requests while the
thread keeps serving; the byte bound flushing a batch before its window; a receive that
completes late; a silent peer and stop(); broadcasts of blobs in pieces, gather and bcast;
and RemoteSource fetching through two Transports under trio (the middle layer of issue 13).
"""

from __future__ import annotations

import collections
import importlib.util
import pickle
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fanfs.cluster.remote import RemoteSource
from fanfs.shared import SharedState

TRANSPORT_PY = Path(__file__).resolve().parents[2] / "fanfs" / "cluster" / "transport.py"
WAIT_S = 5.0  # bound on every wait for the MPI thread; a pass takes milliseconds


class FakeMPIError(Exception):
    """mpi4py's MPI.Exception: what a call on a broken communicator raises."""


class FakeStatus:
    def __init__(self) -> None:
        self.source = self.tag = -1

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag


class FakeRequest:
    """A send or receive handle; complete after `delay` polls."""

    def __init__(self, payload: Any = None, delay: int = 0) -> None:
        self.payload, self.delay = payload, delay

    def test(self) -> tuple[bool, Any]:
        if self.delay > 0:
            self.delay -= 1
            return False, None
        return True, self.payload

    def Test(self) -> bool:
        return self.test()[0]


class FakeMessage:
    def __init__(self, payload: Any, delay: int) -> None:
        self.payload, self.delay = payload, delay

    def irecv(self) -> FakeRequest:
        return FakeRequest(self.payload, self.delay)


def fake_mpi() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        THREAD_SERIALIZED=2,
        THREAD_MULTIPLE=3,
        Query_thread=lambda: 3,
        ERRORS_RETURN="errors-return",
        BYTE="byte",
        ANY_SOURCE=-1,
        ANY_TAG=-1,
        Exception=FakeMPIError,
        Status=FakeStatus,
        COMM_WORLD=None,
    )


class World:
    """The wire between the ranks of one job: an inbox per rank, messages pickled on send
    (as mpi4py's lowercase calls do); collectives meet in numbered rounds."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Condition()
        self.inbox: list[collections.deque[tuple[int, int, Any]]] = [
            collections.deque() for _ in range(size)
        ]
        self.dead: set[int] = set()  # isend to these raises, as towards a dead peer
        self.recv_delay = 0  # polls before a receive completes
        self.sent: list[tuple[int, int, int, Any]] = []  # (source, dest, tag, message)
        self.rounds: dict[int, dict[int, Any]] = collections.defaultdict(dict)

    def comm(self, rank: int) -> FakeComm:
        return FakeComm(self, rank)


class FakeComm:
    """The calls of mpi4py's Comm that transport.py makes, for one rank of a `World`."""

    def __init__(self, world: World, rank: int) -> None:
        self.world, self.rank = world, rank
        self.round = 0

    def Set_errhandler(self, handler: object) -> None:
        pass

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.world.size

    # point to point, from the MPI threads
    def isend(self, obj: Any, dest: int, tag: int) -> FakeRequest:
        world = self.world
        with world.lock:
            if dest in world.dead:
                raise FakeMPIError("MPI_ERR_PROC_FAILED: rank %d is gone" % dest)
            world.sent.append((self.rank, dest, tag, obj))
            world.inbox[dest].append((self.rank, tag, pickle.dumps(obj)))
        return FakeRequest()

    def improbe(self, source: int, tag: int, status: FakeStatus) -> FakeMessage | None:
        assert (source, tag) == (-1, -1)
        with self.world.lock:
            if not self.world.inbox[self.rank]:
                return None
            status.source, status.tag, data = self.world.inbox[self.rank].popleft()
            return FakeMessage(pickle.loads(data), self.world.recv_delay)

    # collectives, from the main thread of each rank: every rank's n-th call meets the
    # others' n-th call
    def _meet(self, value: Any) -> dict[int, Any]:
        world, number = self.world, self.round
        self.round += 1
        with world.lock:
            world.rounds[number][self.rank] = value
            world.lock.notify_all()
            assert world.lock.wait_for(lambda: len(world.rounds[number]) == world.size, WAIT_S)
            return dict(world.rounds[number])

    def bcast(self, obj: Any, root: int) -> Any:
        return pickle.loads(pickle.dumps(self._meet(obj)[root]))

    def Bcast(self, spec: list[Any], root: int) -> None:
        buf, datatype = spec
        assert datatype == "byte"
        buf[:] = self._meet(bytes(buf))[root]

    def gather(self, obj: Any, root: int) -> list[Any] | None:
        met = self._meet(obj)
        return [met[r] for r in range(self.world.size)] if self.rank == root else None

    def Barrier(self) -> None:
        self._meet(None)


@pytest.fixture(scope="module")
def transport_module() -> Iterator[types.ModuleType]:
    """fanfs/cluster/transport.py loaded against the stand-in (under its own name: the real
    module and mpi4py stay as they were)."""
    mpi4py = types.ModuleType("mpi4py")
    mpi4py.rc = types.SimpleNamespace(thread_level="single")
    mpi4py.MPI = fake_mpi()
    saved = {name: sys.modules.get(name) for name in ("mpi4py", "mpi4py.MPI")}
    sys.modules["mpi4py"], sys.modules["mpi4py.MPI"] = mpi4py, mpi4py.MPI
    try:
        spec = importlib.util.spec_from_file_location("fanfs_transport_under_test", TRANSPORT_PY)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    assert mpi4py.rc.thread_level == "multiple"  # asked of MPI before it initialises
    yield module


class Answers:
    """A deliver callback that records what arrives (from the MPI thread)."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[bool, Any]] = {}
        self.cond = threading.Condition()

    def __call__(self, req_id: int, ok: bool, payload: Any) -> None:
        with self.cond:
            self.got[req_id] = (ok, payload)
            self.cond.notify_all()

    def wait(self, count: int) -> dict[int, tuple[bool, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) >= count, WAIT_S), self.got
            return dict(self.got)


def stored(partition: int, offset: int, length: int) -> bytes:
    """What a rank serving `partition` holds (partitions 0-9; anything else is not here)."""
    if partition >= 10:
        raise KeyError(partition)
    return bytes((partition + offset + i) % 251 for i in range(length))


def refuse(partition: int, offset: int, length: int) -> bytes:
    raise OSError(5, "Input/output error")


@pytest.fixture
def job(transport_module: types.ModuleType) -> Iterator[Callable[..., tuple[World, list, Answers]]]:
    """`job(size, window_s=0.0, serve=stored, running=all)`: the ranks of one job, the
    ranks in `running` started (serving with `serve`; rank 0's answers recorded in the
    Answers returned); every rank is stopped at the end, and its thread must be gone."""
    ranks: list[Any] = []

    def start(
        size: int,
        window_s: float = 0.0,
        serve: Callable[[int, int, int], bytes] = stored,
        running: tuple[int, ...] | None = None,
    ) -> tuple[World, list, Answers]:
        world, answers = World(size), Answers()
        transport_module.MPI.COMM_WORLD = world.comm(0)
        mine = []
        for rank in range(size):
            transport = transport_module.Transport(window_s)
            transport.comm, transport.rank = world.comm(rank), rank
            mine.append(transport)
            if running is None or rank in running:
                transport.start(serve, answers if rank == 0 else Answers())
        ranks.extend(mine)
        return world, mine, answers

    yield start
    for transport in ranks:
        transport.stop()
        assert transport._thread is None or not transport._thread.is_alive()


def test_a_window_of_requests_is_one_message_each_way(
    transport_module: types.ModuleType, job: Callable[..., Any]
) -> None:
    world, (asker, owner), answers = job(2, window_s=0.05)
    for req_id in range(5):
        asker.submit(1, (req_id, 3, req_id * 100, 100))
    got = answers.wait(5)
    assert got == {i: (True, stored(3, i * 100, 100)) for i in range(5)}
    assert [(s, d, t, len(m)) for s, d, t, m in world.sent] == [
        (0, 1, transport_module.TAG_REQUEST, 5),
        (1, 0, transport_module.TAG_RESPONSE, 5),
    ]
    assert asker.statistics() == {
        "messages_sent": 1,
        "requests_sent": 5,
        "messages_received": 1,
        "bytes_received": 500,
    }
    assert owner.statistics() == {
        "messages_received": 1,
        "requests_served": 5,
        "bytes_served": 500,
    }


def test_requests_for_two_owners_go_in_one_message_per_owner(job: Callable[..., Any]) -> None:
    world, ranks, answers = job(3, window_s=0.05)
    for req_id, dest in enumerate([1, 2, 1, 2, 1]):
        ranks[0].submit(dest, (req_id, req_id, 0, 10))
    assert answers.wait(5) == {i: (True, stored(i, 0, 10)) for i in range(5)}
    requests = [(d, [r[0] for r in m]) for s, d, t, m in world.sent if s == 0]
    assert sorted(requests) == [(1, [0, 2, 4]), (2, [1, 3])]


def test_a_refusal_is_an_answer_naming_the_rank_and_partition(job: Callable[..., Any]) -> None:
    _, (asker, owner), answers = job(2, serve=refuse)
    asker.submit(1, (7, 4, 0, 10))
    assert answers.wait(1) == {
        7: (False, "rank 1 cannot serve partition 4: [Errno 5] Input/output error")
    }
    assert owner.statistics()["requests_served"] == 1
    assert "bytes_served" not in owner.statistics()


def test_a_partition_not_held_is_refused(job: Callable[..., Any]) -> None:
    _, (asker, _), answers = job(2)
    asker.submit(1, (1, 12, 0, 10))
    asker.submit(1, (2, 2, 0, 10))
    assert answers.wait(2) == {
        1: (False, "rank 1 cannot serve partition 12: 12"),
        2: (True, stored(2, 0, 10)),
    }


def test_a_send_to_a_dead_peer_fails_its_requests_and_the_thread_serves_on(
    job: Callable[..., Any],
) -> None:
    world, ranks, answers = job(3, running=(0, 1))
    world.dead.add(2)
    ranks[0].submit(2, (1, 0, 0, 10))
    assert answers.wait(1) == {
        1: (False, "send to rank 2 failed: MPI_ERR_PROC_FAILED: rank 2 is gone")
    }
    ranks[0].submit(1, (2, 0, 0, 10))
    assert answers.wait(2)[2] == (True, stored(0, 0, 10))
    assert ranks[0].statistics()["requests_sent"] == 1  # the failed batch is not counted


def test_a_batch_of_enough_bytes_leaves_before_its_window(
    transport_module: types.ModuleType, job: Callable[..., Any]
) -> None:
    _, (asker, _), answers = job(2, window_s=60.0, serve=lambda p, o, n: b"x")
    half = transport_module.BATCH_MAX_BYTES // 2
    asker.submit(1, (1, 0, 0, half))
    time.sleep(0.05)
    assert answers.got == {}  # waits for its window (a minute) or more bytes
    start = time.monotonic()
    asker.submit(1, (2, 0, half, half))
    assert answers.wait(2) == {1: (True, b"x"), 2: (True, b"x")}
    assert time.monotonic() - start < 1.0
    assert asker.statistics()["messages_sent"] == 1


def test_a_receive_that_completes_late_is_delivered(job: Callable[..., Any]) -> None:
    world, (asker, _), answers = job(2)
    world.recv_delay = 20  # polls of the request before its data is there
    asker.submit(1, (9, 1, 5, 20))
    assert answers.wait(1) == {9: (True, stored(1, 5, 20))}


def test_a_silent_peer_gets_no_answer_and_stop_is_bounded(job: Callable[..., Any]) -> None:
    _, (asker, _), answers = job(2, running=(0,))  # rank 1's thread never runs
    asker.submit(1, (1, 0, 0, 10))
    time.sleep(0.1)
    assert answers.got == {}
    start = time.monotonic()
    asker.stop()
    assert time.monotonic() - start < 1.0
    assert asker._thread is not None and not asker._thread.is_alive()


def test_collectives_across_ranks(
    transport_module: types.ModuleType, job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A blob larger than a piece goes in several Bcasts; every rank gets it whole.
    monkeypatch.setattr(transport_module, "BCAST_PIECE", 1000)
    _, ranks, _ = job(3, running=())  # collectives come before the MPI thread
    blob = bytes(range(256)) * 10  # 2560 bytes: 3 pieces
    results: dict[int, Any] = {}

    def rank_main(transport: Any) -> None:
        mine = transport.bcast_blob(blob if transport.rank == 1 else None, root=1)
        told = transport.bcast({"from": transport.rank}, root=0)
        gathered = transport.gather(transport.rank * 10, root=0)
        transport.barrier()
        results[transport.rank] = (mine, told, gathered)

    threads = [threading.Thread(target=rank_main, args=(t,)) for t in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert results == {
        0: (blob, {"from": 0}, [0, 10, 20]),
        1: (blob, {"from": 0}, None),
        2: (blob, {"from": 0}, None),
    }


def test_remote_source_fetches_through_two_transports_under_trio(
    job: Callable[..., Any], tmp_path: Path
) -> None:
    """The whole remote read path but the wire: trio fetch, rank 0's MPI thread, rank 1's
    thread serving from its partitions, the answer back through deliver into trio."""
    _, (asker, owner), _ = job(2, window_s=0.001, running=(1,))
    source = RemoteSource(
        asker,
        [(0,), (1,), (1,)],  # partitions 1 and 2 live on rank 1
        pack_path=str(tmp_path),  # empty: a fallback to the pack would fail loudly
        timeout_s=WAIT_S,
        shared=SharedState(processes=1, partitions=3, chunks=1),
        io_limiter=trio.CapacityLimiter(2),
    )

    async def main() -> list[bytes]:
        source.attach()
        asker.start(refuse, source.deliver)
        got: list[bytes] = [b""] * 6
        async with trio.open_nursery() as nursery:
            for n in range(6):

                async def fetch(n: int = n) -> None:
                    got[n] = await source.fetch(1 + n % 2, n * 1000, 1000)

                nursery.start_soon(fetch)
        return got

    assert trio.run(main) == [stored(1 + n % 2, n * 1000, 1000) for n in range(6)]
    totals = source.shared.totals()
    assert (totals["remote_fetches"], totals["remote_bytes"], totals["remote_timeouts"]) == (
        6,
        6000,
        0,
    )
    assert owner.statistics()["requests_served"] == 6
