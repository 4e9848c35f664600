"""What a session calls out to with every state it publishes: the observer protocol.

An observer sees each new `TurnState` as the session publishes it, synchronously, in the task that made
it, so it learns of every transition (a turn's phases, each call's status, the usage) at the moment it
becomes visible, with no task of its own. It must be quick and must not raise; a fault in one is logged
and the observer is dropped, never the turn. An observer may also define ``on_suspended(state)``: called
when a turn ends suspended in review (no new state is published then; `Session.continue_turn` publishes the
turn again when it takes it up). `trioloop.otel` implements one (OpenTelemetry spans and
metrics); an app may add its own with ``Session(observers=...)`` or `Session.observe`.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from trioloop.machine.reducer import TurnState

__all__ = ["TurnObserver"]

log = logging.getLogger("trioloop.observer")


@runtime_checkable
class TurnObserver(Protocol):
    """Told of every state a session publishes (``on_state``), in order, as it is published."""

    def on_state(self, state: TurnState) -> None: ...
