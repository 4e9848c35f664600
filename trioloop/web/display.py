"""How untrusted text is shown on a page: control, bidi and invisible characters made visible, each field capped,
and the whole page held to a budget.

Everything a model, a tool or a document wrote (the request, the model's text, every card field) goes through
`Budget.show` before a template sees it. The template still escapes it (Jinja2's autoescape is on for every
template): this module decides what a person sees, not what is safe HTML. A character that could reorder or hide
what follows it (U+202E, U+2066, zero-width ones), or a control character, is shown as ``⟨U+202E⟩``; a field longer
than its cap ends with ``… N more characters``; once the page's budget is spent, fields are left out and the page says
how many.
"""

from __future__ import annotations

import unicodedata
from typing import Final, final

import attrs

__all__ = ["FIELD_CHARS", "PAGE_CHARS", "Budget", "Shown", "visible"]

#: The most characters one field shows.
FIELD_CHARS: Final = 4000
#: The most characters of untrusted text one page shows (a page of the largest cards stays a few hundred KB).
PAGE_CHARS: Final = 120_000
_KEPT: Final = frozenset("\n\t")
_VISIBLE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _needs_mark(char: str, keep_lines: bool) -> bool:
    if keep_lines and char in _KEPT:
        return False
    return unicodedata.category(char) in _VISIBLE_CATEGORIES


@final
@attrs.frozen
class Shown:
    """Text ready for a template: what to show, and how many characters of the original were left out."""

    text: str
    left_out: int = 0

    @property
    def more(self) -> str:
        """``… 12 more characters`` (empty when nothing was left out)."""
        return f"… {self.left_out} more characters" if self.left_out else ""

    def __str__(self) -> str:
        return self.text


def visible(value: object, *, cap: int = FIELD_CHARS, keep_lines: bool = True) -> Shown:
    """``value`` (text; anything else shows as nothing) with every control, bidi and invisible character written
    ``⟨U+XXXX⟩``, cut to ``cap`` characters of output."""
    text = value if isinstance(value, str) else ""
    out: list[str] = []
    size = 0
    for used, char in enumerate(text):
        piece = f"⟨U+{ord(char):04X}⟩" if _needs_mark(char, keep_lines) else char
        if size + len(piece) > cap:
            return Shown("".join(out), len(text) - used)
        out.append(piece)
        size += len(piece)
    return Shown("".join(out))


@final
class Budget:
    """The characters of untrusted text one page may still show."""

    def __init__(self, chars: int = PAGE_CHARS) -> None:
        self.left = chars
        self.skipped = 0

    def show(self, value: object, *, cap: int = FIELD_CHARS, keep_lines: bool = True) -> Shown:
        """`visible` within what is left of the page's budget; a field past it is left out whole (counted in
        ``skipped``)."""
        if self.left <= 0:
            self.skipped += 1
            text = value if isinstance(value, str) else ""
            return Shown("", len(text))
        shown = visible(value, cap=min(cap, self.left), keep_lines=keep_lines)
        self.left -= max(len(shown.text), 1)
        return shown
