"""`fanfs stats MOUNTPOINT`: the running daemon's counters, as a table, JSON, or the
Prometheus text exposition format (for node_exporter's textfile collector, or any scraper
that reads a file or stdout).

Reads the root xattr `user.fanfs.stats` (outside the dataset namespace), so it works for any
fanfs mount the caller can read, single-node or one rank of a cluster. Never imports pyfuse3.
"""

from __future__ import annotations

import contextlib
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
    ("readdirs", "READDIR requests", "n"),
    ("dir_opens", "OPENDIR requests (in Python)", "n"),
    ("fast_opendirs", "OPENDIR answered ENOSYS in C (no-opendir mode)", "n"),
    ("xattr_calls", "xattr requests (in Python)", "n"),
    ("fast_getxattrs", "GETXATTR answered in C", "n"),
    ("fast_listxattrs", "LISTXATTR answered in C", "n"),
    ("fast_ioctls", "IOCTL answered in C (a buffered open's isatty)", "n"),
    ("chunk_reads", "chunk reads", "n"),
    ("object_hits", "object cache hits", "n"),
    ("buffer_hits", "read-ahead buffer hits", "n"),
    ("object_inserts", "objects cached", "n"),
    ("inline_decodes", "decodes on the request thread", "n"),
    ("thread_decodes", "decodes in worker threads", "n"),
    ("inline_reads", "pack reads on the request thread (an idle process)", "n"),
    ("bytes_decoded", "bytes decoded", "b"),
    ("solid_bytes", "solid blocks: bytes decoded", "b"),
    ("solid_hits", "solid blocks: files served from a decoded block", "n"),
    ("solid_shared", "solid blocks: files sliced from another serving process's block", "n"),
    ("solid_pushed", "solid blocks: files pushed to page cache with a block-mate", "n"),
    ("decode_ns", "decode time (CPU of the decoding threads)", "ns"),
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
    ("rest_pushed", "partly read blocks: the rest pushed to page cache", "n"),
    ("rest_waited", "partly read blocks pushed before replying", "n"),
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


# Gauges of the exposition: (stats key, metric name without the prefix, help).
GAUGES: Final = (
    ("cache_bytes", "object_cache_bytes", "Bytes held by the object cache."),
    ("cache_budget", "object_cache_budget_bytes", "The object cache's budget."),
    ("cache_objects", "object_cache_objects", "Chunks held by the object cache."),
    ("buffer_bytes", "readahead_buffer_bytes", "Bytes in this process's read-ahead buffer."),
    ("buffer_budget", "readahead_buffer_budget_bytes", "The read-ahead buffer's budget."),
    ("resident_partitions", "resident_partitions", "Partitions preloaded into memory."),
    ("partitions", "partitions", "Partitions of the pack."),
    ("processes", "serving_processes", "Processes serving the mount."),
    ("memory_rss_bytes", "memory_rss_bytes", "Resident memory of the mount's processes."),
    ("memory_pss_bytes", "memory_pss_bytes", "Proportional memory of the mount's processes."),
    ("files", "files", "Regular files in the pack."),
    ("bytes_in", "dataset_bytes", "Bytes of the files in the pack, uncompressed."),
)
PROMETHEUS_PREFIX: Final = "fanfs_"


def _metric_name(key: str, kind: str) -> str:
    if kind == "ns":
        return PROMETHEUS_PREFIX + key.removesuffix("_ns") + "_seconds_total"
    return PROMETHEUS_PREFIX + key + "_total"


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return "%d" % value if float(value).is_integer() else repr(float(value))


def format_prometheus(stats: dict[str, Any]) -> str:
    """The counters and gauges of one mount in the Prometheus text exposition format 0.0.4,
    labelled with the mountpoint (and the rank in cluster mode)."""
    labels = 'mountpoint="%s"' % _label_value(str(stats.get("mountpoint", "")))
    if "rank" in stats:
        labels += ',rank="%d"' % stats["rank"]
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, value: float) -> None:
        lines.append("# HELP %s %s" % (name, help_text))
        lines.append("# TYPE %s %s" % (name, kind))
        lines.append("%s{%s} %s" % (name, labels, _number(value)))

    for key, label, kind in ROWS:
        if key in stats:
            value = stats[key] / 1e9 if kind == "ns" else stats[key]
            metric(_metric_name(key, kind), "counter", label[0].upper() + label[1:] + ".", value)
    for key, name, help_text in GAUGES:
        if isinstance(stats.get(key), int | float) and not isinstance(stats.get(key), bool):
            metric(PROMETHEUS_PREFIX + name, "gauge", help_text, stats[key])
    served = stats.get("read_bytes", 0)
    metric(
        PROMETHEUS_PREFIX + "decode_amplification",
        "gauge",
        "Bytes decoded per byte served (0 before the first read).",
        (stats.get("bytes_decoded", 0) + stats.get("solid_bytes", 0)) / served if served else 0.0,
    )
    return "\n".join(lines) + "\n"


def write_atomically(path: str, text: str) -> None:
    """Replace `path` with `text` by a rename, so a scraper never reads half a file."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def run_stats(
    mountpoint: str,
    *,
    as_json: bool,
    watch: float | None,
    prometheus: bool = False,
    output: str | None = None,
) -> int:
    def render(current: dict[str, Any], previous: dict[str, Any] | None) -> str:
        if prometheus:
            return format_prometheus(current)
        if as_json:
            return json.dumps(current, indent=None if watch else 2, sort_keys=True)
        return format_table(current, previous, watch or 0.0) + ("\n" if previous else "")

    def emit(text: str) -> None:
        if output is None:
            print(text, end="" if prometheus else "\n", flush=True)
        else:
            try:
                write_atomically(output, text)
            except OSError as exc:
                raise UsageError("cannot write %s: %s" % (output, exc.strerror)) from exc

    stats = read_stats(mountpoint)
    if watch is None or output is not None:
        emit(render(stats, None))
    if watch is None:
        return 0
    while True:
        time.sleep(watch)
        try:
            current = read_stats(mountpoint)
        except UsageError:
            if output is not None:  # no stale numbers for a mount that is gone
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(output)
            raise
        emit(render(current, stats))
        stats = current
