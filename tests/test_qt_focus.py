"""The Qt panel's current card and keyboard focus, driven headless through the real shortcuts and keys: the card
the keys act on is in view and marked, a key never decides a card out of view, Alt+D opens the deny reason, and
text typed during a review always lands in a field (never on a disabled button or a decided card)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6", reason="the Qt review panel needs the optional 'trioloop[qt]' extra (PySide6)")

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QWidget
from test_qt_review import (
    Running,
    app_fixture,  # noqa: F401 -- a fixture, shared
    click,
    document_fixture,  # noqa: F401 -- a fixture, shared
    pending_call,
    review_panel,
)

from trioloop.machine.reducer import CallStatus, Phase
from trioloop.threatmodel import ThreatModel
from trioloop.threatmodel.demo import DEMO_LIMITS, DEMO_PROMPT, DEMO_SCRIPT
from trioloop.ui.qt import CallCard, ReviewPanel

#: Room the panel leaves above a card it scrolls to (a card taller than the view shows from its top).
MARGIN = 6


def drain(app: QApplication) -> None:
    """Handle what is queued now (layout, deferred calls), so what a person would see is what is painted."""
    for _ in range(3):
        app.processEvents()


def shown(panel: ReviewPanel, card: QWidget) -> bool:
    """Whether ``card`` is in the card list's view: all of it when it fits, else from its top."""
    view = panel.card_area.viewport()
    top = card.mapTo(view, QPoint(0, 0)).y()
    if card.height() + 2 * MARGIN <= view.height():
        return top >= 0 and top + card.height() <= view.height()
    return 0 <= top <= MARGIN


def press(panel: ReviewPanel, keys: str) -> None:
    """``keys`` pressed where keyboard focus is, as a person would (the panel's window active)."""
    combo = QKeySequence(keys)[0]
    panel.activateWindow()
    QTest.keyClick(focused(panel), combo.key(), combo.keyboardModifiers())


def focused(panel: ReviewPanel) -> QWidget:
    widget = panel.window().focusWidget()
    return panel if widget is None else widget


def type_text(panel: ReviewPanel, text: str) -> None:
    """``text`` typed where keyboard focus is, key by key, as a person would."""
    for char in text:
        panel.activateWindow()
        QTest.keyClicks(focused(panel), char)


def second_iteration(run: Running) -> ReviewPanel:
    """The demo turn at its second step, reviewed in a panel short enough that its cards do not all fit."""
    panel = run.panel
    panel.resize(760, 560)
    run.send(DEMO_PROMPT)
    run.until(lambda: panel.card("toolu_06") is not None, "the second step's cards")
    run.until_phase(Phase.AWAITING_APPROVAL)
    drain(run.app)
    return panel


def test_the_current_card_is_in_view_and_marked_as_its_cards_arrive(app: QApplication, document: ThreatModel) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = second_iteration(run)
        current = panel.current_card
        assert current is panel.cards["toolu_03"]  # the first card that waits for review
        # The later cards (and the invalid one after them) arrived below it; the list did not follow them.
        assert panel.card_area.verticalScrollBar().maximum() > 0
        assert shown(panel, current), "the card Alt+A would approve is out of view"

        # Marked: a bar down its left edge and the keys, which no other card shows.
        other = panel.cards["toolu_04"]
        assert current.is_current and not other.is_current
        assert current.focus_mark.grab().toImage() != other.focus_mark.grab().toImage()
        assert current.keys_label.isVisibleTo(current) and current.keys_label.text() == "Alt+A approves · Alt+D denies"
        assert not other.keys_label.isVisibleTo(other)

        press(panel, "Alt+A")  # decided: the next card becomes current and is scrolled to
        run.until_status("toolu_03", CallStatus.APPROVED)
        drain(app)
        assert panel.current_card is other and other.is_current and not current.is_current
        assert shown(panel, other)
        press(panel, "Alt+N")
        drain(app)
        assert panel.current_card is panel.cards["toolu_05"] and shown(panel, panel.cards["toolu_05"])
        click(panel.stop_button)
        run.until_settled()


def test_a_key_never_decides_a_card_out_of_view(app: QApplication, document: ThreatModel) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = second_iteration(run)
        card = panel.current_card
        assert card is panel.cards["toolu_03"]
        bar = panel.card_area.verticalScrollBar()
        bar.setValue(bar.maximum())  # the person scrolled down to read the last cards
        drain(app)
        assert not shown(panel, card)

        press(panel, "Alt+A")  # the card comes into view instead of being approved unseen
        drain(app)
        assert card.call.status is CallStatus.PENDING and card.approve_button.isEnabled()
        assert shown(panel, card)
        press(panel, "Alt+A")  # now seen: approved
        run.until_status("toolu_03", CallStatus.APPROVED)
        click(panel.stop_button)
        run.until_settled()


def test_alt_d_opens_the_reason_field_and_enter_denies_with_what_was_typed(
    app: QApplication, document: ThreatModel
) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = second_iteration(run)
        card = panel.cards["toolu_03"]
        assert panel.current_card is card
        press(panel, "Alt+D")
        drain(app)
        assert card.call.status is CallStatus.PENDING  # not denied yet: the reason comes first
        assert focused(panel) is card.reason_edit

        type_text(panel, "duplicate of threat-2")
        press(panel, "Return")
        run.until_status("toolu_03", CallStatus.DENIED)
        assert card.reason_label.text() == "Your reason: duplicate of threat-2"
        assert "duplicate of threat-2" in (card.call.result or "")
        assert panel.current_card is panel.cards["toolu_04"]
        assert focused(panel) is panel.current_card  # focus followed the review, off the decided card
        click(panel.stop_button)
        run.until_settled()


def test_text_typed_after_a_decision_becomes_the_next_cards_reason(app: QApplication, document: ThreatModel) -> None:
    """The reported slip: focus on the card's Approve, Alt+A, a reason typed, Alt+D. The typed text must not
    vanish on a disabled or decided widget: it is the next card's reason, and Alt+D denies with it."""
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = second_iteration(run)
        first = panel.cards["toolu_03"]
        first.approve_button.setFocus(Qt.FocusReason.TabFocusReason)
        press(panel, "Alt+A")
        run.until_status("toolu_03", CallStatus.APPROVED)
        drain(app)
        following = panel.cards["toolu_04"]
        assert panel.current_card is following

        type_text(panel, "MFA is not decided yet")
        assert following.reason_edit.text() == "MFA is not decided yet"
        press(panel, "Alt+D")  # a reason is typed: this press denies with it
        run.until_status("toolu_04", CallStatus.DENIED)
        assert "MFA is not decided yet" in (following.call.result or "")
        assert following.declined_reason == "MFA is not decided yet"
        click(panel.stop_button)
        run.until_settled()


def test_esc_in_a_reason_returns_to_the_card_and_keeps_the_text(app: QApplication, document: ThreatModel) -> None:
    with review_panel(app, DEMO_SCRIPT, document, limits=DEMO_LIMITS) as run:
        panel = second_iteration(run)
        card = panel.cards["toolu_03"]
        press(panel, "Alt+D")
        type_text(panel, "not sure")
        press(panel, "Esc")  # backs out of the reason; the turn goes on
        drain(app)
        assert panel.state is not None and panel.state.phase is Phase.AWAITING_APPROVAL
        assert focused(panel) is card and card.reason_edit.text() == "not sure"
        assert card.call.status is CallStatus.PENDING
        press(panel, "Esc")  # from the card, Esc stops the turn
        run.until_settled()


def test_typing_on_a_card_fills_its_reason_and_shortcut_keys_do_not(app: QApplication) -> None:
    record = pending_call("rename_model", "Rename")
    card = CallCard(record)
    try:
        card.show_call(record, reviewable=True)
        card.show()
        card.activateWindow()
        card.setFocus()
        QTest.keyClicks(card, "Keep")
        QTest.keyClick(card, Qt.Key.Key_A, Qt.KeyboardModifier.AltModifier)  # a shortcut, not text
        assert card.reason_edit.text() == "Keep"
        assert card.deny_started
    finally:
        card.close()
        card.deleteLater()
