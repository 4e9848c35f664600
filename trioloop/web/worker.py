"""The fleet's worker (`trioloop worker`): processes that carry approved turns on, so no app has to stay up for them.

A reviewer's decision lands in the store's decision box; the process that holds the session applies it itself. A
session nobody holds (its app suspended it in review and exited, or died) is what a worker takes up. `run_worker`
asks the box which sessions have waiting decisions (one indexed query every ``poll_s``) and, for each one it does
not carry yet, opens it under its lease with no wait (held elsewhere: that holder applies its decisions itself),
takes the decisions, and carries the turn on: the approved calls run, the model is asked again, and the turn either
settles or waits in review again, where the worker takes decisions once more and, with a card still waiting,
suspends it and lets it go. Every ``scan_s`` it also looks for orphans: journals whose turn was in flight when its
holder died (a call it was running is settled failed on reopening, never run twice) and takes them up the same way.

Nothing runs twice because nothing here bypasses the session: one lease per session (fenced, with a time to live),
the journal's numbered appends, and the decisions proven by the session against its own state. A session whose
waiting card has no decision yet is let go without taking any: a decision taken by a suspended turn lives in the
process that took it until the turn goes on, so the worker takes decisions only when it will carry the turn on.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, Protocol, final, runtime_checkable

import attrs
import trio

from trioloop.durable.decision_box import DecisionBox
from trioloop.durable.decisions import decision_slot
from trioloop.durable.journal import decode_entries
from trioloop.durable.signing import given_public_keys
from trioloop.durable.store import JournalStore, SessionLocked
from trioloop.machine.calls import CallStatus
from trioloop.machine.state import Phase, TurnState
from trioloop.runtime.session import Session
from trioloop.web._heap import freeze_startup_heap
from trioloop.web.worker_app import AppLoadError, WorkerApp, load_app

__all__ = [
    "WorkerEvent",
    "add_worker_arguments",
    "run_worker",
    "worker_main",
]

log = logging.getLogger("trioloop.worker")

#: What became of one session a worker looked at (see `WorkerEvent`).
EventKind = Literal["carrying", "locked", "waiting", "idle", "suspended", "settled", "error", "stopped"]

#: How long one query of the worker's own (the box, the heads, a journal read) may take before it is given up.
_QUERY_S: Final = 30.0
#: How long making a turn durable (suspending it, releasing the lease) may take once asked.
_DURABLE_S: Final = 30.0
#: A session held elsewhere is asked about again after this long (its holder applies its decisions meanwhile).
_LOCKED_RETRY_S: Final = 0.5
#: A session whose carrying failed is tried again after this long, doubled each failure, at most `_ERROR_MAX_S`.
_ERROR_RETRY_S: Final = 2.0
_ERROR_MAX_S: Final = 60.0
#: An open session's own poll is kept quiet: the worker takes decisions itself, when it acts on them (a store that
#: announces decisions, PostgreSQL, still wakes the session's listener; it then takes them under the same lock).
_QUIET_POLL_S: Final = 1e6
#: How often a store that announces decisions (PostgreSQL) is asked anyway while nothing waits (a notice can be lost
#: with its connection).
_NOTICED_POLL_S: Final = 1.0
#: The head start a worker woken by a notice may leave another (seconds, at random up to this).
_SPREAD_S: Final = 0.015
#: Journal entries that say where the last turn stands: started or taken up (in flight, or settled without a
#: snapshot), suspended in review, or over (a snapshot follows a settled turn, or starts the journal).
_MARKERS: Final = frozenset({"submit", "resume", "suspend", "snapshot"})


@runtime_checkable
class _Heads(Protocol):
    async def heads(self) -> dict[str, int]:
        """Every session with a journal and the number of its last entry (one query)."""
        ...


@final
@attrs.frozen
class WorkerEvent:
    """What a worker did with one session: ``carrying`` (taken up, ``detail`` says why: ``decision`` or
    ``orphan``), ``locked`` (held elsewhere: skipped), ``waiting`` (a card has no decision yet: let go without
    taking any), ``idle`` (no turn to carry), ``suspended`` (carried to its next review and suspended there),
    ``settled`` (the turn ended: ``detail`` is its outcome), ``stopped`` (the worker stopped before the turn
    reached a review or settled), ``error`` (``detail`` says what; the worker goes on)."""

    session_id: str
    kind: EventKind
    detail: str = ""


def _pending(state: TurnState | None) -> tuple[str, ...]:
    if state is None:
        return ()
    return tuple(call.id for call in state.current_calls if call.status is CallStatus.PENDING)


class _Worker:
    """One worker's bookkeeping: the sessions it carries, and when it looks again at those it let go."""

    def __init__(
        self,
        store: JournalStore,
        app: WorkerApp,
        *,
        max_sessions: int,
        on_event: Callable[[WorkerEvent], None] | None,
    ) -> None:
        if not isinstance(store, DecisionBox):
            raise TypeError(f"a worker needs a store with a decision box, not {type(store).__name__}")
        self.store = store
        self.box: DecisionBox = store
        self.heads_of: _Heads | None = store if isinstance(store, _Heads) else None
        self.app = app
        self.max_sessions = max_sessions
        self.on_event = on_event
        self.carrying: set[str] = set()
        self.idle = trio.Event()
        self.idle.set()
        self.not_before: dict[str, float] = {}  # session id -> when to look at it again
        self.failures: dict[str, int] = {}
        #: Sessions let go with a card undecided: looked at again once their records change (or after a while).
        self.held_back: dict[str, float] = {}
        self.held_for = 2.0
        self.change = -1  # the decision box's last change number seen (-1: not asked yet)
        self.slots = trio.lowlevel.ParkingLot()  # woken whenever a session is let go
        self.looked: dict[str, int] = {}  # orphan scan: the head each session had when found with nothing to do
        self.heads: dict[str, int] = {}  # orphan scan: the heads of the scan before

    def emit(self, session_id: str, kind: EventKind, detail: str = "") -> None:
        event = WorkerEvent(session_id, kind, detail)
        log.log(logging.WARNING if kind == "error" else logging.INFO, "%s: %s %s", session_id, kind, detail)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event failed for %s", event)

    def free(self, session_id: str) -> bool:
        """Whether ``session_id`` may be taken up now (not carried, not waiting out a retry, a slot free)."""
        if session_id in self.carrying or len(self.carrying) >= self.max_sessions:
            return False
        return trio.current_time() >= self.not_before.get(session_id, -math.inf)

    def start(self, nursery: trio.Nursery, session_id: str, why: str) -> None:
        self.carrying.add(session_id)
        self.idle = trio.Event() if self.idle.is_set() else self.idle
        nursery.start_soon(self.carry, session_id, why, name=f"trioloop worker: {session_id}")

    # -- finding sessions ----------------------------------------------------------------------------

    def hold_back(self, session_id: str) -> None:
        self.held_back[session_id] = trio.current_time() + self.held_for

    async def decided(self) -> Sequence[str]:
        """The sessions with waiting decisions worth a look: one held back (a card of it had no decision) once a
        record of it changed, or its time held back is over."""
        with trio.fail_after(_QUERY_S):
            waiting = await self.box.sessions_with_waiting_decisions()
            latest, changed = await self.box.decision_changes(self.change if self.change >= 0 else 2**62)
        if self.change >= 0:
            for record in changed:
                self.held_back.pop(record.session_id, None)
        self.change = latest
        now = trio.current_time()
        self.held_back = {sid: until for sid, until in self.held_back.items() if until > now and sid in waiting}
        return [sid for sid in waiting if sid not in self.held_back]

    async def orphans(self, *, settled_heads: bool) -> list[str]:
        """Sessions whose journal shows a turn in flight (or cut short) and whose head is where it was one scan
        ago (nobody writes it), or at once with ``settled_heads=False``; each is judged once per head. One query
        (`turn_marks`: each journal's last turn marker, from its entries' first bytes), whatever the number of
        sessions; a store without it is read journal by journal."""
        if self.heads_of is None:
            return []
        with trio.fail_after(_QUERY_S):
            heads = dict(await self.heads_of.heads())
        before, self.heads = self.heads, heads
        candidates = [
            session_id
            for session_id, seq in heads.items()
            if self.looked.get(session_id) != seq
            and session_id not in self.carrying
            and not (settled_heads and before.get(session_id) != seq)
        ]
        marks_of = getattr(self.store, "turn_marks", None)
        marks: dict[str, tuple[int, str]] | None = None
        if marks_of is not None and candidates:
            with trio.fail_after(_QUERY_S):  # those sessions' alone: the journals that moved since the last look
                marks = await marks_of(set(candidates))
        found = []
        for session_id in candidates:
            seq = heads[session_id]
            if marks is not None:
                marker = marks.get(session_id, (0, "snapshot"))[1]
            else:
                with trio.fail_after(_QUERY_S):
                    stored = await self.store.read(session_id)
                marker = next((e.kind for e in reversed(decode_entries(stored)) if e.kind in _MARKERS), "snapshot")
            if marker in ("submit", "resume"):
                found.append(session_id)
            else:
                self.looked[session_id] = seq
        return found

    # -- carrying one session ------------------------------------------------------------------------

    async def carry(self, session_id: str, why: str) -> None:
        """Take ``session_id`` up and carry its turn as far as it goes (see the module docstring); every error is
        reported, and the session tried again later."""
        try:
            async with self.app.provider(session_id) as provider:
                try:
                    session: Session[Any] = await Session.open(
                        self.store,
                        session_id,
                        kind=self.app.kind,
                        provider=provider,
                        tools=self.app.tools,
                        model=self.app.model,
                        limits=self.app.limits,
                        rules=self.app.rules,
                        signer=self.app.signer,
                        keys=self.app.keys,
                        witness=self.app.witness,
                        wait_s=0.0,
                    )
                except SessionLocked:
                    self.not_before[session_id] = trio.current_time() + _LOCKED_RETRY_S
                    self.emit(session_id, "locked")
                    return
                self.emit(session_id, "carrying", why)
                session.decision_poll_s = _QUIET_POLL_S
                await self.take_up(session, session_id)
            self.failures.pop(session_id, None)
        except Exception as exc:
            failures = self.failures[session_id] = self.failures.get(session_id, 0) + 1
            delay = min(_ERROR_RETRY_S * 2 ** (failures - 1), _ERROR_MAX_S)
            self.not_before[session_id] = trio.current_time() + delay
            log.exception("carrying session %s failed", session_id)
            self.emit(session_id, "error", f"{type(exc).__name__}: {exc}")
        finally:
            self.carrying.discard(session_id)
            self.slots.unpark_all()
            if not self.carrying:
                self.idle.set()

    async def take_up(self, session: Session[Any], session_id: str) -> None:
        """Decide, on the opened (not yet entered) ``session``, whether its turn goes on, and carry it if so."""
        entered = False
        try:
            state = session.state
            head = self.heads.get(session_id)
            if not session.suspended or state is None:
                await session.take_decisions()  # none can apply: each is answered refused, with the reason
                if head is not None:
                    self.looked[session_id] = head
                self.emit(session_id, "idle")
                return
            pending = _pending(state)
            with trio.fail_after(_QUERY_S):
                records = await self.box.decisions(session_id, waiting_only=True)
            slots = {record.slot for record in records}
            if any(decision_slot(state.turn_id, call_id) not in slots for call_id in pending):
                self.hold_back(session_id)
                if head is not None:
                    self.looked[session_id] = head
                self.emit(session_id, "waiting", "a card has no decision yet")
                return
            taken = await session.take_decisions()
            applied = {t.decision.call_id for t in taken if t.applied and t.decision is not None}
            if pending and not applied:  # every record refused (each says why): nothing was taken
                self.hold_back(session_id)
                self.emit(session_id, "waiting", "no decision applied")
                return
            entered = True
            async with session:
                await self.go_on(session, session_id, applied)
        finally:
            if not entered:
                with trio.CancelScope(shield=True), trio.move_on_after(_DURABLE_S):
                    await session.aclose()

    async def go_on(self, session: Session[Any], session_id: str, decided: set[str]) -> None:
        """Continue the suspended turn of the entered ``session`` until it settles, or waits in review again with
        a card no decision in the box covers (then it is suspended there)."""
        assert session.state is not None
        turn_id = session.state.turn_id
        suspended = False

        async def watch() -> None:
            nonlocal suspended
            async for state in session.states():  # nothing to close when left
                if state.turn_id != turn_id or state.is_settled or state.phase is not Phase.AWAITING_APPROVAL:
                    continue
                if not set(_pending(state)) - decided:  # the decisions taken are not in the state yet
                    continue
                taken = await session.take_decisions()
                decided.update(t.decision.call_id for t in taken if t.applied and t.decision is not None)
                now = session.state
                if now is None or now.phase is not Phase.AWAITING_APPROVAL or not set(_pending(now)) - decided:
                    continue
                with trio.CancelScope(shield=True), trio.move_on_after(_DURABLE_S):
                    await session.suspend()
                suspended = True
                return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, name=f"trioloop worker: reviews of {session_id}")
            final = await session.continue_turn()
            nursery.cancel_scope.cancel()
        if final.is_settled:
            self.emit(session_id, "settled", final.outcome.value if final.outcome is not None else "")
        elif suspended or session.suspended:
            self.emit(session_id, "suspended", ", ".join(_pending(final)))


async def run_worker(
    store: JournalStore,
    app: WorkerApp,
    *,
    poll_s: float = 0.05,
    max_sessions: int = 16,
    scan_s: float = 2.0,
    grace_s: float = 30.0,
    stop: trio.Event | None = None,
    once: bool = False,
    on_event: Callable[[WorkerEvent], None] | None = None,
) -> None:
    """Carry the turns of ``store``'s sessions on as reviewers decide them (see the module docstring), until
    ``stop`` is set (then no new session is taken; each running turn reaches its next review, where it is
    suspended, or settles, for up to ``grace_s`` seconds; then the rest is cancelled). ``once``: carry what waits
    now (decided sessions and orphans), then return. ``on_event`` hears of every session looked at."""
    for name, value in (("poll_s", poll_s), ("scan_s", scan_s), ("grace_s", grace_s)):
        if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    if not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be a positive whole number, not {max_sessions!r}")
    worker = _Worker(store, app, max_sessions=max_sessions, on_event=on_event)
    worker.held_for = scan_s
    stop = stop if stop is not None else trio.Event()
    async with trio.open_nursery() as carriers:
        if once:
            await _once(worker, carriers)
        else:
            async with trio.open_nursery() as loops:
                loops.start_soon(_poll, worker, carriers, poll_s, name="trioloop worker: decisions")
                loops.start_soon(_scan, worker, carriers, scan_s, name="trioloop worker: orphans")
                await stop.wait()
                loops.cancel_scope.cancel()
        with trio.move_on_after(grace_s):
            await worker.idle.wait()
        for session_id in sorted(worker.carrying):
            worker.emit(session_id, "stopped", f"cancelled after the {grace_s:g} s grace period")
        carriers.cancel_scope.cancel()


async def _once(worker: _Worker, carriers: trio.Nursery) -> None:
    todo = [(sid, "decision") for sid in await worker.decided()]
    todo += [(sid, "orphan") for sid in await worker.orphans(settled_heads=False)]
    seen: set[str] = set()
    for session_id, why in todo:
        if session_id in seen:
            continue
        seen.add(session_id)
        while len(worker.carrying) >= worker.max_sessions:
            await worker.slots.park()  # bounded by the turns carried: each is bounded by its own deadline
        worker.start(carriers, session_id, why)
    await worker.idle.wait()


async def _poll(worker: _Worker, carriers: trio.Nursery, poll_s: float) -> None:
    """Ask the box every ``poll_s``; a store that announces decisions (PostgreSQL) is asked when one is announced
    instead (armed before asking, so none falls between), and every `_NOTICED_POLL_S` besides, while nothing it found
    waits for a slot or a retry."""
    arm = getattr(worker.box, "arm_any_decision", None)
    while True:
        armed = None if arm is None else arm()
        waiting = False
        try:
            for session_id in await worker.decided():
                if worker.free(session_id):
                    worker.start(carriers, session_id, "decision")
                else:
                    waiting = True  # carried now, a slot busy, or a retry later: asked again at the next poll
        except Exception as exc:  # a store that failed or stalled: said, and asked again next time
            log.warning("asking the decision box failed: %s: %s", type(exc).__name__, exc)
            waiting = True
        if armed is None or waiting:
            await trio.sleep(poll_s)
        else:
            with trio.move_on_after(_NOTICED_POLL_S):
                await armed.wait()
                # Every worker hears the notice at once: a random head start (a few ms) lets one open the session
                # first, and the others find it held without making a connection for it.
                await trio.sleep(random.uniform(0, _SPREAD_S))


async def _scan(worker: _Worker, carriers: trio.Nursery, scan_s: float) -> None:
    while True:
        try:
            for session_id in await worker.orphans(settled_heads=True):
                if worker.free(session_id):
                    worker.start(carriers, session_id, "orphan")
        except Exception as exc:
            log.warning("looking for orphaned turns failed: %s: %s", type(exc).__name__, exc)
        await trio.sleep(scan_s)


# -- the command ---------------------------------------------------------------------------------------


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``trioloop worker``."""
    parser.add_argument("--app", required=True, metavar="MODULE:FACTORY", help="the WorkerApp factory to run")
    parser.add_argument(
        "--store", required=True, metavar="URL", help="the journal store: a path, sqlite:///PATH or postgresql://URL"
    )
    parser.add_argument("--poll-s", type=float, default=0.05, help="how often to ask the decision box (seconds)")
    parser.add_argument("--max-sessions", type=int, default=16, help="sessions carried at once by this process")
    parser.add_argument("--scan-s", type=float, default=2.0, help="how often to look for orphaned turns (seconds)")
    parser.add_argument(
        "--grace-s", type=float, default=30.0, help="on SIGINT/SIGTERM, how long running turns may take to stop"
    )
    parser.add_argument("--keys", action="append", default=[], metavar="FILE", help="public keys to accept (a file)")
    parser.add_argument(
        "--key", "--public-key", dest="key", action="append", default=[], metavar="TEXT", help="a public key to accept"
    )
    parser.add_argument(
        "--group-commit",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="PostgreSQL: commit the carried sessions' appends together (default: on)",
    )
    parser.add_argument("--once", action="store_true", help="carry what waits now, then exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="say what happens to each session")


def worker_main(args: argparse.Namespace) -> int:
    """``trioloop worker``: 0 after a graceful stop (or ``--once``), 2 for a bad app or option."""
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        app = load_app(args.app).with_keys(given_public_keys(args.key, args.keys))
        from trioloop.stores import open_store

        # A connection per carried session, reused; their appends committed together (PostgreSQL).
        store = open_store(args.store, reuse_connections=2, group_commit=args.group_commit)
    except (AppLoadError, ValueError, OSError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    freeze_startup_heap()  # the modules and the app, loaded: out of the full collections' walk
    options = {
        "poll_s": args.poll_s,
        "max_sessions": args.max_sessions,
        "scan_s": args.scan_s,
        "grace_s": args.grace_s,
        "once": args.once,
    }

    async def main() -> None:
        stop = trio.Event()
        async with store, trio.open_nursery() as nursery:

            async def signals() -> None:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
                    async for _ in received:
                        if stop.is_set():  # a second signal: no grace
                            nursery.cancel_scope.cancel()
                        stop.set()

            nursery.start_soon(signals)
            await run_worker(store, app, stop=stop, **options)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # python -m trioloop.web.worker --app module:factory --store URL
    parser = argparse.ArgumentParser(prog="trioloop worker", description=__doc__.split("\n\n")[0] if __doc__ else "")
    add_worker_arguments(parser)
    sys.exit(worker_main(parser.parse_args()))
