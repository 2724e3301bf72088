"""The shape of the source tree, read from the source: layers, no import circles, file sizes.

The planner is a library: it must not import the training application, the command line or
the bundled model, and must not print or write files; the bundled model ``tft`` is a library of
its own and imports nothing of ``autockpt``. Nothing in ``autockpt/`` or ``tft/`` may
import in a circle, counting imports inside functions too (they hide circles, not remove them).
The planner's top keeps what a user imports; its stage sub-packages import one another in the
pipeline's order only, hold a sitting's worth of modules each, and no planner function runs
over a screen.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("autockpt", "tft")
#: A module a newcomer reads in one sitting (the house rule says "about 450 lines").
MAX_MODULE_LINES = 460
PLANNER = "autockpt.planner"
#: The planner's stage sub-packages, in the order they may import one another: each imports
#: only those before it, and none imports the planner's top (which imports them all).
STAGES = ("core", "trace", "runtime", "simulate", "measure", "timing", "solve")
#: Modules at the planner's top: what a user imports (plan(), the Plan types, apply,
#: training_step, verification), planning's pipeline and the compiled search (which, like
#: verification, runs real steps of the applied plan).
MAX_TOP_MODULES = 9
MAX_STAGE_MODULES = 12
TRAINING = "autockpt.training"
#: The training application's sub-packages, in the order they may import one another: what a
#: run is asked to do, the process it runs in, its setup, its forecasts and scores, the loop.
TRAINING_STAGES = ("options", "host", "setup", "forecasts", "loop")
#: A function in one screen: lines of code, docstrings, comments and blank lines not counted.
MAX_FUNCTION_LINES = 100


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


def test_tft_imports_nothing_of_autockpt() -> None:
    # By the source: no module of tft names autockpt, inside functions either.
    graph = import_graph()
    offenders = {
        f"{name} -> {edge}"
        for name, edges in graph.items()
        if name.startswith("tft")
        for edge in edges
        if edge.startswith("autockpt")
    }
    assert not offenders, sorted(offenders)
    # By what importing it loads: every module of tft, in a fresh interpreter.
    tft_modules = sorted(name for name in source_modules() if name.startswith("tft"))
    script = (
        "import importlib, sys\n"
        f"for name in {tft_modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'autockpt'))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_every_package_holds_a_sitting_of_modules() -> None:
    # The planner's top has a test of its own (MAX_TOP_MODULES).
    planner = REPO / "autockpt" / "planner"
    packages = [p.parent for package in PACKAGES for p in (REPO / package).rglob("__init__.py")]
    packages = [p for p in packages if p != planner]
    crowded = {
        str(package.relative_to(REPO)): count
        for package in packages
        if (count := len([p for p in package.glob("*.py") if p.name != "__init__.py"]))
        > MAX_STAGE_MODULES
    }
    assert not crowded, crowded


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


def stage_of(module: str, root: str = PLANNER, stages: tuple[str, ...] = STAGES) -> str | None:
    """The stage sub-package of a module under ``root``; ``None`` for ``root``'s top."""
    parts = module.split(".")
    depth = len(root.split("."))
    if len(parts) > depth + 1 or (len(parts) == depth + 1 and parts[depth] in stages):
        return parts[depth]
    return None


def stage_order_offenders(
    graph: dict[str, set[str]], root: str = PLANNER, stages: tuple[str, ...] = STAGES
) -> list[str]:
    """Imports between modules under ``root`` that run against its stage order."""
    offenders = []
    for name, edges in graph.items():
        if not name.startswith(root + ".") or (stage := stage_of(name, root, stages)) is None:
            continue
        for edge in edges:
            if not edge.startswith(root + "."):
                continue
            target = stage_of(edge, root, stages)
            if target is None or stages.index(target) > stages.index(stage):
                offenders.append(f"{name} -> {edge}")
    return sorted(offenders)


@pytest.mark.parametrize(("root", "stages"), [(PLANNER, STAGES), (TRAINING, TRAINING_STAGES)])
def test_stages_import_in_their_order(root: str, stages: tuple[str, ...]) -> None:
    graph = import_graph()
    modules = [name for name in graph if name.startswith(root + ".")]
    unknown = {stage_of(n, root, stages) for n in modules} - {None, *stages}
    assert not unknown, f"sub-packages not in the stage order: {sorted(map(str, unknown))}"
    assert stage_order_offenders(graph, root, stages) == []


def test_stage_order_check_sees_an_import_against_it() -> None:
    graph = {
        "autockpt.planner.trace.fx_graph": {"autockpt.planner.core.units"},
        "autockpt.planner.core.units": {"autockpt.planner.solve.refusal"},
        "autockpt.planner.measure.fake_step": {"autockpt.planner.entry"},
        "autockpt.planner.entry": {"autockpt.planner.solve.refusal"},
    }
    assert stage_order_offenders(graph) == [
        "autockpt.planner.core.units -> autockpt.planner.solve.refusal",
        "autockpt.planner.measure.fake_step -> autockpt.planner.entry",
    ]


def test_planner_top_and_stages_hold_a_sitting_of_modules() -> None:
    root = REPO / "autockpt" / "planner"
    top = sorted(p.name for p in root.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, top
    stages = sorted(p.parent.name for p in root.glob("*/__init__.py"))
    assert stages == sorted(STAGES)
    for stage in STAGES:
        modules = sorted(p.name for p in (root / stage).glob("*.py") if p.name != "__init__.py")
        assert len(modules) <= MAX_STAGE_MODULES, f"{stage}/ holds {len(modules)}: {modules}"
        docstring = ast.get_docstring(ast.parse((root / stage / "__init__.py").read_text()))
        assert docstring, f"planner/{stage}/__init__.py says not what the stage takes and gives"


def module_words_clashes(paths: list[Path]) -> list[str]:
    """Pairs of modules named with the same words, in any order (``a_b`` and ``b_a``)."""
    seen: dict[frozenset[str], Path] = {}
    clashes = []
    for path in sorted(paths):
        if path.name == "__init__.py":
            continue
        words = frozenset(path.stem.split("_"))
        if words in seen:
            clashes.append(f"{seen[words].name} and {path.name}")
        seen[words] = path
    return clashes


def test_no_two_planner_modules_share_their_words() -> None:
    assert module_words_clashes(list((REPO / "autockpt" / "planner").rglob("*.py"))) == []
    clash = [Path("planned_module.py"), Path("module_planned.py"), Path("plan.py")]
    assert module_words_clashes(clash) == ["module_planned.py and planned_module.py"]


def code_lines(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of code in ``node``: docstrings (its own and nested ones), comments and blank
    lines not counted."""
    lines = source.splitlines()
    docstrings: set[int] = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (
            isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    first, last = node.lineno, node.end_lineno or node.lineno
    return sum(
        1
        for number in range(first, last + 1)
        if number not in docstrings
        and lines[number - 1].strip()
        and not lines[number - 1].strip().startswith("#")
    )


def long_functions(source: str, label: str) -> list[str]:
    """Functions (methods and nested functions included) over ``MAX_FUNCTION_LINES``."""
    return [
        f"{label}:{node.lineno} {node.name} has {count} lines of code"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (count := code_lines(source, node)) > MAX_FUNCTION_LINES
    ]


def test_no_function_runs_over_a_screen() -> None:
    offenders = []
    for name, path in source_modules().items():
        offenders += long_functions(path.read_text(), name)
    assert offenders == []


def test_function_length_counts_code_not_prose() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    prose = '    """Says what it does.\n\n    At length.\n    """\n    # why\n\n'
    fits = f"def fits():\n{prose}{body}\n"
    assert long_functions(fits, "m") == []  # the def line and 99 assignments
    over = f"def over():\n{prose}{body}\n    return x0\n"
    assert long_functions(over, "m") == ["m:1 over has 101 lines of code"]
