"""A running call's questions for the person (``ctx.ask``): a card of its own, answered only through the session,
the turn deadline standing still while the person answers, Stop and the call's end cancelling it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trioloop import (
    Answer,
    AnswerError,
    Question,
    QuestionField,
    QuestionRefused,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    TurnLimits,
)
from trioloop.machine.document import define_document_kind
from trioloop.machine.limits import DEFAULT_TURN_LIMITS
from trioloop.machine.reducer import Outcome, TurnState
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.tools import function_tool

NOTE = define_document_kind("note")

FORM = (
    QuestionField(name="name", kind="text", title="Your name", required=True),
    QuestionField(name="age", kind="integer", minimum=0, maximum=150, default=30),
    QuestionField(name="plan", kind="choice", options=(("free", "Free"), ("pro", "Pro")), default="free"),
    QuestionField(name="agree", kind="boolean", default=False),
)


def _steps(calls: int = 1) -> list[ScriptStep]:
    tool_calls = tuple(ScriptedCall(id=f"c{i}", name="ask_person") for i in range(calls))
    return [ScriptStep(tool_calls=tool_calls), ScriptStep(text="Done.")]


async def _turn(
    answerer: Callable[[Session[str], Question], Awaitable[None]],
    *,
    limits: TurnLimits = DEFAULT_TURN_LIMITS,
    calls: int = 1,
    asks: int = 1,
    url: str = "",
) -> tuple[TurnState, list[Answer | str], Session[str]]:
    """One turn whose read-only tool asks ``asks`` questions, answered by ``answerer`` (a face)."""
    got: list[Answer | str] = []

    @function_tool(effect="read")
    async def ask_person(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Ask the person."""
        for _ in range(asks):
            try:
                answer = await ctx.ask(
                    source='MCP server "forms"', message="Who are you?\u202e", fields=() if url else FORM, url=url
                )
            except QuestionRefused as exc:
                got.append(str(exc))
                continue
            got.append(answer)
        return ToolOutcome.success("asked")

    async with ScriptedProvider(_steps(calls)) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="m", tools=[ask_person], limits=limits)
        async with session, trio.open_nursery() as nursery:

            async def face() -> None:
                answered: set[str] = set()
                async for _ in session.states():
                    for question in session.questions:
                        if question.id not in answered:
                            answered.add(question.id)
                            nursery.start_soon(answerer, session, question)

            nursery.start_soon(face)
            final = await session.send("ask me")
            nursery.cancel_scope.cancel()
    return final, got, session


async def test_a_form_question_is_answered_by_the_person_with_defaults_filled_in() -> None:
    shown: list[Question] = []

    async def accept(session: Session[str], question: Question) -> None:
        shown.append(question)
        assert session.answer(question.id, "accept", {"name": "Ada", "plan": "pro"})

    final, got, session = await _turn(accept)
    assert final.outcome is Outcome.COMPLETED
    [question] = shown
    assert question.id == "turn-1:q1" and question.call_id == "c0" and question.tool_name == "ask_person"
    assert question.message == "Who are you?"  # the asker's bidi control is gone before any face sees it
    [answer] = got
    assert isinstance(answer, Answer) and answer.action == "accept"
    assert dict(answer.content) == {"name": "Ada", "age": 30, "plan": "pro", "agree": False}
    assert session.questions == ()


async def test_values_that_do_not_fit_are_refused_and_nothing_is_answered() -> None:
    errors: list[str] = []

    async def fumble(session: Session[str], question: Question) -> None:
        for bad in ({}, {"name": 3}, {"name": "x", "age": 200}, {"name": "x", "plan": "gold"}, {"name": "x", "z": 1}):
            with pytest.raises(AnswerError) as caught:
                session.answer(question.id, "accept", bad)
            errors.append(str(caught.value))
        with pytest.raises(ValueError, match="carries no values"):
            session.answer(question.id, "decline", {"name": "x"})
        with pytest.raises(ValueError, match="accept, decline or cancel"):
            session.answer(question.id, "approve", None)  # type: ignore[arg-type]
        assert session.answer(question.id, "decline")
        assert not session.answer(question.id, "accept", {"name": "late"})  # answered once, and only once

    final, got, _ = await _turn(fumble)
    assert final.outcome is Outcome.COMPLETED
    assert got == [Answer("decline")]
    assert errors == [
        '"Your name" is required',
        '"Your name" takes text',
        '"age" takes at most 150',
        '"plan" takes one of: free, pro',
        "the form has no field 'z'",
    ]


async def test_the_deadline_stands_still_while_the_person_answers(autojump_clock: trio.testing.MockClock) -> None:
    async def slowly(session: Session[str], question: Question) -> None:
        await trio.sleep(60)  # a minute, against a 5 s turn deadline
        assert session.answer(question.id, "accept", {"name": "Ada"})

    final, got, _ = await _turn(slowly, limits=TurnLimits(turn_deadline_ms=5_000))
    assert final.outcome is Outcome.COMPLETED
    assert isinstance(got[0], Answer) and got[0].action == "accept"


async def test_the_review_timeout_bounds_an_unanswered_question(autojump_clock: trio.testing.MockClock) -> None:
    async def never(session: Session[str], question: Question) -> None:
        await trio.sleep_forever()

    start = trio.current_time()
    final, _got, session = await _turn(never, limits=TurnLimits(turn_deadline_ms=5_000, review_timeout_ms=30_000))
    assert final.outcome is Outcome.BOUNDED
    assert 30 <= trio.current_time() - start < 31
    assert session.questions == ()


async def test_stop_cancels_an_open_question() -> None:
    async def stop(session: Session[str], question: Question) -> None:
        assert session.stop()

    final, got, session = await _turn(stop)
    assert final.outcome is Outcome.CANCELLED
    assert got in ([], [Answer("cancel")])  # the tool saw the cancel, or was cancelled before it looked
    assert session.questions == ()


async def test_a_turn_asks_at_most_its_limit_and_the_asker_is_told() -> None:
    async def accept(session: Session[str], question: Question) -> None:
        session.answer(question.id, "cancel")

    final, got, _ = await _turn(accept, limits=TurnLimits(max_questions_per_turn=2), asks=3)
    assert final.outcome is Outcome.COMPLETED
    assert got[:2] == [Answer("cancel"), Answer("cancel")]
    assert isinstance(got[2], str) and "max_questions_per_turn" in got[2]


async def test_questions_of_parallel_calls_are_each_their_own_card() -> None:
    seen: list[tuple[str, str]] = []

    async def accept(session: Session[str], question: Question) -> None:
        seen.append((question.id, question.call_id))
        session.answer(question.id, "accept", {"name": question.call_id})

    final, got, _ = await _turn(accept, calls=2)
    assert final.outcome is Outcome.COMPLETED
    assert sorted(seen) in ([("turn-1:q1", "c0"), ("turn-1:q2", "c1")], [("turn-1:q1", "c1"), ("turn-1:q2", "c0")])
    names = sorted(a.content["name"] for a in got if isinstance(a, Answer))
    assert names == ["c0", "c1"]  # each answer went to the call that asked


async def test_a_url_question_shows_the_url_and_its_host_and_takes_no_values() -> None:
    shown: list[Question] = []

    async def accept(session: Session[str], question: Question) -> None:
        shown.append(question)
        session.answer(question.id, "accept")

    final, got, _ = await _turn(accept, url="https://login.example.com/authorize?x=1")
    assert final.outcome is Outcome.COMPLETED
    assert shown[0].kind == "url" and shown[0].host == "login.example.com" and not shown[0].fields
    assert got == [Answer("accept")]


@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "file:///etc/passwd", "https://a.example/\u202eexe", "https://", "x" * 3000]
)
def test_a_question_url_must_be_a_plain_web_address(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        Question(id="", call_id="", source="s", kind="url", url=url)


async def test_outside_a_turn_no_one_is_asked() -> None:
    ctx = ToolExecutionContext(document="")
    with pytest.raises(QuestionRefused):
        await ctx.ask(source="s", message="hello")


def test_a_default_that_does_not_fit_its_field_is_refused() -> None:
    with pytest.raises(ValueError, match="default does not fit"):
        QuestionField(name="n", kind="integer", default="three")
    with pytest.raises(ValueError, match="options"):
        QuestionField(name="n", kind="choice")


_FIELDS = st.lists(
    st.one_of(
        st.builds(
            lambda n, lo, span, req: QuestionField(
                name=n, kind="integer", minimum=lo, maximum=lo + span, required=req, default=None if req else lo
            ),
            st.from_regex(r"[a-z]{1,8}", fullmatch=True),
            st.integers(-100, 100),
            st.integers(0, 100),
            st.booleans(),
        ),
        st.builds(
            lambda n, req: QuestionField(name=n, kind="text", required=req, maximum=20),
            st.from_regex(r"[a-z]{1,8}", fullmatch=True),
            st.booleans(),
        ),
        st.builds(
            lambda n, many: QuestionField(
                name=n, kind="choices" if many else "choice", options=(("a", "A"), ("b", "B"))
            ),
            st.from_regex(r"[a-z]{1,8}", fullmatch=True),
            st.booleans(),
        ),
    ),
    max_size=6,
    unique_by=lambda f: f.name,
)

_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-300, 300), st.floats(allow_nan=True), st.text(max_size=30),
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
)  # fmt: skip


@given(fields=_FIELDS, data=st.data())
def test_for_all_answers_accepted_content_fits_every_field(fields: list[QuestionField], data: Any) -> None:
    """For all forms and all values a face might send: either AnswerError, or every value fits its field,
    every required field is there, and only the form's fields are."""
    question = Question(id="q", call_id="c", source="s", fields=fields)
    content = {f.name: data.draw(_VALUES) for f in fields if data.draw(st.booleans())}
    try:
        checked = question.checked(content)
    except AnswerError:
        return
    names = {f.name for f in fields}
    assert set(checked) <= names
    for field in fields:
        if field.required:
            assert field.name in checked
        if field.name in checked:
            assert field.check(checked[field.name]) == checked[field.name]


@given(message=st.text(), label=st.text(), option=st.text())
def test_for_all_asker_text_a_card_shows_no_control_or_bidi_code_point(message: str, label: str, option: str) -> None:
    """For all text an asker sends: what the faces get has no stripped code point, stays within its cap,
    and cleaning it again changes nothing (a question renumbered by the runner reads the same)."""
    from trioloop.machine.questions import MAX_MESSAGE
    from trioloop.machine.untrusted_text import is_stripped_code_point

    field = QuestionField(name="f", kind="choice", title=label, description=label, options=(("v", option),))
    question = Question(id="", call_id="", source=label, message=message, fields=(field,))
    shown = [question.message, question.source, field.title, field.description, field.options[0][1]]
    assert not any(is_stripped_code_point(c, allow_newlines=True) for text in shown for c in text)
    assert not any(c in "\r\x1b\u202e\u2066" for text in shown for c in text)
    assert len(question.message) <= MAX_MESSAGE
    assert attrs.evolve(question, id="q1") == attrs.evolve(question, id="q1", message=question.message)
    assert attrs.evolve(question, id="q1").message == question.message


async def test_an_answer_to_a_stopped_turns_question_never_answers_the_next_turns() -> None:
    # Question ids are the session's: turn 2's first question is not turn 1's, so a late answer to the question
    # of a stopped turn is refused (False), and the open question stays open for the person.
    got: list[Answer] = []

    @function_tool(effect="read")
    async def ask_person(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Ask the person."""
        got.append(await ctx.ask(source='MCP server "forms"', message="Plan?", fields=FORM[2:3]))
        return ToolOutcome.success("asked")

    steps = [_steps()[0], *_steps()]  # turn 1 is stopped at its question, before it asks the model again
    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="m", tools=[ask_person])
        async with session, trio.open_nursery() as nursery:

            async def asked() -> Question:
                with trio.fail_after(10):
                    async with aclosing(session.states()) as states:
                        async for _ in states:
                            if session.questions:
                                return session.questions[0]
                raise AssertionError("unreachable")

            nursery.start_soon(session.send, "ask me")
            first = await asked()
            session.stop()
            await trio.testing.wait_all_tasks_blocked()
            assert session.questions == ()
            nursery.start_soon(session.send, "ask me again")
            second = await asked()
            assert second.id != first.id
            assert not session.answer(first.id, "accept", {"plan": "pro"})  # the late click
            assert session.questions == (second,)
            assert session.answer(second.id, "accept", {"plan": "free"})
    assert [dict(a.content) for a in got if a.action == "accept"] == [{"plan": "free"}]


def test_every_string_of_a_question_is_cleaned_values_and_defaults_included() -> None:
    hidden = "\u202e\u200b\u2066"
    choice = QuestionField(
        name="plan", kind="choice", options=((f"pro{hidden}", f"Pro{hidden}"), ("free", "Free")), default=f"pro{hidden}"
    )
    assert choice.options == (("pro", "Pro"), ("free", "Free")) and choice.default == "pro"
    assert choice.check("pro") == "pro"  # answered as the person saw it
    picks = QuestionField(
        name="extras", kind="choices", options=((f"a{hidden}", "A"), ("b", "B")), default=[f"a{hidden}"]
    )
    assert picks.options[0][0] == "a" and picks.default == ["a"]
    text = QuestionField(name="note", kind="text", default=f"hello{hidden}\nworld")
    assert text.default == "hello\nworld"
    with pytest.raises(ValueError, match="same value"):
        QuestionField(name="x", kind="choice", options=(("a\u200b", "A"), ("a", "also A")))


@given(st.text(max_size=40))
def test_a_cleaned_question_field_shows_nothing_invisible(value: str) -> None:
    from trioloop.machine.untrusted_text import is_stripped_code_point

    field = QuestionField(name="t", kind="text", default=value)
    assert not any(is_stripped_code_point(c, True) for c in field.default)
    option = QuestionField(name="c", kind="choice", options=((value or "v", "V"),))
    assert not any(is_stripped_code_point(c, False) for c in option.options[0][0])


async def test_a_late_click_on_a_card_that_is_gone_is_refused() -> None:
    # Decisions are for open cards: one for a call of an earlier turn (or none at all) says False while a turn
    # runs, instead of being queued and dropped unseen.
    steps = [ScriptStep(tool_calls=(ScriptedCall(id="c1", name="note_it"),)), ScriptStep(text="Done.")] * 2

    @function_tool(effect="mutate")
    def note_it(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Note it."""
        return ToolOutcome.success("noted", document=ctx.document + "x")

    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="m", tools=[note_it])
        async with session, trio.open_nursery() as nursery:

            async def review() -> str:
                with trio.fail_after(10):
                    async with aclosing(session.states()) as states:
                        async for state in states:
                            pending = [c.id for c in state.current_calls if c.status.value == "pending"]
                            if pending:
                                return pending[0]
                raise AssertionError("unreachable")

            nursery.start_soon(session.send, "one")
            first = await review()
            assert not session.approve("no-such-call") and not session.deny("no-such-call")
            assert session.approve(first)
            with trio.fail_after(10):
                while session.busy:  # noqa: ASYNC110 -- the turn settles in its own task
                    await trio.sleep(0.01)
            nursery.start_soon(session.send, "two")
            second = await review()
            if second != first:
                assert not session.approve(first)  # the earlier turn's card is gone
            assert not session.approve_batch([second, "no-such-call"])
            assert session.deny(second, "not now")
