"""What a root daemon writes on a shared node (issue 10, docs/security.md): the runtime
directory, log files, the hint socket and the cluster stage dir are never taken over by
another user's directory or symlink. The attacker is a real second user (nobody) where the
attack needs one; the victim is `fanfs mount` run as root, as on a cluster node."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanfs.errors import MountSetupError
from fanfs.hints import bind_hint_socket
from fanfs.runtime import check_writable_by_owner_only, private_dir, runtime_dir, write_atomic
from tests.conftest import NOBODY, as_nobody, run_fanfs
from tests.treegen import write_tree

UID = os.geteuid()
VICTIM_TEXT = "precious\n"


@pytest.fixture
def tmpdir_env(public_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A world-writable sticky TMPDIR (like /tmp) for this test alone, no XDG_RUNTIME_DIR."""
    tmp = public_dir / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() looks again
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return tmp


@pytest.fixture
def victim(public_dir: Path) -> Path:
    """A file root owns that the attacker wants root's daemon to write to."""
    path = public_dir / "victim"
    path.write_text(VICTIM_TEXT)
    return path


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_tree(tmp_path_factory.mktemp("runtime") / "src", {"a.txt": b"a\n"})
    out = src.parent / "p.fan"
    assert run_fanfs("pack", src, out, "-q").returncode == 0
    return out


def expected_refusal(path: Path, problem: str) -> str:
    return (
        "refusing to use %s: %s (it must be a directory of uid %d with mode 0700; remove it, "
        "or set XDG_RUNTIME_DIR)" % (path, problem, UID)
    )


# --- the runtime directory ------------------------------------------------------------------


def test_runtime_dir_is_created_private(tmpdir_env: Path) -> None:
    path = Path(runtime_dir())
    assert path == tmpdir_env / ("fanfs-%d" % UID)
    info = path.lstat()
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == UID


def test_runtime_dir_of_ours_with_a_loose_mode_is_tightened(tmpdir_env: Path) -> None:
    path = tmpdir_env / ("fanfs-%d" % UID)
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    assert runtime_dir() == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_runtime_dir_prefers_xdg_runtime_dir(
    tmpdir_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    xdg = tmp_path / "run-user"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert runtime_dir() == str(xdg / "fanfs")
    assert stat.S_IMODE((xdg / "fanfs").stat().st_mode) == 0o700


def test_runtime_dir_ignores_another_users_xdg_runtime_dir(
    tmpdir_env: Path, public_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sudo keeps the caller's XDG_RUNTIME_DIR: root must not create files in it."""
    xdg = public_dir / "run-user-65534"
    xdg.mkdir(mode=0o700)
    os.chown(xdg, NOBODY, NOBODY)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert runtime_dir() == str(tmpdir_env / ("fanfs-%d" % UID))
    assert list(xdg.iterdir()) == []


def test_runtime_dir_planted_by_another_user_is_refused(tmpdir_env: Path, victim: Path) -> None:
    """The attack of issue 10: another user creates /tmp/fanfs-0 first and puts a symlink
    named like root's next log file in it. Root's `fanfs mount` now refuses the directory."""
    planted = tmpdir_env / ("fanfs-%d" % UID)
    made = as_nobody("mkdir", "-m", "0777", planted)
    assert made.returncode == 0, made.stderr
    with pytest.raises(MountSetupError) as info:
        runtime_dir()
    assert str(info.value) == expected_refusal(planted, "it is owned by uid %d" % NOBODY)
    assert info.value.exit_code == 4


def test_runtime_dir_that_is_a_symlink_is_refused(tmpdir_env: Path, public_dir: Path) -> None:
    target = public_dir / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmpdir_env / ("fanfs-%d" % UID)
    assert as_nobody("ln", "-s", target, link).returncode == 0
    with pytest.raises(MountSetupError) as info:
        runtime_dir()
    assert str(info.value) == expected_refusal(link, "it is a symbolic link")
    assert list(target.iterdir()) == []


def test_private_dir_refuses_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(MountSetupError, match="it is not a directory"):
        private_dir(str(tmp_path / "f"))


def test_mount_refuses_a_planted_runtime_dir_and_writes_nothing(
    tmpdir_env: Path, victim: Path, pack: Path, tmp_path: Path
) -> None:
    """End to end, as root: the daemon would have logged to the planted directory (the
    default log path); `fanfs mount` exits 4 with one line and the victim is untouched."""
    planted = tmpdir_env / ("fanfs-%d" % UID)
    assert as_nobody("mkdir", "-m", "0777", planted).returncode == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    digest = hashlib.sha1(str(mnt).encode()).hexdigest()[:8]
    log = planted / ("mount%s-%s.log" % (str(mnt).replace("/", "-"), digest))
    assert as_nobody("ln", "-s", victim, log).returncode == 0
    result = run_fanfs("mount", pack, mnt)
    assert result.returncode == 4, result.stderr
    assert result.stderr == "fanfs mount: error: %s\n" % expected_refusal(
        planted, "it is owned by uid %d" % NOBODY
    )
    assert victim.read_text() == VICTIM_TEXT
    assert os.listdir(mnt) == []


# --- log files --------------------------------------------------------------------------


@pytest.mark.parametrize("foreground", [False, True], ids=["daemon", "foreground"])
def test_a_log_file_that_is_a_symlink_is_refused(
    pack: Path, tmp_path: Path, victim: Path, foreground: bool
) -> None:
    link = tmp_path / "mount.log"
    link.symlink_to(victim)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    args = ["-f"] if foreground else []
    result = run_fanfs("mount", *args, "--log", link, pack, mnt, timeout=60)
    assert result.returncode == 4, result.stderr
    assert result.stderr == (
        "fanfs mount: error: log file %s is a symbolic link; fanfs does not write through "
        "links (give the real path with --log)\n" % link
    )
    assert victim.read_text() == VICTIM_TEXT


# --- the hint socket ------------------------------------------------------------------------


def test_hint_socket_is_private_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "hints.sock"
    sock = bind_hint_socket(str(path))
    try:
        info = path.lstat()
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    finally:
        sock.close()


def test_a_stale_hint_socket_of_ours_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "hints.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    sock = bind_hint_socket(str(path))
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(path))
        client.close()
    finally:
        sock.close()


@pytest.mark.parametrize("planted", ["file", "symlink", "nobody's socket"])
def test_anything_else_at_the_hint_socket_path_is_left_alone(
    public_dir: Path, victim: Path, planted: str
) -> None:
    path = public_dir / "hints.sock"
    if planted == "file":
        path.write_text(VICTIM_TEXT)
    elif planted == "symlink":
        path.symlink_to(victim)
    else:
        public_dir.chmod(0o1777)
        code = "import socket; socket.socket(socket.AF_UNIX).bind(%r)" % str(path)
        assert as_nobody("/usr/bin/python3", "-c", code).returncode == 0
    before = path.lstat()
    with pytest.raises(FileExistsError):
        bind_hint_socket(str(path))
    after = path.lstat()
    assert (after.st_ino, after.st_mode, after.st_uid) == (
        before.st_ino,
        before.st_mode,
        before.st_uid,
    )
    assert victim.read_text() == VICTIM_TEXT


# --- cache and stage directories ------------------------------------------------------------


@pytest.fixture
def shared_dir(public_dir: Path) -> Iterator[Path]:
    path = public_dir / "shared"
    path.mkdir()
    yield path


@pytest.mark.parametrize(
    ("mode", "owner", "problem"),
    [
        (0o777, UID, "it is writable by others"),
        (0o775, UID, "it is writable by its group"),
        (0o700, NOBODY, "it is owned by uid %d" % NOBODY),
    ],
)
def test_a_cache_dir_others_can_change_is_refused(
    shared_dir: Path, mode: int, owner: int, problem: str
) -> None:
    shared_dir.chmod(mode)
    os.chown(shared_dir, owner, -1)
    with pytest.raises(MountSetupError) as info:
        check_writable_by_owner_only(str(shared_dir), "--cache-dir")
    assert str(info.value) == (
        "refusing to use --cache-dir %s: %s (other users could replace what fanfs writes "
        "there; use a directory only you can write)" % (shared_dir, problem)
    )


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o1777])
def test_a_cache_dir_only_its_owner_can_change_is_accepted(shared_dir: Path, mode: int) -> None:
    shared_dir.chmod(mode)
    check_writable_by_owner_only(str(shared_dir), "--cache-dir")


def test_write_atomic_never_follows_a_planted_temporary_name(
    public_dir: Path, victim: Path
) -> None:
    """A stale `NAME.tmp` symlink (left by anyone) is removed, not written through."""
    target = public_dir / "index"
    (public_dir / "index.tmp").symlink_to(victim)
    write_atomic(str(target), b"new bytes")
    assert target.read_bytes() == b"new bytes"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not (public_dir / "index.tmp").exists()
    assert victim.read_text() == VICTIM_TEXT
