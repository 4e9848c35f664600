"""The second domain: a Markdown note (a plain str) with three typed tools, driven through real turns.

It proves the core serves any document: validation refusals reach the model, the destructive tool is never
covered by "approve all safe", Stop and the deadline keep what was committed, undo restores the note, and
the how-to guide's (docs/howto/own-document.md) code is the checked example file, word for word.
"""

from __future__ import annotations

import importlib.util
import re
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop import CallStatus, Outcome, Phase, ScriptedProvider, Session, TurnLimits, TurnState
from trioloop.providers.scripted import ScriptedCall, ScriptStep

ROOT = Path(__file__).resolve().parent.parent


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("markdown_notes", ROOT / "examples" / "markdown_notes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["markdown_notes"] = module
    spec.loader.exec_module(module)
    return module


notes = load_example()
NOTE, NOTE_TOOLS, EXAMPLE = notes.NOTE, notes.NOTE_TOOLS, notes.EXAMPLE_NOTE


def call(cid: str, name: str, **inp: Any) -> ScriptedCall:
    return ScriptedCall(id=cid, name=name, input=inp)


async def run(
    steps: list[ScriptStep],
    decide: Callable[[Session[str], TurnState], None],
    *,
    limits: TurnLimits | None = None,
    document: str = EXAMPLE,
) -> tuple[TurnState, Session[str], ScriptedProvider]:
    async with (
        ScriptedProvider(steps) as provider,
        Session(
            document=document,
            kind=NOTE,
            provider=provider,
            model="scripted-1",
            tools=NOTE_TOOLS,
            limits=limits or TurnLimits(),
        ) as session,
        trio.open_nursery() as ui,
    ):

        async def review() -> None:
            async for state in session.states():
                decide(session, state)

        ui.start_soon(review)
        final = await session.send("edit my note")
        ui.cancel_scope.cancel()
    return final, session, provider


def approve_all(session: Session[str], state: TurnState) -> None:
    if state.phase is Phase.AWAITING_APPROVAL:
        for c in state.current_calls:
            if c.status is CallStatus.PENDING:
                session.approve(c.id)


def tool_results(provider: ScriptedProvider, index: int) -> str:
    return str(provider.requests[index])


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(ROOT / "examples" / "markdown_notes.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "card: Replace the body of section 'Packing' -> approved" in out
    assert "card: Delete section 'Budget' and everything under it -> declined" in out
    assert "outcome: completed" in out and "+- rain jacket" in out and "undone: True" in out


async def test_an_edit_commits_diffs_and_undoes() -> None:
    steps = [
        ScriptStep(tool_calls=[call("w", "replace_section", heading="Travel", body="Bus on Saturday.")]),
        ScriptStep(text="Done."),
    ]
    final, session, _ = await run(steps, approve_all)
    assert final.outcome is Outcome.COMPLETED
    assert "## Travel\nBus on Saturday.\n\n## Packing" in session.document
    diff = NOTE.diff(EXAMPLE, session.document)
    assert "-Train on Friday at 9:00." in diff and "+Bus on Saturday." in diff
    assert session.undo_last_turn() and session.document == EXAMPLE


async def test_an_invalid_result_is_refused_with_the_validators_words() -> None:
    steps = [
        ScriptStep(tool_calls=[call("w", "replace_section", heading="Budget", body="## Travel\nagain")]),
        ScriptStep(text="Sorry."),
    ]
    final, session, provider = await run(steps, approve_all)
    bad = final.call("w")
    assert bad is not None and bad.status is CallStatus.FAILED
    assert "every heading must be unique" in (bad.result or "") and "Travel" in (bad.result or "")
    assert "every heading must be unique" in tool_results(provider, 1)  # the model was told what to fix
    assert session.document == EXAMPLE and session.undo_history.entries == ()


async def test_a_missing_section_fails_only_that_call() -> None:
    steps = [ScriptStep(tool_calls=[call("r", "read_section", heading="Nope")]), ScriptStep(text="ok")]
    final, _, provider = await run(steps, approve_all)
    assert final.call("r").status is CallStatus.FAILED  # type: ignore[union-attr]
    assert "No section is headed 'Nope'. The headings are: Trip plan, Travel, Packing, Budget." in tool_results(
        provider, 1
    )


async def test_approve_all_safe_never_covers_the_destructive_delete() -> None:
    decided: list[tuple[str, ...]] = []

    def safe_only(session: Session[str], state: TurnState) -> None:
        if state.phase is Phase.AWAITING_APPROVAL and not decided:
            ids = tuple(c.id for c in state.current_calls if c.status is CallStatus.PENDING)
            decided.append(ids)
            session.approve_batch(ids)  # the batch silently skips destructive calls...
            for c in state.current_calls:
                if c.destructive:
                    session.deny(c.id)  # ...which then need their own decision

    steps = [
        ScriptStep(
            tool_calls=[
                call("w", "replace_section", heading="Packing", body="- passport"),
                call("d", "delete_section", heading="Budget"),
            ]
        ),
        ScriptStep(text="ok"),
    ]
    final, session, _ = await run(steps, safe_only)
    assert decided == [("w", "d")]
    assert final.call("w").status is CallStatus.SUCCEEDED  # type: ignore[union-attr]
    assert final.call("d").status is CallStatus.DENIED  # type: ignore[union-attr]
    assert "## Budget" in session.document and "- charger" not in session.document


async def test_stop_at_the_card_changes_nothing() -> None:
    def stop(session: Session[str], state: TurnState) -> None:
        if state.phase is Phase.AWAITING_APPROVAL:
            session.stop()

    steps = [ScriptStep(tool_calls=[call("d", "delete_section", heading="Travel")]), ScriptStep(text="unused")]
    final, session, _ = await run(steps, stop)
    assert final.outcome is Outcome.CANCELLED and session.document == EXAMPLE


async def test_the_deadline_keeps_what_was_committed(autojump_clock: trio.testing.MockClock) -> None:
    steps = [
        ScriptStep(tool_calls=[call("w", "replace_section", heading="Budget", body="About 250 EUR.")]),
        ScriptStep(text="x" * 400, stall_after_bytes=200),
    ]
    final, session, _ = await run(steps, approve_all, limits=TurnLimits(turn_deadline_ms=5_000))
    assert final.outcome is Outcome.BOUNDED
    assert session.document == EXAMPLE.replace("About 300 EUR.", "About 250 EUR.")
    assert session.undo_last_turn() and session.document == EXAMPLE


HEADINGS = st.lists(
    st.from_regex(r"[A-Za-z][A-Za-z ]{0,10}[A-Za-z]", fullmatch=True), min_size=2, max_size=5, unique=True
)
BODY = st.from_regex(r"[a-z0-9 .\-]{0,40}", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(titles=HEADINGS, bodies=st.lists(BODY, min_size=5, max_size=5), new_body=BODY, pick=st.integers(0, 4))
def test_replacing_a_section_leaves_every_other_section_as_it_was(
    titles: list[str], bodies: list[str], new_body: str, pick: int
) -> None:
    sections = [f"## {t}\n{b}\n\n" for t, b in zip(titles, bodies, strict=False)]
    note = "# Title\n\n" + "".join(sections)
    target = titles[pick % len(titles)]
    prepared = notes.replace_section.prepare({"heading": target, "body": new_body})
    from trioloop import ToolExecutionContext

    outcome = trio.run(prepared.run, ToolExecutionContext(document=note))
    assert outcome.ok and NOTE.validate(outcome.document) is None
    after = outcome.document
    for t, section in zip(titles, sections, strict=False):
        if t != target:
            assert section in after
    assert notes.headings(after) == notes.headings(note)


def test_the_docs_show_the_checked_example_word_for_word() -> None:
    page = (ROOT / "docs" / "howto" / "own-document.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- bring-your-own -->\n```python\n(.*?)```", page, re.S)
    assert block is not None, "the own-document guide lost its code block"
    example = (ROOT / "examples" / "bring_your_own.py").read_text(encoding="utf-8")
    assert block.group(1) == example
    assert sum(1 for line in example.splitlines() if line.strip()) <= 40


def test_the_bring_your_own_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(ROOT / "examples" / "bring_your_own.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "review: Append '- milk' to the note" in out
    assert "completed '# Shopping\\n- milk\\n' | undone: True" in out
