"""Reviews as data (trioloop.durable.review_document, trioloop.runtime.review_exchange).

A session's waiting review goes out as a signed JSON document (`Session.pending_review`), and the decisions on it
come back as a JSON document of signed records (`Session.apply_decisions`), maybe to another process. A decision
applies only when signed by a key the session accepts, for this session, the turn waiting and a card still waiting
with the digest the reviewer saw; anything else is refused with a reason, nothing runs for it, and nothing runs
twice. Real SQLite journals, the scripted provider over real HTTP.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from note_tools import NOTE, RUNS, TOOLS, fresh_runs, open_note  # noqa: F401 -- fresh_runs: autouse

from trioloop import (
    CallStatus,
    Outcome,
    Phase,
    ScriptedProvider,
    Session,
)
from trioloop.durable import review_document as module
from trioloop.durable.audit import verify_decision_entries
from trioloop.durable.decisions import DecisionError, ReviewDecision, open_decision
from trioloop.durable.journal import decode_entries
from trioloop.durable.review_document import (
    MAX_DECISIONS_DOCUMENT_BYTES,
    MAX_REVIEW_DOCUMENT_BYTES,
    ReviewCard,
    ReviewDocument,
    ReviewDocumentError,
    open_review_document,
    read_decisions,
    seal_decisions,
    seal_review_document,
)
from trioloop.durable.signing import JournalSigner
from trioloop.machine.canonical import canonical_json
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import SQLiteJournalStore

APP = JournalSigner.generate()  # the app's journal key: signs the review documents
REVIEWER = JournalSigner.generate()  # the reviewing service's key, which the app accepts
STRANGER = JournalSigner.generate()  # a key nobody accepts
CARDS = ScriptStep(
    text="I will add a line and erase.",
    tool_calls=(
        ScriptedCall(id="c1", name="append_line", input={"line": "one"}),
        ScriptedCall(id="c2", name="erase", input={}),
    ),
)

ONE = ScriptStep(tool_calls=(ScriptedCall(id="c1", name="append_line", input={"line": "one"}),))


@asynccontextmanager
async def opened(
    db: Path, provider: ScriptedProvider, session_id: str = "s1", *, signer: JournalSigner = APP, **kw: Any
) -> AsyncIterator[Session[str]]:
    """The session ``session_id`` of the SQLite journal ``db``, open (its store closed after it)."""
    async with SQLiteJournalStore(db) as store:
        session = await open_note(store, provider, session_id, signer=signer, keys=kw.pop("keys", REVIEWER.keys), **kw)
        async with session:
            yield session


async def entries(db: Path, session_id: str = "s1") -> list[Any]:
    async with SQLiteJournalStore(db) as store:
        return decode_entries(await store.read(session_id))


async def until_review(session: Session[str]) -> None:
    async for state in session.states():
        if state.phase is Phase.AWAITING_APPROVAL:
            return


async def suspend_with_cards(db: Path, session_id: str = "s1", step: ScriptStep = CARDS) -> None:
    async with (
        ScriptedProvider([step]) as provider,
        opened(db, provider, session_id) as session,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(session.send, "edit the note")
        await until_review(session)
        await session.suspend()


async def export(db: Path, session_id: str = "s1") -> str:
    """The waiting review as the JSON text a queue or a ticket carries (read by another opening of the store)."""
    async with ScriptedProvider([]) as provider, opened(db, provider, session_id) as session:
        return session.pending_review().to_json()


async def apply(db: Path, decisions: str, steps: list[ScriptStep] | None = None, **kw: Any) -> tuple[Any, Any]:
    """Apply ``decisions`` in a new opening of the store, then (given ``steps``) carry the turn on."""
    async with ScriptedProvider(steps or []) as provider, opened(db, provider, **kw) as session:
        taken = await session.apply_decisions(decisions)
        final = await session.continue_turn() if steps is not None else session.state
    return taken, final


def decide(text: str, card: str, signer: JournalSigner = REVIEWER, /, **changes: Any) -> str:
    """A reviewer's decision on ``card`` as the review document ``text`` shows it (``changes`` forge it)."""
    doc = open_review_document(text, APP.keys)
    decision = doc.decision(card, changes.pop("action", "approve"), reviewer="ada", reviewer_name="Ada")
    return seal_decisions([attrs.evolve(decision, **changes)], signer)


async def test_a_suspended_review_goes_out_as_json_and_its_decisions_come_back_to_another_opening(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    await suspend_with_cards(db)
    text = await export(db)

    doc = open_review_document(text, APP.keys)
    assert doc.to_json() == text and doc.session_id == "s1" and doc.turn_id == "turn-1" and doc.suspended
    assert doc.request == "edit the note" and doc.model_text == "I will add a line and erase."
    assert [(c.call_id, c.tool, c.destructive, c.input) for c in doc.cards] == [
        ("c1", "append_line", False, {"line": "one"}),
        ("c2", "erase", True, {}),
    ]
    assert doc.card("c1").details == (("line", "one"),) and doc.card("c2").rule_options == ("deny:tool",)
    by_seq = {e.seq: e for e in await entries(db)}
    assert by_seq[doc.head_seq].hash == doc.head_hash  # the journal head it was read at

    answer = seal_decisions(
        [
            doc.decision("c1", "approve", reviewer="ada", edited_input={"line": "ONE"}),
            doc.decision("c2", "deny", reviewer="bob", reason="keep it"),
        ],
        REVIEWER,
    )
    taken, final = await apply(db, answer, [ScriptStep(text="Done.")])
    assert [(t.record_id, t.applied, t.deferred) for t in taken] == [(0, True, True), (1, True, True)], taken
    assert final.outcome is Outcome.COMPLETED and RUNS == ["ONE"]
    assert final.call("c1").decided_by.describe() == "approved by ada"
    assert final.call("c2").decided_by.describe() == "denied by bob"
    journal = await entries(db)
    approve = next(e for e in journal if e.kind == "approve")
    assert approve.data["reviewer"] == "ada" and approve.data["seen_digest"] == doc.card("c1").digest
    proven = verify_decision_entries(journal, session_id="s1", keys=APP.keys | REVIEWER.keys)
    assert sorted(proven.values()) == [REVIEWER.key_id, REVIEWER.key_id]  # the audit proves each record again


CHILD = """
import faulthandler, json, sys, trio
faulthandler.dump_traceback_later(20, exit=True)
sys.path.insert(0, sys.argv[1])
import test_review_document as t
from trioloop.durable.signing import JournalKeys, JournalSigner, public_key_from_text
from trioloop.providers.scripted import ScriptStep

async def main():
    signer, keys = JournalSigner.load(sys.argv[3]), JournalKeys([public_key_from_text(sys.argv[4])])
    steps = [ScriptStep(text="Done.")]
    taken, final = await t.apply(t.Path(sys.argv[2]), sys.stdin.read(), steps, signer=signer, keys=keys)
    print(json.dumps({"taken": [[x.applied, x.note] for x in taken], "outcome": final.outcome.value, "runs": t.RUNS}))

trio.run(main)
"""
TESTS = str(Path(__file__).resolve().parent)


async def test_decisions_applied_in_another_process_carry_the_turn_on(tmp_path: Path) -> None:
    db, key = tmp_path / "j.db", tmp_path / "app-key"
    APP.save(key)
    await suspend_with_cards(db, step=ONE)
    text = await export(db)
    answer = decide(text, "c1")
    done = await trio.run_process(
        [sys.executable, "-c", CHILD, TESTS, str(db), str(key), REVIEWER.public_key_text],
        stdin=answer.encode("utf-8"),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert report["outcome"] == "completed" and report["runs"] == ["one"], report
    assert [applied for applied, _ in report["taken"]] == [True]
    assert RUNS == []  # it ran there, not here


async def test_a_review_waiting_in_a_running_turn_is_exported_and_decided_at_once(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    step = ScriptStep(tool_calls=(ScriptedCall(id="c1", name="append_line", input={"line": "hi"}),))
    done: list[Any] = []
    async with (
        ScriptedProvider([step, ScriptStep(text="Done.")]) as provider,
        opened(db, provider) as s,
        trio.open_nursery() as nursery,
    ):

        async def drive() -> None:
            done.append(await s.send("add hi"))

        nursery.start_soon(drive)
        await until_review(s)
        doc = s.pending_review(expires_in_s=60)
        assert not doc.suspended and doc.expires_at is not None and doc.expires_at > doc.exported_at
        (taken,) = await s.apply_decisions(decide(doc.to_json(), "c1"))
        assert taken.applied and not taken.deferred and taken.note.endswith(f"applied (key {REVIEWER.key_id})")
    assert done[0].outcome is Outcome.COMPLETED and RUNS == ["hi"]


def _other_session(text: str) -> str:
    doc = open_review_document(text, APP.keys)
    return seal_decisions([attrs.evolve(doc.decision("c1", "approve", reviewer="ada"), session_id="s2")], REVIEWER)


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda text: decide(text, "c1", digest="0" * 64), "input changed"),
        (lambda text: decide(text, "c1", STRANGER), "does not accept"),
        (_other_session, "another session"),
        (lambda text: decide(text, "c1", turn_id="turn-9"), "turn it was made for is over"),
        (lambda text: decide(text, "c1", call_id="c9"), "no such card"),
        (lambda text: decide(text, "c2", always="tool"), "never approves a destructive call"),
        (lambda text: decide(text, "c1", edited_input={"line": 5}), "not valid"),
    ],
)
async def test_a_decision_that_does_not_prove_itself_is_refused_and_nothing_runs(
    tmp_path: Path, build: Callable[[str], str], expected: str
) -> None:
    db = tmp_path / "j.db"
    await suspend_with_cards(db)
    text = await export(db)
    (taken,), state = await apply(db, build(text))
    assert not taken.applied and expected in taken.note, taken
    assert all(c.status is CallStatus.PENDING for c in state.current_calls) and RUNS == []


async def test_a_session_accepts_its_own_key_for_decisions_its_app_code_signs(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await suspend_with_cards(db, step=ONE)
    text = await export(db)
    taken, final = await apply(db, decide(text, "c1", APP), [ScriptStep(text="Done.")], keys=None)
    assert [t.applied for t in taken] == [True] and RUNS == ["one"] and final.outcome is Outcome.COMPLETED


async def test_a_replayed_or_duplicated_decisions_document_runs_nothing_twice(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await suspend_with_cards(db, step=ONE)
    text = await export(db)
    doc = open_review_document(text, APP.keys)
    approve = doc.decision("c1", "approve", reviewer="ada")
    twice = seal_decisions([approve, approve, doc.decision("c1", "deny", reviewer="bob")], REVIEWER)
    async with ScriptedProvider([ScriptStep(text="Done.")]) as provider, opened(db, provider) as s:
        first = await s.apply_decisions(twice)
        again = await s.apply_decisions(twice)  # the same message delivered again
        assert [t.applied for t in first] == [True, True, False] and "already decided" in first[2].note
        assert [t.applied for t in again] == [True, True, False]
        assert [t.deferred for t in first] == [True, False, False]  # handed to the turn once
        final = await s.continue_turn()
        late = await s.apply_decisions(twice)  # after the turn: nothing waits
    assert final.outcome is Outcome.COMPLETED and RUNS == ["one"]
    assert [t.note for t in late] == ["no turn of this session waits for a decision"] * 3
    _, state = await apply(db, twice)
    assert RUNS == ["one"] and state.is_settled


async def test_an_oversized_or_malformed_document_is_a_typed_error_before_it_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: Any, **kw: Any) -> Any:
        raise AssertionError("parsed")

    with monkeypatch.context() as patched:
        patched.setattr(module, "parse_bounded_json", never)
        with pytest.raises(ReviewDocumentError, match="cap"):
            read_decisions("[" * (MAX_DECISIONS_DOCUMENT_BYTES + 1))
        with pytest.raises(ReviewDocumentError, match="cap"):
            read_decisions(b" " * (MAX_DECISIONS_DOCUMENT_BYTES + 1))
        with pytest.raises(ReviewDocumentError, match="over"):
            open_review_document("{" * (MAX_REVIEW_DOCUMENT_BYTES + 1), APP.keys)
    db = tmp_path / "j.db"
    await suspend_with_cards(db)
    text = await export(db)
    good = decide(text, "c1")
    bad = [
        "not json",
        "[" * 500 + "]" * 500,
        "[]",
        json.dumps(json.loads(good), indent=2),  # pretty-printed: not the canonical text that was signed
        good.replace('"trioloop_decisions":1', '"trioloop_decisions":2'),
        good.replace('{"decisions":[', '{"decisions":[1,'),
        '{"decisions":[],"trioloop_decisions":1}',
        good[:-1] + ',"extra":1}',
    ]
    async with ScriptedProvider([]) as provider, opened(db, provider) as session:
        for raw in bad:
            with pytest.raises(ReviewDocumentError):
                await session.apply_decisions(raw)
        with pytest.raises(ReviewDocumentError, match="cap"):
            await session.apply_decisions("x" * (MAX_DECISIONS_DOCUMENT_BYTES + 1))
        assert session.state is not None
        assert all(c.status is CallStatus.PENDING for c in session.state.current_calls)
    for raw in [
        "not json",
        "[]",
        json.dumps(json.loads(text), indent=1),
        text.replace('"trioloop_review":1', '"trioloop_review":2'),
    ]:
        with pytest.raises(ReviewDocumentError):
            open_review_document(raw, APP.keys)
    assert RUNS == []


async def test_a_forged_review_document_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await suspend_with_cards(db)
    text = await export(db)
    with pytest.raises(ReviewDocumentError, match="not accepted"):
        open_review_document(text, REVIEWER.keys)
    forged = text.replace('"line":"one"', '"line":"two"')
    with pytest.raises(ReviewDocumentError, match="does not verify"):
        open_review_document(forged, APP.keys)
    resigned = seal_review_document(open_review_document(text, APP.keys), STRANGER)
    with pytest.raises(ReviewDocumentError, match="not accepted"):
        open_review_document(resigned.to_json(), APP.keys)
    with pytest.raises(ReviewDocumentError, match="expired"):
        expiring = seal_review_document(attrs.evolve(open_review_document(text, APP.keys), expires_at=5), APP)
        open_review_document(expiring.to_json(), APP.keys, now_ms=6)


async def test_no_review_no_document(tmp_path: Path) -> None:
    async with ScriptedProvider([]) as provider, opened(tmp_path / "j.db", provider) as session:
        with pytest.raises(ReviewDocumentError, match="no turn"):
            session.pending_review()
    async with ScriptedProvider([]) as provider, Session(document="", kind=NOTE, provider=provider, model="m") as s:
        with pytest.raises(ReviewDocumentError, match="signed journal"):
            s.pending_review()


# -- for all ------------------------------------------------------------------------------------------------------

_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_CARD = st.builds(
    ReviewCard,
    call_id=_TEXT,
    tool=_TEXT,
    summary=_TEXT,
    effect=st.sampled_from(["read", "mutate"]),
    destructive=st.booleans(),
    input=_JSON,
    digest=_TEXT,
    details=st.lists(st.tuples(_TEXT, _TEXT), max_size=3).map(tuple),
    preview=st.lists(_TEXT, max_size=3).map(tuple),
    asked_by=_TEXT,
)
_DOCUMENT = st.builds(
    ReviewDocument,
    session_id=_TEXT,
    turn_id=_TEXT,
    head_seq=st.integers(0, 2**40),
    head_hash=_TEXT,
    request=_TEXT,
    model_text=_TEXT,
    suspended=st.booleans(),
    cards=st.lists(_CARD, max_size=3).map(tuple),
    exported_at=st.integers(0, 2**50),
    expires_at=st.none() | st.integers(0, 2**50),
    key_id=st.just(""),
    signature=st.just(""),
)


@settings(max_examples=150, deadline=None)
@given(document=_DOCUMENT)
def test_for_all_documents_export_then_open_is_the_identity(document: ReviewDocument) -> None:
    sealed = seal_review_document(document, APP)
    assert open_review_document(sealed.to_json(), APP.keys) == sealed
    assert open_review_document(sealed.to_json().encode("utf-8"), APP.keys).to_json() == sealed.to_json()


_SIGNED = (
    seal_review_document(
        ReviewDocument(
            session_id="s1",
            turn_id="turn-1",
            head_seq=9,
            head_hash="ab" * 32,
            request="edit",
            model_text="ok",
            suspended=True,
            cards=(
                ReviewCard(
                    call_id="c1",
                    tool="append_line",
                    summary="Append 'one'",
                    effect="mutate",
                    destructive=False,
                    input={"line": "one"},
                    digest="cd" * 32,
                    details=(("line", "one"),),
                ),
            ),
            exported_at=1,
            key_id="",
            signature="",
        ),
        APP,
    )
    .to_json()
    .encode("utf-8")
)
_DECISIONS = seal_decisions(
    [ReviewDecision(session_id="s1", turn_id="turn-1", call_id="c1", digest="cd" * 32, action="deny", reviewer="a")],
    REVIEWER,
).encode("utf-8")


def _mutated(raw: bytes, data: st.DataObject) -> bytes:
    at = data.draw(st.integers(0, len(raw) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != raw[at]))
    return raw[:at] + bytes([byte]) + raw[at + 1 :]


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_for_all_byte_changes_a_signed_review_document_is_refused(data: st.DataObject) -> None:
    with pytest.raises(ReviewDocumentError):
        open_review_document(_mutated(_SIGNED, data), APP.keys)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_for_all_byte_changes_a_decisions_document_proves_no_decision(data: st.DataObject) -> None:
    try:
        records = read_decisions(_mutated(_DECISIONS, data))
    except ReviewDocumentError:
        return
    for record in records:
        with pytest.raises(DecisionError):
            open_decision(record, REVIEWER.keys)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
async def test_for_all_byte_changes_a_decisions_document_runs_no_tool(tmp_path: Path, data: st.DataObject) -> None:
    RUNS.clear()
    db = Path(tempfile.mkdtemp(dir=tmp_path)) / "j.db"  # hypothesis may run an example again: a new store each
    await suspend_with_cards(db)
    raw = decide(await export(db), "c1", action="deny").encode("utf-8")  # the genuine one denies
    forged = _mutated(raw, data)
    async with ScriptedProvider([ScriptStep(text="ok")]) as provider, opened(db, provider) as session:
        try:
            taken = await session.apply_decisions(forged)
        except ReviewDocumentError:
            taken = []
        assert not any(t.applied for t in taken)
        assert session.state is not None
        assert all(c.status is CallStatus.PENDING for c in session.state.current_calls)
    assert RUNS == []


def test_a_signature_spelled_another_way_is_refused() -> None:
    """Base64 leaves the last character's low bits unused: a signature with them set decodes to the same bytes, and
    is refused all the same (no byte of a signed document or record changes while it still passes)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    review = json.loads(_SIGNED)
    record = json.loads(_DECISIONS)["decisions"][0]
    for value in (review, record):
        signature = value["signature"]
        last = signature.rstrip("=")[-1]
        respelled = alphabet[alphabet.index(last) | 1 if alphabet.index(last) % 2 == 0 else alphabet.index(last) - 1]
        value["signature"] = signature.replace(last + "==", respelled + "==")
        assert value["signature"] != signature
    with pytest.raises(ReviewDocumentError, match="does not verify"):
        open_review_document(canonical_json(review), APP.keys)
    with pytest.raises(DecisionError, match="does not verify"):
        open_decision(canonical_json(record).encode("utf-8"), REVIEWER.keys)
