"""Untrusted text: how a string from a document or the catalog becomes safe to hand to a model.

Every such string is stripped of invisible and control code points, capped in code points, and escaped so
it can never spell a fence marker; every successful read result is one canonical JSON line between the two
markers, so a raw marker in a result can only be the fence itself.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from trioloop.machine.canonical import canonical_json

__all__ = [
    "END_MARKER",
    "START_MARKER",
    "TRUNCATION_MARK",
    "fence",
    "fence_canonical",
    "is_stripped_code_point",
    "quote_untrusted",
    "sanitize_scalar",
    "strip_and_cap",
]

START_MARKER: Final = "<<<UNTRUSTED_DOCUMENT_DATA>>>"
END_MARKER: Final = "<<<END_UNTRUSTED_DOCUMENT_DATA>>>"
TRUNCATION_MARK: Final = "…"

# Cc (C0, DEL, C1), Cf (bidi controls, zero-width characters, BOM, soft hyphen, tag characters), Cs (lone
# surrogates cannot be encoded as UTF-8) and Zl/Zp (U+2028/U+2029 would split the JSON line).
#: The ASCII characters `str.splitlines` ends a line at.
_ASCII_LINE_ENDS: Final = "\n\r\x0b\x0c\x1c\x1d\x1e"
_STRIPPED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Named explicitly as well, so the rule does not depend on the Unicode version behind `unicodedata`.
_ALWAYS_STRIPPED: Final = frozenset(
    {0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2060, 0xFEFF}
    | set(range(0x202A, 0x202F))
    | set(range(0x2066, 0x206A))
    | set(range(0xE0000, 0xE0080))
)
_DESCRIPTION_WHITESPACE: Final = frozenset({"\n", "\t"})


def is_stripped_code_point(char: str, allow_newlines: bool = False) -> bool:
    """True if `char` (one code point) never survives sanitizing; newline and tab survive only in text."""
    if " " <= char <= "~":
        return False
    if allow_newlines and char in _DESCRIPTION_WHITESPACE:
        return False
    return ord(char) in _ALWAYS_STRIPPED or unicodedata.category(char) in _STRIPPED_CATEGORIES


#: Whether Python's Unicode database already counts every explicit code point as non-printable (it does today):
#: then ``str.isprintable`` alone finds them, else a (C-level) set check for them runs as well.
_EXPLICIT_NOT_PRINTABLE: Final = not any(chr(c).isprintable() for c in _ALWAYS_STRIPPED)
_ALWAYS_STRIPPED_CHARS: Final = frozenset(chr(c) for c in _ALWAYS_STRIPPED)


def _nothing_stripped(text: str, allow_newlines: bool) -> bool:
    """Whether no code point of ``text`` would be stripped, decided in C: every stripped category (Cc, Cf, Cs,
    Zl, Zp) is non-printable, so a printable string (newline and tab aside, where they are kept) holding none
    of the explicit code points loses nothing."""
    probe = text.replace("\n", " ").replace("\t", " ") if allow_newlines else text
    return probe.isprintable() and (_EXPLICIT_NOT_PRINTABLE or _ALWAYS_STRIPPED_CHARS.isdisjoint(text))


def sanitize_scalar(text: str, max_code_points: int, allow_newlines: bool = False) -> tuple[str, bool]:
    """Strip, cap and escape one untrusted string; returns (escaped text, whether it was cut).

    Capping counts code points after stripping and before escaping, so the escaped text can be longer
    than the cap. A cut string keeps `max_code_points - 1` code points and ends in "…".
    """
    clean, truncated = strip_and_cap(text, max_code_points, allow_newlines)
    return _escaped(clean), truncated


def strip_and_cap(text: str, max_code_points: int, allow_newlines: bool = False) -> tuple[str, bool]:
    """`sanitize_scalar` without the escaping, for text shown as plain text (a face's card): the stripped and
    capped text, and whether it was cut. Cleaning its result again changes nothing."""
    if max_code_points < 1:
        raise ValueError("max_code_points must be at least 1")
    # The common case, in C: nothing to strip within the first cap + 1 code points (all the walk would read),
    # so only cap.
    head = text[: max_code_points + 1]
    if _nothing_stripped(head, allow_newlines):
        if len(head) > max_code_points:
            return head[: max_code_points - 1] + TRUNCATION_MARK, True
        return head, False
    return _strip_each(text, max_code_points, allow_newlines)


def _strip_each(text: str, max_code_points: int, allow_newlines: bool) -> tuple[str, bool]:
    """`strip_and_cap` code point by code point (for text that holds something to strip)."""
    kept: list[str] = []
    # Stop one past the cap: that is enough to know the string was cut, and bounds work on huge fields.
    for char in text:
        if not is_stripped_code_point(char, allow_newlines):
            kept.append(char)
            if len(kept) > max_code_points:
                break
    truncated = len(kept) > max_code_points
    if truncated:
        kept[max_code_points - 1 :] = [TRUNCATION_MARK]
    return "".join(kept), truncated


def _escaped(text: str) -> str:
    """Backslash, ``<`` and ``>`` escaped (three C-level passes: ``str.translate`` walks a dict per code point)."""
    return text.replace("\\", "\\\\").replace("<", "\\<").replace(">", "\\>")


def quote_untrusted(text: str, max_code_points: int) -> str:
    """Sanitize `text` and wrap it in JSON string quotes, for echoing a value inside authored prose."""
    clean, _ = sanitize_scalar(text, max_code_points)
    return canonical_json(clean)


def fence(payload: Mapping[str, Any]) -> str:
    """Wrap a payload as start marker line, canonical JSON line, end marker line.

    Raises ValueError if the JSON could spell a marker or break the line, which only an unsanitized string
    can cause: that is a bug in the caller, and refusing is safer than fencing it.
    """
    return fence_canonical(canonical_json(dict(payload)))


def fence_canonical(body: str) -> str:
    """``fence`` for a payload already written as its canonical JSON line (so it is encoded only once)."""
    # '<' and '>' found by a byte scan first (the usual payload has neither); an ASCII body's line ends found by a
    # scan each, the split (which copies the body) only for a body that may hold one.
    marked = ("<" in body and "<<<" in body) or (">" in body and ">>>" in body)
    one_line = bool(body) if body.isascii() and not any(end in body for end in _ASCII_LINE_ENDS) else None
    if marked or not (one_line if one_line is not None else len(body.splitlines()) == 1):
        raise ValueError("payload holds unsanitized text; every document string must pass sanitize_scalar")
    return f"{START_MARKER}\n{body}\n{END_MARKER}"
