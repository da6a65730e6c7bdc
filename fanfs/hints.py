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
import logging
import os
import socket
import stat
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from fanfs.errors import UsageError

if TYPE_CHECKING:
    from fanfs.format.index import Index
    from fanfs.prefetch import Prefetcher

log = logging.getLogger(__name__)

XATTR: Final = "user.fanfs.hints"
MAX_LINE: Final = 64 * 1024
MAX_INDICES: Final = 1 << 31


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
        self._sock.sendall(b"\n".join(lines))
        answer = self._reply.readline().split()
        if len(answer) != 3 or answer[0] != b"ok":
            raise UsageError(
                "%s: the mount refused the hints (%r)" % (self.mountpoint, b" ".join(answer))
            )
        return int(answer[1]), int(answer[2])

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
        self._sock.sendall(b"indices %d\n" % len(order) + order.tobytes())
        answer = self._reply.readline().split()
        if not answer or answer[0] != b"ok":
            raise UsageError(
                "%s: the mount refused the order (%r)" % (self.mountpoint, b" ".join(answer))
            )

    def progress(self, position: int) -> None:
        """The reader has reached `position` in the last order sent."""
        self._sock.sendall(b"at %d\n" % position)

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


async def serve_hints(prefetcher: Prefetcher, index: Index, mountpoint: str, path: str) -> None:
    """Accept hint connections on the Unix socket `path` until cancelled; removes it then."""
    import trio

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener_sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener_sock.bind(path)
    os.chmod(path, 0o600)
    listener_sock.listen(16)
    listeners = [trio.SocketListener(listener_sock)]
    root = os.fsencode(mountpoint)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                await _converse(stream, prefetcher, index, root)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            except ValueError as exc:
                log.warning("hint client sent a bad command (%s); connection closed", exc)

    try:
        await trio.serve_listeners(handle, listeners)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


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
            end = self.buf.find(b"\n", start)
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > MAX_LINE:
                raise ValueError("line longer than %d bytes" % MAX_LINE)
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


async def _converse(stream: Any, prefetcher: Prefetcher, index: Index, root: bytes) -> None:
    import trio

    reader = _Lines(stream)
    table = np.zeros(0, dtype=np.int64)  # this connection's registered paths, as entries
    while (line := await reader.line()) is not None:
        if line in (b"order", b"paths"):
            paths = []
            while (path := await reader.line()) != b"end":
                if path is None:
                    return
                paths.append(path)
            entries = await trio.to_thread.run_sync(_resolve_all, index, root, paths)
            missing = int((entries < 0).sum())
            if line == b"order":
                prefetcher.set_hints(entries)
            else:
                table = entries
            await stream.send_all(b"ok %d %d\n" % (len(entries) - missing, missing))
        elif line.startswith(b"indices "):
            count = int(line[8:])
            if not 0 <= count <= MAX_INDICES:
                raise ValueError("bad index count %d" % count)
            raw = await reader.block(4 * count)
            if raw is None:
                return
            indices = np.frombuffer(raw, dtype="<u4")
            if count and int(indices.max()) >= len(table):
                raise ValueError(
                    "index %d past the %d registered paths" % (indices.max(), len(table))
                )
            prefetcher.set_hints(table[indices])
            await stream.send_all(b"ok %d\n" % count)
        elif line.startswith(b"at "):
            prefetcher.hint_progress(int(line[3:]))
        elif line:
            raise ValueError("unknown command %r" % line[:40])


def _resolve_all(index: Index, root: bytes, paths: list[bytes]) -> np.ndarray:
    return np.fromiter(
        (resolve(index, root, path) if path else -1 for path in paths),
        dtype=np.int64,
        count=len(paths),
    )
