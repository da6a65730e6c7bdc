"""The `fanfs` command: argument parsing and dispatch only.

Every subcommand module is imported lazily, so `fanfs pack` never imports pyfuse3 or mpi4py.
Expected failures (`FanfsError`, OSError) print one line and return their exit code
(docs/errors.md); only a bug prints a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

from fanfs import __version__
from fanfs.errors import FanfsError, UsageError

log = logging.getLogger(__name__)

EXIT_CODES = """exit codes: 0 ok, 1 internal or OS error, 2 usage or bad input,
3 pack unreadable/corrupt/wrong version, 4 mount setup failed, 5 cluster init failed"""


def _add_pack(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pack", help="convert a dataset tree into a pack", epilog=EXIT_CODES)
    p.add_argument("src", help="source directory (the dataset tree)")
    p.add_argument("out", help="pack directory to create")
    p.add_argument(
        "--codec",
        default="zstd:3",
        help="none, lz4, lz4hc[:LEVEL], zstd[:LEVEL], brotli[:LEVEL], lzma[:LEVEL], or auto: "
        "a codec per class of files chosen by the optimizer (see fanfs plan; default zstd:3)",
    )
    p.add_argument(
        "--chunk-size",
        default="1MiB",
        help="files up to this size are stored as one chunk (default 1MiB)",
    )
    p.add_argument(
        "--block-size",
        default=None,
        help="files larger than --chunk-size are stored in independently decodable blocks of "
        "this size, so that a small read inside them decodes one block (default 128KiB; "
        "0: in chunks of --chunk-size)",
    )
    p.add_argument(
        "--solid-block",
        default=None,
        metavar="SIZE",
        help="compress files of at most a quarter of SIZE together in blocks of SIZE "
        "(format 7: smaller packs of small files; a read decodes its file's whole block). "
        "With --codec auto the plan chooses the classes, in every mode but sync "
        "(default 128KiB); without, every small file (default 0: none)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="number of partitions (default: by size, 16..4096)",
    )
    p.add_argument(
        "--broadcast",
        action="append",
        default=[],
        metavar="GLOB",
        help="paths replicated on every node, e.g. 'val/**' (repeatable)",
    )
    p.add_argument(
        "-j", "--jobs", type=int, default=0, help="compression threads (default: all cores)"
    )
    p.add_argument(
        "--read-threads",
        type=int,
        default=0,
        metavar="N",
        help="source reads in flight, for parallel filesystems (default 16)",
    )
    p.add_argument(
        "--no-dedup",
        dest="dedup",
        action="store_false",
        help="store every chunk, even one whose bytes an earlier chunk already holds "
        "(identical files; default: stored once)",
    )
    p.add_argument(
        "--index-codec",
        choices=("auto", "zstd", "none"),
        default="auto",
        help="store the index compressed (zstd) or as it is read (none); auto (default): "
        "compressed when that saves at least 0.5%% of the pack (many small files)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists and is not empty")
    p.add_argument(
        "--skip-unreadable", action="store_true", help="skip unreadable files with a warning"
    )
    _add_plan_options(p)
    p.set_defaults(func=_cmd_pack)


# Serving processes of a mount by default (mount/family.py: min(2, CPUs)); each decodes inline
# on one thread, so that is how many cores decode at once.
_MOUNT_PROCESSES = 2


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="profile a dataset and print the codec plan of --codec auto",
        epilog=EXIT_CODES + "; 2 also when no plan meets the constraint (the closest is printed)",
    )
    p.add_argument("src", help="source directory (the dataset tree)")
    p.add_argument("--chunk-size", default="1MiB", help="as for fanfs pack (default 1MiB)")
    p.add_argument("--block-size", default=None, help="as for fanfs pack (default 128KiB)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--skip-unreadable", action="store_true", help="skip unreadable files with a warning"
    )
    _add_plan_options(p)
    p.set_defaults(func=_cmd_plan)


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("codec plan (fanfs plan, fanfs pack --codec auto)")
    g.add_argument(
        "--mode",
        choices=("balanced", "sync", "prefetch"),
        default=None,
        help="balanced (default): the smallest pack that decodes no slower in all than zstd:3 "
        "(the default codec); sync: decode may add --max-overhead to every read; prefetch: "
        "decoding on --decode-cores must keep up with --target-rate (implied by it)",
    )
    g.add_argument(
        "--max-overhead",
        default=None,
        help="sync (implied by it): decode time allowed per sample, as a share of reading it "
        "raw plus --compute-ms (default 5%%)",
    )
    g.add_argument(
        "--compute-ms",
        default=None,
        help="sync (implied by it): compute time per sample (default 0)",
    )
    g.add_argument(
        "--read-mbps",
        default=None,
        help="sync: raw read bandwidth, MB/s (default: measured on the sample)",
    )
    g.add_argument(
        "--read-latency-ms",
        default=None,
        help="sync: raw read latency per file, ms (default: measured)",
    )
    g.add_argument(
        "--target-rate",
        default=None,
        metavar="RATE",
        help="prefetch: what the job consumes per node, files/s (2000) or bytes/s (500MB/s)",
    )
    g.add_argument(
        "--decode-cores",
        default=str(_MOUNT_PROCESSES),
        help="prefetch: cores free to decode (default %d, the mount's serving processes)"
        % _MOUNT_PROCESSES,
    )
    g.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="balanced: nodes that read the dataset each epoch; a solid block of small files "
        "is decoded once on each node that reads one of its files (default 1)",
    )
    g.add_argument(
        "--capacity",
        default=None,
        metavar="SIZE",
        help="fit in SIZE (e.g. nodes x SSD) with the least decode time instead",
    )
    g.add_argument(
        "--codecs",
        default=None,
        metavar="LIST",
        help="candidates, e.g. 'lz4 zstd:3 zstd:9+dict' (none is always one; default: a wide set)",
    )
    g.add_argument(
        "--sample-bytes", default="64MiB", help="bytes sampled over all classes (default 64MiB)"
    )
    g.add_argument(
        "--sample-entries",
        type=int,
        default=None,
        metavar="N",
        help="walk at most N entries of SRC to plan (bigger trees are sampled; default 200000)",
    )
    g.add_argument(
        "--time-budget",
        default=None,
        metavar="SECONDS",
        help="CPU seconds of codec measurement (default: --plan-share of the predicted pack time)",
    )
    g.add_argument(
        "--plan-share",
        default="25%",
        metavar="PERCENT",
        help="without --time-budget: the plan (reading the sample, the zstd:3 pass, measuring) "
        "aims at this share of the time the pack is predicted to take with the codecs it "
        "chooses, and its last measurements stop at this share of the whole pack time, the "
        "plan included (default 25%%)",
    )
    g.add_argument(
        "--cold-cost",
        choices=("mount", "method"),
        default="mount",
        help="how a decode's cost with cold caches (what a mount pays per file) is measured: "
        "mount reads the sample through a real mount of it (a few seconds; needs FUSE, else "
        "the plan says so and uses method), method times decodes after evicting the CPU "
        "caches (default mount)",
    )
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")


def _add_mount(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mount", help="mount a pack as a read-only tree", epilog=EXIT_CODES)
    p.add_argument("pack", help="pack directory")
    p.add_argument("mountpoint", help="empty directory to mount on")
    p.add_argument("-f", "--foreground", "--fg", action="store_true", help="stay in the foreground")
    p.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="OPT[,OPT...]",
        help="FUSE mount options passed through (e.g. allow_other)",
    )
    p.add_argument(
        "--log",
        default=None,
        help="log file (default: stderr with -f, else /tmp/fanfs-UID/mount-*.log)",
    )
    p.add_argument("--debug", action="store_true", help="log at DEBUG level")
    g = p.add_argument_group("prefetch and caches (docs/architecture.md)")
    g.add_argument(
        "--prefetch",
        choices=("on", "off"),
        default="on",
        help="read ahead of sequential readers and walks, follow sampler hints, fill the "
        "object cache in the background (default on; off still puts a decoded solid block's "
        "other files into the page cache)",
    )
    g.add_argument(
        "--prefetch-memory",
        default="auto",
        metavar="SIZE",
        help="read-ahead buffer per serving process "
        "(default: 1/32 of available memory, 64MiB-1GiB, shared out among the serving processes)",
    )
    g.add_argument(
        "--prefetch-into",
        choices=("kernel", "daemon"),
        default="kernel",
        help="where prefetched data goes: the kernel page cache (default) or the daemon's buffer",
    )
    g.add_argument(
        "--cache-memory",
        default="auto",
        metavar="SIZE",
        help="decoded-object cache for the whole mount (default: 1/8 of available memory; 0: off)",
    )
    g.add_argument(
        "--cache-policy",
        choices=("minio", "lru"),
        default="minio",
        help="minio: fill once, never evict (hits every epoch); lru: least recently used "
        "(default minio)",
    )
    p.add_argument(
        "--preload",
        default="auto",
        metavar="auto|yes|no|SIZE",
        help="copy this node's partitions into memory at mount: auto (default) as many as fit in "
        "a quarter of the available memory, yes all, no none, or up to SIZE",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=0,
        metavar="N",
        help="serving processes (default: 2 + cores/8, at most 8 and one per usable core; "
        "needs the patched pyfuse3)",
    )
    c = p.add_argument_group(
        "cluster mode (one daemon per node under mpirun/srun; docs/cluster.md)"
    )
    c.add_argument(
        "--cluster",
        dest="cluster",
        action="store_true",
        default=None,
        help="force cluster mode (default: detected from the MPI launcher's environment)",
    )
    c.add_argument(
        "--no-cluster", dest="cluster", action="store_false", help="never use cluster mode"
    )
    c.add_argument(
        "--cache-dir",
        default=None,
        help="node-local directory for this node's share ({rank} is replaced)",
    )
    c.add_argument(
        "--replicas", type=int, default=1, help="copies of each partition across nodes (default 1)"
    )
    c.add_argument(
        "--stage",
        choices=("copy", "none"),
        default="copy",
        help="copy this node's share to --cache-dir (default), or serve from PACK in place",
    )
    c.add_argument(
        "--stage-groups",
        type=int,
        default=0,
        metavar="G",
        help="at most G ranks read the shared filesystem at once while staging (0: all)",
    )
    c.add_argument(
        "--remote-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="wait this long for a peer before trying a replica or the pack (default 5)",
    )
    c.add_argument(
        "--coalesce-window",
        type=float,
        default=0.5,
        metavar="MS",
        help="batch remote requests to one peer within this window (default 0.5 ms; 0: off)",
    )
    p.add_argument(
        "--no-noopen",
        dest="noopen",
        action="store_false",
        help="do not use the kernel's no-open mode even with the patched pyfuse3",
    )
    p.add_argument(
        "--no-fast-paths",
        dest="fast_paths",
        action="store_false",
        help="answer OPENDIR and xattr requests in Python, and let the kernel drop directory"
        " listings, even with the patched pyfuse3 (for comparisons)",
    )
    p.set_defaults(func=_cmd_mount)


def _add_small(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("umount", help="unmount a fanfs mount", epilog=EXIT_CODES)
    p.add_argument("mountpoint")
    p.add_argument("-z", "--lazy", action="store_true", help="detach now even if busy")
    p.set_defaults(func=_cmd_umount)
    p = sub.add_parser(
        "wait", help="wait until a fanfs mount is ready (in a job script)", epilog=EXIT_CODES
    )
    p.add_argument("mountpoint")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="give up after this long (default 600)",
    )
    p.set_defaults(func=_cmd_wait)
    p = sub.add_parser("stats", help="show a running mount's counters", epilog=EXIT_CODES)
    p.add_argument("mountpoint")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument(
        "--prometheus",
        action="store_true",
        help="print the Prometheus text exposition format (metrics fanfs_*)",
    )
    p.add_argument(
        "--watch",
        type=float,
        default=None,
        metavar="SECONDS",
        help="print again every SECONDS (with rates) until interrupted",
    )
    p.add_argument(
        "--output",
        metavar="FILE",
        help="with --prometheus or --json: replace FILE (atomically) instead of printing, e.g. "
        "a .prom file in node_exporter's textfile directory; with --watch, every SECONDS; "
        "removed when the mount goes away",
    )
    p.set_defaults(func=_cmd_stats)
    p = sub.add_parser("inspect", help="summarise a pack", epilog=EXIT_CODES)
    p.add_argument("pack")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(func=_cmd_inspect)
    p = sub.add_parser("verify", help="check every checksum in a pack", epilog=EXIT_CODES)
    p.add_argument("pack")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser(
        "demo", help="generate a sample dataset, pack, mount and read it like a training loop"
    )
    p.add_argument(
        "--workdir", default=None, help="where to put the sample (default: a temporary directory)"
    )
    p.add_argument("--files", type=int, default=4000, help="number of sample files (default 4000)")
    p.add_argument("--workers", type=int, default=4, help="reader processes (default 4)")
    p.add_argument("--epochs", type=int, default=2, help="epochs to read (default 2)")
    p.set_defaults(func=_cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fanfs",
        description="A compressed, partitioned, read-only filesystem for deep-learning datasets.",
        epilog=EXIT_CODES,
    )
    parser.add_argument("--version", action="version", version="fanfs %s" % __version__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_pack(sub)
    _add_plan(sub)
    _add_mount(sub)
    _add_small(sub)
    return parser


def _cmd_pack(args: argparse.Namespace) -> int:
    from fanfs._sizes import parse_size
    from fanfs.compression import CodecSpec, parse_codec
    from fanfs.pack import PackOptions, run_pack
    from fanfs.plan import settings_from_args

    auto = args.codec.strip().lower() == "auto"
    opts = PackOptions(
        src=args.src,
        out=args.out,
        codec=CodecSpec(0, 0) if auto else parse_codec(args.codec),
        auto=settings_from_args(args) if auto else None,
        chunk_size=parse_size(args.chunk_size),
        block_size=None if args.block_size is None else parse_size(args.block_size),
        partitions=args.partitions,
        broadcast=tuple(args.broadcast),
        jobs=args.jobs,
        quiet=args.quiet,
        force=args.force,
        skip_unreadable=args.skip_unreadable,
        read_threads=args.read_threads,
        sample_entries=args.sample_entries,
        dedup=args.dedup,
        index_codec=args.index_codec,
        solid_block=None if args.solid_block is None else parse_size(args.solid_block),
    )
    run_pack(opts)
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from fanfs.pack import run_plan

    return run_plan(args)


def _cmd_mount(args: argparse.Namespace) -> int:
    from fanfs.mount import mount_from_args

    return mount_from_args(args)


def _cmd_umount(args: argparse.Namespace) -> int:
    from fanfs.umount import umount

    note = umount(args.mountpoint, lazy=args.lazy)
    if note:
        print("fanfs umount: %s" % note, file=sys.stderr)
    return 0


def _cmd_wait(args: argparse.Namespace) -> int:
    from fanfs.errors import MountSetupError
    from fanfs.mountinfo import wait_mounted

    if not wait_mounted(os.path.abspath(args.mountpoint), args.timeout):
        raise MountSetupError(
            "%s is not a ready fanfs mount after %gs" % (args.mountpoint, args.timeout)
        )
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    from fanfs.stats import run_stats

    if args.watch is not None and args.watch <= 0:
        raise UsageError("--watch must be a positive number of seconds")
    if args.output is not None and not (args.json or args.prometheus):
        raise UsageError("--output needs --prometheus or --json")
    return run_stats(
        args.mountpoint,
        as_json=args.json,
        watch=args.watch,
        prometheus=args.prometheus,
        output=args.output,
    )


def _cmd_inspect(args: argparse.Namespace) -> int:
    from fanfs.verify import inspect_pack

    print(inspect_pack(args.pack, as_json=args.json))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from fanfs.verify import verify_pack

    return verify_pack(args.pack, quiet=args.quiet)


def _cmd_demo(args: argparse.Namespace) -> int:
    from fanfs.demo import run_demo

    return run_demo(args)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    # fanfs does no linear algebra; a BLAS thread pool would only get in the way of the
    # daemon's fork (it must fork before any thread starts).
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so an interrupted pack removes its temporary directory.
    signal.signal(signal.SIGTERM, _interrupt)
    from fanfs.logsetup import setup_logging

    setup_logging(debug=getattr(args, "debug", False), quiet=getattr(args, "quiet", False))
    try:
        return int(args.func(args))
    except FanfsError as exc:
        print("fanfs %s: error: %s" % (args.command, exc), file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # `fanfs inspect PACK | head`: the reader went away; that is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        print("fanfs %s: error: %s" % (args.command, exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fanfs %s: interrupted" % args.command, file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
