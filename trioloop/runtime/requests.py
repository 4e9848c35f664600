"""The turn's requests to its provider: each a child task of the request nursery (outside the turn's scope, so
Stop and the deadline reach the consumer first), writing into the turn's inbox through an `InboxChannel` that
tags every event with its attempt, and retried (bounded, with backoff) only before the first event reached the
reducer, so a retry can never repeat output. With a `FallbackProvider`, a retry goes to the next provider of its
list at once (a hop), counted in the same budget; a failure after the first event is never taken elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import attrs
import trio

from trioloop.machine.inputs import Retry
from trioloop.machine.limits import timing_exhaustion
from trioloop.machine.state import Phase
from trioloop.protocol.events import StreamError, StreamEvent, is_terminal, terminal_cut
from trioloop.protocol.provider import ChatProvider
from trioloop.protocol.tools import ChatRequest, ToolDefinition
from trioloop.providers.base import is_retriable
from trioloop.providers.fallback import FallbackProvider, FallbackRoute, all_failed, may_hop
from trioloop.runtime.clock import TurnClock, now_ms
from trioloop.runtime.inbox import InboxItem, RequestEnded, StreamBatch, StreamItem, TurnView
from trioloop.runtime.spending import before_request
from trioloop.runtime.workspace import TurnRequest

__all__ = ["BATCHES_PER_YIELD", "InboxChannel", "ProviderRequests"]

#: Turn-level retry backoff: 0.5 s doubling, capped at 10 s; the only retries of a turn's requests (each
#: request asks its provider for one attempt), lengthened by a server's retry-after up to 10 minutes.
_RETRY_BASE_S = 0.5
_RETRY_CAP_S = 10.0
_RETRY_AFTER_CEILING_S = 600.0

#: A provider that never waits between batches (a whole body already buffered) still yields this often, so
#: the consumer (and every other task, a GUI's included) runs while a long answer is being parsed.
BATCHES_PER_YIELD: Final = 16


class InboxChannel(trio.abc.SendChannel[StreamEvent]):
    """What the provider writes into: tags events with the request attempt and notes a terminal one."""

    def __init__(self, inbox: trio.MemorySendChannel[InboxItem], attempt: int) -> None:
        self._inbox = inbox
        self._attempt = attempt
        self._unyielded = 0  # batches delivered since this channel last yielded to the scheduler
        self.terminal_sent = False

    async def send(self, value: StreamEvent) -> None:
        if self.terminal_sent:
            await trio.lowlevel.checkpoint()
            return  # nothing after a terminal event counts
        if is_terminal(value):
            self.terminal_sent = True
        await self._inbox.send(StreamItem(self._attempt, value))

    def send_nowait(self, value: StreamEvent) -> None:
        if self.terminal_sent:
            return
        if is_terminal(value):
            self.terminal_sent = True
        self._inbox.send_nowait(StreamItem(self._attempt, value))

    async def send_batch(self, events: Sequence[StreamEvent]) -> None:
        """Like ``send`` for each event in turn: seen cancelled before any is delivered, or not at all.

        A cancel point, and a schedule point only every ``BATCHES_PER_YIELD`` batches: the provider's
        next network read is the schedule point otherwise, so the batches of the HTTP chunks one socket
        read brought (a fast stream) reach the consumer in one wake-up, and the reducer in one step. A
        batch that ends the stream never yields after it is delivered: nothing the provider sends later
        counts, so the request ends (and its end reaches the inbox) in the same scheduler pass.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.terminal_sent:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        cut, ends = terminal_cut(events)
        if cut:
            self.terminal_sent = ends
            self._inbox.send_nowait(StreamBatch(self._attempt, tuple(events if cut == len(events) else events[:cut])))
        self._unyielded += 1
        if not self.terminal_sent and self._unyielded >= BATCHES_PER_YIELD:
            self._unyielded = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()

    def clone(self) -> InboxChannel:
        raise NotImplementedError("the turn's provider channel cannot be cloned")


class ProviderRequests:
    """The turn's requests: which attempt is current (a retry supersedes the one before; a superseded request's
    events are never seen), whether one is open, whether its first event has reached the reducer."""

    def __init__(
        self,
        turn: TurnView,
        *,
        request: TurnRequest[Any],
        provider: ChatProvider,
        inbox: trio.MemorySendChannel[InboxItem],
        clock: TurnClock,
    ) -> None:
        self.turn = turn
        self.request = request
        self.provider = provider
        self.inbox = inbox
        self.clock = clock
        self.attempt = 0
        self.open = False
        self.saw_first_event = False
        self.nursery: trio.Nursery | None = None  # the request tasks' nursery, outside the turn's scope
        # With a provider list: the request's way through it, and each provider's failure since it began.
        self.fallback = provider if isinstance(provider, FallbackProvider) else None
        self.route: FallbackRoute | None = None
        self.failures: list[tuple[str, StreamError]] = []

    def start(self, *, backoff_s: float, retry: bool = False) -> None:
        """Open the next attempt: the state's messages, the turn's tools, after ``backoff_s``; unless the request
        would pass a token or cost bound (`BeforeRequest`): the turn then settles bounded and nothing is sent.
        A new request (not a ``retry``) through a provider list starts with the provider that answered last."""
        fallback = self.fallback
        if fallback is not None and not retry:
            names = fallback.names
            answered = self.turn.state.answered_by
            self.route = FallbackRoute.starting(len(names), names.index(answered) if answered in names else 0)
            self.failures = []
        asked = self.request
        answer = self.turn.state.answer
        request = ChatRequest(
            model=asked.model,
            system=asked.system,
            messages=self.turn.state.messages,
            tools=asked.registry.definitions(),
            max_tokens=asked.max_output_tokens,
            caller_retries=True,
        )
        if answer is not None:  # a typed answer: its final tool offered beside the others, and a tool required
            final = ToolDefinition(
                name=answer.tool_name, description=answer.description, json_schema=answer.json_schema
            )
            request = attrs.evolve(request, tools=(*request.tools, final), tool_choice="required")
        check = before_request(self.turn.state, request)
        if check is not None:
            self.turn.apply(check)
            if self.turn.state.is_settled:
                return
            # Bounded in tokens or money: the model may answer with at most the output the check reserved.
            request = attrs.evolve(request, max_tokens=min(request.max_tokens, check.output_tokens))
        self.attempt += 1
        self.open = True
        self.saw_first_event = False
        # A child of the request nursery, which is outside the turn's scope: on Stop or the deadline
        # the consumer settles first and then cancels the requests (``Turn.drive``), so the settled state
        # never waits behind a response being torn down. The nursery's deadline is the backstop.
        assert self.nursery is not None, "a turn opens requests only inside Turn.drive"
        index = None if self.route is None else self.route.current
        self.nursery.start_soon(self.task, self.attempt, request, backoff_s, index, name="trioloop request")

    async def task(self, attempt: int, request: ChatRequest, backoff_s: float, index: int | None = None) -> None:
        inbox = self.inbox
        sink = InboxChannel(inbox, attempt)
        if backoff_s > 0:
            await trio.sleep(backoff_s)
        try:
            if self.fallback is not None and index is not None:
                await self.fallback.stream_from(index, request, sink)
            else:
                await self.provider.stream(request, sink)
        except trio.Cancelled:
            raise
        except Exception as exc:  # a provider bug must end the turn as a typed failure, not a crash
            await sink.send(
                StreamError(
                    code="transport",
                    message="The AI request could not be completed.",
                    provider_detail=type(exc).__name__,
                )
            )
        inbox.send_nowait(RequestEnded(attempt, sink.terminal_sent))

    def retried(self, failure: StreamError) -> bool:
        """Retry after ``failure`` (a terminal error) if it is transient, came before the first event reached
        the reducer, and the retry budget and the deadline allow: True if a new attempt was started (or, with a
        provider list, if the turn has failed with one error naming each provider's failure)."""
        if self.fallback is not None:
            return self.hopped(failure)
        turn = self.turn
        if not (
            turn.state.phase is Phase.REQUESTING
            and not self.saw_first_event
            and (is_retriable(failure) or failure.code == "malformed_stream")
            and self.may_retry()
        ):
            return False
        wait = self.backoff(failure.retry_after)
        if trio.current_time() + wait >= self.clock.deadline:
            return False
        # Transient failure before the first event reached the reducer: nothing was shown, so a
        # retry cannot repeat output. The reducer counts it and tells the person (one counter:
        # the provider makes one attempt per request, see ChatRequest.caller_retries); the new
        # attempt supersedes the old. A wait that would outlast the turn is not started: the
        # failure settles the turn now, with the server's own words, instead of at the deadline.
        turn.apply(Retry(now_ms=now_ms(), failure=failure, wait_ms=math.ceil(wait * 1000)))
        self.open = False
        self.start(backoff_s=wait)
        return True

    def hopped(self, failure: StreamError) -> bool:
        """`retried` through a provider list: on to the next provider at once, or a new round after the backoff."""
        turn, route, fallback = self.turn, self.route, self.fallback
        if route is None or fallback is None or turn.state.phase is not Phase.REQUESTING or self.saw_first_event:
            return False  # after the first event: the turn's own rules, never another provider
        self.failures.append((fallback.names[route.current], failure))
        if may_hop(failure) and self.may_retry():
            now = trio.current_time()
            following, wait = route.failed(failure.retry_after, now, self.backoff())
            if now + wait < self.clock.deadline:
                turn.apply(Retry(now_ms=now_ms(), failure=failure, wait_ms=math.ceil(wait * 1000)))
                self.route = following
                self.open = False
                self.start(backoff_s=wait, retry=True)
                return True
        if len(self.failures) < 2:
            return False  # the first provider's own failure, as it is (named)
        tried = {name for name, _ in self.failures}
        untried = [name for name in fallback.names if name not in tried]
        turn.apply(all_failed(self.failures, untried))
        return True

    def may_retry(self) -> bool:
        # Only the retry and time bounds matter here: a retry is not a new iteration.
        state = self.turn.state
        if state.budget.retries_used >= state.limits.max_retries_per_turn:
            return False
        machine_now = state.budget.started_at_ms + self.clock.machine_ms()
        return timing_exhaustion(state.budget, state.limits, machine_now) is None

    def backoff(self, retry_after: float | None = None) -> float:
        """0.5 s doubling per retry, capped at 10 s; a server's ``retry-after`` lengthens it (never shortens)."""
        used = self.turn.state.budget.retries_used
        backoff = float(min(_RETRY_BASE_S * 2 ** max(used, 0), _RETRY_CAP_S))
        return backoff if retry_after is None else max(backoff, min(retry_after, _RETRY_AFTER_CEILING_S))
