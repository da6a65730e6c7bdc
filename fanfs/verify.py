"""`fanfs inspect PACK` (a summary) and `fanfs verify PACK` (every checksum).

Verify checks each partition's crc32, then, for partitions that fail, each chunk's crc32 and
decodability, and names every damaged file. Never imports trio, pyfuse3 or mpi4py.
"""

from __future__ import annotations

import json
import stat
import sys
import zlib

import numpy as np

from fanfs._progress import Progress
from fanfs._sizes import format_size
from fanfs.compression import decompress
from fanfs.errors import CorruptDataError
from fanfs.format.reader import PackReader
from fanfs.pack import display, summary_table


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
        "format      version %d, %s" % (manifest["format_version"], manifest.get("created_by", "?")),
        "options     codec %s, chunk size %s" % (opts["codec"], format_size(manifest["chunk_size"])),
        "entries     %d files, %d directories, %d symlinks" % (totals["files"], totals["dirs"], totals["symlinks"]),
        "data        %s in, %s stored (%.2fx)" % (
            format_size(totals["bytes_in"]), format_size(totals["bytes_out"]),
            totals["bytes_in"] / totals["bytes_out"] if totals["bytes_out"] else 1.0),
        "partitions  %d regular (%s to %s each), %d broadcast (%s)" % (
            len(parts) - len(bcast), format_size(int(sizes.min())), format_size(int(sizes.max())),
            len(bcast), format_size(sum(p["size"] for p in bcast))),
        "broadcast   %s" % (", ".join(opts["broadcast"]) or "(none)"),
    ]
    dicts = manifest.get("dictionaries") or []
    if dicts:
        lines.append("dictionaries %d (%s): %s" % (
            len(dicts), format_size(sum(d["size"] for d in dicts)), ", ".join(d["class"] for d in dicts)))
    lines += ["", summary_table(manifest)]
    plan = manifest.get("plan")
    if plan:
        from fanfs.plan import realised_table, summary_lines

        lines += ["", "codec plan (--codec auto), as planned and as realised:", realised_table(plan)]
        lines += summary_lines(plan)
    return "\n".join(lines)


def _chunk_owners(reader: PackReader) -> np.ndarray:
    """Entry id owning every chunk (vectorised: files' chunk ranges are contiguous)."""
    index = reader.index
    modes = index.arrays["mode"]
    files = np.nonzero((modes & 0o170000) == stat.S_IFREG)[0]
    counts = index.arrays["count"][files].astype(np.int64)
    return np.repeat(files, counts)


def _check_chunks(reader: PackReader, partition: int, owners: np.ndarray) -> list[str]:
    index = reader.index
    bad = []
    for cid in np.nonzero(index.arrays["partition"] == partition)[0].tolist():
        entry = int(owners[cid])
        chunk_no = cid - index.first[entry]
        try:
            stored = reader.read_stored(cid)
            if zlib.crc32(stored) != index.chunk_crc32[cid]:
                raise CorruptDataError("checksum mismatch")
            usize = reader.chunk_usize(entry, chunk_no)
            decompress(index.chunk_codec[cid], stored, usize, reader.dictionary(index.chunk_dict[cid]))
        except (CorruptDataError, OSError) as exc:
            bad.append("%s: chunk %d (partition %d): %s" % (display(index.path(entry)), chunk_no, partition, exc))
    return bad


def verify_pack(path: str, *, quiet: bool = False) -> int:
    """Returns 0 if every checksum matches, 3 otherwise (each bad object printed)."""
    reader = PackReader(path)
    total = sum(p["size"] for p in reader.partitions)
    progress = Progress(total, len(reader.partitions), enabled=not quiet and sys.stderr.isatty(), label="verifying")
    owners = _chunk_owners(reader)
    bad: list[str] = []
    for number, part in enumerate(reader.partitions):
        if not reader.verify_partition(number):
            bad.extend(_check_chunks(reader, number, owners) or ["partition %s: checksum mismatch" % part["file"]])
        progress.advance(part["size"])
    progress.close()
    for line in bad:
        print("fanfs verify: corrupt: %s" % line, file=sys.stderr)
    if bad:
        print("fanfs verify: %s: %d damaged object(s)" % (path, len(bad)), file=sys.stderr)
        return 3
    if not quiet:
        print("%s: OK (%d partitions, %d chunks, %s)" % (path, len(reader.partitions), reader.index.chunk_count, format_size(total)))
    return 0
