"""The review panel's widgets, laid out and styled: what `ReviewPanel` shows, not what it does.

`PanelLayout` builds each widget as a public attribute, so an app can rearrange or restyle them.
"""

from __future__ import annotations

from typing import Final

from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from trioloop.ui._qt_plain_text import plain_label
from trioloop.ui._qt_questions import QUESTION_STYLE
from trioloop.ui._qt_rules import RULES_STYLE, RulesList

__all__ = ["PanelLayout"]

_STYLE: Final = """
QFrame#callCard { background: #ffffff; border: 1px solid #c8d1da; border-radius: 6px; }
QFrame#callCard[destructive="true"] { border: 1px solid #cf222e; }
QFrame#callCard[current="true"] { border: 1px solid #0969da; background: #eef6ff; }
QFrame#callCard[current="true"][destructive="true"] { border: 1px solid #cf222e; }
QFrame#focusMark { background: transparent; border: none; border-radius: 2px; }
QFrame#focusMark[current="true"] { background: #0969da; }
QLabel#cardKeys { color: #0969da; font-size: 11px; }
QToolButton#allFieldsButton { color: #0969da; border: none; padding: 0px 2px; }
QFrame#callCard[status="denied"], QFrame#callCard[status="undone"] { background: #f6f8fa; }
QLabel#toolName { font-family: monospace; font-weight: bold; }
QLabel#destructiveBadge { background: #cf222e; color: #ffffff; border-radius: 3px; padding: 1px 6px;
    font-size: 10px; font-weight: bold; }
QLabel#readBadge { background: #eaeef2; color: #57606a; border-radius: 3px; padding: 1px 6px; font-size: 10px; }
QLabel#callStatus { color: #57606a; }
QLabel#callStatus[status="pending"] { color: #9a6700; font-weight: bold; }
QLabel#callStatus[status="running"] { color: #0969da; font-weight: bold; }
QLabel#callStatus[status="succeeded"] { color: #1a7f37; }
QLabel#callStatus[status="failed"] { color: #bc4c00; }
QLabel#callResult { color: #7d4e00; }
QLabel#declinedReason { color: #57606a; font-style: italic; }
QLabel#documentTitle { font-size: 15px; font-weight: bold; }
QLabel#documentStats, QLabel#phase { color: #57606a; }
QFrame#notice[kind="info"] { background: #ddf4ff; border: 1px solid #80ccff; border-radius: 6px; }
QFrame#notice[kind="info"] QLabel { color: #0a3069; }
QFrame#notice[kind="warning"] { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; }
QFrame#notice[kind="warning"] QLabel { color: #4d2d00; }
QScrollArea#cardArea { border: none; }
"""


class PanelLayout(QWidget):
    """The panel's widgets: a header (document title, tokens and cost, phase), the document's counts, the answer,
    the notice, the cards with "Approve all safe", the approval rules in effect (folded), and the prompt with Send,
    Stop, Undo and Redo."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("reviewPanel")
        self.title_label = plain_label(object_name="documentTitle")
        self.stats_label = plain_label(object_name="documentStats")
        self.phase_label = plain_label(object_name="phase")
        self.usage_label = plain_label(object_name="usage")
        self.usage_label.setToolTip("Tokens (in + out) and their cost, at the model's price when it is known")
        self.answer_view = QPlainTextEdit()
        self.answer_view.setObjectName("answer")
        self.answer_view.setReadOnly(True)
        self.answer_view.setPlaceholderText("The model's answer appears here.")
        self.notice_label = plain_label(object_name="noticeText", wrap=True)
        self.notice_frame = QFrame()
        self.notice_frame.setObjectName("notice")
        notice_layout = QHBoxLayout(self.notice_frame)
        notice_layout.setContentsMargins(10, 8, 10, 8)
        notice_layout.addWidget(self.notice_label, 1)
        self.notice_frame.setVisible(False)
        self.cards_title = plain_label("Proposed tool calls", object_name="cardsTitle")
        self.approve_safe_button = QPushButton("Approve all safe")
        self.approve_safe_button.setObjectName("approveSafeButton")
        self._card_box = QWidget()
        self._card_layout = QVBoxLayout(self._card_box)
        self._card_layout.setContentsMargins(0, 0, 0, 0)
        self._card_layout.setSpacing(6)
        self._card_layout.addStretch(1)
        self.card_area = QScrollArea()
        self.card_area.setObjectName("cardArea")
        self.card_area.setWidgetResizable(True)
        self.card_area.setWidget(self._card_box)
        self.rules_list = RulesList()
        self.prompt_input = QLineEdit()
        self.prompt_input.setObjectName("prompt")
        self.prompt_input.setPlaceholderText("Ask about the threat model or request a change…")
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.undo_button = QPushButton("Undo")
        self.undo_button.setObjectName("undoButton")
        self.redo_button = QPushButton("Redo")
        self.redo_button.setObjectName("redoButton")

        header = QHBoxLayout()
        header.addWidget(self.title_label)
        header.addStretch(1)
        header.addWidget(self.usage_label)
        header.addWidget(self.phase_label)
        cards_header = QHBoxLayout()
        cards_header.addWidget(self.cards_title)
        cards_header.addStretch(1)
        cards_header.addWidget(self.approve_safe_button)
        controls = QHBoxLayout()
        controls.addWidget(self.prompt_input, 1)
        controls.addWidget(self.send_button)
        controls.addWidget(self.stop_button)
        controls.addWidget(self.undo_button)
        controls.addWidget(self.redo_button)
        root = QVBoxLayout(self)
        root.addLayout(header)
        root.addWidget(self.stats_label)
        root.addWidget(self.answer_view, 1)
        root.addWidget(self.notice_frame)
        root.addLayout(cards_header)
        root.addWidget(self.card_area, 3)
        root.addWidget(self.rules_list)
        root.addLayout(controls)
        self.setStyleSheet(_STYLE + QUESTION_STYLE + RULES_STYLE)
