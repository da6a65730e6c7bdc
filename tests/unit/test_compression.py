"""Codecs: round trips, raw storage of incompressible data, corrupt input, --codec parsing."""

from __future__ import annotations

import concurrent.futures
import random
import re
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fanfs.compression import (
    CODEC_BROTLI,
    CODEC_LZ4,
    CODEC_NAMES,
    CODEC_NONE,
    CODEC_ZSTD,
    CodecSpec,
    chunk_codec_name,
    compress,
    compress_object,
    decompress,
    parse_codec,
    shuffle_bytes,
    unshuffle_bytes,
)
from fanfs.errors import CorruptDataError, DecompressionError, UsageError

SPECS = [
    "none",
    "lz4",
    "zstd:1",
    "zstd:19",
    "brotli:0",
    "brotli:11",
    "lz4+shuf4",
    "zstd:1+shuf2",
    "lz4hc:9+shuf8",
]
COMPRESSING_SPECS = [s for s in SPECS if s != "none"]


def _text(n: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    words = [b"image", b"label", b"tensor", b"epoch", b"batch", b"0.125", b"\n", b"class_042"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


DATA = {
    "empty": b"",
    "one_byte": b"x",
    "random_100k": random.Random(1).randbytes(100_000),
    "zeros_1mib": bytes(1024 * 1024),
    "text_200k": _text(200_000),
}
COMPRESSIBLE = ("zeros_1mib", "text_200k")
BUFFERS: dict[str, Callable[[bytes], bytes | bytearray | memoryview]] = {
    "bytes": bytes,
    "bytearray": bytearray,
    "memoryview": memoryview,
}


def _shuffled_text(spec: CodecSpec, kind: str) -> bool:
    """Text shuffled as 4-byte elements loses most of its repeats: a shuffle is for arrays."""
    return bool(spec.shuffle) and kind.startswith("text")


@pytest.fixture(params=SPECS)
def spec(request: pytest.FixtureRequest) -> CodecSpec:
    return parse_codec(request.param)


@pytest.mark.parametrize("buffer", BUFFERS)
@pytest.mark.parametrize("kind", DATA)
def test_round_trip(spec: CodecSpec, kind: str, buffer: str) -> None:
    data = DATA[kind]
    stored = compress(BUFFERS[buffer](data), spec)
    # The read path hands decompress a view into a mapped partition, so decode a view.
    out = decompress(spec.chunk_codec, memoryview(stored), len(data))
    assert bytes(out) == data
    assert bytes(decompress(spec.chunk_codec, stored, len(data))) == data
    if spec.codec_id == CODEC_NONE:
        assert stored == data
    elif kind in COMPRESSIBLE and not _shuffled_text(spec, kind):
        assert len(stored) < len(data) // 2, "%s did not compress %s" % (spec, kind)


@pytest.mark.parametrize("buffer", BUFFERS)
@pytest.mark.parametrize("spec_text", COMPRESSING_SPECS)
def test_compress_object_stores_random_data_raw(spec_text: str, buffer: str) -> None:
    data = DATA["random_100k"]
    codec, stored = compress_object(BUFFERS[buffer](data), parse_codec(spec_text))
    assert codec == CODEC_NONE
    assert type(stored) is bytes
    assert stored == data


@pytest.mark.parametrize("buffer", BUFFERS)
@pytest.mark.parametrize("kind", COMPRESSIBLE)
@pytest.mark.parametrize("spec_text", COMPRESSING_SPECS)
def test_compress_object_compresses_compressible_data(
    spec_text: str, kind: str, buffer: str
) -> None:
    spec, data = parse_codec(spec_text), DATA[kind]
    codec, stored = compress_object(BUFFERS[buffer](data), spec)
    assert codec == spec.chunk_codec
    assert type(stored) is bytes
    assert len(stored) < len(data) * (0.7 if _shuffled_text(spec, kind) else 0.5)
    assert bytes(decompress(codec, stored, len(data))) == data


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"x",
        b"0123456789abcdef",  # under the 64-byte probe minimum: tried, kept raw
        bytes(16 * 1024)
        + random.Random(2).randbytes(1024 * 1024),  # probe shrinks, whole not by 3%
    ],
    ids=["empty", "one_byte", "tiny", "compressible_head_random_body"],
)
def test_compress_object_keeps_raw_what_does_not_shrink(data: bytes) -> None:
    codec, stored = compress_object(data, parse_codec("zstd:3"))
    assert (codec, stored) == (CODEC_NONE, data)


def test_compress_object_with_codec_none_never_compresses() -> None:
    assert compress_object(DATA["zeros_1mib"], parse_codec("none")) == (
        CODEC_NONE,
        DATA["zeros_1mib"],
    )


# --- corrupt, truncated and mis-sized input -------------------------------------------------
# A flipped byte in the middle of a stream is not always detectable by the codec itself
# (zstd frames are written without their own checksum); the pack's crc32 catches those.
# What the codec layer promises: input it cannot decode is a DecompressionError, never a
# library exception, never bytes of the wrong length.

STORED = {s: compress(DATA["text_200k"], parse_codec(s)) for s in COMPRESSING_SPECS}


def _flip_first(b: bytes) -> bytes:
    return bytes([b[0] ^ 0xFF]) + b[1:]


@pytest.mark.parametrize(
    "corrupt",
    [lambda b: b"\xff" * 64, lambda b: bytes(64), _flip_first],
    ids=["garbage", "zeros", "bad_header"],
)
@pytest.mark.parametrize("spec_text", COMPRESSING_SPECS)
def test_corrupt_input_raises(spec_text: str, corrupt: Callable[[bytes], bytes]) -> None:
    spec = parse_codec(spec_text)
    with pytest.raises(DecompressionError, match="^%s: " % CODEC_NAMES[spec.codec_id]) as info:
        decompress(spec.chunk_codec, corrupt(STORED[spec_text]), len(DATA["text_200k"]))
    assert isinstance(info.value, CorruptDataError)
    assert info.value.exit_code == 3


@pytest.mark.parametrize(
    "keep", [0, 1, 0.5, -1], ids=["nothing", "one_byte", "half", "all_but_last"]
)
@pytest.mark.parametrize("spec_text", COMPRESSING_SPECS)
def test_truncated_input_raises(spec_text: str, keep: float) -> None:
    spec, stored = parse_codec(spec_text), STORED[spec_text]
    cut = (
        int(len(stored) * keep)
        if isinstance(keep, float)
        else keep
        if keep >= 0
        else len(stored) + keep
    )
    with pytest.raises(DecompressionError, match="^%s: " % CODEC_NAMES[spec.codec_id]):
        decompress(spec.chunk_codec, stored[:cut], len(DATA["text_200k"]))


def test_truncated_raw_object_raises() -> None:
    with pytest.raises(DecompressionError, match=r"^none: decoded 99 bytes, expected 100$"):
        decompress(CODEC_NONE, bytes(99), 100)


@pytest.mark.parametrize("delta", [-1, +1, -1000, +1000])
@pytest.mark.parametrize("spec_text", SPECS)
def test_wrong_expected_size_raises(spec_text: str, delta: int) -> None:
    spec, data = parse_codec(spec_text), DATA["text_200k"]
    stored = STORED.get(spec_text, data)
    with pytest.raises(DecompressionError, match="^%s: " % CODEC_NAMES[spec.codec_id]):
        decompress(spec.chunk_codec, stored, len(data) + delta)


@pytest.mark.parametrize(
    ("spec_text", "codec_name"), [("zstd:1", "zstd"), ("brotli:0", "brotli"), ("none", "none")]
)
def test_wrong_expected_size_message(spec_text: str, codec_name: str) -> None:
    data = DATA["text_200k"]
    stored = STORED.get(spec_text, data)
    n = len(data)
    expected = "%s: decoded %d bytes, expected %d" % (codec_name, n, n + 1)
    if codec_name == "zstd":  # the frame's header says so before anything is decoded
        expected = "zstd: frame declares %d bytes, expected %d" % (n, n + 1)
    with pytest.raises(DecompressionError, match="^%s$" % re.escape(expected)):
        decompress(parse_codec(spec_text).codec_id, stored, n + 1)


def test_unknown_codec_id_raises() -> None:
    with pytest.raises(DecompressionError, match=r"^unknown codec id 9$"):
        decompress(9, b"abc", 3)


# --- byte shuffle -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, 4, 8])
@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 31, 4096, 4099])
def test_shuffle_round_trip_with_any_tail(size: int, length: int) -> None:
    data = random.Random(length).randbytes(length)
    shuffled = shuffle_bytes(data, size)
    assert len(shuffled) == length
    assert bytes(unshuffle_bytes(shuffled, size)) == data
    whole = length // size * size
    if whole:  # the first plane is every element's first byte
        assert shuffled[: whole // size] == data[0:whole:size]
    assert shuffled[whole:] == data[whole:]


def _float16_in_float32(count: int) -> bytes:
    rng = np.random.default_rng(3)
    return rng.standard_normal(count).astype(np.float16).astype("<f4").tobytes()


def test_shuffle_helps_arrays_and_is_undone_on_decode() -> None:
    data = _float16_in_float32(64 * 1024)
    plain = compress_object(data, parse_codec("lz4hc:9"))
    codec, stored = compress_object(data, parse_codec("lz4hc:9+shuf4"))
    assert codec == CODEC_LZ4 | 2 << 4 == 0x21
    assert chunk_codec_name(codec) == "lz4+shuf4"
    assert len(stored) < 0.85 * len(plain[1])  # 1.40x -> 1.77x on this data
    assert bytes(decompress(codec, memoryview(stored), len(data))) == data


def test_shuffle_finds_what_the_plain_probe_calls_incompressible() -> None:
    # A smooth float32 field: lz4 sees no repeats, the shuffled exponent bytes repeat.
    rng = np.random.default_rng(4)
    data = np.cumsum(rng.standard_normal(64 * 1024) * 0.01).astype("<f4").tobytes()
    assert compress_object(data, parse_codec("lz4"))[0] == CODEC_NONE
    codec, stored = compress_object(data, parse_codec("lz4+shuf4"))
    assert codec == 0x21 and len(stored) < 0.85 * len(data)
    assert bytes(decompress(codec, stored, len(data))) == data


def test_shuffled_data_that_does_not_shrink_is_stored_raw_unshuffled() -> None:
    data = DATA["random_100k"]
    assert compress_object(data, parse_codec("zstd:3+shuf8")) == (CODEC_NONE, data)


@pytest.mark.parametrize("codec", [0x10, 0x15, 0x42, 0xF1])
def test_unknown_shuffle_or_shuffled_raw_is_an_unknown_codec(codec: int) -> None:
    with pytest.raises(DecompressionError, match="^unknown codec id %d$" % codec):
        decompress(codec, b"abcd", 4)


# --- parse_codec ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "codec_id", "level", "shown"),
    [
        ("none", CODEC_NONE, 0, "none"),
        ("lz4", CODEC_LZ4, 0, "lz4"),
        ("zstd", CODEC_ZSTD, 3, "zstd:3"),
        ("zstd:1", CODEC_ZSTD, 1, "zstd:1"),
        ("zstd:19", CODEC_ZSTD, 19, "zstd:19"),
        ("zstd:22", CODEC_ZSTD, 22, "zstd:22"),
        ("brotli", CODEC_BROTLI, 5, "brotli:5"),
        ("brotli:0", CODEC_BROTLI, 0, "brotli:0"),
        ("brotli:11", CODEC_BROTLI, 11, "brotli:11"),
        ("ZSTD:7", CODEC_ZSTD, 7, "zstd:7"),
        (" lz4 ", CODEC_LZ4, 0, "lz4"),
        ("lz4+shuf4", CODEC_LZ4, 0, "lz4+shuf4"),
        ("lz4hc:9+shuf2", CODEC_LZ4, 9, "lz4hc:9+shuf2"),
        ("zstd+shuf8", CODEC_ZSTD, 3, "zstd:3+shuf8"),
    ],
)
def test_parse_codec_accepts(text: str, codec_id: int, level: int, shown: str) -> None:
    spec = parse_codec(text)
    assert (spec.codec_id, spec.level, str(spec)) == (codec_id, level, shown)
    assert parse_codec(str(spec)) == spec  # what the manifest records parses back


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "gzip",
            "unknown codec 'gzip' (choose none, lz4, lz4hc[:LEVEL], zstd[:LEVEL], brotli[:LEVEL] or lzma[:LEVEL], optionally +shuf2|4|8)",
        ),
        (
            "",
            "unknown codec '' (choose none, lz4, lz4hc[:LEVEL], zstd[:LEVEL], brotli[:LEVEL] or lzma[:LEVEL], optionally +shuf2|4|8)",
        ),
        (
            "zstd3",
            "unknown codec 'zstd3' (choose none, lz4, lz4hc[:LEVEL], zstd[:LEVEL], brotli[:LEVEL] or lzma[:LEVEL], optionally +shuf2|4|8)",
        ),
        ("zstd:fast", "invalid level in 'zstd:fast': zstd levels are 1..22"),
        ("zstd:1.5", "invalid level in 'zstd:1.5': zstd levels are 1..22"),
        ("zstd:0", "invalid level in 'zstd:0': zstd levels are 1..22"),
        ("zstd:23", "invalid level in 'zstd:23': zstd levels are 1..22"),
        ("zstd:-1", "invalid level in 'zstd:-1': zstd levels are 1..22"),
        ("brotli:12", "invalid level in 'brotli:12': brotli levels are 0..11"),
        ("brotli:-1", "invalid level in 'brotli:-1': brotli levels are 0..11"),
        ("brotli:max", "invalid level in 'brotli:max': brotli levels are 0..11"),
        ("zstd:", "missing level after ':' in 'zstd:' (write zstd for the default level)"),
        (
            "brotli:+shuf4",
            "missing level after ':' in 'brotli:+shuf4' (write brotli for the default level)",
        ),
        ("lz4:", "codec lz4 takes no level (got 'lz4:')"),
        ("lz4:3", "codec lz4 takes no level (got 'lz4:3')"),
        ("none:0", "codec none takes no level (got 'none:0')"),
        ("zstd+shuf3", "invalid shuffle in 'zstd+shuf3': element sizes are 2, 4 or 8"),
        ("zstd:3+shuf", "invalid shuffle in 'zstd:3+shuf': element sizes are 2, 4 or 8"),
        ("lz4+shuf16", "invalid shuffle in 'lz4+shuf16': element sizes are 2, 4 or 8"),
        ("none+shuf4", "none takes no shuffle (got 'none+shuf4')"),
        ("zstd+shuf²", "invalid shuffle in 'zstd+shuf²': element sizes are 2, 4 or 8"),
        (
            "zstd:3+dict",
            "a dictionary is trained per class: give 'zstd:3+dict' in --codecs with --codec auto",
        ),
        (
            "zstd+shuf4+dict",
            "a dictionary is trained per class: give 'zstd+shuf4+dict' in --codecs with --codec auto",
        ),
    ],
)
def test_parse_codec_rejects(text: str, message: str) -> None:
    with pytest.raises(UsageError, match="^%s$" % re.escape(message)) as info:
        parse_codec(text)
    assert info.value.exit_code == 2


# --- threads ----------------------------------------------------------------------------------


def test_concurrent_decompress_from_eight_threads() -> None:
    objects = []
    for spec_text in SPECS:
        spec = parse_codec(spec_text)
        for kind in ("zeros_1mib", "text_200k", "random_100k"):
            data = DATA[kind]
            objects.append((spec.chunk_codec, compress(data, spec), data))
    rounds = 12

    def work(i: int) -> bool:
        codec, stored, data = objects[i % len(objects)]
        return bytes(decompress(codec, stored, len(data))) == data

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(rounds * len(objects))))
    assert len(results) == rounds * len(objects)
    assert all(results)


def test_concurrent_compress_object_from_eight_threads() -> None:
    # compress_object keeps per-thread zstd contexts; overlapping use must not mix streams.
    inputs = [_text(50_000 + 997 * i, seed=i) for i in range(32)]
    spec = parse_codec("zstd:3")

    def work(data: bytes) -> bytes:
        codec, stored = compress_object(data, spec)
        return bytes(decompress(codec, stored, len(data)))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(work, inputs * 4)) == inputs * 4


# --- fuzzing ----------------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=5000), spec_text=st.sampled_from(SPECS))
def test_fuzz_round_trip(data: bytes, spec_text: str) -> None:
    spec = parse_codec(spec_text)
    codec, stored = compress_object(data, spec)
    assert bytes(decompress(codec, stored, len(data))) == data
    assert bytes(decompress(spec.chunk_codec, compress(data, spec), len(data))) == data


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    stored=st.binary(max_size=2000),
    codec=st.sampled_from([CODEC_LZ4, CODEC_ZSTD, CODEC_BROTLI]),
    size=st.integers(min_value=0, max_value=100_000),
)
def test_fuzz_garbage_is_an_error_or_exact_size(stored: bytes, codec: int, size: int) -> None:
    try:
        out = decompress(codec, stored, size)
    except DecompressionError:
        return
    assert len(out) == size


def test_a_full_context_cache_drops_its_oldest_context_not_all_of_them() -> None:
    # A context with a large dictionary costs up to 0.3 s to build: the plan, which cycles
    # through more (level, dictionary) pairs than the cache holds, rebuilt them all whenever
    # it filled.
    from fanfs import compression

    made: list[int] = []

    def maker(i: int) -> Callable[[], object]:
        return lambda: made.append(i) or i

    for i in range(compression._CONTEXT_CACHE_MAX + 1):
        compression._cached("test_ctx", i, maker(i))
    assert made == list(range(compression._CONTEXT_CACHE_MAX + 1))
    compression._cached("test_ctx", 1, maker(1))  # still cached
    assert len(made) == compression._CONTEXT_CACHE_MAX + 1
    compression._cached("test_ctx", 0, maker(0))  # the oldest: dropped, built again
    assert made[-1] == 0 and len(made) == compression._CONTEXT_CACHE_MAX + 2
