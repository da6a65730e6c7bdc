"""Preload: which local partitions are copied into memory at start-up (`--preload`), the
reservation made before any fork, the copy itself, in a worker thread of the first serving
process, and the other serving processes' mapping of each copy once it is complete.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Final

from fanfs._memory import available_memory
from fanfs._sizes import format_size
from fanfs.format.reader import PackReader
from fanfs.mount.options import MountConfig

# The logger of the whole `fanfs mount` command, whichever module of it writes: the log says
# "fanfs.mount: mounted ...", as it always has.
log = logging.getLogger("fanfs.mount")


# --preload auto: copy partitions into the mount's memory at start-up, in partition order,
# up to this share of the node's available memory; the others are read on demand (pread in
# worker threads). The copies are the daemon's own memory (not page cache the kernel may
# drop), hence a share that leaves the training job most of the node.
PRELOAD_MEMORY_SHARE: Final = 0.25
# How long a serving process first waits before it looks again for partitions the first one
# has finished copying (`map_preloaded`); each wait doubles, up to MAP_POLL_MAX_S.
MAP_POLL_S: Final = 0.05
MAP_POLL_MAX_S: Final = 2.0


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


def reserve_preload(reader: PackReader, config: MountConfig) -> int:
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


async def run_preload(store: Any) -> None:
    import trio

    stop = threading.Event()
    try:
        loaded = await trio.to_thread.run_sync(store.preload, stop, abandon_on_cancel=True)
        log.info("preloaded %s of partitions into memory", format_size(loaded))
    except OSError as exc:
        log.warning("preloading partitions failed (%s); serving from the pack", exc)
    finally:
        stop.set()


async def map_preloaded(store: Any) -> None:
    """In a serving process other than the first: map each preloaded partition's copy into
    this process's page tables (`PackReader.map_copy`) once the first process has marked it
    resident, so that its chunks are served without faulting their pages in. A raw chunk is
    served by its checksum alone, and faulting its pages in cost about as much again: the
    real dataset's WebP wallpapers, stored raw, decoded 1.3-1.5x what the plan predicted."""
    import trio

    reader, resident = store.reader, store.shared.resident
    pending = [n for n in range(len(resident)) if reader.reserved(n)]
    wait = MAP_POLL_S
    while pending:
        for number in [n for n in pending if resident[n]]:
            pending.remove(number)
            if not await trio.to_thread.run_sync(reader.map_copy, number):
                log.debug("partition copies are mapped at their first touch (madvise refused)")
                return
        if pending:
            await trio.sleep(wait)
            wait = min(2 * wait, MAP_POLL_MAX_S)
