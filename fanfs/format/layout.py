"""On-disk constants and the manifest: magic, FORMAT_VERSION, file names, column schema.

A pack is a directory (docs/format.md):
    fanfs.manifest   header (magic, version, length, crc32) + canonical JSON
    index            little-endian column arrays (entries, chunks, names blob, and from
                     version 2 the dictionaries blob the chunks' `dict` column refers to)
    part-NNNNN       partitions: concatenated stored (compressed or raw) chunks
Never does I/O beyond reading and writing the manifest file itself.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import stat
import struct
from typing import Any, Final

import numpy as np

# zlib's crc32, the same values (tests check them against the standard library's), from
# zlib-ng: 30x faster than Debian 12's zlib 1.2.13 on a 100 KB chunk (2 against 58 us),
# where the checksum took 13% of a serving process's CPU in a cold epoch (perf).
from zlib_ng.zlib_ng import crc32

from fanfs.errors import PackFormatError, UsageError

MAGIC: Final = b"FANFSPK\n"
# Version written. Version 2 added zstd dictionaries (the index's `dicts` blob, the chunk
# column `dict`, the manifest's `dictionaries`), the manifest's `plan` and codec 4 (lzma).
# Version 3 lets lz4 chunks refer to a dictionary too (a reader of version 2 would fail them).
# Version 4 binds each chunk's crc32 to its chunk id (`chunk_crc`): a moved, swapped or
# duplicated chunk no longer passes as good data.
# Version 5 adds the manifest's `block_size`: a file larger than `chunk_size` is stored in
# blocks of that size, so that a small read inside it decodes one small block (its chunk
# count tells which: `file_chunk_size`).
# Version 6 lets the index file be one zstd frame (the manifest's `index.codec`, and
# `index.usize`, the size the columns' offsets refer to): a pack of small files spends a few
# percent of its bytes on the index.
# Version 7 adds solid blocks: the chunk columns `skip` and `bsize`. A chunk with `bsize` > 0
# is a slice of a block of small files compressed together: its stored bytes decode to
# `bsize` bytes, and the file's bytes start at `skip` in them. Several chunk rows share the
# block's stored bytes (as shared chunks do since version 6).
FORMAT_VERSION: Final = 7
# The version a pack without solid blocks is written as: readers of version 6 read it.
PLAIN_FORMAT_VERSION: Final = 6
# Versions read. A version-1 pack reads as a version-2 pack without dictionaries; version 2
# reads as version 3; version 3 as version 4 with plain chunk crc32s; version 4 as version 5
# with `block_size` 0 (every file in chunks of `chunk_size`); version 5 as version 6 with an
# uncompressed index; version 6 as version 7 without solid blocks.
READABLE_VERSIONS: Final = (1, 2, 3, 4, 5, 6, 7)
# The index file's codecs (version 6): stored as the columns are, or as one zstd frame.
INDEX_CODECS: Final = ("none", "zstd")
MANIFEST_NAME: Final = "fanfs.manifest"
INDEX_NAME: Final = "index"
MANIFEST_HEADER: Final = struct.Struct(
    "<8sIII"
)  # magic, format version, JSON length, crc32 of JSON
# Largest manifest we accept: a 4096-partition pack's manifest is about 0.5 MiB, and 65535
# dictionaries' descriptors about 7 MiB.
MAX_MANIFEST_BYTES: Final = 16 * 1024 * 1024
# JSON objects and arrays we parse at most (a pack of 8192 partitions and 65535 dictionaries
# has under 80,000): bounds the memory json.loads may take for a hostile manifest.
MAX_MANIFEST_CONTAINERS: Final = 1 << 18

# Column schema of the index file, in file order: (column name, numpy dtype). Entry columns
# have one row per entry (entry id = row, root = 0), chunk columns one row per stored chunk;
# `names` is a byte blob holding entry names and symlink targets. See docs/format.md.
ENTRY_COLUMNS: Final = (
    ("parent", "<u4"),  # entry id of the parent directory (root: 0)
    ("name_off", "<u8"),  # offset of the name in `names`
    ("name_len", "<u2"),  # length of the name (<= 255)
    ("mode", "<u4"),  # st_mode: file type and permission bits
    ("mtime_ns", "<i8"),  # modification time, ns since the epoch
    ("size", "<u8"),  # file size; symlink: target length; directory: 0
    ("first", "<u8"),  # dir: first child id; file: first chunk id; symlink: target offset
    ("count", "<u4"),  # dir: number of children; file: number of chunks; symlink: 0
)
CHUNK_COLUMNS: Final = (
    ("partition", "<u4"),  # partition number
    ("offset", "<u8"),  # byte offset of the stored chunk in its partition
    ("csize", "<u4"),  # stored (compressed) size in bytes
    ("codec", "<u1"),  # codec byte: compression.CODEC_* id, version 3: + log2(shuffle size) << 4
    ("crc32", "<u4"),  # zlib crc32 of the stored bytes
    ("dict", "<u2"),  # dictionary id (manifest `dictionaries`), 0 = none; version 2 (zstd), 3 (lz4)
)
# Version 1 had no `dict` column.
CHUNK_COLUMNS_V1: Final = CHUNK_COLUMNS[:-1]
# Version 7: solid blocks (FORMAT_VERSION above); both 0 for a chunk of its own.
SOLID_COLUMNS: Final = (
    ("skip", "<u4"),  # where the chunk's bytes start in its decoded block
    ("bsize", "<u4"),  # the decoded size of the block (at most chunk_size); 0 = not solid
)
NAMES_COLUMN: Final = ("names", "<u1")
# Version 2: every dictionary's bytes, back to back (manifest `dictionaries` gives offsets).
# In the index rather than in files of their own so that whoever has the index (every node
# of a cluster, after rank 0's broadcast) has the dictionaries too.
DICTS_COLUMN: Final = ("dicts", "<u1")
COLUMN_ALIGN: Final = 8
NAME_MAX: Final = 255


def partition_name(number: int) -> str:
    return "part-%05d" % number


_CHUNK_ID: Final = struct.Struct("<Q")


def chunk_crc(stored: bytes | memoryview, chunk: int, binds: bool) -> int:
    """The checksum a chunk's `crc32` column holds: crc32 of its stored bytes, and from
    format version 4 (`binds`) continued over its chunk id as 8 bytes little-endian, which
    ties the bytes to their (file, chunk number): a chunk moved, swapped or copied to another
    place in the pack no longer matches (docs/format.md section 8)."""
    crc = crc32(stored)
    return bind_chunk_crc(crc, chunk) if binds else crc


def bind_chunk_crc(crc: int, chunk: int) -> int:
    """Format 4's chunk checksum from the plain crc32 of the stored bytes (the pack writer
    learns a chunk's id only once it is placed)."""
    return crc32(_CHUNK_ID.pack(chunk), crc)


def index_columns(version: int) -> tuple[tuple[str, str], ...]:
    """The index columns of a pack of format `version`, in file order."""
    if version < 2:
        return (*ENTRY_COLUMNS, *CHUNK_COLUMNS_V1, NAMES_COLUMN)
    if version < 7:
        return (*ENTRY_COLUMNS, *CHUNK_COLUMNS, NAMES_COLUMN, DICTS_COLUMN)
    return (*ENTRY_COLUMNS, *CHUNK_COLUMNS, *SOLID_COLUMNS, NAMES_COLUMN, DICTS_COLUMN)


def open_pack_file(pack_dir: str, name: str, what: str = "") -> int:
    """Open the pack file `name` read-only and return its descriptor.

    Only a regular file is accepted, and never through a symlink: a pack is untrusted, and a
    symlink could make the mount read (and report the size of) any file the daemon can, a
    FIFO would block the open forever, a device would be read raw. `what` names the file in
    messages (default: its name)."""
    what = what or name
    try:
        fd = os.open(
            os.path.join(pack_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PackFormatError(
                "%s: %s is a symlink (pack files must be regular files)" % (pack_dir, what)
            ) from exc
        raise PackFormatError("%s: cannot open %s: %s" % (pack_dir, what, exc.strerror)) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PackFormatError("%s: %s is not a regular file" % (pack_dir, what))
    return fd


def file_chunk_size(size: int, count: int, chunk_size: int, block_size: int) -> int:
    """The uncompressed size of every chunk but the last of a file of `size` bytes stored in
    `count` chunks: `block_size` if the count says it was split into blocks, else
    `chunk_size` (docs/format.md section 4). Unambiguous because a block is at most half a
    chunk: a file of more than one block has more blocks than chunks."""
    return block_size if block_size and (count - 1) * chunk_size >= size else chunk_size


def file_chunk_sizes(
    sizes: np.ndarray, counts: np.ndarray, chunk_size: int, block_size: int
) -> np.ndarray:
    """`file_chunk_size` of many files at once (u64 arrays in, u64 array out)."""
    out = np.full(len(sizes), chunk_size, dtype=np.uint64)
    if block_size:
        counts = counts.astype(np.uint64)
        split = (counts > 1) & ((counts - np.uint64(1)) * np.uint64(chunk_size) >= sizes)
        out[split] = block_size
    return out


def chunk_usizes(
    sizes: np.ndarray, counts: np.ndarray, chunk_size: int, block_size: int
) -> np.ndarray:
    """The decoded size of every chunk of the table (u64), given the files whose chunks tile
    it, in entry order: their sizes and chunk counts (u64). A file's chunks are its chunk
    size each, but the last, which holds the remainder."""
    per_file = file_chunk_sizes(sizes, counts, chunk_size, block_size)
    counts = counts.astype(np.uint64)
    usize = np.repeat(per_file, counts.astype(np.int64))
    have = counts > 0
    last = np.cumsum(counts, dtype=np.uint64)[have] - np.uint64(1)
    usize[last.astype(np.int64)] = sizes[have] - (counts[have] - np.uint64(1)) * per_file[have]
    return usize


def storage_unit(size: int, chunk_size: int, block_size: int) -> int:
    """The unit `fanfs pack` stores a file of `size` bytes in: blocks if it is larger than a
    chunk (large files are where readers seek: HDF5, LMDB, npy, TFRecord) and blocks are on,
    else one chunk per `chunk_size`."""
    return block_size if block_size and size > chunk_size else chunk_size


def storage_units(sizes: np.ndarray, chunk_size: int, block_size: int) -> np.ndarray:
    """`storage_unit` of many files at once."""
    if not block_size:
        return np.full(len(sizes), chunk_size, dtype=np.int64)
    return np.where(sizes > chunk_size, block_size, chunk_size).astype(np.int64)


def chunk_count(size: int, chunk_size: int) -> int:
    """How many chunks a file of `size` bytes is stored in (0 for an empty file)."""
    return -(-size // chunk_size)


def chunk_length(size: int, chunk_size: int, chunk_no: int) -> int:
    """The uncompressed length of chunk `chunk_no` of a file of `size` bytes."""
    return min(chunk_size, size - chunk_no * chunk_size)


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """Serialise a manifest canonically (sorted keys, no whitespace), header first (with its
    `format_version`, FORMAT_VERSION if it has none)."""
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    version = manifest.get("format_version", FORMAT_VERSION)
    return MANIFEST_HEADER.pack(MAGIC, version, len(body), crc32(body)) + body


def raise_open_file_limit(needed: int) -> None:
    """Raise this process's soft RLIMIT_NOFILE to `needed` (a pack keeps every partition
    open); fail clearly if the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise UsageError(
            "this pack needs %d open files but the limit is %d (ulimit -Hn); "
            "raise it or repack with fewer --partitions" % (needed, hard)
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
