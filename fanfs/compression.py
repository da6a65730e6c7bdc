"""Codecs: compress at pack time, decompress on the read path.

Owns the codec registry (name <-> on-disk codec byte), one-shot compress/decompress with
per-thread contexts, dictionaries (trained by zstd; zstd uses them whole, lz4 as the history
before the object, its last 64 KiB), the byte shuffle for numeric arrays, and the
translation of each library's exception into `DecompressionError`. Never does I/O and never
knows about partitions, FUSE or MPI.

Thread safety: every function here may be called from any thread. zstandard contexts are not
safe for overlapping use, so each thread keeps its own (python-zstandard "Thread and Object
Reuse Safety"); lz4.block, brotli's and lzma's one-shot functions are stateless. All four
libraries release the GIL while they work.
"""

from __future__ import annotations

import lzma
import threading
from dataclasses import dataclass
from typing import BinaryIO, Final

import brotli
import lz4.block
import numpy as np
import zstandard

from fanfs.errors import DecompressionError, UsageError

# On-disk codec ids (docs/format.md). Never renumber: packs on disk refer to them.
CODEC_NONE: Final = 0
CODEC_LZ4: Final = 1
CODEC_ZSTD: Final = 2
CODEC_BROTLI: Final = 3
# Format version 2. lzma is the only codec that beats zstd-19 and brotli-11 on ratio for some
# data (float arrays: 2.47x vs 2.23x and 2.40x here), at a tenth of their decode speed, so
# only a capacity-bound plan picks it. zlib has no id: zstd-19 beat it on both ratio and
# decode speed on every data set measured (docs/format.md section 6).
CODEC_LZMA: Final = 4

# Codecs a chunk may use a dictionary with (format version 3 added lz4).
DICT_CODECS: Final = frozenset({CODEC_ZSTD, CODEC_LZ4})
CODEC_NAMES: Final = {
    CODEC_NONE: "none",
    CODEC_LZ4: "lz4",
    CODEC_ZSTD: "zstd",
    CODEC_BROTLI: "brotli",
    CODEC_LZMA: "lzma",
}
# `lz4hc` is lz4 (same id, same block format and decoder) compressed in high-compression mode:
# CodecSpec(CODEC_LZ4, level) with level > 0.
_CODEC_IDS: Final = {
    **{name: codec_id for codec_id, name in CODEC_NAMES.items()},
    "lz4hc": CODEC_LZ4,
}
_DEFAULT_LEVELS: Final = {"none": 0, "lz4": 0, "lz4hc": 9, "zstd": 3, "brotli": 5, "lzma": 6}
_LEVEL_RANGES: Final = {
    "none": (0, 0),
    "lz4": (0, 0),
    "lz4hc": (1, 12),
    "zstd": (1, 22),
    "brotli": (0, 11),
    "lzma": (0, 9),
}
CODEC_CHOICES: Final = (
    "none, lz4, lz4hc[:LEVEL], zstd[:LEVEL], brotli[:LEVEL] or lzma[:LEVEL], optionally +shuf2|4|8"
)
# Format version 3: a byte-shuffle filter (Blosc's and HDF5's "shuffle") before compressing.
# The bytes of N-byte elements are regrouped by position (all first bytes, then all second
# bytes...), so that the slowly varying bytes of numeric arrays (exponents, high bytes of
# small integers, zeroed mantissa bits) sit together where a codec finds them. A chunk's
# codec byte holds the codec id in its low 4 bits and log2(N) in its high 4 bits (0 = none).
SHUFFLE_SIZES: Final = (2, 4, 8)
_CODEC_ID_MASK: Final = 0x0F

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
    shuffle: int = 0  # element size of the byte shuffle applied before compressing; 0 = none

    @property
    def name(self) -> str:
        if self.codec_id == CODEC_LZ4 and self.level:
            return "lz4hc"
        return CODEC_NAMES[self.codec_id]

    @property
    def chunk_codec(self) -> int:
        """The codec byte of a chunk compressed with this spec (docs/format.md section 6)."""
        return (
            self.codec_id | (self.shuffle.bit_length() - 1) << 4 if self.shuffle else self.codec_id
        )

    def __str__(self) -> str:
        if self.codec_id == CODEC_NONE or (self.codec_id == CODEC_LZ4 and not self.level):
            text = self.name
        else:
            text = "%s:%d" % (self.name, self.level)
        return text + ("+shuf%d" % self.shuffle if self.shuffle else "")


def parse_codec(text: str) -> CodecSpec:
    """Parse a `--codec` value such as `none`, `lz4`, `lz4hc:9`, `zstd:3`, `brotli:5`, `lzma:6`,
    optionally with a byte shuffle of N-byte elements first (`lz4hc:9+shuf4`)."""
    if "+dict" in text.lower():
        raise UsageError(
            "a dictionary is trained per class: give %r in --codecs with --codec auto"
            % text.strip()
        )
    base, plus, shuffle_text = text.strip().lower().partition("+shuf")
    name, colon, level_text = base.partition(":")
    codec_id = _CODEC_IDS.get(name)
    if codec_id is None:
        raise UsageError("unknown codec %r (choose %s)" % (text, CODEC_CHOICES))
    shuffle = 0
    if plus:
        shuffle = int(shuffle_text) if shuffle_text.isascii() and shuffle_text.isdigit() else -1
        if shuffle not in SHUFFLE_SIZES:
            raise UsageError("invalid shuffle in %r: element sizes are 2, 4 or 8" % text)
        if codec_id == CODEC_NONE:
            raise UsageError("none takes no shuffle (got %r)" % text)
    low, high = _LEVEL_RANGES[name]
    if not colon:
        return CodecSpec(codec_id, _DEFAULT_LEVELS[name], shuffle)
    if low == high:
        raise UsageError("codec %s takes no level (got %r)" % (name, text))
    if not level_text:
        raise UsageError(
            "missing level after ':' in %r (write %s for the default level)" % (text, name)
        )
    try:
        level = int(level_text)
    except ValueError:
        level = low - 1
    if not low <= level <= high:
        raise UsageError("invalid level in %r: %s levels are %d..%d" % (text, name, low, high))
    return CodecSpec(codec_id, level, shuffle)


def chunk_codec_name(codec: int) -> str:
    """The name of a chunk's codec byte: `zstd`, `lz4+shuf4`, `?` for an unknown one."""
    name = CODEC_NAMES.get(codec & _CODEC_ID_MASK, "?")
    nibble = codec >> 4
    return name + ("+shuf%d" % (1 << nibble) if nibble else "")


def shuffle_bytes(data: bytes | memoryview, size: int) -> bytes:
    """Group the bytes of `size`-byte elements by position; a tail shorter than one element
    stays at the end as it is."""
    whole = len(data) // size * size
    planes = np.frombuffer(data, dtype=np.uint8, count=whole).reshape(-1, size).T
    return planes.tobytes() + bytes(data[whole:])


def unshuffle_bytes(data: bytes | memoryview, size: int) -> memoryview:
    """Undo `shuffle_bytes`: one strided copy per byte position (about 3 GB/s here; a
    transpose through numpy's generic path is 3 times slower)."""
    whole = len(data) // size * size
    count = whole // size
    src = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(len(data), dtype=np.uint8)
    for k in range(size):
        out[k:whole:size] = src[k * count : (k + 1) * count]
    out[whole:] = src[whole:]
    return out.data


_local = threading.local()
# Per-thread context caches hold at most this many entries each: a pack or a mount uses a
# handful of (level, dictionary) pairs, and a long-lived process must not grow without bound.
_CONTEXT_CACHE_MAX: Final = 64


def _cached(name: str, key: object, make: object) -> object:
    cache: dict[object, object] | None = getattr(_local, name, None)
    if cache is None:
        cache = {}
        setattr(_local, name, cache)
    ctx = cache.get(key)
    if ctx is None:
        if len(cache) >= _CONTEXT_CACHE_MAX:
            # The oldest goes (dicts keep insertion order), not all of them: a context with
            # a large dictionary costs up to 0.3 s to build again (zstd:19, 1 MiB).
            del cache[next(iter(cache))]
        ctx = cache[key] = make()  # type: ignore[operator]
    return ctx


def _zstd_compressor(level: int, dictionary: bytes | None = None) -> zstandard.ZstdCompressor:
    # Dictionaries are keyed by their bytes: Python caches a bytes object's hash, and the
    # pack and the mount reuse one bytes object per dictionary, so a lookup is O(1).
    def make() -> zstandard.ZstdCompressor:
        # Content size in the frame lets any zstd tool decode an object on its own; the
        # checksum is ours (crc32 over the stored bytes), so the frame's is left off.
        if dictionary is None:
            return zstandard.ZstdCompressor(level=level, write_content_size=True)
        return zstandard.ZstdCompressor(
            level=level,
            write_content_size=True,
            dict_data=zstandard.ZstdCompressionDict(dictionary),
        )

    return _cached("zc", (level, dictionary), make)  # type: ignore[return-value]


class _SharedDictionary:
    """A zstd dictionary as every thread of a process decodes with it (`_shared_dictionary`):
    its digested form (zstd's DDict: its entropy tables, and its content by reference) is
    built on its first decode, 0.04-1.2 ms for 64 KiB to 1 MiB, and kept. Built in each
    thread's own decoder, a mount paid it again in every worker thread that met the
    dictionary, and held a copy of the dictionary per thread (up to 1 MiB each)."""

    __slots__ = ("data", "ready")

    def __init__(self, dictionary: bytes) -> None:
        self.data = zstandard.ZstdCompressionDict(dictionary)
        self.ready = False  # (its DDict built: decoded with once)


_shared: dict[bytes, _SharedDictionary] = {}
_shared_lock = threading.Lock()
# Held for a dictionary's first decode: python-zstandard builds the DDict with the GIL
# released, and two threads building it at once would each build one (one leaked).
_first_decode_lock = threading.Lock()


def _shared_dictionary(dictionary: bytes) -> _SharedDictionary:
    """This process's `_SharedDictionary` for `dictionary` (at most _CONTEXT_CACHE_MAX kept,
    the oldest dropped; a thread's decoder keeps its own alive)."""
    with _shared_lock:
        shared = _shared.get(dictionary)
        if shared is None:
            if len(_shared) >= _CONTEXT_CACHE_MAX:
                del _shared[next(iter(_shared))]
            shared = _shared[dictionary] = _SharedDictionary(dictionary)
        return shared


def _zstd_decompressor(
    dictionary: bytes | None = None,
) -> tuple[zstandard.ZstdDecompressor, _SharedDictionary | None]:
    """This thread's zstd decoder for `dictionary`, and the shared dictionary it decodes
    with (None without one)."""

    def make() -> tuple[zstandard.ZstdDecompressor, _SharedDictionary | None]:
        if dictionary is None:
            return zstandard.ZstdDecompressor(), None
        shared = _shared_dictionary(dictionary)
        return zstandard.ZstdDecompressor(dict_data=shared.data), shared

    return _cached("zd", dictionary, make)  # type: ignore[return-value]


def _zstd_decode(stored: bytes | memoryview, size: int, dictionary: bytes | None) -> bytes:
    """`stored`, one zstd frame of `size` bytes, decoded (`_zstd_decompressor`); a
    dictionary's first decode in this process under `_first_decode_lock`."""
    dctx, shared = _zstd_decompressor(dictionary)
    if shared is None or shared.ready:
        return dctx.decompress(stored, max_output_size=size, allow_extra_data=False)
    with _first_decode_lock:
        out = dctx.decompress(stored, max_output_size=size, allow_extra_data=False)
        shared.ready = True
    return out


def _lzma_dict_size(size: int) -> int:
    # The .lzma header records the dictionary size and the decoder allocates that much: the
    # preset's 8 MiB for every 100 KB object would cost more than the decode itself.
    return max(4096, min(1 << max(size - 1, 1).bit_length(), 1 << 26))


def _lzma_filters(level: int, size: int) -> list[dict[str, int]]:
    return [{"id": lzma.FILTER_LZMA1, "preset": level, "dict_size": _lzma_dict_size(size)}]


def prepare(spec: CodecSpec, dictionary: bytes | None = None) -> None:
    """Build this thread's compression context for `spec` and `dictionary` now, as a pack's
    compress thread does once: zstd digests a dictionary on its first frame (0.2-0.35 s for
    1 MiB at level 19, then 2-8 ms a frame), which timing a few objects must not count as a
    cost per byte."""
    if spec.codec_id == CODEC_ZSTD:
        _zstd_compressor(spec.level, dictionary).compress(b"\0")


def compress(data: bytes | memoryview, spec: CodecSpec, dictionary: bytes | None = None) -> bytes:
    """Compress `data` with `spec`; `none` returns the bytes unchanged.

    `dictionary` (zstd and lz4) is a dictionary from `train_dictionary`: a zstd frame records
    its id; an lz4 block refers back into its last 64 KiB as if they preceded the object.
    With `spec.shuffle` the bytes are shuffled first.
    """
    if spec.shuffle:
        data = shuffle_bytes(data, spec.shuffle)
    return _encode(data, spec, dictionary)


def _encode(data: bytes | memoryview, spec: CodecSpec, dictionary: bytes | None) -> bytes:
    if spec.codec_id == CODEC_ZSTD:
        return _zstd_compressor(spec.level, dictionary).compress(data)
    if spec.codec_id == CODEC_LZ4:
        extra = {"dict": dictionary} if dictionary is not None else {}
        if spec.level:
            return lz4.block.compress(
                data, store_size=False, mode="high_compression", compression=spec.level, **extra
            )
        return lz4.block.compress(data, store_size=False, **extra)
    if dictionary is not None:
        raise ValueError("only zstd and lz4 take a dictionary, not %s" % spec)
    if spec.codec_id == CODEC_BROTLI:
        return brotli.compress(bytes(data), quality=spec.level)
    if spec.codec_id == CODEC_LZMA:
        return lzma.compress(
            data, format=lzma.FORMAT_ALONE, filters=_lzma_filters(spec.level, len(data))
        )
    return bytes(data)


def looks_incompressible(data: bytes | memoryview, dictionary: bytes | None = None) -> bool:
    """Guess cheaply whether `data` is not worth compressing (JPEG, PNG, random bytes).

    With a `dictionary` the probe uses it: a 200-byte JSON record does not shrink on its own,
    but does against a dictionary trained on its siblings.
    """
    probe = data[:PROBE_BYTES]
    if len(probe) < 64:
        return False
    return len(_zstd_compressor(1, dictionary).compress(probe)) > len(probe) * (1 - MIN_SAVING)


def compress_object(
    data: bytes | memoryview, spec: CodecSpec, dictionary: bytes | None = None
) -> tuple[int, bytes]:
    """Compress one object for a pack: returns (the chunk's codec byte, stored bytes).

    Objects that do not shrink by `MIN_SAVING` are stored raw (codec `none`, unshuffled), so
    they cost no decode time on the read path. With a shuffle the probe sees the object's
    head shuffled on its own (every byte plane, not just the first): float arrays that no
    codec shrinks as they are may shrink once shuffled.
    """
    if spec.codec_id == CODEC_NONE or not data:
        return CODEC_NONE, bytes(data)
    head = shuffle_bytes(data[:PROBE_BYTES], spec.shuffle) if spec.shuffle else data
    if looks_incompressible(head, dictionary):
        return CODEC_NONE, bytes(data)
    stored = _encode(shuffle_bytes(data, spec.shuffle) if spec.shuffle else data, spec, dictionary)
    if len(stored) > len(data) * (1 - MIN_SAVING):
        return CODEC_NONE, bytes(data)
    return spec.chunk_codec, stored


def decompress(
    codec: int, stored: bytes | memoryview, size: int, dictionary: bytes | None = None
) -> bytes | memoryview:
    """Decode one stored object that must decode to exactly `size` bytes.

    `codec` is the chunk's codec byte: the codec id, and in the high 4 bits the byte shuffle
    to undo after decoding. Returns `stored` itself for codec `none` (no copy). `dictionary`
    is the dictionary the object was compressed with (None for none).

    Bounded: whatever the stored bytes claim, no decoder produces or allocates much more than
    `size` bytes (a chunk is untrusted input, and a 64 KiB chunk could otherwise decode to
    gigabytes): a zstd frame must declare exactly `size` (frames record their content size,
    and the decoder would allocate whatever they declare), brotli decodes under an output
    cap, lzma under a memory limit fitted to `size`, lz4 into a `size` buffer.

    Raises:
        DecompressionError: a codec error, a wrong decoded size, trailing data, an unknown
            codec byte, or a dictionary on a codec other than zstd and lz4.
    """
    codec_id, nibble = codec & _CODEC_ID_MASK, codec >> 4
    if nibble > len(SHUFFLE_SIZES) or (nibble and codec_id == CODEC_NONE):
        raise DecompressionError("unknown codec id %d" % codec)
    if codec == CODEC_NONE and dictionary is None:
        out: bytes | memoryview = stored
    else:
        try:
            if codec_id == CODEC_ZSTD:
                declared = zstandard.frame_content_size(stored)
                if declared != size:
                    raise DecompressionError(
                        "zstd: frame declares %s bytes, expected %d"
                        % ("an unknown number of" if declared < 0 else declared, size)
                    )
                out = _zstd_decode(stored, size, dictionary)
            elif codec_id == CODEC_LZ4:
                if dictionary is None:
                    out = lz4.block.decompress(stored, uncompressed_size=size)
                else:
                    out = lz4.block.decompress(stored, uncompressed_size=size, dict=dictionary)
            elif dictionary is not None:
                raise DecompressionError(
                    "%s chunk refers to a dictionary (only zstd and lz4 take one)"
                    % CODEC_NAMES.get(codec_id, "unknown codec")
                )
            elif codec_id == CODEC_BROTLI:
                out = _brotli_decode(stored, size)
            elif codec_id == CODEC_LZMA:
                out = _lzma_decode(stored, size)
            else:
                raise DecompressionError("unknown codec id %d" % codec)
        except (zstandard.ZstdError, lz4.block.LZ4BlockError, brotli.error, lzma.LZMAError) as exc:
            raise DecompressionError("%s: %s" % (CODEC_NAMES[codec_id], exc)) from exc
    if len(out) != size:
        raise DecompressionError(
            "%s: decoded %d bytes, expected %d" % (CODEC_NAMES.get(codec_id, "?"), len(out), size)
        )
    if nibble:
        return unshuffle_bytes(out, 1 << nibble)
    return out


def _brotli_decode(stored: bytes | memoryview, size: int) -> bytes:
    # The output buffer grows by doubling and stops growing once it holds more than `size`:
    # at most about twice `size` is ever allocated. More output than `size`, or a stream that
    # does not end with its input, is corrupt.
    decoder = brotli.Decompressor()
    out = decoder.process(stored, output_buffer_limit=size + 1)
    if len(out) > size:
        raise DecompressionError("brotli: stream decodes to more than %d bytes" % size)
    if not decoder.is_finished():
        raise DecompressionError("brotli: stream is truncated")
    return out


# lzma's decoder allocates its dictionary plus probability tables and buffers; a stream
# that asks for more than the writer would use for `size` bytes is refused.
_LZMA_MEMORY_SLACK: Final = 1 << 20


def _lzma_decode(stored: bytes | memoryview, size: int) -> bytes:
    decoder = lzma.LZMADecompressor(
        format=lzma.FORMAT_ALONE, memlimit=_lzma_dict_size(size) + _LZMA_MEMORY_SLACK
    )
    out = decoder.decompress(stored, max_length=size)
    # Stopped at the cap: only the end marker may be left.
    if not decoder.eof and len(out) == size and decoder.decompress(b"", max_length=1):
        raise DecompressionError("lzma: stream decodes to more than %d bytes" % size)
    if not decoder.eof or decoder.unused_data:
        raise DecompressionError("lzma: stream is truncated or has trailing data")
    return out


# Dictionaries are only worth it for small objects. zstd's CLI caps dictionaries at 110 KiB,
# but on real source and text classes a 1 MiB dictionary still gains: zstd:19 on Go sources
# 5.10x with 256 KiB, 5.45x with 1 MiB (Python 5.52x / 5.71x, Ruby ri files 4.42x / 4.97x),
# at the same decode speed (docs/benchmarks.md, "The optimizer on real data"). Packs written before
# held at most 112 KiB; readers accept up to DICT_MAX_BYTES (the bound of what a reader copies).
DICT_MAX_BYTES: Final = 1024 * 1024
DICT_MIN_BYTES: Final = 1024
# Training needs this many samples at least (zstd refuses fewer than a handful).
DICT_MIN_SAMPLES: Final = 16
# zstd's trainer with fixed segment parameters (k, d) instead of its parameter search: 50-100
# times faster (0.04 s instead of 1.6-2.9 s for 2 MiB of samples here) at the same ratio
# within 1% on Python, Go, JSON and ri files.
DICT_TRAIN_K: Final = 1024
DICT_TRAIN_D: Final = 8


def dictionary_size(training_bytes: int) -> int:
    """The default dictionary size for a training set of `training_bytes`: a quarter of it,
    within DICT_MIN_BYTES..DICT_MAX_BYTES (zstd needs samples several times the size)."""
    return max(DICT_MIN_BYTES, min(DICT_MAX_BYTES, training_bytes // 4))


def train_dictionary(samples: list[bytes], size: int | None = None) -> bytes | None:
    """Train a zstd dictionary of `size` bytes (default `dictionary_size`) on `samples`; None
    when there is too little to learn from.

    Deterministic: the same samples give the same bytes (one thread, fixed parameters; zstd
    derives the dictionary id from its content).
    """
    total = sum(len(s) for s in samples)
    if len(samples) < DICT_MIN_SAMPLES or total < 8 * DICT_MIN_BYTES:
        return None
    if size is None:
        size = dictionary_size(total)
    size = max(DICT_MIN_BYTES, min(size, DICT_MAX_BYTES))
    try:
        trained = zstandard.train_dictionary(
            size, samples, k=DICT_TRAIN_K, d=DICT_TRAIN_D, threads=1
        )
    except zstandard.ZstdError:
        return None
    return trained.as_bytes()


# --- the index file (format version 6) ----------------------------------------------------------


def zstd_compress_file(src: BinaryIO, dst: BinaryIO, size: int, level: int, piece: int) -> None:
    """Compress `size` bytes of `src` into one zstd frame on `dst` (the size in its header),
    `piece` bytes at a time."""
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True)
    cctx.copy_stream(src, dst, size=size, read_size=piece, write_size=piece)


def zstd_decode_exact(stored: memoryview, out: memoryview, piece: int) -> int:
    """Decode the zstd frame `stored` into `out`, `piece` bytes at a time, never writing past
    it; returns how many bytes the frame gave, or len(out) + 1 if it has more than `out`
    holds (the rest is never decoded).

    Raises:
        DecompressionError: `stored` is not a zstd frame, or a damaged one.
    """
    done = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(stored, read_across_frames=False) as src:
            while done < len(out):
                got = src.readinto(out[done : done + piece])
                if not got:
                    return done
                done += got
            return done + 1 if src.read(1) else done
    except zstandard.ZstdError as exc:
        raise DecompressionError("zstd: %s" % exc) from exc
