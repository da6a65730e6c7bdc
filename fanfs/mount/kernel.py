"""The kernel side of a mount: pyfuse3 and /dev/fuse, the FUSE mount options (ro, nosuid,
nodev; the refused ones), `pyfuse3.init`, the session flags of the fanfs pyfuse3 patch, and
the mount's read-ahead.
"""

from __future__ import annotations

import fcntl
import logging
import os
from typing import Any, Final

from fanfs._sizes import format_size
from fanfs.errors import FanfsError, MountSetupError, UsageError
from fanfs.mount.options import MountConfig

# The logger of the whole `fanfs mount` command, whichever module of it writes: the log says
# "fanfs.mount: mounted ...", as it always has.
log = logging.getLogger("fanfs.mount")


# Kernel read-ahead for the mount, in KiB: files of 1 MiB and more then arrive in one READ
# instead of eight (DESIGN.md section 4).
READ_AHEAD_KB: Final = 1024


def import_pyfuse3() -> Any:
    try:
        import pyfuse3
    except ImportError as exc:
        raise MountSetupError("pyfuse3 is not installed (%s); run tools/setup.sh" % exc) from exc
    if not os.path.exists("/dev/fuse"):
        raise MountSetupError("/dev/fuse does not exist: FUSE is not available on this machine")
    return pyfuse3


# Mount options that pyfuse3/libfuse accept but that break the mount (DESIGN.md section 4).
_REFUSED_OPTIONS: Final = ("max_read", "direct_io")


def mount_options(pyfuse3: Any, config: MountConfig) -> set[str]:
    for option in config.options:
        if option.split("=")[0] in _REFUSED_OPTIONS:
            raise UsageError(
                "-o %s is not supported by fanfs (it breaks the mount or shared mmap)" % option
            )
    # nosuid, nodev: the daemon answers with its own uid (root on a cluster node), so a
    # setuid file or a device node in an untrusted pack must not take effect.
    options = set(pyfuse3.default_options) | {"ro", "nosuid", "nodev", "subtype=fanfs"}
    if not any(o.startswith("fsname=") for o in config.options):
        options.add("fsname=fanfs")
    options.update(o for o in config.options if o not in ("rw",))
    for allowed in ("suid", "dev"):  # an explicit -o suid or -o dev (the user's decision)
        if allowed in options:
            options.discard("no" + allowed)
    return options


def mount_kernel(pyfuse3: Any, ops: Any, config: MountConfig, cluster: Any) -> None:
    """pyfuse3.init; in cluster mode every rank agrees that all mounted (or all fail)."""
    error: FanfsError | None = None
    try:
        pyfuse3.init(ops, config.mountpoint, mount_options(pyfuse3, config))
    except RuntimeError as exc:
        error = MountSetupError("cannot mount %s: %s" % (config.mountpoint, exc))
    except FanfsError as exc:
        error = exc
    if cluster is not None:
        cluster.before_serving(error)
    if error is not None:
        raise error
    info = ops.info
    log.info(
        "mounted %s at %s (%d files, %s, serving processes: %d, no-open mode %s, fast paths %s)",
        config.pack,
        config.mountpoint,
        info.files,
        format_size(info.bytes_in),
        info.processes,
        "on" if info.noopen else "off",
        "on" if info.fast_paths else "off",
    )
    objects = ops.store.objects
    log.info(
        "object cache: %s, %s; prefetch: %s, %s",
        objects.policy if objects else "off",
        format_size(objects.budget if objects else 0),
        info.prefetch,
        format_size(info.prefetch_memory),
    )


def nonblocking_session(pyfuse3: Any) -> None:
    """With the fanfs pyfuse3 patch, make /dev/fuse non-blocking (several processes share
    it; a lost race is EAGAIN, not a stuck loop) and, from patch level 3, read queued
    requests without an epoll round trip each."""
    level = getattr(pyfuse3, "FANFS_PATCH_LEVEL", 0)
    if level < 2:
        return
    fd = pyfuse3.fanfs_session_fd()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    if level >= 3:
        pyfuse3.fanfs_set_eager_receive(True)


def check_initialized(pyfuse3: Any, ops: Any, config: MountConfig) -> None:
    if not ops.initialized:
        pyfuse3.close(unmount=True)
        raise MountSetupError(
            "the kernel did not complete the mount of %s (FUSE INIT failed; see the log)"
            % config.mountpoint
        )


async def tune_read_ahead(mountpoint: str) -> None:
    import trio

    def tune() -> None:
        dev = os.stat(mountpoint).st_dev
        path = "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(dev), os.minor(dev))
        with open(path, "w") as f:
            f.write(str(READ_AHEAD_KB))

    try:
        await trio.to_thread.run_sync(tune, abandon_on_cancel=True)
    except OSError as exc:
        log.debug("cannot raise read-ahead of %s: %s", mountpoint, exc)
