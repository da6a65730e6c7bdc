"""Read /proc/self/mountinfo: which paths are mounted, and as what; and whether a path can
become a mountpoint.

`os.path.ismount` misreports dead FUSE mounts both ways (STYLE.md A8.1); this does not.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from fanfs.errors import MountSetupError


@dataclass(frozen=True, slots=True)
class MountEntry:
    mountpoint: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(table: str = "/proc/self/mountinfo") -> list[MountEntry]:
    """Every mount in `table`: this process's mount namespace, or another process's
    (`/proc/PID/mountinfo`)."""
    entries = []
    with open(table, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            entries.append(
                MountEntry(_unescape(fields[4]), fields[sep + 1], _unescape(fields[sep + 2]))
            )
    return entries


def mounts_under(
    base: str, *, source: str | None = None, table: str = "/proc/self/mountinfo"
) -> list[MountEntry]:
    """Mounts at or under the directory `base` (from `source` only, if given), in order."""
    prefix = os.path.abspath(base).rstrip("/") + "/"
    return [
        entry
        for entry in mounts(table)
        if (entry.mountpoint + "/").startswith(prefix)
        and (source is None or entry.source == source)
    ]


def find_mount(path: str) -> MountEntry | None:
    """The mount whose mountpoint is exactly `path` (resolved without touching it), or None."""
    target = os.path.abspath(path)
    found = None
    for entry in mounts():
        if entry.mountpoint == target:
            found = entry  # the last one listed is on top
    return found


def wait_mounted(path: str, timeout_s: float) -> bool:
    """Wait until a fanfs mount at `path` answers (cluster mode: every rank passes a barrier
    before serving, so one answering mount means the whole job is mounted)."""
    deadline = time.monotonic() + timeout_s
    step = 0.05
    while True:
        entry = find_mount(path)
        if entry is not None and entry.fstype == "fuse.fanfs":
            try:
                os.statvfs(path)
                return True
            except OSError:
                pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(step, max(0.0, deadline - time.monotonic())))
        step = min(step * 2, 1.0)


def check_mountpoint(path: str) -> None:
    """Refuse a missing, non-directory, already mounted or non-empty mountpoint."""
    if find_mount(path) is not None:
        raise MountSetupError(
            "%s is already a mount point (unmount it first: fanfs umount %s)" % (path, path)
        )
    try:
        entries = os.listdir(path)
    except FileNotFoundError:
        raise MountSetupError("mountpoint %s does not exist" % path) from None
    except NotADirectoryError:
        raise MountSetupError("mountpoint %s is not a directory" % path) from None
    except OSError as exc:
        raise MountSetupError("cannot use mountpoint %s: %s" % (path, exc.strerror)) from exc
    if entries:
        raise MountSetupError("mountpoint %s is not empty" % path)
