"""`fanfs stats`: the running daemon's counters, as a user reads them."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FANFS, Mount, run_fanfs

pytestmark = pytest.mark.fuse


def test_stats_json_counts_reads(edge_tree: Path, edge_pack: Path, mount_factory: object) -> None:
    mount: Mount = mount_factory(edge_pack)  # type: ignore[operator]
    before = json.loads(run_fanfs("stats", "--json", mount.mnt).stdout)
    data = (mount.mnt / "sizes" / "text_196625").read_bytes()
    assert data == (edge_tree / "sizes" / "text_196625").read_bytes()
    result = run_fanfs("stats", "--json", mount.mnt)
    assert result.returncode == 0, result.stderr
    after = json.loads(result.stdout)
    assert after["reads"] > before["reads"]
    assert after["read_bytes"] - before["read_bytes"] == len(data)
    assert after["read_ns"] > before["read_ns"]
    assert after["bytes_decoded"] >= before["bytes_decoded"] + len(data)
    assert after["data_errors"] == after["internal_errors"] == 0


def test_stats_table_and_errors(edge_pack: Path, mount_factory: object, tmp_path: Path) -> None:
    mount: Mount = mount_factory(edge_pack)  # type: ignore[operator]
    result = run_fanfs("stats", mount.mnt)
    assert result.returncode == 0
    assert "READ requests" in result.stdout and str(mount.mnt) in result.stdout.splitlines()[0]
    result = run_fanfs("stats", tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "fanfs stats: error: %s: not a fanfs mount (No data available)" % tmp_path
    ]
    result = run_fanfs("stats", "--watch", "0", mount.mnt)
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "fanfs stats: error: --watch must be a positive number of seconds",
    )


# --- the Prometheus exposition (issue 13) -----------------------------------------------------


def families(text: str) -> dict[str, Any]:
    """Parse with the Prometheus client's own parser (it raises on a malformed exposition)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def only_sample(family: Any) -> Any:
    (sample,) = family.samples
    return sample


def test_prometheus_exposition_parses_and_matches_the_json(
    edge_tree: Path, edge_pack: Path, mount_factory: object
) -> None:
    mount: Mount = mount_factory(edge_pack)  # type: ignore[operator]
    assert (mount.mnt / "sizes" / "text_196625").read_bytes() == (
        edge_tree / "sizes" / "text_196625"
    ).read_bytes()
    result = run_fanfs("stats", "--prometheus", mount.mnt)
    assert result.returncode == 0, result.stderr
    stats = json.loads(run_fanfs("stats", "--json", mount.mnt).stdout)
    parsed = families(result.stdout)
    # Counters: the client strips `_total` from the family name.
    reads = parsed["fanfs_reads"]
    assert reads.type == "counter"
    assert only_sample(reads).labels == {"mountpoint": str(mount.mnt)}
    assert only_sample(parsed["fanfs_read_bytes"]).value == stats["read_bytes"] > 0
    assert only_sample(parsed["fanfs_data_errors"]).value == 0
    stall = only_sample(parsed["fanfs_read_seconds"]).value
    assert stall > 0 and stall <= stats["read_ns"] / 1e9 + 1
    for name in ("fanfs_memory_pss_bytes", "fanfs_memory_rss_bytes", "fanfs_serving_processes"):
        assert parsed[name].type == "gauge" and only_sample(parsed[name]).value > 0, name
    assert only_sample(parsed["fanfs_serving_processes"]).value == stats["processes"]
    amplification = only_sample(parsed["fanfs_decode_amplification"]).value
    decoded = only_sample(parsed["fanfs_bytes_decoded"]).value
    served = only_sample(parsed["fanfs_read_bytes"]).value
    assert amplification == pytest.approx(decoded / served) and amplification >= 1.0


def test_prometheus_textfile_is_rewritten_and_removed_with_the_mount(
    edge_pack: Path, mount_factory: object, tmp_path: Path
) -> None:
    """node_exporter's textfile collector: a .prom file replaced atomically every interval,
    and gone once the mount is (no stale numbers)."""
    mount: Mount = mount_factory(edge_pack)  # type: ignore[operator]
    out = tmp_path / "fanfs.prom"
    cmd = [*FANFS, "stats", "--prometheus", "--output", str(out), "--watch", "0.2", str(mount.mnt)]
    watcher = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        first = families(out.read_text())
        before = only_sample(first["fanfs_reads"]).value
        (mount.mnt / "sizes" / "text_196625").read_bytes()
        while time.monotonic() < deadline:
            if only_sample(families(out.read_text())["fanfs_reads"]).value > before:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the textfile never showed the new reads")
        mount.unmount()
        assert watcher.wait(20) == 2
        assert watcher.stderr is not None
        assert watcher.stderr.read().startswith(
            "fanfs stats: error: %s: not a fanfs mount" % mount.mnt
        )
        assert not out.exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("fanfs.prom")] == []
    finally:
        watcher.kill()
        watcher.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--output", "x.prom"], "--output needs --prometheus or --json"),
        (
            ["--prometheus", "--output", "/nonexistent/dir/x.prom"],
            "cannot write /nonexistent/dir/x.prom: No such file or directory",
        ),
    ],
)
def test_prometheus_output_errors(
    edge_pack: Path, mount_factory: object, args: list[str], message: str
) -> None:
    mount: Mount = mount_factory(edge_pack)  # type: ignore[operator]
    result = run_fanfs("stats", *args, mount.mnt)
    assert (result.returncode, result.stderr) == (2, "fanfs stats: error: %s\n" % message)


# --- the decode trace (FANFS_DECODE_TRACE) ----------------------------------------------------


def test_the_decode_trace_holds_each_decode_of_every_serving_process(
    edge_tree: Path,
    edge_pack: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every file read once through two serving processes: the traces hold the chunks of
    # every file (but for a second name of a hard-linked file, which reads the first's), and
    # their CPU ns add up to the decode_ns the mount logs at unmount.
    import ast
    import os
    import stat

    import numpy as np

    from tests.conftest import Mount, entry_at, open_reader

    monkeypatch.setenv("FANFS_DECODE_TRACE", str(tmp_path / "trace"))
    single: list[Path] = []  # regular files with one name
    # (no object cache: its background filler, a process of its own, decodes ahead of the
    # reads, and neither decode_ns nor the trace counts that)
    with Mount(edge_pack, tmp_path / "mnt", "--processes", "2", "--cache-memory", "0") as mount:
        for top, _, names in os.walk(edge_tree):
            for name in names:
                path = Path(top, name)
                st = path.lstat()
                if stat.S_ISREG(st.st_mode):
                    rel = path.relative_to(edge_tree)
                    assert (mount.mnt / rel).read_bytes() == path.read_bytes(), rel
                    if st.st_nlink == 1:
                        single.append(rel)
    (line,) = [line for line in mount.log_text().splitlines() if "statistics: " in line]
    decode_ns = ast.literal_eval(line.split("statistics: ", 1)[1])["decode_ns"]
    traces = sorted(tmp_path.glob("trace.*"))
    assert 1 <= len(traces) <= 2
    pairs = np.concatenate([np.fromfile(t, dtype=np.int64).reshape(-1, 2) for t in traces])
    assert int(pairs[:, 1].sum()) == decode_ns > 0
    reader = open_reader(edge_pack)
    ix = reader.index

    def stored(cids: Iterable[int]) -> set[tuple[int, int]]:
        # (a chunk stored once for several files is decoded once: by its stored location)
        return {(int(ix.chunk_partition[c]), int(ix.chunk_offset[c])) for c in cids}

    decoded = stored(pairs[:, 0].tolist())
    assert len(single) > 100
    for rel in single:
        entry = entry_at(reader, str(rel))
        first = int(ix.first[entry])
        assert stored(range(first, first + int(ix.count[entry]))) <= decoded, rel


def test_a_decode_trace_that_cannot_be_written_does_not_stop_the_unmount(
    edge_tree: Path, edge_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import Mount

    prefix = tmp_path / "missing" / "trace"
    monkeypatch.setenv("FANFS_DECODE_TRACE", str(prefix))
    with Mount(edge_pack, tmp_path / "mnt", "--cache-memory", "0") as mount:
        data = (mount.mnt / "sizes" / "text_196625").read_bytes()
        assert data == (edge_tree / "sizes" / "text_196625").read_bytes()
    # (leaving the block unmounted, asserting the daemon exited 0 and the mount is gone)
    log = mount.log_text()
    assert "decode trace not written: %s." % prefix in log
    assert "No such file or directory" in log and "unmounted" in log
