"""Hostile packs (issue 10, docs/security.md): each attack is built with its checksums
recomputed, so it looks valid, and must be refused at open with exit 3 and one line naming
the field, by `fanfs mount`, `inspect` and `verify` alike; or, for damage inside a chunk,
reported by `verify` and read as EIO (tests/fuse). Nothing is ever written outside the
pack's or the cache's directory, and no case may hang (every command under a timeout).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from fanfs._sizes import format_size
from fanfs.format.layout import PLAIN_FORMAT_VERSION, partition_name
from tests.conftest import FANFS, run_fanfs
from tests.forge import PackImage, copy_pack, make_fifo, raw_manifest, reference_read
from tests.treegen import label_text, write_tree

GOLDEN_V5 = Path(__file__).resolve().parents[1] / "data" / "golden-v5" / "zstd.fan"

CHUNK = 4096
FILES = {
    "a/text.txt": label_text(3 * CHUNK + 100, 1),  # 4 zstd chunks
    "a/small.txt": label_text(900, 2),
    "b/c/deep.txt": label_text(2 * CHUNK, 3),
    "b/random.bin": os.urandom(5000),  # raw chunks
    "top.txt": b"top\n",
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    src = write_tree(root / "src", FILES)
    os.symlink("a/text.txt", src / "link")
    pack = root / "base.fan"
    # The index as its columns, which the forge edits (compressed indexes: section 9 below).
    result = run_fanfs(
        *("pack", src, pack, "-q", "--chunk-size", str(CHUNK), "--partitions", "3"),
        *("--index-codec", "none"),
    )
    assert result.returncode == 0, result.stderr
    return pack


@pytest.fixture
def image(base: Path) -> PackImage:
    return PackImage(base)


@pytest.fixture
def forged(tmp_path: Path) -> Path:
    return tmp_path / "forged.fan"


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    # A pack that should have been refused but was mounted: never leave it behind.
    with open("/proc/self/mountinfo") as f:
        if any(line.split()[4] == str(mnt) for line in f):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False, capture_output=True)


def assert_refused(pack: Path, mnt: Path, message: str) -> None:
    """`mount`, `inspect` and `verify` each exit 3 with exactly `PACK: message`."""
    line = "%s: %s" % (pack, message)
    for command, extra in (("inspect", ()), ("verify", ()), ("mount", (str(mnt),))):
        result = run_fanfs(command, pack, *extra, timeout=60)
        assert (result.returncode, result.stderr, result.stdout) == (
            3,
            "fanfs %s: error: %s\n" % (command, line),
            "",
        ), command


# 1. Partition names: never a path ----------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../../../somewhere", "/etc/hostname", "/etc/no-such-file", "part-00001", "part-0", ""]
)
def test_partition_file_must_be_its_own_name(
    image: PackImage, forged: Path, mountpoint: Path, name: str
) -> None:
    def rename(manifest: dict[str, Any]) -> None:
        manifest["partitions"][0]["file"] = name

    image.save(forged, after=rename)
    # The same line whether or not the named path exists: nothing about it is revealed.
    assert_refused(
        forged, mountpoint, "manifest field partitions[0].file is %r, expected 'part-00000'" % name
    )


def test_a_symlinked_partition_is_refused(base: Path, forged: Path, mountpoint: Path) -> None:
    copy_pack(base, forged)
    (forged / "part-00001").unlink()
    os.symlink("/etc/hostname", forged / "part-00001")
    assert_refused(
        forged, mountpoint, "partition part-00001 is a symlink (pack files must be regular files)"
    )


def test_a_fifo_partition_is_refused_without_waiting(
    base: Path, forged: Path, mountpoint: Path
) -> None:
    copy_pack(base, forged)
    make_fifo(forged / "part-00002")
    assert_refused(forged, mountpoint, "partition part-00002 is not a regular file")


@pytest.mark.parametrize("name", ["index", "fanfs.manifest"])
def test_a_fifo_or_symlink_index_or_manifest_is_refused(
    base: Path, forged: Path, mountpoint: Path, name: str
) -> None:
    copy_pack(base, forged)
    make_fifo(forged / name)
    what = "manifest" if name == "fanfs.manifest" else "index"
    assert_refused(forged, mountpoint, "%s is not a regular file" % what)
    (forged / name).unlink()
    os.symlink(base / name, forged / name)
    assert_refused(forged, mountpoint, "%s is a symlink (pack files must be regular files)" % what)


# 2. The manifest -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("chunk_size", 0, "manifest field chunk_size is 0, expected an integer in 4096..67108864"),
        (
            "chunk_size",
            -4096,
            "manifest field chunk_size is -4096, expected an integer in 4096..67108864",
        ),
        (
            "chunk_size",
            1 << 40,
            "manifest field chunk_size is 1099511627776, expected an integer in 4096..67108864",
        ),
        (
            "chunk_size",
            "4096",
            "manifest field chunk_size is '4096', expected an integer in 4096..67108864",
        ),
        (
            "chunk_size",
            True,
            "manifest field chunk_size is True, expected an integer in 4096..67108864",
        ),
        (
            # At most half a chunk (4096 // 2): else a chunk count could mean either unit.
            "block_size",
            4096,
            "manifest field block_size is 4096, expected an integer in 0..2048",
        ),
        (
            "block_size",
            None,
            "manifest field block_size is None, expected an integer in 0..2048",
        ),
        ("partitions", [], "manifest field partitions is empty"),
        (
            "partitions",
            {},
            "manifest field partitions is {}, expected a list of at most 8192 items",
        ),
        ("totals", None, "manifest field totals is None, expected an object"),
        ("plan", [1], "manifest field plan is [1], expected an object or null"),
    ],
)
def test_manifest_fields_are_checked(
    image: PackImage, forged: Path, mountpoint: Path, field: str, value: object, message: str
) -> None:
    def forge(manifest: dict[str, Any]) -> None:
        manifest[field] = value

    image.save(forged, after=forge)
    assert_refused(forged, mountpoint, message)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ("partitions", 1, "size"),
            -1,
            "manifest field partitions[1].size is -1, expected an integer in 0..1152921504606846976",
        ),
        (
            ("partitions", 1, "broadcast"),
            0,
            "manifest field partitions[1].broadcast is 0, expected true or false",
        ),
        (
            ("index", "entries"),
            0,
            "manifest field index.entries is 0, expected an integer in 1..4294967295",
        ),
        (
            ("index", "entries"),
            10**12,
            "manifest field index.entries is 1000000000000, expected an integer in 1..4294967295",
        ),
        (
            ("index", "file"),
            "../index",
            "manifest field index.file is '../index', expected 'index'",
        ),
        (
            ("index", "columns", 0, "dtype"),
            "<u8",
            "manifest field index.columns[0] is 'parent' '<u8', expected parent <u4",
        ),
        (
            ("totals", "bytes_in"),
            -5,
            "manifest field totals.bytes_in is -5, expected an integer in 0..1152921504606846976",
        ),
    ],
)
def test_nested_manifest_fields_are_checked(
    image: PackImage,
    forged: Path,
    mountpoint: Path,
    path: tuple[Any, ...],
    value: object,
    message: str,
) -> None:
    def forge(manifest: dict[str, Any]) -> None:
        target = manifest
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    image.save(forged, after=forge)
    assert_refused(forged, mountpoint, message)


def test_deeply_nested_manifest_json_is_refused(base: Path, forged: Path, mountpoint: Path) -> None:
    copy_pack(base, forged)
    (forged / "fanfs.manifest").write_bytes(raw_manifest(b"[" * 100_000 + b"]" * 100_000, 4))
    result = run_fanfs("inspect", forged)
    assert result.returncode == 3
    assert result.stderr.startswith(
        "fanfs inspect: error: %s: manifest is not valid JSON: maximum recursion depth" % forged
    )
    assert result.stderr.count("\n") == 1


def test_a_manifest_of_too_many_objects_is_refused_before_parsing(
    base: Path, forged: Path, mountpoint: Path
) -> None:
    copy_pack(base, forged)
    (forged / "fanfs.manifest").write_bytes(raw_manifest(b"[" + b"{}," * 300_000 + b"{}]", 4))
    assert_refused(forged, mountpoint, "manifest has more than 262144 JSON objects and arrays")


def test_a_malformed_plan_record_is_named_by_inspect_not_trusted(
    tmp_path: Path, forged: Path
) -> None:
    """The plan is informational (no reader depends on it): inspect names it malformed, where
    it used to end in a traceback."""
    auto = Path(__file__).resolve().parents[1] / "data" / "golden-v4" / "auto.fan"
    image = PackImage(auto)
    image.manifest["plan"]["classes"][0]["realised"] = []
    image.save(forged)
    result = run_fanfs("inspect", forged)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.endswith(
        "\ncodec plan: the manifest's plan record is malformed (fanfs inspect --json shows it)\n"
    )
    assert run_fanfs("verify", "-q", forged).returncode == 0


def test_a_dictionary_larger_than_any_fanfs_writes_is_refused(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    image.columns["dicts"] = np.zeros(1_100_000, dtype=np.uint8)
    image.manifest["dictionaries"] = [
        {"id": 1, "offset": 0, "size": 1_100_000, "crc32": 0, "class": "x"}
    ]
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "manifest field dictionaries[0].size is 1100000, expected an integer in 1..1048576",
    )


# 3. The index ------------------------------------------------------------------------------


def _entry(image: PackImage, rel: str) -> int:
    return image.entry_of(rel.encode())


def test_a_parent_cycle_is_refused(image: PackImage, forged: Path, mountpoint: Path) -> None:
    """Two directories each other's parent: Index.path() looped forever and hung a reader."""
    b, c = _entry(image, "b"), _entry(image, "b/c")
    image.columns["parent"][b] = c
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: parent[%d] = %d is not an earlier entry (a cycle or a forward reference)" % (b, c),
    )


def test_a_huge_parent_is_refused_without_allocating(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    """One forged parent of 2^32-1 made the mount allocate ~20 GB (np.bincount)."""
    e = _entry(image, "top.txt")
    image.columns["parent"][e] = 0xFFFFFFFF
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: parent[%d] = 4294967295 is not an earlier entry (a cycle or a forward reference)"
        % e,
    )


def test_a_directory_claiming_children_it_has_not_is_refused(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    a = _entry(image, "a")
    image.columns["count"][a] += 1
    image.save(forged)
    first = int(image.columns["first"][a])
    assert_refused(
        forged,
        mountpoint,
        "index: first[%d] = %d, count = %d, but its children are entries %d..%d"
        % (a, first, image.columns["count"][a], first, first + image.columns["count"][a] - 2),
    )


def test_a_file_count_that_disagrees_with_its_size_is_refused(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    """A negative or zero chunk size used to make a 2 MB file read as 0 bytes; the same holds
    for a size whose chunks are not there."""
    e = _entry(image, "a/text.txt")
    image.columns["size"][e] = 100 * CHUNK
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: count[%d] = 4, but a file of 409600 bytes has 100 chunks of 4096" % e,
    )


def test_a_block_size_below_4k_is_refused(tmp_path: Path, forged: Path, mountpoint: Path) -> None:
    """Blocks of a few bytes would make a file of millions of chunks legal."""
    src = tmp_path / "src"
    write_tree(src, {"big.txt": label_text(3 * 8192, 9)})
    pack = tmp_path / "blocks.fan"
    result = run_fanfs("pack", src, pack, "-q", "--chunk-size", "8KiB", "--block-size", "4KiB")
    assert result.returncode == 0, result.stderr

    def forge(manifest: dict[str, Any]) -> None:
        manifest["block_size"] = 16

    PackImage(pack).save(forged, after=forge)
    assert_refused(forged, mountpoint, "manifest field block_size is 16, expected 0 or 4096..4096")


def test_a_block_count_that_disagrees_with_its_size_is_refused(
    tmp_path: Path, forged: Path, mountpoint: Path
) -> None:
    """A file in blocks must have exactly ceil(size / block_size) of them; a count that is
    right for neither unit is named with both."""
    src = tmp_path / "src"
    write_tree(src, {"big.txt": label_text(3 * 8192, 9), "small.txt": b"x"})
    pack = tmp_path / "blocks.fan"
    result = run_fanfs("pack", src, pack, "-q", "--chunk-size", "8KiB", "--block-size", "4KiB")
    assert result.returncode == 0, result.stderr
    image = PackImage(pack)
    e = _entry(image, "big.txt")
    assert image.columns["count"][e] == 6  # 24576 bytes: 6 blocks of 4 KiB, not 3 chunks
    image.columns["size"][e] = 5 * 4096
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: count[%d] = 6, but a file of 20480 bytes has 3 chunks of 8192 or 5 blocks of "
        "4096" % e,
    )


@pytest.mark.parametrize(("byte", "what"), [(b"/", "'/'"), (b"\0", "NUL")])
def test_a_name_with_a_slash_or_nul_is_refused(
    image: PackImage, forged: Path, mountpoint: Path, byte: bytes, what: str
) -> None:
    e = _entry(image, "top.txt")
    image.columns["names"][int(image.columns["name_off"][e]) + 1] = byte[0]
    image.save(forged)
    assert_refused(forged, mountpoint, "index: names[%d] (name) contains %s" % (e, what))


def test_a_dot_name_is_refused(image: PackImage, forged: Path, mountpoint: Path) -> None:
    a = _entry(image, "a")
    image.columns["names"][int(image.columns["name_off"][a])] = ord(".")
    image.save(forged)
    assert_refused(forged, mountpoint, "index: names[%d] is '.' or '..'" % a)


def test_a_name_outside_the_names_blob_is_refused(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    e = _entry(image, "top.txt")
    original = int(image.columns["name_off"][e])
    image.columns["name_off"][e] = 1 << 40
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: name_off[%d] = %d, expected %d (names are stored back to back in entry order)"
        % (e, 1 << 40, original),
    )


def test_a_chunk_in_a_partition_that_does_not_exist_is_refused(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    image.columns["partition"][2] = 7
    image.save(forged)
    assert_refused(forged, mountpoint, "index: partition[2] = 7, but the pack has 3 partitions")


def test_a_chunk_past_its_partition_is_refused(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    size = len(image.parts[int(image.columns["partition"][1])])
    image.columns["offset"][1] = size
    image.save(forged)
    csize = int(image.columns["csize"][1])
    assert_refused(
        forged,
        mountpoint,
        "index: offset[1] = %d with csize %d ends past the %d bytes of partition %d"
        % (size, csize, size, image.columns["partition"][1]),
    )


def test_an_unknown_codec_is_refused(image: PackImage, forged: Path, mountpoint: Path) -> None:
    image.columns["codec"][0] = 9
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: codec[0] = 9 is not a codec byte of format version %d" % PLAIN_FORMAT_VERSION,
    )


def test_a_raw_chunk_of_the_wrong_size_is_refused(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    cid = int(image.columns["first"][_entry(image, "b/random.bin")])
    assert image.columns["codec"][cid] == 0
    image.columns["csize"][cid] -= 1
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: csize[%d] = 4095 does not fit a chunk of 4096 bytes with codec 0" % cid,
    )


# 4. Chunks: bound to their file, bounded when decoded --------------------------------------


def zstd_bomb(size: int) -> bytes:
    """A zstd frame holding (and declaring) `size` zero bytes."""
    cobj = zstandard.ZstdCompressor(level=19).compressobj(size=size)
    zeros = bytes(1 << 24)
    return b"".join(
        [
            *(
                cobj.compress(zeros[: min(len(zeros), size - done)])
                for done in range(0, size, len(zeros))
            ),
            cobj.flush(),
        ]
    )


def _verify(pack: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FANFS, "verify", str(pack)], capture_output=True, text=True, timeout=60, check=False
    )


def test_swapped_chunks_fail_their_checksums(image: PackImage, forged: Path) -> None:
    """Format 4 binds a chunk's checksum to its id: two chunks swapped, with their own
    checksums, no longer pass (format 3's plain crc32 would)."""
    text, deep = _entry(image, "a/text.txt"), _entry(image, "b/c/deep.txt")
    x, y = int(image.columns["first"][text]), int(image.columns["first"][deep])
    for column in ("partition", "offset", "csize", "crc32"):
        col = image.columns[column]
        col[x], col[y] = col[y], col[x]
    image.save(forged)
    result = _verify(forged)
    assert result.returncode == 3
    assert sorted(result.stderr.splitlines()) == sorted(
        [
            "fanfs verify: corrupt: a/text.txt: chunk 0 (partition %d): checksum mismatch"
            % image.columns["partition"][x],
            "fanfs verify: corrupt: b/c/deep.txt: chunk 0 (partition %d): checksum mismatch"
            % image.columns["partition"][y],
            "fanfs verify: %s: 2 damaged object(s)" % forged,
        ]
    )


def test_a_duplicated_chunk_fails_its_checksum(image: PackImage, forged: Path) -> None:
    text = _entry(image, "a/text.txt")
    x = int(image.columns["first"][text])
    for column in ("partition", "offset", "csize", "crc32"):
        image.columns[column][x + 1] = image.columns[column][x]
    image.save(forged)
    result = _verify(forged)
    assert result.returncode == 3
    assert (
        "fanfs verify: corrupt: a/text.txt: chunk 1 (partition %d): checksum mismatch"
        % image.columns["partition"][x]
        in result.stderr.splitlines()
    )


def test_verify_finds_a_bomb_whose_checksums_all_match(image: PackImage, forged: Path) -> None:
    """A chunk replaced by a zstd frame declaring 64 MiB (stored in under its 4 KiB: a chunk
    larger than its decoded size is refused at open), every checksum recomputed: verify used
    to decode only chunks of partitions whose crc32 failed, and passed it."""
    bomb = zstd_bomb(1 << 26)
    assert len(bomb) <= CHUNK
    cid = int(image.columns["first"][_entry(image, "a/text.txt")]) + 1
    image.set_chunk(cid, bomb)
    image.save(forged)
    result = _verify(forged)
    assert (result.returncode, result.stderr.splitlines()) == (
        3,
        [
            "fanfs verify: corrupt: a/text.txt: chunk 1 (partition %d): zstd: frame declares 67108864 bytes, expected 4096"
            % image.columns["partition"][cid],
            "fanfs verify: %s: 1 damaged object(s)" % forged,
        ],
    )


# 9. A compressed index (version 6): one zstd frame, decoded into exactly `usize` bytes -------


def _compressed_index(image: PackImage, forged: Path, stored: bytes, usize: int) -> None:
    """Save `image` with `stored` as its index file, declared zstd of `usize` bytes."""

    def compress(manifest: dict[str, Any]) -> None:
        manifest["index"].update(
            codec="zstd", usize=usize, size=len(stored), crc32=zlib.crc32(stored)
        )

    image.save(forged, after=compress)
    (forged / "index").write_bytes(stored)


def _columns(forged: Path) -> bytes:
    return (forged / "index").read_bytes()


def test_a_compressed_index_reads_as_its_columns(
    image: PackImage, forged: Path, base: Path
) -> None:
    image.save(forged)
    columns = _columns(forged)
    frame = zstandard.ZstdCompressor().compress(columns)
    _compressed_index(image, forged, frame, len(columns))
    assert _verify(forged).returncode == 0
    shown = run_fanfs("inspect", forged).stdout.splitlines()
    assert (
        "index       %s, stored zstd in %s"
        % (
            format_size(len(columns)),
            format_size(len(frame)),
        )
        in shown
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (1, "index decompresses to more than the %d bytes the manifest says (corrupt pack)"),
        (-1, "index decompresses to %d bytes, manifest says %d (corrupt pack)"),
    ],
)
def test_a_compressed_index_of_another_size_is_refused(
    image: PackImage, forged: Path, mountpoint: Path, change: int, message: str
) -> None:
    image.save(forged)
    columns = _columns(forged)
    # The frame's own header says nothing of its size: only what it decodes to counts.
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(columns)
    usize = len(columns) - change
    _compressed_index(image, forged, frame, usize)
    expected = message % usize if change > 0 else message % (usize, usize)
    if change < 0:
        expected = message % (len(columns), usize)
    assert_refused(forged, mountpoint, expected)


def test_a_compressed_index_bomb_is_cut_at_its_declared_size(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    # 8 KiB of frame that would decode to 1 GiB: refused after usize + 1 bytes, not decoded.
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(1 << 30))
    assert len(bomb) < 64 * 1024
    _compressed_index(image, forged, bomb, 4096)
    assert_refused(
        forged,
        mountpoint,
        "index decompresses to more than the 4096 bytes the manifest says (corrupt pack)",
    )


def test_an_index_that_is_not_zstd_is_refused(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    image.save(forged)
    _compressed_index(image, forged, b"not a zstd frame" * 8, 4096)
    for command, extra in (("inspect", ()), ("verify", ()), ("mount", (str(mountpoint),))):
        result = run_fanfs(command, forged, *extra, timeout=60)
        assert result.returncode == 3, command
        assert result.stderr.startswith(
            "fanfs %s: error: %s: index does not decompress: " % (command, forged)
        ), result.stderr
        assert result.stderr.endswith(" (corrupt pack)\n") and result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"codec": "lz4"}, "manifest field index.codec is 'lz4', expected one of none, zstd"),
        ({"usize": 7}, "manifest field index.usize is 7, expected the index size %d (codec none)"),
        ({"codec": None}, "manifest field index.codec is None, expected a string"),
    ],
)
def test_index_codec_fields_are_checked(
    image: PackImage, forged: Path, mountpoint: Path, fields: dict[str, Any], message: str
) -> None:
    image.save(forged)
    size = len(_columns(forged))
    image.save(forged, after=lambda manifest: manifest["index"].update(fields))
    assert_refused(forged, mountpoint, message % size if "%d" in message else message)


def test_a_version_5_manifest_cannot_declare_a_compressed_index(tmp_path: Path) -> None:
    # `index.codec` and `usize` are validated from version 6 on, and read only there: in a
    # version-5 manifest they are unknown keys, and the index is its columns as before.
    pack = copy_pack(GOLDEN_V5, tmp_path / "v5.fan")
    image = PackImage(pack)
    assert image.version == 5

    def declare(manifest: dict[str, Any]) -> None:
        manifest["index"].update(codec="zstd", usize="a lot")

    image.save(pack, after=declare)
    assert _verify(pack).returncode == 0


def test_a_compressed_index_larger_than_memory_is_refused_before_it_is_decoded(
    image: PackImage, forged: Path, mountpoint: Path
) -> None:
    image.save(forged)
    columns = _columns(forged)
    _compressed_index(image, forged, zstandard.ZstdCompressor().compress(columns), 1 << 50)
    result = run_fanfs("inspect", forged, timeout=60)
    assert result.returncode == 3
    assert result.stderr.startswith(
        "fanfs inspect: error: %s: index of 1024.0 TiB does not fit in this node's memory ("
        % forged
    ), result.stderr


def test_the_base_pack_is_good(base: Path) -> None:
    """Premise of every case above: the untouched pack verifies and the forge round-trips."""
    assert _verify(base).returncode == 0
    assert partition_name(0) == "part-00000"


def test_an_unforged_copy_through_the_forge_is_identical(
    image: PackImage, base: Path, forged: Path
) -> None:
    image.save(forged)
    for name in sorted(os.listdir(base)):
        assert (forged / name).read_bytes() == (base / name).read_bytes(), name


_ = (shutil, stat, zlib, Callable)


# 10. Solid blocks (format 7): a slice must lie inside its block, and a block is at most a chunk


@pytest.fixture(scope="module")
def solid_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-solid")
    src = write_tree(root / "src", {"s/%02d.txt" % i: label_text(300 + i, i) for i in range(12)})
    pack = root / "solid.fan"
    result = run_fanfs(
        *("pack", src, pack, "-q", "--chunk-size", str(CHUNK), "--solid-block", "4KiB"),
        *("--index-codec", "none"),
    )
    assert result.returncode == 0, result.stderr
    return pack


def test_a_solid_slice_past_its_block_is_refused(
    solid_base: Path, forged: Path, mountpoint: Path
) -> None:
    image = PackImage(solid_base)
    e = _entry(image, "s/05.txt")
    cid = int(image.columns["first"][e])
    bsize = int(image.columns["bsize"][cid])
    assert image.version == 7 and bsize > 0
    image.columns["skip"][cid] = bsize - 10
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: skip[%d] = %d: 305 bytes from there do not fit a block of %d bytes"
        % (cid, bsize - 10, bsize),
    )


def test_a_solid_block_larger_than_a_chunk_is_refused(
    solid_base: Path, forged: Path, mountpoint: Path
) -> None:
    """A block's decoded size bounds what one read decodes: never more than a chunk."""
    image = PackImage(solid_base)
    cid = int(image.columns["first"][_entry(image, "s/00.txt")])
    image.columns["bsize"][cid] = 1 << 31
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: skip[%d] = %d: the block of %d bytes is larger than a chunk (%d)"
        % (cid, image.columns["skip"][cid], 1 << 31, CHUNK),
    )


def test_a_skip_outside_a_solid_block_is_refused(
    solid_base: Path, forged: Path, mountpoint: Path
) -> None:
    image = PackImage(solid_base)
    cid = int(image.columns["first"][_entry(image, "s/03.txt")])
    image.columns["bsize"][cid] = 0
    image.columns["skip"][cid] = 7
    image.save(forged)
    assert_refused(
        forged,
        mountpoint,
        "index: skip[%d] = 7, but the chunk is not in a solid block (bsize 0)" % cid,
    )


def test_a_solid_pack_reads_as_the_reference_reads_it(solid_base: Path) -> None:
    """Every file of a solid pack, read by the forge's oracle (docs/format.md section 4)."""
    image = PackImage(solid_base)
    assert len(set(image.columns["offset"][image.columns["bsize"] > 0])) < 12  # shared blocks
    for i in range(12):
        rel = b"s/%02d.txt" % i
        assert reference_read(image, rel) == label_text(300 + i, i), rel
