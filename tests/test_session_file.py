"""The session file: conversation + document + undo history round-trip; hostile files are refused, typed."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.files import write_atomic
from trioloop.loop.session_file import (
    MAX_JSON_DEPTH,
    MAX_UNDO_ENTRIES,
    SessionFileError,
    SessionSnapshot,
    UndoRecord,
    decode_session,
    encode_session,
)
from trioloop.loop.transaction import UndoEntry, UndoHistory, undo_turn
from trioloop.protocol import Message, ProviderBlock, TextBlock, ThinkingBlock, ToolCallBlock, ToolResultBlock
from trioloop.threatmodel import ThreatModel, dump_thf, load_thf

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "payment.thf"
SMALL = ROOT / "tests" / "fixtures" / "thf_valid_base.thf"
BILLION_LAUGHS = ROOT / "tests" / "fixtures" / "thf_invalid" / "billion_laughs.thf"


def _load(text: str) -> ThreatModel:
    return load_thf(text)


def _conversation() -> tuple[Message, ...]:
    call = ToolCallBlock(id="toolu_1", name="add_threat", input={"threat": {"title": "Spoofed \u2028 webhook"}})
    return (
        Message.user("add a threat \U0001f600"),
        Message(role="assistant", content=(TextBlock(text="Adding it."), call)),
        Message(role="user", content=(ToolResultBlock(call_id="toolu_1", content="added threat-9", is_error=False),)),
        Message.assistant("Done."),
    )


def _snapshot(path: Path = EXAMPLE) -> tuple[SessionSnapshot[ThreatModel], ThreatModel]:
    before = load_thf(path)
    after = attrs.evolve(before, threats=before.threats[:-1])  # what turn-2 did
    snapshot = SessionSnapshot(
        messages=_conversation(),
        document=after,
        undo=(UndoRecord(turn_id="turn-1", document=before), UndoRecord(turn_id="turn-2", document=before)),
        undo_max_entries=20,
        last_turn_id="turn-2",
        turn_count=2,
        model="claude-x",
    )
    return snapshot, before


def test_a_session_round_trips_through_an_atomic_file(tmp_path: Path) -> None:
    snapshot, before = _snapshot()
    path = tmp_path / "chat.session.json"
    write_atomic(path, encode_session(snapshot, dump_document=dump_thf))
    loaded = decode_session(path.read_bytes(), load_document=_load)
    assert loaded == snapshot
    # Undo of the last turn still works on the resumed history.
    history = UndoHistory(
        entries=tuple(UndoEntry(turn_id=r.turn_id, document=r.document) for r in loaded.undo),
        max_entries=loaded.undo_max_entries,
    )
    assert loaded.last_turn_id is not None
    undone = undo_turn(history, loaded.document, loaded.last_turn_id)
    assert undone is not None and undone[0] == before and len(undone[1].entries) == 1


def test_provider_blocks_and_reasoning_survive_a_save_and_resume(tmp_path: Path) -> None:
    # A server tool's blocks, an OpenAI-compatible server's reasoning and a Responses reasoning item must
    # come back exactly: the next request sends them back verbatim (a reasoning model refuses otherwise).
    snapshot, _ = _snapshot()
    server = ProviderBlock(
        wire="anthropic", kind="server_tool_use", data='{"type":"server_tool_use","id":"srvtoolu_1"}'
    )
    reasoning = ProviderBlock(
        wire="openai-responses", kind="reasoning", data='{"type":"reasoning","encrypted_content":"gAAA"}'
    )
    assistant = Message(
        role="assistant",
        content=(
            ThinkingBlock(thinking="Check the flows first.", source="reasoning_content"),
            server,
            reasoning,
            TextBlock(text="Adding it."),
            ToolCallBlock(id="toolu_1", name="add_threat", input={"threat": {"title": "x"}}),
        ),
    )
    messages = (snapshot.messages[0], assistant, *snapshot.messages[2:])
    snapshot = attrs.evolve(snapshot, messages=messages)
    path = tmp_path / "chat.session.json"
    write_atomic(path, encode_session(snapshot, dump_document=dump_thf))
    assert decode_session(path.read_bytes(), load_document=_load) == snapshot


def test_the_file_is_ascii_and_versioned() -> None:
    snapshot, _ = _snapshot()
    data = encode_session(snapshot, dump_document=dump_thf)
    data.decode("ascii")
    value = json.loads(data)
    assert value["format"] == "trioloop-session" and value["version"] == 1


def test_an_unpairable_conversation_is_not_written() -> None:
    snapshot, _ = _snapshot()
    with pytest.raises(SessionFileError, match="pairable"):
        encode_session(attrs.evolve(snapshot, messages=snapshot.messages[:2]), dump_document=dump_thf)


@functools.cache
def _valid_bytes() -> bytes:
    return encode_session(_snapshot(SMALL)[0], dump_document=dump_thf)


def _valid() -> dict[str, Any]:
    value: dict[str, Any] = json.loads(_valid_bytes())
    return value


def _bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


def _with(**changes: Any) -> bytes:
    value = _valid()
    value.update(changes)
    return _bytes(value)


def _without(key: str) -> bytes:
    value = _valid()
    del value[key]
    return _bytes(value)


HOSTILE = {
    "not utf-8": b'{"format": "\xff"}',
    "not json": b"{not json",
    "a list": b"[]",
    "nan": b'{"format": NaN}',
    "duplicate key": b'{"format": "trioloop-session", "format": "x"}',
    "other format": _with(format="something-else"),
    "future version": _with(version=2),
    "version as text": _with(version="1"),
    "missing key": _without("undo"),
    "unknown key": _with(extra_key=1),
    "model not text": _with(model=5),
    "messages not a list": _with(messages={}),
    "invalid message": _with(messages=[{"role": "system", "content": []}]),
    "unanswered call": _with(messages=_valid()["messages"][:2]),
    "document not text": _with(document=["x"]),
    "document invalid": _with(document="version: '9.0'\n"),
    "document billion laughs": _with(document=BILLION_LAUGHS.read_text()),
    "undo not a list": _with(undo={}),
    "undo entry shape": _with(undo=[{"turn_id": "t", "document": "x", "more": 1}]),
    "undo empty turn id": _with(undo=[{"turn_id": "", "document": _valid()["document"]}]),
    "undo duplicate turn": _with(undo=[{"turn_id": "t", "document": _valid()["document"]}] * 2),
    "undo document invalid": _with(undo=[{"turn_id": "t", "document": "[1, 2"}]),
    "undo over its cap": _with(undo_max_entries=1),
    "undo cap too big": _with(undo_max_entries=MAX_UNDO_ENTRIES + 1),
    "undo cap bool": _with(undo_max_entries=True),
    "turn count negative": _with(turn_count=-1),
    "last turn id not text": _with(last_turn_id=3),
    "deep nesting": b'{"format": "trioloop-session", "version": 1, "model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nesting past the cap": _with(model=json.loads("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))),
}


@pytest.mark.parametrize("data", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_session_files_are_refused_with_a_typed_error(data: bytes) -> None:
    with pytest.raises(SessionFileError):
        decode_session(data, load_document=_load)


def test_size_is_capped_before_parsing() -> None:
    data = encode_session(_snapshot()[0], dump_document=dump_thf)
    with pytest.raises(SessionFileError, match="larger than"):
        decode_session(data, load_document=_load, max_bytes=len(data) - 1)
    assert decode_session(data, load_document=_load, max_bytes=len(data)).turn_count == 2


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(_valid())), _json)
def test_any_value_in_any_field_is_either_read_or_refused_typed(key: str, value: Any) -> None:
    with contextlib.suppress(SessionFileError):
        decode_session(_with(**{key: value}), load_document=_load)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_refused_typed(data: bytes) -> None:
    with pytest.raises(SessionFileError):
        decode_session(data, load_document=_load)


def test_nesting_is_capped_before_any_field_is_read() -> None:
    deep = json.loads("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(SessionFileError, match="nests deeper"):
        decode_session(_with(model=deep), load_document=_load)
    with pytest.raises(SessionFileError, match="not valid JSON"):
        decode_session(b"[" * 100_000 + b"]" * 100_000, load_document=_load)
