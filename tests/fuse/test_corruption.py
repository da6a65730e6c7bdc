"""Damaged packs: a corrupt chunk costs one file (EIO, logged once), never the mount; a pack
that cannot be served is refused before anything is mounted, with one line and an exit code."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fanfs.compression import CODEC_NONE, CODEC_ZSTD
from fanfs.format.layout import FORMAT_VERSION
from fanfs.format.reader import PackReader
from fanfs.mountinfo import mounts
from tests.conftest import TEST_CHUNK_SIZE, TEST_FSNAME, Mount, entry_at, run_fanfs

pytestmark = pytest.mark.fuse

MODES = {
    "noopen": (),
    "open": ("--no-noopen",),
    "cold": ("--preload", "no"),
    "one-process": ("--processes", "1"),
}
# (path, chunk to damage, expected codec of that chunk)
DAMAGED = {
    "compressible": ("sizes/text_196625", 1, CODEC_ZSTD),
    "raw": ("sizes/rand_196625", 2, CODEC_NONE),
}
DAMAGED_CHUNK = {rel: chunk_no for rel, chunk_no, _ in DAMAGED.values()}


def damage_chunk(pack: Path, rel: str, chunk_no: int, codec: int) -> tuple[int, int]:
    """Flip one byte in the middle of a stored chunk of `rel`; returns (partition, chunk id)."""
    reader = PackReader(str(pack))
    try:
        index = reader.index
        entry = entry_at(reader, rel)
        assert chunk_no < index.count[entry]
        cid = index.first[entry] + chunk_no
        assert index.chunk_codec[cid] == codec, "premise: %s chunk %d is stored with codec %d" % (
            rel,
            chunk_no,
            codec,
        )
        partition = index.chunk_partition[cid]
        offset = index.chunk_offset[cid] + index.chunk_csize[cid] // 2
        part_file = pack / reader.partitions[partition]["file"]
    finally:
        reader.close()
    with open(part_file, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))
    return partition, cid


def neighbours(pack: Path, partition: int, exclude: set[str]) -> list[str]:
    """Files with a chunk in `partition`, nearest to the partition's start first."""
    reader = PackReader(str(pack))
    try:
        index = reader.index
        found = []
        for entry in range(index.entry_count):
            if not index.count[entry] or index.is_dir(entry) or not (index.mode[entry] & 0o100000):
                continue
            chunks = range(index.first[entry], index.first[entry] + index.count[entry])
            offsets = [
                index.chunk_offset[c] for c in chunks if index.chunk_partition[c] == partition
            ]
            rel = index.path(entry).decode("utf-8", "surrogateescape")
            if offsets and rel not in exclude:
                found.append((min(offsets), rel))
        return [rel for _, rel in sorted(found)]
    finally:
        reader.close()


def read_errno(path: Path) -> int | None:
    try:
        path.read_bytes()
    except OSError as exc:
        return exc.errno
    return None


@pytest.mark.parametrize("mode", list(MODES))
def test_corrupt_chunk_fails_one_file(
    mode: str, edge_pack: Path, edge_tree: Path, tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    pack = tmp_path / "damaged.fan"
    shutil.copytree(edge_pack, pack)
    damaged = {
        rel: damage_chunk(pack, rel, chunk_no, codec) for rel, chunk_no, codec in DAMAGED.values()
    }
    # Fresh mount: nothing of the damaged pack is in the kernel page cache.
    mount = mount_factory(pack, *MODES[mode])
    mnt = mount.mnt

    for rel in damaged:
        assert read_errno(mnt / rel) == errno.EIO, rel
    for rel, (partition, _) in damaged.items():
        near = neighbours(pack, partition, exclude=set(damaged))[:5]
        assert near, "no neighbour in partition %d" % partition
        for other in near:
            assert (mnt / other).read_bytes() == (edge_tree / other).read_bytes(), (rel, other)
    # Again: still EIO (not stale or zero-filled data), from the broken-chunk cache.
    for rel in damaged:
        assert read_errno(mnt / rel) == errno.EIO, rel
        with open(mnt / rel, "rb", buffering=0) as f:
            with pytest.raises(OSError) as info:
                os.pread(f.fileno(), TEST_CHUNK_SIZE, DAMAGED_CHUNK[rel] * TEST_CHUNK_SIZE)
            assert info.value.errno == errno.EIO
            # The intact first chunk of the damaged file still reads.
            assert os.pread(f.fileno(), 1000, 0) == (edge_tree / rel).read_bytes()[:1000]
    # The mount keeps serving everything else.
    assert sorted(os.listdir(mnt)) == sorted(os.listdir(edge_tree))
    for name in sorted(os.listdir(edge_tree / "sizes")):
        rel = "sizes/" + name
        if rel not in damaged:
            assert (mnt / rel).read_bytes() == (edge_tree / rel).read_bytes(), rel

    errors = mount.log_lines("ERROR")
    for rel in damaged:
        naming = [line for line in errors if rel in line]
        assert len(naming) == 1, (rel, errors)
    assert len(errors) == len(damaged), errors
    assert "Traceback" not in mount.log_text()


def test_a_corrupt_shared_chunk_fails_every_file_that_holds_it(
    edge_pack: Path, edge_tree: Path, tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    """dups/original's second chunk is stored once for it, its copy and same_start (format.md
    section 5.1): damaged, all three give EIO there, each row failing its own crc32, and
    their other chunks and the rest of dups/ still read."""
    pack = tmp_path / "damaged.fan"
    shutil.copytree(edge_pack, pack)
    damage_chunk(pack, "dups/original", 1, CODEC_NONE)
    mnt = mount_factory(pack).mnt
    for rel in ("dups/original", "dups/copy", "dups/same_start"):
        assert read_errno(mnt / rel) == errno.EIO, rel
        with open(mnt / rel, "rb", buffering=0) as f:
            assert os.pread(f.fileno(), 1000, 0) == (edge_tree / rel).read_bytes()[:1000]
    tail = 2 * TEST_CHUNK_SIZE
    with open(mnt / "dups" / "same_start", "rb", buffering=0) as f:
        assert (
            os.pread(f.fileno(), 100, tail)
            == (edge_tree / "dups" / "same_start").read_bytes()[tail:]
        )
    assert (mnt / "dups" / "zeros").read_bytes() == (edge_tree / "dups" / "zeros").read_bytes()


# Mount refusals: `fanfs mount` (background, as users run it) must exit with the code of
# docs/errors.md and one line on stderr, leaving nothing mounted and no daemon behind.


def _mountinfo_count(mnt: Path) -> int:
    return sum(1 for entry in mounts() if entry.mountpoint == str(mnt))


def _processes_naming(path: Path, daemon: int | None = None) -> list[int]:
    """Live processes whose command line names `path`, other than `daemon` and its children."""
    needle = str(path).encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == daemon:
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read()
            with open("/proc/%s/stat" % pid, "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            continue
        if needle in cmdline and ppid != daemon:
            pids.append(int(pid))
    return pids


def _pack_copy(edge_pack: Path, tmp: Path) -> Path:
    pack = tmp / "pack.fan"
    shutil.copytree(edge_pack, pack)
    return pack


def _partition_files(pack: Path) -> list[Path]:
    files = sorted(pack.glob("part-*"))
    assert len(files) > 2
    return files


def _truncate_partition(pack: Path) -> str:
    part = _partition_files(pack)[-1]
    size = part.stat().st_size
    os.truncate(part, size - 100)
    return "%s: partition %s is %d bytes, manifest says %d (truncated pack?)" % (
        pack,
        part.name,
        size - 100,
        size,
    )


def _wrong_version(pack: Path) -> str:
    with open(pack / "fanfs.manifest", "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<I", 99))
    return "%s: pack format version 99 is not supported (this fanfs reads version %d)" % (
        pack,
        FORMAT_VERSION,
    )


def _corrupt_index(pack: Path) -> str:
    with open(pack / "index", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    return "%s: index checksum mismatch (corrupt pack)" % pack


def _missing_partition(pack: Path) -> str:
    part = _partition_files(pack)[1]
    part.unlink()
    return "%s: cannot open partition %s: No such file or directory" % (pack, part.name)


def _corrupt_manifest(pack: Path) -> str:
    data = bytearray((pack / "fanfs.manifest").read_bytes())
    data[30] ^= 0x01
    (pack / "fanfs.manifest").write_bytes(bytes(data))
    return "%s: manifest is truncated or corrupt" % pack


PACK_CASES: dict[str, Callable[[Path], str]] = {
    "truncated partition": _truncate_partition,
    "wrong version": _wrong_version,
    "corrupt index": _corrupt_index,
    "missing partition": _missing_partition,
    "corrupt manifest": _corrupt_manifest,
}


def _refused(pack: Path, mnt: Path, code: int, message: str) -> None:
    result = run_fanfs(
        "mount",
        "-o",
        "fsname=" + TEST_FSNAME,
        "--log",
        mnt.parent / "refused.log",
        pack,
        mnt,
        timeout=60,
    )
    try:
        assert (result.returncode, result.stderr, result.stdout) == (
            code,
            "fanfs mount: error: %s\n" % message,
            "",
        )
    finally:
        if _mountinfo_count(mnt):  # a wrongly accepted mount must not outlive the test
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False, capture_output=True)
    assert _processes_naming(mnt) == []


def test_refuses_bad_packs(edge_pack: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    missing = tmp_path / "no-such-pack"
    _refused(missing, mnt, 3, "%s: not a fanfs pack (no such directory)" % missing)
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    _refused(empty, mnt, 3, "%s: not a fanfs pack (no fanfs.manifest)" % empty)
    for what, damage in PACK_CASES.items():
        case = tmp_path / what.replace(" ", "-")
        case.mkdir()
        pack = _pack_copy(edge_pack, case)
        message = damage(pack)
        _refused(pack, mnt, 3, message)
        assert _mountinfo_count(mnt) == 0, what
    assert os.listdir(mnt) == []


def test_refuses_bad_mountpoints(
    edge_pack: Path, edge_tree: Path, tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    missing = tmp_path / "no-such-dir"
    _refused(edge_pack, missing, 4, "mountpoint %s does not exist" % missing)
    assert not missing.exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_bytes(b"x")
    _refused(edge_pack, full, 4, "mountpoint %s is not empty" % full)
    assert _mountinfo_count(full) == 0 and os.listdir(full) == ["something"]
    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"")
    _refused(edge_pack, a_file, 4, "mountpoint %s is not a directory" % a_file)
    assert _mountinfo_count(a_file) == 0

    mount = mount_factory(edge_pack)
    try:
        result = run_fanfs(
            "mount",
            "-o",
            "fsname=" + TEST_FSNAME,
            "--log",
            tmp_path / "second.log",
            edge_pack,
            mount.mnt,
            timeout=60,
        )
        assert (result.returncode, result.stderr, result.stdout) == (
            4,
            "fanfs mount: error: %s is already a mount point (unmount it first: fanfs umount %s)\n"
            % (mount.mnt, mount.mnt),
            "",
        )
    finally:
        for _ in range(3):  # a second mount stacked on top: remove it
            if _mountinfo_count(mount.mnt) <= 1:
                break
            subprocess.run(
                ["fusermount3", "-u", "-z", str(mount.mnt)], check=False, capture_output=True
            )
    assert _mountinfo_count(mount.mnt) == 1
    assert mount.proc is not None and mount.proc.poll() is None
    assert _processes_naming(mount.mnt, daemon=mount.proc.pid) == []
    assert sorted(os.listdir(mount.mnt)) == sorted(os.listdir(edge_tree))
