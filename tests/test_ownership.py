"""Each part owns its state: no code of trioloop reads or writes another object's private attributes.

An attribute whose name starts with one underscore, read or written on anything but ``self`` or ``cls``, is a
reach into another object's privates: the reader depends on fields no type checker connects to it. DESIGN.md
("Ownership") asks each part to be given, at construction, the narrow things it needs, and to tell its owner
something through a small interface, never by writing the owner's fields. The few reaches left are listed below,
each where a class builds, compares or copies another instance of itself; any other one fails here.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trioloop"

#: The reaches that stay: (module, expression) -> how many. Each is a class building another instance of itself.
ALLOWED: dict[tuple[str, str], int] = {
    # An MCP toolset's tools and its client's notice handler reach the toolset through a weak reference (no
    # reference cycle between the toolset and what it holds), then call its own method.
    ("mcp/toolset.py", "alive._call"): 1,
    ("mcp/toolset.py", "alive._on_server_message"): 1,
    # Session.open makes a Session, then restores into it what the journal recorded (undo history, turn numbering,
    # tokens, the live turn) and attaches the journal it opened.
    ("runtime/session.py", "session._restore"): 1,
    ("runtime/session.py", "session._attach"): 1,
    # SessionForks._continued does the same for Session.resume (a saved file) and Session.fork (the source's state
    # after a settled turn), which then attaches the fork's new journal.
    ("runtime/session_fork.py", "session._restore"): 1,
    ("runtime/session_fork.py", "session._attach"): 1,
    # ToolExecutionContext.deferred makes a context whose document is made on first read (no __init__ argument).
    ("runtime/tools.py", "context._fill"): 1,
}


def reaches(source: str) -> list[tuple[int, str]]:
    """Every ``x._name`` in ``source`` whose ``x`` is not ``self`` or ``cls`` (dunder names aside), with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def all_reaches() -> Counter[tuple[str, str]]:
    counted: Counter[tuple[str, str]] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for _, expression in reaches(path.read_text(encoding="utf-8")):
            counted[(where, expression)] += 1
    return counted


def per_package(counted: Counter[tuple[str, str]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for (where, _), n in counted.items():
        totals[where.split("/")[0] if "/" in where else where] += n
    return dict(totals)


def test_no_part_reaches_into_another_objects_privates() -> None:
    counted = all_reaches()
    new = {key: n for key, n in counted.items() if n > ALLOWED.get(key, 0)}
    assert new == {}, f"{sum(new.values())} new reaches (per package: {per_package(Counter(new))})"


def test_the_allowed_reaches_are_still_there() -> None:
    # An entry that no longer matches anything is removed from ALLOWED, so the list says what the code does.
    counted = all_reaches()
    assert {key: n for key, n in ALLOWED.items() if counted.get(key, 0) != n} == {}


def test_the_counter_sees_every_spelling_of_a_reach() -> None:
    source = (
        "class A:\n"
        "    def f(self, other):\n"
        "        other._x = 1\n"
        "        self._y = other._z\n"
        "        self._w._v()\n"
        "        cls = type(self); cls._k\n"
        "        return self.__dict__, obj.__class__, A._table\n"
    )
    assert sorted(expr for _, expr in reaches(source)) == ["A._table", "other._x", "other._z", "self._w._v"]
