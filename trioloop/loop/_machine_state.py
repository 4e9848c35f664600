"""The values the turn reducer reads and writes: phases, call records and `TurnState`.

Everything is frozen. Growing parts of a turn (the streamed text, violations, notices) live in
persistent append-only logs that share their prefix, so one more delta costs O(1) instead of a copy
of everything before it; the tuples callers read are built once, on first access, per state.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, final

import attrs

from trioloop.loop.limits import DEFAULT_TURN_LIMITS, TurnBudget, TurnLimits
from trioloop.loop.tool_runtime import Effect, PreparedCall, ToolRegistry, create_tool_registry
from trioloop.protocol.events import StreamError, Usage
from trioloop.protocol.messages import ContentBlock, Message, TextBlock, ToolCallBlock

if TYPE_CHECKING:
    from trioloop.loop.authorization import Denial, Grant, Violation

__all__ = [
    "CallRecord",
    "CallStatus",
    "DenialReason",
    "Outcome",
    "Phase",
    "TurnState",
    "ViolationRecord",
]

T = TypeVar("T")


@final
class Phase(enum.StrEnum):
    IDLE = "idle"
    REQUESTING = "requesting"
    STREAMING = "streaming"
    AWAITING_APPROVAL = "awaiting_approval"
    EXECUTING = "executing"
    SETTLED = "settled"


@final
class Outcome(enum.StrEnum):
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    BOUNDED = "bounded"
    FAILED = "failed"


@final
class CallStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNDONE = "undone"
    DENIED = "denied"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.UNDONE, CallStatus.DENIED})


@final
class DenialReason(enum.StrEnum):
    USER_DECLINED = "user_declined"
    TURN_CANCELLED = "turn_cancelled"
    LIMIT_EXCEEDED = "limit_exceeded"


@final
@attrs.frozen(kw_only=True)
class CallRecord:
    """One tool call the model opened in this turn, and what became of it.

    ``input_digest`` is "" and ``prepared`` None for a call that was never prepared (unknown tool,
    over a cap, invalid input). ``result`` is the text the model receives for the call. ``edits`` lists
    the fields the user changed when approving (path, old value, new value; None where absent): the
    call then carries the edited input's digest and prepared run, and its tool result names the edits.
    ``changed_document`` is true once the call's commit swapped the live document: only such a call
    becomes ``undone`` when the turn is undone.
    """

    id: str
    tool_name: str
    input_digest: str
    summary: str
    effect: Effect
    destructive: bool
    iteration: int
    status: CallStatus
    prepared: PreparedCall | None = None
    result: str | None = None
    is_error: bool = False
    denial_reason: DenialReason | None = None
    edits: tuple[tuple[str, str | None, str | None], ...] = ()
    changed_document: bool = False

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    def moved_to(
        self,
        status: CallStatus,
        *,
        result: str | None = None,
        is_error: bool | None = None,
        denial_reason: DenialReason | None = None,
    ) -> CallRecord:
        """This record in ``status``; ``result``, ``is_error`` and ``denial_reason`` change only when given.

        A direct construction rather than ``attrs.evolve`` (about 2.5x cheaper): settling a turn moves
        every open call, and that is on the Stop path. ``tests/test_machine.py`` checks it against
        ``attrs.evolve`` for every field, so a field added to the class cannot be dropped here silently.
        """
        return CallRecord(
            id=self.id,
            tool_name=self.tool_name,
            input_digest=self.input_digest,
            summary=self.summary,
            effect=self.effect,
            destructive=self.destructive,
            iteration=self.iteration,
            status=status,
            prepared=self.prepared,
            result=self.result if result is None else result,
            is_error=self.is_error if is_error is None else is_error,
            denial_reason=self.denial_reason if denial_reason is None else denial_reason,
            edits=self.edits,
            changed_document=self.changed_document,
        )


@final
@attrs.frozen(kw_only=True)
class ViolationRecord:
    """A refused input: which rule, which call (if any), and a short account for logs and tests."""

    violation: Violation
    call_id: str | None
    detail: str


@final
class Log(Generic[T]):
    """A persistent append-only sequence: ``append`` is O(1) and shares every earlier item.

    ``items`` materializes the tuple once per log value; a longer log reuses the tuple of the
    shorter one it grew from when that one was already materialized.
    """

    __slots__ = ("_items", "_last", "_prefix", "_size")

    _prefix: Log[T] | None
    _last: T | None
    _size: int
    _items: tuple[T, ...] | None

    def __init__(self) -> None:
        self._prefix = None
        self._last = None
        self._size = 0
        self._items = ()

    def append(self, item: T) -> Log[T]:
        grown: Log[T] = Log.__new__(Log)
        grown._prefix = self
        grown._last = item
        grown._size = self._size + 1
        grown._items = None
        return grown

    def __len__(self) -> int:
        return self._size

    @property
    def items(self) -> tuple[T, ...]:
        if self._items is None:
            tail: list[T] = []
            node: Log[T] = self
            while node._items is None:
                tail.append(node._last)  # type: ignore[arg-type]
                assert node._prefix is not None
                node = node._prefix
            tail.reverse()
            self._items = node._items + tuple(tail)
        return self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Log):
            return NotImplemented
        return self is other or (self._size == other._size and self.items == other.items)

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"Log({list(self.items)!r})"


_EMPTY_TEXT: Log[str] = Log()


@final
@attrs.frozen(kw_only=True)
class Draft:
    """The current iteration's assistant message: finished blocks plus the text segment still growing.

    ``open`` is true until `MessageStop` (or a settle) closes it; the closed message is then part
    of the turn's messages and the draft is kept only so the UI can read this iteration's text.
    """

    blocks: tuple[ContentBlock, ...] = ()
    text: Log[str] = _EMPTY_TEXT
    open: bool = True

    def with_text(self, text: str) -> Draft:
        return Draft(blocks=self.blocks, text=self.text.append(text), open=self.open)

    def with_call(self, block: ToolCallBlock) -> Draft:
        return Draft(blocks=(*self._finished_blocks, block), open=self.open)

    def closed(self) -> Draft:
        return Draft(blocks=self._finished_blocks, open=False)

    @property
    def _finished_blocks(self) -> tuple[ContentBlock, ...]:
        if not len(self.text):
            return self.blocks
        return (*self.blocks, TextBlock(text="".join(self.text.items)))

    @functools.cached_property
    def message(self) -> Message | None:
        """The assistant message so far, or None while it holds nothing (an empty message is never sent)."""
        blocks = self._finished_blocks
        return Message(role="assistant", content=blocks) if blocks else None

    @functools.cached_property
    def plain_text(self) -> str:
        segments = [b.text for b in self.blocks if isinstance(b, TextBlock)]
        segments.extend(self.text.items)
        return "".join(segments)


_NO_USAGE = Usage()
_EMPTY_VIOLATIONS: Log[ViolationRecord] = Log()
_EMPTY_NOTICES: Log[str] = Log()


@final
@attrs.frozen(kw_only=True)
class TurnState:
    """Everything one turn has decided, as one immutable value; `reduce_turn` makes the next one.

    ``messages`` is the base history plus this turn's messages (the open assistant message
    included while it streams); at every settle it is pairable. ``undo_snapshot_key`` is the key
    under which `commit_tool_outcome` records this turn's pre-turn document (the turn id).
    """

    turn_id: str = ""
    phase: Phase = Phase.IDLE
    outcome: Outcome | None = None
    iteration: int = 0
    tool_set: ToolRegistry = attrs.field(factory=create_tool_registry)
    limits: TurnLimits = DEFAULT_TURN_LIMITS
    budget: TurnBudget = attrs.field(factory=TurnBudget)
    base_messages: tuple[Message, ...] = ()
    calls: tuple[CallRecord, ...] = ()
    grants: tuple[Grant, ...] = ()
    denials: tuple[Denial, ...] = ()
    error: StreamError | None = None
    usage: Usage = _NO_USAGE
    # Internal bookkeeping; only the reducer builds these.
    closed_messages: tuple[Message, ...] = ()
    draft: Draft | None = None
    answered: int = 0
    violation_log: Log[ViolationRecord] = _EMPTY_VIOLATIONS
    notice_log: Log[str] = _EMPTY_NOTICES
    usage_before_iteration: Usage = _NO_USAGE
    base_call_ids: frozenset[str] = frozenset()

    @classmethod
    def idle(cls) -> TurnState:
        return cls()

    @property
    def is_settled(self) -> bool:
        return self.phase is Phase.SETTLED

    @property
    def is_live(self) -> bool:
        return self.phase is not Phase.IDLE and self.phase is not Phase.SETTLED

    @property
    def undo_snapshot_key(self) -> str:
        return self.turn_id

    def call(self, call_id: str) -> CallRecord | None:
        for record in self.calls:
            if record.id == call_id:
                return record
        return None

    @property
    def current_calls(self) -> tuple[CallRecord, ...]:
        """The calls the model opened in the current iteration, in emission order."""
        return tuple(c for c in self.calls if c.iteration == self.iteration)

    @property
    def violations(self) -> tuple[ViolationRecord, ...]:
        return self.violation_log.items

    @property
    def notices(self) -> tuple[str, ...]:
        return self.notice_log.items

    @property
    def streaming_text(self) -> str:
        """The assistant text of the current iteration so far."""
        return "" if self.draft is None else self.draft.plain_text

    @functools.cached_property
    def turn_messages(self) -> tuple[Message, ...]:
        """This turn's messages only: the user's text, then assistant messages and tool results."""
        if self.draft is not None and self.draft.open and self.draft.message is not None:
            return (*self.closed_messages, self.draft.message)
        return self.closed_messages

    @functools.cached_property
    def messages(self) -> tuple[Message, ...]:
        return self.base_messages + self.turn_messages
