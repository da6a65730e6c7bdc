"""Codecs: compress at pack time, decompress on the read path.

Owns the codec registry (name <-> on-disk id), one-shot compress/decompress with per-thread
contexts, and the translation of each library's exception into `DecompressionError`.
Never does I/O and never knows about partitions, FUSE or MPI.

Thread safety: every function here may be called from any thread. zstandard contexts are not
safe for overlapping use, so each thread keeps its own (python-zstandard "Thread and Object
Reuse Safety"); lz4.block and brotli's one-shot functions are stateless. All three libraries
release the GIL while they work.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Final

import brotli
import lz4.block
import zstandard

from fanfs.errors import DecompressionError, UsageError

# On-disk codec ids (docs/format.md). Never renumber: packs on disk refer to them.
CODEC_NONE: Final = 0
CODEC_LZ4: Final = 1
CODEC_ZSTD: Final = 2
CODEC_BROTLI: Final = 3

CODEC_NAMES: Final = {CODEC_NONE: "none", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd", CODEC_BROTLI: "brotli"}
_CODEC_IDS: Final = {name: codec_id for codec_id, name in CODEC_NAMES.items()}
_DEFAULT_LEVELS: Final = {CODEC_NONE: 0, CODEC_LZ4: 0, CODEC_ZSTD: 3, CODEC_BROTLI: 5}
_LEVEL_RANGES: Final = {CODEC_NONE: (0, 0), CODEC_LZ4: (0, 0), CODEC_ZSTD: (1, 22), CODEC_BROTLI: (0, 11)}

# Incompressible data is detected on a sample this large before compressing the whole object,
# so a JPEG costs one fast zstd-1 pass over 64 KiB instead of a slow pass at the target level.
PROBE_BYTES: Final = 64 * 1024
# An object (or probe) must shrink by at least this fraction to be stored compressed; below
# it the saved bytes are not worth the decode time on every read.
MIN_SAVING: Final = 0.03


@dataclass(frozen=True, slots=True)
class CodecSpec:
    """A codec and the level it compresses at (`zstd:3`). Levels do not affect decoding."""

    codec_id: int
    level: int

    @property
    def name(self) -> str:
        return CODEC_NAMES[self.codec_id]

    def __str__(self) -> str:
        if self.codec_id in (CODEC_NONE, CODEC_LZ4):
            return self.name
        return "%s:%d" % (self.name, self.level)


def parse_codec(text: str) -> CodecSpec:
    """Parse a `--codec` value: `none`, `lz4`, `zstd[:LEVEL]`, `brotli[:LEVEL]`."""
    name, _, level_text = text.strip().lower().partition(":")
    codec_id = _CODEC_IDS.get(name)
    if codec_id is None:
        raise UsageError("unknown codec %r (choose none, lz4, zstd[:LEVEL] or brotli[:LEVEL])" % text)
    low, high = _LEVEL_RANGES[codec_id]
    if not level_text:
        return CodecSpec(codec_id, _DEFAULT_LEVELS[codec_id])
    if low == high:
        raise UsageError("codec %s takes no level (got %r)" % (name, text))
    try:
        level = int(level_text)
    except ValueError:
        level = low - 1
    if not low <= level <= high:
        raise UsageError("invalid level in %r: %s levels are %d..%d" % (text, name, low, high))
    return CodecSpec(codec_id, level)


_local = threading.local()


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "zc", None)
    if cache is None:
        cache = _local.zc = {}
    cctx = cache.get(level)
    if cctx is None:
        # Content size in the frame lets any zstd tool decode an object on its own; the
        # checksum is ours (crc32 over the stored bytes), so the frame's is left off.
        cctx = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cctx


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "zd", None)
    if dctx is None:
        dctx = _local.zd = zstandard.ZstdDecompressor()
    return dctx


def compress(data: bytes | memoryview, spec: CodecSpec) -> bytes:
    """Compress `data` with `spec`; `none` returns the bytes unchanged."""
    if spec.codec_id == CODEC_ZSTD:
        return _zstd_compressor(spec.level).compress(data)
    if spec.codec_id == CODEC_LZ4:
        return lz4.block.compress(data, store_size=False)
    if spec.codec_id == CODEC_BROTLI:
        return brotli.compress(bytes(data), quality=spec.level)
    return bytes(data)


def looks_incompressible(data: bytes | memoryview) -> bool:
    """Guess cheaply whether `data` is not worth compressing (JPEG, PNG, random bytes)."""
    probe = data[:PROBE_BYTES]
    if len(probe) < 64:
        return False
    return len(_zstd_compressor(1).compress(probe)) > len(probe) * (1 - MIN_SAVING)


def compress_object(data: bytes | memoryview, spec: CodecSpec) -> tuple[int, bytes]:
    """Compress one object for a pack: returns (codec id actually used, stored bytes).

    Objects that do not shrink by `MIN_SAVING` are stored raw (codec `none`), so they cost
    no decode time on the read path.
    """
    if spec.codec_id == CODEC_NONE or not data or looks_incompressible(data):
        return CODEC_NONE, bytes(data)
    stored = compress(data, spec)
    if len(stored) > len(data) * (1 - MIN_SAVING):
        return CODEC_NONE, bytes(data)
    return spec.codec_id, stored


def decompress(codec_id: int, stored: bytes | memoryview, size: int) -> bytes | memoryview:
    """Decode one stored object that must decode to exactly `size` bytes.

    Returns `stored` itself for codec `none` (no copy). Raises `DecompressionError` for a
    codec error, a wrong decoded size or an unknown codec id.
    """
    if codec_id == CODEC_NONE:
        out: bytes | memoryview = stored
    else:
        try:
            if codec_id == CODEC_ZSTD:
                out = _zstd_decompressor().decompress(stored, max_output_size=size)
            elif codec_id == CODEC_LZ4:
                out = lz4.block.decompress(stored, uncompressed_size=size)
            elif codec_id == CODEC_BROTLI:
                out = brotli.decompress(stored)
            else:
                raise DecompressionError("unknown codec id %d" % codec_id)
        except (zstandard.ZstdError, lz4.block.LZ4BlockError, brotli.error) as exc:
            raise DecompressionError("%s: %s" % (CODEC_NAMES[codec_id], exc)) from exc
    if len(out) != size:
        raise DecompressionError(
            "%s: decoded %d bytes, expected %d" % (CODEC_NAMES.get(codec_id, "?"), len(out), size)
        )
    return out
