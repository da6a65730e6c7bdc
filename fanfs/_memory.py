"""What this node's memory allows (`MemAvailable`, read once per call from /proc/meminfo),
what a mount's processes use, and mapping shared memory into a process's page tables."""

from __future__ import annotations

import mmap
from typing import Final


def available_memory() -> int:
    """Bytes the kernel estimates are available for new allocations (0 if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def process_tree_memory(pid: int) -> dict[str, int]:
    """Resident and proportional set size of process `pid` and its children (a mount's
    serving processes and filler), from /proc/PID/smaps_rollup; missing processes count 0.
    PSS counts shared memory (the object cache, preloaded partitions) once across them."""
    pids = [pid]
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            pids += [int(child) for child in f.read().split()]
    except (OSError, ValueError):
        pass
    rss = pss = alive = 0
    for one in pids:
        try:
            with open("/proc/%d/smaps_rollup" % one) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            rss += int(fields["Rss"].split()[0]) * 1024
            pss += int(fields["Pss"].split()[0]) * 1024
            alive += 1
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return {"memory_rss_bytes": rss, "memory_pss_bytes": pss, "memory_processes": alive}


# madvise(2) advice that maps a range's pages into this process's page tables now (Linux
# 5.14; the mmap module of Python 3.11 names neither).
MADV_POPULATE_READ: Final = 22
MADV_POPULATE_WRITE: Final = 23
# One madvise call at most this much: Python's mmap.madvise holds the GIL while the kernel
# maps the pages (about 1 ms per 16 MiB here).
POPULATE_STEP: Final = 16 * 1024 * 1024


def populate(region: mmap.mmap, start: int, length: int, *, write: bool = False) -> bool:
    """Map bytes `start` to `start + length` of a shared `region` into this process's page
    tables now (for `write`, writable), in steps of POPULATE_STEP. Returns False if the
    kernel did not (older than 5.14, or out of memory): the pages left are then mapped at
    their first touch, as they would be anyway.

    A forked process does not inherit the page tables of a shared mapping: it faults each
    page in at first touch. Reading a partition copy a sibling loaded costs a fault per 16
    pages (fault-around), about a third of serving a chunk stored raw; writing a block into
    its shared segment costs a fault per page, 62-77 us against 8 us for a 128 KiB block
    whose pages are mapped (measured here, docs/architecture.md)."""
    page = mmap.PAGESIZE
    end = min(start + length, len(region))
    start -= start % page
    advice = MADV_POPULATE_WRITE if write else MADV_POPULATE_READ
    while start < end:
        step = min(POPULATE_STEP, end - start)
        try:
            region.madvise(advice, start, step)
        except OSError:  # (EINVAL before 5.14; ENOMEM, EFAULT: left to the first touch too)
            return False
        start += step
    return True
