"""Pure functions of cluster layout: who owns which partition, who stages when.

Takes plain ints and lists, never a communicator, so every rank computes the same answer
with no communication (and tests need no MPI).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping, Sequence

# Launchers and the variables that give (rank, size): Open MPI, MPICH/Hydra and PMIx, Slurm.
_LAUNCH_VARS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMIX_RANK", "PMI_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)


def detect_launch(environ: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(rank, size) when this process was started by an MPI launcher, else None.

    Slurm's variables count only inside a job step (`srun`), not in the batch script itself.
    """
    for rank_var, size_var in _LAUNCH_VARS:
        if rank_var in environ and size_var in environ:
            if rank_var == "SLURM_PROCID" and "SLURM_STEP_ID" not in environ:
                continue
            try:
                return int(environ[rank_var]), int(environ[size_var])
            except ValueError:
                continue
    return None


def place(
    sizes: Sequence[int], broadcast: Sequence[bool], ranks: int, replicas: int = 1
) -> list[tuple[int, ...]]:
    """Owners of every partition: broadcast partitions live on every rank; each regular one
    on `min(replicas, ranks)` distinct ranks, chosen largest partition first onto the least
    loaded ranks (LPT), ties to the lower rank. A pure function of its arguments."""
    if ranks < 1:
        raise ValueError("ranks must be >= 1")
    copies = max(1, min(replicas, ranks))
    owners: list[tuple[int, ...]] = [tuple(range(ranks)) if b else () for b in broadcast]
    loads = [(0, rank) for rank in range(ranks)]
    order = sorted((n for n, b in enumerate(broadcast) if not b), key=lambda n: (-sizes[n], n))
    for number in order:
        chosen = [heapq.heappop(loads) for _ in range(copies)]
        owners[number] = tuple(sorted(rank for _, rank in chosen))
        for load, rank in chosen:
            heapq.heappush(loads, (load + sizes[number], rank))
    return owners


def stage_rounds(ranks: int, groups: int) -> list[list[int]]:
    """Ranks that read the shared filesystem together, round by round: at most `groups`
    at a time (LMDBIO's staggered readers); 0 means all at once."""
    if groups <= 0 or groups >= ranks:
        return [list(range(ranks))]
    return [list(range(start, min(start + groups, ranks))) for start in range(0, ranks, groups)]
