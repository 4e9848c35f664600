"""Names a package exports without importing them: each loads from its home module on first use (PEP 562).

A package lists its names twice: imported under ``TYPE_CHECKING`` (what type checkers and the docs read) and in
a table of homes (what loads them at run time); `tests/test_exports.py` holds the two to each other.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any], **computed: Callable[[], object]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose globals are ``namespace``: a name in ``homes``
    is imported from its home module, one in ``computed`` is computed, each once (then kept in ``namespace``)."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home), name)
        elif name in computed:
            value = computed[name]()
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value  # the next lookup is a plain module attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes, *computed})

    return __getattr__, __dir__
