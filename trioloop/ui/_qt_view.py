"""How the review panel shows a turn: each ``TurnState`` rendered into its widgets.

`PanelView` shows the answer, a card per call and per open question, the previews, the document, the notice and
the controls, and keeps the card the keyboard shortcuts act on in view, marked, and holding keyboard focus whenever
focus would otherwise sit where typing goes nowhere; the Trio side and the actions are the panel's own
(`trioloop.ui.qt`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, Final, final

from PySide6.QtCore import QCoreApplication, QEvent, QPoint, Qt, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QWidget

from trioloop.machine.limits import usd_text
from trioloop.machine.preview import preview_call
from trioloop.machine.questions import AnswerAction
from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.protocol.events import Usage
from trioloop.protocol.messages import JsonValue, ToolCallBlock, flatten_text
from trioloop.runtime.session import Session
from trioloop.runtime.spending import turn_cost
from trioloop.ui._qt_cards import CallCard
from trioloop.ui._qt_layout import PanelLayout
from trioloop.ui._qt_questions import QuestionCard

__all__ = [
    "EARLIER_REDONE_NOTICE",
    "EARLIER_UNDONE_NOTICE",
    "REDONE_NOTICE",
    "UNDONE_NOTICE",
    "UNDONE_PHASE_TEXT",
    "NoticeKind",
    "PanelView",
    "turn_notice",
]


@final
class NoticeKind(enum.StrEnum):
    """How the panel's notice is styled. A limit or a Stop is information, not a fault."""

    NONE = "none"
    INFO = "info"
    WARNING = "warning"


_PHASE_TEXT: Final = {
    Phase.IDLE: "Ready",
    Phase.REQUESTING: "Waiting for the model…",
    Phase.STREAMING: "The model is answering…",
    Phase.AWAITING_APPROVAL: "Waiting for your review",
    Phase.EXECUTING: "Running approved tools…",
}
_OUTCOME_TEXT: Final = {
    Outcome.COMPLETED: "Turn completed",
    Outcome.CANCELLED: "Turn stopped",
    Outcome.BOUNDED: "Turn ended at a limit",
    Outcome.FAILED: "Turn failed",
}
#: The header's word for a settled turn whose changes Undo took back (Redo brings back its outcome's).
UNDONE_PHASE_TEXT: Final = "Turn undone"
#: Room left above (and below) a card scrolled into view, in pixels.
_REVEAL_MARGIN: Final = 6

UNDONE_NOTICE: Final = "Undo restored the document as it was before this turn; Redo applies its changes again."
EARLIER_UNDONE_NOTICE: Final = (
    "Undo restored the document as it was before an earlier turn ({turn}); Redo applies its changes again."
)
REDONE_NOTICE: Final = "Redo applied this turn's changes again."
EARLIER_REDONE_NOTICE: Final = "Redo applied the changes of an earlier turn ({turn}) again."


def _call_input(state: TurnState, call_id: str) -> JsonValue:
    """The raw input the model gave ``call_id`` in this turn (its latest block of that id), for the
    card's editor; None when no block carries it."""
    for message in reversed(state.turn_messages):
        for block in message.content:
            if isinstance(block, ToolCallBlock) and block.id == call_id:
                return block.input
    return None


def turn_notice(state: TurnState | None, *, undoable: bool, undone: bool = False) -> tuple[NoticeKind, str]:
    """The notice the panel shows for ``state``: its kind and plain text (NONE and "" when nothing to say).

    ``undoable`` says whether Undo would revert this turn's changes now, so a Stop notice can say
    truthfully whether anything was kept; ``undone`` says the turn's changes were undone.
    """
    if state is None:
        return NoticeKind.NONE, ""
    if undone:
        return NoticeKind.INFO, UNDONE_NOTICE
    # Every notice (a retry, a skipped frame, a limit) and every refused input, in order: nothing is silent.
    notices = [*state.notices, *(f"Refused ({v.violation.value}): {v.detail}" for v in state.violations)]
    if state.outcome is Outcome.FAILED:
        detail = state.error.message if state.error is not None else "the provider stream ended unexpectedly"
        kept = " Changes already applied were kept and can be undone." if undoable else ""
        return NoticeKind.WARNING, "\n".join([*notices, f"The turn failed: {detail}{kept}"])
    if state.outcome is Outcome.CANCELLED:
        kept = (
            "Changes already applied were kept; Undo reverts them."
            if undoable
            else "No change was applied to the document."
        )
        return NoticeKind.INFO, "\n".join([*notices, f"You stopped this turn; nothing more will run. {kept}"])
    if state.outcome is Outcome.BOUNDED and not notices:
        notices.append("This turn reached one of its limits and was stopped.")
    if notices:
        return NoticeKind.INFO, "\n".join(notices)
    return NoticeKind.NONE, ""


class PanelView(PanelLayout):
    """The panel's view of its session: what it has shown, and how it shows a new ``TurnState``.

    `trioloop.ui.qt.ReviewPanel` adds the Trio side and the user's actions (a card's buttons connect to them).
    """

    if TYPE_CHECKING:  # defined by ReviewPanel (trioloop.ui.qt)
        state_changed: ClassVar[Signal]
        document_changed: ClassVar[Signal]
        busy_changed: ClassVar[Signal]

        @property
        def is_serving(self) -> bool: ...
        @property
        def turn_running(self) -> bool: ...
        @property
        def current_card(self) -> CallCard | None: ...
        def _keys_hint(self) -> str: ...
        def _on_approve(
            self, call_id: str, edited_input: dict[str, Any] | None = None, always: str | None = None
        ) -> None: ...
        def _on_deny(self, call_id: str, reason: str = "", always: str | None = None) -> None: ...
        def _on_deny_always(self, call_id: str, reason: str) -> None: ...
        def _on_answer(self, question_id: str, action: AnswerAction, values: dict[str, Any] | None) -> None: ...

    def __init__(self, session: Session[Any], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._session = session
        self._state: TurnState | None = None
        self._cards: dict[str, CallCard] = {}
        self._question_cards: dict[str, QuestionCard] = {}
        self._turn_id: str | None = None
        self._earlier_text = ""
        self._turn_prompt = ""
        self._turn_texts: dict[int, str] = {}
        self._shown_text = ""
        self._notice_kind = NoticeKind.NONE
        self._current: str | None = None  # the card the keyboard shortcuts act on
        self._previewed_document: object = None
        self._shown_document: object = None
        self._history_notice = ""  # what the last Undo or Redo did, until the next turn
        self._applied_state: TurnState | None = None  # this turn as it stood before Undo, for Redo
        self._busy_shown = False

    # -- the card the keyboard shortcuts act on ----------------------------------------------------

    def _next_card(self) -> None:
        """Make the next card still waiting for review current (wrapping around), and scroll to it."""
        waiting = [cid for cid, card in self._cards.items() if card.call.status is CallStatus.PENDING]
        undecided = [cid for cid in waiting if self._cards[cid].approve_button.isEnabled()]
        if not undecided:
            self._set_current(None)
            return
        after = [cid for cid in undecided if self._current is None or self._order(cid) > self._order(self._current)]
        self._set_current((after or undecided)[0])

    def _order(self, call_id: str) -> int:
        return list(self._cards).index(call_id)

    def _set_current(self, call_id: str | None) -> None:
        if call_id == self._current:
            return
        previous = self.current_card
        if previous is not None:
            previous.set_current(False)
        self._current = call_id
        card = self.current_card
        if card is not None:
            card.set_current(True, self._keys_hint())
            self._reveal(card)
        self._keep_focus()

    def _card_decided(self, call_id: str) -> None:
        """A card's Approve or Deny was clicked (or pressed): the next card becomes current if it was."""
        if call_id == self._current:
            self._next_card()
        self._keep_focus()

    def _keep_focus(self) -> None:
        """Keep keyboard focus where typing lands: a field that takes text keeps it; from anywhere else (a
        button, a decided card, nowhere) it goes to the current card, whose typing fills its deny reason, or,
        with no card to review, to the prompt."""
        focus = self.window().focusWidget()
        card = self.current_card
        if focus is not None and focus.isVisible() and focus.isEnabled():
            if focus is card or focus.testAttribute(Qt.WidgetAttribute.WA_InputMethodEnabled):
                return
            if card is None and not any(c is focus or c.isAncestorOf(focus) for c in self._cards.values()):
                return  # a button, say, that no card's decision moved focus to
        (card if card is not None else self.prompt_input).setFocus(Qt.FocusReason.OtherFocusReason)

    def _in_view(self, card: QWidget) -> bool:
        """Whether ``card`` is in the card list's view: all of it, or enough to fill half the view."""
        if not card.isVisible():
            return False
        _settle_layout()
        view = self.card_area.viewport()
        top = card.mapTo(view, QPoint(0, 0)).y()
        shown = min(top + card.height(), view.height()) - max(top, 0)
        return shown > 0 and shown >= min(card.height(), view.height() // 2)

    def _reveal(self, card: QWidget) -> None:
        """Scroll the card list so ``card`` shows: all of it when it fits, else from its top."""
        if not card.isVisible():
            return
        _settle_layout()  # a card added just now is placed only when its layout request is handled
        bar = self.card_area.verticalScrollBar()
        view = self.card_area.viewport().height()
        margin = min(_REVEAL_MARGIN, view // 4)
        top = card.mapTo(self._card_box, QPoint(0, 0)).y()
        bottom = top + card.height()
        if bottom - top + 2 * margin > view or top - margin < bar.value():
            bar.setValue(top - margin)
        elif bottom + margin > bar.value() + view:
            bar.setValue(bottom + margin - view)

    # -- rendering -------------------------------------------------------------------------------

    def _show(self, state: TurnState) -> None:
        self._show_questions()
        if state is self._state:
            self._refresh_controls()
            return
        if state.turn_id != self._turn_id:
            self._begin_turn(state)
        self._state = state
        self._show_answer(state)
        self._show_cards(state)
        self._show_document()
        self._refresh_controls()
        self.state_changed.emit(state)

    def _begin_turn(self, state: TurnState) -> None:
        self._turn_id = state.turn_id
        self._earlier_text = self._shown_text + "\n\n" if self._shown_text else ""
        first = state.turn_messages[0] if state.turn_messages else None
        self._turn_prompt = flatten_text(first) if first is not None and first.role == "user" else ""
        self._turn_texts = {}
        self._history_notice = ""
        self._applied_state = None
        self._current = None
        self._keep_focus()  # off the last turn's cards, before they go
        for card in self._cards.values():
            self._card_layout.removeWidget(card)
            card.deleteLater()
        self._cards = {}

    def _show_answer(self, state: TurnState) -> None:
        if state.streaming_text:
            self._turn_texts[state.iteration] = state.streaming_text
        parts = [f"You: {self._turn_prompt}"] if self._turn_prompt else []
        parts.extend(text for _, text in sorted(self._turn_texts.items()))
        full = self._earlier_text + "\n\n".join(parts)
        if full == self._shown_text:
            return
        scroll = self.answer_view.verticalScrollBar()
        following = scroll.value() >= scroll.maximum()
        if full.startswith(self._shown_text):
            # A cursor of our own at the document's end: the view's cursor is the reader's (selection, clicks).
            cursor = QTextCursor(self.answer_view.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(full[len(self._shown_text) :])
        else:
            self.answer_view.setPlainText(full)
        self._shown_text = full
        if following:
            scroll.setValue(scroll.maximum())

    def _show_cards(self, state: TurnState) -> None:
        reviewable = self.is_serving and state.is_live
        added = None
        for call in state.calls:
            card = self._cards.get(call.id)
            if card is None:
                card = CallCard(call, _call_input(state, call.id))
                card.progress_source = self._session.call_progress
                card.approve_clicked.connect(self._on_approve)
                card.deny_clicked.connect(self._on_deny)
                card.approve_always_clicked.connect(self._on_approve)
                card.deny_always_clicked.connect(self._on_deny_always)
                self._card_layout.insertWidget(self._card_layout.count() - 1, card)
                card.show()  # now, not on Qt's queued show: a call can arrive already awaiting review
                self._cards[call.id] = card
                added = added or card
            card.show_call(call, reviewable=reviewable)
        self._show_previews(force=added is not None)
        current = self.current_card
        if current is None or current.call.status is not CallStatus.PENDING:
            self._next_card()  # scrolls to the new current card
        current = self.current_card
        if added is not None:
            # The card the keys act on stays in view as later cards arrive below it; with none, the first new one.
            if current is None:
                self._reveal(added)
            elif not self._in_view(current):
                self._reveal(current)

    def _show_questions(self) -> None:
        """A card for each question just opened (first in the list, scrolled to), none for one that closed."""
        open_now = {question.id: question for question in self._session.questions}
        for question_id in [q for q in self._question_cards if q not in open_now]:
            card = self._question_cards.pop(question_id)
            self._card_layout.removeWidget(card)
            card.deleteLater()
        for question_id, question in open_now.items():
            if question_id in self._question_cards:
                continue
            card = QuestionCard(question)
            card.answered.connect(self._on_answer)
            self._card_layout.insertWidget(0, card)
            card.show()
            self._question_cards[question_id] = card
            self._reveal(card)

    def _show_previews(self, *, force: bool) -> None:
        """Each undecided or not yet finished card's preview, from the document as it stands now.

        Recomputed only when the document changed (an earlier approved edit committed) or a card
        arrived; a finished card keeps the preview it had, which is what it did.
        """
        document = self._session.document
        if document is self._previewed_document and not force:
            return
        self._previewed_document = document
        for card in self._cards.values():
            call = card.call
            if call.is_terminal or call.prepared is None or call.effect != "mutate":
                continue
            preview = preview_call(call.prepared, document)
            card.show_preview(() if preview is None else preview.lines())

    def _show_document(self) -> None:
        document = self._session.document
        if document is not self._shown_document:
            self._shown_document = document
            self.document_changed.emit(document)
        title = document.metadata.title or "Untitled threat model"
        self.title_label.setText(title)
        self.setWindowTitle(f"trioloop review: {title}")
        self.stats_label.setText(
            f"{len(document.elements)} elements · {len(document.data_flows)} data flows · "
            f"{len(document.trust_boundaries)} trust boundaries · {len(document.threats)} threats"
        )

    def _pending_safe_cards(self) -> Iterator[CallCard]:
        state = self._state
        if state is None or not state.is_live:
            return
        for card in self._cards.values():
            call = card.call
            if call.status is CallStatus.PENDING and not call.destructive and call.effect == "mutate":
                yield card

    def _phase_text(self, state: TurnState | None) -> str:
        if state is None:
            return _PHASE_TEXT[Phase.IDLE]
        if state.outcome is not None:
            if any(call.status is CallStatus.UNDONE for call in state.calls):
                return UNDONE_PHASE_TEXT  # the turn's outcome no longer describes the document
            return _OUTCOME_TEXT[state.outcome]
        if self._question_cards:
            return "A tool asks you a question…"
        return _PHASE_TEXT.get(state.phase, state.phase.value)

    def _set_notice(self, kind: NoticeKind, text: str) -> None:
        if kind is self._notice_kind and text == self.notice_label.text():
            return
        self._notice_kind = kind
        self.notice_label.setText(text)
        self.notice_frame.setProperty("kind", kind.value)
        self.notice_frame.setVisible(kind is not NoticeKind.NONE)
        for widget in (self.notice_frame, self.notice_label):
            widget.style().unpolish(widget)
            widget.style().polish(widget)

    def _refresh_controls(self) -> None:
        serving = self.is_serving
        state = self._state
        live = state is not None and state.is_live
        busy = self.turn_running
        undoable = self._session.undo_availability().undoable
        history = self._session.undo_history
        self.send_button.setEnabled(serving and not busy)
        self.stop_button.setEnabled(serving and live)
        self.undo_button.setEnabled(serving and not busy and bool(history.entries))
        self.redo_button.setEnabled(serving and not busy and bool(history.redo))
        steps = len(history.entries)
        self.undo_button.setToolTip(
            f"Undo the newest turn's changes ({steps} {'turn' if steps == 1 else 'turns'} can be undone)"
            if steps
            else "Nothing to undo"
        )
        self.redo_button.setToolTip("Apply again what Undo took back" if history.redo else "Nothing to redo")
        self.approve_safe_button.setEnabled(serving and any(True for _ in self._pending_safe_cards()))
        for card in self._cards.values():
            card.show_call(card.call, reviewable=serving and live)
        self.rules_list.show_rules(self._session.rules, removable=serving)
        self.phase_label.setText(self._phase_text(state))
        self.usage_label.setText(usage_line(state, self._session.usage, self._session.cost_usd))
        if self._history_notice:
            self._set_notice(NoticeKind.INFO, self._history_notice)
        elif state is not None:
            self._set_notice(*turn_notice(state, undoable=undoable))
        if busy is not self._busy_shown:
            self._busy_shown = busy
            self.busy_changed.emit(busy)


def _tokens_and_cost(usage: Usage, cost: Decimal | None) -> str:
    text = f"{usage.input_tokens + usage.output_tokens:,} tokens"
    return text if cost is None else f"{text}, {usd_text(cost)}"


def usage_line(state: TurnState | None, session_usage: Usage, session_cost: Decimal | None) -> str:
    """The header's tokens and cost: the turn's (the running one, or the last), then the session's settled turns'."""
    if state is None or state.phase is Phase.IDLE:
        return "" if not session_usage.input_tokens else f"Session: {_tokens_and_cost(session_usage, session_cost)}"
    return (
        f"Turn: {_tokens_and_cost(state.usage, turn_cost(state))} · "
        f"Session: {_tokens_and_cost(session_usage, session_cost)}"
    )


def _settle_layout() -> None:
    """Handle pending layout requests now, so the cards' geometry is where they will be painted."""
    QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)
