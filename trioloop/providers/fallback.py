"""Fallback providers: a list of providers tried in order when one is overloaded, rate limited, unreachable or
failing with a 5xx before its first event, and never once an event of its answer has gone on.

Inside a turn the turn drives the hops (``trioloop.runtime.requests``): each hop is a counted retry of the turn,
taken at once (no backoff when another provider is next), so one budget, ``TurnLimits.max_retries_per_turn``,
bounds every request of the turn whichever provider it went to. `FallbackRoute` is that walk through the list, a
plain value with no I/O and no clock of its own. Used on its own (``FallbackProvider.stream``), the provider asks
each one for one attempt, in order, and reports every failure as one error when none answered.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Final, final

import attrs
import trio

from trioloop.protocol.errors import ProtocolErrorCode
from trioloop.protocol.events import MessageStart, StreamError, StreamEvent, retry_label, terminal_cut
from trioloop.protocol.provider import ChatProvider, HoldsConnections, send_events
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.base import is_retriable

__all__ = ["ALL_FAILED_MESSAGE", "FallbackProvider", "FallbackRoute", "all_failed", "may_hop"]

#: The message of the one error a turn (or a stream) ends with when no provider of the list answered.
ALL_FAILED_MESSAGE: Final = "No AI provider could answer: {failures}."
#: The longest server wait (``retry-after``) a route ever plans for, in seconds (as the turn's own retries).
_RETRY_AFTER_CEILING_S: Final = 600.0


def may_hop(failure: StreamError) -> bool:
    """Whether ``failure``, before the first event, sends the request on to the next provider: an overload, a rate
    limit, a 5xx, a network failure (`is_retriable`), or a stream that broke before it said anything."""
    return failure.terminal and (is_retriable(failure) or failure.code is ProtocolErrorCode.MALFORMED_STREAM)


def all_failed(failures: Sequence[tuple[str, StreamError]], untried: Sequence[str] = ()) -> StreamError:
    """The one error that names each provider and how it failed (its last failure), and those never tried.

    Its code, and its ``retry_after``, are the last failure's, so the turn and a person read it as they read
    that failure; ``provider`` is left empty, as the error is no one provider's."""
    if not failures:
        raise ValueError("all_failed needs at least one failure")
    last: dict[str, StreamError] = {}
    for name, failure in failures:
        last.pop(name, None)
        last[name] = failure  # in the order of each provider's last failure
    parts = [f"{name} ({retry_label(failure)})" for name, failure in last.items()]
    parts += [f"{name} (not tried: the retry budget was spent)" for name in untried if name not in last]
    final_failure = failures[-1][1]
    details = "; ".join(f"{name}: {failure.provider_detail or failure.message}" for name, failure in last.items())
    return StreamError(
        code=final_failure.code,
        message=ALL_FAILED_MESSAGE.format(failures=", ".join(parts)),
        provider_detail=details,
        retry_after=final_failure.retry_after,
    )


def _names(providers: Sequence[ChatProvider], names: Iterable[str] | None) -> tuple[str, ...]:
    if names is not None:
        given = tuple(names)
        if len(given) != len(providers):
            raise ValueError(f"names has {len(given)} entries for {len(providers)} providers")
        for name in given:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"each provider name must be a non-empty str, got {name!r}")
        if len(set(given)) != len(given):
            raise ValueError(f"provider names must be unique, got {given!r}")
        return given
    made: list[str] = []
    for provider in providers:
        base = type(provider).__name__
        name, n = base, 1
        while name in made:
            n += 1
            name = f"{base}#{n}"
        made.append(name)
    return tuple(made)


@final
class FallbackProvider:
    """A `ChatProvider` over several providers, tried in order: ``FallbackProvider([primary, backup],
    names=["primary", "backup"])``.

    A request goes to the first provider; an overload, rate limit, connection failure or 5xx before its first
    event sends it on to the next at once (``Retry-After`` included: the next provider is tried rather than the
    wait sat out). Once an event of an answer has gone on, nothing is tried elsewhere: a later failure ends the
    response as it would with that provider alone. The answering provider's name is on its `MessageStart`
    (``provider``), so the turn's state (``TurnState.answered_by``), the journal and the OTel ``chat`` span say who
    answered; a failure names its provider the same way (``StreamError.provider``).

    Inside a turn, each hop is one retry of the turn's budget (``TurnLimits.max_retries_per_turn``), shown to the
    person as a notice; when every provider has failed, the turn starts over with the provider whose wait is
    shortest, after the turn's backoff (or its ``Retry-After``), while the budget lasts; and the turn's later
    requests start with the provider that answered. When none can answer, the turn fails with one error naming
    each provider and its failure. Used on its own, it asks each provider once, in order.

    ``names`` (default: the class names, numbered when repeated) are how the providers are named in the state,
    the journal, notices and errors: short, unique, and no secret. Holding it (``hold_connections``, as a
    `Session` does) holds every provider that keeps connections.
    """

    def __init__(self, providers: Iterable[ChatProvider], *, names: Iterable[str] | None = None) -> None:
        listed = tuple(providers)
        if not listed:
            raise ValueError("FallbackProvider needs at least one provider")
        for provider in listed:
            if not callable(getattr(provider, "stream", None)):
                raise TypeError(f"{type(provider).__name__} is not a ChatProvider (it has no stream method)")
        self._providers = listed
        self._names = _names(listed, names)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={provider!r}" for name, provider in zip(self._names, self._providers, strict=True))
        return f"FallbackProvider({inner})"

    @property
    def providers(self) -> tuple[ChatProvider, ...]:
        """The providers, in the order they are tried."""
        return self._providers

    @property
    def names(self) -> tuple[str, ...]:
        """Each provider's name, in the same order."""
        return self._names

    def hold_connections(self) -> AbstractAsyncContextManager[object]:
        """Hold every provider that keeps connections (`HoldsConnections`) for the block, the others as they are."""
        return self._hold()

    @asynccontextmanager
    async def _hold(self) -> AsyncIterator[object]:
        async with AsyncExitStack() as stack:
            for provider in self._providers:
                if isinstance(provider, HoldsConnections):
                    await stack.enter_async_context(provider.hold_connections())
            yield self

    async def stream_from(
        self,
        index: int,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        """One attempt on provider ``index`` alone: its events, its `MessageStart` and its failure named."""
        provider = self._providers[index]
        name = self._names[index]
        named = _NamedBatches(send, name) if getattr(send, "send_batch", None) is not None else _Named(send, name)
        await provider.stream(request, named, cancel_scope=cancel_scope)

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        """Each provider once, in order, until one answers (see the class); the `ChatProvider` contract holds."""
        one_attempt = attrs.evolve(request, caller_retries=True)  # a hop replaces a provider's own retries
        failures: list[tuple[str, StreamError]] = []
        batches = getattr(send, "send_batch", None) is not None
        for index, name in enumerate(self._names):
            gate = (_BatchGate if batches else _Gate)(send)
            await self.stream_from(index, one_attempt, gate, cancel_scope=cancel_scope)
            if gate.held is None:
                return  # answered, or failed after its first event, or aborted: the stream has ended
            failures.append((name, gate.held))
            if not may_hop(gate.held):
                break  # a failure no other provider can mend (a rejected key, a bad request): reported as it is
        await send.send(all_failed(failures) if len(failures) > 1 else failures[0][1])


@final
@attrs.frozen(kw_only=True)
class FallbackRoute:
    """One request's way through a provider list: which provider is tried now, which failed since the request
    began, and when each may be asked again (its ``Retry-After``). A value: `failed` returns the next one."""

    count: int
    current: int = 0
    failed_here: frozenset[int] = frozenset()
    #: When each provider may be asked again (seconds on the caller's clock), after a ``Retry-After``.
    ready_at: tuple[float, ...] = ()

    @classmethod
    def starting(cls, count: int, start: int = 0) -> FallbackRoute:
        """A request's route: ``start`` first (the provider that answered the turn last), then in list order."""
        if count < 1 or not 0 <= start < count:
            raise ValueError(f"no provider {start} of {count}")
        return cls(count=count, current=start, ready_at=(-math.inf,) * count)

    def failed(self, retry_after: float | None, now: float, backoff: float) -> tuple[FallbackRoute, float]:
        """The route after the current provider failed (before its first event), and how long to wait first.

        The next provider in list order (wrapping round) that has not failed in this request is tried at
        once. When every one has, a new round begins with the provider whose ``Retry-After`` ends first (the
        earliest in the list on a tie), after ``backoff`` or its remaining wait when that is longer."""
        hint = (
            0.0 if retry_after is None or not math.isfinite(retry_after) else min(retry_after, _RETRY_AFTER_CEILING_S)
        )
        ready = list(self.ready_at)
        ready[self.current] = now + hint
        failed_here = self.failed_here | {self.current}
        for step in range(1, self.count):
            candidate = (self.current + step) % self.count
            if candidate not in failed_here:
                return attrs.evolve(self, current=candidate, failed_here=failed_here, ready_at=tuple(ready)), 0.0
        chosen = min(range(self.count), key=lambda i: (ready[i], i))
        wait = max(backoff, min(ready[chosen] - now, _RETRY_AFTER_CEILING_S))
        return attrs.evolve(self, current=chosen, failed_here=frozenset(), ready_at=tuple(ready)), wait


class _Named(trio.abc.SendChannel[StreamEvent]):
    """Forwards a provider's events, its `MessageStart` and terminal `StreamError` stamped with its name."""

    def __init__(self, inner: trio.abc.SendChannel[StreamEvent], name: str) -> None:
        self._inner = inner
        self._name = name

    def _stamped(self, event: StreamEvent) -> StreamEvent:
        if type(event) is MessageStart and not event.provider:
            return attrs.evolve(event, provider=self._name)
        if type(event) is StreamError and event.terminal and not event.provider:
            return attrs.evolve(event, provider=self._name)
        return event

    async def send(self, value: StreamEvent) -> None:
        await self._inner.send(self._stamped(value))

    async def aclose(self) -> None:
        """Never closes the consumer's channel (the provider contract leaves that to the caller)."""
        await trio.lowlevel.checkpoint()


class _NamedBatches(_Named):
    """`_Named` for a consumer that takes batches (`BatchSendChannel`): batches stay batches."""

    takes_batches = True

    async def send_batch(self, events: Sequence[StreamEvent]) -> None:
        stamp = self._stamped
        await send_events(self._inner, [stamp(event) for event in events])


class _Gate(trio.abc.SendChannel[StreamEvent]):
    """Holds back a failure that comes before any event, forwards everything else.

    ``held`` is that failure (the caller decides whether the next provider is asked); after it nothing more is
    forwarded.
    """

    def __init__(self, inner: trio.abc.SendChannel[StreamEvent]) -> None:
        self._inner = inner
        self._opened = False  # an event went on: from here on everything does
        self.held: StreamError | None = None

    def _hold(self, event: StreamEvent) -> bool:
        if self._opened:
            return False
        if type(event) is StreamError and event.terminal:
            self.held = event
            return True
        self._opened = True
        return False

    async def send(self, value: StreamEvent) -> None:
        if self.held is not None or self._hold(value):
            await trio.lowlevel.checkpoint()
            return
        await self._inner.send(value)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class _BatchGate(_Gate):
    """`_Gate` for a consumer that takes batches: batches stay batches."""

    takes_batches = True

    async def send_batch(self, events: Sequence[StreamEvent]) -> None:
        if self.held is not None:
            await trio.lowlevel.checkpoint()
            return
        if events and self._hold(events[0]):
            await trio.lowlevel.checkpoint()
            return
        cut, _ = terminal_cut(events)
        await send_events(self._inner, events[:cut])
