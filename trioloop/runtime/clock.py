"""The turn's time: a deadline that measures the machine, not the person.

The turn's cancel scope carries the deadline (Stop cancels the same scope). While the turn waits for the person
(a review, or a running call's open question) the deadline stands still: the scope's deadline is then the review
timeout (none unless ``review_timeout_ms``), running tools' scopes have none (a review timeout ends the turn,
which then cancels its tools, never a tool on its own), and when the wait ends the deadline moves forward by the
time waited. The last `LEAD_S` before the deadline belong to the `DeadlineSharpener`, which wakes the loop on
time; the request nursery's deadline, just after the turn's, is the backstop for a request being torn down.
"""

from __future__ import annotations

import math

import trio

from trioloop.machine.limits import Bound, TurnBudget, TurnLimits, timing_exhaustion
from trioloop.runtime.scopes import TurnScopes
from trioloop.runtime.sharpener import LEAD_S, DeadlineSharpener

__all__ = ["REQUEST_DEADLINE_GRACE_S", "TurnClock", "ms", "now_ms"]

#: A request task runs outside the turn's scope and is cancelled by the consumer once the turn settles;
#: its nursery's deadline, this much after the turn's, is the backstop (and what the provider sees as
#: the effective deadline).
REQUEST_DEADLINE_GRACE_S = 0.25


def now_ms() -> int:
    """Trio's clock in whole milliseconds (what the runner's commands carry)."""
    return int(trio.current_time() * 1000)


def ms(seconds: float) -> int:
    """A duration in whole milliseconds; the epsilon keeps 2.0 s from reading as 1999 ms after float error."""
    return math.floor(seconds * 1000 + 1e-6)


class TurnClock:
    """The deadline of one turn, where it is enforced (the turn's scope, the tools' scopes, the sharpener, the
    request nursery's backstop), and the time spent waiting for the person, which never counts against it."""

    def __init__(self, scopes: TurnScopes, started_at: float, deadline_ms: int) -> None:
        self.scopes = scopes
        self.started_at = started_at
        self.deadline = started_at + deadline_ms / 1000
        self.paused_s = 0.0  # time spent waiting for the person: the turn deadline does not run then
        self.waiting_since: float | None = None
        self.waiting = False  # in review, or a running call's question is open: the deadline stands
        self.scope_deadline = self.deadline  # the deadline the turn's scope and the tools' scopes have now
        # A review taken up from a journal had already waited this long in an earlier process: it counts
        # against the review timeout, never against the turn deadline (it was never machine time).
        self.credit_s = 0.0
        self.sharpener = DeadlineSharpener(self.deadline)  # wakes the loop on time for the scope's deadline
        self.approach: trio.CancelScope | None = None  # fires LEAD_S before the deadline: start the sharpener
        self.backstop: trio.CancelScope | None = None  # the request nursery's scope, outside the turn's

    def restart(self, started_at: float, deadline_ms: int) -> None:
        """Count the deadline from ``started_at`` (a resumed turn: now minus the machine time it had spent)."""
        self.started_at = started_at
        self.deadline = started_at + deadline_ms / 1000
        self.sharpener.move(self.deadline)

    def wait_for_person(self, waiting: bool, review_timeout_ms: int | None) -> None:
        """Hold the deadline still while the turn waits for the person, or let it run again once the wait ends,
        moved forward by the time waited. While waiting, the turn scope's deadline is the review timeout."""
        now = trio.current_time()
        self.waiting = waiting
        if waiting:
            self.waiting_since = now
            self.set_deadline(math.inf if review_timeout_ms is None else now + review_timeout_ms / 1000)
            return
        self.credit_s = 0.0  # the next review (if any) starts from nothing
        if self.waiting_since is not None:
            waited = now - self.waiting_since
            self.waiting_since = None
            self.paused_s += waited
            self.deadline += waited
        self.set_deadline(self.deadline)

    def take_up_review(self, waited_ms: int, review_timeout_ms: int | None) -> None:
        """A review taken up from a journal: waiting for the person already, ``waited_ms`` of its timeout spent."""
        self.wait_for_person(True, review_timeout_ms)
        assert self.waiting_since is not None
        self.credit_s = waited_ms / 1000
        if review_timeout_ms is not None:
            self.set_deadline(self.waiting_since - self.credit_s + review_timeout_ms / 1000)

    def set_deadline(self, deadline: float) -> None:
        """The turn scope's deadline, and the request nursery's backstop just after it. Each running tool's
        scope has the turn deadline too, or none while the turn waits for the person: a review timeout ends
        the turn (which then cancels its tools), never a tool on its own."""
        self.scope_deadline = math.inf if self.waiting else deadline
        scope = self.scopes.turn
        if scope is not None:
            scope.deadline = deadline
        for work_scope in self.scopes.work:
            work_scope.deadline = self.scope_deadline
        if self.approach is not None:
            self.approach.deadline = deadline - LEAD_S
        self.sharpener.move(deadline)
        if self.backstop is not None:
            self.backstop.deadline = deadline + REQUEST_DEADLINE_GRACE_S

    def machine_ms(self) -> int:
        """Trio's clock since the turn started, minus every wait for the person."""
        now = trio.current_time()
        waiting = 0.0 if self.waiting_since is None else now - self.waiting_since
        return ms(now - self.started_at - self.paused_s - waiting)

    def review_waited_ms(self) -> int | None:
        """How long the current wait for the person has lasted (a journaled review's earlier wait included), or
        None when the turn is not waiting."""
        since = self.waiting_since
        return None if since is None else ms(trio.current_time() - since + self.credit_s)

    def timing_bound(self, budget: TurnBudget, limits: TurnLimits) -> Bound | None:
        """Whether the deadline or the review timeout has run out (checked in `budget_exhaustion`'s order)."""
        machine_now = budget.started_at_ms + self.machine_ms()
        return timing_exhaustion(budget, limits, machine_now, review_waited_ms=self.review_waited_ms())
