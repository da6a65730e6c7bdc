"""The options of `fanfs mount`: `MountConfig` from the command line, and the paths a
mount derives from its mountpoint (default log file, hint socket).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
from dataclasses import dataclass
from typing import Final

from fanfs._sizes import parse_size
from fanfs.errors import UsageError
from fanfs.runtime import runtime_dir

# The logger of the whole `fanfs mount` command, whichever module of it writes: the log says
# "fanfs.mount: mounted ...", as it always has.
log = logging.getLogger("fanfs.mount")


MAX_PROCESSES: Final = 64


@dataclass(frozen=True, slots=True)
class MountConfig:
    pack: str
    mountpoint: str
    foreground: bool = False
    options: tuple[str, ...] = ()
    logfile: str | None = None
    debug: bool = False
    prefetch: bool = True
    prefetch_memory: int = 0  # 0: prefetch.default_memory
    prefetch_into: str = "kernel"
    cache_memory: int = -1  # -1: prefetch.default_cache_memory
    cache_policy: str = "minio"
    preload: str = "auto"
    noopen: bool = True
    fast_paths: bool = True
    thread_limit: int = 8
    processes: int = 0  # 0: DEFAULT_PROCESSES, bounded by the CPU count
    cluster: bool | None = None  # None: detect an MPI launch
    cache_dir: str | None = None
    replicas: int = 1
    stage: str = "copy"
    stage_groups: int = 0
    remote_timeout_s: float = 5.0
    coalesce_window_s: float = 0.0005


def config_from_args(args: argparse.Namespace) -> MountConfig:
    if not 0 <= args.processes <= MAX_PROCESSES:
        raise UsageError("--processes must be between 1 and %d (0: automatic)" % MAX_PROCESSES)
    options = tuple(o for group in args.options for o in group.split(",") if o)
    if args.prefetch_memory != "auto" and parse_size(args.prefetch_memory) < 1 << 20:
        raise UsageError(
            "--prefetch-memory must be at least 1MiB (to stop prefetching: --prefetch off)"
        )
    return MountConfig(
        pack=os.path.abspath(args.pack),
        mountpoint=os.path.abspath(args.mountpoint),
        foreground=args.foreground,
        options=options,
        logfile=args.log,
        debug=args.debug,
        prefetch=args.prefetch == "on",
        prefetch_memory=parse_size(args.prefetch_memory) if args.prefetch_memory != "auto" else 0,
        prefetch_into=args.prefetch_into,
        cache_memory=parse_size(args.cache_memory) if args.cache_memory != "auto" else -1,
        cache_policy=args.cache_policy,
        preload=_preload_option(args.preload),
        noopen=args.noopen,
        fast_paths=args.fast_paths,
        processes=args.processes,
        cluster=args.cluster,
        cache_dir=os.path.abspath(args.cache_dir) if args.cache_dir else None,
        replicas=args.replicas,
        stage=args.stage,
        stage_groups=args.stage_groups,
        remote_timeout_s=args.remote_timeout,
        coalesce_window_s=args.coalesce_window / 1000,
    )


def _preload_option(value: str) -> str:
    """`auto`, `yes`, `no`, or a memory budget such as `8GiB` (normalised to bytes)."""
    value = value.strip().lower()
    if value in ("auto", "yes", "no"):
        return value
    return str(parse_size(value))


def _mount_digest(mountpoint: str, length: int) -> str:
    return hashlib.sha1(mountpoint.encode(errors="surrogateescape")).hexdigest()[:length]


def default_logfile(mountpoint: str) -> str:
    name = "mount%s-%s.log" % (mountpoint.replace("/", "-"), _mount_digest(mountpoint, 8))
    return os.path.join(runtime_dir(), name)


def hints_socket_path(mountpoint: str, cache_dir: str | None) -> str:
    """Where the hint socket of a mount lives, outside the dataset namespace: the cache dir
    in cluster mode, else the runtime directory (a short name: socket paths are limited to
    107 bytes)."""
    if cache_dir:
        return os.path.join(cache_dir, "hints.sock")
    return os.path.join(runtime_dir(), "hints-%s.sock" % _mount_digest(mountpoint, 12))
