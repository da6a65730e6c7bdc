"""`fanfs stats MOUNTPOINT`: the running daemon's counters, as a table or JSON.

Reads the root xattr `user.fanfs.stats` (outside the dataset namespace), so it works for any
fanfs mount the caller can read, single-node or one rank of a cluster. Never imports pyfuse3.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Final

from fanfs import xattrs
from fanfs._sizes import format_size
from fanfs.errors import UsageError

# (key, label, kind): kind "n" count, "b" bytes, "ns" total nanoseconds
ROWS: Final = (
    ("reads", "READ requests", "n"),
    ("read_bytes", "bytes read", "b"),
    ("read_ns", "readers' wait inside READ (fetch stall)", "ns"),
    ("lookups", "LOOKUP requests", "n"),
    ("chunk_reads", "chunk reads", "n"),
    ("object_hits", "object cache hits", "n"),
    ("buffer_hits", "read-ahead buffer hits", "n"),
    ("object_inserts", "objects cached", "n"),
    ("inline_decodes", "decodes on the request thread", "n"),
    ("thread_decodes", "decodes in worker threads", "n"),
    ("bytes_decoded", "bytes decoded", "b"),
    ("decode_ns", "decode time", "ns"),
    ("prefetch_issued", "prefetch: chunks issued", "n"),
    ("prefetch_pushed", "prefetch: pushed to page cache", "n"),
    ("prefetch_cached", "prefetch: into object cache", "n"),
    ("prefetch_buffered", "prefetch: into buffer", "n"),
    ("prefetch_used", "prefetch: used from buffer", "n"),
    ("prefetch_joined", "prefetch: joined by a reader", "n"),
    ("prefetch_wasted", "prefetch: wasted", "n"),
    ("prefetch_failed", "prefetch: failed", "n"),
    ("prefetch_dropped", "prefetch: dropped (no room)", "n"),
    ("fill_chunks", "background fill: chunks", "n"),
    ("fill_bytes", "background fill: bytes", "b"),
    ("fill_pushed", "background fill: pushed to page cache", "n"),
    ("hint_lists", "hint lists received", "n"),
    ("hint_entries", "hinted files", "n"),
    ("remote_fetches", "remote fetches", "n"),
    ("remote_bytes", "remote bytes", "b"),
    ("remote_timeouts", "remote timeouts", "n"),
    ("pack_fallbacks", "reads from the pack (fallback)", "n"),
    ("data_errors", "reads failed (EIO)", "n"),
    ("corrupt_chunks", "corrupt chunks found", "n"),
    ("internal_errors", "internal errors", "n"),
)


def read_stats(mountpoint: str) -> dict[str, Any]:
    try:
        raw = os.getxattr(mountpoint, xattrs.STATS)
    except OSError as exc:
        raise UsageError("%s: not a fanfs mount (%s)" % (mountpoint, exc.strerror)) from exc
    stats: dict[str, Any] = json.loads(raw)
    return stats


def _value(kind: str, value: float) -> str:
    if kind == "b":
        return format_size(value)
    if kind == "ns":
        return "%.3f s" % (value / 1e9)
    return "%d" % value


def format_table(
    stats: dict[str, Any], previous: dict[str, Any] | None = None, interval: float = 0.0
) -> str:
    lines = [
        "%s  (pack %s, %s serving process(es), no-open mode %s)"
        % (
            stats.get("mountpoint", "?"),
            stats.get("pack", "?"),
            stats.get("processes", "?"),
            "on" if stats.get("noopen") else "off",
        )
    ]
    if "rank" in stats:
        lines.append(
            "cluster rank %d of %d, local partitions %s, peers down %s"
            % (
                stats["rank"],
                stats["ranks"],
                stats.get("local_partitions"),
                stats.get("peers_down") or "none",
            )
        )
    if "cache_policy" in stats:
        lines.append(
            "object cache %s: %s of %s, %d objects; prefetch %s, buffer %s of %s"
            % (
                stats["cache_policy"],
                format_size(stats.get("cache_bytes", 0)),
                format_size(stats.get("cache_budget", 0)),
                stats.get("cache_objects", 0),
                stats.get("prefetch", "?"),
                format_size(stats.get("buffer_bytes", 0)),
                format_size(stats.get("buffer_budget", 0)),
            )
        )
    header = "%-40s %16s" % ("counter", "total") + ("  %14s" % "per second" if previous else "")
    lines.append(header)
    for key, label, kind in ROWS:
        if key not in stats:
            continue
        row = "%-40s %16s" % (label, _value(kind, stats[key]))
        if previous is not None and interval > 0:
            rate = (stats[key] - previous.get(key, 0)) / interval
            row += "  %14s" % (_value(kind, rate) if kind != "ns" else "%.1f%%" % (rate / 1e7))
        lines.append(row)
    if stats.get("reads"):
        lines.append(
            "%-40s %16.1f"
            % ("mean READ service time (us)", stats["read_ns"] / stats["reads"] / 1e3)
        )
    if stats.get("chunk_reads"):
        hits = stats.get("object_hits", 0) + stats.get("buffer_hits", 0)
        lines.append(
            "%-40s %15.1f%%"
            % ("chunk reads served from memory", 100.0 * hits / stats["chunk_reads"])
        )
    return "\n".join(lines)


def run_stats(mountpoint: str, *, as_json: bool, watch: float | None) -> int:
    stats = read_stats(mountpoint)
    if watch is None:
        print(json.dumps(stats, indent=2, sort_keys=True) if as_json else format_table(stats))
        return 0
    while True:
        time.sleep(watch)
        current = read_stats(mountpoint)
        if as_json:
            print(json.dumps(current, sort_keys=True), flush=True)
        else:
            print(format_table(current, stats, watch) + "\n", flush=True)
        stats = current
