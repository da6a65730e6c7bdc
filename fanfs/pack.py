"""`fanfs pack SRC OUT`: walk a dataset tree, read and compress it in parallel, write a pack.

Pipeline, streaming (no Python object per file: issue 11): `walk.TreeWalk` walks the tree
breadth-first (lstat only, symlinks never followed) into numpy columns and one names blob in
the index's entry order; with `--codec auto` the optimizer first profiles a bounded sample
(`walk.sample_tree`) and picks a codec (and maybe a dictionary, for zstd or lz4) per class of
files; chunks are read by a pool of `--read-threads` threads (many reads in flight, for the
latency of a parallel filesystem), compressed by `--jobs` threads (the codecs and reads
release the GIL) and consumed strictly in entry order, so the pack is deterministic whatever
the thread counts and timing; `PackWriter` places them; the chunk table grows as columns; the
index (built from the columns, vectorised) and manifest come last, into a temporary directory
that is renamed over OUT only when complete. Never imports trio, pyfuse3 or mpi4py."""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import hashlib
import json
import math
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from fanfs import __version__
from fanfs._progress import Progress
from fanfs._sizes import format_size, parse_size
from fanfs.compression import CodecSpec, chunk_codec_name, compress_object, parse_codec
from fanfs.errors import PackInputError, UsageError
from fanfs.format.layout import (
    CHUNK_COLUMNS,
    MANIFEST_NAME,
    SOLID_COLUMNS,
    bind_chunk_crc,
    chunk_count,
    chunk_length,
    crc32,
    storage_unit,
    storage_units,
)
from fanfs.format.writer import PackWriter
from fanfs.optimizer import Plan, PlanSettings, class_of, make_plan
from fanfs.plan import plan_table, sample_settings, sampled_plan_record, settings_from_args
from fanfs.walk import (
    BROADCAST,
    DEFAULT_SAMPLE_ENTRIES,
    SKIPPED,
    Column,
    TreeSample,
    TreeWalk,
    display,
    glob_to_regex,
    sample_tree,
    sample_walked,
    unreadable,
    walk_tree,
)

__all__ = ["PackOptions", "display", "glob_to_regex", "run_pack", "run_plan", "walk_tree"]


DEFAULT_CHUNK_SIZE: Final = 1024 * 1024
# Files larger than a chunk are stored in blocks of this size (format 5): a 4 KiB read
# inside an HDF5, LMDB or npy file then decodes 128 KiB, not 1 MiB (issue 12). squashfs and
# EROFS's default cluster sizes are of this order too.
DEFAULT_BLOCK_SIZE: Final = 128 * 1024
# Default partition count: one per this many source bytes, at least MIN_PARTITIONS (so small
# packs still spread over a few nodes) and at most MAX_PARTITIONS.
PARTITION_TARGET_BYTES: Final = 128 * 1024 * 1024
MIN_PARTITIONS: Final = 16
MAX_PARTITIONS: Final = 4096
# Source reads in flight: a parallel filesystem (Lustre, GPFS) answers each small read after
# a round trip of ~0.5-5 ms, so throughput needs many at once; a local disk is not hurt.
DEFAULT_READ_THREADS: Final = 16
MAX_READ_THREADS: Final = 256
# A reader thread reads a batch of consecutive chunks (one pool task, not one per small file).
BATCH_CHUNKS: Final = 16
BATCH_BYTES: Final = 256 * 1024
# With a sampled `--codec auto` plan: files of a class no sampled file had (the --codec default).
UNPLANNED_CODEC: Final = parse_codec("zstd:3")
# Solid blocks (format 7): files of at most a quarter of the block size, of the classes the plan
# (or --solid-block) groups, are compressed together in blocks of about this size, in walk
# order. Measured on the real dataset's small files (ratio of files of up to 32 KiB, zstd:19
# with a dictionary): Ruby ri files 4.38x alone, 6.24x in 16 KiB blocks, 6.74x in 64 KiB,
# 6.88x in 128 KiB; Go sources 4.37x, 4.62x, 4.96x, 5.10x; files without an extension 4.73x,
# 5.26x, 5.66x, 5.81x; the `(other)` mix 3.85x, 4.20x, 4.63x, 4.82x. squashfs's block size;
# a read of one file decodes its block, about 100 us of zstd.
DEFAULT_SOLID_BLOCK: Final = 128 * 1024
# Closed blocks being compressed, at most: the consumer stores the oldest when there are more
# (a fixed lag, so that where each block lands in the partitions does not depend on timing).
SOLID_LAG: Final = 16


@dataclass(frozen=True, slots=True)
class PackOptions:
    src: str
    out: str
    codec: CodecSpec
    chunk_size: int = DEFAULT_CHUNK_SIZE
    block_size: int | None = None  # None: DEFAULT_BLOCK_SIZE if at most half a chunk, else 0
    partitions: int | None = None
    broadcast: tuple[str, ...] = ()
    jobs: int = 0
    quiet: bool = False
    force: bool = False
    skip_unreadable: bool = False
    auto: PlanSettings | None = None  # --codec auto: plan with these settings; `codec` unused
    read_threads: int = 0  # 0: DEFAULT_READ_THREADS
    sample_entries: int | None = None  # --codec auto: bound of the profiled walk (None: default)
    dedup: bool = True  # chunks with the same stored bytes are stored once (--no-dedup)
    index_codec: str = "auto"  # the index file: "auto" (zstd when it saves 0.5%), "zstd", "none"
    # Solid blocks: without a plan, every class's small files are grouped in blocks of this
    # size (0: none); with --codec auto, the classes the plan groups (None: the default size).
    solid_block: int | None = None
    # Without a plan: the codec and dictionary of the files under each named top-level
    # directory; the others take `codec`. (The plan's mount of its sample, in which each
    # class's units are a directory: `optimizer.coldmount`.)
    dir_codecs: tuple[tuple[str, CodecSpec, bytes | None], ...] = ()


class PlanInfeasibleError(UsageError):
    """`--codec auto` cannot meet its constraint; `plan` is the closest plan."""

    def __init__(self, message: str, plan: Plan, sample: TreeSample) -> None:
        super().__init__(message)
        self.plan = plan
        self.sample = sample


@dataclass(frozen=True, slots=True)
class _Task:
    """One chunk to read: file `entry` (walker id), its path, st_size, chunk number, and the
    file's unit (its chunk or block size)."""

    entry: int
    path: bytes
    rel: bytes
    size: int
    chunk_no: int
    unit: int
    spec: CodecSpec
    dictionary: bytes | None
    cls: str  # optimizer class, with --codec auto
    solid: bool = False  # read only: the consumer adds it to its class's open solid block


# A chunk as read and compressed: (codec, stored, crc32, 64-bit hash of stored), or the error
# met reading it (raised or skipped by the consumer, in order).
_Result = tuple[int, bytes, int, int] | OSError | PackInputError
# Chunks in the shared-chunk table's (`PackWriter`) row for "shared" in codec_stats.
SHARED_STATS: Final = "(shared)"


def read_chunk(path: bytes, rel: bytes, size: int, offset: int, length: int) -> bytes:
    """Read `length` bytes at `offset` of a file that had `size` bytes when walked; raise
    PackInputError if it changed (a different size, or bytes past its end). Called by the
    reader pool's threads; OSError propagates."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.pread(fd, length, offset)
        now = os.fstat(fd).st_size
        last = offset + length >= size
        if len(data) != length or now != size or (last and os.pread(fd, 1, offset + length)):
            raise PackInputError(
                "file changed while being packed: %s (size was %d, now %d)"
                % (display(rel), size, now)
            )
    finally:
        os.close(fd)
    return data


def _read_batch(
    batch: list[_Task], compress_pool: concurrent.futures.Executor
) -> concurrent.futures.Future[list[_Result]]:
    """Reader thread: read a batch of chunks, then hand it to the compression pool."""
    datas: list[bytes | OSError | PackInputError] = []
    for task in batch:
        try:
            datas.append(
                read_chunk(
                    task.path,
                    task.rel,
                    task.size,
                    task.chunk_no * task.unit,
                    chunk_length(task.size, task.unit, task.chunk_no),
                )
            )
        except (OSError, PackInputError) as exc:
            datas.append(exc)
    return compress_pool.submit(_compress_batch, batch, datas)


def _compress_batch(
    batch: list[_Task], datas: list[bytes | OSError | PackInputError]
) -> list[_Result]:
    out: list[_Result] = []
    for task, data in zip(batch, datas, strict=True):
        if isinstance(data, bytes) and task.solid:
            out.append((-1, data, 0, 0))  # compressed with its block
        elif isinstance(data, bytes):
            codec, stored = compress_object(data, task.spec, task.dictionary)
            digest = hashlib.blake2b(stored, digest_size=8).digest()
            out.append((codec, stored, crc32(stored), int.from_bytes(digest, "little")))
        else:
            out.append(data)
    return out


def default_partitions(total_bytes: int, chunk_count: int) -> int:
    by_size = math.ceil(total_bytes / PARTITION_TARGET_BYTES)
    return max(1, min(MAX_PARTITIONS, max(by_size, min(MIN_PARTITIONS, chunk_count))))


class Packer:
    """One run of `fanfs pack`. Call `run()`; it returns the manifest it wrote.

    The walk's columns hold every entry (walker ids); the chunk columns grow as chunks are
    consumed, strictly in entry order, so chunk ids, placement and every byte of the pack
    are the same whatever the threads' timing.
    """

    def __init__(self, opts: PackOptions) -> None:
        self.opts = opts
        self.jobs = opts.jobs or os.cpu_count() or 1
        self.read_threads = opts.read_threads or DEFAULT_READ_THREADS
        self.codec_stats: dict[str, list[int]] = {}
        self.class_stats: dict[str, list[int]] = {}
        self.plan: Plan | None = None
        self.sample: TreeSample | None = None
        self.dict_ids: dict[str, int] = {}
        self._dir_codecs = {name: (spec, dic) for name, spec, dic in opts.dir_codecs}
        self.chunk_rows = _ChunkRows()
        self.block_size = effective_block_size(opts.chunk_size, opts.block_size)
        self.solid_block = (
            DEFAULT_SOLID_BLOCK if opts.solid_block is None and opts.auto else opts.solid_block or 0
        )
        self._solid_open: dict[tuple[str, bool], _SolidBlock] = {}
        self._compress_pool: concurrent.futures.Executor
        self._solid_pending: collections.deque[
            tuple[_SolidBlock, concurrent.futures.Future[tuple[int, bytes]]]
        ] = collections.deque()

    def run(self) -> dict[str, Any]:
        out = os.path.abspath(self.opts.out)
        with concurrent.futures.ThreadPoolExecutor(self.read_threads, "pack-stat") as pool:
            tree = TreeWalk(
                self.opts.src,
                broadcast=self.opts.broadcast,
                skip_unreadable=self.opts.skip_unreadable,
                pool=pool,
            ).walk()
        if self.opts.auto is not None:
            self._make_plan(self.opts.auto, tree)
        tmp = os.path.join(
            os.path.dirname(out), ".%s.fanfs-tmp-%d" % (os.path.basename(out), os.getpid())
        )
        os.mkdir(tmp)
        try:
            manifest = self._write(tmp, tree)
            _replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return manifest

    def _write(self, tmp: str, tree: TreeWalk) -> dict[str, Any]:
        files = tree.regular_files()
        sizes = tree.size.array[files].astype(np.int64)
        bcast = (tree.flags.array[files] & BROADCAST) != 0
        units = storage_units(sizes, self.opts.chunk_size, self.block_size)
        counts: np.ndarray = -(-sizes // units)  # layout.chunk_count, per file
        tasks_total = int(counts.sum())
        regular = int(counts[~bcast].sum())
        bytes_total = int(sizes.sum())
        bcast_bytes = int(sizes[bcast].sum())
        del files, sizes, bcast, counts, units
        partitions = self.opts.partitions or default_partitions(bytes_total - bcast_bytes, regular)
        bcast_parts = default_partitions(bcast_bytes, tasks_total - regular) if bcast_bytes else 0
        writer = PackWriter(tmp, partitions, bcast_parts, self.opts.index_codec)
        try:
            self._add_dictionaries(writer)
            self._compress_all(writer, tree, tasks_total, bytes_total)
            columns = _index_columns(tree, self.chunk_rows.columns())
            return writer.finish(columns, self._manifest_fields(tree, columns, partitions))
        except BaseException:
            writer.abort()
            raise

    def _make_plan(self, settings: PlanSettings, tree: TreeWalk) -> None:
        sample = sample_walked(
            tree, max_entries=_sample_entries(self.opts.sample_entries), seed=settings.seed
        )
        plan = make_plan(
            sample.files,
            sample_settings(settings, sample),
            chunk_size=self.opts.chunk_size,
            block_size=self.block_size,
            solid_block=self.solid_block,
        )
        self.sample = sample
        if not plan.selection.feasible:
            raise PlanInfeasibleError(plan.selection.problem, plan, sample)
        self.plan = plan

    def _add_dictionaries(self, writer: PackWriter) -> None:
        """Store the dictionaries the plan uses (or `dir_codecs`, without a plan)."""
        if self.plan is None:
            for name, _, dictionary in self.opts.dir_codecs:
                if dictionary is not None:
                    self.dict_ids[name] = writer.add_dictionary(dictionary, name)
            return
        for prof in self.plan.profiles:
            _, dictionary = self.plan.choice(prof.name)
            if dictionary is not None:
                self.dict_ids[prof.name] = writer.add_dictionary(dictionary, prof.name)

    def _codec_of(self, rel: bytes) -> tuple[str, CodecSpec, bytes | None, bool]:
        """A file's class (with --codec auto), codec, dictionary, and whether the class's
        small files go into solid blocks."""
        if self.plan is None:
            if self._dir_codecs:  # (a plain pack's files skip the split: millions of them)
                top = rel.split(b"/", 1)[0].decode("utf-8", "surrogateescape")
                if top in self._dir_codecs:
                    spec, dictionary = self._dir_codecs[top]
                    return top, spec, dictionary, self.solid_block > 0
            return "", self.opts.codec, None, self.solid_block > 0
        cls = class_of(rel, self.plan.class_names)
        if cls not in self.plan.class_names:
            # Only after a sampled walk: a class no sampled file had gets the default codec.
            return cls, UNPLANNED_CODEC, None, False
        spec, dictionary = self.plan.choice(cls)
        return cls, spec, dictionary, self.solid_block > 0 and cls in self.plan.solid

    def _batches(self, tree: TreeWalk) -> Iterator[list[_Task]]:
        """The chunks of the regular files in entry order, in batches of up to BATCH_CHUNKS
        chunks or BATCH_BYTES (one reader thread reads a batch's files one after the other)."""
        sizes = tree.size.array
        batch: list[_Task] = []
        batch_bytes = 0
        for files in tree.regular_file_blocks():
            for entry, rel, path in tree.file_paths(files):
                size = int(sizes[entry])
                unit = storage_unit(size, self.opts.chunk_size, self.block_size)
                cls, spec, dictionary, solid = self._codec_of(rel)
                solid = solid and 0 < size <= self.solid_block // 4 and spec.codec_id != 0
                for chunk_no in range(chunk_count(size, unit)):
                    batch.append(
                        _Task(entry, path, rel, size, chunk_no, unit, spec, dictionary, cls, solid)
                    )
                    batch_bytes += chunk_length(size, unit, chunk_no)
                    if len(batch) >= BATCH_CHUNKS or batch_bytes >= BATCH_BYTES:
                        yield batch
                        batch, batch_bytes = [], 0
        if batch:
            yield batch

    def _compress_all(self, writer: PackWriter, tree: TreeWalk, tasks: int, total: int) -> None:
        """Read with `read_threads` threads (many reads in flight: a parallel filesystem's
        latency is hidden), compress with `jobs` threads, consume in order."""
        progress = Progress(total, tasks, enabled=not self.opts.quiet and sys.stderr.isatty())
        window = max(2 * self.read_threads, 4 * self.jobs)
        pending: collections.deque[
            tuple[list[_Task], concurrent.futures.Future[concurrent.futures.Future[list[_Result]]]]
        ] = collections.deque()
        todo = self._batches(tree)
        state = _FileState()
        with (
            concurrent.futures.ThreadPoolExecutor(self.jobs, "pack") as compress_pool,
            concurrent.futures.ThreadPoolExecutor(self.read_threads, "pack-read") as read_pool,
        ):
            self._compress_pool = compress_pool
            try:
                while True:
                    while len(pending) < window and (batch := next(todo, None)) is not None:
                        pending.append(
                            (
                                batch,
                                read_pool.submit(_read_batch, batch, compress_pool),
                            )
                        )
                    if not pending:
                        break
                    batch, future = pending.popleft()
                    if not future.done() or not future.result().done():
                        writer.flush()  # idle anyway: write out what is buffered
                    results = future.result().result()
                    for task, result in zip(batch, results, strict=True):
                        self._consume(writer, tree, state, task, result, progress)
                    self._store_solid(writer, SOLID_LAG)
                for key in sorted(self._solid_open):
                    self._close_solid(key)
                self._store_solid(writer, 0)
            except BaseException:
                for _, future in pending:
                    future.cancel()
                read_pool.shutdown(wait=True, cancel_futures=True)
                compress_pool.shutdown(wait=True, cancel_futures=True)
                raise
            finally:
                progress.close()

    def _consume(
        self,
        writer: PackWriter,
        tree: TreeWalk,
        state: _FileState,
        task: _Task,
        result: _Result,
        progress: Progress,
    ) -> None:
        entry = task.entry
        rows = self.chunk_rows
        if entry != state.entry:
            state.entry, state.first_row = entry, rows.n
        if tree.flags.array[entry] & SKIPPED:
            return
        if isinstance(result, PackInputError):
            raise result
        if isinstance(result, OSError):
            unreadable(display(task.rel), result, skip=self.opts.skip_unreadable)
            tree.flags.array[entry] |= SKIPPED
            tree.skipped += 1
            rows.truncate(state.first_row)  # its chunks so far are not in the index
            return
        codec, stored, crc, digest = result
        broadcast = bool(tree.flags.array[entry] & BROADCAST)
        if task.solid:
            self._add_solid(task, broadcast, stored)
            tree.count.array[entry] = 1
            progress.advance(task.size)
            return
        # Raw chunks (the incompressible fallback) never refer to the dictionary.
        dict_id = self.dict_ids.get(task.cls, 0) if codec != 0 else 0
        shared_key = _shared_key(digest, codec, dict_id, broadcast) if self.opts.dedup else None
        partition, offset, shared = writer.add_chunk(stored, broadcast, shared_key)
        rows.append(partition, offset, len(stored), codec, crc, dict_id)
        tree.count.array[entry] = rows.n - state.first_row
        usize = chunk_length(task.size, task.unit, task.chunk_no)
        name = chunk_codec_name(codec) + ("+dict" if dict_id else "")
        for table, key in (
            (self.codec_stats, SHARED_STATS if shared else name),
            (self.class_stats, task.cls),
        ):
            stats = table.setdefault(key, [0, 0, 0])
            stats[0] += 1
            stats[1] += usize
            stats[2] += 0 if shared else len(stored)
        progress.advance(usize)

    def _add_solid(self, task: _Task, broadcast: bool, data: bytes) -> None:
        """A small file of a solid class: a row to be filled in once its block is stored, its
        bytes appended to the class's open block (closed first if they would not fit)."""
        key = (task.cls, broadcast)
        block = self._solid_open.get(key)
        if block is not None and block.size + len(data) > self.solid_block:
            self._close_solid(key)
            block = None
        if block is None:
            block = self._solid_open[key] = _SolidBlock(
                task.cls, broadcast, task.spec, task.dictionary
            )
        block.members.append((self.chunk_rows.append_placeholder(), block.size))
        block.parts.append(data)
        block.size += len(data)
        if block.size >= self.solid_block:
            self._close_solid(key)

    def _close_solid(self, key: tuple[str, bool]) -> None:
        block = self._solid_open.pop(key)
        data = b"".join(block.parts)
        block.parts = []
        self._solid_pending.append(
            (block, self._compress_pool.submit(compress_object, data, block.spec, block.dictionary))
        )

    def _store_solid(self, writer: PackWriter, lag: int) -> None:
        """Store the oldest compressed solid blocks while more than `lag` are pending: each
        member's row points at the block's stored bytes, from its own offset in the block."""
        rows = self.chunk_rows
        while len(self._solid_pending) > lag:
            block, future = self._solid_pending.popleft()
            codec, stored = future.result()
            crc = crc32(stored)
            dict_id = self.dict_ids.get(block.cls, 0) if codec != 0 else 0
            partition, offset, _ = writer.add_chunk(stored, block.broadcast)
            for row, skip in block.members:
                rows.fill(
                    row, (partition, offset, len(stored), codec, crc, dict_id, skip, block.size)
                )
            name = chunk_codec_name(codec) + ("+dict" if dict_id else "") + "+solid"
            for table, key in ((self.codec_stats, name), (self.class_stats, block.cls)):
                stats = table.setdefault(key, [0, 0, 0])
                stats[0] += len(block.members)
                stats[1] += block.size
                stats[2] += len(stored)

    def _manifest_fields(
        self, tree: TreeWalk, columns: dict[str, np.ndarray], partitions: int
    ) -> dict[str, Any]:
        kinds = columns["mode"] & 0o170000
        files = int(np.count_nonzero(kinds == stat.S_IFREG))
        return {
            "created_by": "fanfs %s" % __version__,
            "chunk_size": self.opts.chunk_size,
            "block_size": self.block_size,
            "options": {
                "codec": "auto" if self.plan else str(self.opts.codec),
                "partitions": partitions,
                "broadcast": list(self.opts.broadcast),
                "chunk_size": self.opts.chunk_size,
                "block_size": self.block_size,
                # Only when the pack has solid blocks: one without keeps version 6's options.
                **({"solid_block": self.solid_block} if self.chunk_rows.solid else {}),
            },
            "totals": {
                "files": files,
                "dirs": int(np.count_nonzero(kinds == stat.S_IFDIR)),
                "symlinks": int(np.count_nonzero(kinds == stat.S_IFLNK)),
                "bytes_in": int(columns["size"][kinds == stat.S_IFREG].sum()),
                # The bytes stored: a shared chunk's are counted once.
                "bytes_out": sum(st[2] for st in self.codec_stats.values()),
                "skipped": tree.skipped,
            },
            "codec_stats": {
                name: {"chunks": c, "bytes_in": b_in, "bytes_out": b_out}
                for name, (c, b_in, b_out) in sorted(self.codec_stats.items())
            },
            "plan": self._plan_record(),
        }

    def _plan_record(self) -> dict[str, Any] | None:
        """The plan as planned, plus what each class realised (`fanfs inspect`)."""
        if self.plan is None or self.sample is None:
            return None
        record = sampled_plan_record(self.plan, self.sample)
        for row in record["classes"]:
            chunks, b_in, b_out = self.class_stats.get(row["class"], [0, 0, 0])
            row["realised"] = {
                "chunks": chunks,
                "bytes_in": b_in,
                "bytes_out": b_out + row["dictionary_bytes"],
            }
        return record


_MIX: Final = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: spreads the small fields' bits


def _shared_key(digest: int, codec: int, dict_id: int, broadcast: bool) -> int:
    """The shared-chunk table's key: the stored bytes' hash mixed with what else must match
    for two chunks to be interchangeable (codec byte, dictionary, broadcast set); never 0."""
    meta = codec | dict_id << 8 | int(broadcast) << 24
    return ((digest ^ (meta * _MIX)) & 0xFFFF_FFFF_FFFF_FFFF) or 1


@dataclass(slots=True)
class _SolidBlock:
    """An open solid block: its class's codec, and each member's chunk row and offset in the
    block."""

    cls: str
    broadcast: bool
    spec: CodecSpec
    dictionary: bytes | None
    size: int = 0
    members: list[tuple[int, int]] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class _FileState:
    """The consumer's current file: its walker id and its first chunk row."""

    entry: int = -1
    first_row: int = 0


class _ChunkRows:
    """The chunk table as chunks are placed, in columns (rows buffered, then flushed)."""

    _FLUSH: Final = 4096

    def __init__(self) -> None:
        self._columns = [Column(dtype) for _, dtype in (*CHUNK_COLUMNS, *SOLID_COLUMNS)]
        self._pending: list[tuple[int, ...]] = []
        self.solid = False  # some row is a slice of a solid block (format 7)

    @property
    def n(self) -> int:
        return self._columns[0].n + len(self._pending)

    def append(
        self, partition: int, offset: int, csize: int, codec: int, crc: int, dict_id: int
    ) -> None:
        # Format 4: each chunk's crc32 also covers its chunk id (known only now).
        crc = bind_chunk_crc(crc, self.n)
        self._pending.append((partition, offset, csize, codec, crc, dict_id, 0, 0))
        if len(self._pending) >= self._FLUSH:
            self._flush()

    def append_placeholder(self) -> int:
        """A row for a member of a solid block not stored yet (`fill` it then); its id."""
        row = self.n
        self._pending.append((0, 0, 0, 0, 0, 0, 0, 0))
        return row

    def fill(self, row: int, values: tuple[int, int, int, int, int, int, int, int]) -> None:
        """Set a placeholder row: partition, offset, csize, codec, the plain crc32 of the
        stored bytes (bound to the row's id here), dict, skip, bsize."""
        self._flush()
        values = (*values[:4], bind_chunk_crc(values[4], row), *values[5:])
        for column, value in zip(self._columns, values, strict=True):
            column.array[row] = value
        self.solid = True

    def truncate(self, n: int) -> None:
        """Forget the rows from `n` on (a file skipped after some of its chunks)."""
        self._flush()
        for column in self._columns:
            column.n = n

    def columns(self) -> dict[str, np.ndarray]:
        self._flush()
        # Without solid blocks the pack is version 6: no skip and bsize columns.
        schema = (*CHUNK_COLUMNS, *SOLID_COLUMNS) if self.solid else CHUNK_COLUMNS
        return {name: c.values for (name, _), c in zip(schema, self._columns, strict=False)}

    def _flush(self) -> None:
        if self._pending:
            for i, column in enumerate(self._columns):
                column.extend([row[i] for row in self._pending])
            self._pending.clear()


def _index_columns(tree: TreeWalk, chunks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The index columns in entry order from the walk's columns, vectorised, and frugal: the
    walk's columns already have the index's dtypes and are passed on as they are (`first`
    rewritten in place); no new array per entry but masks. Directories, symlinks and skipped
    entries (few) are fixed through their ids. Skipped entries are dropped: later ids
    renumbered, their names cut out of the names blob, each remaining column copied once."""
    kinds = tree.mode.values & 0o170000
    is_file = kinds == stat.S_IFREG
    dirs = np.flatnonzero(kinds == stat.S_IFDIR)
    links = np.flatnonzero(kinds == stat.S_IFLNK)
    del kinds
    dead = np.flatnonzero(tree.flags.values & SKIPPED)
    counts = tree.count.values
    dir_first, dir_count = tree.first.values[dirs], counts[dirs].astype(np.int64)
    # A file's chunks follow those of the kept files before it (an empty file's `first` is
    # where its chunks would be): an exclusive running sum of the kept files' chunk counts,
    # computed in the walk's `first` column (only directories used it, saved just above).
    first = tree.first.values
    first[:] = 0
    np.copyto(first, counts, where=is_file)
    del is_file
    first[dead] = 0
    np.cumsum(first, out=first)
    np.subtract(first, counts, out=first, casting="unsafe")  # wrong only where overwritten
    # The names blob holds each entry's name, then a symlink's target, in entry order.
    name_off, name_len, names = tree.name_off.values, tree.name_len.values, tree.names
    seg_len = name_len[dead].astype(np.uint64)
    seg_len[np.isin(dead, links)] += tree.size.values[dead[np.isin(dead, links)]]
    parent, count = tree.parent.values, counts
    if len(dead):
        # Ids, children and name offsets once the dead entries are gone.
        dead_before = np.searchsorted(dead, tree.parent.values).astype(np.uint32)
        parent = tree.parent.values - dead_before
        del dead_before
        ends = dir_first + dir_count.astype(np.uint64)
        lo, hi = np.searchsorted(dead, dir_first), np.searchsorted(dead, ends)
        dir_count = dir_count - (hi - lo)
        dir_first = dir_first - lo.astype(np.uint64)
        blob, pieces, pos = memoryview(names), [], 0
        for entry, length in zip(dead.tolist(), seg_len.tolist(), strict=True):
            pieces.append(blob[pos : int(name_off[entry])])
            pos = int(name_off[entry]) + length
        pieces.append(blob[pos:])
        names = bytearray().join(pieces)
        del pieces, blob
        cut = np.concatenate(([0], np.cumsum(seg_len)))
        name_off = name_off - cut[np.searchsorted(dead, np.arange(tree.n))].astype(np.uint64)
        count = counts.copy()
    first[dirs] = np.where(dir_count > 0, dir_first, 0)
    count[dirs] = dir_count
    first[links] = name_off[links] + name_len[links]
    columns = {
        "parent": parent,
        "name_off": name_off,
        "name_len": name_len,
        "mode": tree.mode.values,
        "mtime_ns": tree.mtime_ns.values,
        "size": tree.size.values,
        "first": first,
        "count": count,
    }
    if len(dead):
        alive = np.ones(tree.n, dtype=bool)
        alive[dead] = False
        columns = {k: v[alive] for k, v in columns.items()}
    return {**columns, **chunks, "names": np.frombuffer(names, dtype=np.uint8)}


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
    if not 0 <= opts.read_threads <= MAX_READ_THREADS:
        raise UsageError(
            "--read-threads must be between 1 and %d (0: the default, %d)"
            % (MAX_READ_THREADS, DEFAULT_READ_THREADS)
        )
    _sample_entries(opts.sample_entries)
    if not 4096 <= opts.chunk_size <= 64 * 1024 * 1024:
        raise UsageError("--chunk-size must be between 4KiB and 64MiB")
    effective_block_size(opts.chunk_size, opts.block_size)
    if opts.solid_block and not 4096 <= opts.solid_block <= opts.chunk_size:
        raise UsageError(
            "--solid-block must be 0 or between 4KiB and the chunk size (%s)"
            % format_size(opts.chunk_size)
        )
    if opts.partitions is not None and not 1 <= opts.partitions <= MAX_PARTITIONS:
        raise UsageError("--partitions must be between 1 and %d" % MAX_PARTITIONS)


def effective_block_size(chunk_size: int, block_size: int | None) -> int:
    """--block-size, checked, or the default where it is at most half a chunk (else 0: no
    blocks). At most half a chunk, so that a file's chunk count tells blocks from chunks."""
    if block_size is not None:
        if block_size and not 4096 <= block_size <= chunk_size // 2:
            raise UsageError(
                "--block-size must be 0 or between 4KiB and half the chunk size (%s)"
                % format_size(chunk_size // 2)
            )
        return block_size
    return DEFAULT_BLOCK_SIZE if chunk_size >= 2 * DEFAULT_BLOCK_SIZE else 0


def _sample_entries(value: int | None) -> int:
    """--sample-entries, checked; the default if not given."""
    if value is None:
        return DEFAULT_SAMPLE_ENTRIES
    if value < 1:
        raise UsageError("--sample-entries must be 1 or more")
    return value


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
        print(plan_table(sampled_plan_record(exc.plan, exc.sample)))
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
    """`fanfs plan SRC`: sample SRC as `fanfs pack --codec auto` does (the whole tree when it
    has at most --sample-entries entries), then print the plan."""
    settings = settings_from_args(args)
    chunk_size = parse_size(args.chunk_size)
    block_size = effective_block_size(
        chunk_size, None if args.block_size is None else parse_size(args.block_size)
    )
    sample = sample_tree(
        args.src,
        max_entries=_sample_entries(args.sample_entries),
        seed=settings.seed,
        skip_unreadable=args.skip_unreadable,
    )
    plan: Plan = make_plan(
        sample.files,
        sample_settings(settings, sample),
        chunk_size=chunk_size,
        block_size=block_size,
        solid_block=DEFAULT_SOLID_BLOCK,  # as `pack --codec auto` plans by default
    )
    record = sampled_plan_record(plan, sample)
    print(json.dumps(record, indent=2, sort_keys=True) if args.json else plan_table(record))
    if not plan.selection.feasible:
        raise UsageError(plan.selection.problem)
    return 0
