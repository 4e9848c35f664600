"""Question cards in the Qt panel (an MCP server's elicitation as a form), driven headless through their real
widgets with Trio as a guest of the Qt loop: fields filled in with their defaults, values checked on the card,
a URL shown as text and never opened, Stop closing an open question."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6", reason="the Qt review panel needs the optional 'trioloop[qt]' extra (PySide6)")

from PySide6.QtGui import QDesktopServices
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QCheckBox, QComboBox, QLineEdit
from test_qt_review import (
    NoInput,
    app_fixture,  # noqa: F401 -- a fixture, shared
    click,
    document_fixture,  # noqa: F401 -- a fixture, shared
    review_panel,
    save_screenshot,
)

from trioloop import Answer, QuestionField, SamplingRequest
from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import ThreatModel
from trioloop.ui._qt_questions import QuestionCard

FORM = (
    QuestionField(
        name="account", kind="text", title="Account name", required=True, description="As on the bank's site"
    ),
    QuestionField(name="limit", kind="integer", title="Daily limit", minimum=0, maximum=10_000, default=500),
    QuestionField(
        name="region", kind="choice", title="Region", options=(("eu", "Europe"), ("us", "USA")), default="eu"
    ),
    QuestionField(name="alerts", kind="boolean", title="Send alerts", default=True),
)


def _asking_tools(got: list[Any], url: str = "") -> Any:
    async def connect(data: NoInput, ctx: ToolExecutionContext[ThreatModel]) -> ToolOutcome[ThreatModel]:
        got.append(
            await ctx.ask(
                source='MCP server "bank"',
                message="Which account should the payment threat model cover? <b>not bold</b>",
                fields=() if url else FORM,
                url=url,
            )
        )
        return ToolOutcome.success("connected")

    return create_tool_registry(
        [
            define_executable_tool(
                name="bank__connect",
                description="Connect the bank account.",
                effect="read",
                destructive=False,
                input_type=NoInput,
                run=connect,
                summarize=lambda i: "Connect the bank account",
            )
        ]
    )


STEPS = [ScriptStep(tool_calls=(ScriptedCall(id="c1", name="bank__connect", input={}),)), ScriptStep(text="Done.")]


def _card(run: Any) -> QuestionCard:
    run.until(lambda: len(run.panel.question_cards) == 1, "the question card")
    (card,) = run.panel.question_cards.values()
    return card


def test_a_form_question_is_filled_in_on_its_card(app: QApplication, document: ThreatModel, tmp_path: Path) -> None:
    got: list[Any] = []
    with review_panel(app, STEPS, document, registry=_asking_tools(got)) as run:
        run.send("Connect my bank")
        card = _card(run)
        assert card.source_label.text() == 'MCP server "bank" asks, during bank__connect'
        assert run.panel.phase_label.text() == "A tool asks you a question…"
        assert "<b>not bold</b>" in card.message_label.text()  # shown literally, as the server's words
        limit = card.inputs["limit"]
        region = card.inputs["region"]
        alerts = card.inputs["alerts"]
        assert isinstance(limit, QLineEdit) and limit.text() == "500"  # the default, filled in
        assert isinstance(region, QComboBox) and region.currentData() == "eu"
        assert isinstance(alerts, QCheckBox) and alerts.isChecked()
        run.panel.resize(760, 620)
        save_screenshot(run.panel, "qt-question.png", tmp_path)

        click(card.accept_button)  # the required account is empty: the card says so and sends nothing
        assert card.error_label.text() == '"Account name" is required.' and card.accept_button.isEnabled()
        account = card.inputs["account"]
        assert isinstance(account, QLineEdit)
        QTest.keyClicks(account, "Household")
        limit.setText("20000")
        click(card.accept_button)
        assert card.error_label.text() == '"Daily limit" takes at most 10000.'
        limit.setText("750")
        region.setCurrentIndex(region.findData("us"))
        click(card.accept_button)
        run.until_settled()
    assert got == [Answer("accept", got[0].content)]
    assert dict(got[0].content) == {"account": "Household", "limit": 750, "region": "us", "alerts": True}
    assert run.panel.question_cards == {}


def test_a_url_question_shows_the_address_and_never_opens_it(
    app: QApplication, document: ThreatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Any] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
    got: list[Any] = []
    url = "https://bank.example.com/connect?session=1"
    with review_panel(app, STEPS, document, registry=_asking_tools(got, url=url)) as run:
        run.send("Connect my bank")
        card = _card(run)
        assert card.url_label is not None and card.url_label.text() == url
        assert card.url_label.openExternalLinks() is False
        click(card.findChild(type(card.accept_button), "copyUrlButton"))
        assert QApplication.clipboard().text() == url
        click(card.decline_button)
        run.until_settled()
    assert got == [Answer("decline")] and opened == []


def test_stop_closes_an_open_question(app: QApplication, document: ThreatModel) -> None:
    got: list[Any] = []
    with review_panel(app, STEPS, document, registry=_asking_tools(got)) as run:
        run.send("Connect my bank")
        _card(run)
        click(run.panel.stop_button)
        run.until_settled()
        state = run.panel.state
        assert state is not None and state.outcome is Outcome.CANCELLED
        assert run.panel.question_cards == {}
        call = state.call("c1")
        assert call is not None and call.status is CallStatus.DENIED


def test_a_sampling_card_shows_every_message_and_sends_only_when_approved(
    app: QApplication, document: ThreatModel, tmp_path: Path
) -> None:
    got: list[Any] = []
    request = SamplingRequest(
        messages=(("user", "Summarize the payment threats in one line. <i>urgent</i>"),),
        system_prompt="You write one-line summaries.",
        model_hint="claude-haiku",
        max_tokens=300,
    )

    async def summarize(data: NoInput, ctx: ToolExecutionContext[ThreatModel]) -> ToolOutcome[ThreatModel]:
        got.append(await ctx.sample(source='MCP server "notes"', request=request))
        return ToolOutcome.success("summarized")

    registry = create_tool_registry(
        [
            define_executable_tool(
                name="notes__summarize",
                description="Summarize the threats.",
                effect="read",
                destructive=False,
                input_type=NoInput,
                run=summarize,
                summarize=lambda i: "Summarize the threats",
            )
        ]
    )
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="c1", name="notes__summarize", input={}),)),
        ScriptStep(text="Seven threats, two open."),
        ScriptStep(text="Done."),
    ]
    with review_panel(app, steps, document, registry=registry) as run:
        run.send("Summarize with the notes server")
        card = _card(run)
        shown = card.sampling_view.toPlainText()
        assert shown == (
            "system prompt:\nYou write one-line summaries.\n\nuser:\nSummarize the payment threats in one line. "
            "<i>urgent</i>"
        )
        assert card.accept_button.text() == "Send to the model"
        run.panel.resize(760, 620)
        save_screenshot(run.panel, "qt-sampling.png", tmp_path)
        click(card.accept_button)
        run.until_settled()
    assert [(s.action, s.text) for s in got] == [("accept", "Seven threats, two open.")]
