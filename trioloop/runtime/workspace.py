"""What a turn is given: the live `Workspace` (the document, its kind and undo history: the only mutable things a
turn writes), the `TurnRequest` (everything else it needs), and the callback that is told of each state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeAlias, TypeVar

import attrs

from trioloop.machine.document import DocumentKind
from trioloop.machine.limits import DEFAULT_TURN_LIMITS, NO_SPENDING, Spending, TurnLimits
from trioloop.machine.rules import EMPTY_RULES, RuleSet
from trioloop.machine.state import TurnState
from trioloop.machine.tools import ToolRegistry
from trioloop.machine.transaction import UndoHistory
from trioloop.protocol.messages import Message
from trioloop.runtime.answers import AnswerForm

__all__ = ["TOOL_CANCEL_GRACE_S", "StateObserver", "TurnRequest", "Workspace"]

StateObserver: TypeAlias = Callable[[TurnState], None]

#: How long a cancelled tool may take to unwind before the turn abandons it (its value discarded).
TOOL_CANCEL_GRACE_S = 2.0

D = TypeVar("D")


@attrs.define(kw_only=True)
class Workspace(Generic[D]):
    """The live document, how to treat it, and its undo history: the only mutable things a turn writes."""

    document: D
    kind: DocumentKind[D]
    undo: UndoHistory[D] = attrs.field(factory=UndoHistory)


@attrs.frozen(kw_only=True)
class TurnRequest(Generic[D]):
    """Everything one turn needs besides the live workspace."""

    text: str
    turn_id: str
    model: str
    system: str = ""
    base_messages: tuple[Message, ...] = ()
    registry: ToolRegistry[D] = attrs.field(factory=lambda: ToolRegistry(()))
    limits: TurnLimits = DEFAULT_TURN_LIMITS
    max_output_tokens: int = 4096
    tool_cancel_grace_s: float = TOOL_CANCEL_GRACE_S
    #: Seconds of the turn already spent before it was driven (listing a toolset's tools again, say): its
    #: deadline counts them.
    spent_s: float = 0.0
    #: The model's price and the session's token and cost bounds (`trioloop.runtime.spending.turn_spending`).
    spending: Spending = NO_SPENDING
    #: The approval rules the turn decides by (the app's, the files', the session's).
    rules: RuleSet = EMPTY_RULES
    #: The typed answer the turn asks for (`trioloop.runtime.answers`), None for a text answer.
    answer: AnswerForm[Any] | None = None
