"""A Qt review panel for one ``Session``, driven by Trio running as a guest of the Qt event loop.

The panel shows what the session's turns do (streamed answer, a card per tool call, the outcome) and
turns clicks into the session's review commands. It decides nothing itself: a click becomes one
``approve`` / ``approve_batch`` / ``deny`` / ``stop`` / ``undo_step`` / ``redo_last_undo`` call, made
from a Trio task so the reducer sees it in order with everything else. Every string that came from the
user, the model, a tool or the document is displayed as plain text.

Needs the ``trioloop[qt]`` extra (PySide6) and, on Linux, the system libraries Qt links to; importing
this module or `qt_application` names the Debian package of one that is missing
(`trioloop.ui.qt_libraries`). Typical use::

    app = qt_application()

    async def main() -> None:
        async with (
            ScriptedProvider(steps) as provider,
            Session(document=doc, kind=kind, provider=provider, model="scripted-1", tools=tools) as session,
        ):
            panel = ReviewPanel(session)
            panel.show()
            await panel.serve()  # returns when the panel's window is closed

    run_trio_guest(main, app=app)
"""

from __future__ import annotations

import contextlib
import enum
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, final

import trio

from trioloop.ui.qt_libraries import QtUnavailable, qt_import_failure, require_qt_libraries

try:
    from PySide6.QtCore import QTimer, Signal
    from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut, QTextCursor
    from PySide6.QtWidgets import (
        QApplication,
        QFrame,
        QHBoxLayout,
        QLineEdit,
        QPlainTextEdit,
        QPushButton,
        QScrollArea,
        QVBoxLayout,
        QWidget,
    )
except ImportError as exc:  # the extra, or a system library Qt links to: say what to install
    raise ImportError(qt_import_failure(exc)) from exc

from trioloop.machine.preview import preview_call
from trioloop.machine.questions import AnswerAction, AnswerError
from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.protocol.messages import JsonValue, ToolCallBlock, flatten_text
from trioloop.runtime.session import Session, SessionBusy
from trioloop.ui._qt_cards import CallCard, call_status_text, plain_label, shown_reason
from trioloop.ui._qt_guest import TrioGuestHost, run_trio_guest
from trioloop.ui._qt_questions import QUESTION_STYLE, QuestionCard

__all__ = [
    "CallCard",
    "NoticeKind",
    "QtUnavailable",
    "ReviewPanel",
    "TrioGuestHost",
    "call_status_text",
    "qt_application",
    "run_trio_guest",
    "shown_reason",
    "turn_notice",
]

_Action = Callable[[], object]


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


#: The panel's keyboard shortcuts: approve / deny the current card, move to the next card, stop the turn.
SHORTCUTS: Final = {"approve": "Alt+A", "deny": "Alt+D", "next": "Alt+N", "stop": "Esc"}

UNDONE_NOTICE: Final = "Undo restored the document as it was before this turn; Redo applies its changes again."
EARLIER_UNDONE_NOTICE: Final = (
    "Undo restored the document as it was before an earlier turn ({turn}); Redo applies its changes again."
)
REDONE_NOTICE: Final = "Redo applied this turn's changes again."
EARLIER_REDONE_NOTICE: Final = "Redo applied the changes of an earlier turn ({turn}) again."


def qt_application(argv: Sequence[str] | None = None) -> QApplication:
    """The running QApplication, or a new one once the system libraries Qt's platform plugin needs are
    known to load: Qt aborts the whole process when its plugin cannot start, so a missing library is
    named first, with its Debian package, as `QtUnavailable`."""
    existing = QApplication.instance()
    if isinstance(existing, QApplication):
        return existing
    require_qt_libraries()
    return QApplication(list(sys.argv if argv is None else argv))


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


_STYLE: Final = """
QFrame#callCard { background: #ffffff; border: 1px solid #c8d1da; border-radius: 6px; }
QFrame#callCard[destructive="true"] { border: 1px solid #cf222e; }
QFrame#callCard[current="true"] { border: 1px solid #0969da; background: #f6fbff; }
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


@final
class ReviewPanel(QWidget):
    """A chat input, the streamed answer, a review card per tool call, Stop, Undo and Redo, for one session.

    The widgets are public attributes so an app can rearrange or restyle them. The panel does
    nothing until ``serve()`` runs inside a Trio run on the Qt main thread (Trio guest mode, see
    ``run_trio_guest``). ``state_changed`` is emitted with each ``TurnState`` the panel has shown,
    ``document_changed`` with each new document it shows (a turn's commit, an undo, a redo), and
    ``busy_changed`` when a turn starts or ends (an app disables what must wait, such as Open or Save).

    Undo steps back one turn a click, as far as the session's undo history reaches (``undo_step``);
    Redo applies again what Undo took back, while nothing newer was committed (``redo_last_undo``).
    """

    state_changed = Signal(object)
    document_changed = Signal(object)
    busy_changed = Signal(bool)

    def __init__(self, session: Session[Any], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("reviewPanel")
        self._session = session
        self._state: TurnState | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._inbox: trio.MemorySendChannel[_Action] | None = None
        self._nursery: trio.Nursery | None = None
        self._closing: trio.Event | None = None
        self._turn_running = False
        self._turn_done = trio.Event()
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

        self.title_label = plain_label(object_name="documentTitle")
        self.stats_label = plain_label(object_name="documentStats")
        self.phase_label = plain_label(object_name="phase")
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
        root.addLayout(controls)
        self.setStyleSheet(_STYLE + QUESTION_STYLE)

        self.send_button.clicked.connect(self._on_send)
        self.prompt_input.returnPressed.connect(self._on_send)
        self.stop_button.clicked.connect(self._on_stop)
        self.undo_button.clicked.connect(self._on_undo)
        self.redo_button.clicked.connect(self._on_redo)
        self.approve_safe_button.clicked.connect(self._on_approve_safe)
        self.shortcuts = {
            name: QShortcut(QKeySequence(keys), self) for name, keys in SHORTCUTS.items()
        }  # public, so an app can rebind them
        self.shortcuts["approve"].activated.connect(lambda: self._decide_current(approve=True))
        self.shortcuts["deny"].activated.connect(lambda: self._decide_current(approve=False))
        self.shortcuts["next"].activated.connect(self._next_card)
        self.shortcuts["stop"].activated.connect(self._on_stop)
        self._show_document()
        self._refresh_controls()

    # -- what an app or a test reads -------------------------------------------------------------

    @property
    def session(self) -> Session[Any]:
        """The session the panel drives."""
        return self._session

    @property
    def state(self) -> TurnState | None:
        """The latest state the panel has shown."""
        return self._state

    @property
    def is_serving(self) -> bool:
        """Whether the panel is connected to its session and takes requests."""
        return self._token is not None

    @property
    def turn_running(self) -> bool:
        """Whether a turn is running (the panel's own send or the session's)."""
        return self._turn_running or self._session.busy

    @property
    def notice_kind(self) -> NoticeKind:
        """The kind of the notice shown now (for tests and styling)."""
        return self._notice_kind

    @property
    def cards(self) -> dict[str, CallCard]:
        """The current turn's cards by call id, in the order the model emitted the calls."""
        return dict(self._cards)

    @property
    def current_card(self) -> CallCard | None:
        """The card the keyboard shortcuts act on (a card still waiting for review), if any."""
        return None if self._current is None else self._cards.get(self._current)

    def card(self, call_id: str) -> CallCard | None:
        """The card of call ``call_id``, or None."""
        return self._cards.get(call_id)

    # -- the Trio side ---------------------------------------------------------------------------

    async def serve(self) -> None:
        """Follow the session and carry out the user's clicks until the panel's window is closed.

        Run it in a Trio run hosted by this widget's Qt event loop. Closing the window stops a turn
        still in flight (it settles ``cancelled``) and returns once it has settled; cancelling
        ``serve`` from outside also works, for panels embedded in a larger window.
        """
        if self._token is not None:
            raise RuntimeError("this ReviewPanel is already being served")
        send, receive = trio.open_memory_channel[_Action](math.inf)
        closing = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                self._token = trio.lowlevel.current_trio_token()
                self._inbox, self._nursery, self._closing = send, nursery, closing
                nursery.start_soon(self._follow_states)
                nursery.start_soon(self._perform, receive)
                self._refresh_controls()
                await closing.wait()
                self._session.stop()
                if self._turn_running:
                    await self._turn_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            send.close()
            self._token = self._inbox = self._nursery = self._closing = None
            self._refresh_controls()

    async def _follow_states(self) -> None:
        async for state in self._session.states():
            self._show(state)

    async def _perform(self, receive: trio.MemoryReceiveChannel[_Action]) -> None:
        """Run the actions the Qt side posted, one at a time, in click order, from a real Trio task."""
        async with receive:
            async for action in receive:
                action()

    def _post(self, action: _Action) -> bool:
        """Hand ``action`` to the Trio side; Qt code must never call into Trio directly."""
        token, inbox = self._token, self._inbox
        if token is None or inbox is None:
            return False

        def deliver() -> None:
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                inbox.send_nowait(action)

        try:
            token.run_sync_soon(deliver)
        except trio.RunFinishedError:
            return False
        return True

    async def _run_turn(self, text: str, done: trio.Event) -> None:
        try:
            if self._closing is None or self._closing.is_set():
                return
            try:
                state = await self._session.send(text)
            except SessionBusy:
                self._set_notice(NoticeKind.WARNING, "Another turn is still running in this session.")
                return
            self._show(state)
        finally:
            self._turn_running = False
            done.set()
            self._refresh_controls()

    def _start_turn(self, text: str, done: trio.Event) -> None:
        if self._nursery is None:
            self._turn_running = False
            done.set()
            self._refresh_controls()
            return
        self._nursery.start_soon(self._run_turn, text, done)

    def _undo(self) -> None:
        shown = self._state
        turn_id = self._session.undo_step()
        if turn_id is not None:
            if turn_id == self._turn_id:
                if shown is not None and any(c.status is CallStatus.SUCCEEDED for c in shown.calls):
                    self._applied_state = shown
                self._history_notice = UNDONE_NOTICE
                undone = self._session.state
                if undone is not None and undone.turn_id == turn_id:
                    self._show(undone)
            else:
                self._history_notice = EARLIER_UNDONE_NOTICE.format(turn=turn_id)
        self._show_document()
        self._refresh_controls()

    def _redo(self) -> None:
        turn_id = self._session.redo_last_undo()
        if turn_id is not None:
            if turn_id == self._turn_id:
                # The session does not publish a redo; the cards show this turn as it stood before Undo.
                self._history_notice = REDONE_NOTICE
                if self._applied_state is not None:
                    self._show(self._applied_state)
            else:
                self._history_notice = EARLIER_REDONE_NOTICE.format(turn=turn_id)
        self._show_document()
        self._refresh_controls()

    # -- Qt slots: each posts exactly one session command ----------------------------------------

    def _on_send(self) -> None:
        text = self.prompt_input.text().strip()
        if not text or not self.is_serving or self.turn_running:
            return
        done = trio.Event()
        self._turn_running, self._turn_done = True, done
        self.prompt_input.clear()
        self._refresh_controls()
        if not self._post(lambda: self._start_turn(text, done)):
            self._turn_running = False
            self._refresh_controls()

    def _on_stop(self) -> None:
        self._post(self._session.stop)

    def _on_undo(self) -> None:
        self.undo_button.setEnabled(False)
        self._post(self._undo)

    def _on_redo(self) -> None:
        self.redo_button.setEnabled(False)
        self._post(self._redo)

    def _on_approve(self, call_id: str, edited_input: dict[str, Any] | None = None) -> None:
        self._post(lambda: self._session.approve(call_id, edited_input))

    def _on_deny(self, call_id: str, reason: str = "") -> None:
        self._post(lambda: self._session.deny(call_id, reason))

    def _decide_current(self, *, approve: bool) -> None:
        card = self.current_card
        if card is None or not card.approve_button.isEnabled():
            return
        (card.approve_button if approve else card.deny_button).click()
        self._next_card()

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
            card.set_current(True)
            self._scroll_to(card)

    def _scroll_to(self, card: QWidget) -> None:
        # After the layout has placed the card: a new card is not positioned until the event loop runs.
        QTimer.singleShot(0, lambda: self.card_area.ensureWidgetVisible(card) if card.isVisible() else None)

    def _on_approve_safe(self) -> None:
        # The batch is exactly the safe calls on screen at the click, never whatever is pending later.
        ids = tuple(card.call_id for card in self._pending_safe_cards())
        if ids:
            self.approve_safe_button.setEnabled(False)
            self._post(lambda: self._session.approve_batch(ids))

    def closeEvent(self, event: QCloseEvent) -> None:
        """Qt's close event: tells the panel's Trio side (`serve`) to end, then lets Qt close the window."""
        closing = self._closing
        if closing is not None:
            self._post(closing.set)
        super().closeEvent(event)

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
        for card in self._cards.values():
            self._card_layout.removeWidget(card)
            card.deleteLater()
        self._cards = {}
        self._current = None

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
                self._card_layout.insertWidget(self._card_layout.count() - 1, card)
                card.show()  # now, not on Qt's queued show: a call can arrive already awaiting review
                self._cards[call.id] = card
                added = added or card
            card.show_call(call, reviewable=reviewable)
        self._show_previews(force=added is not None)
        if added is not None:
            self._scroll_to(added)
        current = self.current_card
        if current is None or current.call.status is not CallStatus.PENDING:
            self._next_card()

    @property
    def question_cards(self) -> dict[str, QuestionCard]:
        """The open questions' cards, by question id (a card goes when its question closes)."""
        return dict(self._question_cards)

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
            self._scroll_to(card)

    def _on_answer(self, question_id: str, action: AnswerAction, values: dict[str, Any] | None) -> None:
        def answer() -> None:
            card = self._question_cards.get(question_id)
            try:
                self._session.answer(question_id, action, values)
            except AnswerError as exc:  # the card checked the values; a race with nothing else can fail here
                if card is not None:
                    card.show_error(f"{exc}.")

        self._post(answer)

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
        self.phase_label.setText(self._phase_text(state))
        if self._history_notice:
            self._set_notice(NoticeKind.INFO, self._history_notice)
        elif state is not None:
            self._set_notice(*turn_notice(state, undoable=undoable))
        if busy is not self._busy_shown:
            self._busy_shown = busy
            self.busy_changed.emit(busy)
