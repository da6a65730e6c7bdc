"""The seeded random forgery loop of the hostile-pack suite (tests/unit/test_hostile_fuzz.py).

    python -m tests.hostile_harness --workdir DIR --seed 1 --cases 300 BASE.fan [BASE.fan ...]

For each case, a random forgery of one of the base packs (a manifest field, an index value,
a byte of the names, a partition or a dictionary, a chunk replaced by a decompression bomb,
a partition cut short, several at once), with every checksum recomputed, is checked in a
forked child under an address-space limit and an alarm:

- opening it either fails with a one-line PackFormatError (exit code 3) naming the pack, or
- every entry is served through the real read path (`Operations` over a `ChunkStore`, under
  trio, no kernel): attributes, lookups of every name, paths, links, xattrs, and every
  file's bytes, which must equal what a reference decoder (tests/forge.py, written from
  docs/format.md) makes of the same forged pack, EIO exactly where it finds a corrupt
  chunk; no internal error; `fanfs verify` and `inspect` end in 0 or 3.

One JSON line per case on stdout: {"case", "base", "forgery", "outcome", "problems"}. The
parent imports everything a child needs once (a fork then costs milliseconds), but never
starts a thread or trio.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import select
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from tests.forge import PackImage, bound_crc, reference_read

CASE_SECONDS = 30
MEMORY_HEADROOM = 768 << 20  # address space a case may add to what the harness maps


def _bombs(usize: int) -> dict[int, bytes]:
    """A bomb per codec id that stores in at most `usize` bytes and decodes to far more."""
    import lzma

    import brotli
    import lz4.block
    import zstandard

    from fanfs.compression import _lzma_filters

    out = {}
    cobj = zstandard.ZstdCompressor(level=19).compressobj(size=64 << 20)
    out[2] = b"".join([*(cobj.compress(bytes(1 << 24)) for _ in range(4)), cobj.flush()])
    out[3] = brotli.compress(bytes(64 << 20), quality=11)
    out[4] = lzma.compress(
        bytes(16 << 20), format=lzma.FORMAT_ALONE, filters=_lzma_filters(9, 4096)
    )
    out[1] = lz4.block.compress(
        bytes(256 << 10), store_size=False, mode="high_compression", compression=12
    )
    return {codec: data for codec, data in out.items() if len(data) <= usize}


_NEW_VALUES = ("zero", "one", "max", "plus", "minus", "flip", "other", "big")


def _new_value(rng: random.Random, column: np.ndarray, row: int) -> int:
    info = np.iinfo(column.dtype)
    old = int(column[row])
    how = rng.choice(_NEW_VALUES)
    value = {
        "zero": 0,
        "one": 1,
        "max": int(info.max),
        "plus": old + 1,
        "minus": old - 1,
        "flip": old ^ (1 << rng.randrange(info.bits)),
        "other": int(column[rng.randrange(len(column))]),
        "big": rng.randrange(0, 1 << min(info.bits - 1, 40)),
    }[how]
    return max(int(info.min), min(int(info.max), value))


def _leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(obj, dict):
        return [path] + [
            leaf for key, value in obj.items() for leaf in _leaves(value, (*path, key))
        ]
    if isinstance(obj, list):
        return [path] + [leaf for i, value in enumerate(obj) for leaf in _leaves(value, (*path, i))]
    return [path]


_JSON_VALUES: tuple[Any, ...] = (
    0,
    -1,
    1,
    2**63,
    4096,
    "x",
    "part-00000",
    "../x",
    None,
    [],
    {},
    True,
    1.5,
)


def _forge_manifest(rng: random.Random, manifest: dict[str, Any]) -> str:
    leaves = [p for p in _leaves(manifest) if p]
    path = rng.choice(leaves)
    parent: Any = manifest
    for key in path[:-1]:
        parent = parent[key]
    old = parent[path[-1]]
    if rng.random() < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
        return "manifest del %s" % (path,)
    if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.6:
        new: Any = rng.choice((old + 1, old - 1, old * 2, old // 2, old ^ 1, 0, -old))
    else:
        new = rng.choice(_JSON_VALUES)
    parent[path[-1]] = new
    return "manifest %s: %r -> %r" % (path, old, new)


def forge(rng: random.Random, image: PackImage, bombs: dict[int, bytes], done: list[str]) -> Any:
    """Apply 1-3 random forgeries to `image`, describing each in `done`; returns the manifest
    edit to apply after checksums are recomputed (or None). Manifest edits are described
    once applied, by `PackImage.save`."""
    after: list[Any] = []
    c = image.columns
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.choice(
            (
                "column",
                "column",
                "column",
                "manifest",
                "names",
                "partition",
                "partition",
                "dict",
                "bomb",
                "cut",
            )
        )
        if kind == "column":
            name = rng.choice([n for n in c if len(c[n]) and n not in ("names", "dicts")])
            row = rng.randrange(len(c[name]))
            value = _new_value(rng, c[name], row)
            done.append("%s[%d]: %d -> %d" % (name, row, c[name][row], value))
            c[name][row] = value
        elif kind == "manifest":
            seed = rng.randrange(1 << 30)

            def edit(manifest: dict[str, Any], seed: int = seed) -> None:
                done.append(_forge_manifest(random.Random(seed), manifest))

            after.append(edit)
        elif kind == "names" and len(c["names"]):
            pos = rng.randrange(len(c["names"]))
            value = rng.choice((0, ord("/"), ord("."), rng.randrange(256)))
            done.append("names byte %d: %d -> %d" % (pos, c["names"][pos], value))
            c["names"][pos] = value
        elif kind == "dict" and len(c.get("dicts", ())):
            pos = rng.randrange(len(c["dicts"]))
            c["dicts"][pos] ^= 1 << rng.randrange(8)
            done.append("dicts byte %d flipped" % pos)
        elif kind == "partition" and len(c["partition"]):
            cid = rng.randrange(len(c["partition"]))
            part = image.parts[int(c["partition"][cid])]
            start, csize = int(c["offset"][cid]), int(c["csize"][cid])
            if csize > 0 and start + csize <= len(part):  # (an earlier forgery may have moved it)
                pos = start + rng.randrange(csize)
                part[pos] ^= 1 << rng.randrange(8)
                fixed = rng.random() < 0.5
                if fixed:  # the attacker recomputes the chunk's checksum too
                    c["crc32"][cid] = bound_crc(
                        bytes(part[start : start + csize]), cid, image.version
                    )
                done.append(
                    "chunk %d byte %d flipped%s"
                    % (cid, pos - start, " (crc fixed)" if fixed else "")
                )
        elif kind == "bomb" and len(c["partition"]):
            cid = rng.randrange(len(c["partition"]))
            usable = {
                k: v
                for k, v in bombs.items()
                if len(v) <= int(c["csize"][cid]) or rng.random() < 0.3
            }
            if usable:
                codec = rng.choice(sorted(usable))
                image.set_chunk(cid, usable[codec])
                c["codec"][cid] = codec
                if "dict" in c:
                    c["dict"][cid] = 0
                done.append("chunk %d replaced by a codec %d bomb" % (cid, codec))
        elif kind == "cut":
            number = rng.randrange(len(image.parts))
            part = image.parts[number]
            keep = rng.randrange(len(part) + 1)
            del part[keep:]
            done.append("partition %d cut to %d bytes" % (number, keep))

    def apply(manifest: dict[str, Any]) -> None:
        for edit in after:
            edit(manifest)

    return apply if after else None


# The child ---------------------------------------------------------------------------------


def _serve_everything(pack: Path, preload: bool) -> tuple[str, list[str]]:
    """In the forked child: open the forged pack and serve every entry. Returns (outcome,
    problems)."""
    import errno
    import stat

    import pyfuse3
    import trio

    from fanfs import shared as sh
    from fanfs.errors import FanfsError
    from fanfs.format.reader import PackReader
    from fanfs.operations import FILE_XATTRS, MountInfo, Operations
    from fanfs.shared import SharedState
    from fanfs.store import ChunkStore
    from fanfs.verify import inspect_pack, verify_pack

    problems: list[str] = []
    try:
        reader = PackReader(str(pack))
    except FanfsError as exc:
        text = str(exc)
        if exc.exit_code != 3 or "\n" in text or not text.startswith(str(pack) + ": "):
            problems.append("bad refusal (exit %d): %r" % (exc.exit_code, text))
        return "refused: " + text[len(str(pack)) + 2 :], problems
    index = reader.index
    shared = SharedState(processes=1, partitions=len(reader.partitions), chunks=index.chunk_count)
    store = ChunkStore(reader, shared, buffer_budget=8 << 20, thread_limit=2)
    if preload:
        reader.reserve_memory(range(len(reader.partitions)))
        store.preload(__import__("threading").Event())
    ops = Operations(store, noopen=True, info=MountInfo(pack=str(pack)))

    async def check() -> None:
        for entry in range(index.entry_count):
            inode = entry + 1
            await ops.getattr(inode)
            index.path(entry)
            if entry:
                parent = index.parent[entry]
                found = await ops.lookup(parent + 1, index.name(entry))
                if found.st_ino == 0:
                    pass  # an unsorted directory hides names from the binary search: allowed
            mode = index.mode[entry]
            if stat.S_ISLNK(mode):
                await ops.readlink(inode)
            if stat.S_ISDIR(mode):
                continue
            for name in FILE_XATTRS:
                with contextlib.suppress(pyfuse3.FUSEError):
                    await ops.getxattr(inode, name)
            if not stat.S_ISREG(mode):
                continue
            size = index.size[entry]
            got = bytearray()
            try:
                while len(got) < size:
                    piece = await ops.read(inode, len(got), 128 * 1024)
                    if not piece:
                        problems.append(
                            "entry %d: read returned 0 bytes at %d of %d" % (entry, len(got), size)
                        )
                        break
                    got += piece
                served: bytes | None = bytes(got)
            except pyfuse3.FUSEError as exc:
                if exc.errno != errno.EIO:
                    problems.append("entry %d: errno %d" % (entry, exc.errno))
                served = None
            expected = reference_read(image, entry=entry)
            if served != expected:
                problems.append(
                    "entry %d (%s): served %s, the reference decoder %s"
                    % (
                        entry,
                        index.path(entry)[-40:],
                        "EIO" if served is None else "%d bytes" % len(served),
                        "EIO"
                        if expected is None
                        else "%d bytes%s"
                        % (len(expected), "" if served is None else " that differ"),
                    )
                )
        await ops.statfs()

    image = PackImage(pack)  # the reference decoder's own parse, once per case

    trio.run(check)
    if shared.totals()["internal_errors"] or ops.logged_bugs:
        problems.append("internal errors in %s" % sorted(name for name, _ in ops.logged_bugs))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = verify_pack(str(pack), quiet=True)
        inspect_pack(str(pack))
    if code not in (0, 3):
        problems.append("verify returned %d" % code)
    return "served (verify %d, %d EIO)" % (
        code,
        shared.totals()[sh.COUNTER_NAMES[sh.DATA_ERRORS]],
    ), problems


def _run_child(pack: Path, preload: bool, write_fd: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + MEMORY_HEADROOM, hard))
    signal.alarm(CASE_SECONDS)
    import logging

    logging.getLogger("fanfs").addHandler(logging.NullHandler())
    logging.getLogger("fanfs").propagate = False
    try:
        outcome, problems = _serve_everything(pack, preload)
    except BaseException as exc:
        outcome, problems = (
            "crashed",
            ["%s: %s" % (type(exc).__name__, exc), traceback.format_exc()[-2000:]],
        )
    os.write(write_fd, json.dumps({"outcome": outcome, "problems": problems}).encode())


def run_case(pack: Path, preload: bool) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 0
        try:
            _run_child(pack, preload, write_fd)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    deadline_reached = False
    while True:
        ready, _, _ = select.select([read_fd], [], [], CASE_SECONDS + 10)
        if not ready:
            deadline_reached = True
            os.kill(pid, signal.SIGKILL)
            break
        data = os.read(read_fd, 1 << 20)
        if not data:
            break
        chunks.append(data)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if deadline_reached or os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
        return {
            "outcome": "died",
            "problems": ["child killed by %s (hang or crash)" % signal.Signals(sig).name],
        }
    try:
        result: dict[str, Any] = json.loads(b"".join(chunks))
    except ValueError:
        return {
            "outcome": "died",
            "problems": ["no result (exit %d)" % os.waitstatus_to_exitcode(status)],
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bases", nargs="+", type=Path)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=300)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    bombs = _bombs(4096)
    # Imported here, before the first fork, so that no child imports them again.
    import pyfuse3  # noqa: F401
    import trio  # noqa: F401

    import fanfs.operations
    import fanfs.verify  # noqa: F401

    for case in range(args.cases):
        rng = random.Random(args.seed * 1_000_003 + case)
        base = args.bases[case % len(args.bases)]
        image = PackImage(base)
        done: list[str] = []
        after = forge(rng, image, bombs, done)
        pack = image.save(args.workdir / "case.fan", after=after)
        result = run_case(pack, preload=bool(case % 2))
        result.update(case=case, base=base.name, forgery="; ".join(done) or "(nothing)")
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
