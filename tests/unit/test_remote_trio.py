"""`RemoteSource` under trio with a scripted transport instead of MPI (the middle layer of
issue 13): an owner that answers, one that is silent (marked down, read around, retried
after its backoff), one that refuses, every owner silent (the pack on the shared
filesystem), a late answer, and an unmount while a fetch waits."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from fanfs.cluster import remote as remote_module
from fanfs.cluster.remote import RemoteSource
from fanfs.errors import MountClosingError, RemoteReadError
from fanfs.format.layout import partition_name
from fanfs.shared import SharedState

TIMEOUT_S = 0.2
PARTITION = 1
STORED = bytes(range(256)) * 64  # what the owner (and the pack) hold at offset 0


class ScriptedTransport:
    """Stands in for `Transport`: each request is answered from another thread (as the MPI
    thread does) according to `behaviour[dest]`: "answer", "refuse" or "silent"."""

    rank = 0

    def __init__(self, behaviour: dict[int, str]) -> None:
        self.behaviour = behaviour
        self.asked: list[int] = []
        self.deliver: Callable[[int, bool, object], None] | None = None

    def submit(self, dest: int, request: tuple[int, int, int, int]) -> None:
        self.asked.append(dest)
        req_id, partition, offset, length = request
        what = self.behaviour[dest]
        if what == "silent":
            return
        assert self.deliver is not None
        if what == "answer":
            args: tuple[int, bool, object] = (req_id, True, STORED[offset : offset + length])
        else:
            args = (req_id, False, "rank %d cannot serve partition %d: gone" % (dest, partition))
        threading.Thread(target=self.deliver, args=args).start()


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    """A directory standing for the pack on the shared filesystem (only partition 1)."""
    (tmp_path / partition_name(PARTITION)).write_bytes(STORED)
    return tmp_path


def make_source(
    pack: Path, behaviour: dict[int, str], timeout_s: float = TIMEOUT_S
) -> tuple[RemoteSource, ScriptedTransport]:
    transport = ScriptedTransport(behaviour)
    owners = [(0,), tuple(behaviour)]  # partition 1 lives on the scripted ranks, in order
    shared = SharedState(processes=1, partitions=2, chunks=1)
    source = RemoteSource(
        transport,
        owners,
        pack_path=str(pack),
        timeout_s=timeout_s,
        shared=shared,
        io_limiter=trio.CapacityLimiter(2),
    )
    transport.deliver = source.deliver
    return source, transport


def run(source: RemoteSource, fn: Callable[[], object]) -> object:
    async def main() -> object:
        source.attach()
        return await fn()  # type: ignore[misc]

    return trio.run(main)


def counters(source: RemoteSource) -> dict[str, int]:
    return source.shared.totals()


def test_an_owner_that_answers(pack: Path) -> None:
    source, transport = make_source(pack, {1: "answer"})
    data = run(source, lambda: source.fetch(PARTITION, 100, 1000))
    assert data == STORED[100:1100]
    assert transport.asked == [1]
    got = counters(source)
    assert (got["remote_fetches"], got["remote_bytes"], got["remote_timeouts"]) == (1, 1000, 0)


def test_a_silent_owner_is_marked_down_and_read_around(
    pack: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging.getLogger("fanfs"), "propagate", True)
    source, transport = make_source(pack, {1: "silent", 2: "answer"})

    async def twice() -> list[bytes]:
        first = await source.fetch(PARTITION, 0, 64)
        second = await source.fetch(PARTITION, 64, 64)  # rank 1 is skipped while down
        return [first, second]

    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="fanfs"):
        assert run(source, twice) == [STORED[:64], STORED[64:128]]
    assert time.monotonic() - start < TIMEOUT_S * 3  # one timeout, not two
    assert transport.asked == [1, 2, 2]
    assert source.peers_down() == [1]
    assert counters(source)["remote_timeouts"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        "rank 1 did not answer within 0.2s: marked down, reading around it (replicas, then the pack)"
    ]


def test_a_down_owner_is_asked_again_after_its_backoff(
    pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_module, "BACKOFF_MIN_S", 1.0)
    source, transport = make_source(pack, {1: "silent", 2: "answer"})

    async def across_the_backoff() -> None:
        await source.fetch(PARTITION, 0, 8)  # rank 1 times out, marked down for 1 s
        transport.behaviour[1] = "answer"
        await source.fetch(PARTITION, 0, 8)  # skipped
        await trio.sleep(1.05)
        await source.fetch(PARTITION, 0, 8)  # asked again, answers: up

    run(source, across_the_backoff)
    assert transport.asked == [1, 2, 2, 1]
    assert source.peers_down() == []


def test_a_refusing_owner_is_not_marked_down(pack: Path) -> None:
    source, transport = make_source(pack, {1: "refuse", 2: "answer"})
    assert run(source, lambda: source.fetch(PARTITION, 0, 16)) == STORED[:16]
    assert transport.asked == [1, 2]
    assert source.peers_down() == []
    assert counters(source)["remote_timeouts"] == 0


def test_every_owner_silent_reads_the_pack(pack: Path) -> None:
    source, transport = make_source(pack, {1: "silent", 2: "silent"})
    assert run(source, lambda: source.fetch(PARTITION, 1000, 500)) == STORED[1000:1500]
    assert transport.asked == [1, 2]
    got = counters(source)
    assert (got["remote_timeouts"], got["pack_fallbacks"]) == (2, 1)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncate", "no owner answered and the pack is truncated (partition 1)"),
        (
            "symlink",
            "no owner answered and the pack cannot be read: %s: part-00001 is a symlink (pack files must be regular files)",
        ),
        (
            "missing",
            "no owner answered and the pack cannot be read: %s: cannot open part-00001: No such file or directory",
        ),
    ],
)
def test_no_owner_and_no_pack_is_a_remote_read_error(pack: Path, damage: str, message: str) -> None:
    path = pack / partition_name(PARTITION)
    if damage == "truncate":
        path.write_bytes(STORED[:10])
    elif damage == "symlink":
        path.unlink()
        (pack / "elsewhere").write_bytes(STORED)
        path.symlink_to(pack / "elsewhere")
    else:
        path.unlink()
    source, _ = make_source(pack, {1: "silent"})
    with pytest.raises(RemoteReadError) as info:
        run(source, lambda: source.fetch(PARTITION, 0, 100))
    assert str(info.value) == (message % pack if "%s" in message else message)


def test_a_late_answer_is_ignored(pack: Path) -> None:
    source, transport = make_source(pack, {1: "silent", 2: "answer"})

    async def late() -> bytes:
        data = await source.fetch(PARTITION, 0, 32)
        source.deliver(1, True, b"too late")  # request 1 timed out long ago
        await trio.sleep(0.05)
        return data

    assert run(source, late) == STORED[:32]


def test_unmounting_fails_a_waiting_fetch_at_once(pack: Path) -> None:
    source, _ = make_source(pack, {1: "silent"}, timeout_s=30.0)

    async def close_while_waiting() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
            start = time.monotonic()

            async def stop_soon() -> None:
                await trio.sleep(0.02)
                source.close()

            nursery.start_soon(stop_soon)
            with pytest.raises(MountClosingError):
                await source.fetch(PARTITION, 0, 16)
            assert time.monotonic() - start < 5.0  # not the 30 s timeout
        with pytest.raises(MountClosingError):
            await source.fetch(PARTITION, 0, 16)

    run(source, close_while_waiting)
    assert counters(source)["pack_fallbacks"] == 0
