"""The layers point one way and no module needs itself: every import of every module under `agl_cli/` and
`rl_backend/` is read from its source (module level, inside functions, and under `if TYPE_CHECKING:` alike), so an
import that only runs later, or only for the type checker, still counts.

- nothing under `rl_backend/` imports `agl_cli`, or starts it as `python -m agl_cli` (agl_cli uses rl_backend; the
  trainer asks for what it needs through the interfaces in `rl_backend/trainer/interfaces.py`, which agl_cli fills in);
- no import cycle: a module never reaches itself by following imports (an import names the module it loads, so
  `from pkg.mod import name` is an edge to `pkg.mod`, and `from pkg import mod` one to `pkg.mod`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import REPO

PACKAGES = ("agl_cli", "rl_backend")


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the two packages (a package is its __init__.py)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, files: dict[str, Path]) -> Iterator[str]:
    """Every module name an import statement of this file loads, relative imports resolved: `from pkg import mod`
    names pkg.mod when that is a module, else pkg (what it imports is then a name defined in pkg)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}" if f"{module}.{alias.name}" in files else module


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the two packages it imports (the nearest known module of each imported name)."""
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set()
        for target in _imported(name, path, files):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """rl_backend modules -> the agl_cli modules they import."""
    found = {name: sorted(t for t in targets if t.split(".")[0] == "agl_cli")
             for name, targets in graph.items() if name.split(".")[0] == "rl_backend"}
    return {name: targets for name, targets in found.items() if targets}


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checks below can fail: a lazy import, a TYPE_CHECKING one and a relative one are all edges, and a
    cycle made only of them is found."""
    pkg = tmp_path / "rl_backend" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "rl_backend" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import thing\n")
    (pkg / "b.py").write_text("def f():\n    from rl_backend.sub import a\n    import agl_cli.spec\n")
    (tmp_path / "agl_cli").mkdir()
    (tmp_path / "agl_cli" / "__init__.py").write_text("")
    (tmp_path / "agl_cli" / "spec.py").write_text("from rl_backend.sub.a import x\n")
    graph = import_graph(module_files(tmp_path))
    assert graph["rl_backend.sub.a"] == {"rl_backend.sub.b"}
    assert graph["rl_backend.sub.b"] == {"rl_backend.sub.a", "agl_cli.spec"}
    assert graph["agl_cli.spec"] == {"rl_backend.sub.a"}
    assert cycles(graph) == [{"rl_backend.sub.a", "rl_backend.sub.b", "agl_cli.spec"}]
    assert upward_imports(graph) == {"rl_backend.sub.b": ["agl_cli.spec"]}


def test_rl_backend_never_imports_agl_cli() -> None:
    assert upward_imports(import_graph(module_files())) == {}


def agl_cli_commands(path: Path) -> list[int]:
    """Lines of the file that start `python -m agl_cli` (a list or tuple holding "-m" then "agl_cli")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.List | ast.Tuple):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if any(a == "-m" and b == "agl_cli" for a, b in zip(words, words[1:], strict=False)):
                found.append(node.lineno)
    return found


def test_rl_backend_never_starts_agl_cli(tmp_path: Path) -> None:
    """Not through a subprocess either: the caller passes the command line (see rl_backend/gateway/fake/procs.py)."""
    probe = tmp_path / "probe.py"
    probe.write_text('import sys\ncommand = [sys.executable, "-m", "agl_cli", "gateway", "serve"]\n')
    assert agl_cli_commands(probe) == [2]
    found = {name: lines for name, path in module_files().items()
             if name.split(".")[0] == "rl_backend" and (lines := agl_cli_commands(path))}
    assert found == {}


def test_no_import_cycles() -> None:
    found = [sorted(c) for c in cycles(import_graph(module_files()))]
    assert found == [], "import cycles (break them by moving what both sides need into a third module)"
