"""What this node's memory allows: `MemAvailable`, read once per call from /proc/meminfo."""

from __future__ import annotations


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
