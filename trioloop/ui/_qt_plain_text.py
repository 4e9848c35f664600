"""How the panel shows text it did not write: always as plain text, never as markup, with what could hide or
reorder it stripped or escaped.

Every string that came from the model, a tool or the document goes into a label made by `plain_label` (or a
`OneLineLabel`), so markup in it is displayed, never interpreted. A reason typed to decline a call is shown as
`shown_reason` cleans it, and a call's input as the editor shows it (`input_text`) writes every invisible code
point as a JSON escape, so nothing can hide in what a person approves.
"""

from __future__ import annotations

import json
from typing import Any, final

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QSizePolicy

from trioloop.machine.reducer import DENY_REASON_MAX
from trioloop.machine.untrusted_text import is_stripped_code_point

__all__ = ["OneLineLabel", "input_text", "plain_label", "shown_reason"]


def plain_label(text: str = "", *, object_name: str = "", wrap: bool = False) -> QLabel:
    """A QLabel that can only ever show ``text`` literally (no rich text, no links)."""
    label = QLabel()
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setOpenExternalLinks(False)
    label.setText(text)
    label.setWordWrap(wrap)
    if object_name:
        label.setObjectName(object_name)
    return label


@final
class OneLineLabel(QLabel):
    """A plain-text label that keeps to one line, ending in "…" where the text does not fit.

    ``text()`` stays the whole text; only the painting is cut, so the card never grows wider than its
    panel. (No tooltip: Qt would render a tooltip that looks like markup as rich text.)"""

    def __init__(self, text: str, *, object_name: str) -> None:
        super().__init__()
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setObjectName(object_name)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def paintEvent(self, event: QPaintEvent) -> None:
        area = self.contentsRect()
        line = " ".join(self.text().split())
        painter = QPainter(self)
        painter.drawText(
            area,
            int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
            self.fontMetrics().elidedText(line, Qt.TextElideMode.ElideRight, area.width()),
        )
        painter.end()


def shown_reason(reason: str) -> str:
    """A reason typed to decline a call, as its card shows it: control and bidi code points stripped
    (they could reorder or hide what is shown), whitespace runs as one space, capped."""
    kept = "".join(char for char in reason if char in "\t\n" or not is_stripped_code_point(char))
    return " ".join(kept.split())[:DENY_REASON_MAX]


def input_text(raw_input: Any) -> str:
    """The call's input as the editor shows it: indented JSON in which every invisible code point (a bidi
    control, a zero-width space, a line separator) is a JSON escape, so nothing can hide in what the user
    approves, while visible text in any script reads as itself. ``json.loads`` gives the input back."""
    text = json.dumps(raw_input, indent=2, ensure_ascii=False)
    return "".join(_json_escape(char) if is_stripped_code_point(char, allow_newlines=True) else char for char in text)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # outside the BMP: a UTF-16 surrogate pair, as JSON writes it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
