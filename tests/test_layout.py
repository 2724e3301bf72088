"""The shape of the source tree, read from the source: layers, no import circles, file sizes.

The planner is a library: it must not import the training application, the command line or
the bundled model, and must not print or write files. Nothing in ``autockpt/`` or ``tft/`` may
import in a circle, counting imports inside functions too (they hide circles, not remove them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("autockpt", "tft")
#: A module a newcomer reads in one sitting (the house rule says "about 450 lines").
MAX_MODULE_LINES = 460


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    return {
        module_name(path): path for package in PACKAGES for path in (REPO / package).rglob("*.py")
    }


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports, resolved to the most specific module named.

    ``from autockpt.planner import entry`` counts as importing ``autockpt.planner.entry`` when
    that is a module, else the package ``autockpt.planner``.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    graph = {name: imported_modules(path, modules) for name, path in modules.items()}
    for name, edges in graph.items():
        edges.discard(name)
        # A package's __init__ re-exporting its own modules is how a package is read, not a
        # circle: ``autockpt`` -> ``autockpt.planner.entry`` -> ``autockpt.errors`` is fine.
        graph[name] = {edge for edge in edges if not _is_ancestor_package(edge, name)}
    return graph


def _is_ancestor_package(candidate: str, name: str) -> bool:
    return name.startswith(candidate + ".")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for edge in sorted(graph.get(node, ())):
            if state.get(edge) == 1:
                return [*path[path.index(edge) :], edge]
            if edge not in state and (cycle := visit(edge)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_cycle_finder_sees_a_circle() -> None:
    # The check above is only worth something if it can fail.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_planner_imports_nothing_from_the_application() -> None:
    graph = import_graph()
    forbidden = ("autockpt.training", "autockpt.cli", "tft")
    offenders = {
        f"{name} -> {edge}"
        for name, edges in graph.items()
        if name.startswith("autockpt.planner")
        for edge in edges
        if edge.startswith(forbidden)
    }
    assert not offenders, sorted(offenders)


def test_training_does_not_import_the_command_line() -> None:
    graph = import_graph()
    offenders = {
        f"{name} -> {edge}"
        for name, edges in graph.items()
        if name.startswith(("autockpt.training", "autockpt.planner", "tft"))
        for edge in edges
        if edge.startswith("autockpt.cli")
    }
    assert not offenders, sorted(offenders)


def test_planner_neither_prints_nor_writes_files() -> None:
    offenders = []
    for name, path in source_modules().items():
        if not name.startswith("autockpt.planner"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func
            label = (
                called.id
                if isinstance(called, ast.Name)
                else called.attr
                if isinstance(called, ast.Attribute)
                else ""
            )
            if label in {"print", "open", "write_text", "write_bytes", "save"}:
                offenders.append(f"{name}:{node.lineno} {label}()")
    assert not offenders, offenders


@pytest.mark.parametrize("name", sorted(source_modules()))
def test_module_reads_in_one_sitting(name: str) -> None:
    path = source_modules()[name]
    num_lines = len(path.read_text().splitlines())
    assert num_lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO)} has {num_lines} lines"
    if num_lines > 10:
        assert ast.get_docstring(ast.parse(path.read_text())), f"{name} says not what it is for"
