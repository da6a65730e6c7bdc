"""The object caches: MinIO (fill once, never evict, shared across forked processes) and LRU."""

from __future__ import annotations

import os
from typing import Any

from fanfs.cache import LruCache, MinioCache, make_cache


def minio_stats(cache: MinioCache, *, used: int, objects: int, refused: int) -> None:
    assert cache.statistics() == {
        "cache_policy": "minio",
        "cache_budget": cache.budget,
        "cache_bytes": used,
        "cache_objects": objects,
        "cache_refused": refused,
    }


def test_minio_put_get_and_fill_once() -> None:
    cache = MinioCache(64, chunks=8)
    assert cache.get(3) is None and not cache.contains(3)
    minio_stats(cache, used=0, objects=0, refused=0)
    assert cache.put(3, b"abcdefghij")
    assert cache.contains(3) and bytes(cache.get(3) or b"") == b"abcdefghij"
    # Filled once: a second put of the chunk neither replaces it nor takes room.
    assert not cache.put(3, b"0123456789")
    assert bytes(cache.get(3) or b"") == b"abcdefghij"
    # 10 bytes take 16: every object starts 8-byte aligned.
    minio_stats(cache, used=16, objects=1, refused=0)
    # Nothing else appeared.
    assert [cid for cid in range(8) if cache.contains(cid)] == [3]


def test_minio_refuses_when_full_and_never_evicts() -> None:
    cache = MinioCache(64, chunks=8)
    assert cache.put(0, b"a" * 32)
    assert cache.put(1, memoryview(b"b" * 24))
    assert cache.has_room()
    assert not cache.put(2, b"c" * 9)  # 56 + 9 > 64
    assert cache.put(2, b"c" * 8)  # exactly fills it
    assert not cache.has_room()
    assert not cache.put(3, b"d")
    minio_stats(cache, used=64, objects=3, refused=2)
    assert [bytes(cache.get(c) or b"") for c in range(4)] == [b"a" * 32, b"b" * 24, b"c" * 8, b""]
    assert not cache.contains(3)


def test_minio_refuses_empty_objects() -> None:
    cache = MinioCache(64, chunks=2)
    assert not cache.put(0, b"")
    assert not cache.contains(0)
    minio_stats(cache, used=0, objects=0, refused=0)


def test_minio_is_shared_with_forked_processes() -> None:
    """Made before the fork, the cache is one for the parent and its children: each sees what
    the other stored, and a chunk is stored once whoever stores it first."""
    cache = MinioCache(1 << 20, chunks=100)
    assert cache.put(1, b"from the parent")
    child_data = b"from the child " * 100
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            if bytes(cache.get(1) or b"") != b"from the parent":
                code = 2
            elif cache.put(1, b"the child's own"):
                code = 3
            elif not cache.put(50, child_data):
                code = 4
            else:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bytes(cache.get(50) or b"") == child_data
    assert bytes(cache.get(1) or b"") == b"from the parent"
    assert not cache.put(50, b"parent's copy")
    minio_stats(cache, used=16 + 1504, objects=2, refused=0)  # 1500 bytes take 1504


class _RacingSlots:
    """A slot table through which the first `put` sees another writer's whole `put` of the
    same chunk run between its last check of the slot and its store (two processes storing
    one chunk at once, as a serving process and the background filler do)."""

    def __init__(self, cache: MinioCache, slots: Any, cid: int, data: bytes) -> None:
        self.cache, self.slots, self.cid, self.data = cache, slots, cid, data
        self.reads = 0

    def __getitem__(self, cid: int) -> int:
        value = int(self.slots[cid])
        self.reads += 1
        if self.reads == 3:  # the first put's check after its copy
            self.cache.put(self.cid, self.data)  # the other writer, start to finish
        return value

    def __setitem__(self, cid: int, value: int) -> None:
        self.slots[cid] = value


def test_minio_chunk_stored_at_once_by_two_writers_counts_once() -> None:
    cache = MinioCache(1024, chunks=4)
    data = b"x" * 100
    cache._slots = _RacingSlots(cache, cache._slots, 2, data)  # type: ignore[assignment]
    cache.put(2, data)
    assert bytes(cache.get(2) or b"") == data
    stats = cache.statistics()
    # The losing copy's room may stay unused (documented), but the chunk is one object.
    assert stats["cache_objects"] == 1, stats


def test_lru_evicts_least_recently_used_first() -> None:
    lru = LruCache(30)
    for cid in (1, 2, 3):
        assert lru.put(cid, bytes([cid]) * 10)
    assert bytes(lru.get(1) or b"") == b"\x01" * 10  # 1 is now the most recently used
    assert lru.put(4, b"\x04" * 10)  # evicts 2, the least recently used
    assert [c for c in range(1, 6) if lru.contains(c)] == [1, 3, 4]
    assert lru.get(2) is None
    assert lru.put(5, b"\x05" * 15)  # evicts 3, then 1
    assert [c for c in range(1, 6) if lru.contains(c)] == [4, 5]
    assert lru.evictions == 3
    assert lru.statistics() == {
        "cache_policy": "lru",
        "cache_budget": 30,
        "cache_bytes": 25,
        "cache_objects": 2,
        "cache_evictions": 3,
    }


def test_lru_refusals() -> None:
    lru = LruCache(30)
    assert lru.put(1, b"a" * 10)
    assert not lru.put(1, b"b" * 10)  # present: kept as it is
    assert not lru.put(2, b"c" * 31)  # larger than the whole budget: nothing evicted for it
    assert not lru.put(3, b"")
    assert bytes(lru.get(1) or b"") == b"a" * 10
    assert (lru.statistics()["cache_objects"], lru.evictions) == (1, 0)
    assert lru.has_room()


def test_make_cache() -> None:
    assert make_cache("minio", 0, chunks=10, processes=2) is None
    assert make_cache("lru", 0, chunks=10, processes=2) is None
    minio = make_cache("minio", 1000, chunks=10, processes=2)
    assert isinstance(minio, MinioCache) and minio.budget == 1000
    lru = make_cache("lru", 1000, chunks=10, processes=4)
    assert isinstance(lru, LruCache) and lru.budget == 250  # split among the processes
