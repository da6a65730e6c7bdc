"""Defaults `fanfs mount` derives from the node: how many serving processes, and how the
default read-ahead memory is shared among them (issue 12: a 64-core node is not held to two
serving processes, and more processes take no more memory)."""

from __future__ import annotations

import os
import types
from typing import Any

import pytest

from fanfs.mount.family import default_processes, serving_processes, usable_cpus
from fanfs.mount.options import MountConfig
from fanfs.mount.serve import MIN_DEFAULT_PREFETCH, _solid_plan_nodes, memory_budgets
from fanfs.prefetch import default_memory


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [(1, 1), (2, 2), (4, 2), (8, 3), (16, 4), (32, 6), (48, 8), (64, 8), (256, 8)],
)
def test_default_serving_processes_grow_with_the_cores(cpus: int, expected: int) -> None:
    assert default_processes(cpus) == expected


def test_usable_cpus_are_the_affinity_mask() -> None:
    assert usable_cpus() == len(os.sched_getaffinity(0))


def _config(**kw: object) -> MountConfig:
    return MountConfig(pack="p", mountpoint="m", **kw)  # type: ignore[arg-type]


def test_processes_never_exceed_the_usable_cores_and_need_the_patch() -> None:
    patched = types.SimpleNamespace(FANFS_PATCH_LEVEL=4)
    cpus = usable_cpus()
    assert serving_processes(patched, _config(processes=64)) == cpus
    assert serving_processes(patched, _config()) == default_processes(cpus)
    assert serving_processes(types.SimpleNamespace(), _config(processes=4)) == 1


def test_the_default_read_ahead_budget_is_shared_by_the_serving_processes() -> None:
    one = memory_budgets(_config(), 1)[1]
    four = memory_budgets(_config(), 4)[1]
    assert four == max(MIN_DEFAULT_PREFETCH, one // 4)
    assert one >= default_memory(1)  # 64 MiB at least on any node
    # A value given on the command line is per process, as documented.
    assert memory_budgets(_config(prefetch_memory=8 << 20), 4)[1] == 8 << 20


def _plan(mode: object = "balanced", solid: object = True, nodes: object = 4) -> dict[str, Any]:
    return {
        "plan": {
            "mode": mode,
            "classes": [{"class": "a/*.txt", "solid": False}, {"class": "b/*", "solid": solid}],
            "settings": {"nodes": nodes},
        }
    }


@pytest.mark.parametrize(
    ("manifest", "nodes"),
    [
        (_plan(), 4),
        (_plan(nodes=None), 1),  # malformed: one node, the default
        (_plan(nodes=True), 1),
        (_plan(nodes=0), 1),
        (_plan(mode="prefetch"), None),  # each member counted decoding its block
        (_plan(solid=False), None),
        (_plan(solid="yes"), None),
        ({"plan": {"mode": "balanced", "classes": "all"}}, None),
        ({"plan": ["balanced"]}, None),
        ({}, None),
    ],
)
def test_the_nodes_a_balanced_solid_plan_was_made_for_survive_a_malformed_manifest(
    manifest: dict[str, Any], nodes: int | None
) -> None:
    """The mount warns when read-ahead is off or the cluster is larger than planned; the
    manifest's plan is informational and untrusted: anything malformed reads as no plan."""

    assert _solid_plan_nodes(manifest) == nodes
