"""A session's review as data (`Session.pending_review`) and decisions that come back as data
(`Session.apply_decisions`): the documents of `trioloop.durable.review_document`, judged against the live turn.

Exporting reads the turn waiting in review (running, or suspended) and signs its waiting cards with the session's
journal key. Applying takes a decisions document apart and proves each record exactly as a record from the web
inbox is proven (`trioloop.runtime.remote_review.judge_record`): signed by a key the session accepts (its own or
``keys=``), for this session, the turn waiting, a card still waiting with the digest the reviewer saw, no "always"
that approves a destructive call, an edit the tool accepts. A proven record becomes the reviewer's click
(`hand_over`), its journal entry keeping the signed record, so `trioloop audit` proves it again; anything else is
refused with the reason, and nothing runs for it.

Nothing runs twice: a record whose decision the turn shows already (the same document again, a redelivered
message) is reported applied and handed over no more; a second decision on a decided card is refused. For a
suspended turn, what was handed over is folded into the state later records are judged against (the turn itself
takes them when it goes on, `continue_turn`), so a duplicate is recognised there too.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from trioloop.durable.decisions import ReviewDecision
from trioloop.durable.review_document import ReviewDocument, ReviewDocumentError, read_decisions, review_document_of
from trioloop.durable.signing import JournalSigner
from trioloop.machine.reducer import reduce_turn
from trioloop.machine.state import TurnState
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.remote_review import TakenDecision, hand_over, judge_record
from trioloop.runtime.session_journal import SessionJournal

__all__ = ["ReviewExchange"]

_QUEUED_NOTE = "taken, to apply when the turn goes on (continue_turn)"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _signer_of(journal: SessionJournal) -> JournalSigner | None:
    """The key that signs the session's journal."""
    return journal.turns.writer.signer


class ReviewExchange:
    """Export the waiting review; prove and apply a decisions document (see the module docstring).

    Given ``journal()`` (the session's journal, or None), ``live()`` (the controls a decision goes to, the state it
    is judged against and whether the turn is suspended, or None), ``document()`` (the live document, which the
    previews are shown on), ``states()`` (the newest state each time it changes) and ``clock()`` (wall ms)."""

    def __init__(
        self,
        *,
        journal: Callable[[], SessionJournal | None],
        live: Callable[[], tuple[TurnControls, TurnState, bool] | None],
        document: Callable[[], Any],
        states: Callable[[], AsyncIterator[TurnState]],
        clock: Callable[[], int] = _wall_ms,
    ) -> None:
        self._journal = journal
        self._live = live
        self._document = document
        self._states = states
        self._clock = clock
        self._lock = trio.Lock()
        #: A suspended turn's decisions handed over here, folded into its state: (its controls, that state).
        self._projected: tuple[TurnControls, TurnState] | None = None

    def _judged_against(self, live: tuple[TurnControls, TurnState, bool]) -> TurnState:
        controls, state, suspended = live
        projected = self._projected
        if suspended and projected is not None and projected[0] is controls:
            return projected[1]
        return state

    def export(self, *, expires_in_s: float | None = None) -> ReviewDocument:
        """The review waiting now as a signed document; `ReviewDocumentError` when none waits, or the session
        has no signed journal to sign it with."""
        journal = self._journal()
        signer = None if journal is None else _signer_of(journal)
        if journal is None or signer is None:
            raise ReviewDocumentError("a session without a signed journal cannot sign its review (Session.open)")
        if expires_in_s is not None and not (expires_in_s > 0 and math.isfinite(expires_in_s)):
            raise ValueError("expires_in_s must be a positive number of seconds")
        live = self._live()
        if live is None:
            raise ReviewDocumentError("no turn of this session waits for a decision")
        now = self._clock()
        writer = journal.turns.writer
        return review_document_of(
            self._judged_against(live),
            document=self._document(),
            session_id=journal.lease.session_id,
            head=(writer.last_seq, writer.last_hash),
            suspended=live[2],
            signer=signer,
            now_ms=now,
            expires_at=None if expires_in_s is None else now + math.ceil(expires_in_s * 1000),
        )

    async def apply(self, data: bytes | bytearray | str) -> list[TakenDecision]:
        """Prove and apply each record of the decisions document ``data``, in order: what became of each
        (``record_id`` is its position in the document). `ReviewDocumentError`, before anything is applied, for a
        document that is not one (`read_decisions`)."""
        records = read_decisions(data)
        journal = self._journal()
        if journal is None:
            why = "a session without a journal accepts no key: it takes no decisions documents"
            return [TakenDecision(index, False, why) for index in range(len(records))]
        async with self._lock:
            return [await self._apply_one(index, raw, journal) for index, raw in enumerate(records)]

    async def _apply_one(self, index: int, raw: bytes, journal: SessionJournal) -> TakenDecision:
        live = self._live()
        state = None if live is None else self._judged_against(live)
        judged = judge_record(raw, session_id=journal.lease.session_id, keys=journal.keys, state=state)
        decision: ReviewDecision | None = judged.decision
        if judged.item is None or live is None or state is None or decision is None:
            return TakenDecision(index, judged.applied, judged.note, decision)
        controls, _, suspended = live
        refusal = await hand_over(judged, controls, suspended, vouch=journal.turns.writer.vouch, states=self._states)
        if refusal:
            return TakenDecision(index, False, refusal, decision)
        if suspended:
            self._projected = (controls, reduce_turn(state, judged.item))
        how = _QUEUED_NOTE if suspended else "applied"
        return TakenDecision(index, True, f"{decision.describe()}: {how} (key {judged.key_id})", decision, suspended)
