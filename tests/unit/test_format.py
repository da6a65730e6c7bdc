"""The pack format: what `fanfs pack` writes is what `PackReader` and `Index` read back.

Covers index lookups and entry order, chunk tables, partition balance, broadcast placement,
determinism, broadcast globs, validation of damaged packs, and the committed golden packs
(tests/data/golden-v*/, one per FORMAT_VERSION) that keep readers backward compatible.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import stat
import struct
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanfs.compression import CODEC_NONE, CODEC_ZSTD, decompress, parse_codec
from fanfs.errors import PackFormatError, PackVersionError
from fanfs.format.index import ROOT_ID
from fanfs.format.layout import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    PLAIN_FORMAT_VERSION,
    chunk_count,
    chunk_crc,
    chunk_length,
    crc32,
)
from fanfs.format.reader import PackReader
from fanfs.pack import PackOptions, glob_to_regex, run_pack
from fanfs.verify import verify_pack
from tests.conftest import TEST_CHUNK_SIZE, lookup_path, run_fanfs
from tests.conftest import open_reader as _open
from tests.treegen import label_text as _text
from tests.treegen import make_dataset
from tests.treegen import write_tree as _write_tree

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CHUNK = 4096


# --- the checksum ---------------------------------------------------------------------------------


@given(
    st.binary(max_size=70_000),
    st.integers(0, 0xFFFFFFFF),
    st.integers(0, 64),
    st.sampled_from(["bytes", "memoryview", "bytearray"]),
)
def test_crc32_is_zlibs(data: bytes, start: int, skip: int, kind: str) -> None:
    """The format's checksum is zlib's crc32 (packs written by earlier versions, and by any
    other tool that follows docs/format.md, must keep matching): the faster implementation
    fanfs uses gives the standard library's values, continued from any value, on every
    buffer type the read path hands it (a memoryview slice of a preloaded partition)."""
    buffer: bytes | bytearray | memoryview = data
    if kind == "memoryview":
        buffer = memoryview(b"x" * skip + data)[skip:]
    elif kind == "bytearray":
        buffer = bytearray(data)
    assert crc32(buffer) == zlib.crc32(data)
    assert crc32(buffer, start) == zlib.crc32(data, start)


def test_crc32_of_a_large_buffer() -> None:
    data = random.Random(3).randbytes(5 << 20)  # past any size where an implementation switches
    assert crc32(data) == zlib.crc32(data) and crc32(data[1:]) == zlib.crc32(data[1:])


# --- helpers ----------------------------------------------------------------------------------


def _pack(
    src: Path,
    out: Path,
    *,
    codec: str = "zstd:3",
    chunk_size: int = CHUNK,
    partitions: int | None = None,
    broadcast: tuple[str, ...] = (),
    jobs: int = 2,
) -> Path:
    run_pack(
        PackOptions(
            src=str(src),
            out=str(out),
            codec=parse_codec(codec),
            chunk_size=chunk_size,
            partitions=partitions,
            broadcast=broadcast,
            jobs=jobs,
            quiet=True,
        )
    )
    return out


def _read(reader: PackReader, entry: int) -> bytes:
    """A file's bytes, chunk by chunk, checking every chunk's crc32 as the read path does."""
    index = reader.index
    out = bytearray()
    for k in range(index.count[entry]):
        cid = index.first[entry] + k
        stored = reader.read_stored(cid)
        assert chunk_crc(stored, cid, reader.crc_binds_chunk) == index.chunk_crc32[cid], (
            "chunk %d of %r"
            % (
                k,
                index.path(entry),
            )
        )
        usize = reader.chunk_usize(entry, k)
        # Version 7: a slice of a solid block decodes the block, then skips into it.
        bsize, skip = index.chunk_bsize[cid], index.chunk_skip[cid]
        data = decompress(
            index.chunk_codec[cid],
            stored,
            bsize or usize,
            reader.dictionary(index.chunk_dict[cid]),
        )
        out += data[skip : skip + usize]
    return bytes(out)


def _walk(root: Path) -> list[bytes]:
    """Every path below `root`, relative, as bytes (symlinks not followed)."""
    base = os.fsencode(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            out.append(os.path.relpath(os.path.join(dirpath, name), base))
    return out


def _tree_files(root: Path) -> dict[str, bytes]:
    return {
        os.fsdecode(p): (root / os.fsdecode(p)).read_bytes()
        for p in _walk(root)
        if (root / os.fsdecode(p)).is_file() and not (root / os.fsdecode(p)).is_symlink()
    }


def _owner_of_chunks(reader: PackReader) -> dict[int, bytes]:
    index = reader.index
    owners = {}
    for entry in range(index.entry_count):
        if stat.S_ISREG(index.mode[entry]):
            for k in range(index.count[entry]):
                owners[index.first[entry] + k] = index.path(entry)
    return owners


@pytest.fixture(scope="module")
def edge_reader(edge_pack: Path) -> Iterator[PackReader]:
    reader = PackReader(str(edge_pack))
    yield reader
    reader.close()


# --- index: lookups, names, order -------------------------------------------------------------


def test_every_source_entry_is_in_the_index(edge_tree: Path, edge_reader: PackReader) -> None:
    index, base = edge_reader.index, os.fsencode(edge_tree)
    paths = _walk(edge_tree)
    assert index.entry_count == len(paths) + 1  # + the root, nothing else
    for rel in paths:
        st = os.lstat(os.path.join(base, rel))
        entry = lookup_path(index, rel)
        assert entry is not None, rel
        assert index.path(entry) == rel
        assert index.name(entry) == os.path.basename(rel)
        assert (index.mode[entry], index.mtime_ns[entry]) == (st.st_mode, st.st_mtime_ns), rel
        if stat.S_ISLNK(st.st_mode):
            assert index.symlink_target(entry) == os.readlink(os.path.join(base, rel))
            assert index.size[entry] == st.st_size
        elif stat.S_ISREG(st.st_mode):
            assert index.size[entry] == st.st_size
            with open(os.path.join(base, rel), "rb") as f:
                assert _read(edge_reader, entry) == f.read(), rel
        else:
            subdirs = sum(
                1
                for n in os.listdir(os.path.join(base, rel))
                if stat.S_ISDIR(os.lstat(os.path.join(base, rel, n)).st_mode)
            )
            assert index.subdir_counts()[entry] == subdirs, rel


@pytest.mark.parametrize(
    ("rel", "content"),
    [
        (b"names/bad\xff\xfename", b"non-utf8 name\n"),
        (b"names/\xe9t\xe9-latin1-dir/inner", b"inside a latin-1 dir\n"),
        (b"names/" + b"n" * 255, b"255-byte name\n"),
        (b"names/" + b"d" * 255 + b"/" + b"f" * 255, b"255 inside 255\n"),
        ("names/ünïcødé-名前.txt".encode(), "unicode ✓\n".encode()),
        (b"names/new\nline", b"new\nline" * 3),
        (b".hidden", b"hidden\n"),
        (b"deep/" + b"/".join(b"level%02d" % i for i in range(40)) + b"/bottom.txt", b"deep\n"),
    ],
    ids=[
        "non_utf8",
        "latin1_dir",
        "255_bytes",
        "255_in_255",
        "unicode",
        "newline",
        "hidden",
        "depth_40",
    ],
)
def test_lookup_finds_awkward_names(edge_reader: PackReader, rel: bytes, content: bytes) -> None:
    entry = lookup_path(edge_reader.index, rel)
    assert entry is not None
    assert edge_reader.index.name(entry) == rel.rsplit(b"/", 1)[-1]
    assert _read(edge_reader, entry) == content


@pytest.mark.parametrize(
    ("directory", "name"),
    [
        (b"", b"nope"),
        (b"", b""),
        (b"", b"\x00"),
        (b"", b"\xff\xff\xff"),  # sorts after everything
        (b"", b"sizes/text_1"),  # a path is not a name
        (b"names", b"bad\xff\xfe"),  # prefix of an existing name
        (b"names", b"bad\xff\xfename\x00"),  # existing name plus a byte
        (b"names", b"n" * 254),
        (b"names", b"n" * 256),
        (b"names", b"BAD\xff\xfeNAME"),  # lookups are case-sensitive
        (b"many", b"f"),
        (b"many", b"f100003"),
        (b"empty_dir", b"anything"),
        (b"a/b/c/empty", b"x"),
    ],
)
def test_lookup_of_missing_name_returns_none(
    edge_reader: PackReader, directory: bytes, name: bytes
) -> None:
    parent = lookup_path(edge_reader.index, directory) if directory else ROOT_ID
    assert parent is not None and edge_reader.index.is_dir(parent)
    assert edge_reader.index.lookup(parent, name) is None


def test_lookup_every_name_in_a_large_directory(edge_tree: Path, edge_reader: PackReader) -> None:
    index = edge_reader.index
    many = lookup_path(index, b"many")
    assert many is not None
    present = set(os.listdir(os.fsencode(edge_tree / "many")))
    assert len(present) == 1500
    for name in present:
        entry = index.lookup(many, name)
        assert entry is not None and index.name(entry) == name
    for i in range(0, 100_003, 97):  # every miss between the present names
        name = b"f%05d" % i
        if name not in present:
            assert index.lookup(many, name) is None, name


def test_entry_order_is_breadth_first_with_sorted_children(edge_reader: PackReader) -> None:
    index = edge_reader.index
    n = index.entry_count
    assert index.is_dir(ROOT_ID) and index.parent[ROOT_ID] == ROOT_ID and index.name(ROOT_ID) == b""
    depth = [0] * n
    for e in range(1, n):
        assert index.parent[e] < e
        depth[e] = depth[index.parent[e]] + 1
    assert depth == sorted(depth), "entries are not in breadth-first order"
    expected_next = 1
    for d in range(n):
        if not index.is_dir(d) or index.count[d] == 0:
            continue
        first, count = index.first[d], index.count[d]
        assert first == expected_next, "children of %r are not next in order" % index.path(d)
        names = [index.name(c) for c in range(first, first + count)]
        assert names == sorted(names) and len(set(names)) == len(names)
        assert all(index.parent[c] == d for c in range(first, first + count))
        expected_next = first + count
    assert expected_next == n, "some entries are nobody's children"


def test_symlink_targets_are_stored_not_followed(edge_tree: Path, edge_reader: PackReader) -> None:
    index = edge_reader.index
    links = {
        name: os.readlink(os.fsencode(edge_tree / "links") + b"/" + name)
        for name in os.listdir(os.fsencode(edge_tree / "links"))
    }
    assert links[b"bad_target"] == b"\xff\xfe-target"
    assert len(links[b"long_target"]) == 1000
    for name, target in links.items():
        entry = lookup_path(index, b"links/" + name)
        assert entry is not None
        assert stat.S_ISLNK(index.mode[entry])
        assert index.symlink_target(entry) == target
        assert index.size[entry] == len(target)
        assert index.count[entry] == 0


def test_empty_source_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "src").mkdir()
    reader = _open(_pack(tmp_path / "src", tmp_path / "out"))
    assert (reader.index.entry_count, reader.index.chunk_count) == (1, 0)
    assert reader.index.is_dir(ROOT_ID) and reader.index.count[ROOT_ID] == 0
    assert reader.index.lookup(ROOT_ID, b"anything") is None
    assert verify_pack(str(tmp_path / "out"), quiet=True) == 0


# --- chunks -----------------------------------------------------------------------------------


def test_chunk_table(tmp_path: Path) -> None:
    sizes = {
        "empty": 0,
        "one": 1,
        "under": CHUNK - 1,
        "exact": CHUNK,
        "over": CHUNK + 1,
        "three_and_a_half": CHUNK * 7 // 2,
        "two": 2 * CHUNK,
    }
    files = {name: _text(n, i) for i, (name, n) in enumerate(sizes.items())}
    files["random"] = random.Random(3).randbytes(CHUNK * 5 // 2)
    reader = _open(_pack(_write_tree(tmp_path / "src", files), tmp_path / "out"))
    index = reader.index
    seen_chunks = []
    for name, data in files.items():
        entry = lookup_path(index, name.encode())
        assert entry is not None
        count = index.count[entry]
        assert count == math.ceil(len(data) / CHUNK), name
        usizes = [reader.chunk_usize(entry, k) for k in range(count)]
        assert sum(usizes) == len(data)
        assert all(u == CHUNK for u in usizes[:-1]) and all(0 < u <= CHUNK for u in usizes)
        seen_chunks += [index.first[entry] + k for k in range(count)]
        assert _read(reader, entry) == data
        codecs = {index.chunk_codec[index.first[entry] + k] for k in range(count)}
        if name == "random":
            assert codecs == {CODEC_NONE}  # incompressible: stored raw
        elif len(data) >= CHUNK:
            assert CODEC_ZSTD in codecs
    entry = lookup_path(index, b"three_and_a_half")
    assert entry is not None
    assert [reader.chunk_usize(entry, k) for k in range(4)] == [CHUNK, CHUNK, CHUNK, CHUNK // 2]
    assert sorted(seen_chunks) == list(range(index.chunk_count))  # every chunk owned once


@pytest.mark.parametrize(
    ("name", "chunks", "last"),
    [
        ("text_1", 1, 1),
        ("text_65535", 1, 65535),
        ("text_65536", 1, 65536),
        ("text_65537", 2, 1),
        ("text_196625", 4, 17),
        ("rand_655360", 10, 65536),
    ],
)
def test_chunk_table_of_edge_sizes(
    edge_reader: PackReader, name: str, chunks: int, last: int
) -> None:
    assert edge_reader.chunk_size == TEST_CHUNK_SIZE
    entry = lookup_path(edge_reader.index, b"sizes/" + name.encode())
    assert entry is not None
    assert edge_reader.index.count[entry] == chunks
    assert edge_reader.chunk_usize(entry, chunks - 1) == last


def test_equal_chunks_of_the_edge_tree_are_stored_once(edge_reader: PackReader) -> None:
    """dups/: a copy reads the original's bytes, a file sharing two chunks shares those two,
    and a file of zeros stores one chunk of them (`_read` checks every row's own crc32)."""
    index = edge_reader.index

    def places(rel: bytes) -> list[tuple[int, int]]:
        entry = lookup_path(index, b"dups/" + rel)
        assert entry is not None
        first, count = index.first[entry], index.count[entry]
        return [
            (index.chunk_partition[c], index.chunk_offset[c]) for c in range(first, first + count)
        ]

    original = places(b"original")
    assert len(set(original)) == 4
    assert places(b"copy") == original
    same_start = places(b"same_start")
    assert same_start[:2] == original[:2] and same_start[2] not in original
    zeros = places(b"zeros")
    assert len(zeros) == 7 and len(set(zeros[:6])) == 1 and zeros[6] != zeros[0]
    for rel in (b"original", b"copy", b"same_start", b"zeros"):
        entry = lookup_path(index, b"dups/" + rel)
        assert entry is not None
        assert len(_read(edge_reader, entry)) == index.size[entry]


# --- partitions -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dataset") / "src"
    make_dataset(root, 600, per_dir=150)
    return root


def test_partitions_are_balanced_by_stored_bytes(dataset: Path, tmp_path: Path) -> None:
    reader = _open(_pack(dataset, tmp_path / "out", partitions=7))
    index, parts = reader.index, reader.partitions
    assert len(parts) == 7 and not any(p["broadcast"] for p in parts)
    assert index.chunk_count > 1000
    for number, part in enumerate(parts):
        # Chunks tile their partition exactly: no gaps, no overlaps, sizes as the manifest says.
        mine = sorted(
            (index.chunk_offset[c], index.chunk_csize[c])
            for c in range(index.chunk_count)
            if index.chunk_partition[c] == number
        )
        offset = 0
        for chunk_offset, csize in mine:
            assert chunk_offset == offset
            offset += csize
        assert offset == part["size"] == os.path.getsize(tmp_path / "out" / part["file"])
        assert len(mine) == part["chunks"]
    sizes = [p["size"] for p in parts]
    assert max(sizes) - min(sizes) <= CHUNK, sizes
    for name, data in _tree_files(dataset).items():
        entry = lookup_path(index, name.encode())
        assert entry is not None and _read(reader, entry) == data


def test_broadcast_glob_places_exactly_its_files_in_broadcast_partitions(tmp_path: Path) -> None:
    files = {
        "train/a.txt": _text(10_000, 1),
        "train/b.bin": random.Random(2).randbytes(9000),
        "val/x.txt": _text(12_000, 3),
        "val/sub/y.bin": random.Random(4).randbytes(5000),
        "val/sub/deeper/z.txt": _text(300, 5),
        "val/empty": b"",
        "valid.txt": _text(5000, 6),
        "other/val/w.txt": _text(5000, 7),
        "val.txt": _text(100, 8),
    }
    src = _write_tree(tmp_path / "src", files)
    reader = _open(_pack(src, tmp_path / "out", partitions=3, broadcast=("val/**",)))
    parts = reader.partitions
    assert reader.manifest["options"]["broadcast"] == ["val/**"]
    assert [p["broadcast"] for p in parts[:3]] == [False] * 3
    assert len(parts) > 3 and all(p["broadcast"] for p in parts[3:])
    owners = _owner_of_chunks(reader)
    in_broadcast = {
        owners[c] for c in owners if parts[reader.index.chunk_partition[c]]["broadcast"]
    }
    in_regular = {
        owners[c] for c in owners if not parts[reader.index.chunk_partition[c]]["broadcast"]
    }
    assert in_broadcast == {b"val/x.txt", b"val/sub/y.bin", b"val/sub/deeper/z.txt"}
    assert in_regular == {
        b"train/a.txt",
        b"train/b.bin",
        b"valid.txt",
        b"other/val/w.txt",
        b"val.txt",
    }
    assert sum(p["chunks"] for p in parts[3:]) == sum(
        1 for c in owners if owners[c] in in_broadcast
    )
    for name, data in files.items():
        entry = lookup_path(reader.index, name.encode())
        assert entry is not None and _read(reader, entry) == data


def test_no_broadcast_partitions_without_broadcast(dataset: Path, tmp_path: Path) -> None:
    reader = _open(_pack(dataset, tmp_path / "out"))
    assert not any(p["broadcast"] for p in reader.partitions)


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("val/**", "val/a.jpg", True),
        ("val/**", "val/sub/deep/a.jpg", True),
        ("val/**", "valid/a.jpg", False),
        ("val/**", "train/val/a.jpg", False),
        ("val", "val", True),  # a pattern naming a directory covers its subtree
        ("val", "val/a.jpg", True),
        ("val", "val/sub/a.jpg", True),
        ("val", "valid", False),
        ("val", "val.txt", False),
        ("/val/", "val/a.jpg", True),  # leading and trailing slashes are ignored
        ("*.jpg", "a.jpg", True),
        ("*.jpg", "dir/a.jpg", False),  # * stays within one segment
        ("*.jpg", "a.jpeg", False),
        ("*/*.jpg", "dir/a.jpg", True),
        ("*/*.jpg", "dir/sub/a.jpg", False),
        ("**/*.jpg", "a.jpg", True),  # ** spans zero or more segments
        ("**/*.jpg", "dir/sub/a.jpg", True),
        ("**/*.jpg", "dir/a.png", False),
        ("a/**/b", "a/b", True),
        ("a/**/b", "a/x/y/b", True),
        ("a/**/b", "a/x/y/b/c", True),
        ("a/**/b", "a/x/yb", False),
        ("**", "anything/at/all", True),
        ("img?.png", "img1.png", True),
        ("img?.png", "img12.png", False),
        ("img?.png", "img/.png", False),  # ? does not match a slash
        ("a[1].txt", "a[1].txt", True),  # no character classes: brackets are literal
        ("a[1].txt", "a1.txt", False),
        ("a+b.txt", "a+b.txt", True),
        ("a+b.txt", "aab.txt", False),
        ("new\nline", "new\nline/x", True),
    ],
)
def test_glob_to_regex(pattern: str, path: str, matches: bool) -> None:
    assert bool(glob_to_regex(pattern).match(path.encode())) is matches


def test_glob_matches_non_utf8_names_by_wildcard() -> None:
    assert glob_to_regex("names/*").match(b"names/bad\xff\xfename")
    assert glob_to_regex("**/*name").match(b"x/bad\xff\xfename")


# --- determinism ------------------------------------------------------------------------------


def _dir_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_packs_are_byte_identical_whatever_jobs(edge_tree: Path, tmp_path: Path) -> None:
    one = _pack(edge_tree, tmp_path / "one", chunk_size=TEST_CHUNK_SIZE, jobs=1)
    four = _pack(edge_tree, tmp_path / "four", chunk_size=TEST_CHUNK_SIZE, jobs=4)
    again = _pack(edge_tree, tmp_path / "again.fan", chunk_size=TEST_CHUNK_SIZE, jobs=4)
    reference = _dir_bytes(one)
    assert len(reference) > 3
    assert _dir_bytes(four) == reference
    assert _dir_bytes(again) == reference
    # The CLI (default --jobs: every core) writes the very same bytes.
    cli = tmp_path / "cli"
    result = run_fanfs("pack", edge_tree, cli, "-q", "--chunk-size", str(TEST_CHUNK_SIZE))
    assert result.returncode == 0, result.stderr
    assert _dir_bytes(cli) == reference


def test_packs_of_many_chunks_are_byte_identical(dataset: Path, tmp_path: Path) -> None:
    one = _pack(dataset, tmp_path / "one", partitions=5, broadcast=("class_001",), jobs=1)
    eight = _pack(dataset, tmp_path / "eight", partitions=5, broadcast=("class_001",), jobs=8)
    assert _dir_bytes(one) == _dir_bytes(eight)


def test_pack_depends_on_the_tree_not_its_location(dataset: Path, tmp_path: Path) -> None:
    moved = Path(shutil.copytree(dataset, tmp_path / "elsewhere" / "copy", symlinks=True))
    assert os.stat(moved).st_mtime_ns == os.stat(dataset).st_mtime_ns  # copystat kept times
    here = _pack(dataset, tmp_path / "here", partitions=5)
    there = _pack(moved, tmp_path / "there", partitions=5)
    assert _dir_bytes(here) == _dir_bytes(there)


# --- damaged packs ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("small")
    src = _write_tree(
        base / "src",
        {
            "a.txt": _text(20_000, 1),
            "b/c.bin": random.Random(1).randbytes(9000),
            "b/d.txt": _text(3000, 2),
        },
    )
    return _pack(src, base / "pack", partitions=3)


@pytest.fixture
def pack_copy(small_pack: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(small_pack, dest)
    assert _open(dest).index.chunk_count > 3
    return dest


def _raises(cls: type[Exception], message: str) -> Any:
    return pytest.raises(cls, match="^%s$" % re.escape(message))


def test_bad_magic(pack_copy: Path) -> None:
    manifest = pack_copy / MANIFEST_NAME
    raw = manifest.read_bytes()
    manifest.write_bytes(b"NOTAPACK" + raw[8:])
    with _raises(PackFormatError, "%s: not a fanfs pack (bad magic in fanfs.manifest)" % pack_copy):
        PackReader(str(pack_copy))


def test_empty_manifest(pack_copy: Path) -> None:
    (pack_copy / MANIFEST_NAME).write_bytes(b"")
    with _raises(PackFormatError, "%s: not a fanfs pack (bad magic in fanfs.manifest)" % pack_copy):
        PackReader(str(pack_copy))


@pytest.mark.parametrize("version", [0, 99, FORMAT_VERSION + 1, 0xFFFFFFFF])
def test_unsupported_version(pack_copy: Path, version: int) -> None:
    manifest = pack_copy / MANIFEST_NAME
    raw = bytearray(manifest.read_bytes())
    assert struct.unpack_from("<I", raw, 8) == (PLAIN_FORMAT_VERSION,)
    struct.pack_into("<I", raw, 8, version)
    manifest.write_bytes(bytes(raw))
    message = "%s: pack format version %d is not supported (this fanfs reads version %d)" % (
        pack_copy,
        version,
        FORMAT_VERSION,
    )
    with _raises(PackVersionError, message) as info:
        PackReader(str(pack_copy))
    assert info.value.exit_code == 3


@pytest.mark.parametrize(
    "keep", [-1, -100, 20], ids=["one_byte_short", "hundred_short", "header_only"]
)
def test_truncated_manifest(pack_copy: Path, keep: int) -> None:
    manifest = pack_copy / MANIFEST_NAME
    manifest.write_bytes(manifest.read_bytes()[:keep])
    with _raises(PackFormatError, "%s: manifest is truncated or corrupt" % pack_copy):
        PackReader(str(pack_copy))


def test_manifest_truncated_inside_the_header_is_reported_as_truncated(pack_copy: Path) -> None:
    # The magic is intact, so this is a damaged pack, not "not a fanfs pack (bad magic)".
    manifest = pack_copy / MANIFEST_NAME
    manifest.write_bytes(manifest.read_bytes()[:12])
    with pytest.raises(PackFormatError, match="truncated") as info:
        PackReader(str(pack_copy))
    assert "bad magic" not in str(info.value)


def test_corrupt_manifest_body(pack_copy: Path) -> None:
    manifest = pack_copy / MANIFEST_NAME
    raw = bytearray(manifest.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    manifest.write_bytes(bytes(raw))
    with _raises(PackFormatError, "%s: manifest is truncated or corrupt" % pack_copy):
        PackReader(str(pack_copy))


def test_missing_manifest(pack_copy: Path) -> None:
    (pack_copy / MANIFEST_NAME).unlink()
    with _raises(PackFormatError, "%s: not a fanfs pack (no fanfs.manifest)" % pack_copy):
        PackReader(str(pack_copy))


def test_missing_directory(tmp_path: Path) -> None:
    with _raises(PackFormatError, "%s: not a fanfs pack (no such directory)" % (tmp_path / "nope")):
        PackReader(str(tmp_path / "nope"))


def test_truncated_index(pack_copy: Path) -> None:
    index = pack_copy / "index"
    size = index.stat().st_size
    os.truncate(index, size - 8)
    message = "%s: index is %d bytes, manifest says %d (truncated pack?)" % (
        pack_copy,
        size - 8,
        size,
    )
    with _raises(PackFormatError, message):
        PackReader(str(pack_copy))


def test_corrupt_index(pack_copy: Path) -> None:
    index = pack_copy / "index"
    raw = bytearray(index.read_bytes())
    raw[5] ^= 0x40
    index.write_bytes(bytes(raw))
    with _raises(PackFormatError, "%s: index checksum mismatch (corrupt pack)" % pack_copy):
        PackReader(str(pack_copy))


def test_missing_index(pack_copy: Path) -> None:
    (pack_copy / "index").unlink()
    with _raises(PackFormatError, "%s: cannot open index: No such file or directory" % pack_copy):
        PackReader(str(pack_copy))


@pytest.mark.parametrize(
    "delta", [-1, -1000, +1], ids=["one_byte_short", "1000_short", "one_byte_long"]
)
def test_partition_of_wrong_size(pack_copy: Path, delta: int) -> None:
    part = pack_copy / "part-00001"
    size = part.stat().st_size
    assert size > 1000
    os.truncate(part, size + delta)
    message = "%s: partition part-00001 is %d bytes, manifest says %d (truncated pack?)" % (
        pack_copy,
        size + delta,
        size,
    )
    with _raises(PackFormatError, message):
        PackReader(str(pack_copy))


def test_missing_partition(pack_copy: Path) -> None:
    (pack_copy / "part-00002").unlink()
    message = "%s: cannot open partition part-00002: No such file or directory" % pack_copy
    with _raises(PackFormatError, message):
        PackReader(str(pack_copy))


# --- golden packs -----------------------------------------------------------------------------

GOLDEN = sorted(DATA_DIR.glob("golden-v*/*.fan"))
# The ids docs/format.md fixes; auto.fan (version 2) mixes zstd with and without a dictionary.
GOLDEN_CODECS = {
    "zstd.fan": 2,
    "lz4.fan": 1,
    "brotli.fan": 3,
    "lzma.fan": 4,
    "auto.fan": 2,
    "lz4dict.fan": 1,
    "shuffle.fan": 0x22,
    "blocks.fan": 2,
    "plainindex.fan": 2,
    "solid.fan": 2,
    "solidlz4.fan": 1,
}
# Golden packs whose compressed chunks (all of them: the plan's only candidate takes one) use
# dictionary 1: version 3's lz4 chunks with a dictionary.
GOLDEN_ALL_DICT = {"lz4dict.fan"}


def test_there_is_a_golden_pack_for_the_current_format_version() -> None:
    names = {p.name for p in DATA_DIR.glob("golden-v%d/*.fan" % PLAIN_FORMAT_VERSION)}
    assert {"zstd.fan", "lz4.fan", "brotli.fan"} <= names
    # Packs without solid blocks are written as version 6: version 7's are the solid ones.
    names = {p.name for p in DATA_DIR.glob("golden-v%d/*.fan" % FORMAT_VERSION)}
    assert {"solid.fan", "solidlz4.fan"} <= names
    for version in range(1, FORMAT_VERSION + 1):
        assert (DATA_DIR / ("golden-v%d" % version) / "src.tar.gz").is_file(), version


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: "%s/%s" % (p.parent.name, p.name))
def test_golden_pack_reads_back_its_source(golden: Path) -> None:
    reader = _open(golden)
    index = reader.index
    with tarfile.open(golden.parent / "src.tar.gz") as tar:
        members = tar.getmembers()
        assert index.entry_count == len(members) + 1
        for member in members:
            rel = os.fsencode(member.name)
            entry = lookup_path(index, rel)
            assert entry is not None, rel
            assert stat.S_IMODE(index.mode[entry]) == member.mode, rel
            if member.issym():
                assert stat.S_ISLNK(index.mode[entry])
                assert index.symlink_target(entry) == os.fsencode(member.linkname)
                continue
            assert index.mtime_ns[entry] == member.mtime * 10**9, rel
            if member.isdir():
                assert index.is_dir(entry)
            else:
                assert stat.S_ISREG(index.mode[entry])
                extracted = tar.extractfile(member)
                assert extracted is not None
                assert _read(reader, entry) == extracted.read(), rel
    # Layout facts the golden source was built to exercise.
    assert reader.manifest["format_version"] == int(golden.parent.name.removeprefix("golden-v"))
    counts = {
        name: index.count[lookup_path(index, name)]
        for name in (b"data/text.txt", b"data/exact.txt", b"data/empty")
    }
    if golden.name == "blocks.fan":
        # 9000 bytes > one 8 KiB chunk: three blocks of 4 KiB; 8192 bytes: one chunk.
        assert (reader.chunk_size, reader.block_size) == (8192, 4096)
        assert counts == {b"data/text.txt": 3, b"data/exact.txt": 1, b"data/empty": 0}
        text = lookup_path(index, b"data/text.txt")
        assert [reader.chunk_usize(text, k) for k in range(3)] == [4096, 4096, 808]
    else:
        assert (reader.chunk_size, reader.block_size) == (4096, 0)
        assert counts == {b"data/text.txt": 3, b"data/exact.txt": 2, b"data/empty": 0}
    owners = _owner_of_chunks(reader)
    broadcast = {
        owners[c] for c in owners if reader.partitions[index.chunk_partition[c]]["broadcast"]
    }
    assert broadcast == {b"val/v1.txt", b"val/v2.bin"}
    # Raw random data plus the pack's codec, under its on-disk id (ids are never renumbered).
    codecs = {index.chunk_codec[c] for c in range(index.chunk_count)}
    assert codecs == {CODEC_NONE, GOLDEN_CODECS[golden.name]}
    if golden.name in GOLDEN_ALL_DICT:
        compressed = [c for c in range(index.chunk_count) if index.chunk_codec[c] != CODEC_NONE]
        assert len(compressed) == 64 and {index.chunk_dict[c] for c in compressed} == {1}


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: "%s/%s" % (p.parent.name, p.name))
def test_golden_pack_verifies(golden: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify_pack(str(golden), quiet=True) == 0
    assert capsys.readouterr() == ("", "")


@given(size=st.integers(0, 1 << 40), chunk_size=st.integers(4096, 64 << 20))
def test_chunk_arithmetic_tiles_every_file(size: int, chunk_size: int) -> None:
    count = chunk_count(size, chunk_size)
    if size == 0:
        assert count == 0
        return
    lengths = [chunk_length(size, chunk_size, k) for k in (0, count - 1)]
    assert all(0 < n <= chunk_size for n in lengths)
    assert (count - 1) * chunk_size + lengths[-1] == size
    assert count == math.ceil(size / chunk_size) or size > 1 << 52
