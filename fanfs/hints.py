"""Clairvoyant prefetching: tell a mount the order in which files will be read.

A training script that knows its sampler's order can hand it to the mount; the daemon then
decodes files ahead in exactly that order (NoPFS, CoorDL) instead of guessing from reads.
Unmodified scripts never need this.

The channel is a Unix socket outside the dataset namespace; the mount root's extended
attribute `user.fanfs.hints` names it (the mount is read-only, so the client reads the path
rather than writing an attribute). Commands, one per line:

    order\n  PATH\n ... PATH\n  end\n    the upcoming order (replaces the previous one);
                                      the daemon answers "ok KNOWN MISSING\n"
    paths\n  PATH\n ... PATH\n  end\n    register the dataset's paths once (sample i is the
                                      i-th); answered like order
    indices N\n  then N x u32 (LE)     the upcoming order as indices into the registered
                                      paths: 4 bytes per sample, no path lookups; "ok N\n"
    at POSITION\n                     the client has consumed the order up to POSITION
                                      (0-based); the daemon keeps its window ahead of it

PATHs are absolute paths inside the mount or paths relative to its root. A hint is advice: an
unknown path is counted as missing and skipped, and reads work the same without hints.

`HintChannel` is the client; `fanfs.torch.HintedSampler` wraps a PyTorch sampler with it.
`serve_hints` is the daemon side.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from fanfs import xattrs
from fanfs.errors import UsageError

if TYPE_CHECKING:
    from fanfs.format.index import Index
    from fanfs.prefetch import Prefetcher

log = logging.getLogger(__name__)

XATTR: Final = xattrs.HINTS
MAX_LINE: Final = 64 * 1024
MAX_CONNECTIONS: Final = 8  # hint connections served at once; more are refused
RESOLVE_BATCH: Final = 8192  # paths resolved per worker-thread call


def socket_path(mountpoint: str) -> str:
    """The hint socket of the fanfs mount at `mountpoint`."""
    try:
        return os.getxattr(mountpoint, XATTR).decode()
    except OSError as exc:
        raise UsageError("%s: no fanfs hint channel (%s)" % (mountpoint, exc.strerror)) from exc


class HintChannel:
    """A connection to a mount's hint socket.

    Example:
        with HintChannel("/mnt/data") as hints:
            hints.send_order(paths)           # this epoch's order
            for position, path in enumerate(paths):
                if position % 64 == 0:
                    hints.progress(position)
                ...
    """

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = os.path.abspath(mountpoint)
        path = socket_path(self.mountpoint)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except OSError as exc:
            self._sock.close()
            raise UsageError(
                "%s: cannot connect to the hint socket %s (%s)" % (mountpoint, path, exc.strerror)
            ) from exc
        self._reply = self._sock.makefile("rb")

    def send_order(self, paths: Iterable[str | bytes]) -> tuple[int, int]:
        """Send the upcoming order; returns (paths the mount knows, paths it does not)."""
        return self._send_paths(b"order", paths)

    def _send_paths(self, command: bytes, paths: Iterable[str | bytes]) -> tuple[int, int]:
        lines = [command]
        for path in paths:
            raw = os.fsencode(path)
            lines.append(raw if b"\n" not in raw else b"")
        lines.append(b"end\n")
        answer = self._ask(b"\n".join(lines))
        if len(answer) != 3:
            raise UsageError("%s: bad answer from the mount (%r)" % (self.mountpoint, answer))
        return int(answer[1]), int(answer[2])

    def _ask(self, request: bytes) -> list[bytes]:
        """Send `request`; the daemon's "ok ..." answer split in words, or UsageError with
        the daemon's reason when it refuses ("error REASON", then it hangs up)."""
        # Refused part-way, the daemon hung up: its reason is waiting to be read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._sock.sendall(request)
        line = self._reply.readline()
        answer = line.split()
        if answer[:1] == [b"ok"]:
            return answer
        reason = line[6:].strip().decode(errors="replace") if line.startswith(b"error ") else None
        raise UsageError(
            "%s: the mount refused the hints: %s"
            % (self.mountpoint, reason or "no answer (%r)" % line[:80])
        )

    def register(self, paths: Iterable[str | bytes]) -> tuple[int, int]:
        """Send the dataset's paths once (sample i is paths[i]); later orders can then be
        sent as indices with `send_indices`, a few bytes per sample instead of a path.
        Returns (paths the mount knows, paths it does not)."""
        return self._send_paths(b"paths", paths)

    def send_indices(self, indices: Iterable[int]) -> None:
        """Send the upcoming order as indices into the registered paths."""
        order = np.asarray(
            list(indices) if not hasattr(indices, "__len__") else indices, dtype="<u4"
        )
        self._ask(b"indices %d\n" % len(order) + order.tobytes())

    def progress(self, position: int) -> None:
        """The reader has reached `position` in the last order sent."""
        try:
            self._sock.sendall(b"at %d\n" % position)
        except OSError as exc:
            raise UsageError(
                "%s: the hint connection was closed (%s)" % (self.mountpoint, exc.strerror)
            ) from exc

    def close(self) -> None:
        self._reply.close()
        self._sock.close()

    def __enter__(self) -> HintChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve(index: Index, mountpoint: bytes, path: bytes) -> int:
    """Entry id of the regular file at `path` (absolute in the mount or relative), or -1."""
    if path.startswith(b"/"):
        prefix = mountpoint.rstrip(b"/") + b"/"
        if not path.startswith(prefix):
            return -1
        path = path[len(prefix) :]
    entry = 0
    for name in path.split(b"/"):
        if not name or name == b".":
            continue
        if not index.is_dir(entry):
            return -1
        found = index.lookup(entry, name)
        if found is None:
            return -1
        entry = found
    return entry if stat.S_ISREG(index.mode[entry]) else -1


def order_limit(index: Index) -> int:
    """The most paths or indices one order may hold: twice the pack's entries (an epoch
    that samples with replacement), at least 64 Ki. Bounds a connection's memory."""
    return max(2 * index.entry_count, 1 << 16)


class HintError(ValueError):
    """A hint command the daemon refuses; the client gets "error MESSAGE" and the
    connection is closed."""


def bind_hint_socket(path: str) -> socket.socket:
    """Create the listening hint socket at `path`, mode 0600 from the start (bound under a
    umask, never chmod-ed by name). A stale socket of this user at that path is replaced;
    anything else there is left alone and the socket is not created (OSError)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
            raise FileExistsError(errno.EEXIST, "something that is not our socket is there")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.listen(16)
    return sock


async def serve_hints(
    listener: socket.socket, prefetcher: Prefetcher, index: Index, mountpoint: str
) -> None:
    """Accept hint connections on `listener` (from `bind_hint_socket`) until cancelled, at
    most MAX_CONNECTIONS at a time; removes the socket then."""
    import trio

    path = listener.getsockname()
    listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(listener))]
    root = os.fsencode(mountpoint)
    slots = trio.Semaphore(MAX_CONNECTIONS)
    limit = order_limit(index)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            if slots.value == 0:
                await _refuse(stream, "too many hint connections (at most %d)" % MAX_CONNECTIONS)
                return
            async with slots:
                try:
                    await _converse(stream, prefetcher, index, root, limit)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                except HintError as exc:
                    log.warning("refused a hint client: %s", exc)
                    await _refuse(stream, str(exc))

    try:
        await trio.serve_listeners(handle, listeners)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


async def _refuse(stream: Any, message: str) -> None:
    import trio

    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(b"error %s\n" % message.encode())


class _Lines:
    """Lines and fixed-size binary blocks from a trio stream (a bytearray consumed from the
    front, which CPython does in amortised O(1))."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def _more(self) -> bool:
        data = await self.stream.receive_some(1 << 20)
        self.buf += data
        return bool(data)

    async def line(self) -> bytes | None:
        start = 0
        while True:
            end = self.buf.find(b"\n", start, MAX_LINE + 1)
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > MAX_LINE:
                raise HintError("line longer than %d bytes" % MAX_LINE)
            start = len(self.buf)
            if not await self._more():
                return None

    async def block(self, size: int) -> bytes | None:
        while len(self.buf) < size:
            if not await self._more():
                return None
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data


async def _converse(
    stream: Any, prefetcher: Prefetcher, index: Index, root: bytes, limit: int
) -> None:
    reader = _Lines(stream)
    table = np.zeros(0, dtype=np.int64)  # this connection's registered paths, as entries
    while (line := await reader.line()) is not None:
        if line in (b"order", b"paths"):
            entries = await _read_paths(reader, index, root, limit, line.decode())
            if entries is None:
                return
            missing = int((entries < 0).sum())
            if line == b"order":
                prefetcher.set_hints(entries)
            else:
                table = entries
            await stream.send_all(b"ok %d %d\n" % (len(entries) - missing, missing))
        elif line.startswith(b"indices "):
            count = _number(line[8:], line)
            if count > limit:
                raise HintError(
                    "order of %d indices is longer than the limit of %d" % (count, limit)
                )
            raw = await reader.block(4 * count)
            if raw is None:
                return
            indices = np.frombuffer(raw, dtype="<u4")
            if count and int(indices.max()) >= len(table):
                raise HintError(
                    "index %d past the %d registered paths" % (indices.max(), len(table))
                )
            prefetcher.set_hints(table[indices])
            await stream.send_all(b"ok %d\n" % count)
        elif line.startswith(b"at "):
            prefetcher.hint_progress(_number(line[3:], line))
        elif line:
            raise HintError("unknown command %r" % line[:40])


def _number(text: bytes, line: bytes) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise HintError("bad number in %r" % line[:40])
    return int(text)


async def _read_paths(
    reader: _Lines, index: Index, root: bytes, limit: int, command: str
) -> np.ndarray | None:
    """The entries of the paths up to "end", resolved in batches as they arrive (memory:
    8 bytes a path, not the path); None if the client went away."""
    import trio

    batches: list[np.ndarray] = []
    batch: list[bytes] = []
    count = 0
    while (path := await reader.line()) != b"end":
        if path is None:
            return None
        count += 1
        if count > limit:
            raise HintError("%s longer than the limit of %d paths" % (command, limit))
        batch.append(path)
        if len(batch) == RESOLVE_BATCH:
            batches.append(await trio.to_thread.run_sync(_resolve_all, index, root, batch))
            batch = []
    batches.append(await trio.to_thread.run_sync(_resolve_all, index, root, batch))
    return np.concatenate(batches)


def _resolve_all(index: Index, root: bytes, paths: list[bytes]) -> np.ndarray:
    return np.fromiter(
        (resolve(index, root, path) if path else -1 for path in paths),
        dtype=np.int64,
        count=len(paths),
    )
