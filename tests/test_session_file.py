"""The session file: conversation + document + undo history round-trip; hostile files are refused, typed."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bounded_json import _bound, _peak  # one measure of a decode's peak memory

from trioloop.durable.files import write_atomic
from trioloop.durable.session_file import (
    MAX_JSON_DEPTH,
    MAX_UNDO_ENTRIES,
    SessionFileError,
    SessionSnapshot,
    UndoRecord,
    decode_session,
    encode_session,
)
from trioloop.machine.transaction import UndoEntry, UndoHistory, undo_turn
from trioloop.protocol import (
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)
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
    assert value["format"] == "trioloop-session" and value["version"] == 2


def test_a_version_1_file_is_read_and_names_no_kind_or_source() -> None:
    snapshot, _ = _snapshot()
    named = attrs.evolve(snapshot, kind="threat model", source="/a.thf")
    value = json.loads(encode_session(named, dump_document=dump_thf))
    assert (value["kind"], value["source"]) == ("threat model", "/a.thf")
    del value["kind"], value["source"], value["usage"], value["rules"]
    value["version"] = 1
    read = decode_session(json.dumps(value).encode(), load_document=_load)
    assert (read.kind, read.source) == (None, None) and read == snapshot
    value["kind"] = "note"  # version 1 has no such key
    with pytest.raises(SessionFileError, match="unknown key 'kind'"):
        decode_session(json.dumps(value).encode(), load_document=_load)


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
    "future version": _with(version=3),
    "source not text": _with(source=7),
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


# -- memory: decoding never holds more than 8 times the file's size (plus 1 MiB) -------------------


def _session_with(messages: bytes) -> bytes:
    head = json.dumps({k: v for k, v in _valid().items() if k != "messages"})[:-1].encode()
    return head + b', "messages": ' + messages + b"}"


MEMORY_HOSTILE = {
    # The file: 2.9 MiB, a million {}; the old decoder grew by about 135 MiB before refusing.
    "a million {}": b"[" + b",".join([b"{}"] * 1_000_000) + b"]",
    "300,000 {} as messages": _session_with(b"[" + b",".join([b"{}"] * 300_000) + b"]"),
    "100,000 [] in a tool input": _session_with(
        b'[{"role": "assistant", "content": [{"type": "tool_call", "id": "t", "name": "n", "input": ['
        + b",".join([b"[]"] * 100_000)
        + b"]}]}]"
    ),
    "80,000 distinct keys in a tool input": _session_with(
        b'[{"role": "assistant", "content": [{"type": "tool_call", "id": "t", "name": "n", "input": {'
        + b",".join(b'"k%d": 0' % i for i in range(80_000))
        + b"}}]}]"
    ),
}


@pytest.mark.parametrize("name", list(MEMORY_HOSTILE))
def test_a_hostile_file_is_refused_within_eight_times_its_size(name: str) -> None:
    data = MEMORY_HOSTILE[name]
    peak, result = _peak(lambda: decode_session(data, load_document=_load))
    assert isinstance(result, SessionFileError) and "more memory" in str(result), result
    assert peak <= _bound(data), f"{name}: {peak / len(data):.1f} times its size"


def _with_raw(key: str, raw: bytes) -> bytes:
    """A valid file whose ``key`` holds ``raw``, written as is (JSON that json.dumps would not write)."""
    value = _valid()
    value[key] = "placeholder-7f3a"
    return _bytes(value).replace(b'"placeholder-7f3a"', raw)


def test_a_number_past_a_float_is_refused_not_read_as_infinity() -> None:
    with pytest.raises(SessionFileError, match="too large for a float"):
        decode_session(_with_raw("undo_max_entries", b"1e999"), load_document=_load)


def _turns(count: int) -> tuple[Message, ...]:
    messages: list[Message] = []
    for turn in range(count):
        call = ToolCallBlock(
            id=f"toolu_{turn:05d}",
            name="add_threat",
            input={"threat": {"title": f"Spoofed webhook {turn} \u00e9", "severity": "high", "tags": ["a", "b"]}},
        )
        messages += [
            Message.user(f"add threat number {turn} \U0001f600"),
            Message(
                role="assistant", content=(ThinkingBlock(thinking="Check the flows."), TextBlock(text="Adding."), call)
            ),
            Message(role="user", content=(ToolResultBlock(call_id=call.id, content=f"added threat-{turn}"),)),
            Message.assistant("Done."),
        ]
    return tuple(messages)


def test_a_long_legitimate_session_is_read_within_eight_times_its_size() -> None:
    snapshot = attrs.evolve(_snapshot(SMALL)[0], messages=_turns(800))
    data = encode_session(snapshot, dump_document=dump_thf)
    peak, result = _peak(lambda: decode_session(data, load_document=_load))
    assert result == snapshot
    assert peak <= _bound(data), f"{peak / len(data):.1f} times its size"


def test_a_session_of_large_documents_is_read_within_eight_times_its_size() -> None:
    text = "".join(f'line {i}: "quoted" \\ caf\u00e9 \u4e2d\n' for i in range(20_000))
    snapshot = SessionSnapshot(
        messages=_turns(3),
        document=text,
        undo=tuple(UndoRecord(turn_id=f"turn-{i}", document=text + str(i)) for i in range(3)),
        undo_max_entries=20,
        last_turn_id="turn-2",
        turn_count=3,
    )
    data = encode_session(snapshot, dump_document=str)
    peak, result = _peak(lambda: decode_session(data, load_document=str))
    assert result == snapshot
    assert peak <= _bound(data), f"{peak / len(data):.1f} times its size"


_texts = st.text(max_size=12)
_tool_inputs = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**18), max_value=10**18)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
    max_leaves=8,
)
_side_blocks = st.one_of(
    st.builds(TextBlock, text=_texts),
    st.builds(ThinkingBlock, thinking=_texts, signature=_texts, source=_texts),
    st.builds(RedactedThinkingBlock, data=_texts),
    st.builds(ProviderBlock, wire=st.sampled_from(["anthropic", "openai-responses"]), kind=_texts, data=_texts),
)


@st.composite
def _conversations(draw: st.DrawFn) -> tuple[Message, ...]:
    """A pairable conversation: each turn a user message, an assistant reply, and its tools' results."""
    messages: list[Message] = []
    calls_made = 0
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        messages.append(Message.user(draw(_texts)))
        calls = []
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            calls_made += 1
            calls.append(ToolCallBlock(id=f"toolu_{calls_made}", name=draw(_texts), input=draw(_tool_inputs)))
        messages.append(Message(role="assistant", content=(*draw(st.lists(_side_blocks, max_size=2)), *calls)))
        if calls:
            results = [ToolResultBlock(call_id=c.id, content=draw(_texts), is_error=draw(st.booleans())) for c in calls]
            messages.append(Message(role="user", content=tuple(results)))
    return tuple(messages)


@st.composite
def _sessions(draw: st.DrawFn) -> SessionSnapshot[str]:
    turn_ids = draw(st.lists(st.text(min_size=1, max_size=8), max_size=4, unique=True))
    return SessionSnapshot(
        messages=draw(_conversations()),
        document=draw(st.text(max_size=40)),
        undo=tuple(UndoRecord(turn_id=t, document=draw(st.text(max_size=20))) for t in turn_ids),
        undo_max_entries=draw(st.integers(min_value=max(1, len(turn_ids)), max_value=MAX_UNDO_ENTRIES)),
        last_turn_id=draw(st.none() | st.text(max_size=8)),
        turn_count=draw(st.integers(min_value=0, max_value=10**6)),
        model=draw(st.none() | _texts),
    )


@settings(max_examples=150, deadline=None)
@given(_sessions())
def test_any_session_of_valid_messages_decodes_to_what_was_encoded(snapshot: SessionSnapshot[str]) -> None:
    data = encode_session(snapshot, dump_document=str)
    assert decode_session(data, load_document=str) == snapshot


# -- a save whose folder cannot be synced ---------------------------------------------------------


def test_a_save_whose_folder_sync_fails_says_the_new_session_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "chat.session.json"
    old, _ = _snapshot(SMALL)
    write_atomic(path, encode_session(old, dump_document=dump_thf))
    new = attrs.evolve(old, turn_count=3, messages=_turns(2))
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):  # the folder's fsync only; the file's goes through
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as caught:
        write_atomic(path, encode_session(new, dump_document=dump_thf))
    monkeypatch.undo()
    error = caught.value
    # Same type and errno as the failure, and a message that does not pretend nothing was written.
    assert type(error) is OSError and error.errno == errno.EIO and error.filename == str(path.resolve())
    assert "the new content is in place" in str(error) and "may not survive a crash" in str(error)
    assert decode_session(path.read_bytes(), load_document=_load) == new
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left


def test_an_interrupt_while_syncing_the_folder_leaves_the_new_session_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "chat.session.json"
    old, _ = _snapshot(SMALL)
    write_atomic(path, encode_session(old, dump_document=dump_thf))
    new = attrs.evolve(old, turn_count=5)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise KeyboardInterrupt
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, encode_session(new, dump_document=dump_thf))
    monkeypatch.undo()
    assert decode_session(path.read_bytes(), load_document=_load) == new
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
