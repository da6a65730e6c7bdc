"""`Operations`: the FUSE request handlers of a read-only fanfs mount.

One short method per request; the `_boundary` decorator is the only place where errors
become errnos: `FanfsError` -> its `fuse_errno` (logged once per message), any other
exception -> EIO with one traceback per (operation, exception type), so a bug in one request
never ends the mount (an escaping exception would, STYLE.md A8.1).

Inode numbers are entry ids + 1 (the root entry 0 is pyfuse3.ROOT_INODE). File handles are
inode numbers too, which is what lets `read()` work unchanged in the kernel's no-open mode
(patched pyfuse3 passes the inode when the kernel sends fh=0, see tools/pyfuse3/).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import functools
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, ParamSpec, TypeVar

import numpy as np
import pyfuse3
import trio
from pyfuse3 import FUSEError

from fanfs import shared as sh
from fanfs import xattrs
from fanfs._memory import process_tree_memory
from fanfs.errors import FanfsError, KnownCorruptError, MountClosingError
from fanfs.format.layout import NAME_MAX
from fanfs.logsetup import LOG_ONCE
from fanfs.prefetch import Prefetcher
from fanfs.store import ChunkStore

log = logging.getLogger(__name__)

# The pack is immutable while mounted, so the kernel may cache names, attributes and
# negative lookups for as long as it likes; short timeouts cost a LOOKUP and several GETATTRs
# per open (2.3x slower, DESIGN.md section 4).
CACHE_TIMEOUT_S: Final = 24 * 3600.0
# st_blksize and f_bsize: large, so buffered readers and `cp` ask in big reads.
BLOCK_SIZE: Final = 128 * 1024
XATTR_PREFIX: Final = xattrs.PREFIX.encode()
FILE_XATTRS: Final = xattrs.FILE
ROOT_XATTRS: Final = xattrs.ROOT
HINTS_XATTR: Final = xattrs.HINTS.encode()
STATS_XATTR: Final = xattrs.STATS.encode()
# `user.fanfs.stats` reuses its memory figures for this long: they walk the page tables of
# the mount's processes (25 ms for 1.8 GB resident, seconds for a preloaded ImageNet), and a
# reader polling the counters once a file (a benchmark charging decode time to each file's
# class: 56,000 files) made the serving process spend most of its CPU time walking them.
MEMORY_STATS_S: Final = 1.0


@dataclasses.dataclass(slots=True)
class MountInfo:
    """What `mount.serve` decided for this mount, read by the serving loop and reported in
    the statistics (`user.fanfs.stats`)."""

    pack: str
    mountpoint: str = ""
    noopen: bool = False
    processes: int = 1
    bytes_in: int = 0  # the dataset's size, uncompressed
    files: int = 0
    prefetch: str = "off"  # off, kernel or daemon
    prefetch_memory: int = 0
    # The kernel's no-opendir mode (directory listings kept by the kernel) and every xattr
    # but user.fanfs.* answered in C by the patched pyfuse3 (pyfuse3.fanfs_set_fast_paths).
    fast_paths: bool = False
    filler: bool = False  # a background filler process fills the object cache
    hints: str | None = None  # the hint socket's path, while it is served

    def as_stats(self) -> dict[str, Any]:
        stats = dataclasses.asdict(self)
        if self.hints is None:
            del stats["hints"]
        return stats


P = ParamSpec("P")
R = TypeVar("R")


def _boundary(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except FUSEError:
            raise
        except FanfsError as exc:
            ops: Operations = args[0]  # type: ignore[assignment]
            if isinstance(exc, MountClosingError):
                log.debug("%s", exc)  # expected while unmounting; not a data error
            else:
                ops.shared.counters[sh.DATA_ERRORS] += 1
                if not isinstance(exc, KnownCorruptError):
                    log.error("%s", exc, extra=LOG_ONCE)
            raise FUSEError(exc.fuse_errno) from None
        except Exception as exc:
            ops = args[0]  # type: ignore[assignment]
            ops.shared.counters[sh.INTERNAL_ERRORS] += 1
            if (name, type(exc)) not in ops.logged_bugs:
                ops.logged_bugs.add((name, type(exc)))
                log.exception("internal error in %s (the reader gets EIO):", name)
            raise FUSEError(errno.EIO) from None

    return wrapper


class Operations(pyfuse3.Operations):
    """Read-only view of one pack. Every write intent gets EROFS (the mount is also `ro`,
    so the kernel refuses most of them before asking)."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        store: ChunkStore,
        *,
        noopen: bool,
        info: MountInfo,
        extra_stats: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.shared = store.shared
        self.main_pid = os.getpid()
        self._memory: tuple[float, dict[str, int]] | None = None  # (when walked, figures)
        self.initialized = False
        self.init_callbacks: list[Callable[[], None]] = []
        self.logged_bugs: set[tuple[str, type[BaseException]]] = set()
        self.index = store.index
        self.unit = store.reader.unit
        self.noopen = noopen
        self.info = info
        self.extra_stats = extra_stats
        # Set by mount/serve.py in each serving process when prefetching is on.
        self.prefetcher: Prefetcher | None = None
        self.uid = os.getuid()
        self.gid = os.getgid()
        nlink = self.index.subdir_counts().astype(np.uint32)
        nlink += 2  # in place: one array of 4 bytes per entry, not two
        self._nlink = nlink.data.cast("B").cast("I")

    def init(self) -> None:
        # Called by libfuse inside the INIT handshake; mount/serve.py hooks readiness (and, with
        # several serving processes, the stop before forking) onto it. Must not raise.
        self.initialized = True
        for callback in self.init_callbacks:
            try:
                callback()
            except Exception:
                log.exception("start-up callback %r failed", callback)

    def statistics(self, memory: dict[str, int]) -> dict[str, Any]:
        """Mount-wide counters (all serving processes) plus this process's cache state and
        `memory` (`process_tree_memory`)."""
        stats = self.info.as_stats()
        stats.update(self.shared.totals())
        stats.update(self.store.statistics())
        stats.update(memory)
        if self.extra_stats is not None:
            stats.update(self.extra_stats())
        return stats

    def _entry(self, inode: int) -> int:
        entry = inode - 1
        if not 0 <= entry < self.index.entry_count:
            raise FUSEError(errno.ENOENT)
        return entry

    def _attr(self, entry: int) -> pyfuse3.EntryAttributes:
        index = self.index
        attr = pyfuse3.EntryAttributes()
        mode = index.mode[entry]
        size = index.size[entry]
        mtime = index.mtime_ns[entry]
        attr.st_ino = entry + 1
        attr.st_mode = mode
        attr.st_nlink = self._nlink[entry] if stat.S_ISDIR(mode) else 1
        attr.st_uid = self.uid
        attr.st_gid = self.gid
        attr.st_size = size
        attr.st_blksize = BLOCK_SIZE
        attr.st_blocks = (size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime
        attr.entry_timeout = attr.attr_timeout = CACHE_TIMEOUT_S
        return attr

    def _dir(self, inode: int) -> int:
        entry = self._entry(inode)
        if not stat.S_ISDIR(self.index.mode[entry]):
            raise FUSEError(errno.ENOTDIR)
        return entry

    @_boundary
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: Any = None
    ) -> pyfuse3.EntryAttributes:
        self.shared.counters[sh.LOOKUPS] += 1
        parent = self._dir(parent_inode)
        if name == b".":
            return self._attr(parent)
        if name == b"..":
            return self._attr(self.index.parent[parent])
        if len(name) > NAME_MAX:
            raise FUSEError(errno.ENAMETOOLONG)
        entry = self.index.lookup(parent, name)
        if entry is None:
            # A negative entry (st_ino 0) is cached by the kernel for entry_timeout: loaders
            # probe many names that do not exist.
            miss = pyfuse3.EntryAttributes()
            miss.st_ino = 0
            miss.entry_timeout = CACHE_TIMEOUT_S
            return miss
        return self._attr(entry)

    @_boundary
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attr(self._entry(inode))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        # Nothing to free: inodes are index rows, not objects.
        return None

    @_boundary
    async def readlink(self, inode: int, ctx: Any = None) -> bytes:
        entry = self._entry(inode)
        if not stat.S_ISLNK(self.index.mode[entry]):
            raise FUSEError(errno.EINVAL)
        return self.index.symlink_target(entry)

    @_boundary
    async def opendir(self, inode: int, ctx: Any = None) -> int:
        # With the fanfs pyfuse3 patch (level 4) the first OPENDIR is answered ENOSYS in C
        # instead: the kernel's no-opendir mode, which keeps the listings and sends READDIR
        # with fh=0, passed on as the inode (MountInfo.fast_paths).
        self.shared.counters[sh.DIR_OPENS] += 1
        self._dir(inode)
        return inode

    @_boundary
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        # Offsets: 1 is after ".", 2 after "..", 2 + i + 1 after child i.
        index = self.index
        entry = fh - 1
        self.shared.counters[sh.READDIRS] += 1
        if start_id == 0 and not pyfuse3.readdir_reply(token, b".", self._attr(entry), 1):
            return
        if start_id <= 1 and not pyfuse3.readdir_reply(
            token, b"..", self._attr(index.parent[entry]), 2
        ):
            return
        first = index.first[entry]
        for i in range(max(start_id - 2, 0), index.count[entry]):
            child = first + i
            if not pyfuse3.readdir_reply(token, index.name(child), self._attr(child), i + 3):
                break

    async def releasedir(self, fh: int) -> None:
        return None

    @_boundary
    async def open(self, inode: int, flags: int, ctx: Any = None) -> pyfuse3.FileInfo:
        entry = self._entry(inode)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise FUSEError(errno.EROFS)
        if stat.S_ISDIR(self.index.mode[entry]):
            raise FUSEError(errno.EISDIR)
        if self.noopen:
            # ENOSYS switches the kernel to no-open mode: no OPEN/RELEASE from now on, page
            # cache kept, READ arrives with fh=0 and patched pyfuse3 passes the inode.
            raise FUSEError(errno.ENOSYS)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    @_boundary
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        # Time spent serving READs (decode, waits for threads and peers): the daemon's part
        # of the readers' fetch stall (DS-Analyzer), in `fanfs stats`.
        start = time.perf_counter_ns()
        try:
            return await self._read(fh, off, size)
        finally:
            self.shared.counters[sh.READ_NS] += time.perf_counter_ns() - start

    async def _read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        entry = fh - 1
        index = self.index
        fsize = index.size[entry]
        counters = self.shared.counters
        counters[sh.READS] += 1
        if off >= fsize or size <= 0:
            if stat.S_ISDIR(index.mode[entry]):
                raise FUSEError(errno.EISDIR)
            return b""
        end = min(off + size, fsize)
        counters[sh.READ_BYTES] += end - off
        cs = self.unit(entry)  # the file's chunk or block size
        first = off // cs
        last = (end - 1) // cs
        if self.prefetcher is not None and self.prefetcher.observe(entry, first, last):
            # Let the workers take the new read-ahead now: a READ of a resident chunk is
            # served without yielding, and the kernel may queue many of them back to back.
            await trio.lowlevel.checkpoint()
        if first == last:
            base = first * cs
            whole = off == base and end == min(base + cs, fsize)
            data = await self.store.chunk(entry, first, whole=whole)
            if self.prefetcher is not None and self.prefetcher.pushes:
                mates = self.store.block_mates(index.first[entry] + first)
                if mates:
                    self.prefetcher.push_mates(mates)
            if whole:
                return data
            if self.prefetcher is not None:
                self.prefetcher.push_rest(entry, first, data, off - base, end - base)
            self.store.used(index.first[entry] + first, off - base, end - base, len(data))
            return memoryview(data)[off - base : end - base]
        parts = []
        for k in range(first, last + 1):
            base = k * cs
            data = await self.store.chunk(entry, k, whole=False)
            start, stop = max(off, base) - base, min(end, base + cs) - base
            self.store.used(index.first[entry] + k, start, stop, len(data))
            parts.append(memoryview(data)[start:stop])
        return b"".join(parts)

    async def flush(self, fh: int) -> None:
        # ENOSYS once switches FLUSH off for the whole mount (+40% warm, DESIGN.md section 4).
        raise FUSEError(errno.ENOSYS)

    async def release(self, fh: int) -> None:
        return None

    async def fsync(self, fh: int, datasync: bool) -> None:
        return None

    @_boundary
    async def statfs(self, ctx: Any = None) -> pyfuse3.StatvfsData:
        st = pyfuse3.StatvfsData()
        st.f_bsize = st.f_frsize = BLOCK_SIZE
        st.f_blocks = (self.info.bytes_in + BLOCK_SIZE - 1) // BLOCK_SIZE
        st.f_bfree = st.f_bavail = 0
        st.f_files = self.index.entry_count
        st.f_ffree = st.f_favail = 0
        st.f_namemax = NAME_MAX
        return st

    @_boundary
    async def access(self, inode: int, mode: int, ctx: Any = None) -> bool:
        self._entry(inode)
        if mode & os.W_OK:
            raise FUSEError(errno.EROFS)
        return True

    def _xattr_names(self, entry: int) -> tuple[bytes, ...]:
        names: tuple[bytes, ...] = ()
        if stat.S_ISREG(self.index.mode[entry]):
            names += FILE_XATTRS
        if entry == 0:
            names += ROOT_XATTRS
            if self.info.hints:
                names += (HINTS_XATTR,)
        return names

    # fanfs's attributes answer when asked by name but are never listed, so that `cp -a`,
    # `rsync -X` and `tar --xattrs` copies carry none of them. Names outside user. get
    # EOPNOTSUPP: no security labels, no POSIX ACLs, and `ls -l` stops asking after the
    # first file. The patched pyfuse3 (level 4) gives these same answers in C
    # (MountInfo.fast_paths); only user.fanfs.* reach Python there.
    @_boundary
    async def listxattr(self, inode: int, ctx: Any = None) -> Sequence[bytes]:
        self.shared.counters[sh.XATTR_CALLS] += 1
        self._entry(inode)
        return ()

    @_boundary
    async def getxattr(self, inode: int, name: bytes, ctx: Any = None) -> bytes:
        self.shared.counters[sh.XATTR_CALLS] += 1
        entry = self._entry(inode)
        if not name.startswith(b"user."):
            raise FUSEError(errno.EOPNOTSUPP)
        if name not in self._xattr_names(entry):
            raise FUSEError(pyfuse3.ENOATTR)
        if name == STATS_XATTR:
            # The memory figures walk every page table entry of the mount's processes
            # (smaps_rollup), in a worker thread: a monitor polling `fanfs stats` must not
            # stall this process. Walked at most once per MEMORY_STATS_S; the counters are
            # always current.
            if self._memory is None or time.monotonic() - self._memory[0] >= MEMORY_STATS_S:
                memory = await trio.to_thread.run_sync(process_tree_memory, self.main_pid)
                self._memory = (time.monotonic(), memory)
            return json.dumps(self.statistics(self._memory[1]), sort_keys=True).encode()
        return self._xattr_value(entry, name[len(XATTR_PREFIX) :]).encode()

    def _xattr_value(self, entry: int, key: bytes) -> str:
        index = self.index
        chunks = range(index.first[entry], index.first[entry] + index.count[entry])
        if key == b"codec":
            # The codec holding most of the file's chunks: a few-byte tail chunk stored raw
            # does not make a zstd file "none".
            from fanfs.compression import chunk_codec_name

            counts = collections.Counter(index.chunk_codec[c] for c in chunks)
            return chunk_codec_name(counts.most_common(1)[0][0]) if counts else "none"
        if key == b"stored_size":
            return str(sum(index.chunk_csize[c] for c in chunks))
        if key == b"chunks":
            return str(len(chunks))
        if key == b"partitions":
            return ",".join(str(p) for p in sorted({index.chunk_partition[c] for c in chunks}))
        if key == b"pid":
            return str(self.main_pid)
        if key == b"version":
            from fanfs import __version__

            return __version__
        if key == b"hints":
            return str(self.info.hints)
        return self.info.pack

    # Every write intent is refused; the `ro` mount option makes the kernel refuse most of
    # them itself, these cover the rest (and mounts with -o rw).
    async def setattr(self, *_: Any) -> pyfuse3.EntryAttributes:
        raise FUSEError(errno.EROFS)

    async def mknod(self, *_: Any) -> pyfuse3.EntryAttributes:
        raise FUSEError(errno.EROFS)

    async def mkdir(self, *_: Any) -> pyfuse3.EntryAttributes:
        raise FUSEError(errno.EROFS)

    async def symlink(self, *_: Any) -> pyfuse3.EntryAttributes:
        raise FUSEError(errno.EROFS)

    async def link(self, *_: Any) -> pyfuse3.EntryAttributes:
        raise FUSEError(errno.EROFS)

    async def create(self, *_: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise FUSEError(errno.EROFS)

    async def unlink(self, *_: Any) -> None:
        raise FUSEError(errno.EROFS)

    async def rmdir(self, *_: Any) -> None:
        raise FUSEError(errno.EROFS)

    async def rename(self, *_: Any) -> None:
        raise FUSEError(errno.EROFS)

    async def write(self, *_: Any) -> int:
        raise FUSEError(errno.EROFS)

    async def setxattr(self, *_: Any) -> None:
        raise FUSEError(errno.EROFS)

    async def removexattr(self, *_: Any) -> None:
        raise FUSEError(errno.EROFS)
