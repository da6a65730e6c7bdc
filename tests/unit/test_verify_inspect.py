"""`fanfs verify` (every checksum, damaged files named) and `fanfs inspect` (a summary)."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
from pathlib import Path

import pytest

from fanfs import __version__
from fanfs._sizes import format_size
from fanfs.compression import CODEC_NONE, CODEC_ZSTD
from fanfs.format.index import ROOT_ID
from fanfs.format.layout import FORMAT_VERSION, MANIFEST_NAME, PLAIN_FORMAT_VERSION
from tests.conftest import open_reader as _open
from tests.conftest import run_fanfs
from tests.treegen import label_text as _text

CHUNK = 64 * 1024


FILES = {
    "docs/big.txt": _text(3 * CHUNK + 500, 1),  # 4 compressed chunks
    "docs/small.txt": _text(2000, 2),
    "img/photo.jpg": random.Random(3).randbytes(CHUNK + 100),  # 2 raw chunks
    "img/thumb.jpg": random.Random(4).randbytes(3000),
    "labels.csv": b"file,label\nphoto.jpg,3\n" * 50,
    "empty": b"",
}


@pytest.fixture(scope="module")
def good_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("verify")
    for rel, data in FILES.items():
        path = base / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    os.symlink("docs/big.txt", base / "src" / "link")
    out = base / "pack"
    result = run_fanfs(
        "pack", base / "src", out, "-q", "--chunk-size", "64KiB", "--partitions", "2"
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def pack(good_pack: Path, tmp_path: Path) -> Path:
    """A private copy of the good pack, free to damage."""
    return Path(shutil.copytree(good_pack, tmp_path / "pack"))


def _chunk_location(pack: Path, rel: str, chunk_no: int) -> tuple[int, int, int, int]:
    """(partition, offset, stored size, codec) of a file's chunk."""
    index = _open(pack).index
    entry = ROOT_ID
    for part in rel.split("/"):
        found = index.lookup(entry, part.encode())
        assert found is not None, rel
        entry = found
    cid = index.first[entry] + chunk_no
    assert chunk_no < index.count[entry]
    return (
        index.chunk_partition[cid],
        index.chunk_offset[cid],
        index.chunk_csize[cid],
        index.chunk_codec[cid],
    )


def _flip(pack: Path, partition: int, offset: int) -> None:
    path = pack / ("part-%05d" % partition)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


# --- verify -----------------------------------------------------------------------------------


def test_verify_good_pack(good_pack: Path) -> None:
    reader = _open(good_pack)
    total = sum(p["size"] for p in reader.partitions)
    result = run_fanfs("verify", good_pack)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "%s: OK (2 partitions, %d chunks, %s)\n" % (
        good_pack,
        reader.index.chunk_count,
        format_size(total),
    )
    quiet = run_fanfs("verify", "-q", good_pack)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("rel", "chunk_no", "codec"),
    [("docs/big.txt", 2, CODEC_ZSTD), ("img/photo.jpg", 1, CODEC_NONE)],
)
def test_verify_names_the_damaged_file(pack: Path, rel: str, chunk_no: int, codec: int) -> None:
    partition, offset, csize, stored_codec = _chunk_location(pack, rel, chunk_no)
    assert stored_codec == codec
    _flip(pack, partition, offset + csize // 2)
    result = run_fanfs("verify", pack)
    assert result.returncode == 3
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "fanfs verify: corrupt: %s: chunk %d (partition %d): checksum mismatch"
        % (rel, chunk_no, partition),
        "fanfs verify: %s: 1 damaged object(s)" % pack,
    ]


def test_verify_names_every_damaged_file(pack: Path) -> None:
    damaged = [("docs/big.txt", 0), ("img/thumb.jpg", 0), ("labels.csv", 0)]
    for rel, chunk_no in damaged:
        partition, offset, _, _ = _chunk_location(pack, rel, chunk_no)
        _flip(pack, partition, offset)
    result = run_fanfs("verify", pack)
    assert result.returncode == 3
    lines = result.stderr.splitlines()
    assert lines[-1] == "fanfs verify: %s: 3 damaged object(s)" % pack
    named = sorted(line.split(": ")[2] for line in lines[:-1])
    assert named == sorted(rel for rel, _ in damaged)
    assert all(line.startswith("fanfs verify: corrupt: ") for line in lines[:-1])


def test_verify_truncated_partition(pack: Path) -> None:
    part = pack / "part-00001"
    size = part.stat().st_size
    os.truncate(part, size - 1)
    result = run_fanfs("verify", pack)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [
        "fanfs verify: error: %s: partition part-00001 is %d bytes, manifest says %d"
        " (truncated pack?)" % (pack, size - 1, size)
    ]


# --- inspect ----------------------------------------------------------------------------------


def test_inspect(good_pack: Path) -> None:
    result = run_fanfs("inspect", good_pack)
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    fields = {line[:12].strip(): line[12:] for line in lines[:8]}
    assert fields["pack"] == str(good_pack)
    assert fields["format"] == "version %d, fanfs %s" % (PLAIN_FORMAT_VERSION, __version__)
    assert fields["options"] == "codec zstd:3, chunk size 64.0 KiB, no blocks"
    assert fields["entries"] == "6 files, 3 directories, 1 symlinks"
    bytes_in = sum(len(d) for d in FILES.values())
    bytes_out = sum(p.stat().st_size for p in good_pack.glob("part-*"))
    assert fields["data"] == "%s in, %s stored (%.2fx)" % (
        format_size(bytes_in),
        format_size(bytes_out),
        bytes_in / bytes_out,
    )
    assert fields["partitions"].startswith("2 regular (")
    assert fields["partitions"].endswith(", 0 broadcast (0 B)")
    assert fields["broadcast"] == "(none)"
    index = json.loads((good_pack / "fanfs.manifest").read_bytes()[20:])["index"]
    stored = format_size((good_pack / "index").stat().st_size)
    assert fields["index"] == (
        "%s, stored zstd in %s" % (format_size(index["usize"]), stored)
        if index["codec"] == "zstd"
        else stored
    )
    assert lines[8] == ""
    assert lines[9].split() == ["codec", "chunks", "bytes", "in", "bytes", "out", "ratio"]
    assert lines[-1].split()[:2] == ["total", str(_open(good_pack).index.chunk_count)]


def test_inspect_json(good_pack: Path) -> None:
    result = run_fanfs("inspect", "--json", good_pack)
    assert (result.returncode, result.stderr) == (0, "")
    manifest = json.loads(result.stdout)
    assert manifest["format_version"] == PLAIN_FORMAT_VERSION
    assert manifest["totals"]["files"] == 6
    assert manifest["totals"]["symlinks"] == 1
    assert manifest["totals"]["bytes_in"] == sum(len(d) for d in FILES.values())
    assert manifest["chunk_size"] == CHUNK
    assert manifest["options"]["codec"] == "zstd:3"
    assert [p["file"] for p in manifest["partitions"]] == ["part-00000", "part-00001"]
    assert manifest == _open(good_pack).manifest


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_not_a_pack(tmp_path: Path, command: str) -> None:
    (tmp_path / "somedir").mkdir()
    (tmp_path / "somedir" / "file.txt").write_bytes(b"x")
    result = run_fanfs(command, tmp_path / "somedir")
    assert result.returncode == 3
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "fanfs %s: error: %s: not a fanfs pack (no fanfs.manifest)"
        % (command, tmp_path / "somedir")
    ]
    result = run_fanfs(command, tmp_path / "missing")
    assert result.returncode == 3
    assert result.stderr.splitlines() == [
        "fanfs %s: error: %s: not a fanfs pack (no such directory)"
        % (command, tmp_path / "missing")
    ]


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_newer_format_version(pack: Path, command: str) -> None:
    manifest = pack / MANIFEST_NAME
    raw = bytearray(manifest.read_bytes())
    struct.pack_into("<I", raw, 8, FORMAT_VERSION + 1)
    manifest.write_bytes(bytes(raw))
    result = run_fanfs(command, pack)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [
        "fanfs %s: error: %s: pack format version %d is not supported (this fanfs reads version %d)"
        % (command, pack, FORMAT_VERSION + 1, FORMAT_VERSION)
    ]
