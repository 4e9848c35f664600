"""One review card per tool call, and the plain-text label every piece of untrusted text goes through.

A card shows what the model asked for (tool name, the tool's own plain-text summary, a destructive
badge), expands to the call's whole input and its dry-run preview, and shows what became of it. It
decides nothing: its buttons only report clicks (with a reason to deny, or an edited input to approve),
and the panel turns them into session commands.
Every string that came from the model, a tool or the document is shown with ``Qt.PlainText``, so
markup in it is displayed, never interpreted.
"""

from __future__ import annotations

import json
from typing import Any, Final, final

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from trioloop.loop.machine import DENY_REASON_MAX, CallRecord, CallStatus, DenialReason
from trioloop.loop.untrusted_text import is_stripped_code_point

__all__ = ["CallCard", "call_status_text", "plain_label"]

#: Longest piece of a call's result shown on its card; the whole text went to the model.
RESULT_PREVIEW_CHARS: Final = 300


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


def call_status_text(call: CallRecord) -> str:
    """A short account of where the call stands, for the card's status line."""
    status = call.status
    if status is CallStatus.PENDING:
        return "Waiting for your review"
    if status is CallStatus.APPROVED:
        return "Approved" if call.effect == "mutate" else "Allowed (read-only)"
    if status is CallStatus.RUNNING:
        return "Running…"
    if status is CallStatus.SUCCEEDED:
        return "Applied" if call.changed_document else "Done"
    if status is CallStatus.FAILED:
        return "Failed"
    if status is CallStatus.UNDONE:
        return "Undone"  # only a call that changed the document is ever undone
    reason = call.denial_reason
    if reason is DenialReason.TURN_CANCELLED:
        return "Not run: the turn ended first"
    if reason is DenialReason.LIMIT_EXCEEDED:
        return "Not run: tool-call limit reached"
    return "Declined"


def _result_preview(call: CallRecord) -> str:
    """What the card shows of the result: only for calls that failed or were refused, first line, capped."""
    if call.status is not CallStatus.FAILED or not call.result:
        return ""
    first = call.result.strip().splitlines()[0] if call.result.strip() else ""
    if len(first) > RESULT_PREVIEW_CHARS:
        first = first[: RESULT_PREVIEW_CHARS - 1] + "…"
    return first


def _input_text(raw_input: Any) -> str:
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


@final
class CallCard(QFrame):
    """The review card of one tool call.

    ``approve_clicked`` carries the call id and, when the user changed the input in the card's editor,
    the edited input (a dict; None otherwise). ``deny_clicked`` carries the call id and the reason typed
    on the card ("" for none), which the model receives as the user's words.
    """

    approve_clicked = Signal(str, object)
    deny_clicked = Signal(str, str)

    def __init__(self, call: CallRecord, raw_input: Any = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("callCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)  # never squeezed: it scrolls
        self.call_id = call.id
        self._call = call
        self._enabled_for_review: bool | None = None

        self.tool_label = plain_label(call.tool_name, object_name="toolName")
        self.destructive_badge = plain_label("DESTRUCTIVE", object_name="destructiveBadge")
        self.read_badge = plain_label("read-only", object_name="readBadge")
        self.status_label = plain_label(object_name="callStatus")
        self.status_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.summary_label = plain_label(call.summary, object_name="callSummary", wrap=True)
        self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result_label = plain_label(object_name="callResult", wrap=True)
        self.approve_button = QPushButton("Approve")
        self.approve_button.setObjectName("approveButton")
        self.deny_button = QPushButton("Deny")
        self.deny_button.setObjectName("denyButton")
        self.reason_edit = QLineEdit()
        self.reason_edit.setObjectName("denyReason")
        self.reason_edit.setPlaceholderText("Reason to deny (optional)")
        self.reason_edit.setToolTip("Why you deny this call: the model is told, in your words")
        self.reason_edit.setMaxLength(DENY_REASON_MAX)
        self.reason_edit.returnPressed.connect(self.deny_button.click)  # type a reason, Enter denies
        self._raw_input = raw_input
        self.edit_button = QToolButton()
        self.edit_button.setObjectName("editButton")
        self.edit_button.setText("Edit input")
        self.edit_button.setCheckable(True)
        self.edit_button.setToolTip("Change the input before approving; the tool checks the edit, the model is told")
        self.input_editor = QPlainTextEdit(_input_text(raw_input))
        self.input_editor.setObjectName("inputEditor")
        self.input_editor.setVisible(False)
        self.edit_error = plain_label(object_name="editError", wrap=True)
        self.edit_error.setVisible(False)
        self.edit_button.toggled.connect(self.input_editor.setVisible)
        self.approve_button.clicked.connect(self._on_approve)
        self.deny_button.clicked.connect(self._on_deny)
        for control in self._review_controls:
            # A decided card keeps the buttons' room, so nothing moves under the pointer after a click.
            policy = control.sizePolicy()
            policy.setRetainSizeWhenHidden(True)
            control.setSizePolicy(policy)
        self.details_button = QToolButton()
        self.details_button.setObjectName("detailsButton")
        self.details_button.setText("Details")
        self.details_button.setCheckable(True)
        self.details_button.setToolTip("The call's whole input and a preview of what it would change")
        self.details_label = plain_label(object_name="callDetails", wrap=True)
        self.details_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_label.setVisible(False)
        self.details_button.toggled.connect(self.details_label.setVisible)
        self._preview_lines: tuple[str, ...] = ()

        header = QHBoxLayout()
        header.addWidget(self.tool_label)
        header.addWidget(self.destructive_badge)
        header.addWidget(self.read_badge)
        header.addStretch(1)
        header.addWidget(self.status_label)
        buttons = QHBoxLayout()
        buttons.addWidget(self.details_button)
        buttons.addWidget(self.edit_button)
        buttons.addStretch(1)
        buttons.addWidget(self.reason_edit, 2)
        buttons.addWidget(self.deny_button)
        buttons.addWidget(self.approve_button)
        body = QVBoxLayout(self)
        body.setContentsMargins(10, 8, 10, 8)
        body.setSpacing(4)
        body.addLayout(header)
        body.addWidget(self.summary_label)
        body.addWidget(self.result_label)
        body.addWidget(self.details_label)
        body.addWidget(self.input_editor)
        body.addWidget(self.edit_error)
        body.addLayout(buttons)

        self.destructive_badge.setVisible(call.destructive)
        self.read_badge.setVisible(call.effect == "read")
        self.setProperty("destructive", call.destructive)
        self.setProperty("current", False)
        self.show_call(call, reviewable=False)

    @property
    def call(self) -> CallRecord:
        return self._call

    def show_call(self, call: CallRecord, *, reviewable: bool) -> None:
        """Show the call's latest record; the buttons are enabled only when ``reviewable``."""
        if call is self._call and reviewable is self._enabled_for_review:
            return
        self._call = call
        self._enabled_for_review = reviewable
        self.summary_label.setText(call.summary)
        self._show_details()
        self.status_label.setText(call_status_text(call))
        self.status_label.setProperty("status", call.status.value)
        self.setProperty("status", call.status.value)
        preview = _result_preview(call)
        self.result_label.setText(preview)
        self.result_label.setVisible(bool(preview) and preview != call.summary)
        pending = call.status is CallStatus.PENDING
        for control in self._review_controls:
            control.setVisible(pending)
            control.setEnabled(reviewable and pending)
        if not pending:
            self.edit_button.setChecked(False)
            self.edit_error.setVisible(False)
        for widget in (self, self.status_label):
            widget.style().unpolish(widget)
            widget.style().polish(widget)

    def show_preview(self, lines: tuple[str, ...]) -> None:
        """Show ``lines`` (the call's dry-run preview on the document as it stands) in the details."""
        if lines != self._preview_lines:
            self._preview_lines = lines
            self._show_details()

    @property
    def details_text(self) -> str:
        return self.details_label.text()

    def set_current(self, current: bool) -> None:
        """Mark this card as the one the keyboard shortcuts act on."""
        if self.property("current") is not current:
            self.setProperty("current", current)
            self.style().unpolish(self)
            self.style().polish(self)

    def _show_details(self) -> None:
        call = self._call
        lines = []
        details = call.prepared.details if call.prepared is not None else ()
        if details:
            lines.append("Input:")
            lines.extend(f"  {path}: {value}" for path, value in details)
        if call.edits:
            lines.append("You edited:")
            lines.extend(
                f"  {path}: {old if old is not None else '(absent)'} -> {new}" for path, old, new in call.edits
            )
        if self._preview_lines:
            lines.append("Preview:")
            lines.extend(f"  {line}" for line in self._preview_lines)
        self.details_label.setText("\n".join(lines))
        self.details_button.setEnabled(bool(lines))

    @property
    def _review_controls(self) -> tuple[QWidget, ...]:
        return (self.approve_button, self.deny_button, self.reason_edit, self.edit_button)

    def edited_input(self) -> dict[str, Any] | None:
        """The input in the editor when the user changed it (None when unchanged or the editor is closed);
        raises ValueError, with a message for the card, when it is not a JSON object."""
        if not self.edit_button.isChecked():
            return None
        try:
            edited = json.loads(self.input_editor.toPlainText())
        except ValueError as exc:
            raise ValueError(f"The edited input is not valid JSON ({exc.args[0]}).") from None
        if not isinstance(edited, dict):
            raise ValueError("The edited input must be a JSON object ({...}).")
        return None if edited == self._raw_input else edited

    def _decided(self) -> None:
        for control in self._review_controls:
            control.setEnabled(False)

    def _on_approve(self) -> None:
        try:
            edited = self.edited_input()
        except ValueError as exc:  # nothing is approved: the card stays open for a fix or a denial
            self.edit_error.setText(str(exc))
            self.edit_error.setVisible(True)
            return
        self.edit_error.setVisible(False)
        self._decided()
        self.approve_clicked.emit(self.call_id, edited)

    def _on_deny(self) -> None:
        self._decided()
        self.deny_clicked.emit(self.call_id, self.reason_edit.text())
