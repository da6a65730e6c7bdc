"""Staging: put this node's share of a pack into its cache dir before the mount serves.

Rank 0 alone reads the manifest and index from the shared filesystem and broadcasts them.
Each rank copies the regular partitions it owns with large sequential reads, verifying
their crc32, in rounds of at most `stage_groups` ranks (LMDBIO staggering). Broadcast
partitions are read once, by rank 0, and sent to every rank over MPI. A partition already in
the cache dir from an earlier job (same pack, verified then) is reused without a read.
Errors on any rank are agreed on collectively, so no rank waits in a barrier for a failed one.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Final

from fanfs._progress import Progress
from fanfs._sizes import format_size
from fanfs.cluster.topology import place, stage_rounds
from fanfs.errors import ClusterInitError, FanfsError, PackFormatError
from fanfs.format.layout import (
    INDEX_NAME,
    MANIFEST_NAME,
    crc32,
    open_pack_file,
    partition_name,
)
from fanfs.format.reader import PackReader
from fanfs.format.validate import read_manifest
from fanfs.runtime import create_new, private_dir, write_atomic

log = logging.getLogger(__name__)

COPY_PIECE: Final = 4 * 1024 * 1024  # sequential read size on the shared filesystem
VERIFIED_SUFFIX: Final = ".verified"  # marker: the staged copy matched this crc32


@dataclass(slots=True)
class StageResult:
    data_dir: str  # where this rank's PackReader opens the pack
    local: set[int]  # partitions held here
    owners: list[tuple[int, ...]]
    shared_fs_bytes: int = 0  # bytes this rank read from the shared filesystem
    stage_s: float = 0.0
    reused: int = 0
    report: list[dict[str, Any]] = field(default_factory=list)  # rank 0: every rank's numbers


def _agree(transport: Any, error: FanfsError | None) -> None:
    """Collective: if any rank failed, every rank raises the first failure."""
    errors = transport.gather(
        None if error is None else (type(error).__name__, error.exit_code, str(error))
    )
    verdict = transport.bcast(next((e for e in errors if e), None) if errors is not None else None)
    if verdict is not None:
        if error is not None:
            raise error
        _, code, message = verdict
        failure = ClusterInitError(message)
        failure.exit_code = code
        raise failure


def _read_pack_file(pack: str, name: str) -> bytes:
    with os.fdopen(open_pack_file(pack, name), "rb", buffering=0) as f:
        return f.read()


def _read_head(pack: str) -> tuple[bytes, bytes]:
    # Validates manifest, index and every partition's size. The bytes read afterwards may
    # differ (the pack may change meanwhile): every rank validates its staged copy again.
    reader = PackReader(pack)
    reader.close()
    return _read_pack_file(pack, MANIFEST_NAME), _read_pack_file(pack, INDEX_NAME)


def _share_head(transport: Any, pack: str, cache_dir: str) -> tuple[str, bytes]:
    head, error = None, None
    if transport.rank == 0:
        try:
            head = _read_head(pack)
        except FanfsError as exc:
            error = exc
        except OSError as exc:
            error = PackFormatError("%s: %s" % (pack, exc))
    _agree(transport, error)
    manifest = transport.bcast_blob(head[0] if head else None)
    index = transport.bcast_blob(head[1] if head else None)
    stage_dir = os.path.join(cache_dir, "pack-%08x" % crc32(manifest))
    error = None
    try:
        private_dir(stage_dir)
        write_atomic(os.path.join(stage_dir, INDEX_NAME), index)
        write_atomic(os.path.join(stage_dir, MANIFEST_NAME), manifest)
    except FanfsError as exc:
        error = exc
    except OSError as exc:
        error = ClusterInitError("cannot write to %s: %s" % (stage_dir, exc.strerror or exc))
    _agree(transport, error)
    return stage_dir, manifest


def _is_staged(path: str, part: dict[str, Any]) -> bool:
    try:
        with open(path + VERIFIED_SUFFIX) as f:
            marker = f.read().strip()
        return os.path.getsize(path) == part["size"] and marker == "%08x" % part["crc32"]
    except OSError:
        return False


def _copy_partition(
    pack: str, stage_dir: str, number: int, part: dict[str, Any], progress: Progress
) -> int:
    """Copy one partition with large sequential reads, verifying its crc32; returns bytes read."""
    name = partition_name(number)
    dst = os.path.join(stage_dir, name)
    crc, copied = 0, 0
    with (
        os.fdopen(open_pack_file(pack, name, "partition " + name), "rb", buffering=0) as fin,
        os.fdopen(create_new(dst + ".tmp"), "wb") as fout,
    ):
        while piece := fin.read(COPY_PIECE):
            crc = crc32(piece, crc)
            fout.write(piece)
            copied += len(piece)
            progress.advance(len(piece))
    if copied != part["size"] or crc != part["crc32"]:
        os.unlink(dst + ".tmp")
        raise PackFormatError("%s: partition %s is corrupt or truncated in the pack" % (pack, name))
    os.replace(dst + ".tmp", dst)
    write_atomic(dst + VERIFIED_SUFFIX, ("%08x\n" % crc).encode())
    return copied


def stage(
    transport: Any, *, pack: str, cache_dir: str, replicas: int, groups: int, copy: bool
) -> StageResult:
    """Collective: every rank calls it. Returns where this rank's pack data is."""
    start = time.monotonic()
    stage_dir, _ = _share_head(transport, pack, cache_dir)
    manifest = read_manifest(stage_dir)
    parts = manifest["partitions"]
    owners = place(
        [p["size"] for p in parts], [p["broadcast"] for p in parts], transport.size, replicas
    )
    local = {n for n, ranks in enumerate(owners) if transport.rank in ranks}
    if not copy:  # --stage none: the pack is on local disk already; serve it in place
        return StageResult(pack, set(range(len(parts))), owners)
    result = StageResult(stage_dir, local, owners)
    _stage_regular(transport, pack, stage_dir, parts, result, groups)
    _stage_broadcast(transport, pack, stage_dir, parts, result)
    result.stage_s = time.monotonic() - start
    result.report = (
        transport.gather(
            {
                "rank": transport.rank,
                "bytes": result.shared_fs_bytes,
                "seconds": round(result.stage_s, 3),
                "reused": result.reused,
            }
        )
        or []
    )
    if transport.rank == 0:
        for row in result.report:
            log.info(
                "staged rank %d: %s read from the pack in %.1fs (%d partitions reused)",
                row["rank"],
                format_size(row["bytes"]),
                row["seconds"],
                row["reused"],
            )
    return result


def _stage_regular(
    transport: Any,
    pack: str,
    stage_dir: str,
    parts: list[dict[str, Any]],
    result: StageResult,
    groups: int,
) -> None:
    mine = [n for n in sorted(result.local) if not parts[n]["broadcast"] and parts[n]["size"]]
    todo = [n for n in mine if not _is_staged(os.path.join(stage_dir, partition_name(n)), parts[n])]
    result.reused = len(mine) - len(todo)
    total = sum(parts[n]["size"] for n in todo)
    progress = Progress(
        total, len(todo), enabled=transport.rank == 0 and os.isatty(2), label="staging"
    )
    for round_ranks in stage_rounds(transport.size, groups):
        error = None
        if transport.rank in round_ranks:
            try:
                for n in todo:
                    result.shared_fs_bytes += _copy_partition(
                        pack, stage_dir, n, parts[n], progress
                    )
            except FanfsError as exc:
                error = exc
            except OSError as exc:
                error = ClusterInitError("staging %s failed: %s" % (pack, exc))
        _agree(transport, error)
    progress.close()


def _stage_broadcast(
    transport: Any, pack: str, stage_dir: str, parts: list[dict[str, Any]], result: StageResult
) -> None:
    wanted = [n for n, p in enumerate(parts) if p["broadcast"] and p["size"]]
    missing = [
        n for n in wanted if not _is_staged(os.path.join(stage_dir, partition_name(n)), parts[n])
    ]
    needed = transport.gather(missing)
    todo: list[int] = transport.bcast(sorted(set().union(*needed)) if needed is not None else None)
    for n in todo:
        part = parts[n]
        data, error = None, None
        if transport.rank == 0:
            try:
                data = _read_pack_file(pack, partition_name(n))
                result.shared_fs_bytes += len(data)
                if len(data) != part["size"] or crc32(data) != part["crc32"]:
                    raise PackFormatError(
                        "%s: partition %s is corrupt or truncated in the pack"
                        % (pack, partition_name(n))
                    )
            except FanfsError as exc:
                error = exc
            except OSError as exc:
                error = ClusterInitError("reading %s failed: %s" % (partition_name(n), exc))
        _agree(transport, error)
        dst = os.path.join(stage_dir, partition_name(n))
        write_atomic(dst, transport.bcast_blob(data))
        write_atomic(dst + VERIFIED_SUFFIX, ("%08x\n" % part["crc32"]).encode())
