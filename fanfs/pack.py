"""`fanfs pack SRC OUT`: walk a dataset tree, compress it in parallel, write a pack.

Pipeline: a breadth-first walk (lstat only, symlinks never followed) builds the tree in the
index's entry order; with `--codec auto` the optimizer then profiles a sample and picks a codec
(and maybe a dictionary, for zstd or lz4) per class of files; chunks are read and compressed by
a thread pool (the codecs and reads release the GIL) and consumed strictly in order, so the
pack is deterministic whatever `--jobs` is; `PackWriter` places them; the index and manifest
come last, into a temporary directory that is renamed over OUT only when complete. Never
imports trio, pyfuse3 or mpi4py."""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import logging
import math
import os
import re
import shutil
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from fanfs import __version__
from fanfs._progress import Progress
from fanfs._sizes import format_size, parse_size
from fanfs.compression import CodecSpec, chunk_codec_name, compress_object
from fanfs.errors import PackInputError, UsageError
from fanfs.format.layout import MANIFEST_NAME, NAME_MAX, bind_chunk_crc, chunk_count
from fanfs.format.writer import PackWriter
from fanfs.optimizer import FileRef, Plan, PlanSettings, class_of, make_plan, plan_record
from fanfs.plan import plan_table, settings_from_args

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE: Final = 1024 * 1024
# Default partition count: one per this many source bytes, at least MIN_PARTITIONS (so small
# packs still spread over a few nodes) and at most MAX_PARTITIONS.
PARTITION_TARGET_BYTES: Final = 128 * 1024 * 1024
MIN_PARTITIONS: Final = 16
MAX_PARTITIONS: Final = 4096


@dataclass(frozen=True, slots=True)
class PackOptions:
    src: str
    out: str
    codec: CodecSpec
    chunk_size: int = DEFAULT_CHUNK_SIZE
    partitions: int | None = None
    broadcast: tuple[str, ...] = ()
    jobs: int = 0
    quiet: bool = False
    force: bool = False
    skip_unreadable: bool = False
    auto: PlanSettings | None = None  # --codec auto: plan with these settings; `codec` unused


class PlanInfeasibleError(UsageError):
    """`--codec auto` cannot meet its constraint; `plan` is the closest plan."""

    def __init__(self, message: str, plan: Plan) -> None:
        super().__init__(message)
        self.plan = plan


@dataclass(slots=True)
class _Node:
    path: bytes  # absolute path, for reading
    rel: bytes  # path relative to SRC, for messages and broadcast globs
    name: bytes
    parent: int
    st: os.stat_result
    broadcast: bool
    children: list[int] = field(default_factory=list)
    target: bytes = b""
    chunks: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    skipped: bool = False
    spec: CodecSpec | None = None  # None: the pack's --codec
    dict_id: int = 0
    dictionary: bytes | None = None
    cls: str = ""  # optimizer class, with --codec auto


def display(path: bytes) -> str:
    """A path for messages: undecodable bytes shown as \\xNN, never an encode error."""
    return path.decode("utf-8", "backslashreplace")


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


class _Walker:
    """Breadth-first walk of SRC into `_Node`s in index entry order."""

    def __init__(self, opts: PackOptions) -> None:
        self.opts = opts
        self.globs = [glob_to_regex(g) for g in opts.broadcast]
        self.nodes: list[_Node] = []
        self.skipped_special = 0

    def walk(self) -> list[_Node]:
        src = os.fsencode(self.opts.src)
        root_st = os.stat(src)
        self.nodes.append(_Node(src, b"", b"", 0, root_st, False))
        queue = collections.deque([0])
        while queue:
            dir_id = queue.popleft()
            for child in self._scan(dir_id):
                if stat.S_ISDIR(self.nodes[child].st.st_mode):
                    queue.append(child)
        return self.nodes

    def _scan(self, dir_id: int) -> list[int]:
        node = self.nodes[dir_id]
        try:
            with os.scandir(node.path) as it:
                names = sorted(entry.name for entry in it)
        except OSError as exc:
            self._unreadable(node, exc)
            return []
        for name in names:
            self._add(dir_id, name)
        return node.children

    def _add(self, dir_id: int, name: bytes) -> None:
        parent = self.nodes[dir_id]
        path = parent.path + b"/" + name
        rel = parent.rel + b"/" + name if parent.rel else name
        try:
            st = os.lstat(path)
        except OSError as exc:
            # A directory that can be listed but not searched (mode r--): report the entry.
            self._unreadable(_Node(path, rel, name, dir_id, parent.st, False), exc)
            return
        mode = st.st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            log.warning("skipping %s: not a regular file, directory or symlink", display(rel))
            self.skipped_special += 1
            return
        if len(name) > NAME_MAX:
            raise PackInputError("name longer than %d bytes: %s" % (NAME_MAX, display(rel)))
        broadcast = parent.broadcast or any(g.match(rel) for g in self.globs)
        node = _Node(path, rel, name, dir_id, st, broadcast)
        if stat.S_ISLNK(mode):
            node.target = os.readlink(path)
        parent.children.append(len(self.nodes))
        self.nodes.append(node)

    def _unreadable(self, node: _Node, exc: OSError) -> None:
        what = display(node.rel) or self.opts.src
        if not self.opts.skip_unreadable or node is self.nodes[0]:
            raise PackInputError(
                "cannot read %s: %s (use --skip-unreadable to skip it)" % (what, exc.strerror)
            )
        log.warning("skipping unreadable %s: %s", what, exc.strerror)
        node.skipped = True


def walk_tree(src: str, *, skip_unreadable: bool = False) -> list[FileRef]:
    """The regular files under `src`, walked exactly as `fanfs pack` walks (for `fanfs plan`)."""
    opts = PackOptions(src=src, out="", codec=CodecSpec(0, 0), skip_unreadable=skip_unreadable)
    return _file_refs(_Walker(opts).walk())


def _file_refs(nodes: list[_Node]) -> list[FileRef]:
    return [
        FileRef(n.rel, n.path, n.st.st_size)
        for n in nodes
        if stat.S_ISREG(n.st.st_mode) and not n.skipped
    ]


def _read_and_compress(
    node: _Node, chunk_no: int, chunk_size: int, spec: CodecSpec
) -> tuple[int, bytes, int] | OSError:
    """Worker: read one chunk of a file and compress it. Returns (codec, stored, crc32).

    OSError is returned, not raised, so the consumer can apply --skip-unreadable in order.
    """
    size = node.st.st_size
    offset = chunk_no * chunk_size
    length = min(chunk_size, size - offset)
    try:
        fd = os.open(node.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return exc
    try:
        data = os.pread(fd, length, offset)
        now = os.fstat(fd).st_size
        last = offset + length >= size
        if len(data) != length or now != size or (last and os.pread(fd, 1, offset + length)):
            raise PackInputError(
                "file changed while being packed: %s (size was %d, now %d)"
                % (display(node.rel), size, now)
            )
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
    codec, stored = compress_object(data, node.spec or spec, node.dictionary)
    return codec, stored, zlib.crc32(stored)


def _chunk_tasks(nodes: list[_Node], chunk_size: int) -> Iterator[tuple[_Node, int]]:
    for node in nodes:
        if stat.S_ISREG(node.st.st_mode) and not node.skipped:
            for chunk_no in range(chunk_count(node.st.st_size, chunk_size)):
                yield node, chunk_no


def default_partitions(total_bytes: int, chunk_count: int) -> int:
    by_size = math.ceil(total_bytes / PARTITION_TARGET_BYTES)
    return max(1, min(MAX_PARTITIONS, max(by_size, min(MIN_PARTITIONS, chunk_count))))


class Packer:
    """One run of `fanfs pack`. Call `run()`; it returns the manifest it wrote."""

    def __init__(self, opts: PackOptions) -> None:
        self.opts = opts
        self.jobs = opts.jobs or os.cpu_count() or 1
        self.codec_stats: dict[str, list[int]] = {}
        self.class_stats: dict[str, list[int]] = {}
        self.plan: Plan | None = None

    def run(self) -> dict[str, Any]:
        out = os.path.abspath(self.opts.out)
        nodes = _Walker(self.opts).walk()
        if self.opts.auto is not None:
            self._make_plan(nodes, self.opts.auto)
        tmp = os.path.join(
            os.path.dirname(out), ".%s.fanfs-tmp-%d" % (os.path.basename(out), os.getpid())
        )
        os.mkdir(tmp)
        try:
            manifest = self._write(tmp, nodes)
            _replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return manifest

    def _write(self, tmp: str, nodes: list[_Node]) -> dict[str, Any]:
        tasks = list(_chunk_tasks(nodes, self.opts.chunk_size))
        regular = sum(1 for node, _ in tasks if not node.broadcast)
        bytes_total = sum(n.st.st_size for n in nodes if stat.S_ISREG(n.st.st_mode))
        bcast_bytes = sum(n.st.st_size for n in nodes if stat.S_ISREG(n.st.st_mode) and n.broadcast)
        partitions = self.opts.partitions or default_partitions(bytes_total - bcast_bytes, regular)
        bcast_parts = default_partitions(bcast_bytes, len(tasks) - regular) if bcast_bytes else 0
        writer = PackWriter(tmp, partitions, bcast_parts)
        try:
            self._apply_plan(writer, nodes)
            self._compress_all(writer, tasks, bytes_total)
            columns = _build_columns(nodes, self.opts.chunk_size)
            return writer.finish(columns, self._manifest_fields(nodes, columns, partitions))
        except BaseException:
            writer.abort()
            raise

    def _make_plan(self, nodes: list[_Node], settings: PlanSettings) -> None:
        plan = make_plan(_file_refs(nodes), settings, chunk_size=self.opts.chunk_size)
        if not plan.selection.feasible:
            raise PlanInfeasibleError(plan.selection.problem, plan)
        self.plan = plan

    def _apply_plan(self, writer: PackWriter, nodes: list[_Node]) -> None:
        """Give every file its class's codec; store the dictionaries the plan uses."""
        if self.plan is None:
            return
        known = self.plan.class_names
        dict_ids: dict[str, int] = {}
        for prof in self.plan.profiles:
            spec, dictionary = self.plan.choice(prof.name)
            if dictionary is not None:
                dict_ids[prof.name] = writer.add_dictionary(dictionary, prof.name)
        for node in nodes:
            if stat.S_ISREG(node.st.st_mode):
                node.cls = class_of(node.rel, known)
                node.spec, node.dictionary = self.plan.choice(node.cls)
                node.dict_id = dict_ids.get(node.cls, 0)

    def _compress_all(self, writer: PackWriter, tasks: list[tuple[_Node, int]], total: int) -> None:
        progress = Progress(total, len(tasks), enabled=not self.opts.quiet and sys.stderr.isatty())
        window = self.jobs * 8
        spec, chunk_size = self.opts.codec, self.opts.chunk_size
        pending: collections.deque[tuple[_Node, concurrent.futures.Future[Any]]] = (
            collections.deque()
        )
        todo = iter(tasks)
        with concurrent.futures.ThreadPoolExecutor(self.jobs, thread_name_prefix="pack") as pool:
            try:
                while True:
                    while len(pending) < window and (task := next(todo, None)) is not None:
                        node, chunk_no = task
                        future = pool.submit(_read_and_compress, node, chunk_no, chunk_size, spec)
                        pending.append((node, future))
                    if not pending:
                        break
                    node, future = pending.popleft()
                    self._consume(writer, node, future.result(), progress)
            except BaseException:
                for _, future in pending:
                    future.cancel()
                raise
            finally:
                progress.close()

    def _consume(
        self,
        writer: PackWriter,
        node: _Node,
        result: tuple[int, bytes, int] | OSError,
        progress: Progress,
    ) -> None:
        if node.skipped:
            return
        if isinstance(result, OSError):
            if not self.opts.skip_unreadable:
                raise PackInputError(
                    "cannot read %s: %s (use --skip-unreadable to skip it)"
                    % (display(node.rel), result.strerror)
                )
            log.warning("skipping unreadable %s: %s", display(node.rel), result.strerror)
            node.skipped = True
            return
        codec, stored, crc = result
        partition, offset = writer.add_chunk(stored, node.broadcast)
        # Raw chunks (the incompressible fallback) never refer to the dictionary.
        dict_id = node.dict_id if codec != 0 else 0
        node.chunks.append((partition, offset, len(stored), codec, crc, dict_id))
        usize = min(
            self.opts.chunk_size, node.st.st_size - (len(node.chunks) - 1) * self.opts.chunk_size
        )
        name = chunk_codec_name(codec) + ("+dict" if dict_id else "")
        for table, key in ((self.codec_stats, name), (self.class_stats, node.cls)):
            stats = table.setdefault(key, [0, 0, 0])
            stats[0] += 1
            stats[1] += usize
            stats[2] += len(stored)
        progress.advance(usize)

    def _manifest_fields(
        self, nodes: list[_Node], columns: dict[str, np.ndarray], partitions: int
    ) -> dict[str, Any]:
        kinds = columns["mode"] & 0o170000
        files = int(np.count_nonzero(kinds == stat.S_IFREG))
        return {
            "created_by": "fanfs %s" % __version__,
            "chunk_size": self.opts.chunk_size,
            "options": {
                "codec": "auto" if self.plan else str(self.opts.codec),
                "partitions": partitions,
                "broadcast": list(self.opts.broadcast),
                "chunk_size": self.opts.chunk_size,
            },
            "totals": {
                "files": files,
                "dirs": int(np.count_nonzero(kinds == stat.S_IFDIR)),
                "symlinks": int(np.count_nonzero(kinds == stat.S_IFLNK)),
                "bytes_in": int(columns["size"][kinds == stat.S_IFREG].sum()),
                "bytes_out": int(columns["csize"].sum()),
                "skipped": sum(1 for n in nodes if n.skipped),
            },
            "codec_stats": {
                name: {"chunks": c, "bytes_in": b_in, "bytes_out": b_out}
                for name, (c, b_in, b_out) in sorted(self.codec_stats.items())
            },
            "plan": self._plan_record(),
        }

    def _plan_record(self) -> dict[str, Any] | None:
        """The plan as planned, plus what each class realised (`fanfs inspect`)."""
        if self.plan is None:
            return None
        record = plan_record(self.plan)
        for row in record["classes"]:
            chunks, b_in, b_out = self.class_stats.get(row["class"], [0, 0, 0])
            row["realised"] = {
                "chunks": chunks,
                "bytes_in": b_in,
                "bytes_out": b_out + row["dictionary_bytes"],
            }
        return record


def _build_columns(nodes: list[_Node], chunk_size: int) -> dict[str, np.ndarray]:
    """Turn the walked tree (minus skipped nodes) into index columns in entry order."""
    alive = [i for i, n in enumerate(nodes) if not n.skipped]
    new_id = {old: new for new, old in enumerate(alive)}
    names = bytearray()
    cols: dict[str, list[int]] = {
        k: []
        for k in ("parent", "name_off", "name_len", "mode", "mtime_ns", "size", "first", "count")
    }
    chunk_rows: list[tuple[int, int, int, int, int, int]] = []
    for old in alive:
        node = nodes[old]
        cols["parent"].append(new_id[node.parent])
        cols["name_off"].append(len(names))
        cols["name_len"].append(len(node.name))
        names += node.name
        cols["mode"].append(node.st.st_mode)
        cols["mtime_ns"].append(node.st.st_mtime_ns)
        mode = node.st.st_mode
        if stat.S_ISDIR(mode):
            kids = [new_id[c] for c in node.children if c in new_id]
            cols["size"].append(0)
            cols["first"].append(kids[0] if kids else 0)
            cols["count"].append(len(kids))
        elif stat.S_ISLNK(mode):
            cols["size"].append(len(node.target))
            cols["first"].append(len(names))
            cols["count"].append(0)
            names += node.target
        else:
            cols["size"].append(node.st.st_size)
            cols["first"].append(len(chunk_rows))
            cols["count"].append(len(node.chunks))
            # Format 4: each chunk's crc32 also covers its chunk id (known only now).
            for cid, (partition, offset, csize, codec, crc, dict_id) in enumerate(
                node.chunks, len(chunk_rows)
            ):
                chunk_rows.append(
                    (partition, offset, csize, codec, bind_chunk_crc(crc, cid), dict_id)
                )
    out = {
        k: np.array(v, dtype=np.int64 if k == "mtime_ns" else np.uint64) for k, v in cols.items()
    }
    chunks = np.array(chunk_rows, dtype=np.uint64).reshape(-1, 6)
    for i, name in enumerate(("partition", "offset", "csize", "codec", "crc32", "dict")):
        out[name] = chunks[:, i]
    out["names"] = np.frombuffer(bytes(names), dtype=np.uint8)
    return out


def _replace_dir(tmp: str, out: str) -> None:
    """Move the finished pack into place; an existing OUT (already checked) is replaced."""
    if os.path.isdir(out) and not os.path.islink(out) and os.listdir(out):
        old = os.path.join(
            os.path.dirname(out), ".%s.fanfs-old-%d" % (os.path.basename(out), os.getpid())
        )
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    # The rename is durable only once the parent directory is on disk.
    dir_fd = os.open(os.path.dirname(out), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def check_inputs(opts: PackOptions) -> None:
    """Refuse bad SRC/OUT before any work, with one clear line each."""
    if not os.path.exists(opts.src):
        raise PackInputError("source %s does not exist" % opts.src)
    if not os.path.isdir(opts.src):
        raise PackInputError("source %s is not a directory" % opts.src)
    src, out = os.path.realpath(opts.src), os.path.realpath(opts.out)
    if out == src or out.startswith(src.rstrip("/") + "/"):
        raise PackInputError("output %s is inside the source %s" % (opts.out, opts.src))
    if src.startswith(out.rstrip("/") + "/"):
        raise PackInputError("source %s is inside the output %s" % (opts.src, opts.out))
    if os.path.lexists(opts.out):
        if not os.path.isdir(opts.out) or os.path.islink(opts.out):
            raise PackInputError("output %s exists and is not a directory" % opts.out)
        if os.listdir(opts.out):
            if not opts.force:
                raise PackInputError(
                    "output %s exists and is not empty (use --force to replace it)" % opts.out
                )
            if not os.path.exists(os.path.join(opts.out, MANIFEST_NAME)):
                raise PackInputError(
                    "output %s is not empty and not a fanfs pack; refusing to replace it" % opts.out
                )
    parent = os.path.dirname(os.path.abspath(opts.out))
    if not os.path.isdir(parent):
        raise PackInputError("cannot create %s: %s does not exist" % (opts.out, parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PackInputError("cannot create %s: %s is not writable" % (opts.out, parent))
    if opts.jobs < 0:
        raise UsageError("--jobs must be 0 (all cores) or more")
    if not 4096 <= opts.chunk_size <= 64 * 1024 * 1024:
        raise UsageError("--chunk-size must be between 4KiB and 64MiB")
    if opts.partitions is not None and not 1 <= opts.partitions <= MAX_PARTITIONS:
        raise UsageError("--partitions must be between 1 and %d" % MAX_PARTITIONS)


def summary_table(manifest: dict[str, Any]) -> str:
    """The table printed after a pack (and by `fanfs inspect`)."""
    totals = manifest["totals"]
    lines = [
        "%-10s %10s %12s %12s %7s" % ("codec", "chunks", "bytes in", "bytes out", "ratio"),
    ]
    for name, st in manifest["codec_stats"].items():
        lines.append(_row(name, st["chunks"], st["bytes_in"], st["bytes_out"]))
    chunk_total = sum(st["chunks"] for st in manifest["codec_stats"].values())
    lines.append(_row("total", chunk_total, totals["bytes_in"], totals["bytes_out"]))
    return "\n".join(lines)


def _row(name: str, chunks: int, b_in: int, b_out: int) -> str:
    ratio = "%.2fx" % (b_in / b_out) if b_out else "-"
    return "%-10s %10d %12s %12s %7s" % (name, chunks, format_size(b_in), format_size(b_out), ratio)


def run_pack(opts: PackOptions) -> dict[str, Any]:
    check_inputs(opts)
    try:
        manifest = Packer(opts).run()
    except PlanInfeasibleError as exc:
        print(plan_table(plan_record(exc.plan)))
        raise
    if not opts.quiet:
        if manifest["plan"]:
            print(plan_table(manifest["plan"]))
            print()
        t = manifest["totals"]
        print(
            "packed %d files, %d directories, %d symlinks into %s (%d partitions)"
            % (t["files"], t["dirs"], t["symlinks"], opts.out, len(manifest["partitions"]))
        )
        print(summary_table(manifest))
    return manifest


def run_plan(args: argparse.Namespace) -> int:
    """`fanfs plan SRC`: walk SRC as `fanfs pack` would, then print the plan."""
    settings = settings_from_args(args)
    chunk_size = parse_size(args.chunk_size)
    files = walk_tree(args.src, skip_unreadable=args.skip_unreadable)
    plan: Plan = make_plan(files, settings, chunk_size=chunk_size)
    record = plan_record(plan)
    print(json.dumps(record, indent=2, sort_keys=True) if args.json else plan_table(record))
    if not plan.selection.feasible:
        raise UsageError(plan.selection.problem)
    return 0
