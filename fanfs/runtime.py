"""Directories and files a root daemon writes: never through another user's symlink.

A mount runs as root on shared nodes, next to other users who can write /tmp and often the
scratch filesystem that holds the cache dir. So every directory fanfs writes into is either
created by it with mode 0700 or checked to be one only its user (or root) can change, and
every file it creates there is opened with O_NOFOLLOW (and O_EXCL where it is new), so that a
planted symlink is refused instead of followed (docs/security.md).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from typing import TYPE_CHECKING, Final

from fanfs.errors import MountSetupError

if TYPE_CHECKING:
    import numpy as np

_RUNTIME_ADVICE: Final = "remove it, or set XDG_RUNTIME_DIR"
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# The environment variable that turns on a mount's decode trace (a path prefix:
# `store.ChunkStore.write_decode_trace`, `read_decode_trace`), for benchmarks and the
# plan's sample mount.
DECODE_TRACE_ENV: Final = "FANFS_DECODE_TRACE"


def runtime_dir() -> str:
    """The per-user directory for daemon logs and hint sockets: `$XDG_RUNTIME_DIR/fanfs` when
    that variable names a directory of this user, else `TMPDIR/fanfs-UID`; created mode 0700,
    refused (MountSetupError) if it exists and is not a private directory of this user."""
    uid = os.geteuid()
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isabs(base):
        try:
            info = os.stat(base)
        except OSError:
            info = None
        # sudo keeps the caller's XDG_RUNTIME_DIR: root must not write into a user's.
        if info is not None and stat.S_ISDIR(info.st_mode) and info.st_uid == uid:
            return private_dir(os.path.join(base, "fanfs"), advice=_RUNTIME_ADVICE)
    return private_dir(
        os.path.join(tempfile.gettempdir(), "fanfs-%d" % uid), advice=_RUNTIME_ADVICE
    )


def private_dir(path: str, *, advice: str = "remove it") -> str:
    """Create `path` mode 0700, or check that the existing one is a directory (not a
    symlink) owned by this user; a looser mode on it is tightened to 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise MountSetupError("cannot use %s: %s" % (path, exc.strerror)) from exc
    problem = _unsafe(info, private=True)
    if problem and problem.startswith("its mode"):
        # Ours, but made with a looser mode (an older fanfs, a umask): only its owner (or
        # root) can change it, and in a sticky or private parent only they can swap it.
        os.chmod(path, 0o700, follow_symlinks=False)
        problem = None
    if problem:
        raise MountSetupError(
            "refusing to use %s: %s (it must be a directory of uid %d with mode 0700; %s)"
            % (path, problem, os.geteuid(), advice)
        )
    return path


def check_writable_by_owner_only(path: str, what: str) -> None:
    """Refuse a directory that a user other than this one or root could change: one whose
    entries someone else could rename or replace with a symlink under the daemon."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise MountSetupError("cannot use %s %s: %s" % (what, path, exc.strerror)) from exc
    problem = _unsafe(info, private=False)
    if problem:
        raise MountSetupError(
            "refusing to use %s %s: %s (other users could replace what fanfs writes there; "
            "use a directory only you can write)" % (what, path, problem)
        )


def _unsafe(info: os.stat_result, *, private: bool) -> str | None:
    uid = os.geteuid()
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    if private:
        if info.st_uid != uid:
            return "it is owned by uid %d" % info.st_uid
        if info.st_mode & 0o077:
            return "its mode is %04o" % stat.S_IMODE(info.st_mode)
        return None
    if info.st_uid not in (uid, 0):
        return "it is owned by uid %d" % info.st_uid
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        return "it is writable by %s" % ("others" if info.st_mode & 0o002 else "its group")
    return None


def open_append(path: str) -> int:
    """Open a log file for appending, creating it mode 0600; never through a symlink."""
    return os.open(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )


def create_new(path: str) -> int:
    """Create `path` for writing, mode 0600: a stale file (or a planted symlink) of that name
    is removed first, and the new one is created exclusively, so nothing is followed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, _NEW_FILE, 0o600)


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data`: written to a new `path.tmp`, then renamed over it."""
    tmp = path + ".tmp"
    with os.fdopen(create_new(tmp), "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_decode_trace(path: str | os.PathLike[str]) -> np.ndarray:
    """A serving process's decode trace (`DECODE_TRACE_ENV`): its (chunk id, CPU ns) pairs,
    an int64 numpy array of shape (decodes, 2). ValueError if the file is torn."""
    import numpy as np  # (lazily: every command's runtime paths import this module)

    flat = np.fromfile(path, dtype=np.int64)
    if flat.size % 2:
        raise ValueError("decode trace %s is torn" % os.fspath(path))
    return flat.reshape(-1, 2)
