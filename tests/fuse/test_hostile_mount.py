"""A mount of an untrusted pack, on real FUSE mounts (issue 10, docs/security.md).

- a setuid-root binary inside a pack does not run as root (the mount is nosuid, nodev);
- a pack changed under a live mount: a truncated or rewritten partition gives EIO for what
  it held and the mount keeps serving (a preloaded one keeps serving its copy); a truncated
  index changes nothing (it was copied at open);
- a serving process that dies while holding requests takes the mount down at once instead
  of leaving readers waiting forever;
- the background filler is reaped when it finishes (no zombie until unmount).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fanfs.format.reader import PackReader
from tests.conftest import NOBODY, Mount, as_nobody, run_fanfs
from tests.fuse.test_lifecycle import adopt_orphans, mountinfo, wait_until
from tests.treegen import label_text, write_tree

pytestmark = pytest.mark.fuse


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts as root, runs a binary as nobody")
def test_setuid_binary_in_a_pack_does_not_run_as_root(
    tmp_path: Path, public_dir: Path, mount_factory: Callable[..., Mount]
) -> None:
    """A root mount answers with uid 0 for every file: without nosuid, a setuid file in a
    pack anyone can write would be a root shell for every user of the node."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy("/usr/bin/id", src / "id")
    (src / "id").chmod(0o4755)
    pack = tmp_path / "suid.fan"
    assert run_fanfs("pack", src, pack, "-q").returncode == 0
    mnt = public_dir / "mnt"
    mnt.mkdir()
    with Mount(pack, mnt, "-o", "allow_other"):
        fields = mountinfo(mnt)
        assert fields is not None
        assert {"nosuid", "nodev"} <= set(fields[5].split(",")), fields
        assert os.stat(mnt / "id").st_mode & 0o7777 == 0o4755  # shown as it was packed
        ran = as_nobody(mnt / "id", "-u")
        assert (ran.returncode, ran.stdout.strip()) == (0, str(NOBODY)), ran.stderr


def _pack_tree(
    tmp_path: Path, files: int = 64, size: int = 150_000
) -> tuple[Path, dict[str, bytes]]:
    content = {"d%02d/f%03d.txt" % (i % 4, i): label_text(size, i) for i in range(files)}
    src = tmp_path / "src"
    write_tree(src, content)
    pack = tmp_path / "p.fan"
    result = run_fanfs("pack", src, pack, "-q", "--chunk-size", "64KiB", "--partitions", "4")
    assert result.returncode == 0, result.stderr
    return pack, content


def _files_in(pack: Path, partition: int, lo: int, hi: int) -> set[str]:
    """Files with a chunk in bytes lo..hi-1 of `partition`."""
    reader = PackReader(str(pack))
    try:
        index = reader.index
        hit = set()
        for entry in range(index.entry_count):
            if index.is_dir(entry):
                continue
            for cid in range(index.first[entry], index.first[entry] + index.count[entry]):
                start = index.chunk_offset[cid]
                if (
                    index.chunk_partition[cid] == partition
                    and start < hi
                    and start + index.chunk_csize[cid] > lo
                ):
                    hit.add(index.path(entry).decode())
        return hit
    finally:
        reader.close()


def _read_all(mnt: Path, content: dict[str, bytes]) -> dict[str, int | None]:
    """errno of reading each file (None: the bytes equal the source's)."""
    out: dict[str, int | None] = {}
    for rel, data in content.items():
        try:
            with open(mnt / rel, "rb", buffering=0) as f:
                got = f.read()
        except OSError as exc:
            out[rel] = exc.errno
            continue
        assert got == data, "wrong bytes from %s" % rel
        out[rel] = None
    return out


def test_truncated_and_rewritten_partitions_give_eio_and_the_mount_serves_on(
    tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    pack, content = _pack_tree(tmp_path)
    size = (pack / "part-00001").stat().st_size
    hit = _files_in(pack, 1, size // 2, size)
    rewritten = _files_in(pack, 2, 0, 4096)
    assert hit and rewritten and len(hit | rewritten) < len(content)
    mount = mount_factory(pack, "--preload", "no", "--prefetch", "off", "--cache-memory", "0")
    os.truncate(pack / "part-00001", size // 2)
    with open(pack / "part-00002", "r+b") as f:  # rewritten in place, same size
        f.write(b"\xff" * 4096)
    outcome = _read_all(mount.mnt, content)
    failed = {rel for rel, code in outcome.items() if code is not None}
    assert set(outcome.values()) <= {None, errno.EIO}
    assert hit | rewritten == failed  # exactly the files that lost or changed bytes
    assert failed < set(content)  # the others read back exactly
    # Still serving: a listing and an untouched file after the errors.
    assert sorted(os.listdir(mount.mnt)) == ["d00", "d01", "d02", "d03"]
    rel = sorted(set(content) - failed)[0]
    assert (mount.mnt / rel).read_bytes() == content[rel]


def test_a_preloaded_pack_serves_its_copy_after_partitions_and_index_are_truncated(
    tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    """The issue's SIGBUS: partitions and the index were mapped, and truncating one under a
    live mount killed a serving process. Now they are copies made at open."""
    pack, content = _pack_tree(tmp_path)
    mount = mount_factory(pack, "--preload", "yes", "--prefetch", "off", "--cache-memory", "0")
    assert wait_until(lambda: "fanfs.mount: preloaded " in mount.log_text(), 20), mount.log_text()
    for part in sorted(pack.glob("part-*")):
        os.truncate(part, 0)
    os.truncate(pack / "index", 0)
    assert _read_all(mount.mnt, content) == dict.fromkeys(content)
    assert mount.proc is not None and mount.proc.poll() is None
    assert not mount.log_lines("CRITICAL")


def _daemon_children(pid: int) -> list[int]:
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(p) for p in f.read().split()]


def test_the_background_filler_is_reaped_when_it_finishes(
    edge_pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(edge_pack, "--processes", "1", "--cache-memory", "64MiB")
    assert mount.proc is not None
    pid = mount.proc.pid
    assert len(_daemon_children(pid)) == 1  # the filler
    os.stat(mount.mnt / "sizes")  # the job's first LOOKUP starts the fill; the pack fits the cache
    # Once done it exits, and the mount reaps it: no zombie left until the unmount.
    assert wait_until(lambda: not _daemon_children(pid), 20), [
        (child, Path("/proc/%d/stat" % child).read_text().split()[2])
        for child in _daemon_children(pid)
    ]


def _state(pid: int) -> str:
    with open("/proc/%d/stat" % pid, "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def test_a_serving_process_that_dies_takes_the_mount_down_instead_of_hanging_readers(
    tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    """Requests the kernel handed to a serving process that dies can be answered by no other
    one; the kernel keeps them waiting while any process still holds /dev/fuse. So the first
    process ends the mount: the readers get ENOTCONN instead of waiting forever."""
    pack, content = _pack_tree(tmp_path, files=200, size=300_000)
    mount = mount_factory(
        pack, "--processes", "2", "--preload", "no", "--prefetch", "off", "--cache-memory", "0"
    )
    assert mount.proc is not None
    first = mount.proc.pid
    (child,) = _daemon_children(first)
    progress: dict[int, float] = {}
    outcome: dict[int, BaseException | None] = {}
    stop = threading.Event()

    def reader(number: int) -> None:
        try:
            while not stop.is_set():
                for rel in list(content)[number::4]:
                    with open(mount.mnt / rel, "rb", buffering=0) as f:
                        while f.read(65536):
                            progress[number] = time.monotonic()
                        # Drop it from the page cache: the next round must ask the daemon.
                        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            outcome[number] = None
        except OSError as exc:
            outcome[number] = exc

    threads = [threading.Thread(target=reader, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    try:
        # Premise: freeze the second process until a reader waits on a request it holds.
        stuck = False
        for _ in range(20):
            os.kill(child, signal.SIGSTOP)
            time.sleep(1.0)
            now = time.monotonic()
            if any(now - progress.get(n, now) > 0.8 for n in range(4)):
                stuck = True
                break
            os.kill(child, signal.SIGCONT)
            time.sleep(0.05)
        assert stuck, "no reader ever waited on the frozen serving process"
        with adopt_orphans():
            os.kill(child, signal.SIGKILL)
            stop.set()
            for t in threads:
                t.join(15)
            assert not any(
                t.is_alive() for t in threads
            ), "a reader still waits for the dead process's request"
            assert mount.proc.wait(10) == 1
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)
    # By errno: Python raises ECONNABORTED as ConnectionAbortedError, ENOTCONN as OSError.
    errors = {e.errno if isinstance(e, OSError) else repr(e) for e in outcome.values() if e}
    assert errors <= {errno.ENOTCONN, errno.ECONNABORTED}, outcome
    (line,) = mount.log_lines("CRITICAL")
    assert (
        "serving process %d was killed by SIGKILL; taking the mount of %s down" % (child, mount.mnt)
        in line
    )
    mount.proc = None
    result = run_fanfs("umount", mount.mnt)
    assert (result.returncode, result.stderr) == (0, "")
    assert mountinfo(mount.mnt) is None


def _peak_rss(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM for %d" % pid)


def test_a_decompression_bomb_is_eio_with_the_daemon_memory_flat(
    tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    """A chunk replaced by a zstd frame that declares 1 GiB (32 KiB stored, within its 64 KiB
    chunk), every checksum recomputed: the daemon decoded all of it before the size check
    (peak RSS +1 GiB). Now the frame's header is refused: EIO, one ERROR line, no growth."""
    import zstandard

    from tests.forge import PackImage

    pack, content = _pack_tree(tmp_path, files=8)
    image = PackImage(pack)
    victim = "d01/f001.txt"
    cid = int(image.columns["first"][image.entry_of(victim.encode())]) + 1
    cobj = zstandard.ZstdCompressor(level=19).compressobj(size=1 << 30)
    bomb = b"".join([*(cobj.compress(bytes(1 << 24)) for _ in range(64)), cobj.flush()])
    assert len(bomb) <= 64 * 1024
    image.set_chunk(cid, bomb)
    forged = image.save(tmp_path / "bomb.fan")
    assert run_fanfs("verify", "-q", forged).returncode == 3
    mount = mount_factory(
        forged, "--processes", "1", "--preload", "no", "--prefetch", "off", "--cache-memory", "0"
    )
    assert mount.proc is not None
    others = {rel: data for rel, data in content.items() if rel != victim}
    assert _read_all(mount.mnt, others) == dict.fromkeys(others)
    before = _peak_rss(mount.proc.pid)
    with pytest.raises(OSError) as info:
        (mount.mnt / victim).read_bytes()
    assert info.value.errno == errno.EIO
    assert _peak_rss(mount.proc.pid) - before < 32 << 20
    assert _read_all(mount.mnt, others) == dict.fromkeys(others)  # still serving
    (line,) = mount.log_lines("ERROR")
    assert line.endswith(
        "zstd: frame declares 1073741824 bytes, expected 65536 in %s (chunk 1, partition %d, offset %d)"
        % (victim, image.columns["partition"][cid], image.columns["offset"][cid])
    )
