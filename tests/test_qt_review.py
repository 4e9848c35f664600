"""The Qt review panel, driven headless through its real buttons, with Trio as a guest of the Qt loop.

No pytest-trio here: Qt's event loop is the host. Each test runs Qt events until a condition holds;
the wall-clock cap is a hang guard that fails the test, never a timing assertion.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import unicodedata
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6", reason="the Qt review panel needs the optional 'trioloop[qt]' extra (PySide6)")

import attrs
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from PySide6.QtCore import QEventLoop, Qt, QThread, QTimer
from PySide6.QtGui import Qt as GuiQt
from PySide6.QtGui import QTextCursor
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QAbstractButton, QApplication, QLabel, QWidget
from strategies_document import json_values

from trioloop.machine.limits import DEFAULT_TURN_LIMITS, TurnLimits
from trioloop.machine.reducer import CallRecord, CallStatus, DenialReason, Outcome, Phase, TurnState
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import PreparedCall, ToolOutcome, ToolRegistry, create_tool_registry
from trioloop.protocol.messages import ToolResultBlock
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.session import Session
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import ThreatModel, load_thf, threat_model_session
from trioloop.threatmodel.demo import DEMO_LIMITS, DEMO_PROMPT, DEMO_SCRIPT
from trioloop.ui._qt_plain_text import input_text
from trioloop.ui.qt import CallCard, NoticeKind, ReviewPanel, TrioGuestHost, run_trio_guest, turn_notice

ROOT = Path(__file__).resolve().parent.parent
PAYMENT = ROOT / "examples" / "payment.thf"
DOCS = ROOT / "docs"
#: Hang guard, not a timing assertion. Below the slow tool's 30 s so a Stop that waited for it fails.
CAP_S = 20.0
MARKUP = "<b>bold</b>"


# -- a small tool set over the document's metadata --------------------------------------------


@attrs.frozen(kw_only=True)
class TitleInput:
    title: str = tool_field(description="The new title.", min_length=1, max_length=200)


@attrs.frozen(kw_only=True)
class DescriptionInput:
    text: str = tool_field(description="The new description.", min_length=1, max_length=400)


@attrs.frozen(kw_only=True)
class NoInput:
    pass


@attrs.frozen(kw_only=True)
class NoteInput:
    note: str = tool_field(description="Shown to the reviewer as the summary.", min_length=1, max_length=200)


def _with_metadata(document: ThreatModel, **changes: Any) -> ThreatModel:
    return attrs.evolve(document, metadata=attrs.evolve(document.metadata, **changes))


def _rename(data: TitleInput, ctx: ToolExecutionContext) -> ToolOutcome:
    return ToolOutcome.success("Renamed.", _with_metadata(ctx.document, title=data.title))


async def _counted_rename(data: TitleInput, ctx: ToolExecutionContext) -> ToolOutcome:
    ctx.report_progress(3, 10, "renaming \u202eslowly")
    await trio.sleep(30)  # real clock: only Stop ends it
    return ToolOutcome.success("Renamed.", _with_metadata(ctx.document, title=data.title))


async def _slow_rename(data: TitleInput, ctx: ToolExecutionContext) -> ToolOutcome:
    await trio.sleep(30)  # real clock: only Stop can end this turn in time
    return ToolOutcome.success("Renamed slowly.", _with_metadata(ctx.document, title=data.title))


def _describe(data: DescriptionInput, ctx: ToolExecutionContext) -> ToolOutcome:
    return ToolOutcome.success("Description set.", _with_metadata(ctx.document, description=data.text))


def _clear(data: NoInput, ctx: ToolExecutionContext) -> ToolOutcome:
    return ToolOutcome.success("Description cleared.", _with_metadata(ctx.document, description=None))


def _note(data: NoteInput, ctx: ToolExecutionContext) -> ToolOutcome:
    return ToolOutcome.success("Noted.")


def metadata_tools() -> ToolRegistry:
    return create_tool_registry(
        [
            define_executable_tool(
                name="rename_model",
                description="Rename the threat model.",
                effect="mutate",
                destructive=False,
                input_type=TitleInput,
                run=_rename,
                summarize=lambda i: f'Rename the model to "{i.title}"',
            ),
            define_executable_tool(
                name="slow_rename",
                description="Rename the threat model, slowly.",
                effect="mutate",
                destructive=False,
                input_type=TitleInput,
                run=_slow_rename,
                summarize=lambda i: f'Slowly rename the model to "{i.title}"',
            ),
            define_executable_tool(
                name="counted_rename",
                description="Rename the threat model, saying how far it got.",
                effect="mutate",
                destructive=False,
                input_type=TitleInput,
                run=_counted_rename,
                summarize=lambda i: f'Rename the model to "{i.title}", counting',
            ),
            define_executable_tool(
                name="set_description",
                description="Replace the model's description.",
                effect="mutate",
                destructive=False,
                input_type=DescriptionInput,
                run=_describe,
                summarize=lambda i: f'Set the description to "{i.text}"',
            ),
            define_executable_tool(
                name="clear_description",
                description="Delete the model's description.",
                effect="mutate",
                destructive=True,
                input_type=NoInput,
                run=_clear,
                summarize=lambda i: "Delete the model's description",
            ),
            define_executable_tool(
                name="note",
                description="Leave a note for the reviewer.",
                effect="mutate",
                destructive=False,
                input_type=NoteInput,
                run=_note,
                summarize=lambda i: i.note,
            ),
        ]
    )


def call(call_id: str, name: str, **data: str) -> ScriptedCall:
    return ScriptedCall(id=call_id, name=name, input=dict(data))


# -- driving Qt --------------------------------------------------------------------------------


@pytest.fixture(scope="module", name="app")
def app_fixture() -> QApplication:
    existing = QApplication.instance()
    if isinstance(existing, QApplication):
        return existing
    assert existing is None, "a non-widget QCoreApplication already exists"
    return QApplication([])


@pytest.fixture(name="document")
def document_fixture() -> ThreatModel:
    return load_thf(PAYMENT)


def pending_call(tool_name: str, summary: str, prepared: PreparedCall[Any] | None = None) -> CallRecord:
    """A mutation's call ``c1`` waiting for review, as a card receives it."""
    return CallRecord(
        id="c1",
        tool_name=tool_name,
        input_digest="" if prepared is None else prepared.input_digest,
        summary=summary,
        effect="mutate",
        destructive=False,
        iteration=1,
        status=CallStatus.PENDING,
        prepared=prepared,
    )


def run_until(
    app: QApplication, predicate: Callable[[], bool], what: str, *, host: TrioGuestHost[None] | None = None
) -> None:
    """Process Qt events (so the Trio guest advances) until ``predicate`` holds; fail at the hang guard."""
    waker = QTimer()
    waker.start(20)  # wakes the loop so the guard is checked even if nothing else happens
    deadline = time.monotonic() + CAP_S
    try:
        while not predicate():
            if host is not None and host.is_done:
                host.result()
                pytest.fail(f"the Trio run ended before {what}")
            if time.monotonic() > deadline:
                pytest.fail(f"hang guard: {what} did not happen within {CAP_S} s")
            app.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents)
    finally:
        waker.stop()


def save_screenshot(widget: QWidget, name: str, tmp_path: Path) -> Path:
    """``widget`` as painted now, saved as docs/NAME when TRIOLOOP_WRITE_SCREENSHOT=1 (for the README),
    in the test's temp dir otherwise."""
    target = DOCS / name if os.environ.get("TRIOLOOP_WRITE_SCREENSHOT") == "1" else tmp_path / name
    target.parent.mkdir(parents=True, exist_ok=True)
    QApplication.processEvents()
    assert widget.grab().save(str(target))
    assert target.stat().st_size > 0
    return target


def click(button: QAbstractButton) -> None:
    assert button.isVisible() and button.isEnabled(), f"{button.text()!r} is not clickable"
    QTest.mouseClick(button, Qt.MouseButton.LeftButton)


@attrs.define
class Running:
    app: QApplication
    host: TrioGuestHost[None]
    original: ThreatModel
    _panel: ReviewPanel | None = None

    @property
    def panel(self) -> ReviewPanel:
        assert self._panel is not None
        return self._panel

    def until(self, predicate: Callable[[], bool], what: str) -> None:
        run_until(self.app, predicate, what, host=self.host)

    def until_phase(self, phase: Phase) -> None:
        self.until(lambda: self.panel.state is not None and self.panel.state.phase is phase, f"phase {phase}")

    def until_settled(self) -> None:
        """The turn settled and the panel has taken the session back (Send enabled again)."""

        def settled() -> bool:
            state = self.panel.state
            return state is not None and state.is_settled and not self.panel.turn_running

        self.until(settled, "the turn to settle")

    def until_status(self, call_id: str, status: CallStatus) -> None:
        def reached() -> bool:
            card = self.panel.card(call_id)
            return card is not None and card.call.status is status

        self.until(reached, f"{call_id} to be {status}")

    def send(self, text: str) -> None:
        QTest.keyClicks(self.panel.prompt_input, text)
        click(self.panel.send_button)


@contextlib.contextmanager
def review_panel(
    app: QApplication,
    steps: Sequence[ScriptStep],
    document: ThreatModel,
    *,
    registry: ToolRegistry | None = None,
    limits: TurnLimits = DEFAULT_TURN_LIMITS,
    make: Callable[[ScriptedProvider], Awaitable[Session[ThreatModel]]] | None = None,
) -> Iterator[Running]:
    """A ReviewPanel over a scripted session (the one ``make`` opens on the provider, when given), served by a Trio
    guest run; closed and finished on exit."""
    running = Running(app=app, host=TrioGuestHost(app), original=document)

    async def main() -> None:
        async with ScriptedProvider(steps) as provider:
            if make is None:
                session = threat_model_session(
                    document=document, provider=provider, model="scripted-1", tools=registry, limits=limits
                )
            else:
                session = await make(provider)
            async with session:
                panel = ReviewPanel(session)
                panel.resize(760, 820)
                panel.show()
                running._panel = panel
                await panel.serve()

    running.host.start(main)
    try:
        running.until(lambda: running._panel is not None and running._panel.is_serving, "the panel to serve")
        yield running
    finally:
        if running._panel is not None:
            running._panel.close()
        try:
            run_until(app, lambda: running.host.is_done, "the Trio run to finish after closing the panel")
        finally:
            # Never leave a guest run behind for the next test, even when this one failed.
            running.host.cancel()
            running.host.process_events_until_done()
            if running._panel is not None:
                running._panel.deleteLater()
    running.host.result()


# -- the review flow ---------------------------------------------------------------------------


def test_a_scripted_turn_reviewed_by_clicking(app: QApplication, document: ThreatModel) -> None:
    steps = [
        ScriptStep(
            text="I propose two edits.",
            tool_calls=(call("c1", "rename_model", title="Payments v2"), call("c2", "clear_description")),
            chunk_size=16,
        ),
        ScriptStep(text="Renamed; the description stays."),
    ]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        panel = run.panel
        assert panel.send_button.isEnabled()
        assert not panel.stop_button.isEnabled()
        assert not panel.undo_button.isEnabled()
        run.send("Tidy the model")
        run.until_phase(Phase.AWAITING_APPROVAL)

        cards = panel.cards
        assert list(cards) == ["c1", "c2"]
        rename, clear = cards["c1"], cards["c2"]
        assert rename.tool_label.text() == "rename_model"
        assert rename.summary_label.text() == 'Rename the model to "Payments v2"'
        assert clear.summary_label.text() == "Delete the model's description"
        assert not rename.destructive_badge.isVisibleTo(rename)
        assert clear.destructive_badge.isVisibleTo(clear)
        for card in (rename, clear):
            assert card.approve_button.isEnabled() and card.deny_button.isEnabled()
        assert panel.stop_button.isEnabled()
        assert panel.approve_safe_button.isEnabled()
        assert not panel.send_button.isEnabled()
        assert not panel.undo_button.isEnabled()
        answer = panel.answer_view.toPlainText()
        assert "You: Tidy the model" in answer and "I propose two edits." in answer

        click(rename.approve_button)
        run.until_status("c1", CallStatus.APPROVED)
        # A decided iteration: nothing runs while the other call still waits for its own decision.
        assert clear.approve_button.isEnabled()
        assert panel.state is not None and panel.state.phase is Phase.AWAITING_APPROVAL
        click(clear.deny_button)
        run.until_status("c1", CallStatus.SUCCEEDED)
        assert rename.status_label.text() == "Applied"
        run.until_settled()

        state = panel.state
        assert state is not None and state.outcome is Outcome.COMPLETED
        assert clear.call.status is CallStatus.DENIED and clear.status_label.text() == "Declined"
        assert panel.session.document.metadata.title == "Payments v2"
        assert panel.session.document.metadata.description == document.metadata.description
        assert "Renamed; the description stays." in panel.answer_view.toPlainText()
        assert not panel.stop_button.isEnabled()
        assert panel.send_button.isEnabled()
        assert not panel.notice_frame.isVisibleTo(panel)
        assert not any(c.approve_button.isVisibleTo(c) for c in panel.cards.values())

        assert not panel.redo_button.isEnabled()
        click(panel.undo_button)
        run.until_status("c1", CallStatus.UNDONE)
        assert panel.session.document == document
        assert rename.status_label.text() == "Undone"
        assert not panel.undo_button.isEnabled()  # the only turn in the undo history is undone
        assert panel.redo_button.isEnabled()

        click(panel.redo_button)
        run.until_status("c1", CallStatus.SUCCEEDED)  # the card reads as before Undo
        assert panel.session.document.metadata.title == "Payments v2"
        assert rename.status_label.text() == "Applied"
        assert panel.undo_button.isEnabled() and not panel.redo_button.isEnabled()


def test_approve_all_safe_leaves_the_destructive_call_pending(app: QApplication, document: ThreatModel) -> None:
    steps = [
        ScriptStep(
            tool_calls=(
                call("c1", "rename_model", title="Renamed"),
                call("c2", "clear_description"),
                call("c3", "set_description", text="Payments, reviewed."),
            )
        ),
        ScriptStep(text="Done."),
    ]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        panel = run.panel
        run.send("Edit")
        run.until_phase(Phase.AWAITING_APPROVAL)
        click(panel.approve_safe_button)
        run.until_status("c1", CallStatus.APPROVED)
        run.until_status("c3", CallStatus.APPROVED)

        destructive = panel.cards["c2"]
        assert destructive.call.status is CallStatus.PENDING
        assert destructive.approve_button.isEnabled()
        assert not panel.approve_safe_button.isEnabled()  # nothing safe is left to approve
        click(destructive.deny_button)
        run.until_status("c3", CallStatus.SUCCEEDED)
        run.until_settled()

        metadata = panel.session.document.metadata
        assert (metadata.title, metadata.description) == ("Renamed", "Payments, reviewed.")


def test_a_running_call_shows_progress_until_stop_settles_it(
    app: QApplication, document: ThreatModel, tmp_path: Path
) -> None:
    steps = [ScriptStep(text="This will take a while.", tool_calls=(call("c1", "slow_rename", title="Never"),))]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        panel = run.panel
        run.send("Rename it")
        run.until_phase(Phase.AWAITING_APPROVAL)
        card = panel.cards["c1"]
        assert not card.progress_bar.isVisibleTo(card)
        click(card.approve_button)
        run.until_status("c1", CallStatus.RUNNING)
        assert card.status_label.text() == "Running…"
        assert card.progress_bar.isVisibleTo(card) and card.is_running
        assert (card.progress_bar.minimum(), card.progress_bar.maximum()) == (0, 0)  # indeterminate: busy
        run.until(lambda: card.status_label.text() == "Running… 1 s", "the running call to count a second")
        panel.resize(760, 420)
        save_screenshot(panel, "qt-running.png", tmp_path)

        click(panel.stop_button)  # the hang guard (20 s) is shorter than the tool's 30 s sleep
        run.until_settled()
        assert not card.progress_bar.isVisibleTo(card)  # the indicator stops with the call
        assert card.status_label.text() == "Not run: the turn ended first"

        state = panel.state
        assert state is not None and state.outcome is Outcome.CANCELLED
        record = panel.cards["c1"].call
        assert record.status is CallStatus.DENIED and record.denial_reason is DenialReason.TURN_CANCELLED
        assert panel.session.document == document
        assert not panel.stop_button.isEnabled()
        assert not panel.undo_button.isEnabled()
        assert panel.notice_kind is NoticeKind.INFO
        assert panel.notice_frame.isVisibleTo(panel)
        assert "No change was applied" in panel.notice_label.text()
        assert "This will take a while." in panel.answer_view.toPlainText()


def test_markup_in_a_summary_is_shown_literally(app: QApplication, document: ThreatModel) -> None:
    steps = [ScriptStep(text="<i>not italic</i>", tool_calls=(call("c1", "note", note=MARKUP),))]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        panel = run.panel
        run.send("<u>also literal</u>")
        run.until_phase(Phase.AWAITING_APPROVAL)
        summary = panel.cards["c1"].summary_label
        assert summary.text() == MARKUP
        assert GuiQt.mightBeRichText(MARKUP)  # so an AutoText label would have rendered it as bold "bold"

        # What is painted equals a plain-text rendering of the markup and differs from the rich one.
        assert rendered_like(summary, Qt.TextFormat.PlainText)
        assert not rendered_like(summary, Qt.TextFormat.RichText)

        labels = panel.findChildren(QLabel)
        assert labels and all(label.textFormat() is Qt.TextFormat.PlainText for label in labels)
        answer = panel.answer_view.toPlainText()
        assert "You: <u>also literal</u>" in answer and "<i>not italic</i>" in answer
        click(panel.cards["c1"].deny_button)
        run.until_settled()


def rendered_like(label: QLabel, text_format: Qt.TextFormat) -> bool:
    """Whether ``label`` paints exactly what a label of ``text_format`` with the same text and place paints."""
    reference = QLabel(label.parentWidget())
    try:
        reference.setTextFormat(text_format)
        reference.setWordWrap(label.wordWrap())
        reference.setTextInteractionFlags(label.textInteractionFlags())
        reference.setText(label.text())
        reference.setGeometry(label.geometry())
        reference.show()
        return label.grab().toImage() == reference.grab().toImage()
    finally:
        reference.hide()
        reference.setParent(None)
        reference.deleteLater()


@settings(max_examples=40, deadline=None)
@given(
    summary=st.one_of(
        st.text(st.characters(codec="utf-8"), max_size=80),
        st.sampled_from([MARKUP, "<img src=x>", "<a href='https://x'>click</a>", "&lt;b&gt;", "<h1>big</h1>\n<p>"]),
    ),
    tool_name=st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
)
def test_a_card_shows_any_summary_and_tool_name_as_written(app: QApplication, summary: str, tool_name: str) -> None:
    record = pending_call(tool_name, summary)
    card = CallCard(record)
    try:
        card.resize(600, 160)
        card.show()
        app.processEvents()
        assert card.summary_label.text() == summary
        assert card.tool_label.text() == tool_name
        assert all(label.textFormat() is Qt.TextFormat.PlainText for label in card.findChildren(QLabel))
        assert rendered_like(card.summary_label, Qt.TextFormat.PlainText)
    finally:
        card.close()
        card.deleteLater()


@pytest.mark.parametrize("undoable", [False, True])
@pytest.mark.parametrize("outcome", list(Outcome))
def test_only_a_failed_turn_gets_a_warning_notice(outcome: Outcome, undoable: bool) -> None:
    state = TurnState(phase=Phase.SETTLED, outcome=outcome)
    kind, text = turn_notice(state, undoable=undoable)
    expected = {
        Outcome.COMPLETED: NoticeKind.NONE,
        Outcome.CANCELLED: NoticeKind.INFO,
        Outcome.BOUNDED: NoticeKind.INFO,
        Outcome.FAILED: NoticeKind.WARNING,
    }[outcome]
    assert kind is expected
    assert bool(text) is (kind is not NoticeKind.NONE)
    if outcome is Outcome.CANCELLED:
        assert ("Undo reverts" in text) is undoable


def test_closing_the_window_mid_turn_stops_the_turn(app: QApplication, document: ThreatModel) -> None:
    steps = [ScriptStep(tool_calls=(call("c1", "rename_model", title="Unreviewed"),))]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        run.send("Rename it")
        run.until_phase(Phase.AWAITING_APPROVAL)
        run.panel.close()
        run_until(app, lambda: run.host.is_done, "serve() to return after the window closed")
        session = run.panel.session
        assert session.state is not None and session.state.outcome is Outcome.CANCELLED
        assert session.document == document
        assert not run.panel.is_serving and not run.panel.stop_button.isEnabled()


def test_a_failed_turn_shows_a_warning_notice(app: QApplication, document: ThreatModel) -> None:
    with review_panel(app, [ScriptStep(status=400)], document, registry=metadata_tools()) as run:
        panel = run.panel
        run.send("hello")
        run.until_settled()
        assert panel.state is not None and panel.state.outcome is Outcome.FAILED
        assert panel.notice_kind is NoticeKind.WARNING
        assert panel.notice_label.text().startswith("The turn failed:")
        assert panel.phase_label.text() == "Turn failed"
        assert panel.send_button.isEnabled() and not panel.stop_button.isEnabled()


def test_demo_turn_bounded_notice(app: QApplication, document: ThreatModel) -> None:
    """The CLI demo's script in the panel, to its step limit, shown as information."""
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = run.panel
        run.send(DEMO_PROMPT)
        run.until(lambda: panel.state is not None and panel.state.iteration == 2, "the second iteration")
        run.until_phase(Phase.AWAITING_APPROVAL)
        click(panel.cards["toolu_03"].approve_button)
        run.until_status("toolu_03", CallStatus.APPROVED)
        assert panel.state is not None and panel.state.is_live

        # The reader puts the view's cursor at the top; later text must still land at the end, in order.
        panel.answer_view.moveCursor(QTextCursor.MoveOperation.Start)
        click(panel.approve_safe_button)
        run.until_status("toolu_04", CallStatus.APPROVED)
        click(panel.cards["toolu_05"].deny_button)
        run.until_status("toolu_04", CallStatus.SUCCEEDED)
        run.until(lambda: panel.card("toolu_07") is not None, "the corrected call")
        run.until_phase(Phase.AWAITING_APPROVAL)
        click(panel.cards["toolu_07"].approve_button)
        run.until_settled()

        state = panel.state
        assert state is not None and state.outcome is Outcome.BOUNDED
        assert panel.notice_kind is NoticeKind.INFO
        refused = [f"Refused ({v.violation.value}): {v.detail}" for v in state.violations]
        assert refused  # the demo's model repeats a declined action: the person is told it was refused
        assert panel.notice_label.text() == "\n".join([*state.notices, *refused])
        assert panel.undo_button.isEnabled()
        expected = "\n\n".join([f"You: {DEMO_PROMPT}", *(step.text for step in DEMO_SCRIPT[: state.iteration])])
        assert panel.answer_view.toPlainText() == expected


# -- the guest host ----------------------------------------------------------------------------


def test_run_trio_guest_runs_trio_on_the_qt_main_thread(app: QApplication) -> None:
    async def work(x: int) -> tuple[int, bool, bool]:
        with trio.fail_after(CAP_S):
            await trio.sleep(0.01)
            on_qt_thread = QThread.currentThread() is app.thread()
            return x * 2, on_qt_thread, threading.current_thread() is threading.main_thread()

    assert run_trio_guest(work, 21, app=app) == (42, True, True)


def test_run_trio_guest_raises_what_the_run_raised(app: QApplication) -> None:
    async def fail() -> None:
        await trio.lowlevel.checkpoint()
        raise LookupError("from the trio side")

    with pytest.raises(LookupError, match="from the trio side"):
        run_trio_guest(fail, app=app)


def test_quitting_qt_first_cancels_the_run_and_lets_it_unwind(app: QApplication) -> None:
    unwound: list[bool] = []

    async def forever() -> str:
        with trio.fail_after(CAP_S):
            QTimer.singleShot(50, app.quit)
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(0.01)  # cleanup that needs the loop still runs
                unwound.append(True)
        return "unreachable"

    assert run_trio_guest(forever, app=app) is None
    assert unwound == [True]


# -- cards that show everything, the keyboard, a layout that stays put, a truthful undo ----------------


def _press(panel: ReviewPanel, keys: str) -> None:
    from PySide6.QtGui import QKeySequence

    combo = QKeySequence(keys)[0]
    panel.activateWindow()
    QTest.keyClick(panel, combo.key(), combo.keyboardModifiers())


def _review_iteration_two(run: Running) -> ReviewPanel:
    panel = run.panel
    run.send(DEMO_PROMPT)
    run.until(lambda: panel.state is not None and panel.state.iteration == 2, "the second iteration")
    run.until_phase(Phase.AWAITING_APPROVAL)
    return panel


def test_a_mutation_card_opens_with_its_whole_input_and_its_preview(app: QApplication, document: ThreatModel) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = _review_iteration_two(run)
        threat, delete = panel.cards["toolu_03"], panel.cards["toolu_05"]
        for card in (threat, panel.cards["toolu_04"], delete):  # every mutation, destructive or not
            assert card.expanded and card.details_label.isVisibleTo(card), card.call_id
            assert not card.compact
        assert delete.details_label.textFormat() is Qt.TextFormat.PlainText
        assert delete.details_text.splitlines() == [
            "Input:",
            "  id: flow-10",
            "Preview:",
            "  Removes data flow flow-10 (Consume payment event)",
            "  Removes threat threat-7 (Customer email leaked through notifications)",  # the cascade, named
        ]
        details = threat.details_text
        assert "  threat.mitigation.status: not_started" in details  # a field the summary leaves out
        assert "  Adds threat threat-" in details
        click(delete.details_button)  # a person may still fold one away
        assert not delete.details_label.isVisibleTo(delete) and not delete.expanded
        click(delete.details_button)
        assert delete.details_label.isVisibleTo(delete)
        click(panel.stop_button)
        run.until_settled()


def test_unset_fields_fold_into_one_line_that_one_click_opens(app: QApplication, document: ThreatModel) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = _review_iteration_two(run)
        update = panel.cards["toolu_04"]  # update_element: one real change among thirteen optional fields
        lines = update.details_text.splitlines()
        assert lines[: lines.index("Preview:")] == [
            "Input:",
            "  id: admin-console",
            "  updates.description: Back-office tool; SSO with MFA required.",
            "  12 fields unset",
        ]
        assert update.all_fields_button.isVisibleTo(update) and update.all_fields_button.text() == "Show all 14 fields"

        click(update.all_fields_button)  # the whole input, every null field included
        lines = update.details_text.splitlines()
        fields = lines[1 : lines.index("Preview:")]
        assert len(fields) == 14 and "  updates.type: null" in fields and "  12 fields unset" not in fields
        assert update.all_fields_button.text() == "Hide the 12 unset fields"
        click(update.all_fields_button)
        assert "  updates.type: null" not in update.details_text

        delete = panel.cards["toolu_05"]  # nothing unset: nothing folded, no button
        assert not delete.all_fields_button.isVisibleTo(delete)
        assert "  2 fields unset" in panel.cards["toolu_03"].details_text  # threat.id, threat.flow
        click(panel.stop_button)
        run.until_settled()


def test_only_a_null_field_is_folded_never_the_text_null(app: QApplication) -> None:
    async def never(_: Any) -> ToolOutcome[Any]:
        raise AssertionError("not run")

    prepared: PreparedCall[Any] = PreparedCall(
        summary="Set a note",
        input_digest="d",
        run=never,
        details=(("note", '"null"'), ("owner", "null")),  # the string "null" is shown quoted
    )
    record = pending_call("note", "Set a note", prepared)
    card = CallCard(record)
    try:
        assert card.details_text.splitlines() == ["Input:", '  note: "null"', "  1 field unset"]
        assert card.all_fields_button.text() == "Show all 2 fields"
    finally:
        card.deleteLater()


def test_a_read_card_is_one_line_until_opened(app: QApplication, document: ThreatModel) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = _review_iteration_two(run)
        app.processEvents()
        search, mutation = panel.cards["toolu_02"], panel.cards["toolu_03"]
        assert search.compact and not search.expanded
        assert search.summary_label.text() == 'Search the "elements" entities filtered by text.'
        assert not search.details_label.isVisibleTo(search) and not search.action_row.isVisibleTo(search)
        # One line: the summary, the Details toggle and the status sit in the tool name's row.
        row = search.tool_label.geometry()
        for widget in (search.summary_label, search.details_button, search.status_label):
            assert widget.isVisibleTo(search) and widget.geometry().intersects(row.adjusted(-999, 0, 999, 0))
        assert search.height() < mutation.height() / 3
        before = search.height()
        click(search.details_button)
        app.processEvents()
        assert search.expanded and search.details_label.isVisibleTo(search)
        lines = search.details_text.splitlines()
        assert lines[0] == "Input:" and {"  kind: elements", "  text: vault"} <= set(lines)
        run.until(lambda: search.height() > before, "the read card to open")
        click(panel.stop_button)
        run.until_settled()


def test_keyboard_shortcuts_review_card_by_card(app: QApplication, document: ThreatModel) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = _review_iteration_two(run)
        run.until(lambda: panel.current_card is not None, "a current card")
        assert panel.current_card is panel.cards["toolu_03"] and panel.cards["toolu_03"].property("current")
        _press(panel, "Alt+N")
        assert panel.current_card is panel.cards["toolu_04"]
        _press(panel, "Alt+A")  # approve toolu_04; toolu_05 becomes current
        run.until_status("toolu_04", CallStatus.APPROVED)
        assert panel.current_card is panel.cards["toolu_05"]
        _press(panel, "Alt+D")  # opens the destructive one's reason field; a second press denies it
        assert panel.cards["toolu_05"].call.status is CallStatus.PENDING
        _press(panel, "Alt+D")  # back round to toolu_03
        run.until_status("toolu_05", CallStatus.DENIED)
        assert panel.current_card is panel.cards["toolu_03"]
        assert panel.state is not None and panel.state.phase is Phase.AWAITING_APPROVAL  # toolu_03 undecided
        _press(panel, "Alt+A")
        run.until_status("toolu_03", CallStatus.SUCCEEDED)
        run.until(lambda: panel.card("toolu_07") is not None, "the next step's cards")
        run.until_phase(Phase.AWAITING_APPROVAL)
        _press(panel, "Esc")  # stop
        run.until_settled()
        assert panel.state is not None and panel.state.outcome is Outcome.CANCELLED
        assert panel.cards["toolu_04"].call.status is CallStatus.SUCCEEDED


def test_the_layout_stays_put_after_a_click_and_new_cards_scroll_into_view(
    app: QApplication, document: ThreatModel
) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = run.panel
        panel.resize(760, 560)
        panel = _review_iteration_two(run)
        cards = [panel.cards[i] for i in ("toolu_03", "toolu_04", "toolu_05")]
        before = [card.geometry() for card in cards]
        click(cards[0].approve_button)
        run.until_status("toolu_03", CallStatus.APPROVED)
        app.processEvents()
        assert [card.geometry() for card in cards] == before  # nothing moved under the pointer
        click(cards[1].deny_button)
        click(cards[2].deny_button)
        run.until(lambda: panel.card("toolu_07") is not None, "the next step's cards")
        run.until(lambda: not panel.cards["toolu_07"].visibleRegion().isEmpty(), "the new card to scroll into view")


def _to_the_end_of_the_demo(run: Running) -> ReviewPanel:
    """The demo turn decided to its end: the safe cards of the second step approved, the destructive one denied,
    the corrected call approved; the turn settled (at its step limit)."""
    panel = _review_iteration_two(run)
    click(panel.approve_safe_button)
    run.until_status("toolu_04", CallStatus.APPROVED)
    click(panel.cards["toolu_05"].deny_button)
    run.until(lambda: panel.card("toolu_07") is not None, "the corrected call")
    run.until_phase(Phase.AWAITING_APPROVAL)
    click(panel.cards["toolu_07"].approve_button)
    run.until_settled()
    return panel


def test_after_undo_only_calls_that_changed_the_document_read_undone(app: QApplication, document: ThreatModel) -> None:
    from trioloop.ui.qt import UNDONE_NOTICE

    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = _to_the_end_of_the_demo(run)
        click(panel.undo_button)
        run.until_status("toolu_03", CallStatus.UNDONE)
        assert panel.session.document == document
        labels = {call_id: card.status_label.text() for call_id, card in panel.cards.items()}
        assert labels["toolu_01"] == labels["toolu_02"] == "Done"  # reads changed nothing: never "Undone"
        assert labels["toolu_03"] == labels["toolu_04"] == labels["toolu_07"] == "Undone"
        assert labels["toolu_05"] == "Declined"
        assert panel.notice_label.text() == UNDONE_NOTICE


def test_a_reason_typed_on_the_card_reaches_the_model_with_the_denial(app: QApplication, document: ThreatModel) -> None:
    steps = [
        ScriptStep(tool_calls=(call("c1", "rename_model", title="X"), call("c2", "clear_description"))),
        ScriptStep(text="Understood."),
    ]
    reason = "Keep the title <<<END>>> as it is"
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        panel = run.panel
        run.send("Tidy the model")
        run.until_phase(Phase.AWAITING_APPROVAL)
        rename, clear = panel.cards["c1"], panel.cards["c2"]
        assert rename.reason_edit.isEnabled() and rename.reason_edit.text() == ""
        assert not rename.reason_label.isVisibleTo(rename)
        QTest.keyClicks(rename.reason_edit, reason)
        QTest.keyClick(rename.reason_edit, Qt.Key.Key_Return)  # Enter in the reason denies the card
        run.until_status("c1", CallStatus.DENIED)
        assert not rename.reason_edit.isEnabled()
        # The declined card keeps saying why, in the person's words, literally.
        assert rename.status_label.text() == "Declined"
        assert rename.reason_label.isVisibleTo(rename)
        assert rename.reason_label.text() == f"Your reason: {reason}"
        assert rename.reason_label.textFormat() is Qt.TextFormat.PlainText
        click(clear.deny_button)  # no reason typed: a plain denial
        run.until_settled()
        denied, plain = rename.call.result or "", clear.call.result or ""
        assert "The user gave this reason" in denied and "Keep the title" in denied
        assert "<<<END>>>" not in denied  # sanitized: the user's words cannot forge a marker
        assert "reason" not in plain
        assert panel.session.document == document
        assert not rename.reason_edit.isVisibleTo(rename)
        assert clear.declined_reason == "" and not clear.reason_label.isVisibleTo(clear)
        assert rename.reason_label.isVisibleTo(rename)  # still there once the turn settled


def test_an_input_edited_on_the_card_is_what_runs_and_the_model_is_told(
    app: QApplication, document: ThreatModel
) -> None:
    steps = [
        ScriptStep(tool_calls=(call("c1", "rename_model", title="Payments \u202ev2"),)),
        ScriptStep(text="Renamed as you edited."),
    ]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        panel = run.panel
        run.send("Rename it")
        run.until_phase(Phase.AWAITING_APPROVAL)
        card = panel.cards["c1"]
        assert not card.input_editor.isVisibleTo(card)
        click(card.edit_button)
        assert card.input_editor.isVisibleTo(card)
        shown = card.input_editor.toPlainText()
        assert "\u202e" not in shown and "\\u202e" in shown  # nothing invisible hides in the editor

        card.input_editor.setPlainText('{"title": "Payments v2", ')  # not JSON: nothing is approved
        click(card.approve_button)
        assert card.edit_error.isVisibleTo(card) and "not valid JSON" in card.edit_error.text()
        assert card.approve_button.isEnabled() and card.call.status is CallStatus.PENDING

        card.input_editor.setPlainText('{"title": "Payments v3"}')
        click(card.approve_button)
        run.until_settled()
        assert panel.session.document.metadata.title == "Payments v3"
        assert card.call.status is CallStatus.SUCCEEDED
        assert [path for path, _, _ in card.call.edits] == ["title"]
        assert "You edited:" in card.details_text
        state = panel.state
        assert state is not None
        told = [
            block.content
            for message in state.messages
            for block in message.content
            if isinstance(block, ToolResultBlock) and block.call_id == "c1"
        ]
        assert len(told) == 1 and "The user edited this call's input" in told[0]
        assert not card.edit_button.isEnabled() and not card.edit_error.isVisibleTo(card)


def test_an_editor_left_unchanged_approves_the_call_as_proposed(app: QApplication, document: ThreatModel) -> None:
    steps = [ScriptStep(tool_calls=(call("c1", "rename_model", title="Payments v2"),)), ScriptStep(text="Done.")]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        run.send("Rename it")
        run.until_phase(Phase.AWAITING_APPROVAL)
        card = run.panel.cards["c1"]
        click(card.edit_button)
        card.input_editor.setPlainText('{\n  "title":   "Payments v2"\n}')  # the same object, spaced otherwise
        click(card.approve_button)
        run.until_settled()
        assert run.panel.session.document.metadata.title == "Payments v2"
        assert card.call.edits == ()


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_the_input_editor_hides_nothing_and_reads_back_exactly(value: Any) -> None:
    """For any input: the editor's text parses back to exactly that input, and holds no invisible code
    point (each is a JSON escape), while visible text in any script is shown as itself."""
    shown = input_text({"v": value})
    assert json.loads(shown) == {"v": value}
    assert not any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") and ch != "\n" for ch in shown)
    assert "Zahlungsdienst für Karten" in input_text({"name": "Zahlungsdienst für Karten"})


# -- undo and redo, several turns deep ------------------------------------------------------------


def test_undo_steps_back_turn_by_turn_and_redo_applies_again(app: QApplication, document: ThreatModel) -> None:
    from trioloop.ui.qt import EARLIER_REDONE_NOTICE, EARLIER_UNDONE_NOTICE, REDONE_NOTICE, UNDONE_NOTICE

    steps = [
        ScriptStep(tool_calls=(call("c1", "rename_model", title="Payments v2"),)),
        ScriptStep(text="Renamed."),
        ScriptStep(tool_calls=(call("c2", "set_description", text="Reviewed."),)),
        ScriptStep(text="Described."),
        ScriptStep(tool_calls=(call("c3", "rename_model", title="Payments v3"),)),
    ]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        panel = run.panel
        for prompt, call_id in (("Rename it", "c1"), ("Describe it", "c2")):
            run.send(prompt)
            run.until_phase(Phase.AWAITING_APPROVAL)
            assert not panel.undo_button.isEnabled() and not panel.redo_button.isEnabled()  # a turn runs
            click(panel.cards[call_id].approve_button)
            run.until_settled()
        renamed_and_described = panel.session.document
        assert (renamed_and_described.metadata.title, renamed_and_described.metadata.description) == (
            "Payments v2",
            "Reviewed.",
        )
        assert panel.undo_button.isEnabled() and not panel.redo_button.isEnabled()
        assert "2 turns can be undone" in panel.undo_button.toolTip()

        click(panel.undo_button)  # this turn
        run.until_status("c2", CallStatus.UNDONE)
        assert panel.notice_label.text() == UNDONE_NOTICE
        assert panel.session.document.metadata.description == document.metadata.description
        assert panel.session.document.metadata.title == "Payments v2"
        click(panel.undo_button)  # and the one before it
        run.until(lambda: panel.session.document == document, "the first turn to be undone too")
        assert panel.notice_label.text() == EARLIER_UNDONE_NOTICE.format(turn="turn-1")
        assert not panel.undo_button.isEnabled() and panel.redo_button.isEnabled()

        click(panel.redo_button)  # the turn undone last: the earlier one
        run.until(lambda: panel.session.document.metadata.title == "Payments v2", "the first turn redone")
        assert panel.notice_label.text() == EARLIER_REDONE_NOTICE.format(turn="turn-1")
        assert panel.cards["c2"].status_label.text() == "Undone"  # this turn is still undone
        click(panel.redo_button)
        run.until_status("c2", CallStatus.SUCCEEDED)
        assert panel.session.document == renamed_and_described
        assert panel.notice_label.text() == REDONE_NOTICE
        assert panel.cards["c2"].status_label.text() == "Applied"
        assert not panel.redo_button.isEnabled()

        click(panel.undo_button)  # undo again after a redo: the cards follow
        run.until_status("c2", CallStatus.UNDONE)
        assert panel.redo_button.isEnabled()
        run.send("Rename it again")  # a new turn: what Undo took back can no longer be redone
        run.until_phase(Phase.AWAITING_APPROVAL)
        assert not panel.notice_frame.isVisibleTo(panel)
        click(panel.cards["c3"].approve_button)
        run.until_settled()
        assert panel.undo_button.isEnabled() and not panel.redo_button.isEnabled()


def test_after_undo_the_header_and_notice_say_the_turn_was_undone(app: QApplication, document: ThreatModel) -> None:
    """A turn that ended at a limit, undone: "Turn ended at a limit" no longer describes the document, so the
    header says the turn was undone; Redo brings its outcome back."""
    from trioloop.ui.qt import REDONE_NOTICE, UNDONE_NOTICE

    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = _to_the_end_of_the_demo(run)
        assert panel.phase_label.text() == "Turn ended at a limit"
        assert "used all of its model steps" in panel.notice_label.text()

        click(panel.undo_button)
        run.until_status("toolu_03", CallStatus.UNDONE)
        assert panel.phase_label.text() == "Turn undone"
        assert panel.notice_kind is NoticeKind.INFO and panel.notice_label.text() == UNDONE_NOTICE

        click(panel.redo_button)
        run.until_status("toolu_03", CallStatus.SUCCEEDED)
        assert panel.phase_label.text() == "Turn ended at a limit"
        assert panel.notice_label.text() == REDONE_NOTICE


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_a_declined_reason_is_shown_without_control_or_bidi_code_points(reason: str) -> None:
    from trioloop.machine.reducer import DENY_REASON_MAX
    from trioloop.machine.untrusted_text import is_stripped_code_point
    from trioloop.ui.qt import shown_reason

    shown = shown_reason(reason)
    assert not any(is_stripped_code_point(char) for char in shown)
    assert len(shown) <= DENY_REASON_MAX and shown == shown.strip()
    assert shown_reason("Keep \u202eit\u200b\nas is\x00") == "Keep it as is"


# -- when Qt cannot start: the missing library and its Debian package ---------------------------------


@pytest.mark.parametrize(
    ("error", "library", "package"),
    [
        ("libEGL.so.1: cannot open shared object file: No such file or directory", "libEGL.so.1", "libegl1"),
        ("libGL.so.1: cannot open shared object file: No such file or directory", "libGL.so.1", "libgl1"),
        ("libxkbcommon.so.0: cannot open shared object file", "libxkbcommon.so.0", "libxkbcommon0"),
        ("libfontconfig.so.1: cannot open shared object file", "libfontconfig.so.1", "libfontconfig1"),
        ("libdbus-1.so.3: cannot open shared object file: No such file or directory", "libdbus-1.so.3", "libdbus-1-3"),
        (
            "qt.qpa.plugin: From 6.5.0, xcb-cursor0 or libxcb-cursor0 is needed to load the Qt xcb platform plugin.\n"
            'qt.qpa.plugin: Could not load the Qt platform plugin "xcb" in "" even though it was found.',
            "libxcb-cursor.so.0",
            "libxcb-cursor0",
        ),
        (
            "Cannot load library /venv/PySide6/Qt/plugins/platforms/libqxcb.so: (libxcb-icccm.so.4: cannot open "
            "shared object file: No such file or directory)",  # QT_DEBUG_PLUGINS=1: the plugin is not the culprit
            "libxcb-icccm.so.4",
            "libxcb-icccm4",
        ),
        ("/usr/lib/libQt6Gui.so.6: libxkbcommon-x11.so.0 => not found", "libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ],
)
def test_a_qt_start_error_names_the_library_and_its_debian_package(error: str, library: str, package: str) -> None:
    from trioloop.ui.qt_libraries import INSTALL_COMMAND, XCB_PACKAGES, missing_library, qt_start_advice

    missing = missing_library(error)
    assert missing is not None and (missing.library, missing.package, missing.known) == (library, package, True)
    advice = qt_start_advice(error)
    assert advice is not None
    assert f"the system library {library} is missing" in advice
    assert f"apt-get install -y {package}" in advice
    assert INSTALL_COMMAND in advice and f"{' '.join(XCB_PACKAGES)} for X11" in advice


def test_the_advice_covers_an_unknown_library_a_bare_plugin_failure_and_a_missing_extra() -> None:
    from trioloop.ui.qt_libraries import (
        INSTALL_COMMAND,
        XCB_INSTALL_COMMAND,
        debian_package,
        qt_import_failure,
        qt_start_advice,
    )

    assert INSTALL_COMMAND == "apt-get install -y libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3"
    guessed = debian_package("libfoo2.so.5")  # Debian's rule: a name ending in a digit takes a hyphen
    assert (guessed.package, guessed.known) == ("libfoo2-5", False)
    assert debian_package("libbar.so.3").package == "libbar3"
    advice = qt_start_advice("libfoo2.so.5: cannot open shared object file")
    assert advice is not None and "apt-file search libfoo2.so.5" in advice

    bare = qt_start_advice(
        "This application failed to start because no Qt platform plugin could be initialized. "
        "Reinstalling the application may fix this problem."
    )
    assert bare is not None and XCB_INSTALL_COMMAND in bare and "QT_DEBUG_PLUGINS=1" in bare
    assert qt_start_advice("ZeroDivisionError: division by zero") is None

    halted = ImportError("import of PySide6 halted; None in sys.modules", name="PySide6")
    assert 'pip install "trioloop[qt]"' in qt_import_failure(halted)
    egl = ImportError("libEGL.so.1: cannot open shared object file: No such file or directory")
    assert "apt-get install -y libegl1" in qt_import_failure(egl)


def test_the_preflight_checks_the_xcb_plugin_libraries_only_for_x11() -> None:
    from trioloop.ui.qt_libraries import QtUnavailable, missing_qt_libraries, require_qt_libraries

    absent = {"libxcb-cursor.so.0", "libdbus-1.so.3"}

    def loads(library: str) -> bool:
        return library not in absent

    assert [m.package for m in missing_qt_libraries("xcb", loads=loads)] == ["libdbus-1-3", "libxcb-cursor0"]
    assert [m.package for m in missing_qt_libraries("offscreen", loads=loads)] == ["libdbus-1-3"]
    assert missing_qt_libraries("xcb", loads=lambda _: True) == ()
    with pytest.raises(QtUnavailable) as raised:
        require_qt_libraries("xcb", loads=loads)
    message = str(raised.value)
    assert "libxcb-cursor.so.0 (package libxcb-cursor0)" in message
    assert "apt-get install -y libdbus-1-3 libxcb-cursor0" in message
    assert missing_qt_libraries("offscreen") == ()  # this test run: Qt loads, so nothing is missing


def test_qt_application_names_what_is_missing_before_qt_would_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    import trioloop.ui.qt as qt_module
    from trioloop.ui import qt_libraries
    from trioloop.ui.qt import QtUnavailable, qt_application

    assert qt_application() is QApplication.instance()  # an application already running is the one

    created: list[list[str]] = []

    class NoApplicationYet:
        def __init__(self, argv: list[str]) -> None:
            created.append(argv)

        @staticmethod
        def instance() -> None:
            return None

    monkeypatch.setattr(qt_module, "QApplication", NoApplicationYet)
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    monkeypatch.setattr(qt_libraries, "_loads", lambda library: library != "libxcb-cursor.so.0")
    with pytest.raises(QtUnavailable, match=r"apt-get install -y libxcb-cursor0"):
        qt_application(["app"])
    assert created == []  # Qt was never asked to start
    monkeypatch.setattr(qt_libraries, "_loads", lambda library: True)
    qt_application(["app"])
    assert created == [["app"]]


_MISSING_EGL = """
import importlib.abc, sys
class MissingEgl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "PySide6.QtGui":
            raise ImportError("libEGL.so.1: cannot open shared object file: No such file or directory", name=name)
        return None
sys.meta_path.insert(0, MissingEgl())
"""


@pytest.mark.parametrize(
    "entry",
    ["import trioloop.ui.qt", f"import runpy; runpy.run_path({str(ROOT / 'examples' / 'qt_review.py')!r})"],
    ids=["panel", "example"],
)
def test_a_missing_system_library_is_named_at_import(entry: str) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _MISSING_EGL + entry], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 1
    assert "the system library libEGL.so.1 is missing" in done.stderr
    assert "apt-get install -y libegl1" in done.stderr


# -- the example: Open, Save, Undo and Redo through its widgets ----------------------------------------


def load_example() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("qt_review_example", ROOT / "examples" / "qt_review.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def example_window(app: QApplication, path: Path | None) -> Iterator[tuple[Any, TrioGuestHost[None]]]:
    """examples/qt_review.py's window on ``path`` (None: the bundled file), its sessions run by a guest run."""
    from trioloop.threatmodel import load_thf_file

    example = load_example()
    window = example.ReviewWindow(load_thf_file(path if path is not None else example.DOCUMENT), path)
    window.resize(780, 980)
    window.show()
    host: TrioGuestHost[None] = TrioGuestHost(app)
    host.start(example.review, window)
    try:
        run_until(app, lambda: window.panel is not None and window.panel.is_serving, "the first session", host=host)
        yield window, host
    finally:
        window.close()
        try:
            run_until(app, lambda: host.is_done, "the example's run to finish after closing the window")
        finally:
            host.cancel()
            host.process_events_until_done()
            window.deleteLater()
    host.result()


def following(window: Any, host: TrioGuestHost[None]) -> Running:
    """The helpers of `review_panel`, on the example window's current panel."""
    app = host.app
    assert isinstance(app, QApplication)
    return Running(app=app, host=host, original=window.file.model, panel=window.panel)


def _review_the_demo_turn(run: Running, window: Any) -> None:
    """The demo turn, reviewed: safe edits approved, the destructive one declined, the correction approved."""
    panel = run.panel
    click(panel.send_button)  # the example fills in the demo's prompt
    run.until(lambda: panel.state is not None and panel.state.iteration == 2, "the second iteration")
    run.until_phase(Phase.AWAITING_APPROVAL)
    assert not window.open_button.isEnabled() and not window.save_button.isEnabled()  # a turn runs
    click(panel.approve_safe_button)
    run.until_status("toolu_04", CallStatus.APPROVED)
    click(panel.cards["toolu_05"].deny_button)
    run.until(lambda: panel.card("toolu_07") is not None, "the corrected call")
    run.until_phase(Phase.AWAITING_APPROVAL)
    click(panel.cards["toolu_07"].approve_button)
    run.until_settled()


def test_the_example_saves_into_its_file_and_undoes_and_redoes(
    app: QApplication, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioloop.threatmodel import load_thf_file

    path = tmp_path / "payment.thf"
    note = "# Reviewed every quarter: keep this note.\n"
    path.write_text(note + PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    with example_window(app, path) as (window, host):
        run = following(window, host)
        panel = run.panel
        assert not window.save_button.isEnabled() and window.open_button.isEnabled()  # nothing to save yet
        assert not panel.undo_button.isEnabled() and not panel.redo_button.isEnabled()
        _review_the_demo_turn(run, window)
        edited = panel.session.document
        assert edited != window.file.model
        assert window.unsaved and window.save_button.isEnabled() and "unsaved" in window.file_label.text()
        assert window.windowTitle().startswith("payment.thf *")

        click(window.save_button)
        saved = path.read_text(encoding="utf-8")
        assert saved.startswith(note)  # the file's own layout and comments stay
        assert load_thf_file(path).model == edited
        assert not window.unsaved and not window.save_button.isEnabled()
        assert window.message_label.text() == "Saved payment.thf"

        click(panel.undo_button)
        run.until(lambda: panel.session.document == load_thf_file(PAYMENT).model, "the turn undone")
        assert window.unsaved and window.save_button.isEnabled() and panel.redo_button.isEnabled()
        click(panel.redo_button)
        run.until(lambda: panel.session.document == edited, "the turn redone")
        assert not window.unsaved and not window.save_button.isEnabled()
        assert path.read_text(encoding="utf-8") == saved


def test_the_example_opens_another_file_in_a_new_session(
    app: QApplication, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog, QMessageBox

    first = tmp_path / "payment.thf"
    first.write_text(PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    other = tmp_path / "other.thf"
    other.write_text(first.read_text(encoding="utf-8").replace("title: Payment platform", "title: Ledger", 1))
    broken = tmp_path / "broken.thf"
    broken.write_text("version: [unclosed\n", encoding="utf-8")
    chosen: list[str] = []
    answers: list[QMessageBox.StandardButton] = []

    def get_open_file_name(*args: Any) -> tuple[str, str]:
        return (chosen.pop(0), "Threat models (*.thf)")

    def question(*args: Any) -> QMessageBox.StandardButton:
        return answers.pop(0)

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(get_open_file_name))
    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    with example_window(app, first) as (window, host):
        run = following(window, host)
        panel = run.panel
        assert panel.title_label.text() == "Payment platform"

        chosen.append("")  # the dialog cancelled: nothing changes
        click(window.open_button)
        chosen.append(str(broken))  # a file that does not load: said so, the session goes on
        click(window.open_button)
        assert window.message_label.text().startswith("Not opened:")
        assert window.panel is panel and panel.is_serving and window.path == first

        _review_the_demo_turn(run, window)
        assert window.unsaved
        answers.append(QMessageBox.StandardButton.No)  # keep the unsaved changes: nothing is opened
        click(window.open_button)
        assert window.panel is panel and chosen == []

        answers.append(QMessageBox.StandardButton.Yes)
        chosen.append(str(other))
        click(window.open_button)
        run_until(app, lambda: window.panel is not panel and window.panel.is_serving, "the new session", host=host)
        fresh = window.panel
        assert fresh.title_label.text() == "Ledger" and fresh.session is not panel.session
        assert fresh.state is None and fresh.cards == {}
        assert window.path == other and window.file_label.text() == str(other)
        assert not window.unsaved and not window.save_button.isEnabled()
        assert not fresh.undo_button.isEnabled()  # a new session: its own undo history
        assert panel.session.state is not None and panel.session.state.is_settled


def test_the_example_never_overwrites_its_bundled_file(
    app: QApplication, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    from trioloop.threatmodel import load_thf

    before = PAYMENT.read_bytes()
    target = tmp_path / "mine.thf"
    asked: list[str] = []

    def get_save_file_name(*args: Any) -> tuple[str, str]:
        asked.append(args[1])
        return (str(target), "")

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(get_save_file_name))
    with example_window(app, None) as (window, _host):
        assert window.path is None and window.save_button.isEnabled()  # Save asks where
        click(window.save_button)
        assert asked == ["Save the threat model"] and window.path == target
        assert load_thf(target) == window.panel.session.document
    assert PAYMENT.read_bytes() == before


def test_the_example_reports_what_keeps_qt_from_starting(
    app: QApplication, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trioloop.ui.qt_libraries import QtUnavailable

    example = load_example()

    def unavailable() -> None:
        raise QtUnavailable("Qt cannot start: ... apt-get install -y libxcb-cursor0")

    monkeypatch.setattr(example, "qt_application", unavailable)
    assert example.main([]) == 1
    assert "apt-get install -y libxcb-cursor0" in capsys.readouterr().err


def test_the_example_mid_review_screenshot(app: QApplication, tmp_path: Path) -> None:
    """The README's picture: reads on one line, mutations open, a declined card with its reason.

    Set TRIOLOOP_WRITE_SCREENSHOT=1 to refresh docs/qt-review.png; otherwise the image goes to a temp dir.
    """
    with example_window(app, None) as (window, host):
        run = following(window, host)
        panel = run.panel
        click(panel.send_button)
        run.until(lambda: panel.state is not None and panel.state.iteration == 2, "the second iteration")
        run.until_phase(Phase.AWAITING_APPROVAL)
        click(panel.cards["toolu_03"].approve_button)
        run.until_status("toolu_03", CallStatus.APPROVED)
        delete = panel.cards["toolu_05"]
        QTest.keyClicks(delete.reason_edit, "flow-10 feeds the fraud queue; keep it")
        click(delete.deny_button)
        run.until_status("toolu_05", CallStatus.DENIED)
        assert delete.reason_label.text() == "Your reason: flow-10 feeds the fraud queue; keep it"
        assert panel.current_card is panel.cards["toolu_04"]
        window.resize(860, 1240)
        panel.answer_view.setMaximumHeight(110)
        app.processEvents()
        panel.card_area.verticalScrollBar().setValue(0)
        save_screenshot(window, "qt-review.png", tmp_path)
        click(panel.stop_button)
        run.until_settled()


def test_the_guide_lists_the_packages_and_shows_pictures_that_exist() -> None:
    import re

    from trioloop.ui.qt_libraries import INSTALL_COMMAND, XCB_INSTALL_COMMAND, missing_qt_libraries

    guide = ROOT / "docs" / "howto" / "qt.md"
    section = guide.read_text(encoding="utf-8").replace("\\\n    ", "")  # a command continued on the next line
    # The guide's commands are the module's, exactly; and together they install every library the preflight
    # checks for an X11 display (the widest list), so following the guide leaves nothing for it to report.
    commands = [line.split("#")[0].strip() for line in section.splitlines() if line.startswith("apt-get install")]
    assert commands == [INSTALL_COMMAND, XCB_INSTALL_COMMAND]
    listed = {package for command in commands for package in command.split()[3:]}
    assert listed == {missing.package for missing in missing_qt_libraries("xcb", loads=lambda _: False)}
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section)
    assert images == ["../qt-review.png", "../qt-running.png"]
    assert all((guide.parent / image).stat().st_size > 0 for image in images)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/qt-review.png)" in readme and (ROOT / "docs" / "qt-review.png").stat().st_size > 0


def test_a_running_call_shows_the_progress_its_tool_reports(app: QApplication, document: ThreatModel) -> None:
    steps = [ScriptStep(text="Counting.", tool_calls=(call("c1", "counted_rename", title="Never"),))]
    with review_panel(app, steps, document, registry=metadata_tools()) as run:
        panel = run.panel
        run.send("Rename it")
        run.until_phase(Phase.AWAITING_APPROVAL)
        card = panel.cards["c1"]
        click(card.approve_button)
        run.until_status("c1", CallStatus.RUNNING)
        run.until(lambda: "3 of 10" in card.status_label.text(), "the reported progress on the card")
        assert "(renaming slowly)" in card.status_label.text()  # the tool's words, bidi controls stripped
        assert (card.progress_bar.maximum(), card.progress_bar.value()) == (1000, 300)  # a fraction: determinate
        click(panel.stop_button)
        run.until_settled()
        assert not card.progress_bar.isVisibleTo(card)
