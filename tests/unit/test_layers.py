"""The layering rules of docs/architecture.md, checked on the source (STYLE.md B2)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fanfs"

# Third-party imports each module may make (module-level or lazy, anywhere in the file); a
# package's name allows it in each of its modules.
ALLOWED = {
    "pyfuse3": {"operations", "mount"},
    "mpi4py": {"transport"},
    "trio": {"store", "prefetch", "hints", "operations", "mount", "remote", "node"},
    "zstandard": {"compression"},
    "lz4": {"compression"},
    "brotli": {"compression"},
    "zlib_ng": {"layout"},
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("library", sorted(ALLOWED))
def test_only_allowed_modules_import(library: str) -> None:
    offenders = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if library in _imports(path)
        and path.stem not in ALLOWED[library]
        and path.parent.name not in ALLOWED[library]
    )
    assert offenders == []


def test_format_layer_knows_nothing_above_it() -> None:
    for path in (PACKAGE / "format").glob("*.py"):
        text = path.read_text()
        for upper in ("fanfs.store", "fanfs.operations", "fanfs.mount", "fanfs.pack", "fanfs.cli"):
            assert upper not in text, (path.name, upper)


@pytest.mark.parametrize(
    "code",
    [
        "import fanfs",
        "import fanfs.cli; fanfs.cli.build_parser()",
        "import fanfs.pack, fanfs.verify, fanfs.format.reader",
    ],
)
def test_cheap_imports_load_no_fuse_mpi_or_trio(code: str) -> None:
    check = (
        code
        + "; import sys; print(sorted(m for m in ('pyfuse3', 'mpi4py', 'trio') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_pack_command_loads_no_fuse_mpi_or_trio(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x" * 1000)
    code = (
        "import sys; from fanfs.cli import main; "
        "rc = main(['pack', '-q', sys.argv[1], sys.argv[2]]); "
        "print(rc, sorted(m for m in ('pyfuse3', 'mpi4py', 'trio') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "src"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "0 []"


# The layers of docs/architecture.md, bottom up: a module imports (at the top or lazily)
# only modules of its own layer or of lower ones, so data flows one way, down. Inside the
# `mount` and `optimizer` packages the modules are ordered too (each imports only those
# before it). Every module must be listed: a new one needs a decision.
LAYERS: tuple[tuple[str, ...], ...] = (
    # 0: foundations
    (
        "fanfs",
        "errors",
        "logsetup",
        "_sizes",
        "_progress",
        "_memory",
        "mountinfo",
        "xattrs",
        "runtime",
        "cluster",
        "cluster.topology",
        "format",
    ),
    # 1: the pack format, codecs, MPI
    (
        "compression",
        "format.layout",
        "format.validate",
        "format.index",
        "format.reader",
        "format.writer",
        "cluster.transport",
    ),
    # 2: commands on packs, and staging
    ("optimizer", "walk", "plan", "pack", "verify", "sample", "cluster.staging"),
    # 3: the read path below FUSE: chunks, caches, shared state, remote chunks
    ("shared", "cache", "store", "cluster.remote"),
    # 4: read-ahead above the store (the store never calls it), and its hints
    ("prefetch", "hints"),
    # 5: FUSE requests; the sampler wrapper
    ("operations", "torch"),
    # 6: the mount's lifecycle, one cluster node, the commands that talk to a mount
    ("mount", "cluster.node", "umount", "stats"),
    # 7: the command line; the subprocess harness of tests and benchmarks (nothing in fanfs
    # may use it)
    ("cli", "demo", "__main__", "_harness"),
)
PACKAGE_ORDER = {
    "mount": ("options", "signals", "kernel", "preload", "family", "serve", "daemon", "command"),
    "optimizer": (
        "candidates",
        "classes",
        "sampling",
        "coldmount",
        "measurement",
        "selection",
        "budgets",
    ),
}


def _rank(module: str) -> tuple[int, str, int]:
    """(layer, package, place inside the package) of a module; a package's __init__ ranks
    above its modules (it re-exports them)."""
    name = module.removeprefix("fanfs").removeprefix(".") or "fanfs"
    package, _, inner = name.partition(".")
    for layer, names in enumerate(LAYERS):
        if name in names:
            return layer, name, len(PACKAGE_ORDER.get(name, ()))
        if package in PACKAGE_ORDER and package in names:
            return layer, package, PACKAGE_ORDER[package].index(inner)
    raise KeyError(module)


def _is_above(a: str, b: str) -> bool:
    """Is module b in a higher layer than a, or later in the same package?"""
    (layer_a, package_a, place_a), (layer_b, package_b, place_b) = _rank(a), _rank(b)
    if layer_a != layer_b:
        return layer_b > layer_a
    return package_a == package_b and place_b > place_a


def _fanfs_imports(path: Path) -> set[str]:
    """The fanfs modules `path` imports, at the top or lazily inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fanfs"):
            found.add(node.module)
            found.update("%s.%s" % (node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fanfs"))
    return found


def _import_graph() -> dict[str, set[str]]:
    modules = {
        "fanfs." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts): p
        for p in PACKAGE.rglob("*.py")
    }
    modules = {name.removesuffix(".__init__"): p for name, p in modules.items()}
    return {name: _fanfs_imports(p) & modules.keys() - {name} for name, p in modules.items()}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        "%s imports %s" % (a, b) for a, targets in graph.items() for b in targets if _is_above(a, b)
    )


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for name in _import_graph():
        try:
            _rank(name)
        except (KeyError, ValueError):
            unplaced.append(name)
    assert unplaced == []


def test_no_upward_import() -> None:
    assert _upward(_import_graph()) == []


def test_an_upward_import_is_found() -> None:
    # The check itself: the store calling up into the prefetcher, the mount's options
    # reaching for the serving loop, the format knowing the store.
    graph = _import_graph()
    graph["fanfs.store"] = graph["fanfs.store"] | {"fanfs.prefetch"}
    graph["fanfs.mount.options"] = graph["fanfs.mount.options"] | {"fanfs.mount.serve"}
    graph["fanfs.format.reader"] = graph["fanfs.format.reader"] | {"fanfs.store"}
    assert _upward(graph) == [
        "fanfs.format.reader imports fanfs.store",
        "fanfs.mount.options imports fanfs.mount.serve",
        "fanfs.store imports fanfs.prefetch",
    ]


def test_no_import_cycles() -> None:
    graph = _import_graph()
    cycles = set()
    for a, targets in graph.items():
        for b in targets:
            if a in _reachable(graph, b):
                cycles.add(frozenset({a, b}))
    assert cycles == set()


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        for nxt in graph.get(name, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
