"""The soak's sessions: each one a conversation journaled in a store, a simulated person, and a watch on its turns.

`run_slot` keeps one conversation going after another until the soak's end: a conversation opens a journaled
`Session` (`Session.open`), runs a number of turns and retires (its journal reopened and its document compared
with the live one). Its `Person` reads every published state and acts as a person at a review panel would:
after a moment of reading, approve, approve an edit, deny (with a reason), Stop, suspend (the session is then
closed, reopened from its journal, the remaining cards decided and the turn continued with `continue_turn`),
walk away (the review timeout ends the turn), answer a tool's question, or click on a card or a question that is
gone (a late click, which must change nothing). Now and then it clicks Stop while the model streams or a tool
runs. A journal that fails (the database behind the proxy reset, say) makes the session refuse new turns: the
conversation reopens it from the store and goes on, as an app would.

Every fact the soak checks goes through the `Ledger`: the person's approvals in time (the card was pending in the
newest state when it was clicked), late clicks, each call observed succeeded, each turn's legs with their times,
and each retired conversation's document as its journal gives it back.

**Times.** A `Leg` is one ``send`` or one ``continue_turn``. Its start is taken just before the call (no later
than the runner's clock starts), its settle when the `Watch` (an observer, told synchronously of each published
state) sees the settled state. The time the turn waited for the person (cards shown, a question open) does not
count against the deadline; the soak measures it from the publication that opened the wait (no earlier than the
runner paused its deadline) to the click that ended it (no later than the runner resumed it), so it is never
overestimated and the overshoot ``settle - start - waited - budget`` never underestimated. The runner pauses its
deadline as the turn enters review, before it journals the cards it then shows: those writes (`Leg.review_lag`) stay
in the overshoot, and a late leg counts them with its journal writes (the store's time, not trioloop's). A
continued leg's budget is the deadline less the machine time its earlier legs used (measured the same way, so never
more than the runner's remaining time), and it carries their review lag, which that budget was charged with. A leg
continued after a crash (the process that ran the first part was killed) gets the whole deadline as its budget, which
the runner's remaining time can only be below: its figure is a lower bound and is reported apart.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final

import attrs
import trio

from benchmarks._soak_causes import OVERSHOOT_BOUND_MS, where_tasks
from benchmarks._soak_person import Person
from benchmarks._soak_tools import NOTE, SESSION, START_DOCUMENT, Ledger
from trioloop import (
    CallStatus,
    JournalStoreError,
    Phase,
    Session,
    SessionJournalError,
    SessionLocked,
    TurnLimits,
    TurnState,
)
from trioloop.durable.journal import JournalError
from trioloop.machine.limits import Bound, bound_notice
from trioloop.machine.tools import RegisteredTool
from trioloop.protocol.provider import ChatProvider

__all__ = ["Leg", "Person", "SlotPlan", "SoakContext", "Watch", "run_slot"]

_BOUND_BY_NOTICE: Final = {bound_notice(bound): bound.value for bound in Bound}
#: Errors a (re)open may meet while the database's edge is faulted: the soak waits and tries again.
_REOPEN_ERRORS: Final = (JournalStoreError, SessionLocked, OSError)
REOPEN_ATTEMPTS: Final = 40


@attrs.define
class SoakContext:
    """What every conversation of one process shares."""

    provider: ChatProvider
    model: str
    limits: TurnLimits
    ledger: Ledger
    seed: int
    end_at: float  # time.time() after which no new turn starts
    open_options: dict[str, Any] = attrs.field(factory=dict)  # signer, keys, witness
    tools: Sequence[RegisteredTool[str]] = ()  # made once for the process (`make_tools`)
    append_times: Any = None  # `benchmarks._soak_wiring.AppendTimes`
    causes: Any = None  # `benchmarks._soak_causes.Causes`: what a late leg waited for
    turns: tuple[int, int] = (5, 20)
    idle_s: tuple[float, float] = (0.05, 0.5)
    stop_chance: float = 0.06
    live_turns: int = 0  # turns started, in this process

    def ending(self) -> bool:
        return time.time() >= self.end_at


@attrs.define
class SlotPlan:
    """Where one slot's conversations are journaled."""

    slot: str
    store: Any
    store_name: str
    lease_wait_s: float = 15.0
    #: For a slot whose conversations also get an MCP server's tools: the toolset for a session id.
    toolset: Callable[[str], Any] | None = None


@attrs.define
class Leg:
    """One ``send`` or ``continue_turn`` of a turn, and its times (trio clock, seconds).

    Two accounts of the time the turn waited for the person. ``person``: from the state that showed the cards
    (or the question) to the click that decided the last of them. ``runner``: to the state that left the
    review, which is when the runner lets its deadline run again; the difference is what the runner does
    between the click and leaving the review, journaling the decisions first of all. ``budget`` is the machine
    time the leg may use in each account (the deadline, less what earlier legs of the turn used).
    """

    kind: str  # "send", "continue" (after a suspend in this process) or "after_crash"
    turn: str
    start: float
    budget: tuple[float, float]  # (person, runner)
    waited: list[float] = attrs.field(factory=lambda: [0.0, 0.0])  # (person, runner)
    wait_since: float | None = None  # cards shown (the observer saw it) and not yet all decided
    questions: set[str] = attrs.field(factory=set)  # questions open (seen, not yet answered)
    question_since: float | None = None  # since when at least one question is open
    last_click: float | None = None
    settled_at: float | None = None
    returned_at: float | None = None
    state: TurnState | None = None
    suspended: bool = False
    late_at: list[str] | None = None  # where its tasks waited when it was still unsettled past its bound
    #: Machine time the runner kept off its deadline before the person could see a review: it pauses the deadline as
    #: the turn enters review, then journals the cards, and only then shows them (where both accounts begin).
    review_lag: float = 0.0

    def carry(self, at: float, turn: str) -> Leg:
        """The leg that continues this one's turn, suspended at ``at`` (the review's publication): its budget less
        the machine time used until then, which holds the cards' journal writes the runner kept off its deadline, so
        their review lag goes with it and counts as the store's time there too."""
        used = self.machine(at)
        budget = (max(self.budget[0] - used[0], 0.0), max(self.budget[1] - used[1], 0.0))
        return Leg(kind="continue", turn=turn, start=0.0, budget=budget, review_lag=self.review_lag)

    def begin_wait(self, now: float) -> None:
        if self.wait_since is None:
            self.wait_since = now

    def end_wait(self, now: float, *, settled: bool) -> None:
        """The review ends (a state that is not in review): in the person's account it lasted until the click
        that decided the cards; with no click since it began, until ``now`` if the turn settled meanwhile (a
        review timeout: the person walked away), else not at all (a turn taken up with its cards decided)."""
        if self.wait_since is None:
            return
        click = self.last_click
        if click is not None and self.wait_since <= click <= now:
            self.waited[0] += click - self.wait_since
        elif settled:
            self.waited[0] += max(now - self.wait_since, 0.0)
        self.waited[1] += max(now - self.wait_since, 0.0)
        self.wait_since = None

    def question_opened(self, question_id: str, now: float) -> None:
        if self.settled_at is None:
            if not self.questions:
                self.question_since = now
            self.questions.add(question_id)

    def question_closed(self, question_id: str, now: float) -> None:
        if question_id in self.questions:
            self.questions.discard(question_id)
            if not self.questions and self.question_since is not None:
                waited = max(now - self.question_since, 0.0)
                self.waited[0] += waited
                self.waited[1] += waited
                self.question_since = None

    def machine(self, until: float) -> tuple[float, float]:
        """Machine time the leg used up to ``until`` in each account (its waits for the person taken out)."""
        return (until - self.start - self.waited[0], until - self.start - self.waited[1])


def _outcome(state: TurnState) -> str:
    if state.outcome is None:
        return state.phase.value
    if state.outcome.value == "bounded":
        bound = next((_BOUND_BY_NOTICE[n] for n in reversed(state.notices) if n in _BOUND_BY_NOTICE), "?")
        return f"bounded:{bound}"
    if state.outcome.value == "failed" and state.error is not None:
        return f"failed:{state.error.code.value}"
    return state.outcome.value


class Watch:
    """The session's observer: times the current leg and writes each call seen succeeded to the ledger."""

    def __init__(self, ledger: Ledger, sid: str, append_times: Any = None) -> None:
        self.ledger = ledger
        self.sid = sid
        self.append_times = append_times  # `benchmarks._soak_wiring.AppendTimes`: the cards' journal writes
        self.leg: Leg | None = None
        self.seen_at: float | None = None  # when the last state was published
        self.succeeded: set[str] = set()
        self.errors = 0

    def on_state(self, state: TurnState) -> None:
        try:
            self._see(state)
        except Exception:  # an observer that raises is dropped by the session: count it instead
            self.errors += 1

    def _see(self, state: TurnState) -> None:
        now = trio.current_time()
        leg = self.leg
        if leg is not None and leg.settled_at is None:
            if state.phase is Phase.AWAITING_APPROVAL:
                if leg.wait_since is None:
                    leg.review_lag += self._cards_written(leg, now)
                leg.begin_wait(now)
            else:
                leg.end_wait(now, settled=state.is_settled)
            if state.is_settled:
                for question_id in list(leg.questions):  # unanswered: open until the turn ended
                    leg.question_closed(question_id, now)
                leg.settled_at = now
                leg.state = state
        self.seen_at = now
        for call in state.calls:
            if call.status is CallStatus.SUCCEEDED and call.id not in self.succeeded:
                self.succeeded.add(call.id)
                self.ledger.emit("succeeded", sid=self.sid, call=call.id, tool=call.tool_name)

    def _cards_written(self, leg: Leg, now: float) -> float:
        """How long the journal writes that held back the state showing a review took: from the first one that began
        after the last state published (the runner had paused its deadline by then) to ``now``, its showing."""
        if self.append_times is None:
            return 0.0
        since = leg.start if self.seen_at is None else max(leg.start, self.seen_at)
        starts = [start for start, end in self.append_times.writes(self.sid) if start >= since and end <= now]
        return now - min(starts) if starts else 0.0


async def _open(
    ctx: SoakContext, plan: SlotPlan, sid: str, tools: Sequence[RegisteredTool[str]], *, new: bool
) -> Session[str]:
    """``Session.open``, tried again while the store's edge is faulted (bounded)."""
    for attempt in range(REOPEN_ATTEMPTS):
        try:
            return await Session.open(
                plan.store,
                sid,
                kind=NOTE,
                provider=ctx.provider,
                document=START_DOCUMENT if new else None,
                model=ctx.model,
                tools=tools,
                limits=ctx.limits,
                wait_s=plan.lease_wait_s,
                **ctx.open_options,
            )
        except _REOPEN_ERRORS as exc:
            ctx.ledger.emit("open_retry", sid=sid, error=type(exc).__name__, attempt=attempt)
            await trio.sleep(min(0.1 * 2**attempt, 2.0))
    raise RuntimeError(f"could not open session {sid} after {REOPEN_ATTEMPTS} attempts")


async def _late_watch(leg: Leg, task: trio.lowlevel.Task) -> None:
    """Past the leg's deadline and the bound with no settled state: where ``task`` (the leg's) and its children
    wait, kept with the leg (a review or a question open moves the deadline: then look again a little later)."""
    while leg.settled_at is None:
        if leg.wait_since is not None or leg.question_since is not None:
            await trio.sleep(0.25)
            continue
        at = leg.start + leg.waited[1] + leg.budget[1] + OVERSHOOT_BOUND_MS / 1e3
        if trio.current_time() < at:
            await trio.sleep_until(at)
            continue
        leg.late_at = where_tasks(task, skip=trio.lowlevel.current_task())
        return


def _emit_leg(ctx: SoakContext, sid: str, store: str, leg: Leg, error: str | None = None) -> None:
    state = leg.state
    outcome = error or ("suspended" if leg.suspended else (_outcome(state) if state is not None else "unsettled"))
    # A leg whose journal failed never shows its settled state (nothing the journal may not hold is published): it
    # ends when ``send`` raises, which is what the person sees, and it is held to the same bound.
    settle = leg.settled_at if leg.settled_at is not None or error is None else leg.returned_at
    machine = None if settle is None else leg.machine(settle)
    # From the moment the runner's deadline fell due (its own account) to the settle: how much of it the session's
    # journal writes covered (the runner awaits a write it has begun before it goes on).
    due = leg.start + leg.waited[1] + leg.budget[1]
    journal_late = 0.0
    causes: dict[str, Any] = {}
    if settle is not None and settle > due:
        if ctx.append_times is not None:
            journal_late = ctx.append_times.busy(sid, due, settle) + leg.review_lag
        if ctx.causes is not None:
            causes = ctx.causes.explain(sid, due, settle)
            if causes:
                # The runner's deadline fell due later than ``due`` by the cards' journal writes: the machine's time.
                causes["journal_ms"] = round(causes["journal_ms"] + leg.review_lag * 1e3, 3)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1e3, 3)

    ctx.ledger.emit(
        "leg",
        sid=sid,
        store=store,
        kind=leg.kind,
        turn=leg.turn,
        outcome=outcome,
        budget_ms=ms(leg.budget[1]),
        waited_ms=ms(leg.waited[1]),
        machine_ms=None if machine is None else ms(machine[1]),
        overshoot_ms=None if machine is None else ms(machine[1] - leg.budget[1]),
        person_waited_ms=ms(leg.waited[0]),
        person_overshoot_ms=None if machine is None else ms(machine[0] - leg.budget[0]),
        settle_ms=None if settle is None else ms(settle - leg.start),
        unwind_ms=None if settle is None or leg.returned_at is None else ms(leg.returned_at - settle),
        journal_late_ms=ms(journal_late),
        review_lag_ms=ms(leg.review_lag),
        **causes,
        **({"late_at": leg.late_at} if leg.late_at is not None else {}),
    )


class Conversation:
    """One session id from its first turn to its retirement, through any number of reopenings."""

    def __init__(self, ctx: SoakContext, plan: SlotPlan, sid: str, rng: random.Random, turns: int) -> None:
        self.ctx = ctx
        self.plan = plan
        self.sid = sid
        self.rng = rng
        self.turns_left = turns
        self.turn_number = 0
        self.live_document: str | None = None
        self.carried: Leg | None = None  # a suspended leg whose turn the next opening continues
        self.tools: list[RegisteredTool[str]] = list(ctx.tools)

    async def run(self, *, new: bool) -> None:
        SESSION.set(self.sid)  # what this task's tools (its children) write their runs under
        if self.plan.toolset is None:
            await self._run(new=new)
            return
        async with trio.open_nursery() as nursery:  # the MCP server's connection lives as long as the conversation
            toolset = self.plan.toolset(self.sid)
            for attempt in range(5):
                try:
                    self.tools += await nursery.start(toolset.run)
                    break
                except Exception as exc:  # a server killed while it started: a new toolset, a new process
                    self.ctx.ledger.emit("mcp_connect_retry", sid=self.sid, error=type(exc).__name__, attempt=attempt)
                    toolset = self.plan.toolset(self.sid)
            else:
                self.ctx.ledger.emit("mcp_unavailable", sid=self.sid)
            await self._run(new=new)
            nursery.cancel_scope.cancel()

    async def _run(self, *, new: bool) -> None:
        session = await _open(self.ctx, self.plan, self.sid, self.tools, new=new)
        self.ctx.ledger.emit("conversation", sid=self.sid, slot=self.plan.slot, store=self.plan.store_name, new=new)
        while True:
            again = await self._life(session)
            if not again:
                break
            self.ctx.ledger.emit("reopen", sid=self.sid, store=self.plan.store_name)
            session = await _open(self.ctx, self.plan, self.sid, self.tools, new=False)
        await self.retire()

    async def _life(self, session: Session[str]) -> bool:
        """Turns on one opened session; True when the conversation must reopen its journal to go on."""
        watch = Watch(self.ctx.ledger, self.sid, self.ctx.append_times)
        session.observe(watch)
        async with session, trio.open_nursery() as nursery:
            person = Person(self.rng, self.sid, self.ctx.ledger, watch, session)
            nursery.start_soon(person.run)
            try:
                again = await self._turns(session, watch, person)
            except SessionJournalError:
                self.ctx.ledger.emit("journal_error", sid=self.sid, store=self.plan.store_name)
                again = True
            if person.suspending:
                with trio.move_on_after(30):
                    await person.suspended.wait()  # its journal flush, before the session closes
            nursery.cancel_scope.cancel()
        if watch.errors:
            self.ctx.ledger.emit("observer_error", sid=self.sid, count=watch.errors)
        return again

    async def _turns(self, session: Session[str], watch: Watch, person: Person) -> bool:
        if session.suspended and not await self._continue(session, watch, person):
            return True
        while self.turns_left > 0 and not self.ctx.ending():
            await trio.sleep(self.rng.uniform(*self.ctx.idle_s))
            self.turns_left -= 1
            self.turn_number += 1
            self.ctx.live_turns += 1
            nonce = f"{self.rng.getrandbits(40):010x}"
            deadline = self.ctx.limits.turn_deadline_ms / 1e3
            leg = Leg(kind="send", turn=nonce, start=trio.current_time(), budget=(deadline, deadline))
            if not await self._leg(session, watch, person, leg, partial(session.send, f"[soak nonce={nonce}] tidy")):
                return True
        return False

    async def _continue(self, session: Session[str], watch: Watch, person: Person) -> bool:
        state = session.state
        carried, self.carried = self.carried, None
        now = trio.current_time()
        if carried is not None and state is not None and carried.turn == state.turn_id:
            leg = attrs.evolve(carried, start=now)
        else:  # cut by a crash (or a failed journal): the runner's remaining time is at most the deadline
            deadline = self.ctx.limits.turn_deadline_ms / 1e3
            leg = Leg(kind="after_crash", turn="?", start=now, budget=(deadline, deadline))
        if state is not None:
            person.decide(state)  # the cards still pending: decided before the turn is taken up
        return await self._leg(session, watch, person, leg, session.continue_turn)

    async def _leg(
        self, session: Session[str], watch: Watch, person: Person, leg: Leg, call: Callable[[], Any]
    ) -> bool:
        """Run one leg; False when the session must be reopened (suspended, or its journal failed)."""
        watch.leg = leg
        error: str | None = None
        async with trio.open_nursery() as timers:
            if self.rng.random() < self.ctx.stop_chance:
                timers.start_soon(self._stop_later, session, watch, leg)
            timers.start_soon(_late_watch, leg, trio.lowlevel.current_task())
            try:
                state = await call()
            except SessionJournalError:
                error = "journal_error"
                state = None
            leg.returned_at = trio.current_time()
            timers.cancel_scope.cancel()
        if state is not None and not state.is_settled and session.suspended:
            leg.suspended = True
            self.carried = leg.carry(leg.wait_since if leg.wait_since is not None else leg.returned_at, state.turn_id)
        if state is not None and state.is_settled:
            self.live_document = session.document
        elif error is not None:
            # The journal failed: the live document went back to what it last confirmed, while an append cut short
            # may have landed (reopening reads the truth). Nothing live to compare until a turn settles again.
            self.live_document = None
        watch.leg = None
        _emit_leg(self.ctx, self.sid, self.plan.store_name, leg, error)
        if error is not None:
            raise SessionJournalError(error)
        return not leg.suspended

    async def _stop_later(self, session: Session[str], watch: Watch, leg: Leg) -> None:
        await trio.sleep(self.rng.uniform(0.0, self.ctx.limits.turn_deadline_ms / 1e3))
        state = session.state
        # Stop in review is the person's own roll; this is a Stop while the model streams or a tool runs.
        if (
            watch.leg is leg
            and leg.settled_at is None
            and state is not None
            and state.phase is not Phase.AWAITING_APPROVAL
        ):
            leg.last_click = trio.current_time()
            self.ctx.ledger.emit("click", sid=self.sid, what="stop_while_running" if session.stop() else "stop_late")

    async def retire(self) -> None:
        """Reopen the journal once more and write the document it gives back (the lost-commit check's input)."""
        try:
            check = await _open(self.ctx, self.plan, self.sid, self.tools, new=False)
        except (RuntimeError, JournalError) as exc:
            self.ctx.ledger.emit("retire_failed", sid=self.sid, error=f"{type(exc).__name__}: {exc}")
            return
        finally:
            if self.ctx.append_times is not None:
                self.ctx.append_times.forget(self.sid)  # its legs are all written: their writes are of no more use
        async with check:
            document = check.document
        self.ctx.ledger.emit(
            "final_doc",
            sid=self.sid,
            store=self.plan.store_name,
            document=document,
            live_equal=None if self.live_document is None else document == self.live_document,
        )


async def run_slot(ctx: SoakContext, plan: SlotPlan, resume: str | None = None) -> None:
    """Conversations one after another until the soak's end (``resume``: a session id to take up first)."""
    rng = random.Random(f"{ctx.seed}/{plan.slot}/{time.time_ns()}")
    generation = 0
    if resume is not None:
        conversation = Conversation(ctx, plan, resume, rng, rng.randint(*ctx.turns))
        await conversation.run(new=False)
    while not ctx.ending():
        generation += 1
        sid = f"{plan.slot}-{rng.getrandbits(32):08x}"
        conversation = Conversation(ctx, plan, sid, rng, rng.randint(*ctx.turns))
        await conversation.run(new=True)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (an observed value); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
