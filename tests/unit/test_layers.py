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


def test_no_import_cycles() -> None:
    modules = {
        "fanfs." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts): p
        for p in PACKAGE.rglob("*.py")
    }
    modules = {name.removesuffix(".__init__"): p for name, p in modules.items()}
    graph = {name: _fanfs_imports(p) & modules.keys() - {name} for name, p in modules.items()}
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
