"""Conditions on a call's canonical input, as approval rules hold them: a field found by its RFC 6901 JSON pointer,
compared by equality, one of, string glob, prefix or numeric range. Pure and total: a malformed condition is
refused when it is built (`RuleError`); evaluating one never raises, and a field the input lacks never holds."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final, final

import attrs

from trioloop.machine.globs import Glob, glob_regex

__all__ = ["Condition", "Match", "RuleError", "glob_regex", "json_equal", "resolve_pointer"]


class RuleError(ValueError):
    """A rule that cannot be built: a bad pointer, matcher, value or verdict (a file's loader names the line)."""


@final
class Match(enum.StrEnum):
    """How a condition compares an input field: ``equals`` (JSON equality: 1 == 1.0, true != 1), ``one_of``,
    ``glob`` and ``prefix`` (strings only), ``range`` (numbers only, bounds inclusive)."""

    EQUALS = "equals"
    ONE_OF = "one_of"
    GLOB = "glob"
    PREFIX = "prefix"
    RANGE = "range"


_MISSING: Final = object()


def _pointer_tokens(pointer: str) -> tuple[str, ...]:
    if type(pointer) is not str:
        raise RuleError(f"a JSON pointer must be a string, got {type(pointer).__name__}")
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise RuleError(f'the JSON pointer "{pointer}" must be empty or start with "/"')
    tokens = []
    for raw in pointer[1:].split("/"):
        if re.search(r"~(?![01])", raw):
            raise RuleError(f'the JSON pointer "{pointer}" has a "~" that is not "~0" or "~1"')
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def resolve_pointer(value: Any, tokens: Sequence[str]) -> Any:
    """The value ``tokens`` (a parsed RFC 6901 pointer) names in ``value``, or a private marker when it names
    nothing (an array index is decimal digits without a leading zero; ``-`` names nothing)."""
    for token in tokens:
        if type(value) is dict:
            value = value.get(token, _MISSING)
            if value is _MISSING:
                return _MISSING
        elif type(value) is list:
            if not token.isascii() or not token.isdigit() or (len(token) > 1 and token[0] == "0"):
                return _MISSING
            index = int(token)
            if index >= len(value):
                return _MISSING
            value = value[index]
        else:
            return _MISSING
    return value


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0, as canonical JSON writes both "1"), booleans only equal to
    booleans, objects by keys and values, arrays in order. Never raises for JSON values, however deep (it walks
    them with a stack of its own, not by recursion)."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if _is_number(x) and _is_number(y):
            if x != y:
                return False
        elif type(x) is not type(y):
            return False
        elif type(x) is dict:
            if x.keys() != y.keys():
                return False
            pending.extend((x[key], y[key]) for key in x)
        elif type(x) is list:
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


#: The deepest value a condition may compare with: a rule is journaled with every turn, and a journal's entries
#: are read back only up to a depth of their own (`trioloop.durable.journal.MAX_ENTRY_DEPTH`).
MAX_VALUE_DEPTH: Final = 64


def _depth(value: Any) -> int:
    """How deeply ``value`` nests (a scalar: 0), walked with a stack of its own, stopping past `MAX_VALUE_DEPTH`."""
    deepest = 0
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if type(item) in (dict, list, tuple):
            depth += 1
            deepest = max(deepest, depth)
            if depth > MAX_VALUE_DEPTH:
                return depth
            pending.extend((child, depth) for child in (item.values() if type(item) is dict else item))
    return deepest


def _checked_json(value: Any, where: str) -> Any:
    """`_json_value`, for a value nested no deeper than `MAX_VALUE_DEPTH` (deeper: `RuleError`)."""
    if _depth(value) > MAX_VALUE_DEPTH:
        raise RuleError(f"{where}: the value is nested too deeply (more than {MAX_VALUE_DEPTH} levels)")
    return _json_value(value, where)


def _json_value(value: Any, where: str) -> Any:
    """``value`` if it is a JSON value (lists for arrays), else `RuleError`; tuples become lists."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise RuleError(f"{where}: a number must be finite")
        return value
    if type(value) in (list, tuple):
        return [_json_value(v, where) for v in value]
    if type(value) is dict:
        if not all(type(k) is str for k in value):
            raise RuleError(f"{where}: object keys must be strings")
        return {k: _json_value(v, where) for k, v in value.items()}
    raise RuleError(f"{where}: {type(value).__name__} is not a JSON value")


def _range_bound(value: Any, where: str) -> int | float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or value != value or value in (float("inf"), float("-inf")):
        raise RuleError(f"{where}: a range bound must be a finite number")
    return value  # type: ignore[no-any-return]


@final
@attrs.frozen(kw_only=True)
class Condition:
    """One test on the canonical input: the field at ``pointer`` (RFC 6901; "" is the whole input) compared by
    ``match`` with ``value`` (for ``one_of`` a list of values, for ``range`` a ``(min, max)`` pair, either None).

    Build them with `Condition.equals`, `one_of`, `glob`, `prefix` and `in_range`; a malformed one raises
    `RuleError` when it is built, never when it is evaluated.
    """

    pointer: str
    match: Match
    value: Any
    _tokens: tuple[str, ...] = attrs.field(init=False, repr=False, eq=False)
    _glob: Glob | None = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        try:
            match = Match(self.match)
        except ValueError:
            raise RuleError(f'unknown matcher "{self.match}" (one of: {", ".join(m.value for m in Match)})') from None
        object.__setattr__(self, "match", match)
        object.__setattr__(self, "_tokens", _pointer_tokens(self.pointer))
        where = f'condition on "{self.pointer}"'
        glob = None
        value = self.value
        if match is Match.EQUALS:
            value = _checked_json(value, where)
        elif match is Match.ONE_OF:
            if type(value) not in (list, tuple) or not value:
                raise RuleError(f"{where}: one_of needs a non-empty list of values")
            value = tuple(_checked_json(v, where) for v in value)
        elif match in (Match.GLOB, Match.PREFIX):
            if type(value) is not str:
                raise RuleError(f"{where}: {match.value} needs a string")
            if match is Match.GLOB:
                glob = Glob(value)
        else:
            if type(value) not in (list, tuple) or len(value) != 2:
                raise RuleError(f"{where}: range needs [min, max] (either may be null)")
            low, high = _range_bound(value[0], where), _range_bound(value[1], where)
            if low is None and high is None:
                raise RuleError(f"{where}: range needs a min, a max or both")
            if low is not None and high is not None and low > high:
                raise RuleError(f"{where}: range min {low} is above max {high}")
            value = (low, high)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "_glob", glob)

    @classmethod
    def equals(cls, pointer: str, value: Any) -> Condition:
        """The field equals ``value``, as JSON compares (1 == 1.0; true is not 1)."""
        return cls(pointer=pointer, match=Match.EQUALS, value=value)

    @classmethod
    def one_of(cls, pointer: str, values: Iterable[Any]) -> Condition:
        """The field equals one of ``values``."""
        return cls(pointer=pointer, match=Match.ONE_OF, value=tuple(values))

    @classmethod
    def glob(cls, pointer: str, pattern: str) -> Condition:
        """The field is a string ``pattern`` matches whole (``*``, ``?`` within a path segment, ``**`` across)."""
        return cls(pointer=pointer, match=Match.GLOB, value=pattern)

    @classmethod
    def prefix(cls, pointer: str, text: str) -> Condition:
        """The field is a string starting with ``text``."""
        return cls(pointer=pointer, match=Match.PREFIX, value=text)

    @classmethod
    def in_range(cls, pointer: str, min: float | None = None, max: float | None = None) -> Condition:
        """The field is a number (not a boolean) from ``min`` to ``max``, both included; either may be None."""
        return cls(pointer=pointer, match=Match.RANGE, value=(min, max))

    def holds(self, canonical: Any) -> bool:
        """Whether the field holds; a missing field, or one of the wrong type, does not (nor does any field of a
        call whose tool gave no canonical input: None). Never raises."""
        if canonical is None:
            return False
        field = resolve_pointer(canonical, self._tokens)
        if field is _MISSING:
            return False
        match = self.match
        if match is Match.EQUALS:
            return json_equal(field, self.value)
        if match is Match.ONE_OF:
            return any(json_equal(field, v) for v in self.value)
        if match is Match.GLOB:
            return type(field) is str and self._glob is not None and self._glob.matches(field)
        if match is Match.PREFIX:
            return type(field) is str and field.startswith(self.value)
        if type(field) not in (int, float):
            return False
        low, high = self.value
        return (low is None or field >= low) and (high is None or field <= high)

    @property
    def tokens(self) -> tuple[str, ...]:
        """The pointer, parsed (what `resolve_pointer` takes)."""
        return self._tokens

    def string_pattern(self) -> str | None:
        """A regular expression that fully matches exactly the string fields this condition holds for, when it holds
        for strings only (glob, prefix, equals a string, one of strings); None otherwise. What lets a rule set test
        many such conditions on one field with one match (`trioloop.machine.rule_index`)."""
        match, value = self.match, self.value
        if match is Match.GLOB:
            glob = self._glob
            return None if glob is None or glob.regex is None else str(glob.regex.pattern)  # one star at most
        if match is Match.PREFIX:
            return re.escape(str(value)) + ".*"
        if match is Match.EQUALS and type(value) is str:
            return re.escape(str(value))
        if match is Match.ONE_OF and all(type(v) is str for v in value):
            return "|".join(f"(?:{re.escape(v)})" for v in value)
        return None

    def describe(self) -> str:
        """The condition as a person reads it: ``path docs/**``, ``mode one of "a", "b"``, ``size 1..10``."""
        field = self.pointer.lstrip("/") or "input"
        if self.match is Match.EQUALS:
            return f"{field} = {_shown(self.value)}"
        if self.match is Match.ONE_OF:
            return f"{field} one of {', '.join(_shown(v) for v in self.value)}"
        if self.match is Match.GLOB:
            return f"{field} {self.value}"
        if self.match is Match.PREFIX:
            return f"{field} starts with {self.value}"
        low, high = self.value
        return f"{field} {'' if low is None else low}..{'' if high is None else high}"

    def to_json(self) -> dict[str, Any]:
        """The condition as the journal and session files record it."""
        value = list(self.value) if type(self.value) is tuple else self.value
        return {"pointer": self.pointer, "match": self.match.value, "value": value}


_SHOWN_MAX: Final = 60


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, sort_keys=True)  # no bidi control hides in it
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 1] + "…"
