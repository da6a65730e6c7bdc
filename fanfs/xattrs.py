"""The extended attributes a fanfs mount answers: one definition for the daemon and the
commands that read them (`fanfs stats`, `fanfs umount`, hint clients). docs/errors.md and
the README list what each holds."""

from __future__ import annotations

from typing import Final

PREFIX: Final = "user.fanfs."

# On every regular file.
CODEC: Final = PREFIX + "codec"
STORED_SIZE: Final = PREFIX + "stored_size"
CHUNKS: Final = PREFIX + "chunks"
PARTITIONS: Final = PREFIX + "partitions"

# On the mount's root.
STATS: Final = PREFIX + "stats"
PACK: Final = PREFIX + "pack"
PID: Final = PREFIX + "pid"
VERSION: Final = PREFIX + "version"
HINTS: Final = PREFIX + "hints"  # only while the hint socket is served

FILE: Final = tuple(name.encode() for name in (CODEC, STORED_SIZE, CHUNKS, PARTITIONS))
ROOT: Final = tuple(name.encode() for name in (STATS, PACK, PID, VERSION))
