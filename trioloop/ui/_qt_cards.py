"""One review card per tool call: what the call asks and what became of it, and the clicks that review it.

A card shows what the model asked for (tool name, the tool's own plain-text summary, a destructive
badge), the call's input and its dry-run preview, and what became of it: a progress bar while it
runs, the reason given when it was declined. A mutation's card opens with everything visible, since
that is what a person approves (fields the call leaves unset, null, fold into one "N fields unset" line
that one click unfolds); a read's card is one line that expands on a click. A card decides
nothing: its buttons only report clicks (with a reason to deny, or an edited input to approve), and the
panel turns them into session commands. Typing on a card that waits for review goes into its deny reason.
Every string that came from the model, a tool or the document is shown with ``Qt.PlainText``, so
markup in it is displayed, never interpreted (the labels and text helpers of ``_qt_plain_text.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final, final

from PySide6.QtCore import QElapsedTimer, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from trioloop.machine.reducer import DENY_REASON_MAX, CallRecord, CallStatus, DenialReason
from trioloop.machine.untrusted_text import sanitize_scalar
from trioloop.ui._qt_plain_text import OneLineLabel, input_text, plain_label, shown_reason
from trioloop.ui._qt_rules import AlwaysChoices, decider_text, decision_status

__all__ = ["CallCard", "call_status_text"]

#: Longest piece of a call's result shown on its card; the whole text went to the model.
RESULT_PREVIEW_CHARS: Final = 300
#: How a card's input line writes a field left unset (null); a string "null" is shown quoted.
_UNSET: Final = "null"
_TYPING_MODIFIERS: Final = (
    Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier | Qt.KeyboardModifier.MetaModifier
)


def call_status_text(call: CallRecord) -> str:
    """A short account of where the call stands, for the card's status line."""
    status = call.status
    if status is CallStatus.PENDING:
        return "Waiting for your review"
    if status is CallStatus.APPROVED:
        return decision_status(call) or ("Approved" if call.effect == "mutate" else "Allowed (read-only)")
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
    if reason is DenialReason.RULE_DENIED:
        return decision_status(call) or "Denied by a rule"
    return "Declined"


def _result_preview(call: CallRecord) -> str:
    """What the card shows of the result: only for calls that failed or were refused, first line, capped."""
    if call.status is not CallStatus.FAILED or not call.result:
        return ""
    first = call.result.strip().splitlines()[0] if call.result.strip() else ""
    if len(first) > RESULT_PREVIEW_CHARS:
        first = first[: RESULT_PREVIEW_CHARS - 1] + "…"
    return first


@final
class CallCard(QFrame):
    """The review card of one tool call.

    A mutation's card opens expanded (its input and preview shown); a read's card is one line
    (``compact``) until its Details toggle is opened. Fields the call leaves unset (null) are folded into one
    "N fields unset" line; ``all_fields_button`` shows every field. While the call runs, ``progress_bar`` (an
    indeterminate bar) shows and the status counts the seconds; once it settles both stop.

    The card the panel's keyboard shortcuts act on is marked (``set_current``: a blue bar down its left
    edge, a tinted background and the keys to press). Text typed while the card itself has keyboard
    focus goes into its deny reason (`start_deny`), so nothing typed is dropped.

    ``approve_clicked`` carries the call id and, when the user changed the input in the card's editor,
    the edited input (a dict; None otherwise). ``deny_clicked`` carries the call id and the reason typed
    on the card ("" for none), which the model receives as the user's words and the card keeps showing.
    ``approve_always_clicked`` also carries what the person chose to allow from now on ("input" or "tool"), and
    ``deny_always_clicked`` (id, reason) denies the tool from now on: the card's **Always…** menu (`always`).
    ``decider_label`` says which rule or function asked for the card, or decided the call without the person.
    """

    approve_clicked = Signal(str, object)
    deny_clicked = Signal(str, str)
    approve_always_clicked = Signal(str, object, str)
    deny_always_clicked = Signal(str, str)

    def __init__(self, call: CallRecord, raw_input: Any = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("callCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # typing on a card fills in its deny reason
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)  # never squeezed: it scrolls
        self.call_id = call.id
        self._call = call
        self._enabled_for_review: bool | None = None
        self._was_pending = False
        self._typed_reason: str | None = None  # what the user typed when denying on this card
        self.compact = call.effect == "read"

        self.tool_label = plain_label(call.tool_name, object_name="toolName")
        self.destructive_badge = plain_label("DESTRUCTIVE", object_name="destructiveBadge")
        self.read_badge = plain_label("read-only", object_name="readBadge")
        self.status_label = plain_label(object_name="callStatus")
        self.status_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.summary_label: QLabel
        if self.compact:
            self.summary_label = OneLineLabel(call.summary, object_name="callSummary")
        else:
            self.summary_label = plain_label(call.summary, object_name="callSummary", wrap=True)
            self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result_label = plain_label(object_name="callResult", wrap=True)
        self.decider_label = plain_label(object_name="callDecider", wrap=True)
        self.always = AlwaysChoices(call.destructive)
        self.always.chosen.connect(self._on_always)
        self.reason_label = plain_label(object_name="declinedReason", wrap=True)
        self.reason_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress_bar = QProgressBar()
        self.progress_bar.setObjectName("callProgress")
        self.progress_bar.setRange(0, 0)  # indeterminate: a tool reports no fraction done
        self.progress_bar.setTextVisible(False)
        self.progress_bar.setFixedSize(90, 8)
        self.progress_bar.setVisible(False)
        #: Where the running call's reported progress is read (the panel sets ``Session.call_progress``).
        self.progress_source: Callable[[str], tuple[float, float | None, str] | None] | None = None
        self._elapsed = QElapsedTimer()
        self._ticker = QTimer(self)
        self._ticker.setInterval(1000)
        self._ticker.timeout.connect(self._show_elapsed)
        self.approve_button = QPushButton("Approve")
        self.approve_button.setObjectName("approveButton")
        self.deny_button = QPushButton("Deny")
        self.deny_button.setObjectName("denyButton")
        self.reason_edit = QLineEdit()
        self.reason_edit.setObjectName("denyReason")
        self.reason_edit.setPlaceholderText("Reason to deny (optional)")
        self.reason_edit.setToolTip("Why you deny this call (Enter denies): the model is told, in your words")
        self.reason_edit.setMaxLength(DENY_REASON_MAX)
        self.reason_edit.returnPressed.connect(self.deny_button.click)  # type a reason, Enter denies
        self._raw_input = raw_input
        self.edit_button = QToolButton()
        self.edit_button.setObjectName("editButton")
        self.edit_button.setText("Edit input")
        self.edit_button.setCheckable(True)
        self.edit_button.setToolTip("Change the input before approving; the tool checks the edit, the model is told")
        self.input_editor = QPlainTextEdit(input_text(raw_input))
        self.input_editor.setObjectName("inputEditor")
        self.input_editor.setVisible(False)
        self.edit_error = plain_label(object_name="editError", wrap=True)
        self.edit_error.setVisible(False)
        self.edit_button.toggled.connect(self.input_editor.setVisible)
        self.keys_label = plain_label(object_name="cardKeys")
        self.keys_label.setVisible(False)
        self.approve_button.clicked.connect(lambda: self._on_approve())  # not given the button's checked flag
        self.deny_button.clicked.connect(lambda: self._on_deny())
        for control in (*self._review_controls, self.keys_label):
            # A decided card keeps the buttons' room, so nothing moves under the pointer after a click.
            policy = control.sizePolicy()
            policy.setRetainSizeWhenHidden(True)
            control.setSizePolicy(policy)
        self.details_button = QToolButton()
        self.details_button.setObjectName("detailsButton")
        self.details_button.setText("Details")
        self.details_button.setCheckable(True)
        self.details_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.details_button.setToolTip("The call's whole input and a preview of what it would change")
        self.details_label = plain_label(object_name="callDetails", wrap=True)
        self.details_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_label.setVisible(False)
        #: Below the input (and its Show all button): the edits made on the card and the dry-run preview.
        self.changes_label = plain_label(object_name="callChanges", wrap=True)
        self.changes_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.changes_label.setVisible(False)
        self.details_button.setChecked(not self.compact)  # what a mutation would do shows without a click
        self.details_button.toggled.connect(self._show_expanded)
        self.all_fields_button = QToolButton()
        self.all_fields_button.setObjectName("allFieldsButton")
        self.all_fields_button.setCheckable(True)
        self.all_fields_button.setAutoRaise(True)
        self.all_fields_button.setVisible(False)
        self.all_fields_button.toggled.connect(self._show_details)
        self.focus_mark = QFrame()
        self.focus_mark.setObjectName("focusMark")
        self.focus_mark.setFixedWidth(4)
        self._preview_lines: tuple[str, ...] = ()
        self._unset_fields = 0

        header = QHBoxLayout()
        header.addWidget(self.tool_label)
        header.addWidget(self.destructive_badge)
        header.addWidget(self.read_badge)
        if self.compact:
            header.addWidget(self.summary_label, 1)
            header.addWidget(self.details_button)
        else:
            header.addStretch(1)
        header.addWidget(self.progress_bar, 0, Qt.AlignmentFlag.AlignVCenter)
        header.addWidget(self.status_label)
        self.action_row = QWidget()
        self.action_row.setObjectName("cardActions")
        buttons = QHBoxLayout(self.action_row)
        buttons.setContentsMargins(0, 0, 0, 0)
        if not self.compact:
            buttons.addWidget(self.details_button)
        buttons.addWidget(self.edit_button)
        buttons.addWidget(self.keys_label)
        buttons.addStretch(1)
        buttons.addWidget(self.reason_edit, 2)
        buttons.addWidget(self.deny_button)
        buttons.addWidget(self.approve_button)
        buttons.addWidget(self.always)
        outer = QHBoxLayout(self)
        outer.setContentsMargins(3, 4, 10, 4)  # the mark, then the content 10 px in as before
        outer.setSpacing(3)
        outer.addWidget(self.focus_mark)
        body = QVBoxLayout()
        body.setContentsMargins(0, 4, 0, 4)
        body.setSpacing(4)
        outer.addLayout(body, 1)
        body.addLayout(header)
        if not self.compact:
            body.addWidget(self.summary_label)
        body.addWidget(self.decider_label)
        body.addWidget(self.result_label)
        body.addWidget(self.reason_label)
        body.addWidget(self.details_label)
        body.addWidget(self.all_fields_button, 0, Qt.AlignmentFlag.AlignLeft)
        body.addWidget(self.changes_label)
        body.addWidget(self.input_editor)
        body.addWidget(self.edit_error)
        body.addWidget(self.action_row)

        self.destructive_badge.setVisible(call.destructive)
        self.read_badge.setVisible(call.effect == "read")
        self.setProperty("destructive", call.destructive)
        self.setProperty("current", False)
        self.focus_mark.setProperty("current", False)
        self.show_call(call, reviewable=False)

    @property
    def call(self) -> CallRecord:
        """The call record the card shows now."""
        return self._call

    @property
    def expanded(self) -> bool:
        """Whether the call's details (whole input, preview) are open."""
        return self.details_button.isChecked()

    @property
    def declined_reason(self) -> str | None:
        """The reason shown on a card the user declined here, sanitized ("" for none); None otherwise."""
        declined = self._call.status is CallStatus.DENIED and self._call.denial_reason is DenialReason.USER_DECLINED
        return shown_reason(self._typed_reason) if declined and self._typed_reason is not None else None

    @property
    def is_running(self) -> bool:
        """Whether the call is running (its progress shows)."""
        return self._call.status is CallStatus.RUNNING

    def show_call(self, call: CallRecord, *, reviewable: bool) -> None:
        """Show the call's latest record; the buttons are enabled only when ``reviewable``."""
        if call is self._call and reviewable is self._enabled_for_review:
            return
        self._call = call
        self._enabled_for_review = reviewable
        self.summary_label.setText(call.summary)
        self._show_details()
        self.status_label.setProperty("status", call.status.value)
        self.setProperty("status", call.status.value)
        self._show_progress()
        self.status_label.setText(self._status_text())
        preview = _result_preview(call)
        self.result_label.setText(preview)
        self.result_label.setVisible(bool(preview) and preview != call.summary)
        self.decider_label.setText(decider_text(call))
        self.decider_label.setVisible(bool(self.decider_label.text()))
        reason = self.declined_reason
        self.reason_label.setText(f"Your reason: {reason}" if reason else "")
        self.reason_label.setVisible(bool(reason))
        pending = call.status is CallStatus.PENDING
        self._was_pending = self._was_pending or pending
        for control in self._review_controls:
            control.setVisible(pending)
            control.setEnabled(reviewable and pending)
        # A card that waited for review keeps its buttons' room, so nothing moves under the pointer; a read
        # that never waited is one line, and a card with neither buttons nor details has no button row.
        self.action_row.setVisible(self._was_pending or (not self.compact and not self.details_button.isHidden()))
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
        """The card's details as plain text: the input (unset fields folded unless shown), the edits, the preview."""
        return "\n".join(text for text in (self.details_label.text(), self.changes_label.text()) if text)

    @property
    def is_current(self) -> bool:
        """Whether the card is marked as the one the keyboard shortcuts act on."""
        return bool(self.property("current"))

    def set_current(self, current: bool, keys: str = "") -> None:
        """Mark this card as the one the keyboard shortcuts act on (or no longer); ``keys`` says which
        keys do what, shown on the card while it is current."""
        self.keys_label.setText(keys)
        self.keys_label.setVisible(current and bool(keys) and self._call.status is CallStatus.PENDING)
        if self.is_current is not current:
            for widget in (self, self.focus_mark):
                widget.setProperty("current", current)
                widget.style().unpolish(widget)
                widget.style().polish(widget)

    @property
    def deny_started(self) -> bool:
        """Whether a denial is under way on this card: a reason typed, or the reason field has keyboard focus."""
        edit = self.reason_edit
        return edit.isEnabled() and (bool(edit.text().strip()) or self.window().focusWidget() is edit)

    def start_deny(self) -> None:
        """Put keyboard focus in the deny-reason field, after what is typed there: type why, Enter denies."""
        self.reason_edit.setFocus(Qt.FocusReason.OtherFocusReason)  # no select-all: nothing typed is replaced
        self.reason_edit.end(False)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Text typed while the card itself has focus goes into its deny reason (when it can still be denied)."""
        text = event.text()
        typing = bool(text) and text.isprintable() and not event.modifiers() & _TYPING_MODIFIERS
        if typing and self.reason_edit.isEnabled() and self.reason_edit.isVisible():
            self.start_deny()
            self.reason_edit.insert(text)
            return
        super().keyPressEvent(event)

    def _status_text(self) -> str:
        text = call_status_text(self._call)
        if self.is_running and self._elapsed.isValid():
            seconds = self._elapsed.elapsed() // 1000
            text = f"{text} {seconds} s" if seconds else text
            reported = None if self.progress_source is None else self.progress_source(self.call_id)
            if reported is not None:
                done, total, message = reported
                said = sanitize_scalar(message, 60)[0]
                text += f" · {done:g} of {total:g}" if total else f" · {done:g}"
                text += f" ({said})" if said else ""
                self._show_fraction(done, total)
        return text

    def _show_fraction(self, done: float, total: float | None) -> None:
        """A reported fraction makes the bar determinate; without a total it stays a busy indicator."""
        if total and total > 0:
            self.progress_bar.setRange(0, 1000)
            self.progress_bar.setValue(max(0, min(1000, round(done / total * 1000))))

    def _show_progress(self) -> None:
        running = self.is_running
        self.progress_bar.setVisible(running)
        if running and not self._ticker.isActive():
            self._elapsed.start()
            self._ticker.start()
        elif not running and self._ticker.isActive():
            self._ticker.stop()
            self._elapsed.invalidate()

    def _show_elapsed(self) -> None:
        self.status_label.setText(self._status_text())

    def _show_details(self) -> None:
        call = self._call
        lines = []
        changes = []
        details = call.prepared.details if call.prepared is not None else ()
        unset = sum(1 for _, value in details if value == _UNSET)
        folded = bool(unset) and not self.all_fields_button.isChecked()
        fields = "field" if unset == 1 else "fields"
        if details:
            lines.append("Input:")
            lines.extend(f"  {path}: {value}" for path, value in details if not folded or value != _UNSET)
            if folded:
                lines.append(f"  {unset} {fields} unset")
        if call.edits:
            changes.append("You edited:")
            changes.extend(
                f"  {path}: {old if old is not None else '(absent)'} -> {new}" for path, old, new in call.edits
            )
        if self._preview_lines:
            changes.append("Preview:")
            changes.extend(f"  {line}" for line in self._preview_lines)
        self.details_label.setText("\n".join(lines))
        self.changes_label.setText("\n".join(changes))
        self.details_button.setVisible(bool(lines or changes))
        shown_all = f"Hide the {unset} unset {fields}"
        self.all_fields_button.setText(f"Show all {len(details)} fields" if folded else shown_all)
        self._unset_fields = unset
        self._show_expanded()

    def _show_expanded(self) -> None:
        expanded = self.details_button.isChecked()
        self.details_button.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self.details_label.setVisible(expanded and bool(self.details_label.text()))
        self.all_fields_button.setVisible(expanded and self._unset_fields > 0)
        self.changes_label.setVisible(expanded and bool(self.changes_label.text()))

    @property
    def _review_controls(self) -> tuple[QWidget, ...]:
        return (self.approve_button, self.deny_button, self.reason_edit, self.edit_button, self.always)

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
        focus = self.window().focusWidget()
        if focus is not None and self.isAncestorOf(focus):
            # Keep focus on the card, not wherever Qt would move it from a disabled control; the panel
            # then hands it to the next card.
            self.setFocus(Qt.FocusReason.OtherFocusReason)
        for control in self._review_controls:
            control.setEnabled(False)
        self.keys_label.setVisible(False)

    def _on_approve(self, always: str = "") -> None:
        try:
            edited = self.edited_input()
        except ValueError as exc:  # nothing is approved: the card stays open for a fix or a denial
            self.edit_error.setText(str(exc))
            self.edit_error.setVisible(True)
            return
        self.edit_error.setVisible(False)
        self._decided()
        if always:
            self.approve_always_clicked.emit(self.call_id, edited, always)
        else:
            self.approve_clicked.emit(self.call_id, edited)

    def _on_deny(self, always: bool = False) -> None:
        self._decided()
        self._typed_reason = self.reason_edit.text()
        (self.deny_always_clicked if always else self.deny_clicked).emit(self.call_id, self._typed_reason)

    def _on_always(self, choice: str) -> None:
        if not self.approve_button.isEnabled():
            return  # a late pick from a menu left open on a decided card does nothing
        if choice == "never":
            self._on_deny(always=True)
        else:
            self._on_approve(always=choice)
