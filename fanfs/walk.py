"""How `fanfs pack` and `fanfs plan` read a dataset tree: the full walk and the bounded sample.

`TreeWalk` walks SRC breadth-first, children sorted by name bytes (the index's entry order),
with lstat only: symlinks are stored, never followed; sockets, FIFOs and devices are skipped
with a warning; an entry that cannot be listed or stat'ed is an error, or with
--skip-unreadable a warning. It keeps its per-entry state in numpy columns (`Column`) and one
names blob, never in a Python object per entry: about 50 bytes per entry plus its name, so a
10-million-file tree walks in well under 1 GB.

`sample_tree` is what `fanfs plan` and `--codec auto` profile: the same walk while the tree has
at most `max_entries` entries (so the plan of a small tree is exactly today's), else a bounded
sampled walk (`_SampledWalk`) whose time and memory do not grow with the tree. Never imports
trio, pyfuse3 or mpi4py; never reads file contents.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import random
import re
import stat
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from fanfs.errors import PackInputError
from fanfs.format.layout import NAME_MAX
from fanfs.optimizer import FileRef

log = logging.getLogger(__name__)

# Entry flags.
BROADCAST: Final = 1
SKIPPED: Final = 2
# `fanfs plan` and `--codec auto` walk at most this many entries exactly, then sample.
DEFAULT_SAMPLE_ENTRIES: Final = 200_000
# Entries stat'ed and appended to the columns at once.
_BATCH: Final = 4096
# Entries whose regular files are listed at once for the packer.
_FILE_BLOCK: Final = 65536
# lstat calls per task of the walk's thread pool.
_STAT_GROUP: Final = 64


def display(path: bytes) -> str:
    """A path for messages: undecodable bytes shown as \\xNN, never an encode error."""
    return path.decode("utf-8", "backslashreplace")


def unreadable(what: str, exc: OSError, *, skip: bool) -> None:
    """An entry that cannot be read: a PackInputError, or with `skip` (--skip-unreadable) a
    warning (the caller then leaves the entry out)."""
    if not skip:
        raise PackInputError(
            "cannot read %s: %s (use --skip-unreadable to skip it)" % (what, exc.strerror)
        )
    log.warning("skipping unreadable %s: %s", what, exc.strerror)


def glob_to_regex(pattern: str) -> re.Pattern[bytes]:
    """Compile a broadcast glob: `*` and `?` stay within a path segment, `**` spans segments.

    A pattern that matches a directory also covers everything below it (`val` == `val/**`).
    """
    out = []
    segments = pattern.strip("/").split("/")
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == "**":
            out.append(".*" if last else "(?:[^/]*/)*")
            continue
        body = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in seg)
        out.append(body if last else body + "/")
    return re.compile(("^" + "".join(out) + "(?:/.*)?$").encode(), re.DOTALL)


class Column:
    """A growable numpy column. Grows in place (ndarray.resize: realloc, which moves large
    blocks with mremap rather than copying) by a quarter, so at most a quarter of it is slack.

    Never keep a view of `array` across `extend`: the buffer may move.
    """

    __slots__ = ("array", "n")

    def __init__(self, dtype: str) -> None:
        self.array = np.zeros(1024, dtype=dtype)
        self.n = 0

    def extend(self, values: Sequence[int] | np.ndarray) -> None:
        need = self.n + len(values)
        if need > len(self.array):
            grown = max(need, len(self.array) + len(self.array) // 4)
            self.array.resize(grown, refcheck=False)
        self.array[self.n : need] = values
        self.n = need

    @property
    def values(self) -> np.ndarray:
        """The filled part (a view: valid until the next `extend`)."""
        return self.array[: self.n]


class TreeTooLargeError(Exception):
    """The walk passed its `max_entries` (sample_tree then samples instead)."""


def _lstat_group(paths: list[bytes]) -> list[os.stat_result | OSError]:
    out: list[os.stat_result | OSError] = []
    for path in paths:
        try:
            out.append(os.lstat(path))
        except OSError as exc:
            out.append(exc)
    return out


class TreeWalk:
    """The walk of one tree into columns in index entry order (walker ids; entry 0 is SRC).

    Columns: `parent`, `name_off`, `name_len` (into `names`, where a symlink's target follows
    its name), `mode`, `mtime_ns`, `size` (regular file: st_size; symlink: target length;
    directory: 0), `first`/`count` (directory: its children's walker ids, which are
    contiguous), `flags` (BROADCAST, SKIPPED). `skipped` counts entries flagged SKIPPED.
    With a `pool`, a directory's entries are stat'ed by its threads (results in order).
    """

    def __init__(
        self,
        src: str,
        *,
        broadcast: Sequence[str] = (),
        skip_unreadable: bool = False,
        max_entries: int | None = None,
        pool: concurrent.futures.Executor | None = None,
    ) -> None:
        self.src = src
        self.pool = pool
        self.root = os.fsencode(src)
        self.globs = [glob_to_regex(g) for g in broadcast]
        self.skip_unreadable = skip_unreadable
        self.max_entries = max_entries
        self.names = bytearray()
        self.parent = Column("<u4")
        self.name_off = Column("<u8")
        self.name_len = Column("<u2")
        self.mode = Column("<u4")
        self.mtime_ns = Column("<i8")
        self.size = Column("<u8")
        self.first = Column("<u8")
        self.count = Column("<u4")
        self.flags = Column("u1")
        self.skipped = 0
        self.skipped_special = 0
        self.directories = 0

    @property
    def n(self) -> int:
        return self.parent.n

    def walk(self) -> TreeWalk:
        root_st = os.stat(self.root)
        self._append([(0, b"", root_st, 0, b"")])
        dirs = array("Q", [0])
        pos = 0
        while pos < len(dirs):
            dir_id = dirs[pos]
            pos += 1
            first = self.n
            self._scan(dir_id, dirs)
            self.first.array[dir_id] = first
            self.count.array[dir_id] = self.n - first
        return self

    def rel(self, entry: int) -> bytes:
        """The entry's path relative to SRC (O(depth))."""
        parts = []
        names, name_off, name_len, parent = (
            self.names,
            self.name_off.array,
            self.name_len.array,
            self.parent.array,
        )
        while entry:
            off = int(name_off[entry])
            parts.append(bytes(names[off : off + int(name_len[entry])]))
            entry = int(parent[entry])
        return b"/".join(reversed(parts))

    def path(self, rel: bytes) -> bytes:
        return self.root + b"/" + rel if rel else self.root

    def _scan(self, dir_id: int, dirs: array[int]) -> None:
        self.directories += 1
        rel = self.rel(dir_id)
        path = self.path(rel)
        room = None if self.max_entries is None else self.max_entries - self.n
        try:
            with os.scandir(path) as it:
                names = []
                for entry in it:
                    names.append(entry.name)
                    if room is not None and len(names) > room:
                        raise TreeTooLargeError
            names.sort()
        except OSError as exc:
            self._unreadable(rel, exc, root=dir_id == 0)
            self.flags.array[dir_id] |= SKIPPED
            self.skipped += 1
            return
        parent_bcast = int(self.flags.array[dir_id]) & BROADCAST
        for start in range(0, len(names), _BATCH):  # a huge directory: bounded state at once
            part = names[start : start + _BATCH]
            batch: list[tuple[int, bytes, os.stat_result, int, bytes]] = []
            for name, st in zip(
                part, self._lstat_all([path + b"/" + n for n in part]), strict=True
            ):
                child = rel + b"/" + name if rel else name
                if isinstance(st, OSError):
                    # A directory that can be listed but not searched (mode r--): report it.
                    self._unreadable(child, st, root=False)
                    continue
                mode = st.st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                    log.warning(
                        "skipping %s: not a regular file, directory or symlink", display(child)
                    )
                    self.skipped_special += 1
                    continue
                if len(name) > NAME_MAX:
                    raise PackInputError(
                        "name longer than %d bytes: %s" % (NAME_MAX, display(child))
                    )
                bcast = parent_bcast or any(g.match(child) for g in self.globs)
                target = os.readlink(path + b"/" + name) if stat.S_ISLNK(mode) else b""
                if stat.S_ISDIR(mode):
                    dirs.append(self.n + len(batch))
                batch.append((dir_id, name, st, BROADCAST if bcast else 0, target))
            self._append(batch)

    def _lstat_all(self, paths: list[bytes]) -> list[os.stat_result | OSError]:
        """lstat of every path, in order; with a pool, groups of them in its threads (many
        metadata round trips in flight on a parallel filesystem)."""
        if self.pool is None or len(paths) <= _STAT_GROUP:
            return _lstat_group(paths)
        futures = [
            self.pool.submit(_lstat_group, paths[i : i + _STAT_GROUP])
            for i in range(0, len(paths), _STAT_GROUP)
        ]
        return [st for future in futures for st in future.result()]

    def _append(self, batch: list[tuple[int, bytes, os.stat_result, int, bytes]]) -> None:
        offs, sizes = [], []
        for _, name, st, _, target in batch:
            offs.append(len(self.names))
            self.names += name
            self.names += target
            sizes.append(
                st.st_size if stat.S_ISREG(st.st_mode) else len(target)  # directory: b""
            )
        self.parent.extend([b[0] for b in batch])
        self.name_off.extend(offs)
        self.name_len.extend([len(b[1]) for b in batch])
        self.mode.extend([b[2].st_mode for b in batch])
        self.mtime_ns.extend([b[2].st_mtime_ns for b in batch])
        self.size.extend(sizes)
        self.first.extend([0] * len(batch))
        self.count.extend([0] * len(batch))
        self.flags.extend([b[3] for b in batch])

    def _unreadable(self, rel: bytes, exc: OSError, *, root: bool) -> None:
        unreadable(display(rel) or self.src, exc, skip=self.skip_unreadable and not root)

    def regular_files(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Walker ids of the regular files not skipped, in entry order (of ids start..stop)."""
        kinds = self.mode.values[start:stop] & 0o170000
        alive = (self.flags.values[start:stop] & SKIPPED) == 0
        return np.flatnonzero((kinds == stat.S_IFREG) & alive) + start

    def regular_file_blocks(self) -> Iterator[np.ndarray]:
        """`regular_files` a block of entries at a time (no array of every file's id)."""
        for start in range(0, self.n, _FILE_BLOCK):
            yield self.regular_files(start, start + _FILE_BLOCK)

    def file_paths(self, ids: np.ndarray) -> Iterator[tuple[int, bytes, bytes]]:
        """(walker id, rel, path) of `ids` (in entry order: the files of a directory are
        contiguous, so each directory's path is built once)."""
        last_parent, dir_rel = -1, b""
        names, name_off, name_len, parent = (
            self.names,
            self.name_off.array,
            self.name_len.array,
            self.parent.array,
        )
        for entry in ids.tolist():
            p = int(parent[entry])
            if p != last_parent:
                last_parent, dir_rel = p, self.rel(p)
            off = int(name_off[entry])
            name = bytes(names[off : off + int(name_len[entry])])
            rel = dir_rel + b"/" + name if dir_rel else name
            yield entry, rel, self.root + b"/" + rel

    def file_refs(self) -> list[FileRef]:
        sizes = self.size.array
        return [
            FileRef(rel, path, int(sizes[entry]))
            for entry, rel, path in self.file_paths(self.regular_files())
        ]


def walk_tree(src: str, *, skip_unreadable: bool = False) -> list[FileRef]:
    """Every regular file under `src`, walked exactly as `fanfs pack` walks (unbounded)."""
    return TreeWalk(src, skip_unreadable=skip_unreadable).walk().file_refs()


# --- the bounded sample of `fanfs plan` -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeSample:
    """What `sample_tree` saw.

    Attributes:
        files: regular files, each file of the tree equally likely to be here, in entry order.
        complete: `files` is every regular file (the tree had at most `max_entries` entries).
        examined: directory entries listed or stat'ed.
        est_files, est_bytes: the tree's regular files and their bytes (exact if complete).
        truncated: the sample missed part of the tree (a directory listed only in part, or
            levels below the budget's reach): the estimates are then low.
    """

    files: list[FileRef]
    complete: bool
    examined: int
    directories: int
    est_files: float
    est_bytes: float
    truncated: bool = False


def sample_tree(
    src: str,
    *,
    max_entries: int = DEFAULT_SAMPLE_ENTRIES,
    seed: int = 0,
    skip_unreadable: bool = False,
) -> TreeSample:
    """The regular files of `src` for profiling: all of them, walked exactly as `fanfs pack`
    walks, while there are at most `max_entries` entries; else a seeded sample from a walk of
    at most `max_entries` more entries (`_SampledWalk`). Memory and time are bounded by
    `max_entries` whatever the tree's size."""
    exact = _exact_sample(src, max_entries, skip_unreadable)
    if isinstance(exact, TreeSample):
        return exact
    return _SampledWalk(src, max_entries, seed, skip_unreadable).run(exact)


def sample_walked(tree: TreeWalk, *, max_entries: int, seed: int) -> TreeSample:
    """What `sample_tree` takes, for a tree `fanfs pack` has just walked: its files if it has
    at most `max_entries` entries, else a sampled walk that reports nothing (the pack's walk
    has reported every special or unreadable entry once already)."""
    if tree.n > max_entries:
        return _SampledWalk(tree.src, max_entries, seed, True, quiet=True).run(0)
    files = tree.file_refs()
    return TreeSample(files, True, tree.n, tree.directories, len(files), sum(f.size for f in files))


def _exact_sample(src: str, max_entries: int, skip_unreadable: bool) -> TreeSample | int:
    """Every file, walked as `fanfs pack` walks; or the entries seen before passing
    `max_entries` (the walk's columns are freed on return)."""
    walk = TreeWalk(src, skip_unreadable=skip_unreadable, max_entries=max_entries)
    try:
        walk.walk()
    except TreeTooLargeError:
        return walk.n
    files = walk.file_refs()
    return TreeSample(files, True, walk.n, walk.directories, len(files), sum(f.size for f in files))


class _SampledWalk:
    """A bounded walk that samples: level by level (depth), each level's directories are
    listed in a seeded random order until the level has used half the remaining budget; in
    each directory listed, a random subset of its regular files (up to a quarter of the
    level's allowance) is stat'ed. Every sampled
    file carries the inverse of its inclusion probability (directories: level size / listed,
    files: files in the directory / stat'ed), so sums of weights estimate the tree's totals
    (Horvitz-Thompson); thinning by weight then leaves a sample in which every file of the
    tree was equally likely, which is what the optimizer's per-class sampling expects.
    File types come from the directory listing (d_type), so only sampled files are stat'ed.
    """

    def __init__(
        self, src: str, budget: int, seed: int, skip_unreadable: bool, *, quiet: bool = False
    ) -> None:
        self.src = src
        self.quiet = quiet  # unreadable directories pass silently (already reported)
        self.root = os.fsencode(src)
        self.budget = budget
        self.rng = random.Random(seed)
        self.skip_unreadable = skip_unreadable
        self.examined = 0
        self.directories = 0
        self.truncated = False

    def run(self, examined_before: int) -> TreeSample:
        frontier: list[tuple[bytes, float]] = [(b"", 1.0)]
        picked: list[tuple[bytes, int, float]] = []  # rel, size, weight
        while frontier:
            remaining = self.budget - self.examined
            if remaining <= 0:
                self.truncated = True
                break
            frontier = self._level(frontier, max(remaining // 2, 1), picked)
        heaviest = max((w for _, _, w in picked), default=1.0)
        kept = [(rel, size) for rel, size, w in picked if self.rng.random() * heaviest < w]
        kept.sort(key=lambda f: (f[0].count(b"/"), f[0].split(b"/")))  # entry order
        return TreeSample(
            [FileRef(rel, self.root + b"/" + rel, size) for rel, size in kept],
            False,
            examined_before + self.examined,
            self.directories,
            sum(w for _, _, w in picked),
            sum(w * size for _, size, w in picked),
            self.truncated,
        )

    def _level(
        self,
        level: list[tuple[bytes, float]],
        allowance: int,
        picked: list[tuple[bytes, int, float]],
    ) -> list[tuple[bytes, float]]:
        order = list(range(len(level)))
        self.rng.shuffle(order)
        per_dir_files = max(64, allowance // 4)
        start = self.examined
        listed: list[tuple[list[tuple[bytes, int, float]], list[bytes], float]] = []
        for i in order:
            if listed and self.examined - start >= allowance:
                break  # the rest of the level is represented by the listed (weights)
            rel, weight = level[i]
            # The level's allowance decides whether to start a directory, never where a
            # listing stops (a partial listing would bias the estimate): only the whole
            # budget does.
            files, subdirs = self._list(rel, self.budget - self.examined)
            chosen = self.rng.sample(files, min(len(files), per_dir_files))
            sized = self._sizes(chosen, len(files) / max(len(chosen), 1))
            listed.append((sized, subdirs, weight))
        scale = len(level) / max(len(listed), 1)  # each directory's inclusion: listed / level
        nxt: list[tuple[bytes, float]] = []
        for sized, subdirs, weight in listed:
            w = weight * scale
            picked.extend((rel, size, w * f) for rel, size, f in sized)
            nxt.extend((sub, w) for sub in subdirs)
        return nxt

    def _list(self, rel: bytes, cap: int) -> tuple[list[bytes], list[bytes]]:
        """(regular files, subdirectories) of one directory, from at most `cap` names."""
        self.directories += 1
        files: list[bytes] = []
        subdirs: list[bytes] = []
        path = self.root + b"/" + rel if rel else self.root
        try:
            with os.scandir(path) as it:
                for entry in it:
                    self.examined += 1
                    child = rel + b"/" + entry.name if rel else entry.name
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(child)
                    elif entry.is_file(follow_symlinks=False):
                        files.append(child)
                    if len(files) + len(subdirs) >= max(cap, 1):
                        self.truncated = True
                        break
        except OSError as exc:
            if not self.quiet:
                unreadable(display(rel) or self.src, exc, skip=self.skip_unreadable and bool(rel))
        files.sort()
        subdirs.sort()
        return files, subdirs

    def _sizes(self, rels: list[bytes], factor: float) -> list[tuple[bytes, int, float]]:
        out = []
        for rel in rels:
            self.examined += 1
            try:
                st = os.lstat(self.root + b"/" + rel)
            except OSError:
                continue  # gone or unreadable: the full pack walk reports it
            if stat.S_ISREG(st.st_mode):
                out.append((rel, st.st_size, factor))
        return out
