"""`fanfs mount PACK MOUNTPOINT`: lifecycle of one mount daemon.

Steps, each a function: validate the mountpoint and the pack (before anything is mounted,
so errors are one line and an exit code); fork the daemon (before any thread exists) unless
`-f`; `pyfuse3.init`; tell the waiting parent the mount is ready; run `pyfuse3.main` in a
nursery with the signal handler, the partition preloader and the read-ahead tuner; unmount
cleanly on SIGINT/SIGTERM/fusermount -u. A crash leaves the mount dead (ENOTCONN) rather than
silently showing the empty mountpoint; `fanfs umount` clears it.

One module per job, each importing only those listed before it:
- `options`: `MountConfig` from the command line; paths derived from the mountpoint.
- `signals`: SIGINT/SIGTERM before and inside trio; faulthandler.
- `kernel`: pyfuse3, FUSE mount options, `pyfuse3.init`, session flags, read-ahead.
- `preload`: which partitions to copy into memory, the reservation, the copy.
- `family`: the serving processes and the filler: fork, watch, reap.
- `serve`: `serve`, the store and operations, the trio loop (prefetcher, hints).
- `daemon`: the background daemon and its readiness report to the parent.
- `command`: `mount_from_args`, single node or one rank of a cluster.
"""

from fanfs.mount.command import mount_from_args
from fanfs.mount.family import serving_processes
from fanfs.mount.options import MountConfig, config_from_args
from fanfs.mount.preload import preload_partitions
from fanfs.mount.serve import memory_budgets, serve

__all__ = [
    "MountConfig",
    "config_from_args",
    "memory_budgets",
    "mount_from_args",
    "preload_partitions",
    "serve",
    "serving_processes",
]
