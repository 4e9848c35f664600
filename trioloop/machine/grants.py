"""Grants and denials, as values: what a person's decision (or the read-only policy) leaves in a turn.

A `Grant` binds one call id, tool name, input digest and iteration, and is spent by one start; a `Denial`
sticks to a (tool, input) pair for the rest of the turn. `TurnState` holds both; only `authorization` makes a
grant and checks one, and only the reducer records a denial.
"""

from __future__ import annotations

from typing import final

import attrs

__all__ = ["Denial", "Grant"]


@final
@attrs.frozen(kw_only=True)
class Grant:
    """Permission for exactly one run of one call, with one input, in one iteration."""

    call_id: str
    tool_name: str
    input_digest: str
    iteration: int
    consumed: bool = False

    def spent(self) -> Grant:
        """This grant, consumed (it permits no further run)."""
        return Grant(
            call_id=self.call_id,
            tool_name=self.tool_name,
            input_digest=self.input_digest,
            iteration=self.iteration,
            consumed=True,
        )


@final
@attrs.frozen(kw_only=True)
class Denial:
    """A user's refusal; it sticks to the (tool, input) pair for the rest of the turn."""

    tool_name: str
    input_digest: str
