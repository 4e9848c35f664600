"""Persistent values for what grows during a turn: each version shares its prefix with the one it grew from,
so one more item costs O(1) instead of a copy of everything before it (a long streamed answer, a flood of
violations, many calls); the tuples callers read are built once, on first access.

Each is one list shared by the versions of a line plus the length a version reads, and each version is made
whole by its constructor: no version reads or writes another's fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any, Generic, TypeVar, final, overload

__all__ = ["Log", "TextRun", "cached"]

T = TypeVar("T")
_Owner = TypeVar("_Owner")


class cached(Generic[_Owner, T]):  # lower case: a decorator, like functools.cached_property
    """A value computed on the first read and kept in the instance ``__dict__``, then read from there.

    ``functools.cached_property`` without its per-read lock (Python 3.11 takes one on every first read;
    3.12 dropped it): states are immutable and the computation pure, so two threads racing here would
    only store equal values. The descriptor defines no ``__set__``, so once stored the instance's entry
    is found first and the descriptor is not called again.
    """

    def __init__(self, compute: Callable[[_Owner], T]) -> None:
        self._compute = compute
        self._name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> cached[_Owner, T]: ...

    @overload
    def __get__(self, instance: _Owner, owner: type[Any]) -> T: ...

    def __get__(self, instance: _Owner | None, owner: type[Any]) -> T | cached[_Owner, T]:
        if instance is None:
            return self
        value = self._compute(instance)
        instance.__dict__[self._name] = value
        return value


@final
class Log(Generic[T]):
    """A persistent append-only sequence: ``append`` is O(1) amortized and shares every earlier item.

    Versions grown one from another share one list; only the newest (the tip) extends it, and each version
    reads only its first ``len`` items, so an older log never sees a later item (appending to an older
    version copies its prefix: a branch). ``items`` materializes the tuple once per log value. As with
    `TextRun`, a version holds no reference to the one it grew from: a long log keeps one list alive, not one
    tracked object per item.
    """

    __slots__ = ("_items", "_size", "_tuple")

    _items: list[T]
    _size: int
    _tuple: tuple[T, ...] | None

    def __init__(self, items: list[T] | None = None, size: int = 0) -> None:
        """The log of the first ``size`` of ``items`` (a list versions share); with no argument, the empty log.

        Positional: a keyword call costs about 100 ns more on Python 3.11, and a log grows per item.
        """
        self._items = [] if items is None else items
        self._size = size
        self._tuple = None

    def append(self, item: T) -> Log[T]:
        items = self._items
        if not self._size:
            items = []  # every log starts a list of its own (the shared empty log is never grown)
        elif len(items) != self._size:
            items = items[: self._size]  # a branch: a list of its own
        items.append(item)
        return Log(items, self._size + 1)

    def __len__(self) -> int:
        return self._size

    @property
    def items(self) -> tuple[T, ...]:
        if self._tuple is None:
            items = self._items
            self._tuple = tuple(items) if len(items) == self._size else tuple(items[: self._size])
        return self._tuple

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Log):
            return NotImplemented
        return self is other or (self._size == len(other) and self.items == other.items)

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"Log({list(self.items)!r})"


@final
class TextRun:
    """A response's streamed text as a persistent append-only run of pieces: ``append`` is O(1) amortized.

    Versions grown one from another share one list; only the newest (the tip) extends it, and each version
    reads only its first ``len`` pieces, so an older state never sees a later delta (appending to an older
    version copies its prefix: a branch, which the reducer never makes). Unlike a chain of nodes, a version
    holds no reference to the one it grew from: a long answer keeps one list and its strings (which the
    garbage collector does not track) alive, not one tracked object per delta.
    """

    __slots__ = ("_pieces", "_size")

    _pieces: list[str]
    _size: int

    def __init__(self, pieces: list[str] | None = None, size: int = 0) -> None:
        """The run of the first ``size`` of ``pieces`` (a list versions share); with no argument, the empty run.

        Positional, as `Log`'s: a run grows per streamed delta.
        """
        self._pieces = [] if pieces is None else pieces
        self._size = size

    def append(self, text: str) -> TextRun:
        pieces = self._pieces
        if not self._size:
            pieces = []  # every run starts a list of its own (the shared empty run is never grown)
        elif len(pieces) != self._size:
            pieces = pieces[: self._size]  # a branch: a list of its own
        pieces.append(text)
        return TextRun(pieces, self._size + 1)

    def __len__(self) -> int:
        return self._size

    @property
    def items(self) -> tuple[str, ...]:
        return tuple(islice(self._pieces, self._size))

    def joined(self) -> str:
        return "".join(islice(self._pieces, self._size))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TextRun):
            return NotImplemented
        return self is other or (self._size == len(other) and self.items == other.items)

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"TextRun({list(self.items)!r})"
