"""Globs as approval rules write them: ``**`` any run of characters, ``*`` any run without ``/``, ``?`` one character
other than ``/``, ``\\`` before a character makes it literal, everything else literally; a glob matches a whole string.

A glob with at most one star becomes a regular expression (matched in time linear in the text). One with more
stars is matched without backtracking, by following every position of the pattern at once (bit-parallel, one step
per character of the text): a regular expression for ``**a**a**a**b`` takes time exponential in the number of
stars on a long text that nearly matches, and a rule file a repository brings must not be able to stall the turn.
"""

from __future__ import annotations

import re
from typing import Final, final

__all__ = ["Glob", "glob_regex"]

_LIT: Final = "lit"
_ONE: Final = "one"
_STAR: Final = "star"
_ANY: Final = "any"  # **


def _tokens(pattern: str) -> list[tuple[str, str]]:
    """The pattern's tokens, each run of stars made one (``**`` when any of them is)."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            kind, text, i = _ANY, "", i + 2
        elif pattern[i] == "*":
            kind, text, i = _STAR, "", i + 1
        elif pattern[i] == "?":
            kind, text, i = _ONE, "", i + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            kind, text, i = _LIT, pattern[i + 1], i + 2
        else:
            kind, text, i = _LIT, pattern[i], i + 1
        if kind in (_STAR, _ANY) and tokens and tokens[-1][0] in (_STAR, _ANY):
            if kind == _ANY:
                tokens[-1] = (_ANY, "")
            continue
        tokens.append((kind, text))
    return tokens


_REGEX: Final = {_ANY: ".*", _STAR: "[^/]*", _ONE: "[^/]"}


def _regex_source(tokens: list[tuple[str, str]]) -> str:
    return "".join(re.escape(text) if kind == _LIT else _REGEX[kind] for kind, text in tokens)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` as a regular expression matching whole strings (see the module; for a glob of at most one star,
    or a text known to be short: `Glob` matches any glob in linear time)."""
    return re.compile(_regex_source(_tokens(pattern)), re.DOTALL)


@final
class Glob:
    """One compiled glob: `matches` says whether it matches a whole string, in time linear in the string."""

    __slots__ = ("_any", "_by_char", "_end", "_lits", "_one", "_star", "pattern", "regex")

    def __init__(self, pattern: str) -> None:
        tokens = _tokens(pattern)
        self.pattern = pattern
        stars = sum(1 for kind, _ in tokens if kind in (_STAR, _ANY))
        #: The regular expression, for a glob of at most one star (None otherwise): what a rule set may join.
        self.regex: re.Pattern[str] | None = re.compile(_regex_source(tokens), re.DOTALL) if stars <= 1 else None
        self._lits: dict[str, int] = {}
        self._one = self._star = self._any = 0
        for position, (kind, text) in enumerate(tokens):
            bit = 1 << position
            if kind == _LIT:
                self._lits[text] = self._lits.get(text, 0) | bit
            elif kind == _ONE:
                self._one |= bit
            elif kind == _STAR:
                self._star |= bit
            else:
                self._any |= bit
        self._end = 1 << len(tokens)
        self._by_char: dict[str, int] = {}

    def matches(self, text: str) -> bool:
        """Whether the glob matches the whole of ``text``."""
        if self.regex is not None:
            return self.regex.fullmatch(text) is not None
        stars = self._star | self._any
        state = 1
        state |= (state & stars) << 1
        by_char, lits, one, star, any_ = self._by_char, self._lits, self._one, self._star, self._any
        for char in text:
            moves = by_char.get(char)
            if moves is None:
                moves = lits.get(char, 0) | (one if char != "/" else 0)
                if len(by_char) < 256:
                    by_char[char] = moves
            stay = state & (any_ | (star if char != "/" else 0))
            state = ((state & moves) << 1) | stay
            state |= (state & stars) << 1  # a star may match nothing (no two stars are adjacent)
            if not state:
                return False
        return bool(state & self._end)
