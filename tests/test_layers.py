"""The layering DESIGN.md fixes, checked on the source: who may import whom, no system tasks, and the
threat-model domain built only on what any other domain could use.

The three kinds of code the core holds are three packages: `machine` (pure: decides), `durable` (outlives a
process) and `runtime` (waits, on Trio). Each package may import only the packages its row names below; an
import of anything else of trioloop (statically, anywhere in the module, type-only imports included) is an arrow
against the design and fails here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "trioloop"

#: What each layer may import of trioloop (its own package included). Anything else of trioloop is an arrow
#: pointing up or sideways: a domain, a face, an optional layer, the public facades, the top-level package.
MAY_IMPORT = {
    "protocol": ("protocol",),
    "machine": ("machine", "protocol"),
    "durable": ("durable", "machine", "protocol"),
    "providers": ("providers", "protocol", "_lazy"),
    "runtime": ("runtime", "durable", "machine", "protocol", "providers"),
    "tools": ("tools", "runtime", "machine", "protocol"),
}

#: Everything a module of `machine` may import from outside trioloop: pure computation only. No Trio, no
#: HTTP, no files, sockets, threads, processes, clocks or randomness.
PURE_LIBRARIES = frozenset(
    {
        "__future__",
        "attrs",
        "cattrs",
        "cattrs.errors",
        "collections",
        "collections.abc",
        "copy",
        "decimal",
        "difflib",
        "enum",
        "functools",
        "hashlib",
        "itertools",
        "json",
        "math",
        "operator",
        "re",
        "types",
        "typing",
        "unicodedata",
        "urllib.parse",
    }
)

#: Libraries the pure machine and the durable layer must not load, even through another module.
NOT_IN_THE_MACHINE = ("trio", "httpx", "anyio", "sqlite3", "psycopg", "yaml", "socket", "asyncio", "subprocess")

#: Storage libraries only `durable` imports: everything else goes through the journal-store protocol.
STORAGE_LIBRARIES = ("sqlite3", "psycopg")


def modules(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every module an import statement in ``path`` names (relative imports resolved), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if path.name == "__init__.py":
        here += ".__init__"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")[: -node.level]
                base = ".".join([*parts, base] if base else parts)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _layer_of(name: str) -> str | None:
    """The trioloop package (or top-level module) an imported name belongs to, or None outside trioloop."""
    parts = name.split(".")
    if parts[0] != "trioloop":
        return None
    return parts[1] if len(parts) > 1 else "trioloop"


def arrows(package: str) -> list[str]:
    """Every import in ``package`` of a part of trioloop its row does not allow."""
    allowed = MAY_IMPORT[package]
    found = []
    for path in modules(package):
        for line, name in imported(path):
            layer = _layer_of(name)
            if layer is not None and layer not in allowed:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_no_arrow_points_up_or_sideways(package: str) -> None:
    assert modules(package), package
    assert arrows(package) == []


def test_every_package_of_the_core_has_a_row() -> None:
    # A new package under trioloop/ must be placed in the layering (or be a domain, an extra or a face).
    outside = {"threatmodel", "mcp", "otel", "ui", "cli", "web", "_data"}
    packages = {path.name for path in PACKAGE.iterdir() if path.is_dir() and not path.name.startswith("__")}
    assert packages - outside == set(MAY_IMPORT)


def test_the_machine_imports_only_pure_libraries() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in modules("machine")
        for line, name in imported(path)
        if _layer_of(name) is None and name not in PURE_LIBRARIES and name.rpartition(".")[0] not in PURE_LIBRARIES
    ]
    assert found == []


@pytest.mark.parametrize("package", ["machine", "durable"])
def test_importing_a_layer_loads_nothing_above_it(package: str) -> None:
    # The static walk above sees each module's own imports; this sees what importing the whole layer loads, through
    # every package __init__ on the way (trioloop's own included).
    names = [".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in modules(package)]
    names = [name.removesuffix(".__init__") for name in names]
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    loaded = done.stdout.split()
    above = {"machine": ("durable", "runtime", "providers"), "durable": ("runtime", "providers")}[package]
    faces = ("tools", "threatmodel", "mcp", "otel", "ui", "cli", "web")
    assert [m for m in loaded if _layer_of(m) in (*above, *faces)] == []
    if package == "machine":
        assert [m for m in loaded if m.split(".")[0] in NOT_IN_THE_MACHINE] == []


@pytest.mark.parametrize("package", ["machine", "runtime", "protocol", "providers"])
def test_the_core_and_providers_import_no_opentelemetry(package: str) -> None:
    # Telemetry is an observer outside the core (trioloop.otel, an optional extra), never a dependency of it.
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in modules(package)
        for line, name in imported(path)
        if name == "opentelemetry" or name.startswith("opentelemetry.")
    ]
    assert found == []


@pytest.mark.parametrize("package", ["machine", "runtime", "protocol", "providers", "tools"])
def test_only_the_durable_layer_imports_a_storage_library(package: str) -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in modules(package)
        for line, name in imported(path)
        if any(name == library or name.startswith(library + ".") for library in STORAGE_LIBRARIES)
    ]
    assert found == []


@pytest.fixture
def package_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the package the checks below read instead of the real one: a probe module written into it is never
    seen by a test running at the same time in another process (pytest-xdist)."""
    import shutil

    copy = tmp_path / "trioloop"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    return copy


def test_the_checker_sees_a_forbidden_arrow(package_copy: Path) -> None:
    # The walk must catch every spelling of an import, or the rules above prove nothing.
    cases = {
        "machine": (
            "import trioloop.threatmodel.model\n",
            "from trioloop.threatmodel import ThreatModel\n",
            "from trioloop import threatmodel\n",
            "from ..runtime import session\n",
            "from ..durable.journal import JournalWriter\n",
            "import trioloop\n",
            "from trioloop import Session\n",
            "def f():\n    from trioloop.ui.qt import ReviewPanel\n",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from trioloop.runtime.tools import ToolExecutionContext\n",
        ),
        "durable": ("from trioloop.runtime.session import Session\n", "from ..runtime import run_turn\n"),
        "runtime": ("from trioloop.tools.functions import function_tool\n", "from trioloop.stores import open_store\n"),
    }
    for package, sources in cases.items():
        for source in sources:
            fake = package_copy / package / "_layer_probe.py"
            fake.write_text(source, encoding="utf-8")
            try:
                found = arrows(package)
            finally:
                fake.unlink()
            assert any("_layer_probe.py" in arrow for arrow in found), (package, source)


def test_the_checker_sees_an_impure_library(package_copy: Path) -> None:
    for source in ("import trio\n", "from time import monotonic\n", "import os.path\n", "from httpx import Client\n"):
        fake = package_copy / "machine" / "_layer_probe.py"
        fake.write_text(source, encoding="utf-8")
        try:
            found = [
                name
                for _, name in imported(fake)
                if name not in PURE_LIBRARIES and name.rpartition(".")[0] not in PURE_LIBRARIES
            ]
        finally:
            fake.unlink()
        assert found, source


def test_nothing_spawns_a_system_task() -> None:
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if any(
            isinstance(node, ast.Attribute) and node.attr == "spawn_system_task"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    ]
    assert offenders == []


def test_the_threat_model_uses_no_private_core_module() -> None:
    # Whatever the threat model needs from the core, a second domain can import too.
    private = [
        f"{path.name}:{line} {name}"
        for path in modules("threatmodel")
        for line, name in imported(path)
        if name.startswith("trioloop.")
        and not name.startswith("trioloop.threatmodel")
        and any(part.startswith("_") for part in name.split(".")[1:])
    ]
    assert private == []


def test_the_qt_face_names_its_extra_when_pyside6_is_missing() -> None:
    probe = "import sys; sys.modules['PySide6'] = None; import trioloop.ui.qt"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode != 0
    assert 'pip install "trioloop[qt]"' in done.stderr


# -- circles: the modules of each package import each other top-down ----------------------------------------


def packages() -> list[str]:
    """Every package of trioloop (a folder with modules)."""
    return sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_") and modules(p.name))


def _module_of(dotted: list[str], package: str, names: set[str]) -> str | None:
    """The module of ``package`` an imported dotted name is in (``__init__`` for the package's own names), or None."""
    if dotted[:2] != ["trioloop", package]:
        return None
    return dotted[2] if len(dotted) > 2 and dotted[2] in names else "__init__"


def module_graph(package: str) -> dict[str, set[str]]:
    """Which modules of ``package`` each of its modules imports (statically, anywhere in the module, type-only
    imports and imports inside functions included). ``from package import name`` depends on the module ``name``
    when there is one, else on the package's ``__init__``, whose names it takes."""
    names = {path.stem for path in (PACKAGE / package).glob("*.py")}
    home = ["trioloop", package]  # where a relative import starts from
    graph: dict[str, set[str]] = {}
    for path in modules(package):
        if path.parent != PACKAGE / package:
            continue
        found: list[list[str]] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [alias.name.split(".") for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (node.module or "").split(".") if not node.level else home[: len(home) - node.level + 1]
                if node.level and node.module:
                    base = [*base, *node.module.split(".")]
                found += [[*base, alias.name] for alias in node.names] if base == home else [base]
        targets = {_module_of(dotted, package, names) for dotted in found}
        graph[path.stem] = {target for target in targets if target is not None and target != path.stem}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def top_down(package: str) -> list[list[str]]:
    """The modules of ``package`` in levels, top first: a module imports only modules of the levels below it
    (``__init__`` aside: it gathers the package's names, so it stands on top of what it imports)."""
    graph = module_graph(package)
    assert import_circles(graph) == [], package
    level: dict[str, int] = {}

    def depth(module: str) -> int:
        if module not in level:
            level[module] = 1 + max((depth(dep) for dep in graph[module]), default=-1)
        return level[module]

    for module in graph:
        depth(module)
    highest = max(level.values(), default=0)
    return [sorted(m for m, d in level.items() if d == n) for n in range(highest, -1, -1)]


@pytest.mark.parametrize("package", packages())
def test_the_modules_of_a_package_import_each_other_without_circles(package: str) -> None:
    assert import_circles(module_graph(package)) == []


def test_the_circle_check_sees_a_circle(package_copy: Path) -> None:
    # Two modules of one package importing each other: one only for the type checker, the other inside a function
    # and relatively.
    assert import_circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    first, second = package_copy / "runtime" / "_circle_probe_a.py", package_copy / "runtime" / "_circle_probe_b.py"
    first.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trioloop.runtime._circle_probe_b import f\n",
        encoding="utf-8",
    )
    second.write_text("def f():\n    from . import _circle_probe_a\n", encoding="utf-8")
    try:
        assert ["_circle_probe_a", "_circle_probe_b"] in import_circles(module_graph("runtime"))
    finally:
        first.unlink()
        second.unlink()


#: Modules that may pass the size a reader takes in at once, and why.
LONG_MODULES = {"threatmodel/catalog.py": "data: the component catalog's entries, one per kind of element"}
MAX_MODULE_LINES = 500


def test_every_module_is_short_enough_to_read_whole() -> None:
    # DESIGN.md: a module over ~500 lines is split by job, not by size (a data table aside).
    long = {
        path.relative_to(PACKAGE).as_posix(): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert {name: n for name, n in long.items() if name not in LONG_MODULES} == {}
    assert set(LONG_MODULES) <= set(long), "a module listed in LONG_MODULES is short now: remove it from the list"
