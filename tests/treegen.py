"""Generators of source trees for tests: every edge case a pack must round-trip."""

from __future__ import annotations

import os
import random
from pathlib import Path


def _write(path: Path | bytes, data: bytes, mode: int = 0o644, mtime_ns: int | None = None) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def _text(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"tensor", b"label", b"\n"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def _random(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def make_edge_tree(root: Path, *, chunk_size: int) -> None:
    """Build the edge-case tree under `root` (created)."""
    root.mkdir(parents=True)
    b = os.fsencode(root)
    # sizes around chunk boundaries, compressible and not
    sizes = root / "sizes"
    sizes.mkdir()
    for n in (
        1,
        2,
        100,
        chunk_size - 1,
        chunk_size,
        chunk_size + 1,
        3 * chunk_size + 17,
        10 * chunk_size,
    ):
        _write(sizes / ("text_%d" % n), _text(n, n))
        _write(sizes / ("rand_%d" % n), _random(n, n))
    _write(root / "empty", b"")
    _write(root / ".hidden", b"hidden\n")
    # equal chunks, stored once by default (format.md section 5.1): a copy of a file, a file
    # sharing its first two chunks with it, and zeros repeating one chunk
    dups = root / "dups"
    dups.mkdir()
    original = _random(3 * chunk_size + 100, 7)
    _write(dups / "original", original)
    _write(dups / "copy", original)
    _write(dups / "same_start", original[: 2 * chunk_size] + b"another tail")
    _write(dups / "zeros", bytes(6 * chunk_size + 5))
    # names: non-UTF-8, 255 bytes, unicode, spaces, newline, sort-order traps
    names = root / "names"
    names.mkdir()
    bn = os.fsencode(names)
    _write(bn + b"/bad\xff\xfename", b"non-utf8 name\n")
    os.mkdir(bn + b"/\xe9t\xe9-latin1-dir")
    _write(bn + b"/\xe9t\xe9-latin1-dir/inner", b"inside a latin-1 dir\n")
    _write(names / ("n" * 255), b"255-byte name\n")
    (names / ("d" * 255)).mkdir()
    _write(names / ("d" * 255) / ("f" * 255), b"255 inside 255\n")
    _write(names / "ünïcødé-名前.txt", "unicode ✓\n".encode())
    for odd in (
        "with space",
        "new\nline",
        "tab\tname",
        "a",
        "A",
        "a.b",
        "a-b",
        "a0",
        "_",
        "~",
        "-dash",
        "#hash",
    ):
        _write(names / odd, odd.encode() * 3)
    # many entries in one directory: binary-search lookups
    many = root / "many"
    many.mkdir()
    for i in range(1500):
        _write(many / ("f%05d" % (i * 7919 % 100003)), b"%d\n" % i)
    # deep and empty directories
    deep = root / "deep"
    path = deep
    for level in range(40):
        path = path / ("level%02d" % level)
    path.mkdir(parents=True)
    _write(path / "bottom.txt", b"deep\n")
    (root / "empty_dir").mkdir()
    (root / "a" / "b" / "c" / "empty").mkdir(parents=True)
    # symlinks: stored, never followed
    links = root / "links"
    links.mkdir()
    os.symlink("../sizes/text_100", links / "relative")
    os.symlink("/etc/hostname", links / "absolute")
    os.symlink("does/not/exist", links / "dangling")
    os.symlink("../a", links / "to_dir")
    os.symlink("loop", links / "loop")
    os.symlink("x" * 1000, links / "long_target")
    os.symlink(b"\xff\xfe-target", os.fsencode(links) + b"/bad_target")
    # modes
    modes = root / "modes"
    modes.mkdir()
    for mode in (0o600, 0o644, 0o755, 0o444, 0o4755, 0o2755, 0o000):
        _write(modes / ("m%04o" % mode), b"mode %o\n" % mode, mode)
    for mode in (0o700, 0o1777, 0o555):
        d = modes / ("d%04o" % mode)
        d.mkdir()
        _write(d / "f", b"x")
        os.chmod(d, mode)
    # times
    times = root / "times"
    times.mkdir()
    for label, ns in (
        ("epoch", 0),
        ("old", -1_000_000_000_123),
        ("ns", 1_600_000_000_123_456_789),
        ("future", 4_102_444_800_000_000_000),
    ):
        _write(times / label, label.encode(), mtime_ns=ns)
    _fix_dir_times(b)


def _fix_dir_times(root: bytes) -> None:
    """Give every directory a distinct, fixed mtime (creating children changed them)."""
    for i, (dirpath, _, _) in enumerate(sorted(os.walk(root), reverse=True)):
        ns = 1_500_000_000_000_000_000 + i * 1_000_000_007
        os.utime(dirpath, ns=(ns, ns), follow_symlinks=False)


def make_dataset(root: Path, files: int, *, seed: int = 0, per_dir: int = 500) -> int:
    """`files` small files of mixed kinds in directories of `per_dir`; returns total bytes."""
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        d = root / ("class_%03d" % (i // per_dir))
        if i % per_dir == 0:
            d.mkdir(parents=True, exist_ok=True)
        n = rng.randint(0, 20_000)
        data = _text(n, i) if i % 3 else _random(n, i)
        _write(d / ("sample_%06d.bin" % i), data)
        total += n
    return total


def label_text(n: int, seed: int) -> bytes:
    """`n` bytes of compressible label-like text, deterministic for `seed`."""
    rng = random.Random(seed)
    words = [b"cat", b"dog", b"bird", b"0.5", b"\n", b"label"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    """Create `files` (relative path -> bytes) under `root`; returns `root`."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root
