"""A Qt review panel for one ``Session``, driven by Trio running as a guest of the Qt event loop.

The panel shows what the session's turns do (streamed answer, a card per tool call, the outcome) and
turns clicks into the session's review commands. It decides nothing itself: a click becomes one
``approve`` / ``approve_batch`` / ``deny`` / ``stop`` / ``undo_step`` / ``redo_last_undo`` / ``remove_rule``
call, made from a Trio task so the reducer sees it in order with everything else. Every string that came from the
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
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, final

import trio

from trioloop.ui.qt_libraries import QtUnavailable, qt_import_failure, require_qt_libraries

try:
    from PySide6.QtCore import Qt, Signal
    from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
    from PySide6.QtWidgets import QApplication, QWidget
except ImportError as exc:  # the extra, or a system library Qt links to: say what to install
    raise ImportError(qt_import_failure(exc)) from exc

from trioloop.machine.questions import AnswerAction, AnswerError
from trioloop.machine.reducer import CallStatus, TurnState
from trioloop.runtime.session import Session, SessionBusy
from trioloop.ui._qt_cards import CallCard, call_status_text
from trioloop.ui._qt_guest import TrioGuestHost, run_trio_guest
from trioloop.ui._qt_plain_text import shown_reason
from trioloop.ui._qt_questions import QuestionCard
from trioloop.ui._qt_view import (
    EARLIER_REDONE_NOTICE,
    EARLIER_UNDONE_NOTICE,
    REDONE_NOTICE,
    UNDONE_NOTICE,
    NoticeKind,
    PanelView,
    turn_notice,
)

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

#: The panel's keyboard shortcuts: approve the current card, deny it (the first press opens its reason field,
#: Enter or a second press denies), move to the next card, stop the turn (in a reason field: back to the card),
#: open the current card's Always… menu (approve or deny and add a session rule), open the rules list.
SHORTCUTS: Final = {
    "approve": "Alt+A",
    "deny": "Alt+D",
    "next": "Alt+N",
    "stop": "Esc",
    "always": "Alt+R",
    "rules": "Alt+L",
}


def qt_application(argv: Sequence[str] | None = None) -> QApplication:
    """The running QApplication, or a new one once the system libraries Qt's platform plugin needs are
    known to load: Qt aborts the whole process when its plugin cannot start, so a missing library is
    named first, with its Debian package, as `QtUnavailable`."""
    existing = QApplication.instance()
    if isinstance(existing, QApplication):
        return existing
    require_qt_libraries()
    return QApplication(list(sys.argv if argv is None else argv))


@final
class ReviewPanel(PanelView):
    """A chat input, the streamed answer, a review card per tool call, Stop, Undo and Redo, for one session.

    The widgets are public attributes so an app can rearrange or restyle them. The panel does
    nothing until ``serve()`` runs inside a Trio run on the Qt main thread (Trio guest mode, see
    ``run_trio_guest``). ``state_changed`` is emitted with each ``TurnState`` the panel has shown,
    ``document_changed`` with each new document it shows (a turn's commit, an undo, a redo), and
    ``busy_changed`` when a turn starts or ends (an app disables what must wait, such as Open or Save).

    Undo steps back one turn a click, as far as the session's undo history reaches (``undo_step``);
    Redo applies again what Undo took back, while nothing newer was committed (``redo_last_undo``).
    The header and the notice describe the document as it is: after Undo of the shown turn they say
    it was undone (not how it ended), after Redo how it ended again and that Redo applied it.

    Each card's **Always…** menu (Alt+R on the current card) approves it and allows its tool with this input, or
    its tool, from now on, or denies it and its tool from now on (a session rule; a destructive card offers only
    the denial). ``rules_list`` shows the rules in effect (Alt+L opens it), with Remove on the session's own.

    The keyboard works on the current card (``current_card``): the card list scrolls to it when it
    becomes current and keeps it in view as later cards arrive, and it is marked (a blue bar, a tint,
    the keys). Alt+A approves it; Alt+D puts focus in its deny-reason field (type why, then Enter or
    Alt+D again denies; with a reason already typed, Alt+D denies at once); Alt+N moves to the next
    card; Esc stops the turn, or from a reason field returns to the card. A key never decides a card out
    of view: it scrolls the card into view instead. Keyboard focus never stays where typing is dropped
    (a disabled button, a decided card): it moves to the current card, where typing goes into the
    deny reason, or to the prompt when nothing waits for review.
    """

    state_changed = Signal(object)
    document_changed = Signal(object)
    busy_changed = Signal(bool)

    def __init__(self, session: Session[Any], parent: QWidget | None = None) -> None:
        super().__init__(session, parent)
        self._token: trio.lowlevel.TrioToken | None = None
        self._inbox: trio.MemorySendChannel[_Action] | None = None
        self._nursery: trio.Nursery | None = None
        self._closing: trio.Event | None = None
        self._turn_running = False
        self._turn_done = trio.Event()

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
        self.shortcuts["next"].activated.connect(self._on_next)
        self.shortcuts["stop"].activated.connect(self._on_escape)
        self.shortcuts["always"].activated.connect(self._on_always_key)
        self.shortcuts["rules"].activated.connect(self._on_rules_key)
        self.rules_list.remove_clicked.connect(self._on_remove_rule)
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

    @property
    def question_cards(self) -> dict[str, QuestionCard]:
        """The open questions' cards, by question id (a card goes when its question closes)."""
        return dict(self._question_cards)

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

    def _on_approve(self, call_id: str, edited_input: dict[str, Any] | None = None, always: str | None = None) -> None:
        self._post(lambda: self._session.approve(call_id, edited_input, always=always or None))
        self._card_decided(call_id)

    def _on_deny(self, call_id: str, reason: str = "", always: str | None = None) -> None:
        self._post(lambda: self._session.deny(call_id, reason, always=always or None))
        self._card_decided(call_id)

    def _on_deny_always(self, call_id: str, reason: str) -> None:
        self._on_deny(call_id, reason, "tool")

    def _on_remove_rule(self, number: int) -> None:
        def remove() -> None:
            self._session.remove_rule(number)  # False for a rule already gone: the list shows what is left
            self._refresh_controls()

        if not self._post(remove):
            self._refresh_controls()

    def _on_answer(self, question_id: str, action: AnswerAction, values: dict[str, Any] | None) -> None:
        def answer() -> None:
            card = self._question_cards.get(question_id)
            try:
                self._session.answer(question_id, action, values)
            except AnswerError as exc:  # the card checked the values; a race with nothing else can fail here
                if card is not None:
                    card.show_error(f"{exc}.")

        self._post(answer)

    def _decide_current(self, *, approve: bool) -> None:
        card = self.current_card
        if card is None or not card.approve_button.isEnabled():
            return
        if not self._in_view(card):
            self._reveal(card)  # a key never decides a card the person cannot see: it shows it first
            return
        if approve:
            card.approve_button.click()
        elif card.deny_started:
            card.deny_button.click()
        else:
            card.start_deny()

    def _on_always_key(self) -> None:
        card = self.current_card
        if card is None or not card.approve_button.isEnabled():
            return
        if not self._in_view(card):
            self._reveal(card)  # as for Alt+A: the card is shown before anything on it is decided
            return
        card.always.open_menu()

    def _on_rules_key(self) -> None:
        rules = self.rules_list
        rules.toggle.setChecked(True)
        first = next(iter(rules.remove_buttons.values()), None)
        target = first if first is not None and first.isEnabled() else rules.toggle
        target.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def _on_next(self) -> None:
        self._next_card()
        card = self.current_card
        if card is not None:
            if not self._in_view(card):
                self._reveal(card)  # the only card left: Alt+N still brings it into view
            card.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def _on_escape(self) -> None:
        focus = self.window().focusWidget()
        for card in self._cards.values():
            if focus is card.reason_edit:
                card.setFocus(Qt.FocusReason.ShortcutFocusReason)  # back out of the reason; what was typed stays
                return
        self._on_stop()

    def _keys_hint(self) -> str:
        keys = {
            name: shortcut.key().toString(QKeySequence.SequenceFormat.NativeText)
            for name, shortcut in self.shortcuts.items()
        }
        return f"{keys['approve']} approves · {keys['deny']} denies"

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
