"""Decisions made away from the session's process (the web inbox), proven and fed to its turn (`RemoteReview`).

A record in the store's decision box (`trioloop.durable.decision_box`) decides nothing until the process that
holds the session has proven it: signed by a key the session accepts (its own or ``keys=``), for this session,
for the turn that is waiting, for a card that still waits, with the digest of the input the card shows now (a
changed input, an edit by someone else, a stale page decide nothing), and, for an edited input, an edit the call's
own tool accepts. Only then does it become the turn's input, as a click would, naming its reviewer; the journal
entry keeps the signed record, so `trioloop audit` proves it again. Every record is answered in the box: applied,
or refused with the reason the reviewer reads.

While a review is open the session polls its box (`poll_s`; a store that tells of new records, PostgreSQL,
answers the same poll: the box is one indexed query), so a decision reaches the turn within about one poll.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import attrs
import trio

from trioloop.durable.decision_box import DecisionBox
from trioloop.durable.decisions import DecisionError, PostedDecision, ReviewDecision, open_decision
from trioloop.durable.signing import JournalKeys
from trioloop.machine.inputs import ApproveCall, DenyCall
from trioloop.machine.rules import Verdict
from trioloop.machine.state import CallStatus, Phase, TurnState
from trioloop.machine.texts import invalid_edit_text
from trioloop.machine.tools import PrepareFailure
from trioloop.runtime.controls import TurnControls

__all__ = ["DEFAULT_POLL_S", "Judged", "RemoteReview", "TakenDecision", "hand_over", "judge_record"]

#: How often an open review asks its decision box (seconds).
DEFAULT_POLL_S: Final = 0.05
#: How often a store that announces decisions is asked anyway (a notice is lost with its connection).
_NOTIFIED_POLL_S: Final = 1.0
_WAITING_NOTE: Final = "taken, to apply when the turn goes on"
#: How long answering a record in the box may take once it was judged.
_ANSWER_S: Final = 10.0
#: How long an applied decision may take to show in the running turn's state before it is judged lost.
_SEEN_S: Final = 5.0


@attrs.frozen
class TakenDecision:
    """What became of one record: ``applied`` (the turn took it) or not, and the reason the reviewer reads."""

    record_id: int
    applied: bool
    note: str
    decision: ReviewDecision | None = None
    #: Taken by a suspended turn: the record is answered ``applied`` once the turn goes on and journals it.
    deferred: bool = False


class RemoteReview:
    """A session's decision box, judged against its live turn (see the module docstring).

    Given the box and the session id, ``keys()`` (the keys the session accepts, None for none), ``live()`` (the
    controls that take decisions and the state they are judged against, or None when no review is open),
    ``vouch(call_id, record)`` (the journal keeps the record with the decision's entry), ``newest()`` (the latest
    state) and ``states()`` (the latest state each time it changes, to see a decision taken)."""

    def __init__(
        self,
        *,
        box: DecisionBox,
        session_id: str,
        keys: Callable[[], JournalKeys | None],
        live: Callable[[], tuple[TurnControls, TurnState, bool] | None],
        vouch: Callable[[str, dict[str, Any]], None],
        newest: Callable[[], TurnState | None],
        states: Callable[[], AsyncIterator[TurnState]],
        poll_s: float = DEFAULT_POLL_S,
    ) -> None:
        if not (poll_s > 0 and math.isfinite(poll_s)):
            raise ValueError("poll_s must be a positive number of seconds")
        self._box = box
        self._session_id = session_id
        self._keys = keys
        self._live = live
        self._vouch = vouch
        self._newest = newest
        self._states = states
        self.poll_s = poll_s
        self._lock = trio.Lock()
        #: Records a suspended turn took, by id: answered once the turn, taken up again, journals them.
        self._deferred: dict[int, TakenDecision] = {}
        #: Every record answered by this process, in order (for the app and its tests).
        self.taken: list[TakenDecision] = []

    def review_open(self) -> bool:
        """Whether a turn waits for a person (running in review, or suspended with a card waiting)."""
        live = self._live()
        return live is not None and any(call.status is CallStatus.PENDING for call in live[1].current_calls)

    async def listen(self) -> None:
        """Forever (a task of the session's nursery): while a review is open, take the box's decisions every
        `poll_s` (a store that announces them, PostgreSQL, wakes it at once and is asked every `_NOTIFIED_POLL_S`
        besides); otherwise look again each `poll_s` without I/O."""
        arm = getattr(self._box, "arm_decisions", None)
        while True:
            if self._deferred:
                await self.settle_deferred()
            if not self.review_open():
                await trio.sleep(self.poll_s)
                continue
            armed = None if arm is None else arm(self._session_id)  # before reading: no notice falls between
            await self.take()
            if armed is not None:
                with trio.move_on_after(_NOTIFIED_POLL_S):  # the notice, or a look anyway (a notice can be lost)
                    await armed.wait()
            else:
                await trio.sleep(self.poll_s)

    async def take(self) -> list[TakenDecision]:
        """Judge and apply the box's waiting records for this session, in the order they were posted.

        A suspended turn takes a decision into its queue (it applies when the turn goes on), but the record stays
        ``waiting`` in the box until the turn's journal holds the decision (`settle_deferred`): a process that takes
        decisions and exits without continuing the turn loses nothing, and the next one takes them again."""
        async with self._lock:
            await self._settle()
            records = await self._box.decisions(self._session_id, waiting_only=True)
            taken = []
            for record in records:
                if record.id in self._deferred:
                    continue  # taken by the suspended turn already
                outcome = await self._judge(record)
                if outcome.applied and outcome.deferred:
                    self._deferred[record.id] = outcome
                else:
                    await self._answer(record.id, outcome.applied, outcome.note)
                self.taken.append(outcome)
                taken.append(outcome)
            return taken

    async def _answer(self, record_id: int, applied: bool, note: str) -> None:
        # Once judged, the answer is written even if the session is closing (bounded: a store that stops answering
        # holds nothing past it; an unanswered record is judged again, the same way, later).
        with trio.CancelScope(shield=True), trio.move_on_after(_ANSWER_S):
            await self._box.answer_decision(record_id, "applied" if applied else "refused", note)

    async def settle_deferred(self) -> None:
        """Answer the records a suspended turn took once the turn, taken up again, shows them decided (its journal
        holds them by then: a decision is journaled before anything it allows starts). Shielded and bounded: a
        session closing, cancelled, still answers (or leaves the records waiting, to be judged again)."""
        with trio.CancelScope(shield=True), trio.move_on_after(_ANSWER_S):
            async with self._lock:
                await self._settle()

    async def _settle(self) -> None:
        if not self._deferred:  # (the newest state is not read: a reopened session's is made when first read)
            return
        live, state = self._live(), self._newest()
        if state is None or (live is not None and live[2]):  # none, or still suspended
            return
        for record_id, outcome in list(self._deferred.items()):
            decision = outcome.decision
            if decision is not None and _taken_already(decision, state):
                del self._deferred[record_id]
                await self._answer(record_id, True, outcome.note.replace(_WAITING_NOTE, "applied"))

    async def _judge(self, record: PostedDecision) -> TakenDecision:
        live = self._live()
        judged = judge_record(
            record.data, session_id=self._session_id, keys=self._keys(), state=None if live is None else live[1]
        )
        if judged.decision is not None and judged.decision.slot != record.slot:
            return TakenDecision(record.id, False, "the decision was made for another session or card", judged.decision)
        decision = judged.decision
        if judged.item is None or live is None or decision is None:
            return TakenDecision(record.id, judged.applied, judged.note, decision)
        controls, _, suspended = live
        refusal = await hand_over(judged, controls, suspended, vouch=self._vouch, states=self._states)
        if refusal:
            return TakenDecision(record.id, False, refusal, decision)
        how = "applied" if not suspended else _WAITING_NOTE
        note = f"{decision.describe()}: {how} (key {judged.key_id})"
        return TakenDecision(record.id, True, note, decision, suspended)


@attrs.frozen
class Judged:
    """What a signed decision record proves against a turn's state (`judge_record`): a refusal (``applied`` False,
    the reason in ``note``), the very decision the turn shows taken already (``applied``, no ``item``), or the
    turn's input it proves (``item``: hand it over with `hand_over`)."""

    applied: bool
    note: str
    decision: ReviewDecision | None = None
    key_id: str = ""
    item: ApproveCall | DenyCall | None = None
    #: The signed record as JSON values: what the decision's journal entry keeps, for the audit.
    record: dict[str, Any] | None = None


def judge_record(raw: bytes, *, session_id: str, keys: JournalKeys | None, state: TurnState | None) -> Judged:
    """Prove the decision record ``raw`` against ``state`` (the live turn's, or None when no turn is live): signed
    by one of ``keys``, for ``session_id``, the turn waiting, a card still waiting with that very digest, no rule
    that approves a destructive call, an edit the tool accepts. Pure: nothing is applied."""
    try:
        decision, key_id = open_decision(raw, keys)
    except DecisionError as exc:
        return Judged(False, str(exc))
    if decision.session_id != session_id:
        return Judged(False, "the decision was made for another session or card", decision)
    if state is None:
        return Judged(False, "no turn of this session waits for a decision", decision)
    if _taken_already(decision, state):  # its answer was cut short, or the same document came again
        return Judged(True, f"{decision.describe()}: applied (key {key_id})", decision, key_id)
    refusal = _refusal(decision, state)
    if refusal:
        return Judged(False, refusal, decision)
    return Judged(True, "", decision, key_id, _item(decision), json.loads(raw))


def _item(decision: ReviewDecision) -> ApproveCall | DenyCall:
    if decision.action == "approve":
        return ApproveCall(
            call_id=decision.call_id,
            edited_input=decision.edited_input,
            always=decision.always,
            seen_digest=decision.digest,
            reviewer=decision.reviewer,
        )
    return DenyCall(
        call_id=decision.call_id,
        reason=decision.reason,
        always=decision.always,
        seen_digest=decision.digest,
        reviewer=decision.reviewer,
    )


async def hand_over(
    judged: Judged,
    controls: TurnControls,
    suspended: bool,
    *,
    vouch: Callable[[str, dict[str, Any]], None],
    states: Callable[[], AsyncIterator[TurnState]],
) -> str:
    """Give the proven decision to the turn as its reviewer's click, its journal entry keeping the signed record:
    "" once a running turn took it (or a suspended one queued it, to apply when it goes on), else why not."""
    decision, item, record = judged.decision, judged.item, judged.record
    assert decision is not None and item is not None and record is not None, "hand over a proven decision only"
    vouch(decision.call_id, record)
    if not controls.decide(item):
        return "the turn ended before the decision reached it"
    if suspended:
        return ""
    refusal = "the session closed before the turn took the decision"
    with trio.CancelScope(shield=True):  # bounded by _SEEN_S
        refusal = await _seen(decision, states)
    return refusal


async def _seen(decision: ReviewDecision, states: Callable[[], AsyncIterator[TurnState]]) -> str:
    """Wait (bounded) for the running turn to take the decision: "" when it did, else why not."""
    with trio.move_on_after(_SEEN_S):
        async for state in states():  # the newest state each time it changes
            verdict = _taken_in(decision, state)
            if verdict is not None:
                return verdict
    return "the turn did not take the decision in time"


def _taken_in(decision: ReviewDecision, state: TurnState) -> str | None:
    """What ``state`` says of a decision handed to the running turn: "" taken, the reason it was not, or None (the
    card still waits: the turn has not come to it yet)."""
    call = state.call(decision.call_id)
    if call is None or state.turn_id != decision.turn_id:
        return "the turn it was made for is over"
    if call.status is not CallStatus.PENDING:
        decider = call.decided_by
        if decider is not None and decider.reviewer == decision.reviewer:
            return ""
        return f"the card was decided first: {'someone else' if decider is None else decider.describe()}"
    if state.is_settled or state.phase is not Phase.AWAITING_APPROVAL:
        return "the turn stopped waiting for this card"
    return None


def _taken_already(decision: ReviewDecision, state: TurnState) -> bool:
    """Whether the turn shows this very decision taken: the card decided by its reviewer, the same way."""
    call = state.call(decision.call_id)
    decider = None if call is None else call.decided_by
    if decider is None or state.turn_id != decision.turn_id or decider.reviewer != decision.reviewer:
        return False
    return (decider.verdict is Verdict.ALLOW) == (decision.action == "approve")


def _refusal(decision: ReviewDecision, state: TurnState) -> str:
    """Why ``decision`` cannot decide anything in ``state`` ("" when it can)."""
    if state.turn_id != decision.turn_id:
        return "the turn it was made for is over"
    call = state.call(decision.call_id)
    if call is None:
        return "the turn has no such card"
    if call.status is not CallStatus.PENDING:
        who = "" if call.decided_by is None else f": {call.decided_by.describe()}"
        return f"the card was already decided{who}"
    if call.input_digest != decision.digest:
        return "the card's input changed since the page showed it: nothing was decided"
    if decision.always is not None and decision.action == "approve" and call.destructive:
        return "a rule never approves a destructive call: approve it without 'always'"
    if decision.edited_input is not None:
        tool = state.tool_set.get(call.tool_name)
        if tool is None:
            return "the card's tool is not offered any more"
        prepared = tool.prepare(decision.edited_input)
        if isinstance(prepared, PrepareFailure):
            return invalid_edit_text(call.tool_name, prepared)
    return ""
