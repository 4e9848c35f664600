"""The API reference (docs/reference/) is split by area, and the split drops nothing: every public name of
``trioloop`` is documented on exactly one page, and each page opens with a table of the names it documents.

A page documents names with mkdocstrings blocks (``::: dotted.path``). A block naming one object documents that
object; a block naming a module documents the classes and functions of its ``__all__`` (mkdocstrings shows a
module's members that have a docstring, and a constant or type alias has none it can read, so those need a
block of their own). A name ``trioloop`` re-exports from ``trioloop.threatmodel`` counts as documented where the
threat model's page documents it.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import trioloop

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
_BLOCK = re.compile(r"^::: (?P<target>[\w.]+)\s*$", re.M)
#: Pages whose table this test does not hold: the Qt panel's page is kept with the Qt face.
_NOT_HELD = {"ui-qt.md"}


def _resolve(target: str) -> Any:
    """The object a ``::: target`` block names: a module, or an attribute of the longest importable prefix."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            value = getattr(value, part)
        return value
    raise AssertionError(f"::: {target} names nothing importable")


def _module_members(module: ModuleType) -> list[str]:
    """The names a whole-module block shows: the classes and functions of the module's ``__all__``."""
    return [
        name
        for name in getattr(module, "__all__", ())
        if inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name))
    ]


def documented(page: Path) -> dict[str, Any]:
    """The dotted names a page's mkdocstrings blocks document, with the objects they name."""
    names: dict[str, Any] = {}
    for target in _BLOCK.findall(page.read_text(encoding="utf-8")):
        value = _resolve(target)
        if inspect.ismodule(value):
            names.update({f"{target}.{name}": getattr(value, name) for name in _module_members(value)})
        else:
            names[target] = value
    return names


def _api_pages() -> list[Path]:
    return sorted(page for page in REFERENCE.glob("*.md") if _BLOCK.search(page.read_text(encoding="utf-8")))


def _first_cells(intro: str) -> list[str]:
    return [row.split("|")[1] for row in intro.splitlines() if row.startswith("|") and row.count("|") >= 3]


def test_every_public_name_is_documented_on_exactly_one_reference_page() -> None:
    pages: dict[str, list[str]] = defaultdict(list)
    for page in _api_pages():
        if page.name in _NOT_HELD:  # trioloop.ui.qt: no name of trioloop's own lives there
            continue
        for dotted, value in documented(page).items():
            module, _, name = dotted.rpartition(".")
            if module == "trioloop" or (
                module == "trioloop.threatmodel" and name in trioloop.__all__ and getattr(trioloop, name) is value
            ):
                pages[name].append(page.name)
    public = [name for name in trioloop.__all__ if name != "__version__"]  # a string, named in prose
    assert {name: pages.get(name, []) for name in public if len(pages.get(name, [])) != 1} == {}
    assert set(pages) <= set(public), "a page documents a trioloop name that is not public"


def test_the_old_single_page_is_gone_and_no_block_documents_all_of_trioloop() -> None:
    assert not (REFERENCE / "trioloop.md").exists()
    for page in _api_pages():
        assert "trioloop" not in _BLOCK.findall(page.read_text(encoding="utf-8")), page.name


@pytest.mark.parametrize("page", [p for p in _api_pages() if p.name not in _NOT_HELD], ids=lambda p: p.name)
def test_a_reference_page_opens_with_a_table_of_its_names(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    first_block = _BLOCK.search(text)
    assert first_block is not None
    intro = text[: first_block.start()]
    assert re.search(r"^\| name \| what it is for \|$", intro, re.M), f"{page.name}: no table before the first block"
    listed = {name for cell in _first_cells(intro) for name in re.findall(r"`(\w+)`", cell)}
    names = [dotted.rpartition(".")[2] for dotted in documented(page)]
    assert [name for name in names if name not in listed] == [], f"{page.name}: documented but not in its table"
    rows = [row for row in intro.splitlines() if re.match(r"^\| \[?`", row)]
    assert len(rows) >= len(names) / 5, "a row per name, or per a few related names"
    assert all(row.count("|") == 3 and row.split("|")[2].strip() for row in rows), "one line each: what it is for"
