"""The journal format, pure: replay equals live for arbitrary runs (hypothesis), the hash chain catches any
change, and hostile entries are refused with a typed error naming the entry."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bounded_json import _bound, _peak  # the bounded reader's own measure of a decode's peak
from test_machine_stateful import REGISTRY  # the three tools the stateful machine test drives the reducer with

from trioloop.durable.journal import GENESIS, JournalError, decode_entries, decode_entry, encode_entry, verify_chain
from trioloop.durable.journal_writer import JournalWriter
from trioloop.durable.replay import recovery_inputs, replay_journal
from trioloop.durable.session_file import SessionSnapshot, UndoRecord
from trioloop.durable.store import StoredEntry
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import (
    Advance,
    ApproveBatch,
    ApproveCall,
    CallSettled,
    CallStatus,
    Cancel,
    DenyCall,
    Retry,
    Revoke,
    StartCall,
    Submit,
    TurnInput,
    TurnState,
    UndoTurn,
    reduce_turn,
)
from trioloop.machine.tools import ToolOutcome
from trioloop.machine.transaction import UndoEntry, UndoHistory, redo_step, undo_step, undo_turn
from trioloop.protocol import (
    Aborted,
    MessageStart,
    MessageStop,
    StreamError,
    TextDelta,
    ToolCallComplete,
    Usage,
)

SCALE = max(1, int(os.environ.get("TRIOLOOP_TORTURE_SCALE", "1")))


NAMES = ("read", "update", "update", "delete", "nope")
INPUTS: tuple[Any, ...] = ({"name": "web"}, {"name": "db"}, {"name": ""}, {})


def dump(text: str) -> str:
    return text


class LiveSession:
    """A session folded by hand, as `Session` and the runner do, writing its journal as it goes."""

    def __init__(self) -> None:
        self.document = "v0"
        self.undo: UndoHistory[str] = UndoHistory()
        self.messages: tuple[Any, ...] = ()
        self.turn: TurnState | None = None
        self.state: TurnState | None = None
        self.last_turn_id: str | None = None
        self.turns = 0
        self.writer = JournalWriter(last_seq=0, last_hash=GENESIS, dump_document=dump, clock=lambda: 0)
        self.entries: list[StoredEntry] = []
        self.writer.snapshot(self.snapshot())

    def snapshot(self) -> SessionSnapshot[str]:
        return SessionSnapshot(
            messages=self.messages,
            document=self.document,
            undo=tuple(UndoRecord(turn_id=e.turn_id, document=e.document) for e in self.undo.entries),
            undo_max_entries=self.undo.max_entries,
            last_turn_id=self.last_turn_id,
            turn_count=self.turns,
            model="m",
        )

    def feed(self, item: TurnInput) -> None:
        assert self.turn is not None
        old = self.turn
        if isinstance(item, CallSettled) and item.changed_document:
            call = old.call(item.call_id)
            if call is not None and call.status is CallStatus.RUNNING and item.outcome.ok:
                top = self.undo.top
                if top is None or top.turn_id != old.turn_id:
                    self.undo = self.undo.push(UndoEntry(turn_id=old.turn_id, document=self.document))
                self.document = f"v{self.writer.last_seq}-{item.call_id}"
        new = reduce_turn(old, item)
        self.writer.note(item, old, new, self.document)
        self.turn = self.state = new
        if new.is_settled:
            self.messages = new.messages
            self.last_turn_id = new.turn_id
            self.turn = None
            self.writer.snapshot(self.snapshot())

    def submit(self, text: str, limits: TurnLimits) -> None:
        self.turns += 1
        self.turn = TurnState.idle()
        self.feed(
            Submit(
                turn_id=f"turn-{self.turns}",
                text=text,
                base_messages=self.messages,
                tool_set=REGISTRY,
                limits=limits,
                now_ms=self.turns * 1000,
            )
        )

    def step(self, redo: bool) -> None:
        """An undo step (the newest turn on the stack) or a redo, as `Session.undo_step` / `redo_last_undo`."""
        if self.turn is not None:
            return
        stepped = (redo_step if redo else undo_step)(self.undo, self.document)
        if stepped is None:
            return
        self.document, self.undo, turn_id = stepped
        self.writer.add("redo" if redo else "undo", {"turn_id": turn_id, "by": ""})
        if not redo and self.state is not None and turn_id == self.last_turn_id:
            self.state = reduce_turn(self.state, UndoTurn())

    def undo_last(self) -> None:
        if self.turn is not None or self.last_turn_id is None:
            return
        undone = undo_turn(self.undo, self.document, self.last_turn_id)
        if undone is None:
            return
        self.document, self.undo = undone
        self.writer.add("undo", {"turn_id": self.last_turn_id, "by": ""})
        if self.state is not None:
            self.state = reduce_turn(self.state, UndoTurn())


def comparable(state: TurnState | None) -> Any:
    return None if state is None else attrs.evolve(state, draft=None)


def check_replay(live: LiveSession) -> None:
    live.entries.extend(live.writer.take())
    entries = decode_entries(live.entries)
    replayed = replay_journal(entries, load_document=lambda text: text, registry=REGISTRY)
    assert replayed.document == live.document
    assert replayed.undo.entries == live.undo.entries
    assert replayed.undo.redo == live.undo.redo
    assert replayed.messages == live.messages
    assert replayed.last_turn_id == live.last_turn_id
    assert replayed.turn_count == live.turns
    assert comparable(replayed.live) == comparable(live.turn)
    assert comparable(replayed.state) == comparable(live.state)


def _step(data: st.DataObject, live: LiveSession, clock: list[int]) -> None:
    turn = live.turn
    clock[0] += 7
    now = clock[0]
    if turn is None:
        choice = data.draw(st.sampled_from(["submit", "submit", "submit", "undo", "undo_step", "redo"]))
        if choice == "undo":
            live.undo_last()
        elif choice in ("undo_step", "redo"):
            live.step(redo=choice == "redo")
        else:
            limits = data.draw(
                st.sampled_from(
                    [
                        TurnLimits(),
                        TurnLimits(max_iterations=2, max_tool_calls_per_iteration=2),
                        TurnLimits(max_retries_per_turn=1),
                    ]
                )
            )
            live.submit(data.draw(st.text(max_size=5)), limits)
        return
    ids = [c.id for c in turn.calls] + ["ghost", "c1"]
    call_id = data.draw(st.sampled_from(ids))
    kind = data.draw(
        st.sampled_from(
            [
                "start_stream",
                "text",
                "text",
                "call",
                "call",
                "usage",
                "stop",
                "stop",
                "error",
                "notice",
                "abort",
                "approve",
                "approve",
                "edit",
                "batch",
                "deny",
                "start",
                "start",
                "settle",
                "settle",
                "advance",
                "advance",
                "retry",
                "cancel",
                "revoke",
            ]
        )
    )
    item: TurnInput
    if kind == "start_stream":
        item = MessageStart(model="m")
    elif kind == "text":
        item = TextDelta(text=data.draw(st.text(max_size=4)))
    elif kind == "call":
        item = ToolCallComplete(
            id=data.draw(st.sampled_from(["c1", "c2", "c3", ""])),
            name=data.draw(st.sampled_from(NAMES)),
            input=data.draw(st.sampled_from(INPUTS)),
        )
    elif kind == "usage":
        item = Usage(input_tokens=data.draw(st.integers(0, 50)), output_tokens=3)
    elif kind == "stop":
        item = MessageStop(stop_reason=data.draw(st.sampled_from(["tool_use", "end_turn", "max_tokens", "pause_turn"])))
    elif kind == "error":
        item = StreamError(code="http_status", message="boom")
    elif kind == "notice":
        item = StreamError(code="malformed_stream", message="one frame", terminal=False)
    elif kind == "abort":
        item = Aborted()
    elif kind == "approve":
        item = ApproveCall(call_id=call_id)
    elif kind == "edit":
        item = ApproveCall(call_id=call_id, edited_input=data.draw(st.sampled_from(INPUTS)))
    elif kind == "batch":
        item = ApproveBatch(call_ids=tuple(data.draw(st.lists(st.sampled_from(ids), max_size=3))))
    elif kind == "deny":
        item = DenyCall(call_id=call_id, reason=data.draw(st.text(max_size=4)))
    elif kind == "start":
        item = StartCall(call_id=call_id, now_ms=now)
    elif kind == "settle":
        ok = data.draw(st.booleans())
        outcome: ToolOutcome[Any] = ToolOutcome.success("ok") if ok else ToolOutcome.failure("no")
        item = CallSettled(call_id=call_id, outcome=outcome, now_ms=now, changed_document=data.draw(st.booleans()))
    elif kind == "advance":
        item = Advance(now_ms=turn.budget.started_at_ms + data.draw(st.sampled_from([5, 10**9])))
    elif kind == "retry":
        item = Retry(now_ms=now, failure=StreamError(code="http_status", message="busy"), wait_ms=500)
    elif kind == "cancel":
        item = Cancel(reason=data.draw(st.sampled_from(["stop", "deadline", "review_timeout"])))
    else:
        item = Revoke(call_id=call_id, detail="changed")
    live.feed(item)


@settings(max_examples=150 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_replay_equals_live_for_any_run(data: st.DataObject) -> None:
    live = LiveSession()
    clock = [0]
    for _ in range(data.draw(st.integers(1, 60))):
        _step(data, live, clock)
        if not live.writer.holding_stream:
            # Whenever nothing is held back (a response in mid-stream is asked again after a crash), the
            # journal replays to exactly the live session, field for field (the draft's chunking aside).
            check_replay(live)


def _journal(n: int = 3) -> list[StoredEntry]:
    live = LiveSession()
    for index in range(n):
        live.submit(f"t{index}", TurnLimits())
        live.feed(MessageStart(model="m"))
        live.feed(TextDelta(text="hello"))
        live.feed(MessageStop(stop_reason="end_turn"))
    return live.writer.take()


def test_any_changed_byte_breaks_the_chain_at_the_next_entry() -> None:
    stored = _journal()
    entries = decode_entries(stored)
    verify_chain(entries)
    for index in range(len(stored) - 1):
        raw = stored[index].data
        # Change one character of the entry's data and keep it well formed.
        forged = raw.replace(b'"at":0', b'"at":1')
        changed = [*entries[:index], decode_entry(forged), *entries[index + 1 :]]
        with pytest.raises(JournalError) as caught:
            verify_chain(changed)
        assert caught.value.seq == entries[index + 1].seq


def test_a_removed_or_reordered_entry_is_named() -> None:
    entries = decode_entries(_journal())
    with pytest.raises(JournalError, match="gap"):
        verify_chain([*entries[:2], *entries[3:]])
    swapped = [entries[0], entries[2], entries[1], *entries[3:]]
    with pytest.raises(JournalError):
        verify_chain(swapped)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b'{"seq":1}',
        b'{"seq":1,"kind":"submit","prev":"' + b"0" * 64 + b'","at":0,"data":{},"x":1}',
        b'{"seq":1,"kind":"launch","prev":"' + b"0" * 64 + b'","at":0,"data":{}}',
        b'{"seq":0,"kind":"submit","prev":"' + b"0" * 64 + b'","at":0,"data":{}}',
        b'{"seq":1,"seq":1,"kind":"submit","prev":"' + b"0" * 64 + b'","at":0,"data":{}}',
        b'{"seq":1,"kind":"submit","prev":"xyz","at":0,"data":{}}',
        b'{"seq":1,"kind":"submit","prev":"' + b"0" * 64 + b'","at":NaN,"data":{}}',
        '{"seq":1,"kind":"submit","prev":"é","at":0,"data":{}}'.encode(),
        b"[" * 100_000,
    ],
)
def test_hostile_entries_are_refused_with_a_typed_error(raw: bytes) -> None:
    with pytest.raises(JournalError):
        decode_entry(raw)


def test_a_journal_with_entries_that_do_not_make_sense_is_refused_naming_them() -> None:
    live = LiveSession()
    live.submit("x", TurnLimits())
    stored = live.writer.take()
    bad = encode_entry(3, "start", hashlib.sha256(stored[-1].data).hexdigest(), 0, {})
    with pytest.raises(JournalError) as caught:
        replay_journal(decode_entries([*stored, StoredEntry(3, bad)]), load_document=str, registry=REGISTRY)
    assert caught.value.seq == 3
    value = json.loads(stored[1].data)
    value["data"]["limits"]["max_iterations"] = -1
    forged = json.dumps(value, separators=(",", ":")).encode()
    with pytest.raises(JournalError, match="limits"):
        replay_journal(decode_entries([stored[0], StoredEntry(2, forged)]), load_document=str, registry=REGISTRY)


def test_recovery_inputs_settle_running_calls_revoke_changed_ones_and_ask_again() -> None:
    live = LiveSession()
    live.submit("x", TurnLimits(max_retries_per_turn=1))
    requesting = live.turn
    assert requesting is not None
    (retry,) = recovery_inputs(requesting, {}, now_ms=5)
    assert isinstance(retry, Retry) and retry.failure is not None
    spent = reduce_turn(requesting, retry)
    assert recovery_inputs(spent, {}, now_ms=6) == []  # past the retry budget: asked again, uncounted
    live.feed(MessageStart(model="m"))
    assert live.turn is not None
    (failed,) = recovery_inputs(live.turn, {}, now_ms=7)
    assert isinstance(failed, StreamError) and failed.terminal
    live.feed(ToolCallComplete(id="c1", name="update", input={"name": "web"}))
    live.feed(ToolCallComplete(id="c2", name="update", input={"name": "db"}))
    live.feed(MessageStop(stop_reason="tool_use"))
    live.feed(ApproveCall(call_id="c1"))
    live.feed(ApproveCall(call_id="c2"))
    live.feed(StartCall(call_id="c1", now_ms=8))
    state = live.turn
    assert state is not None
    c2 = state.call("c2")
    assert c2 is not None
    inputs = recovery_inputs(state, {"c2": "0" * 64, "c1": "whatever"}, now_ms=9)
    assert [type(i) for i in inputs] == [CallSettled, Revoke]
    settled, revoked = inputs
    assert isinstance(settled, CallSettled) and settled.call_id == "c1" and not settled.outcome.ok
    assert isinstance(revoked, Revoke) and revoked.call_id == "c2"
    assert recovery_inputs(state, {"c2": c2.input_digest}, now_ms=9)[1:] == []  # same digest: nothing to refuse


def test_a_hostile_entry_is_refused_in_bounded_memory() -> None:
    prefix = b'{"seq":1,"kind":"stream","prev":"' + b"0" * 64 + b'","at":0,"data":{"events":['
    raw = prefix + b",".join([b"{}"] * 1_000_000) + b"]}}"
    peak, result = _peak(lambda: decode_entry(raw))
    assert isinstance(result, JournalError)
    assert peak <= _bound(raw), (peak, len(raw))


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(data=st.dictionaries(st.text(), _JSON_VALUES, max_size=5), seq=st.integers(1, 2**53), at=st.integers(0, 2**53))
def test_an_entry_is_the_json_the_format_names_for_all_values(data: dict[str, Any], seq: int, at: int) -> None:
    """The encoder made once gives, for every value, the bytes ``json.dumps`` gives with the format's options."""
    value = {"seq": seq, "kind": "advance", "prev": "p" * 64, "at": at, "data": data}
    expected = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
    assert encode_entry(seq, "advance", "p" * 64, at, data) == expected


def test_an_entry_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode_entry(1, "advance", GENESIS, 0, {"x": float("nan")})
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode_entry(1, "advance", GENESIS, 0, {"x": object()})
