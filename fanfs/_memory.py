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
