"""Candidate codecs: the default list and `--codecs` parsing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from fanfs.compression import (
    CODEC_NONE,
    DICT_CODECS,
    CodecSpec,
    parse_codec,
)
from fanfs.errors import UsageError

# Candidates profiled by default. zstd levels: decode speed barely depends on the level, so a
# subset spans the ratio/compress-time curve; dictionaries only help small objects: lz4hc
# with a dictionary keeps lz4's decode speed (about 4 us per 4 KB JSON record here, a zstd
# frame costs twice that) and takes such records from 1.6x to 2.3x. The byte shuffles help
# numeric arrays (float32 embeddings holding float16 values: lz4hc:9 1.40x, +shuf4 1.77x;
# a smooth float32 field: 1.00x and 1.34x) and cost the unshuffle (about 3 GB/s).
DEFAULT_CODECS: Final = (
    "none lz4 lz4hc:9 lz4hc:9+dict zstd:1 zstd:3 zstd:6 zstd:9 zstd:12 zstd:15 zstd:19 "
    "zstd:3+dict zstd:9+dict zstd:19+dict brotli:1 brotli:5 brotli:9 brotli:11 lzma:6 "
    "lz4+shuf4 lz4hc:9+shuf4 zstd:1+shuf4 zstd:19+shuf4 lz4hc:9+shuf2 zstd:1+shuf2"
)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A codec choice for a class: a codec and level, optionally with a trained dictionary."""

    spec: CodecSpec
    use_dict: bool = False

    def __str__(self) -> str:
        return "%s+dict" % self.spec if self.use_dict else str(self.spec)


NONE: Final = Candidate(CodecSpec(CODEC_NONE, 0))


def parse_candidates(text: str) -> tuple[Candidate, ...]:
    """Parse `--codecs` ("zstd:3 lz4 zstd:9+dict lz4hc:9+shuf4", commas or spaces); `none` is
    always in."""
    out = [NONE]
    for word in text.replace(",", " ").split():
        use_dict = "+dict" in word.lower()
        spec = parse_codec(word.lower().replace("+dict", "", 1))
        if use_dict and spec.codec_id not in DICT_CODECS:
            raise UsageError("only zstd and lz4 take a dictionary (got %r)" % word)
        if use_dict and spec.shuffle:
            # The dictionary is trained on the class's bytes as they are, not shuffled.
            raise UsageError("a dictionary does not combine with a shuffle (got %r)" % word)
        cand = Candidate(spec, use_dict)
        if cand not in out:
            out.append(cand)
    return tuple(out)
