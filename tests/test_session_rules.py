"""Approval rules through a real session (issue 50): the app's rules, a person's "always" surviving a journal
reopening and a session file, a forgotten rule, ``needs_approval`` journaled and replayed without being called
again, and a forged rule entry refused by the signature."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.test_durable import wait_for_review
from trioloop import ScriptedProvider, Session, ToolExecutionContext, ToolOutcome, define_document_kind, function_tool
from trioloop.durable.audit import audit_lines
from trioloop.durable.journal import JournalError, decode_entry, encode_entry, entry_hash
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.durable.store import MemoryJournalStore, StoredEntry
from trioloop.machine.conditions import Condition
from trioloop.machine.rules import SESSION_SOURCE, ApprovalRule, DeciderKind
from trioloop.machine.state import CallStatus
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.runtime.approvals import ApprovalQuery

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
RUNS: list[str] = []
ASKED: list[str] = []


@function_tool
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    RUNS.append(line)
    return ToolOutcome.success(f"appended {line}", document=ctx.document + line + "\n")


@function_tool(destructive=True)
async def clear_note(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
    """Clear the note."""
    RUNS.append("clear")
    return ToolOutcome.success("cleared", document="")


def _check(query: ApprovalQuery) -> Any:
    ASKED.append(query.input["line"])
    if query.input["line"].startswith("ok"):
        return "allow"
    if query.input["line"] == "boom":
        raise KeyError("line")
    return ("deny", "lines must start with ok")


@function_tool(name="checked_line", needs_approval=_check)
async def _checked_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one checked line to the note."""
    RUNS.append(line)
    return ToolOutcome.success(f"appended {line}", document=ctx.document + line + "\n")


TOOLS = [append_line, clear_note, _checked_line]


def calls(*pairs: tuple[str, str], tool: str = "append_line") -> ScriptStep:
    return ScriptStep(tool_calls=tuple(ScriptedCall(id=cid, name=tool, input={"line": line}) for cid, line in pairs))


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RUNS.clear()
    ASKED.clear()


async def open_note(store: MemoryJournalStore, provider: ScriptedProvider, **kw: Any) -> Session[str]:
    kw.setdefault("tools", TOOLS)
    document = "" if not await store.read("s1") else None
    return await Session.open(store, "s1", kind=NOTE, provider=provider, document=document, model="m", **kw)


async def test_app_rules_allow_and_deny_without_a_card_and_name_themselves() -> None:
    rules = [
        ApprovalRule(tool="append_line", verdict="allow", when=(Condition.prefix("/line", "docs"),)),
        ApprovalRule(tool="append_line", verdict="deny", when=(Condition.equals("/line", "secret"),), reason="no"),
    ]
    steps = [calls(("a", "docs 1"), ("b", "secret")), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="m", tools=TOOLS, rules=rules)
        async with session:
            state = await session.send("go")
    assert RUNS == ["docs 1"]
    assert state.call("a").decided_by.describe() == "approved by app rule 1: append_line line starts with docs"
    assert state.call("b").status is CallStatus.DENIED and "app rule 2" in state.call("b").result
    assert [r.label for r in session.rules] == ["app rule 1", "app rule 2"]


async def test_always_from_a_card_survives_a_reopening_and_can_be_forgotten() -> None:
    store = MemoryJournalStore()
    steps = [calls(("a", "one")), ScriptStep(text="Done."), calls(("b", "two")), ScriptStep(text="Done again.")]
    async with ScriptedProvider(steps) as provider:
        async with await open_note(store, provider) as session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "first")
            await wait_for_review(session)
            assert session.approve("a", always="tool")
        assert [(r.source, r.number, r.tool) for r in session.rules] == [(SESSION_SOURCE, 1, "append_line")]

        # Another process: the journal carries the session's rule over; the next call runs without a card.
        reopened = await open_note(store, provider)
        assert [r.label for r in reopened.rules] == ["session rule 1"]
        async with reopened:
            state = await reopened.send("second")
            assert state.call("b").decided_by.kind is DeciderKind.RULE and RUNS == ["one", "two"]
            assert reopened.remove_rule(1) and reopened.rules == ()
            assert not reopened.remove_rule(1)

    again = await open_note(store, provider)
    assert again.rules == ()  # the forgetting was journaled too
    await again.aclose()


async def test_a_session_file_restores_its_deny_rules_and_its_allow_rules_only_when_trusted(tmp_path: Path) -> None:
    steps = [calls(("a", "one"), ("b", "two")), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="m", tools=TOOLS)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "first")
            await wait_for_review(session)
            assert session.approve("a", always="input")
            assert session.deny("b", "no", always="tool")
        session.save(tmp_path / "s.json")
        # A session file is not signed: anyone who can write it could add an allow rule, so by default only its
        # deny (and ask) rules come back.
        resumed = Session.resume(tmp_path / "s.json", kind=NOTE, provider=provider, tools=TOOLS)
        trusted = Session.resume(tmp_path / "s.json", kind=NOTE, provider=provider, tools=TOOLS, trust_allow_rules=True)
    assert [(r.label, r.verdict.value) for r in resumed.rules] == [("session rule 2", "deny")]
    assert [r.describe() for r in resumed.withheld_rules] == ['append_line input = {"line": "one"}']
    described = [(r.label, r.describe()) for r in trusted.rules]
    assert described == [("session rule 1", 'append_line input = {"line": "one"}'), ("session rule 2", "append_line")]
    assert trusted.withheld_rules == ()


async def test_a_forget_while_a_turn_waits_applies_to_the_rest_of_it() -> None:
    steps = [calls(("a", "one")), calls(("b", "two")), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="m", tools=TOOLS)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for_review(session)
            assert session.approve("a", always="tool")
            await trio.testing.wait_all_tasks_blocked()
            # The second iteration's call was approved by the rule; forgetting it now affects later calls only.
            assert session.state is not None and session.state.call("b") is not None
            assert session.state.call("b").status is not CallStatus.PENDING
            assert session.remove_rule(1)
            await trio.testing.wait_all_tasks_blocked()
            assert session.rules == ()


async def test_needs_approval_is_journaled_and_replay_never_calls_it_again() -> None:
    store = MemoryJournalStore()
    steps = [calls(("a", "ok 1"), ("b", "bad"), ("c", "boom"), tool="checked_line"), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        async with await open_note(store, provider) as session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for_review(session)
            state = session.state
            assert state is not None
            assert state.call("a").status is CallStatus.APPROVED
            assert state.call("b").status is CallStatus.DENIED and "start with ok" in state.call("b").result
            assert state.call("c").status is CallStatus.PENDING  # the function raised: the person decides
            assert any("raised KeyError" in notice for notice in state.notices)
            await session.suspend()
        assert ASKED == ["ok 1", "bad", "boom"]
        reopened = await open_note(store, provider)
        assert ASKED == ["ok 1", "bad", "boom"]  # replay read the journaled verdicts
        assert reopened.state is not None and reopened.state.call("a").decided_by.kind is DeciderKind.CODE
        await reopened.aclose()


async def test_a_forged_rule_entry_is_refused_by_the_signature() -> None:
    store = MemoryJournalStore()
    signer = JournalSigner.generate()
    steps = [calls(("a", "one")), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = await open_note(store, provider, signer=signer, witness=None)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for_review(session)
            assert session.approve("a")
        entries = store._journals["s1"]
        index = next(i for i, e in enumerate(entries) if b'"kind":"submit"' in e.data)
        # An attacker gives the turn an allow-everything rule and makes the hash chain whole again.
        raws = [e.data for e in entries]
        entry = decode_entry(raws[index])
        data = {**entry.data, "rules": [{"tool": "**", "verdict": "allow", "source": "app", "number": 1}]}
        raws[index] = encode_entry(entry.seq, entry.kind, entry.prev, entry.at_ms, data)
        forged = MemoryJournalStore()
        forged._journals["s1"] = [StoredEntry(seq, raw) for seq, raw in rechained(raws)]
        with pytest.raises(JournalError):
            await open_note(forged, provider, signer=signer, witness=None)
        keys = JournalKeys([signer.public_key])
        reopened = await open_note(store, provider, signer=signer, keys=keys, witness=None)  # the true one opens
        await reopened.aclose()


def rechained(raws: list[bytes]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    prev = "0" * 64
    for seq, raw in enumerate(raws, 1):
        entry = decode_entry(raw)
        new = encode_entry(seq, entry.kind, prev, entry.at_ms, entry.data)
        out.append((seq, new))
        prev = entry_hash(new)
    return out


async def test_the_audit_trail_names_who_decided_each_call() -> None:
    store = MemoryJournalStore()
    rules = [ApprovalRule(tool="append_line", verdict="allow", when=(Condition.prefix("/line", "docs"),))]
    steps = [calls(("a", "docs 1"), ("b", "two")), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = await open_note(store, provider, rules=rules)
        session.actor = "alice"
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for_review(session)
            assert session.approve("b", always="tool")
    trail = "\n".join(audit_lines(store._journals["s1"]))
    assert "call a (append_line) approved by app rule 1: append_line line starts with docs" in trail
    assert "approved b by alice, and always for this session (tool)" in trail


class _Tools:
    """A toolset as `Session.add_toolset` takes one: its tools handed over, then held until cancelled."""

    def __init__(self, *tools: Any) -> None:
        self.tools = tools

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self.tools)
        await trio.sleep_forever()


async def test_a_toolsets_needs_approval_decides_each_of_its_calls() -> None:
    steps = [calls(("a", "ok 1"), ("b", "nope")), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="m", tools=[clear_note])
        async with session:
            await session.add_toolset(_Tools(append_line), needs_approval=_check)
            with trio.fail_after(10):
                state = await session.send("go")
            session.nursery.cancel_scope.cancel()  # the toolset's connection
    assert ASKED == ["ok 1", "nope"] and RUNS == ["ok 1"]  # no card: the function decided both
    assert state.call("a").decided_by.kind is DeciderKind.CODE
    assert state.call("b").status is CallStatus.DENIED and "start with ok" in state.call("b").result
