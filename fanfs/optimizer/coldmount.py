"""Each class's decode of its sample through a real mount (`sample_mount`): what the plan
takes a decode's cold cost from.

A mount decodes each object between FUSE requests whose work (the kernel's request and reply,
the reader's copy, the Python that answers, the other serving process) has pushed the
decoder's state out of the core's caches. The plan's method (`measurement.cold_penalty`:
4 MiB written before each decode) stands in for that work, and misses it class by class: on
the real dataset it put 13-21 of 33 classes within 25% of what a mount of the default pack
decoded them in, and the same classes missed in every plan (barely compressible ONNX and
PNG charged twice what the mount paid per object, 150 KB images a fifth). The sample's own
units written out as files, packed with the reference codec and read once each in a
shuffled order through a mount with the decode trace on, put 25-30 of 33 within 25%
(docs/benchmarks.md, "where the per-class misses come from").

The sample is written into a private directory (mkdtemp, mode 0700: the plan may run as
root), in memory (/dev/shm) where it has room, and everything there is removed, and the
mount unmounted, whatever happens. Without FUSE, or with anything else that fails, the plan
keeps its method and says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from fanfs.format.reader import PackReader
from fanfs.mountinfo import find_mount, wait_mounted
from fanfs.optimizer.sampling import ClassSample
from fanfs.runtime import DECODE_TRACE_ENV, read_decode_trace

log = logging.getLogger(__name__)

# A class with fewer sample units keeps the method: its units' cold costs, one decode each,
# are too few to average out the host's noise (on the real dataset, the sample mount's four
# misses were all classes of 4-20 units; the classes of 16 or more were within 25%).
MOUNT_MIN_UNITS: Final = 16
# Seconds each step may take (writing the sample, packing it, mounting, reading, unmounting)
# before the plan gives up on the mount: on the real dataset's sample (13,014 units, 158 MiB)
# they took 1-3 s each.
STEP_TIMEOUT_S: Final = 120.0
# Seconds to wait for the mount's preload, and for its statistics (written with the decode
# trace) after unmounting.
LOG_WAIT_S: Final = 30.0
# The sample's mount also reads up to this many of each class's odd units stored with
# brotli at BROTLI_LEVEL (`brotli_units`), a minority among the zstd:3 units as brotli's
# chunks are in a pack: brotli's cold cost is its decoder's state, code and static
# dictionary fetched again between the other classes' decodes, which a loop over its own
# objects keeps hot. The level compresses fast; brotli's levels share the decoder.
BROTLI_UNITS: Final = 16
BROTLI_BYTES: Final = 256 * 1024  # (and no more units than reach this many bytes)
BROTLI_LEVEL: Final = "brotli:5"
# The mount of the dictionaries' units also reads them stored with lz4 and the class's
# dictionary: lz4's levels share the decoder, and this one compresses fast.
LZ4_DICT_LEVEL: Final = "lz4"
# Where the sample is written first when there is room (twice its units: the files and the
# pack), else the temporary directory: a file created on the real dataset's disk (ext4 on a
# shared virtual disk) took 0.3-0.6 ms, 2-4.5 s of a plan's two mounts, against 0.02 ms in
# memory.
SCRATCH_DIRS: Final = ("/dev/shm",)


@dataclass(frozen=True, slots=True)
class MountedSample:
    """What `sample_mount` measured: each class's decode of its units through the mount (CPU
    seconds of the serving processes, by class name: the classes of MOUNT_MIN_UNITS units or
    more), and the wall seconds it took; `note` says why a mount was not used (empty if it
    was)."""

    decode_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""
    # with `dictionaries`: each class's decode of the same units packed without its
    # dictionary, read in the same mount (what `decode_s` is compared with, unit for unit),
    # and stored with LZ4_DICT_LEVEL and the dictionary (the classes charged anything)
    plain_s: dict[str, float] = field(default_factory=dict)
    lz4_s: dict[str, float] = field(default_factory=dict)
    # without: each class's `brotli_units` stored with BROTLI_LEVEL, and the same units'
    # zstd:3 chunks among the class's own
    brotli_s: dict[str, float] = field(default_factory=dict)
    brotli_base_s: dict[str, float] = field(default_factory=dict)


class _Failed(Exception):
    """A step of the sample's mount failed: the message is the plan's note."""


def sample_mount(
    classes: Sequence[ClassSample], *, chunk_size: int, seed: int = 0, dictionaries: bool = False
) -> MountedSample:
    """Each class's sample units (`ClassSample.measure_units`), for the classes with at least
    MOUNT_MIN_UNITS of them, written as files, packed with zstd:3 and read once each in a
    seeded shuffled order through a fresh mount with read-ahead and the object cache off and
    the pack preloaded; the mount's decode trace charged to each file's class. With
    `dictionaries`, the units the class's dictionary was not trained on (`dictionary_units`)
    of each class that has one, packed with zstd:3 and that dictionary, again without it
    (`plain_s`) and again with LZ4_DICT_LEVEL and the dictionary (`lz4_s`), all read in one
    shuffled order, each serving process's first decode of each copy of a class charged the
    copy's mean (`_charged`). Without, each class's
    `brotli_units` are read among them stored with BROTLI_LEVEL too (`brotli_s`, and the
    same units' zstd:3 chunks in `brotli_base_s`). Never raises: a failure returns an empty
    result with a one-line note."""
    start = time.perf_counter()
    picked = [c for c in classes if len(_units(c, dictionaries)) >= MOUNT_MIN_UNITS]
    if not picked:
        return MountedSample(note="no class has %d sample units" % MOUNT_MIN_UNITS)
    need = sum(len(u) for c in picked for u in _units(c, dictionaries))
    try:
        # (the files and their pack: with `dictionaries`, three copies of each)
        work = tempfile.mkdtemp(
            prefix="fanfs-plan-", dir=_scratch((6 if dictionaries else 4) * need)
        )
    except OSError as exc:
        return MountedSample(
            seconds=time.perf_counter() - start,
            note="no temporary directory for the sample (%s)" % (exc.strerror or exc),
        )
    try:
        got = _measure(picked, work, chunk_size, seed, dictionaries)
        return dataclasses.replace(got, seconds=time.perf_counter() - start)
    except _Failed as exc:
        log.info("plan: the sample's mount is not used: %s", exc)
        return MountedSample(seconds=time.perf_counter() - start, note=str(exc))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def dictionary_units(cls: ClassSample) -> list[bytes]:
    """The units of `cls`'s sample its dictionary is not trained on (the odd ones:
    `measurement._train_dictionary` trains on the even)."""
    return cls.measure_units[1::2]


def _scratch(need: int) -> str | None:
    """The first of SCRATCH_DIRS this process may write with `need` bytes free in it, else
    None (the temporary directory)."""
    for path in SCRATCH_DIRS:
        with contextlib.suppress(OSError):
            st = os.statvfs(path)
            if os.access(path, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= need:
                return path
    return None


def brotli_units(cls: ClassSample) -> list[bytes]:
    """The units of `cls`'s sample the mount also reads stored with brotli: up to
    BROTLI_UNITS of the odd ones, no more than reach BROTLI_BYTES (none for fewer than
    MOUNT_MIN_UNITS sample units)."""
    if len(cls.measure_units) < MOUNT_MIN_UNITS:
        return []
    picked, total = [], 0
    for unit in cls.measure_units[1::2][:BROTLI_UNITS]:
        if total >= BROTLI_BYTES:
            break
        picked.append(unit)
        total += len(unit)
    return picked


def _units(cls: ClassSample, dictionaries: bool) -> list[bytes]:
    if not dictionaries:
        return cls.measure_units
    return dictionary_units(cls) if cls.dictionary is not None else []


def _measure(
    classes: Sequence[ClassSample], work: str, chunk_size: int, seed: int, dictionaries: bool
) -> MountedSample:
    """Each class's decode through the mount, and with `dictionaries` the same units'
    without the dictionary, else the brotli copies' and their zstd:3 units'."""
    tree, pack, mnt = (os.path.join(work, name) for name in ("tree", "sample.fan", "mnt"))
    log_path, trace = os.path.join(work, "mount.log"), os.path.join(work, "trace")
    members: dict[bytes, int] = {}
    # with `dictionaries`: the same units without it, and with lz4 and it; else the brotli
    # copies
    plain: dict[bytes, int] = {}
    lz4: dict[bytes, int] = {}
    same: dict[bytes, int] = {}  # (the brotli copies' units among `members`)
    dirs: list[list[str | None]] = []  # (directory, codec, dictionary file) for `_PACKER`
    try:
        for k, cls in enumerate(classes):
            units = _units(cls, dictionaries)
            _write(tree, "c%03d" % k, units, members, k)
            if dictionaries:
                _write(tree, "p%03d" % k, units, plain, k)
                _write(tree, "l%03d" % k, units, lz4, k)
                dirs.append(["c%03d" % k, "zstd:3", os.path.join(work, "d%03d" % k)])
                dirs.append(["l%03d" % k, LZ4_DICT_LEVEL, os.path.join(work, "d%03d" % k)])
                with open(os.path.join(work, "d%03d" % k), "xb") as f:
                    f.write(cls.dictionary or b"")
            elif copied := brotli_units(cls):
                _write(tree, "b%03d" % k, copied, plain, k)
                dirs.append(["b%03d" % k, BROTLI_LEVEL, None])
                # (the odd units, `brotli_units`' first ones, in the class's own copy)
                same.update({b"c%03d/u%06d" % (k, 2 * i + 1): k for i in range(len(copied))})
        os.mkdir(mnt)
    except OSError as exc:
        raise _Failed("cannot write the sample (%s)" % (exc.strerror or exc)) from None
    # (`fanfs pack` trains no dictionary of its own: the plan's, each for its directory)
    _python("packing the sample", ["-c", _PACKER, tree, pack, str(chunk_size)],
            stdin=json.dumps(dirs))  # fmt: skip
    owner, plain_owner = _chunk_owners(pack, members), _chunk_owners(pack, plain)
    lz4_owner = _chunk_owners(pack, lz4)
    same_owner = _chunk_owners(pack, same)
    env = dict(os.environ, **{DECODE_TRACE_ENV: trace})
    try:  # (a mount that comes up after its command timed out is unmounted too)
        _fanfs(
            "mounting the sample",
            "mount", pack, mnt, "--log", log_path, "--no-cluster", "--prefetch", "off",
            "--cache-memory", "0", "--preload", "yes",
            env=env,
        )  # fmt: skip
        if not wait_mounted(mnt, STEP_TIMEOUT_S):
            raise _Failed("the sample's mount did not answer")
        # (served from memory, as a mount of the whole pack is where it fits: every outcome
        # of `--preload yes` logs a line with this word)
        _wait_for(log_path, "preload")
        files = sorted(members) + sorted(plain) + sorted(lz4)
        random.Random(seed).shuffle(files)
        _read_all(mnt, files)
    finally:
        _unmount(mnt)
    if not _wait_for(log_path, "statistics: "):
        raise _Failed("the sample's mount wrote no statistics (see its log)")
    if dictionaries:
        return MountedSample(
            _charged(classes, work, owner, first_use=False),
            plain_s=_charged(classes, work, plain_owner, first_use=False),
            lz4_s={
                name: s
                for name, s in _charged(classes, work, lz4_owner, first_use=False).items()
                if s > 0
            },
        )
    brotli = _charged(classes, work, plain_owner, first_use=False) if plain else {}
    base = _charged(classes, work, same_owner, first_use=False) if plain else {}
    return MountedSample(
        _charged(classes, work, owner),
        brotli_s={name: s for name, s in brotli.items() if s > 0},
        brotli_base_s={name: s for name, s in base.items() if s > 0 and brotli.get(name)},
    )


def _write(tree: str, top: str, units: Sequence[bytes], owned: dict[bytes, int], k: int) -> None:
    """Write `units` as files TOP/u000000... of `tree`, each owned by class number `k`."""
    os.makedirs(os.path.join(tree, top))
    for i, unit in enumerate(units):
        rel = "%s/u%06d" % (top, i)
        with open(os.path.join(tree, rel), "xb") as f:
            f.write(unit)
        owned[rel.encode()] = k


def _fanfs(what: str, *args: str, env: dict[str, str] | None = None) -> None:
    """Run `python -m fanfs ARGS` (`_python`)."""
    _python(what, ["-m", "fanfs", *args], env=env)


def _python(
    what: str, args: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None
) -> None:
    """Run this Python with `args`, killed after STEP_TIMEOUT_S; _Failed with its last line of
    stderr if it fails. With -P and from /: the plan may run as root in a directory others
    can write, and a `fanfs` there must not be what runs."""
    try:
        done = subprocess.run(
            [sys.executable, "-P", *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=STEP_TIMEOUT_S,
            env=env,
            cwd="/",
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _Failed("%s failed (%s)" % (what, exc)) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]
        raise _Failed("%s failed: %s" % (what, last.removeprefix("fanfs: ")))


def _chunk_owners(pack: str, members: dict[bytes, int]) -> np.ndarray:
    """Each chunk's class number in `pack` (-1: none; members by path relative to the
    root)."""
    reader = PackReader(pack)
    try:
        ix = reader.index
        owner = np.full(int(ix.chunk_count), -1, dtype=np.int64)
        for rel, k in members.items():
            entry = 0
            for name in rel.split(b"/"):
                found = ix.lookup(entry, name)
                if found is None:
                    raise _Failed("the sample's pack lacks %s" % rel.decode())
                entry = found
            first = int(ix.first[entry])
            owner[first : first + int(ix.count[entry])] = k
        return owner
    finally:
        reader.close()


# The sample's pack, a child process: each named directory's units compressed with its
# codec and dictionary (stdin: [directory, codec, dictionary file or null] triples), the
# other directories' with zstd:3 alone.
_PACKER: Final = """
import json, sys
from fanfs.compression import parse_codec
from fanfs.pack import Packer, PackOptions
src, out, chunk_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
dirs = []
for name, codec, path in json.load(sys.stdin):
    dictionary = None
    if path is not None:
        with open(path, "rb") as f:
            dictionary = f.read()
    dirs.append((name, parse_codec(codec), dictionary))
Packer(PackOptions(src, out, parse_codec("zstd:3"), chunk_size=chunk_size, quiet=True,
                   dir_codecs=tuple(dirs))).run()
"""


# The reader of `_read_all`, a child process: a read that never returns (a mount in trouble)
# is ended by killing it, where the plan's own thread would wait for ever.
_READER: Final = """
import os, sys
mnt, files = sys.argv[1], sys.stdin.read().split()
for rel in files:
    os.stat(os.path.join(mnt, rel))
for rel in files:
    fd = os.open(os.path.join(mnt, rel), os.O_RDONLY)
    try:
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)
"""


def _read_all(mnt: str, files: Sequence[bytes]) -> None:
    """Read each of `files` (relative to `mnt`) once, whole, as a loader does: every file
    looked up first (a file list), then each opened and read in 1 MiB reads; in a child
    process killed after STEP_TIMEOUT_S."""
    names = "\n".join(rel.decode() for rel in files)
    _python("reading the sample's mount", ["-c", _READER, mnt], stdin=names)


def _unmount(mnt: str) -> None:
    """Unmount `mnt`, lazily if it is busy; a mount left behind is logged as an error (the
    plan goes on: its temporary files are removed either way)."""
    for extra in ((), ("--lazy",)):
        with contextlib.suppress(_Failed):
            _fanfs("unmounting the sample", "umount", *extra, mnt)
        if find_mount(mnt) is None:
            return
    log.error("plan: cannot unmount the sample's mount at %s", mnt)


def _wait_for(log_path: str, text: str) -> bool:
    """Wait up to LOG_WAIT_S for `text` in the mount's log; whether it came."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        with contextlib.suppress(OSError), open(log_path, errors="replace") as f:
            if text in f.read():
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _charged(
    classes: Sequence[ClassSample], work: str, owner: np.ndarray, *, first_use: bool = True
) -> dict[str, float]:
    """The decode trace's CPU seconds charged to each chunk's class. Without `first_use`,
    each serving process's first decode of a class is left out and the class charged its
    other decodes' mean for it: a mount builds a dictionary's context on its first frame in
    each process (about 1.2 ms for 1 MiB, 40-250 us for 2-110 KB), once for a class of the
    pack but many small units' worth of the few read here."""
    ns = np.zeros(len(classes), dtype=np.int64)
    count = np.zeros(len(classes), dtype=np.int64)
    first_ns = np.zeros(len(classes), dtype=np.int64)
    firsts = np.zeros(len(classes), dtype=np.int64)
    traced = 0
    for name in os.listdir(work):
        if not name.startswith("trace."):
            continue
        try:
            pairs = read_decode_trace(os.path.join(work, name))
        except ValueError:
            raise _Failed("the sample's decode trace is torn") from None
        if pairs.size and (pairs[:, 0].min() < 0 or pairs[:, 0].max() >= owner.size):
            raise _Failed("the sample's decode trace names chunks its pack lacks")
        known = owner[pairs[:, 0]]
        np.add.at(ns, known[known >= 0], pairs[known >= 0, 1])
        np.add.at(count, known[known >= 0], 1)
        seen, first = np.unique(known, return_index=True)  # (each class's first here)
        np.add.at(first_ns, seen[seen >= 0], pairs[first[seen >= 0], 1])
        np.add.at(firsts, seen[seen >= 0], 1)
        traced += 1
    if not traced:
        raise _Failed("the sample's mount wrote no decode trace")
    if not first_use:
        rest = count - firsts
        mean = (ns - first_ns) / np.maximum(rest, 1)
        ns = np.where(rest > 0, mean * count, ns)
    return {cls.name: float(ns[k]) / 1e9 for k, cls in enumerate(classes)}
