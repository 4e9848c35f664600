"""Every public name has a docstring: each class and function a public module exports, and each public method
and property of those classes (issue 29: the API reference is generated from them)."""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Iterator
from typing import Any

import pytest

MODULES = (
    "trioloop",
    "trioloop.lowlevel",
    "trioloop.threatmodel",
    "trioloop.mcp",
    "trioloop.stores",
    "trioloop.audit",
    "trioloop.otel",
)


def _documented(value: Any) -> bool:
    return bool((getattr(value, "__doc__", None) or "").strip())


def _members(owner: type) -> Iterator[tuple[str, Any]]:
    for name, value in vars(owner).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            yield name, value.fget
        elif isinstance(value, classmethod | staticmethod):
            yield name, value.__func__
        elif inspect.isfunction(value):
            yield name, value


def undocumented(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    missing = []
    for name in getattr(module, "__all__", ()):
        value = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if not _documented(value):
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(value):
            missing.extend(f"{module_name}.{name}.{member}" for member, fn in _members(value) if not _documented(fn))
    return missing


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_says_what_it_does(module_name: str) -> None:
    assert undocumented(module_name) == []


def test_the_qt_panel_says_what_it_does_too() -> None:
    pytest.importorskip("PySide6")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    assert undocumented("trioloop.ui.qt") == [] and undocumented("trioloop.ui.qt_libraries") == []
