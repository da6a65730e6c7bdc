"""Forging packs for the hostile-pack tests: change any field, then recompute every checksum
so that the forgery looks valid (the attacker of docs/security.md can write the whole pack).

`PackImage` holds a pack in memory as plain Python and numpy values, parsed here from the
bytes (not through fanfs.format), and writes it back. `reference_read` decodes a file of a
pack the simplest possible way, straight from docs/format.md section 4: the oracle the
mount's bytes are compared with.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from fanfs.compression import decompress
from fanfs.errors import CorruptDataError

HEADER = struct.Struct("<8sIII")
MAGIC = b"FANFSPK\n"


def manifest_bytes(manifest: dict[str, Any], version: int | None = None) -> bytes:
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return raw_manifest(body, manifest["format_version"] if version is None else version)


def raw_manifest(body: bytes, version: int) -> bytes:
    """A manifest file around any body, with a valid header and crc32."""
    return HEADER.pack(MAGIC, version, len(body), zlib.crc32(body)) + body


def bound_crc(stored: bytes, cid: int, version: int) -> int:
    crc = zlib.crc32(stored)
    return zlib.crc32(struct.pack("<Q", cid), crc) if version >= 4 else crc


class PackImage:
    """A pack, editable. `columns` are writable numpy copies in the manifest's column order."""

    def __init__(self, pack: Path) -> None:
        raw = (pack / "fanfs.manifest").read_bytes()
        _, self.version, length, _ = HEADER.unpack_from(raw)
        self.manifest: dict[str, Any] = json.loads(raw[HEADER.size : HEADER.size + length])
        blob = (pack / "index").read_bytes()
        meta = self.manifest["index"]
        if meta.get("codec") == "zstd":  # version 6: saved uncompressed (`save`)
            blob = zstandard.ZstdDecompressor().decompress(blob, max_output_size=meta["usize"])
        self.columns: dict[str, np.ndarray] = {}
        for col in self.manifest["index"]["columns"]:
            data = blob[col["offset"] : col["offset"] + col["length"]]
            self.columns[col["name"]] = np.frombuffer(data, dtype=col["dtype"]).copy()
        self.parts = [
            bytearray((pack / p["file"]).read_bytes()) for p in self.manifest["partitions"]
        ]

    # Editing helpers ---------------------------------------------------------------------
    def chunk(self, cid: int) -> bytes:
        c = self.columns
        start = int(c["offset"][cid])
        return bytes(self.parts[int(c["partition"][cid])][start : start + int(c["csize"][cid])])

    def set_chunk(self, cid: int, stored: bytes, *, crc: bool = True) -> None:
        """Store new bytes for chunk `cid` at the end of its partition (its checksum made
        to match unless crc=False)."""
        c = self.columns
        part = self.parts[int(c["partition"][cid])]
        c["offset"][cid] = len(part)
        c["csize"][cid] = len(stored)
        part += stored
        if crc:
            c["crc32"][cid] = bound_crc(stored, cid, self.version)

    def entry_of(self, rel: bytes) -> int:
        c, names = self.columns, self.columns["names"].tobytes()
        entry = 0
        for part in rel.split(b"/"):
            first, count = int(c["first"][entry]), int(c["count"][entry])
            found = [
                e
                for e in range(first, first + count)
                if names[int(c["name_off"][e]) : int(c["name_off"][e]) + int(c["name_len"][e])]
                == part
            ]
            assert found, rel
            entry = found[0]
        return entry

    # Writing -----------------------------------------------------------------------------
    def save(
        self,
        dst: Path,
        *,
        after: Callable[[dict[str, Any]], None] | None = None,
        dict_crcs: bool = True,
    ) -> Path:
        """Write the pack to `dst` (replaced) with index, partition, dictionary and manifest
        checksums and sizes recomputed; `after` may then change the manifest further (to
        forge a field this method derives)."""
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        manifest = json.loads(json.dumps(self.manifest))
        blob = bytearray()
        for col in manifest["index"]["columns"]:
            data = self.columns[col["name"]].astype(col["dtype"]).tobytes()
            col["offset"], col["length"] = len(blob), len(data)
            blob += data + b"\0" * (-len(data) % 8)
        manifest["index"]["size"] = len(blob)
        manifest["index"]["crc32"] = zlib.crc32(blob)
        if "codec" in manifest["index"]:
            manifest["index"]["codec"], manifest["index"]["usize"] = "none", len(blob)
        if dict_crcs:
            dicts = self.columns.get("dicts", np.zeros(0, np.uint8)).tobytes()
            for meta in manifest.get("dictionaries", []):
                if (
                    isinstance(meta, dict)
                    and isinstance(meta.get("offset"), int)
                    and isinstance(meta.get("size"), int)
                ):
                    meta["crc32"] = zlib.crc32(
                        dicts[meta["offset"] : meta["offset"] + meta["size"]]
                    )
        for number, data in enumerate(self.parts):
            meta = manifest["partitions"][number]
            meta["size"], meta["crc32"] = len(data), zlib.crc32(data)
            (dst / ("part-%05d" % number)).write_bytes(data)
        (dst / "index").write_bytes(blob)
        if after is not None:
            after(manifest)
        (dst / "fanfs.manifest").write_bytes(manifest_bytes(manifest, self.version))
        return dst


def reference_read(
    pack: Path | PackImage, rel: bytes | None = None, *, entry: int | None = None
) -> bytes | None:
    """A file's bytes per docs/format.md section 4, or None if any chunk is corrupt (bad
    checksum or decode). Independent of fanfs.format: only the codecs are shared."""
    image = pack if isinstance(pack, PackImage) else PackImage(pack)
    c = image.columns
    if entry is None:
        assert rel is not None
        entry = image.entry_of(rel)
    cs = image.manifest["chunk_size"]
    size, first, count = int(c["size"][entry]), int(c["first"][entry]), int(c["count"][entry])
    dicts = c.get("dicts", np.zeros(0, np.uint8)).tobytes()
    metas = image.manifest.get("dictionaries", [])
    out = bytearray()
    for k in range(count):
        cid = first + k
        stored = image.chunk(cid)
        if bound_crc(stored, cid, image.version) != int(c["crc32"][cid]):
            return None
        dict_id = int(c["dict"][cid]) if "dict" in c else 0
        dictionary = None
        if dict_id:
            meta = metas[dict_id - 1]
            dictionary = dicts[meta["offset"] : meta["offset"] + meta["size"]]
        usize = min(cs, size - k * cs)
        # Version 7: a slice of a solid block decodes the whole block.
        bsize = int(c["bsize"][cid]) if "bsize" in c else 0
        skip = int(c["skip"][cid]) if "skip" in c else 0
        try:
            data = decompress(int(c["codec"][cid]), stored, bsize or usize, dictionary)
        except CorruptDataError:
            return None
        out += data[skip : skip + usize]
    return bytes(out)


def copy_pack(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def make_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)
