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
    outside = {"threatmodel", "mcp", "otel", "ui", "cli", "_data"}
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
    assert [m for m in loaded if _layer_of(m) in (*above, "tools", "threatmodel", "mcp", "otel", "ui", "cli")] == []
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


def test_the_checker_sees_a_forbidden_arrow() -> None:
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
            fake = PACKAGE / package / "_layer_probe.py"
            fake.write_text(source, encoding="utf-8")
            try:
                found = arrows(package)
            finally:
                fake.unlink()
            assert any("_layer_probe.py" in arrow for arrow in found), (package, source)


def test_the_checker_sees_an_impure_library() -> None:
    for source in ("import trio\n", "from time import monotonic\n", "import os.path\n", "from httpx import Client\n"):
        fake = PACKAGE / "machine" / "_layer_probe.py"
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
