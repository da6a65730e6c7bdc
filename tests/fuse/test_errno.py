"""What a user sees when asking a mount for something it cannot do: the errno table of
STYLE.md B7, the fanfs xattrs, statvfs and access(), on one shared mount of the edge pack."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TEST_CHUNK_SIZE, Mount
from tests.pagecache import drop_from_page_cache

pytestmark = pytest.mark.fuse

CODECS = {"none", "lz4", "zstd", "brotli"}
FILE_XATTRS = {
    "user.fanfs.codec",
    "user.fanfs.stored_size",
    "user.fanfs.chunks",
    "user.fanfs.partitions",
}
ROOT_XATTRS = {
    "user.fanfs.stats",
    "user.fanfs.pack",
    "user.fanfs.pid",
    "user.fanfs.version",
    "user.fanfs.hints",
}


def stats(mnt: Path) -> dict[str, int]:
    return json.loads(os.getxattr(mnt, "user.fanfs.stats"))


def raises_errno(code: int, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    assert info.value.errno == code, "%s%r: expected %s, got %s" % (
        getattr(fn, "__name__", fn),
        args,
        errno.errorcode[code],
        errno.errorcode.get(info.value.errno or 0),
    )


def test_enoent_and_cached_negative_lookup(edge_tree: Path, edge_mount: Mount) -> None:
    mnt = edge_mount.mnt
    for rel in ("no-such-file", "sizes/no-such-file", "deep/level00/missing", "names/" + "m" * 255):
        raises_errno(errno.ENOENT, os.stat, mnt / rel)
        before = stats(mnt)["lookups"]
        raises_errno(errno.ENOENT, os.stat, mnt / rel)
        raises_errno(errno.ENOENT, os.open, mnt / rel, os.O_RDONLY)
        # The kernel answers the repeats from its negative dentry: no new LOOKUP.
        assert stats(mnt)["lookups"] == before, rel
    raises_errno(errno.ENOENT, os.listdir, mnt / "no-such-dir")
    # a negative entry hides nothing that exists
    assert (mnt / "sizes" / "text_100").read_bytes() == (
        edge_tree / "sizes" / "text_100"
    ).read_bytes()


def test_enotdir(edge_mount: Mount) -> None:
    mnt = edge_mount.mnt
    raises_errno(errno.ENOTDIR, os.stat, mnt / "sizes/text_1/x")
    raises_errno(errno.ENOTDIR, os.open, mnt / "sizes/text_1/x", os.O_RDONLY)
    raises_errno(errno.ENOTDIR, os.listdir, mnt / "sizes/text_1")
    raises_errno(errno.ENOTDIR, os.open, mnt / "sizes/text_1", os.O_RDONLY | os.O_DIRECTORY)


def test_eisdir(edge_mount: Mount) -> None:
    mnt = edge_mount.mnt
    for rel in ("sizes", ".", "empty_dir"):
        fd = os.open(mnt / rel, os.O_RDONLY)
        try:
            raises_errno(errno.EISDIR, os.read, fd, 100)
            raises_errno(errno.EISDIR, os.pread, fd, 100, 0)
        finally:
            os.close(fd)
        raises_errno(errno.EISDIR, os.open, mnt / rel, os.O_WRONLY)
        raises_errno(errno.EISDIR, os.open, mnt / rel, os.O_RDWR)
    raises_errno(errno.EISDIR, open, mnt / "sizes", "rb")


def test_enametoolong(edge_mount: Mount) -> None:
    mnt = edge_mount.mnt
    raises_errno(errno.ENAMETOOLONG, os.stat, mnt / ("n" * 256))
    raises_errno(errno.ENAMETOOLONG, os.stat, mnt / "names" / ("n" * 256))
    raises_errno(errno.ENAMETOOLONG, os.open, mnt / "names" / ("n" * 300), os.O_RDONLY)
    # 255 bytes is still a valid name
    assert (mnt / "names" / ("n" * 255)).read_bytes() == b"255-byte name\n"


def _open_for_writing(path: Path) -> None:
    with open(path, "wb"):
        pass


def test_erofs_for_every_write_intent(edge_mount: Mount) -> None:
    mnt = edge_mount.mnt
    f = mnt / "sizes" / "text_100"
    original = f.read_bytes()
    new = mnt / "new-file"
    attempts = {
        "open O_WRONLY": lambda: os.open(f, os.O_WRONLY),
        "open O_RDWR": lambda: os.open(f, os.O_RDWR),
        "open O_APPEND": lambda: os.open(f, os.O_WRONLY | os.O_APPEND),
        "open O_TRUNC": lambda: os.open(f, os.O_RDONLY | os.O_TRUNC),
        "open O_CREAT new": lambda: os.open(new, os.O_WRONLY | os.O_CREAT, 0o644),
        "open O_CREAT new in subdir": lambda: os.open(
            mnt / "empty_dir" / "x", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644
        ),
        "builtin open w": lambda: _open_for_writing(new),
        "mkdir": lambda: os.mkdir(mnt / "new-dir"),
        "rmdir": lambda: os.rmdir(mnt / "empty_dir"),
        "unlink": lambda: os.unlink(f),
        "rename": lambda: os.rename(f, mnt / "sizes" / "renamed"),
        "rename dir": lambda: os.rename(mnt / "empty_dir", mnt / "renamed_dir"),
        "symlink": lambda: os.symlink("target", mnt / "new-link"),
        "link": lambda: os.link(f, mnt / "new-hardlink"),
        "chmod": lambda: os.chmod(f, 0o600),
        "chown": lambda: os.chown(f, 1000, 1000),
        "utime": lambda: os.utime(f, (0, 0)),
        "truncate": lambda: os.truncate(f, 0),
        "setxattr": lambda: os.setxattr(f, "user.test", b"x"),
        "setxattr existing": lambda: os.setxattr(f, "user.fanfs.codec", b"none"),
        "removexattr": lambda: os.removexattr(f, "user.fanfs.codec"),
        "mknod fifo": lambda: os.mknod(mnt / "new-fifo", 0o600 | stat.S_IFIFO),
    }
    wrong = {}
    for what, attempt in attempts.items():
        try:
            result = attempt()
        except OSError as exc:
            if exc.errno != errno.EROFS:
                wrong[what] = errno.errorcode.get(exc.errno or 0, exc.errno)
        else:
            wrong[what] = "succeeded (%r)" % (result,)
            if isinstance(result, int):
                os.close(result)
    assert not wrong, wrong
    # nothing changed
    assert f.read_bytes() == original
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o644
    assert not new.exists() and (mnt / "empty_dir").is_dir()
    assert os.getxattr(f, "user.fanfs.codec") == b"zstd"


def test_mount_is_read_only(edge_mount: Mount) -> None:
    assert os.statvfs(edge_mount.mnt).f_flag & os.ST_RDONLY
    assert not os.access(edge_mount.mnt / "sizes" / "text_100", os.W_OK)
    assert not os.access(edge_mount.mnt / "sizes", os.W_OK)
    assert not os.access(edge_mount.mnt, os.W_OK)
    assert os.access(edge_mount.mnt / "sizes" / "text_100", os.R_OK)
    assert os.access(edge_mount.mnt / "modes" / "m0755", os.R_OK | os.X_OK)


def test_file_xattrs(edge_tree: Path, edge_mount: Mount) -> None:
    sizes = edge_mount.mnt / "sizes"
    for name in sorted(os.listdir(edge_tree / "sizes")):
        path = sizes / name
        size = os.stat(path).st_size
        stored = int(os.getxattr(path, "user.fanfs.stored_size"))
        chunks = int(os.getxattr(path, "user.fanfs.chunks"))
        partitions = os.getxattr(path, "user.fanfs.partitions").decode().split(",")
        assert os.listxattr(path) == [], name  # answered by name, never listed
        assert all(os.getxattr(path, x) for x in FILE_XATTRS), name
        assert chunks == -(-size // TEST_CHUNK_SIZE), name
        assert 1 <= len(partitions) <= chunks and all(p.isdigit() for p in partitions), name
        if name.startswith("rand_") or size < 64:
            assert stored == size, name  # incompressible or tiny: stored raw
        if name.startswith("text_") and size > 1024:
            assert stored <= size // 2, name  # English-like text compresses well
    empty = edge_mount.mnt / "empty"
    assert os.getxattr(empty, "user.fanfs.stored_size") == b"0"
    assert os.getxattr(empty, "user.fanfs.chunks") == b"0"


def test_codec_xattr(edge_tree: Path, edge_mount: Mount) -> None:
    """`user.fanfs.codec` is one codec name: none for random data, zstd (the default codec)
    for text over 1 KB, including multi-chunk text whose last chunk is a few bytes."""
    sizes = edge_mount.mnt / "sizes"
    got = {
        name: os.getxattr(sizes / name, "user.fanfs.codec").decode()
        for name in os.listdir(edge_tree / "sizes")
    }
    expected = {}
    for name in got:
        size = int(name.split("_")[1])
        if name.startswith("rand_") or size < 64:
            expected[name] = "none"
        elif size > 1024:
            expected[name] = "zstd"
    wrong = {
        name: got[name]
        for name in got
        if got[name] not in CODECS or got[name] != expected.get(name, got[name])
    }
    assert not wrong, wrong
    assert os.getxattr(edge_mount.mnt / "empty", "user.fanfs.codec") == b"none"


def test_missing_xattrs(edge_mount: Mount) -> None:
    mnt = edge_mount.mnt
    f = mnt / "sizes" / "text_100"
    for name in ("user.fanfs.nope", "user.other", "user.fanfs.stats"):
        raises_errno(errno.ENODATA, os.getxattr, f, name)
    # no security labels, no POSIX ACLs, no other namespace: "not supported"
    for name in ("trusted.x", "security.selinux", "system.posix_acl_access", "security.capability"):
        raises_errno(errno.EOPNOTSUPP, os.getxattr, f, name)
        raises_errno(errno.EOPNOTSUPP, os.getxattr, mnt, name)
    # directories and symlinks have no per-file xattrs
    assert os.listxattr(mnt / "sizes") == []
    raises_errno(errno.ENODATA, os.getxattr, mnt / "sizes", "user.fanfs.codec")
    assert os.listxattr(mnt / "links" / "relative", follow_symlinks=False) == []
    raises_errno(
        errno.ENODATA,
        os.getxattr,
        mnt / "links" / "relative",
        "user.fanfs.codec",
        follow_symlinks=False,
    )
    # the root answers only its own, and lists none
    assert os.listxattr(mnt) == []
    assert all(os.getxattr(mnt, name) for name in ROOT_XATTRS)
    raises_errno(errno.ENODATA, os.getxattr, mnt, "user.fanfs.codec")


def test_root_xattrs_and_stats_grow(edge_pack: Path, edge_mount: Mount) -> None:
    mnt = edge_mount.mnt
    assert os.getxattr(mnt, "user.fanfs.pack").decode() == str(edge_pack)
    assert edge_mount.proc is not None
    assert int(os.getxattr(mnt, "user.fanfs.pid")) == edge_mount.proc.pid
    assert os.getxattr(mnt, "user.fanfs.version").decode()
    before = stats(mnt)
    for key in ("reads", "read_bytes", "lookups", "data_errors", "internal_errors"):
        assert isinstance(before[key], int), key
    path = mnt / "sizes" / "text_196625"
    with open(path, "rb", buffering=0) as f:
        drop_from_page_cache(f.fileno())  # make the read reach fanfs
        assert len(f.read()) == 196625
    after = stats(mnt)
    assert after["reads"] > before["reads"]
    # Every byte reached fanfs: in READs, or in chunks its read-ahead pushed into the page
    # cache before the kernel asked (CI, on a loaded host, saw one of the three pushed).
    pushed = sum(after[k] - before[k] for k in ("prefetch_pushed", "fill_pushed", "rest_pushed"))
    assert after["read_bytes"] - before["read_bytes"] + pushed * TEST_CHUNK_SIZE >= 196625
    assert (after["data_errors"], after["internal_errors"]) == (0, 0)


def test_statvfs(edge_tree: Path, edge_mount: Mount) -> None:
    st = os.statvfs(edge_mount.mnt)
    entries = 1  # the root
    for _, dirnames, filenames in os.walk(edge_tree):
        entries += len(dirnames) + len(filenames)
    assert st.f_namemax == 255
    assert st.f_files == entries
    assert st.f_bfree == st.f_bavail == st.f_ffree == 0
    total = sum(
        os.lstat(os.path.join(d, n)).st_size
        for d, _, names in os.walk(edge_tree)
        for n in names
        if stat.S_ISREG(os.lstat(os.path.join(d, n)).st_mode)
    )
    assert st.f_blocks * st.f_frsize >= total


def test_readlink_einval(edge_mount: Mount) -> None:
    mnt = edge_mount.mnt
    raises_errno(errno.EINVAL, os.readlink, mnt / "sizes" / "text_1")
    raises_errno(errno.EINVAL, os.readlink, mnt / "sizes")
    raises_errno(errno.EINVAL, os.readlink, mnt)
    assert os.readlink(mnt / "links" / "relative") == "../sizes/text_100"


def test_no_errors_logged(edge_mount: Mount) -> None:
    """None of the refusals above is a fanfs failure: nothing at WARNING or above."""
    text = edge_mount.log_text()
    assert not edge_mount.log_lines("WARNING") and not edge_mount.log_lines("ERROR"), text
    assert "Traceback" not in text
