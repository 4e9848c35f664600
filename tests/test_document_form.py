"""Documents kept in a journal in their kind's data form: written cheaply, read back through the same gates, and
every journal written before (the text form) still read."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies_document import json_values, threat_models
from test_session_resume import PAYMENT, add_threat, send

from trioloop import ScriptedProvider, Session, ToolExecutionContext, ToolOutcome, define_document_kind, function_tool
from trioloop.durable.document_form import (
    DATA_FORM,
    MAX_DATA_DEPTH,
    TEXT_FORM,
    DocumentCodec,
    DocumentFormError,
    _nests_at_most,
)
from trioloop.durable.journal import JournalError, decode_entries, document_digest, encode_entry, entry_hash
from trioloop.durable.replay import replay_journal
from trioloop.durable.session_file import SESSION_FORMAT, SESSION_VERSION, SessionFileError, session_from_json
from trioloop.durable.store import MemoryJournalStore, StoredEntry
from trioloop.machine.document import DataDocumentKind
from trioloop.machine.tools import ToolRegistry
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, create_ai_tool_registry, load_thf
from trioloop.threatmodel.errors import ThfError


def _entries(stored: Any) -> list[Any]:
    return decode_entries(stored)


async def _thf_journal(store: MemoryJournalStore) -> ThreatModel:
    """A threat-model session whose one turn commits one change; the live document it ends with."""
    async with ScriptedProvider([add_threat("t1", "Forged webhook"), ScriptStep(text="Added.")]) as provider:
        session = await Session.open(
            store,
            "s1",
            kind=THREAT_MODEL,
            provider=provider,
            document=load_thf(PAYMENT),
            model="m",
            tools=create_ai_tool_registry(),
            signer=None,
        )
        async with session:
            await send(session, "add a threat")
            return session.document


async def test_a_threat_model_is_journaled_as_data_and_comes_back_equal(tmp_path: Path) -> None:
    store = MemoryJournalStore()
    live = await _thf_journal(store)
    entries = _entries(await store.read("s1"))
    snapshots = [e for e in entries if e.kind == "snapshot"]
    commits = [e for e in entries if e.kind == "settled" and e.data.get("document") is not None]
    assert snapshots and len(commits) == 1
    for snapshot in snapshots:
        session = snapshot.data["session"]
        assert session["document_form"] == DATA_FORM
        assert isinstance(session["document"], str) and json.loads(session["document"])["version"]
    commit = commits[0].data
    assert commit["document_form"] == DATA_FORM
    assert commit["document_digest"] == document_digest(commit["document"])
    assert THREAT_MODEL.from_data(json.loads(commit["document"])) == live
    # The data form replays to the same session, and a reopened session carries on from it.
    replayed = replay_journal(
        entries, load_document=THREAT_MODEL.load, registry=create_ai_tool_registry(), load_data=THREAT_MODEL.from_data
    )
    assert replayed.document == live
    async with ScriptedProvider([ScriptStep(text="Hello.")]) as provider:
        session = await Session.open(
            store, "s1", kind=THREAT_MODEL, provider=provider, model="m", tools=create_ai_tool_registry(), signer=None
        )
        async with session:
            assert session.document == live
            assert await session.undo()  # the undo history came back too, in the data form
            assert session.document == load_thf(PAYMENT)


async def test_a_data_form_journal_is_refused_by_a_reader_without_one() -> None:
    store = MemoryJournalStore()
    await _thf_journal(store)
    entries = _entries(await store.read("s1"))
    with pytest.raises(JournalError, match=r"does not load|not valid"):
        replay_journal(entries, load_document=THREAT_MODEL.load, registry=create_ai_tool_registry())


def _rewritten(entries: list[Any], seq: int, change: Any) -> list[Any]:
    """``entries`` with entry ``seq``'s data changed by ``change`` and the chain after it re-linked (an unsigned
    journal: what a forger with write access to the store could make)."""
    out: list[StoredEntry] = []
    prev = entries[0].prev
    for entry in entries:
        data = json.loads(json.dumps(entry.data))
        if entry.seq == seq:
            change(data)
        raw = encode_entry(entry.seq, entry.kind, prev, entry.at_ms, data)
        prev = entry_hash(raw)
        out.append(StoredEntry(entry.seq, raw))
    return decode_entries(out)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(document_form="xml"), "form this version does not know"),
        (lambda d: d.update(document=d["document"].replace('"version"', '"versio"')), "digest"),
        (lambda d: d.update(document=d["document"][:-1], document_digest=None), "does not parse|not valid JSON"),
        (lambda d: d.update(document='{"version":"1.0"}', document_digest=None), "does not load"),
        (lambda d: d.update(document='{"a":1,"a":2}', document_digest=None), "repeats a key"),
    ],
)
async def test_a_tampered_data_form_commit_is_refused(change: Any, message: str) -> None:
    store = MemoryJournalStore()
    await _thf_journal(store)
    entries = _entries(await store.read("s1"))
    commit = next(e for e in entries if e.kind == "settled" and e.data.get("document") is not None)
    # Replay from the start, so the commit is folded (the closing snapshot would otherwise stand in for it).
    tampered = [e for e in _rewritten(entries, commit.seq, change) if e.seq <= commit.seq]
    with pytest.raises(JournalError, match=message):
        replay_journal(
            tampered,
            load_document=THREAT_MODEL.load,
            registry=create_ai_tool_registry(),
            load_data=THREAT_MODEL.from_data,
        )


def test_a_snapshot_in_a_form_the_reader_lacks_is_refused() -> None:
    codec = DocumentCodec.of(THREAT_MODEL)
    form, text = codec.encode(load_thf(PAYMENT))
    value = {
        "format": SESSION_FORMAT,
        "version": SESSION_VERSION,
        "model": None,
        "kind": "threat model",
        "source": None,
        "messages": [],
        "document": text,
        "undo": [],
        "undo_max_entries": 20,
        "last_turn_id": None,
        "turn_count": 0,
        "document_form": form,
    }
    with pytest.raises(SessionFileError, match="form this reader does not take"):
        session_from_json(value, load_document=THREAT_MODEL.load)
    codec = DocumentCodec.of(THREAT_MODEL)
    assert session_from_json(value, load_document=THREAT_MODEL.load, decode_document=codec.decode).document == (
        load_thf(PAYMENT)
    )
    with pytest.raises(SessionFileError, match="form this reader does not take"):
        session_from_json({**value, "document_form": 7}, load_document=THREAT_MODEL.load, decode_document=codec.decode)


# -- a kind of the app's own, with and without a data form ----------------------------------------------------


def _lines_from(data: Any) -> tuple[str, ...]:
    if not isinstance(data, list) or not all(isinstance(line, str) for line in data):
        raise ValueError("a note is a list of lines")
    return tuple(data)


LINES = define_document_kind(
    "lines",
    dump="\n".join,
    load=lambda text: tuple(text.split("\n")) if text else (),
    to_data=lambda lines: None if "no data" in lines else list(lines),
    from_data=_lines_from,
)
TEXT_ONLY = define_document_kind("text", dump=str, load=str)


@function_tool
async def add_line(ctx: ToolExecutionContext[Any], line: str) -> ToolOutcome[Any]:
    """Add one line."""
    document = ctx.document
    return ToolOutcome.success("added", document=(*document, line) if isinstance(document, tuple) else document + line)


async def _journal_of(kind: Any, document: Any, lines: list[str]) -> list[Any]:
    store = MemoryJournalStore()
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id=f"c{i}", name="add_line", input={"line": line}),))
        for i, line in enumerate(lines)
    ]
    async with ScriptedProvider([*steps, ScriptStep(text="Done.")]) as provider:
        session = await Session.open(
            store, "n1", kind=kind, provider=provider, document=document, model="m", tools=[add_line], signer=None
        )
        async with session, trio.open_nursery() as ui:

            async def approve() -> None:
                async for state in session.states():
                    for call in state.current_calls:
                        if call.status.name == "PENDING":
                            session.approve(call.id)

            ui.start_soon(approve)
            await session.send("go")
            ui.cancel_scope.cancel()
    return _entries(await store.read("n1"))


def _forms(entries: list[Any]) -> list[str]:
    found = []
    for entry in entries:
        if entry.kind == "snapshot":
            found.append("snapshot:" + entry.data["session"].get("document_form", TEXT_FORM))
        elif entry.kind == "settled" and entry.data.get("document") is not None:
            found.append("commit:" + entry.data.get("document_form", TEXT_FORM))
    return found


async def test_an_app_kind_with_a_data_form_is_journaled_as_data_and_falls_back_per_document() -> None:
    assert isinstance(LINES, DataDocumentKind)
    entries = await _journal_of(LINES, ("a",), ["b", "no data", "c"])
    # The second commit's document has no data form (to_data gave None): that commit, and the closing snapshot,
    # whose document is that one's successor... every document in a snapshot shares one form.
    assert _forms(entries)[:2] == ["snapshot:json", "commit:json"]
    assert "commit:text" in _forms(entries)
    replayed = replay_journal(
        entries, load_document=LINES.load, registry=ToolRegistry([add_line]), load_data=LINES.from_data
    )
    assert replayed.document == ("a", "b", "no data", "c")


async def test_a_kind_without_a_data_form_is_journaled_as_text_as_before() -> None:
    entries = await _journal_of(TEXT_ONLY, "x", ["y"])
    assert _forms(entries) == ["snapshot:text", "commit:text", "snapshot:text"]
    assert all("document_form" not in e.data and "document_form" not in e.data.get("session", {}) for e in entries)
    assert replay_journal(entries, load_document=str, registry=ToolRegistry([add_line])).document == "xy"


def test_define_document_kind_takes_both_data_functions_or_neither() -> None:
    with pytest.raises(TypeError, match="both"):
        define_document_kind("half", to_data=list)
    with pytest.raises(TypeError, match="no data form"):
        TEXT_ONLY.from_data("x")
    assert TEXT_ONLY.to_data("x") is None


@pytest.mark.parametrize(
    "data",
    [
        {"n": math.nan},
        {"n": math.inf},
        {"s": {1, 2}},
        {"b": b"bytes"},
        [[[[[]]]]] * 0 + [json.loads("[" * 200 + "]" * 200)],
    ],
)
def test_data_that_is_not_json_or_nests_too_deep_is_kept_as_text(data: Any) -> None:
    codec: DocumentCodec[Any] = DocumentCodec(lambda d: "TEXT", lambda t: t, lambda d: data, lambda v: v)
    assert codec.encode(object()) == (TEXT_FORM, "TEXT")


def test_data_as_deep_as_the_reader_reads_is_kept_as_data() -> None:
    deep = json.loads("[" * MAX_DATA_DEPTH + "]" * MAX_DATA_DEPTH)
    codec: DocumentCodec[Any] = DocumentCodec(lambda d: "TEXT", lambda t: t, lambda d: deep, lambda v: v)
    form, text = codec.encode(object())
    assert form == DATA_FORM and codec.decode(form, text) == deep
    with pytest.raises(DocumentFormError, match="nests deeper"):
        codec.decode(DATA_FORM, "[" + text + "]")


# -- properties ------------------------------------------------------------------------------------------------


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_BRACKETY = st.text(alphabet='[]{}"\\:, ab\u00e9', max_size=6)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _BRACKETY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_BRACKETY, inner, max_size=3),
    max_leaves=30,
)


@given(_VALUES, st.integers(0, 12))
def test_the_nesting_check_is_the_depth_for_all_json_values(value: Any, limit: int) -> None:
    for ascii_only in (True, False):
        text = json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"))
        assert _nests_at_most(text, limit) == (_depth(value) <= limit)


@settings(max_examples=60, deadline=None)
@given(threat_models())
def test_every_threat_model_round_trips_through_its_data_form(model: ThreatModel) -> None:
    codec = DocumentCodec.of(THREAT_MODEL)
    form, text = codec.encode(model)
    assert codec.decode(form, text) == model
    if form == DATA_FORM:
        assert THREAT_MODEL.from_data(THREAT_MODEL.to_data(model)) == model


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_from_data_refuses_what_load_would_with_a_thf_error(junk: Any) -> None:
    with contextlib.suppress(ThfError):  # anything else (a TypeError, a KeyError) fails the test
        THREAT_MODEL.from_data(junk)
