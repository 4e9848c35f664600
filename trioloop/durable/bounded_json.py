"""Strict JSON whose reading takes at most a constant times the text's size in memory.

`parse_bounded_json(data, max_bytes=..., max_depth=..., error=...)` returns the one JSON value in
``data`` and raises ``error(message)``, never anything else, for: more than ``max_bytes`` bytes
(UTF-8), bytes that are not UTF-8, text that is not JSON, NaN and Infinity, a number too large for
a float (``1e999`` would silently become ``inf``), a key repeated within one object, nesting deeper
than ``max_depth``, and a text whose Python objects would take more than ``MEMORY_RATIO`` times its
size plus ``MEMORY_ALLOWANCE`` bytes. Messages name the text (``subject``) and never echo it.

Why a budget: ``json.loads`` turns 3 bytes (``{},``) into a 64-byte dict and an 8-byte list slot,
so a 2.9 MiB file of a million empty objects costs it about 70 MiB, and 3.2 MiB of ``{"a":0},``
about 77 MiB, before anything can look at what was read.

How: before parsing, a census prices what the parse would build. One compiled regex finds the
tokens (string literals whole, so nothing inside them counts; possessive quantifiers, so the scan
is linear and the regex engine keeps no backtracking stack) and a loop adds up their prices as
CPython 3.11 (64-bit) lays the objects out, measured with tracemalloc: a dict 64 bytes plus its
key table as it grows (120 bytes for up to 5 keys, 208 up to 10, ... about 40 a key), a list 56
plus its slots as they grow (4, 8, 16, 24, ... then by an eighth), a str 49 plus a byte a character
(80 plus 2 or 4 a character when the literal holds a character or ``\\u`` escape past ASCII), a
number 32 (more for a long int), each distinct key once (the parser keeps one copy of each key, in
a memo that grows like a dict), the decoded ``str`` of a bytes input, and the largest transient
(a dict's old key table while it grows; the buffer of the string being built, over-allocated by a
quarter and copied when a wider character turns up). The census stops, and the text is refused,
as soon as the total passes the budget, and it refuses nesting deeper than ``max_depth`` before
parsing, so it holds at most the decoded text, one match at a time and the distinct keys (priced
in the total). The parse then runs without hooks on objects (no pair lists), and a key repeated in
one object shows as a dict with fewer entries than the census counted keys; one iterative walk
(a stack of at most ``max_depth`` iterators) counts them.

Measured on CPython 3.11 (tracemalloc peak during the call over ``len(data)``, bytes input, through
`trioloop.durable.session_file.decode_session`; in brackets, the decoder before this module:
``json.loads`` with a pairs hook, then a depth walk). Refused: a million ``{}`` (2.9 MiB) 1.0
(46.6), a million ``[]`` 1.0 (44.0), 400,000 ``{"a":0}`` 1.0 (33.0), a million ``"ab"`` 1.0
(25.8), 300,000 distinct keys 7.1 (16.8: the census holds the distinct keys until it refuses),
100,000-deep ``[`` 1.0 (1.3), 100,000 ``1e999999`` 1.0 (11.6, and they were read as ``inf``). Read:
a million ``""`` 3.8 (25.3; ``""`` is a shared object, so only the list slots), a session file of
3,000 turns with tool calls 5.4 (6.5), six documents of 1.9 MB 2.4 (2.4). tests/test_bounded_json.py
and tests/test_session_file.py assert ``peak <= 8 * len(data) + 1 MiB`` for such inputs, and that
the price bounds what the parse holds for any JSON value.

What that means for legitimate files: a session file `encode_session` wrote (indented, ASCII) is
priced at about 5.6 times its size (4.6 for its objects, 1 for the decoded text), so it reads with
30% of the budget to spare; a document is a string, priced at about its length. Compact JSON of
many small objects really costs about 8.5 times its size and is refused above about 2 MiB. Raw
non-ASCII text costs more than the same text written with ``ensure_ascii=True`` (its decoded
``str`` takes 2 or 4 bytes for every character), so write what this reads with
``ensure_ascii=True``, as `trioloop.durable.session_file` does. Time: the census is a Python loop over
the tokens, about 0.2 microseconds each (a 2.6 MiB session file: 0.37 s to decode, 0.18 s before);
a text without strings is priced from counts of its brackets, commas and dots at C speed.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from itertools import accumulate, repeat
from operator import attrgetter
from typing import Any, Final, NoReturn

__all__ = ["MEMORY_ALLOWANCE", "MEMORY_RATIO", "parse_bounded_json"]

#: Reading a text may take this many times its size in bytes of memory ...
MEMORY_RATIO: Final = 8
#: ... plus this many bytes, so that no small text is refused for its shape.
MEMORY_ALLOWANCE: Final = 1 << 20

# Prices in bytes (CPython 3.11, 64-bit; tracemalloc counts each allocation's requested size).
_DICT: Final = 64  # an empty dict; its key table is priced as it grows (_DICT_GROWTH)
_LIST: Final = 56  # an empty list; its slots are priced as they grow (_LIST_GROWTH)
_STR: Final = 49  # an ASCII str's header, plus a byte a character
_WIDE_STR: Final = 80  # a str holding a character past ASCII, plus 1, 2 or 4 bytes a character
_NUMBER: Final = 32  # an int (28 up to 9 digits, 4 more per 9 digits) or a float (24); 0..99 are free (shared)
_PARSER: Final = 16 * 1024  # the decoder, its scanner and memo, the walk's stack, the exception on a refusal


def _dict_table(log2_size: int) -> int:
    """Bytes of a dict's key table with str keys (CPython 3.11 ``PyDictKeysObject``)."""
    size = 1 << log2_size
    index_bytes = 1 if log2_size < 8 else 2 if log2_size < 16 else 4 if log2_size < 32 else 8
    return 32 + size * index_bytes + (2 * size // 3) * 16


def _dict_growth() -> dict[int, tuple[int, int]]:
    """key count -> (bytes added, bytes of the old table held while the new one fills) when it grows."""
    growth = {1: (_dict_table(3), 0)}
    for log2_size in range(3, 48):
        usable = 2 * (1 << log2_size) // 3  # a full table doubles on the next insert
        growth[usable + 1] = (_dict_table(log2_size + 1) - _dict_table(log2_size), _dict_table(log2_size))
    return growth


def _list_growth() -> dict[int, int]:
    """element count -> bytes added when a list grows by appends (``list_resize``)."""
    growth: dict[int, int] = {}
    capacity = 0
    while capacity < 1 << 48:
        size = capacity + 1
        new = (size + (size >> 3) + 6) & ~3
        growth[size] = 8 * (new - capacity)
        capacity = new
    return growth


_DICT_GROWTH: Final = _dict_growth()
_LIST_GROWTH: Final = _list_growth()

# One JSON token a match; the kind is the index of the last group that took part (Match.lastindex):
# 1 a string value (group 1 is its body), 2 a key (a string followed by a colon), 3 an object, 4 an
# array, 5 the end of either, 6 a number, 7 true/false/null. String literals are matched whole, an
# unterminated one running to the end of the text, so no search starts inside one. Possessive
# quantifiers (*+) keep the regex engine's own memory flat: (?:[^"\\]|\\.)* would need ~100 bytes
# of backtracking stack per character of a long string.
_WS = r"[ \t\n\r]*+"
_BODY = r'[^"\\]*+(?:\\.[^"\\]*+)*+'
_TOKENS: Final = re.compile(
    rf'"({_BODY})(?:"{_WS}(:)|"|\\?\Z)|(\{{)|(\[)|([\]}}])|(-?[0-9])[0-9.eE+-]*+|([tfn])', re.DOTALL
)
_STRING, _KEY, _OBJECT, _ARRAY, _END, _NUMBER_TOKEN = range(1, 7)
# Every string literal, whole, and the colon after it if it is a key (for a text of valid JSON).
_STRING_ENDS: Final = re.compile(rf'"{_BODY}"{_WS}(:?)', re.DOTALL)
#: The most memory ``json.loads`` builds per byte of text, with a margin: a list of empty objects, the worst
#: shape, takes 24 bytes a byte (``{},``: a 64-byte dict and an 8-byte list slot).
_WORST_RATIO: Final = 48
#: A text at most this long cannot be priced past its budget whatever it holds, so it is read without the
#: census (25 KiB: a journal's entries and a small document; the census costs about 0.2 µs a token).
SMALL_TEXT_BYTES: Final = (MEMORY_ALLOWANCE - _PARSER) // (_WORST_RATIO - MEMORY_RATIO)
_DEPTH_STEP: Final = (0, 0, 0, 1, 1, -1, 0, 0)  # by kind
_BRACKET_STEP: Final = {"{": 1, "[": 1, "}": -1, "]": -1}  # by character, in a text without strings
# What makes a parsed str non-ASCII (1 byte a character still), 2 or 4 bytes a character: a \\uXXXX
# escape for such a character (a surrogate escape may pair up into 4 bytes) or the raw character.
# Two patterns, not one alternation: that would lose the regex engine's fast search for "\\u".
_NEEDS: Final = {
    1: (re.compile(r"\\u(?!00[0-7])"), re.compile(r"[^\x00-\x7f]")),
    2: (re.compile(r"\\u(?!00)"), re.compile(r"[^\x00-\xff]")),
    4: (re.compile(r"\\u[dD][89abAB]"), re.compile(r"[^\x00-\uffff]")),
}

_kind = attrgetter("lastindex")


class _Refusal(Exception):
    """Raised inside this module (and json.loads's hooks); becomes the caller's error type."""


def parse_bounded_json(
    data: bytes | bytearray | str,
    *,
    max_bytes: int,
    max_depth: int,
    error: type[ValueError],
    subject: str = "the JSON text",
) -> Any:
    """The JSON value in ``data``; raises ``error(message)`` for anything this module refuses.

    ``subject`` names the text in messages (``"the session file"``). Bytes must be UTF-8 (no byte
    order mark); a ``str`` is measured by its UTF-8 length.
    """
    try:
        text, size = _text(data, max_bytes, subject)
        if size <= SMALL_TEXT_BYTES:
            try:
                return _parse_small(text, max_depth, subject)
            except _Refusal:
                pass  # refused: the census says why, in the words it always uses
        keys, _ = _census(
            text,
            base=_PARSER + (sys.getsizeof(text) if text is not data else 0),
            budget=MEMORY_RATIO * size + MEMORY_ALLOWANCE,
            max_depth=max_depth,
            subject=subject,
        )
        value = _parse(text, subject)
        if _entries(value, max_depth, subject) != keys:
            raise _Refusal(f"{subject} repeats a key in one object")
    except _Refusal as refusal:
        raise error(str(refusal)) from None
    return value


def _parse_small(text: str, max_depth: int, subject: str) -> Any:
    """A text too short to build past the budget, whatever it holds, read without the census: its keys are
    counted by one scan in C (outside a string, a quote only opens one, so matching each string whole finds
    them all, a key being a string followed by a colon), the parse and the walk check the rest."""
    keys = _STRING_ENDS.findall(text).count(":")
    value = _parse(text, subject)
    if _entries(value, max_depth, subject) != keys:
        raise _Refusal(f"{subject} repeats a key in one object")
    return value


def _text(data: bytes | bytearray | str, max_bytes: int, subject: str) -> tuple[str, int]:
    if isinstance(data, str):
        size = len(data)
        if size <= max_bytes and not data.isascii():
            size = len(data.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise _Refusal(f"{subject} is larger than {max_bytes} bytes")
        return data, size
    if not isinstance(data, bytes | bytearray):
        raise _Refusal(f"{subject} must be bytes or text, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise _Refusal(f"{subject} is larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8"), len(data)
    except UnicodeDecodeError:
        raise _Refusal(f"{subject} is not UTF-8 text") from None


def _census(text: str, *, base: int, budget: int, max_depth: int, subject: str) -> tuple[int, int]:
    """Price what ``json.loads(text)`` would build; refuse past ``budget`` or ``max_depth``.

    Returns the number of keys and the price (``base`` included). Up to the first place where the
    text stops being JSON (where the parser stops) the tokens are exactly the parser's, so the total
    bounds what it builds there. Totals are floats (exact below 2**53): an int past 256 is a new
    object at every addition, a float comes from a free list, so the loop allocates little besides
    each match.
    """
    _refuse_at_once(text, base, budget, max_depth, subject)
    raw = not text.isascii()  # (ASCII text, as ensure_ascii writes it, needs only the escapes searched)
    has_wide = _first(1, text, 0, len(text), raw) < len(text)
    cost = float(base)
    transient = 0  # the largest short-lived allocation, held once at a time
    stack: list[int] = []  # per open container: an object's key count (>= 0), or -1 - an array's element count
    memo: dict[str, None] = {}  # the distinct keys (as written), as the parser's memo will hold them
    keys = 0.0
    dict_growth, list_growth = _DICT_GROWTH, _LIST_GROWTH
    for match in _TOKENS.finditer(text):
        kind = match.lastindex
        if kind == _KEY:
            keys += 1.0
            body = match[1]
            if body not in memo:
                memo[body] = None
                wide_key = has_wide and _first(1, body, 0, len(body), raw) < len(body)
                cost += _WIDE_STR + 4 * len(body) if wide_key else _STR + len(body)
                step = dict_growth.get(len(memo))
                if step is not None:
                    cost += step[0]
                    transient = max(transient, step[1])
            if stack and (count := stack[-1]) >= 0:
                stack[-1] = count + 1
                step = dict_growth.get(count + 1)
                if step is not None:
                    cost += step[0]
                    transient = max(transient, step[1])
            continue  # a key is no value: no list slot
        if kind == _END:
            if stack:
                stack.pop()
            continue
        if kind == _STRING:
            start, end = match.span()
            if has_wide and (wide_at := _first(1, text, start, end, raw)) < end:
                final, building = _wide_string(text, start, end, wide_at, raw)
                cost += final
                transient = max(transient, building)
            elif end - start > 3:  # "" and one-character strings are shared objects
                cost += _STR + end - start
                transient = max(transient, (end - start) >> 2)  # the parser over-allocates by a quarter
        elif kind == _NUMBER_TOKEN:
            start, end = match.span()
            if end - start > 2 or text[start] == "-":  # 0 to 99 are shared objects
                cost += _NUMBER + ((end - start) >> 1)
        # A value (this string or number, true/false/null, or the container opening below) takes a
        # slot in the array around it; an object's values are priced with its keys.
        if stack and (count := stack[-1]) < 0:
            stack[-1] = count - 1
            cost += list_growth.get(-count, 0)
        if kind in (_OBJECT, _ARRAY):
            if len(stack) >= max_depth:
                _refuse_depth(subject, max_depth, past_the_parser=_nests_past(text, sys.getrecursionlimit()))
            stack.append(0 if kind == _OBJECT else -1)
            cost += _DICT if kind == _OBJECT else _LIST
        if cost > budget:
            break
    if cost + transient > budget:
        _refuse_memory(subject)
    return int(keys), math.ceil(cost) + transient


def _refuse_at_once(text: str, base: int, budget: int, max_depth: int, subject: str) -> None:
    """Refuse, at C speed, a text without a single string whose containers alone pass the budget.

    Without strings every bracket, comma and dot is structure: a ``{`` is a dict, a ``[`` a list, a
    ``,`` a list slot (objects without keys are empty) and a ``.`` a float, so their price is a
    floor of the parse's. (A million ``{}`` is refused here in milliseconds.)
    """
    if '"' in text:
        return
    floor = base + _DICT * text.count("{") + _LIST * text.count("[") + 8 * text.count(",") + 24 * text.count(".")
    if floor <= budget:
        return
    deepest = max(accumulate(map(_BRACKET_STEP.get, text, repeat(0))), default=0)
    if deepest > max_depth:
        _refuse_depth(subject, max_depth, past_the_parser=deepest > sys.getrecursionlimit())
    _refuse_memory(subject)


def _refuse_memory(subject: str) -> NoReturn:
    raise _Refusal(
        f"{subject} would take more memory to read than its size allows"
        f" ({MEMORY_RATIO} times its size plus {MEMORY_ALLOWANCE >> 10} KiB)"
    )


def _first(width: int, text: str, start: int, end: int, raw: bool) -> int:
    """Where in ``text[start:end]`` the first character needing ``width`` bytes is; ``end`` if nowhere."""
    escape, character = _NEEDS[width]
    found = escape.search(text, start, end)
    at = end if found is None else found.start()
    if raw and (found := character.search(text, start, at)) is not None:
        at = found.start()
    return at


def _wide_string(text: str, start: int, end: int, first_wide: int, raw: bool) -> tuple[int, int]:
    """(bytes of the str, bytes held besides while the parser builds it) for a non-ASCII literal."""
    # At least the characters it decodes to: every escape has one or two backslashes and saves at
    # least one character, a \\uXXXX escape five (counted only where no backslash precedes it, as
    # "\\\\u" may be an escaped backslash and a "u").
    backslashes = text.count("\\", start, end)
    u_escapes = text.count("\\u", start, end) - text.count("\\\\u", start, end)
    length = end - start - (backslashes + 1) // 2 - 4 * u_escapes
    if (widened_at := _first(4, text, start, end, raw)) < end:
        width = 4
    elif (widened_at := _first(2, text, start, end, raw)) < end:
        width = 2
    else:
        width, widened_at = 1, first_wide
    # While building, the buffer is over-allocated by a quarter, and when the first character that
    # needs the final width turns up, what came before it is copied from the narrower buffer.
    return _WIDE_STR + width * length, (width * length >> 2) + (max(1, width >> 1) * (widened_at - start) * 5 >> 2)


def _nests_past(text: str, depth: int) -> bool:
    """Whether ``text`` nests deeper than ``depth`` anywhere (one more pass of the tokens, stopping there)."""
    depths = accumulate(map(_DEPTH_STEP.__getitem__, map(_kind, _TOKENS.finditer(text))))
    return any(map(depth.__lt__, depths))


def _refuse_depth(subject: str, max_depth: int, *, past_the_parser: bool) -> NoReturn:
    if past_the_parser:  # json's own parser could not follow it at all: as a parse would have said
        raise _Refusal(f"{subject} is not valid JSON: it nests deeper than {max_depth} levels")
    raise _Refusal(f"{subject} nests deeper than {max_depth} levels")


def _parse(text: str, subject: str) -> Any:
    def no_constant(name: str) -> NoReturn:
        raise _Refusal(f"{subject} holds {name}, which JSON does not have")

    def finite(digits: str) -> float:
        number = float(digits)
        if not math.isfinite(number):
            raise _Refusal(f"{subject} holds a number too large for a float")
        return number

    try:
        return json.loads(text, parse_constant=no_constant, parse_float=finite)
    except _Refusal:
        raise
    except (ValueError, RecursionError):  # the C parser's own recursion guard stops very deep nesting
        raise _Refusal(f"{subject} is not valid JSON") from None


def _entries(value: Any, max_depth: int, subject: str) -> int:
    """The number of entries in all of ``value``'s dicts (and a last check of the nesting).

    Iterative: a stack of iterators, one per open container, so it never recurses.
    """
    entries = 0
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        for item in stack[-1]:
            kind = type(item)
            if kind is dict or kind is list:
                if len(stack) > max_depth:
                    raise _Refusal(f"{subject} nests deeper than {max_depth} levels")
                if kind is dict:
                    entries += len(item)
                    stack.append(iter(item.values()))
                else:
                    stack.append(iter(item))
                break
        else:
            stack.pop()
    return entries
