"""Approval rules in the Qt review panel (issue 50), driven headless through its real buttons and keys: a card's
Always… menu adds a session rule that decides the next call without a card, the rules list shows it and Remove
brings the card back, a destructive card offers only the denial, a card asked for by an app rule says so, and an
"always" made in a journaled session is in effect when the session is opened again."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6", reason="the Qt review panel needs the optional 'trioloop[qt]' extra (PySide6)")

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QPainter
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from test_qt_focus import drain, press
from test_qt_review import (
    DOCS,
    Running,
    app_fixture,  # noqa: F401 -- a fixture, shared
    call,
    click,
    document_fixture,  # noqa: F401 -- a fixture, shared
    metadata_tools,
    pending_call,
    review_panel,
)

from trioloop.durable.store import MemoryJournalStore
from trioloop.machine.conditions import Condition
from trioloop.machine.reducer import CallStatus, DenialReason, Phase
from trioloop.machine.rules import SESSION_SOURCE, ApprovalRule, DeciderKind
from trioloop.providers.scripted import ScriptedProvider, ScriptStep
from trioloop.runtime.session import Session
from trioloop.threatmodel import ThreatModel
from trioloop.threatmodel.kind import THREAT_MODEL
from trioloop.ui._qt_rules import AlwaysChoices, RulesList
from trioloop.ui.qt import CallCard, call_status_text

MakeSession = Callable[[ScriptedProvider], Awaitable[Session[ThreatModel]]]


def plain_session(document: ThreatModel, *, rules: Sequence[ApprovalRule] = ()) -> MakeSession:
    async def make(provider: ScriptedProvider) -> Session[ThreatModel]:
        return Session(
            document=document,
            kind=THREAT_MODEL,
            provider=provider,
            model="scripted-1",
            tools=metadata_tools(),
            rules=rules,
        )

    return make


def journaled_session(store: MemoryJournalStore, document: ThreatModel) -> MakeSession:
    async def make(provider: ScriptedProvider) -> Session[ThreatModel]:
        new = not await store.read("s1")
        return await Session.open(
            store,
            "s1",
            kind=THREAT_MODEL,
            provider=provider,
            document=document if new else None,
            model="scripted-1",
            tools=metadata_tools(),
        )

    return make


def panel_on(
    app: QApplication, steps: Sequence[ScriptStep], document: ThreatModel, make: MakeSession
) -> contextlib.AbstractContextManager[Running]:
    """A ReviewPanel over the session ``make`` opens, served by a Trio guest run; closed and finished on exit."""
    return review_panel(app, steps, document, make=make)


def renames(*titles: tuple[str, str]) -> list[ScriptStep]:
    """One step per (call id, title): a rename each, then the model's last word."""
    return [*(ScriptStep(tool_calls=(call(cid, "rename_model", title=t),)) for cid, t in titles), ScriptStep(text="Ok")]


def test_always_allow_this_tool_runs_the_next_call_unasked_until_the_rule_is_removed(
    app: QApplication, document: ThreatModel
) -> None:
    steps = [*renames(("c1", "One"), ("c2", "Two")), *renames(("c3", "Three"))]
    with panel_on(app, steps, document, plain_session(document)) as run:
        panel = run.panel
        assert panel.rules_list.texts == [] and not panel.rules_list.toggle.isChecked()
        run.send("Rename it twice")
        run.until_phase(Phase.AWAITING_APPROVAL)
        card = panel.cards["c1"]
        assert card.always.offered == ("input", "tool", "never")
        click(card.always.button)  # the menu opens under the button; T picks "always allow this tool"
        assert card.always.menu.isVisible()
        QTest.keyClick(card.always.menu, Qt.Key.Key_T)
        run.until_status("c1", CallStatus.SUCCEEDED)

        # The next iteration's call of the same tool ran with no card to click, decided by the session rule.
        run.until_status("c2", CallStatus.SUCCEEDED)
        second = panel.cards["c2"]
        assert second.call.decided_by is not None and second.call.decided_by.kind is DeciderKind.RULE
        assert second.decider_label.text() == "Approved by session rule 1: rename_model"
        assert second.decider_label.isVisibleTo(second)
        assert not card.decider_label.isVisibleTo(card)  # the person decided the first: nothing to add
        run.until_settled()
        assert panel.session.document.metadata.title == "Two"

        # The rules list opened by itself on the new session rule, with a Remove button on it.
        rules = panel.rules_list
        assert rules.toggle.isChecked() and rules.toggle.text() == "Approval rules (1)"
        assert rules.texts == ["session rule 1: allow rename_model"]
        click(rules.remove_buttons[1])
        run.until(lambda: panel.session.rules == () and rules.texts == [], "the rule to be removed")
        assert rules.toggle.text() == "Approval rules (0)"

        run.send("Once more")
        run.until_phase(Phase.AWAITING_APPROVAL)
        third = panel.cards["c3"]
        assert third.call.status is CallStatus.PENDING and third.approve_button.isEnabled()
        click(third.deny_button)
        run.until_settled()
        assert panel.session.document.metadata.title == "Two"


def test_a_destructive_card_offers_only_always_deny_and_a_deny_rule_denies_the_next_call(
    app: QApplication, document: ThreatModel
) -> None:
    steps = [
        ScriptStep(tool_calls=(call("d1", "clear_description"), call("s1", "set_description", text="One"))),
        ScriptStep(tool_calls=(call("s2", "set_description", text="Two"),)),
        ScriptStep(text="Kept."),
    ]
    with panel_on(app, steps, document, plain_session(document)) as run:
        panel = run.panel
        run.send("Clear the description")
        run.until_phase(Phase.AWAITING_APPROVAL)
        card = panel.cards["d1"]
        assert card.destructive_badge.isVisibleTo(card)
        assert card.always.offered == ("never",)
        assert [a.text() for a in card.always.menu.actions()] == ["Deny, and always &deny this tool"]
        assert not card.always.actions_by_choice["tool"].isEnabled()
        assert panel.cards["s1"].always.offered == ("input", "tool", "never")
        card.always.actions_by_choice["never"].trigger()
        run.until_status("d1", CallStatus.DENIED)
        QTest.keyClicks(panel.cards["s1"].reason_edit, "the team writes it")
        panel.cards["s1"].always.actions_by_choice["never"].trigger()
        run.until_status("s1", CallStatus.DENIED)
        assert panel.cards["s1"].declined_reason == "the team writes it"

        run.until_status("s2", CallStatus.DENIED)  # the next iteration: denied by the rule, no card
        denied = panel.cards["s2"]
        assert denied.call.denial_reason is DenialReason.RULE_DENIED
        assert denied.status_label.text() == "Denied by session rule 2"
        assert denied.decider_label.text() == "Denied by session rule 2: set_description"
        run.until_settled()
        assert panel.rules_list.texts == [
            "session rule 1: deny clear_description",
            "session rule 2: deny set_description — the team writes it",
        ]
        assert panel.session.document.metadata.description == document.metadata.description


def test_a_card_asked_for_by_an_app_rule_says_so_and_app_rules_cannot_be_removed(
    app: QApplication, document: ThreatModel
) -> None:
    rules = [
        ApprovalRule(tool="rename_model", verdict="ask", when=(Condition.prefix("/title", "<b>\u202e"),)),
        ApprovalRule(tool="set_description", verdict="allow"),
    ]
    steps = [
        ScriptStep(
            tool_calls=(call("c1", "set_description", text="Reviewed."), call("c2", "rename_model", title="<b>\u202eX"))
        ),
        ScriptStep(text="Done."),
    ]
    with panel_on(app, steps, document, plain_session(document, rules=rules)) as run:
        panel = run.panel
        run.send("Describe and rename")
        run.until_phase(Phase.AWAITING_APPROVAL)
        asked, allowed = panel.cards["c2"], panel.cards["c1"]
        assert asked.call.status is CallStatus.PENDING
        # Who asked, as plain text: markup shown literally, the bidi control (a rule quoting model input) stripped.
        assert asked.decider_label.text() == "Asked by app rule 1: rename_model title starts with <b>"
        assert asked.decider_label.textFormat() is Qt.TextFormat.PlainText
        assert allowed.call.status is CallStatus.APPROVED
        assert allowed.status_label.text() == "Approved by app rule 2"
        assert allowed.decider_label.text() == "Approved by app rule 2: set_description"

        # The app's rules are listed (the list opens with Alt+L) but are not the session's to remove.
        assert not panel.rules_list.toggle.isChecked()
        press(panel, "Alt+L")
        drain(app)
        assert panel.rules_list.toggle.isChecked() and panel.rules_list.body.isVisibleTo(panel)
        assert panel.rules_list.texts == [
            "app rule 1: ask rename_model title starts with <b>",
            "app rule 2: allow set_description",
        ]
        assert panel.rules_list.remove_buttons == {}
        click(asked.approve_button)
        run.until_settled()
        assert panel.session.document.metadata.title == "<b>\u202eX"


def test_always_with_this_input_from_the_keyboard_survives_reopening_the_journal(
    app: QApplication, document: ThreatModel
) -> None:
    store = MemoryJournalStore()
    with panel_on(app, renames(("c1", "One")), document, journaled_session(store, document)) as run:
        panel = run.panel
        run.send("Rename it")
        run.until_phase(Phase.AWAITING_APPROVAL)
        card = panel.current_card
        assert card is panel.cards["c1"]
        press(panel, "Alt+R")  # the current card's Always… menu, its first entry active
        drain(app)
        assert card.always.menu.isVisible()
        assert card.always.menu.activeAction() is card.always.actions_by_choice["input"]
        QTest.keyClick(card.always.menu, Qt.Key.Key_Return)
        run.until_settled()
        assert card.call.status is CallStatus.SUCCEEDED
        assert panel.rules_list.texts == ['session rule 1: allow rename_model input = {"title": "One"}']

    # Another panel, another Session.open of the same journal: the person's rule is in effect again.
    steps = [*renames(("c2", "One")), *renames(("c3", "Other"))]
    with panel_on(app, steps, document, journaled_session(store, document)) as run:
        panel = run.panel
        assert [(r.source, r.number) for r in panel.session.rules] == [(SESSION_SOURCE, 1)]
        assert panel.rules_list.texts == ['session rule 1: allow rename_model input = {"title": "One"}']
        run.send("Rename it the same")
        run.until_status("c2", CallStatus.SUCCEEDED)  # the same input: no card
        run.until_settled()
        run.send("Rename it otherwise")
        run.until_phase(Phase.AWAITING_APPROVAL)
        assert panel.cards["c3"].call.status is CallStatus.PENDING  # another input: a card
        click(panel.cards["c3"].deny_button)
        run.until_settled()


def test_the_status_line_names_the_rule_and_a_card_offers_always_only_while_it_waits(app: QApplication) -> None:
    record = pending_call("rename_model", "Rename")
    assert call_status_text(record) == "Waiting for your review"
    card = CallCard(record)
    try:
        card.show_call(record, reviewable=True)
        card.show()
        assert card.always.isVisibleTo(card) and card.always.button.isEnabled()
        approved: list[tuple[str, object, str]] = []
        card.approve_always_clicked.connect(lambda *args: approved.append(args))
        card.always.actions_by_choice["tool"].trigger()
        assert approved == [("c1", None, "tool")]
        assert not card.always.button.isEnabled()
        card.always.actions_by_choice["never"].trigger()  # a late pick on a decided card does nothing
        assert approved == [("c1", None, "tool")] and card.declined_reason is None
    finally:
        card.close()
        card.deleteLater()
    assert isinstance(card.always, AlwaysChoices) and isinstance(RulesList(), RulesList)


def test_the_rules_screenshot(app: QApplication, document: ThreatModel, tmp_path: Path) -> None:
    """The guide's picture: an app rule asked for a card whose Always… menu is open, a call the session's rule
    approved, and the rules list. Set TRIOLOOP_WRITE_SCREENSHOT=1 to refresh docs/qt-rules.png."""
    rules = [
        ApprovalRule(tool="set_description", verdict="ask", reason="Descriptions are reviewed by the team."),
        ApprovalRule(tool="clear_description", verdict="deny", reason="Descriptions are never deleted."),
    ]
    steps = [
        ScriptStep(text="First the title.", tool_calls=(call("c1", "rename_model", title="Payments"),)),
        ScriptStep(
            text="Now the description.",
            tool_calls=(
                call("c2", "rename_model", title="Payments service"),
                call("c3", "set_description", text="Card payments for the web shop."),
            ),
        ),
        ScriptStep(text="Done."),
    ]
    with panel_on(app, steps, document, plain_session(document, rules=rules)) as run:
        panel = run.panel
        run.send("Tidy the title and the description")
        run.until_phase(Phase.AWAITING_APPROVAL)
        panel.cards["c1"].always.actions_by_choice["tool"].trigger()
        run.until(lambda: panel.card("c3") is not None, "the second step's cards")
        run.until_phase(Phase.AWAITING_APPROVAL)
        asked = panel.cards["c3"]
        assert asked.decider_label.text() == "Asked by app rule 1: set_description"
        panel.answer_view.setMaximumHeight(90)
        drain(app)
        asked.always.open_menu()
        drain(app)
        image = panel.grab().toImage()
        menu = asked.always.menu
        painter = QPainter(image)
        painter.drawImage(menu.mapToGlobal(QPoint(0, 0)) - panel.mapToGlobal(QPoint(0, 0)), menu.grab().toImage())
        painter.end()
        menu.close()
        target = DOCS / "qt-rules.png" if os.environ.get("TRIOLOOP_WRITE_SCREENSHOT") == "1" else tmp_path / "r.png"
        assert image.save(str(target)) and target.stat().st_size > 0
        click(asked.deny_button)
        run.until_settled()


def test_the_guide_shows_the_rules_picture() -> None:
    guide = (DOCS / "howto" / "qt.md").read_text(encoding="utf-8")
    assert "## Rules from the panel" in guide and "../qt-rules.png" in guide
    assert (DOCS / "qt-rules.png").stat().st_size > 0
