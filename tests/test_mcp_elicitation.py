"""A server's ``elicitation/create`` through trioloop's host: a question card for the person during the call, over
stdio and streamable HTTP against the real fixture server (tests/fixtures/mcp_faulty_server.py), in a real turn.
Never answered by anyone but the person; Stop cancels it; a form MCP does not allow is refused, not guessed."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import mcp_types
import pytest
import trio

from trioloop import Question, QuestionField, Session
from trioloop.machine.reducer import CallRecord, Outcome, Phase, TurnState
from trioloop.mcp import HttpServer, McpServer, McpToolset, StdioServer
from trioloop.mcp.elicitation import UnusableRequest, question_parts
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.threatmodel import load_thf, threat_model_session

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAULTY = str(FIXTURES / "mcp_faulty_server.py")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_mcp_toolset import _http_server  # noqa: E402  # the HTTP fixture server's launcher

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"

Answerer = Callable[[Session[Any], Question], Awaitable[None]]


def stdio() -> StdioServer:
    return StdioServer(name="ff", command=sys.executable, args=(FAULTY, "stdio"), tools={})


async def _turn(server: McpServer, tool: str, answerer: Answerer) -> tuple[TurnState, list[Question], CallRecord]:
    """One turn that calls ``tool`` (approved at once); each question it asks goes to ``answerer``."""
    steps = [ScriptStep(tool_calls=(ScriptedCall(id="c1", name=f"ff__{tool}"),)), ScriptStep(text="Done.")]
    asked: list[Question] = []
    async with trio.open_nursery() as nursery, ScriptedProvider(steps) as provider:
        session = threat_model_session(
            document=load_thf(PAYMENT), provider=provider, model="scripted-1", tools=(), nursery=nursery
        )
        await session.add_toolset(McpToolset(server))

        async def face() -> None:
            async for state in session.states():
                if state.phase is Phase.AWAITING_APPROVAL:
                    session.approve("c1")
                for question in session.questions:
                    if question not in asked:
                        asked.append(question)
                        nursery.start_soon(answerer, session, question)

        nursery.start_soon(face)
        final = await session.send("go")
        nursery.cancel_scope.cancel()
    call = final.call("c1")
    assert call is not None
    return final, asked, attrs.evolve(call, result=(call.result or "").replace('\\"', '"'))


async def _accept_name(session: Session[Any], question: Question) -> None:
    assert session.answer(question.id, "accept", {"name": "Ada"})


async def test_a_form_elicitation_is_a_card_and_the_server_gets_the_persons_values() -> None:
    final, asked, call = await _turn(stdio(), "ask", _accept_name)
    assert final.outcome is Outcome.COMPLETED
    [question] = asked
    assert question.source == 'MCP server "ff"' and question.call_id == "c1" and question.tool_name == "ff__ask"
    assert question.message == "Please give your contact details."
    fields = {f.name: f for f in question.fields}
    assert fields["name"].required and fields["name"].description == "Who you are"
    assert fields["age"].default == 30 and fields["age"].minimum == 0 and fields["age"].maximum == 150
    assert fields["plan"].kind == "choice" and [v for v, _ in fields["plan"].options] == ["free", "pro"]
    # The server received the person's name and every default the card showed (SEP-1034).
    assert '{"age": 30, "name": "Ada", "plan": "free", "subscribe": true}' in (call.result or "")


async def test_a_declined_form_and_a_url_request_are_answered_as_the_person_chose() -> None:
    async def decline(session: Session[Any], question: Question) -> None:
        assert session.answer(question.id, "decline")

    _, _, call = await _turn(stdio(), "ask", decline)
    assert "no answer: decline" in (call.result or "")

    shown: list[Question] = []

    async def accept_url(session: Session[Any], question: Question) -> None:
        shown.append(question)
        assert session.answer(question.id, "accept")

    _, _, call = await _turn(stdio(), "ask_url", accept_url)
    [question] = shown
    assert question.kind == "url" and question.url == "https://bank.example.com/connect?s=1"
    assert question.host == "bank.example.com" and question.message == "Sign in to the bank."
    assert "answer: accept" in (call.result or "")


async def test_stop_cancels_an_open_elicitation() -> None:
    async def stop(session: Session[Any], question: Question) -> None:
        await trio.sleep(0.2)
        assert session.stop()

    final, asked, _call = await _turn(stdio(), "ask", stop)
    assert final.outcome is Outcome.CANCELLED and len(asked) == 1


async def test_a_form_mcp_does_not_allow_is_refused_and_never_shown() -> None:
    async def never(session: Session[Any], question: Question) -> None:
        raise AssertionError("a form that cannot be shown faithfully reached the person")

    final, asked, call = await _turn(stdio(), "ask_nested", never)
    assert final.outcome is Outcome.COMPLETED and asked == []
    # The server was told why (a 2025 server reads the error; on 2026-07-28 the SDK ends the call with it).
    assert "cannot be shown" in (call.result or "") and "a form cannot ask for (object)" in (call.result or "")


async def test_an_elicitation_over_streamable_http_is_a_card_too(tmp_path: Path) -> None:
    async with _http_server("http", str(tmp_path / "record"), script=FAULTY) as url:
        final, asked, call = await _turn(HttpServer(name="ff", url=url, tools={}), "ask", _accept_name)
    assert final.outcome is Outcome.COMPLETED and len(asked) == 1
    assert '"name": "Ada"' in (call.result or "")


def _form(properties: dict[str, Any], required: list[str] | None = None) -> mcp_types.ElicitRequestFormParams:
    schema = {"type": "object", "properties": properties, "required": required or []}
    return mcp_types.ElicitRequestFormParams(message="m", requested_schema=schema)


def test_every_form_field_mcp_allows_becomes_a_field() -> None:
    fields: tuple[QuestionField, ...] = question_parts(
        _form(
            {
                "email": {"type": "string", "format": "email", "maxLength": 80},
                "size": {"type": "number", "minimum": 1.5, "default": 2},
                "tier": {"type": "string", "enum": ["a", "b"], "enumNames": ["Tier A", "Tier B"]},
                "color": {"type": "string", "oneOf": [{"const": "r", "title": "Red"}, {"const": "g", "title": "G"}]},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "maxItems": 1},
                "ok": {"type": "boolean", "default": "yes"},  # a default that does not fit: dropped, not shown
            },
            ["email"],
        )
    )["fields"]
    by = {f.name: f for f in fields}
    assert by["email"].format == "email" and by["email"].maximum == 80 and by["email"].required
    assert by["size"].kind == "number" and by["size"].default == 2 and by["size"].minimum == 1.5
    assert by["tier"].options == (("a", "Tier A"), ("b", "Tier B"))
    assert by["color"].options == (("r", "Red"), ("g", "G"))
    assert by["tags"].kind == "choices" and by["tags"].maximum == 1
    assert by["ok"].kind == "boolean" and by["ok"].default is None


@pytest.mark.parametrize(
    "prop",
    [
        {"type": "object", "properties": {}},
        {"type": "array", "items": {"type": "string"}},
        {"type": "string", "enum": [1, 2]},
        "not a schema",
    ],
)
def test_a_field_mcp_does_not_allow_is_refused(prop: Any) -> None:
    with pytest.raises(UnusableRequest):
        question_parts(_form({"f": prop}))
