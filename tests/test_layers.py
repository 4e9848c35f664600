"""The layering DESIGN.md fixes, checked on the source: who may import whom, no system tasks, and the
threat-model domain built only on what any other domain could use."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "trioloop"

#: The generic core and what it must never reach: a domain, a face, or a layer above it.
FORBIDDEN = {
    "loop": (
        "trioloop.threatmodel",
        "trioloop.ui",
        "trioloop.cli",
        "trioloop.tools",
        "trioloop.mcp",
        "trioloop.otel",
        "trioloop.lowlevel",
        "trioloop.stores",
    ),
    "protocol": (
        "trioloop.threatmodel",
        "trioloop.ui",
        "trioloop.cli",
        "trioloop.tools",
        "trioloop.mcp",
        "trioloop.otel",
        "trioloop.loop",
        "trioloop.providers",
        "trioloop.lowlevel",
        "trioloop.stores",
    ),
    "providers": (
        "trioloop.threatmodel",
        "trioloop.ui",
        "trioloop.cli",
        "trioloop.loop",
        "trioloop.tools",
        "trioloop.mcp",
        "trioloop.otel",
        "trioloop.stores",
    ),
    "tools": (
        "trioloop.threatmodel",
        "trioloop.ui",
        "trioloop.cli",
        "trioloop.mcp",
        "trioloop.otel",
        "trioloop.stores",
    ),
    # The journal stores implement the core's protocol and know nothing above it.
    "stores": (
        "trioloop.threatmodel",
        "trioloop.ui",
        "trioloop.cli",
        "trioloop.tools",
        "trioloop.mcp",
        "trioloop.providers",
        "trioloop.lowlevel",
    ),
}

#: Storage libraries the core never imports: it calls the journal-store protocol, and stores/ implements it.
STORAGE_LIBRARIES = ("sqlite3", "psycopg")


def modules(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every module an import statement in ``path`` names (relative imports resolved), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
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


def arrows(package: str) -> list[str]:
    found = []
    for path in modules(package):
        for line, name in imported(path):
            for banned in FORBIDDEN[package]:
                if name == banned or name.startswith(banned + "."):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_arrow_points_up_or_into_a_domain(package: str) -> None:
    assert modules(package), package
    assert arrows(package) == []


@pytest.mark.parametrize("package", ["loop", "protocol", "providers"])
def test_the_core_and_providers_import_no_opentelemetry(package: str) -> None:
    # Telemetry is an observer outside the core (trioloop.otel, an optional extra), never a dependency of it.
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in modules(package)
        for line, name in imported(path)
        if name == "opentelemetry" or name.startswith("opentelemetry.")
    ]
    assert found == []


@pytest.mark.parametrize("package", ["loop", "protocol"])
def test_the_core_imports_no_storage_library(package: str) -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in modules(package)
        for line, name in imported(path)
        if any(name == library or name.startswith(library + ".") for library in STORAGE_LIBRARIES)
    ]
    assert found == []


def test_the_checker_sees_a_forbidden_arrow(tmp_path: Path) -> None:
    # The walk must catch every spelling of an import, or the rule above proves nothing.
    for source in (
        "import trioloop.threatmodel.model\n",
        "from trioloop.threatmodel import ThreatModel\n",
        "from trioloop import threatmodel\n",
        "from ..threatmodel import model\n",
        "def f():\n    from trioloop.ui.qt import ReviewPanel\n",
    ):
        fake = PACKAGE / "loop" / "_layer_probe.py"
        fake.write_text(source, encoding="utf-8")
        try:
            found = arrows("loop")
        finally:
            fake.unlink()
        assert any("_layer_probe.py" in arrow for arrow in found), source


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
