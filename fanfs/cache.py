"""Decoded-object caches of a mount: the shared no-thrash MinIO cache and a per-process LRU.

A training job reads every sample once per epoch in a new random order. An LRU cache smaller
than the dataset then evicts each object before its next use and hits almost never; CoorDL's
MinIO policy keeps the first objects it sees and never evicts, so every epoch gets as many hits
as the cache holds objects. `MinioCache` is that policy over one anonymous shared mapping,
created before the serving processes fork, so all of them fill and hit the same cache:

- an arena of `budget` bytes, filled front to back under a process-shared lock (allocation
  only; hits take no lock), touched only as it fills, so RSS grows with the contents;
- a slot table with one u64 per chunk id: 0 while absent, BUSY once a writer has claimed it
  (under the lock, so a chunk is stored once), then (offset/8 << 28 | length), written with
  one aligned store after the bytes are in place, so a reader in another process sees
  either nothing or the whole object.

`LruCache` is the classic policy with the same interface, per process (budget split across the
serving processes), for comparison (`--cache-policy lru`, docs/benchmarks.md).

Both are keyed by chunk id and hold decoded chunk bytes (a small file is one chunk).
"""

from __future__ import annotations

import collections
import logging
import mmap
import multiprocessing
from collections.abc import Hashable
from typing import Final, Protocol

log = logging.getLogger(__name__)

# A slot being written: claimed under the lock, so a second writer of the same chunk skips it.
BUSY: Final = (1 << 64) - 1
# Slot encoding: 28 bits of length (objects up to 256 MiB - 1), 36 bits of offset in units of
# 8 bytes (arenas up to 512 GiB).
LENGTH_BITS: Final = 28
MAX_OBJECT: Final = (1 << LENGTH_BITS) - 1
MAX_ARENA: Final = (1 << 36) * 8
ALIGN: Final = 8
LOCK_WAIT_S: Final = 0.5


class ObjectCache(Protocol):
    policy: str
    budget: int

    def get(self, cid: int) -> memoryview | bytes | None: ...

    def put(self, cid: int, data: bytes | memoryview) -> bool:
        """Keep `data` for chunk `cid` if the policy admits it; True if it was stored."""
        ...

    def contains(self, cid: int) -> bool: ...

    def has_room(self) -> bool: ...

    def statistics(self) -> dict[str, int | str]: ...


class MinioCache:
    """Fill once, never evict; shared by every serving process of the mount.

    `get` is safe from any thread; `put` from any thread of any process (allocation is locked).
    """

    policy = "minio"

    def __init__(self, budget: int, chunks: int) -> None:
        self.budget = min(budget, MAX_ARENA)
        self._arena = mmap.mmap(-1, max(self.budget, 1), flags=mmap.MAP_SHARED)
        self._view = memoryview(self._arena)
        # Header: [0] bytes allocated, [1] objects stored, [2] objects refused for lack of room.
        self._table_map = mmap.mmap(-1, (chunks + 3) * 8, flags=mmap.MAP_SHARED)
        table = memoryview(self._table_map).cast("Q")
        self._header = table[:3]
        self._slots = table[3:]
        self._lock = multiprocessing.get_context("fork").Lock()

    def get(self, cid: int) -> memoryview | None:
        slot = self._slots[cid]
        if not slot or slot == BUSY:
            return None
        offset = (slot >> LENGTH_BITS) * ALIGN
        return self._view[offset : offset + (slot & MAX_OBJECT)]

    def contains(self, cid: int) -> bool:
        return bool(self._slots[cid])

    def has_room(self) -> bool:
        return self._header[0] < self.budget

    def put(self, cid: int, data: bytes | memoryview) -> bool:
        length = len(data)
        if self._slots[cid] or not 0 < length <= MAX_OBJECT:
            return False
        padded = -(-length // ALIGN) * ALIGN
        # Only the allocation is locked, briefly (the background filler runs at the lowest
        # CPU priority and must not hold others up while it copies). The wait is bounded: a
        # process killed while holding the lock (OOM killer) must not hang the others, who
        # then just stop caching.
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            return False
        try:
            if self._slots[cid]:  # another process stored it meanwhile
                return False
            offset = self._header[0]
            if offset + length > self.budget:
                self._header[2] += 1
                return False
            self._header[0] = offset + padded
            self._header[1] += 1
            self._slots[cid] = BUSY
        finally:
            self._lock.release()
        self._view[offset : offset + length] = data
        self._slots[cid] = (offset // ALIGN) << LENGTH_BITS | length
        return True

    def statistics(self) -> dict[str, int | str]:
        return {
            "cache_policy": self.policy,
            "cache_budget": self.budget,
            "cache_bytes": min(int(self._header[0]), self.budget),
            "cache_objects": int(self._header[1]),
            "cache_refused": int(self._header[2]),
        }


class LruCache:
    """Least-recently-used eviction; one per serving process, `budget` bytes each. Keyed by
    chunk id, or by any hashable key (the store's decoded solid blocks)."""

    policy = "lru"

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._items: collections.OrderedDict[Hashable, bytes | memoryview] = (
            collections.OrderedDict()
        )
        self._bytes = 0
        self.evictions = 0

    def get(self, cid: Hashable) -> bytes | memoryview | None:
        data = self._items.get(cid)
        if data is not None:
            self._items.move_to_end(cid)
        return data

    def contains(self, cid: int) -> bool:
        return cid in self._items

    def has_room(self) -> bool:
        return self._bytes < self.budget

    def put(self, cid: Hashable, data: bytes | memoryview) -> bool:
        if cid in self._items or not 0 < len(data) <= self.budget:
            return False
        self._items[cid] = data
        self._bytes += len(data)
        while self._bytes > self.budget:
            _, old = self._items.popitem(last=False)
            self._bytes -= len(old)
            self.evictions += 1
        return True

    def discard(self, cid: Hashable) -> None:
        """Let `cid` go now, if kept (not an eviction)."""
        data = self._items.pop(cid, None)
        if data is not None:
            self._bytes -= len(data)

    def statistics(self) -> dict[str, int | str]:
        return {
            "cache_policy": self.policy,
            "cache_budget": self.budget,
            "cache_bytes": self._bytes,
            "cache_objects": len(self._items),
            "cache_evictions": self.evictions,
        }


def make_cache(
    policy: str, budget: int, *, chunks: int, processes: int
) -> MinioCache | LruCache | None:
    """The mount's object cache (None when the budget is 0). Call before forking."""
    if budget <= 0:
        return None
    if policy == "lru":
        return LruCache(budget // max(processes, 1))
    try:
        return MinioCache(budget, chunks)
    except OSError as exc:  # e.g. strict overcommit (vm.overcommit_memory=2)
        log.warning(
            "no object cache: cannot map %d bytes of shared memory (%s); lower --cache-memory",
            budget,
            exc.strerror,
        )
        return None
