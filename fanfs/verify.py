"""`fanfs inspect PACK` (a summary) and `fanfs verify PACK` (every checksum).

Verify reads each partition once, front to back: its crc32, and every chunk's crc32 and
bounded decoding (a pack is untrusted: a forged chunk may carry a valid crc32 and still be a
decompression bomb), and names every damaged file. Never imports trio, pyfuse3 or mpi4py.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import stat
import sys
from typing import Any

import numpy as np

from fanfs._progress import Progress
from fanfs._sizes import format_size
from fanfs.compression import decompress
from fanfs.errors import CorruptDataError
from fanfs.format.layout import chunk_crc, crc32, partition_name
from fanfs.format.reader import SCAN_BYTES, PackReader
from fanfs.pack import display, summary_table


def _index_line(meta: dict[str, Any]) -> str:
    if meta.get("codec", "none") == "zstd":
        return "index       %s, stored zstd in %s" % (
            format_size(meta["usize"]),
            format_size(meta["size"]),
        )
    return "index       %s" % format_size(meta["size"])


def inspect_pack(path: str, *, as_json: bool = False) -> str:
    reader = PackReader(path)
    manifest = reader.manifest
    if as_json:
        return json.dumps(manifest, indent=2, sort_keys=True)
    totals = manifest["totals"]
    parts = manifest["partitions"]
    bcast = [p for p in parts if p["broadcast"]]
    sizes = np.array([p["size"] for p in parts if not p["broadcast"]] or [0])
    opts = manifest["options"]
    lines = [
        "pack        %s" % path,
        "format      version %d, %s"
        % (manifest["format_version"], manifest.get("created_by", "?")),
        "options     codec %s, chunk size %s, %s"
        % (
            opts["codec"],
            format_size(manifest["chunk_size"]),
            "larger files in blocks of %s" % format_size(reader.block_size)
            if reader.block_size
            else "no blocks",
        )
        + (
            # Untrusted: shown only when it is an integer (the rows are what is validated).
            ", small files in solid blocks of %s" % format_size(opts["solid_block"])
            if isinstance(opts.get("solid_block"), int) and opts["solid_block"] > 0
            else ""
        ),
        "entries     %d files, %d directories, %d symlinks"
        % (totals["files"], totals["dirs"], totals["symlinks"]),
        "data        %s in, %s stored (%.2fx)"
        % (
            format_size(totals["bytes_in"]),
            format_size(totals["bytes_out"]),
            totals["bytes_in"] / totals["bytes_out"] if totals["bytes_out"] else 1.0,
        ),
        "partitions  %d regular (%s to %s each), %d broadcast (%s)"
        % (
            len(parts) - len(bcast),
            format_size(int(sizes.min())),
            format_size(int(sizes.max())),
            len(bcast),
            format_size(sum(p["size"] for p in bcast)),
        ),
        "broadcast   %s" % (", ".join(opts["broadcast"]) or "(none)"),
        _index_line(manifest["index"]),
    ]
    dicts = manifest.get("dictionaries") or []
    if dicts:
        lines.append(
            "dictionaries %d (%s): %s"
            % (
                len(dicts),
                format_size(sum(d["size"] for d in dicts)),
                ", ".join(d["class"] for d in dicts),
            )
        )
    lines += ["", summary_table(manifest)]
    plan = manifest.get("plan")
    if plan:
        lines += ["", *_plan_lines(plan)]
    return "\n".join(lines)


def _plan_lines(plan: dict[str, Any]) -> list[str]:
    """The plan record as tables. It is informational, free-form and no reader depends on
    it, so a malformed one (an untrusted pack) is named rather than refused or trusted."""
    from fanfs.plan import realised_table, summary_lines

    try:
        return [
            "codec plan (--codec auto), as planned and as realised:",
            realised_table(plan),
            *summary_lines(plan),
        ]
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        IndexError,
        ZeroDivisionError,
        OverflowError,
    ):
        return [
            "codec plan: the manifest's plan record is malformed (fanfs inspect --json shows it)"
        ]


def _chunk_owners(reader: PackReader) -> np.ndarray:
    """Entry id owning every chunk (vectorised: files' chunk ranges are contiguous)."""
    index = reader.index
    modes = index.arrays["mode"]
    files = np.nonzero((modes & 0o170000) == stat.S_IFREG)[0]
    counts = index.arrays["count"][files].astype(np.int64)
    return np.repeat(files, counts)


class _Checker:
    """Checks chunks (crc32, then a bounded decode) in a pool of threads: the codecs release
    the GIL, and verify reads every byte of the pack."""

    def __init__(self, reader: PackReader, owners: np.ndarray) -> None:
        self.reader = reader
        self.owners = owners
        self.threads = max(1, os.cpu_count() or 1)
        self.pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="verify")
        self.pending: collections.deque[concurrent.futures.Future[str | None]] = collections.deque()
        self.bad: list[str] = []
        # Solid blocks (format 7) decoded without error, by everything their decode depends
        # on: each member row still checks its own crc32, but the block is decoded once.
        self.blocks_ok: set[tuple[int, ...]] = set()

    def submit(self, cid: int, stored: bytes) -> None:
        while len(self.pending) >= 4 * self.threads:
            self._collect(self.pending.popleft())
        self.pending.append(self.pool.submit(self._check, cid, stored))

    def drain(self) -> list[str]:
        while self.pending:
            self._collect(self.pending.popleft())
        found, self.bad = self.bad, []
        return found

    def _collect(self, future: concurrent.futures.Future[str | None]) -> None:
        line = future.result()
        if line is not None:
            self.bad.append(line)

    def _check(self, cid: int, stored: bytes) -> str | None:
        reader, index = self.reader, self.reader.index
        entry = int(self.owners[cid])
        chunk_no = cid - index.first[entry]
        try:
            if chunk_crc(stored, cid, reader.crc_binds_chunk) != index.chunk_crc32[cid]:
                raise CorruptDataError("checksum mismatch")
            # A slice of a solid block (format 7) decodes its whole block, once per block.
            bsize = index.chunk_bsize[cid]
            key = index.block_key(cid)
            if not bsize or key not in self.blocks_ok:
                decompress(
                    index.chunk_codec[cid],
                    stored,
                    bsize or reader.chunk_usize(entry, chunk_no),
                    reader.dictionary(index.chunk_dict[cid]),
                )
                if bsize:
                    self.blocks_ok.add(key)
        except CorruptDataError as exc:
            return "%s: chunk %d (partition %d): %s" % (
                display(index.path(entry)),
                chunk_no,
                index.chunk_partition[cid],
                exc,
            )
        return None

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def _scan_partition(
    reader: PackReader, number: int, chunks: np.ndarray, checker: _Checker, progress: Progress
) -> bool:
    """Read partition `number` once, front to back: its crc32 (returned: whether it matches)
    and every chunk in it, handed to `checker` in offset order. Holds at most one chunk plus
    one read in memory."""
    index = reader.index
    size = reader.partitions[number]["size"]
    crc, pos = 0, 0
    window, window_start = bytearray(), 0

    def read_to(end: int) -> None:
        nonlocal crc, pos
        while pos < end:
            piece = reader.read_range(number, pos, min(SCAN_BYTES, size - pos))
            crc = crc32(piece, crc)
            window.extend(piece)
            pos += len(piece)
            progress.advance(len(piece))

    for cid in chunks.tolist():
        start = index.chunk_offset[cid]
        end = start + index.chunk_csize[cid]
        read_to(end)
        if start > window_start:  # later chunks start here or after (offset order)
            del window[: start - window_start]
            window_start = start
        checker.submit(cid, bytes(window[start - window_start : end - window_start]))
    read_to(size)
    return crc == reader.partitions[number]["crc32"]


def verify_pack(path: str, *, quiet: bool = False) -> int:
    """Check every partition's crc32 and every chunk's crc32 and decoding (bounded: a chunk
    that would decode to more than its size is damaged). Returns 0 if all is well, 3
    otherwise (each bad object printed)."""
    reader = PackReader(path)
    total = sum(p["size"] for p in reader.partitions)
    progress = Progress(
        total, len(reader.partitions), enabled=not quiet and sys.stderr.isatty(), label="verifying"
    )
    index = reader.index
    partitions = index.arrays["partition"]
    order = np.lexsort((index.arrays["offset"], partitions))
    bounds = np.searchsorted(partitions[order], np.arange(len(reader.partitions) + 1))
    checker = _Checker(reader, _chunk_owners(reader))
    bad: list[str] = []
    try:
        for number, _part in enumerate(reader.partitions):
            chunks = order[bounds[number] : bounds[number + 1]]
            crc_ok = _scan_partition(reader, number, chunks, checker, progress)
            damaged = checker.drain()
            bad.extend(damaged)
            if not crc_ok and not damaged:
                bad.append("partition %s: checksum mismatch" % partition_name(number))
    except OSError as exc:
        raise CorruptDataError(
            "%s: cannot read the pack: %s" % (path, exc.strerror or exc)
        ) from exc
    finally:
        checker.close()
        progress.close()
    for line in bad:
        print("fanfs verify: corrupt: %s" % line, file=sys.stderr)
    if bad:
        print("fanfs verify: %s: %d damaged object(s)" % (path, len(bad)), file=sys.stderr)
        return 3
    if not quiet:
        print(
            "%s: OK (%d partitions, %d chunks, %s)"
            % (path, len(reader.partitions), index.chunk_count, format_size(total))
        )
    return 0
