"""Bounded retry around a transport: only before the consumer saw an event, only for transient failures.

A failure is retried when nothing reached the consumer yet, an attempt remains, and ``is_retriable``
says it is a rate limit, a 5xx or a network failure. The wait is exponential without jitter, and a
``retry-after`` hint can lengthen it (never shorten it) up to a fixed ceiling. The sleep is
``trio.sleep``, so cancellation ends it and ``MockClock`` makes it instant in tests.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Final, final

import attrs
import trio

from trioloop.protocol.events import StreamError, StreamEvent, retry_label
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.base import AttemptOutcome, Transport, is_retriable

__all__ = ["DEFAULT_RETRY_POLICY", "RetryNotice", "RetryPolicy", "RetryingTransport", "retry_label"]

_log = logging.getLogger("trioloop.providers")


def _positive_int(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def _finite_non_negative(inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How many attempts and how long to wait between them (seconds)."""

    max_attempts: int = attrs.field(default=3, validator=_positive_int)
    base_delay: float = attrs.field(default=0.5, validator=_finite_non_negative)
    max_backoff: float = attrs.field(default=10.0, validator=_finite_non_negative)
    retry_after_ceiling: float = attrs.field(default=600.0, validator=_finite_non_negative)

    def backoff(self, attempt: int) -> float:
        """``base_delay * 2^(attempt-1)`` capped at ``max_backoff``; ``attempt`` counts from 1."""
        exponent = min(max(attempt, 1) - 1, 64)
        return min(self.base_delay * 2.0**exponent, self.max_backoff)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """The wait after failed ``attempt``: the backoff, or the server's hint when longer (clamped)."""
        backoff = self.backoff(attempt)
        if retry_after is None or not math.isfinite(retry_after):
            return backoff
        return max(min(retry_after, self.retry_after_ceiling), backoff)


DEFAULT_RETRY_POLICY: Final = RetryPolicy()


@final
@attrs.frozen(kw_only=True)
class RetryNotice:
    """A failed attempt about to be retried: what failed, how long the wait is, which attempt comes next."""

    failure: StreamError
    wait: float
    next_attempt: int
    max_attempts: int

    def describe(self) -> str:
        """E.g. ``HTTP 529, retrying in 2 s, attempt 2 of 4``."""
        label = retry_label(self.failure)
        return f"{label}, retrying in {self.wait:g} s, attempt {self.next_attempt} of {self.max_attempts}"


@final
class RetryingTransport:
    """A ``Transport`` that re-runs ``inner`` on transient failures, within ``policy``."""

    def __init__(
        self,
        inner: Transport,
        policy: RetryPolicy = DEFAULT_RETRY_POLICY,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        """``on_retry`` is told before each wait, so a UI can show progress instead of silence."""
        self._inner = inner
        self._policy = policy
        self._on_retry = on_retry

    def __repr__(self) -> str:
        return f"RetryingTransport({self._inner!r}, {self._policy!r})"

    async def attempt(self, request: ChatRequest, send: trio.abc.SendChannel[StreamEvent]) -> AttemptOutcome:
        attempt = 1
        while True:
            outcome = await self._inner.attempt(request, send)
            failure = outcome.failure
            if (
                failure is None
                or outcome.committed
                or attempt >= self._policy.max_attempts
                or not is_retriable(failure)
            ):
                return outcome
            wait = self._policy.delay(attempt, outcome.retry_after)
            _log.debug(
                "provider attempt %d of %d failed (%s); retrying in %.3f s",
                attempt,
                self._policy.max_attempts,
                failure.code.value,
                wait,
            )
            if self._on_retry is not None:
                self._on_retry(
                    RetryNotice(
                        failure=failure, wait=wait, next_attempt=attempt + 1, max_attempts=self._policy.max_attempts
                    )
                )
            await trio.sleep(wait)
            attempt += 1
