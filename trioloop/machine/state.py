"""The values the turn reducer reads and writes: phases, call records and `TurnState`.

Everything is frozen. Growing parts of a turn (the streamed text, violations, notices) live in
persistent append-only logs that share their prefix, so one more delta costs O(1) instead of a copy
of everything before it; the tuples callers read are built once, on first access, per state.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final, overload

import attrs

from trioloop.machine.limits import DEFAULT_TURN_LIMITS, TurnBudget, TurnLimits
from trioloop.machine.tools import Effect, PreparedCall, ToolRegistry, create_tool_registry
from trioloop.protocol.events import StopReason, StreamError, Usage
from trioloop.protocol.messages import ContentBlock, Message, TextBlock, ToolCallBlock

if TYPE_CHECKING:
    from trioloop.machine.authorization import Denial, Grant, Violation

__all__ = [
    "CallRecord",
    "CallStatus",
    "CallTable",
    "DenialReason",
    "Outcome",
    "Phase",
    "TurnState",
    "ViolationRecord",
]

T = TypeVar("T")
_Owner = TypeVar("_Owner")


class _cached(Generic[_Owner, T]):  # lower case: a decorator, like functools.cached_property
    """A value computed on the first read and kept in the instance ``__dict__``, then read from there.

    ``functools.cached_property`` without its per-read lock (Python 3.11 takes one on every first read;
    3.12 dropped it): states are immutable and the computation pure, so two threads racing here would
    only store equal values. The descriptor defines no ``__set__``, so once stored the instance's entry
    is found first and the descriptor is not called again.
    """

    def __init__(self, compute: Callable[[_Owner], T]) -> None:
        self._compute = compute
        self._name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> _cached[_Owner, T]: ...

    @overload
    def __get__(self, instance: _Owner, owner: type[Any]) -> T: ...

    def __get__(self, instance: _Owner | None, owner: type[Any]) -> T | _cached[_Owner, T]:
        if instance is None:
            return self
        value = self._compute(instance)
        instance.__dict__[self._name] = value
        return value


@final
class Phase(enum.StrEnum):
    """Where a turn stands: idle, requesting, streaming, awaiting_approval, executing, settled."""

    IDLE = "idle"
    REQUESTING = "requesting"
    STREAMING = "streaming"
    AWAITING_APPROVAL = "awaiting_approval"
    EXECUTING = "executing"
    SETTLED = "settled"


@final
class Outcome(enum.StrEnum):
    """How a settled turn ended: completed, cancelled (Stop), bounded (a limit) or failed."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    BOUNDED = "bounded"
    FAILED = "failed"


@final
class CallStatus(enum.StrEnum):
    """Where one tool call stands: pending a decision, approved, running, or ended (succeeded, failed, undone,
    denied)."""

    PENDING = "pending"
    APPROVED = "approved"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNDONE = "undone"
    DENIED = "denied"

    @property
    def is_terminal(self) -> bool:
        """Whether a call in this status has ended (nothing moves it again but an undo of a success)."""
        return self in _TERMINAL


_TERMINAL = frozenset({CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.UNDONE, CallStatus.DENIED})


@final
class DenialReason(enum.StrEnum):
    """Why a call was not run: the person declined it, the turn was cancelled, or a limit was reached."""

    USER_DECLINED = "user_declined"
    TURN_CANCELLED = "turn_cancelled"
    LIMIT_EXCEEDED = "limit_exceeded"


@final
@attrs.frozen(kw_only=True, slots=False)
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
    prepared: PreparedCall[Any] | None = None
    result: str | None = None
    is_error: bool = False
    denial_reason: DenialReason | None = None
    edits: tuple[tuple[str, str | None, str | None], ...] = ()
    changed_document: bool = False

    @property
    def is_terminal(self) -> bool:
        """Whether the call has ended (succeeded, failed, undone or denied)."""
        return self.status.is_terminal

    def moved_to(
        self,
        status: CallStatus,
        *,
        result: str | None = None,
        is_error: bool | None = None,
        denial_reason: DenialReason | None = None,
        changed_document: bool | None = None,
    ) -> CallRecord:
        """This record in ``status``; ``result``, ``is_error``, ``denial_reason`` and ``changed_document``
        change only when given.

        One dict copy rather than ``attrs.evolve`` (about 3x cheaper; the fields live in an instance
        ``__dict__``, as `TurnState`'s do): every call is moved two or three times, and settling a turn
        moves every open call on the Stop path. ``tests/test_machine.py`` checks it against
        ``attrs.evolve`` for every field, so a field added to the class cannot be dropped here silently.
        """
        values = self.__dict__.copy()
        values["status"] = status
        if result is not None:
            values["result"] = result
        if is_error is not None:
            values["is_error"] = is_error
        if denial_reason is not None:
            values["denial_reason"] = denial_reason
        if changed_document is not None:
            values["changed_document"] = changed_document
        moved: CallRecord = _new_object(CallRecord)
        _set_field(moved, "__dict__", values)
        return moved


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


@final
class CallTable(Sequence[CallRecord]):
    """The turn's calls in emission order, indexed by id: a persistent sequence.

    ``append`` is O(1) amortized and ``get(id)`` O(1): versions grown one from another share one
    list and one id index, and only the newest version (the tip) extends them, so an older value
    never sees a later call (it reads only its first ``len`` items; an index entry at or past its
    length is not its own). Appending to an older version copies (a branch; the reducer never
    does that). ``replaced`` copies the list (memcpy, no Python-level scan): it serves approvals,
    starts and settles, whose number the turn's accepted-call cap bounds. It counts pending calls
    and calls refused by a cap, so the reducer never scans for them. It compares equal to the
    tuple of its records, so code and tests that treat ``TurnState.calls`` as a tuple keep working.
    """

    __slots__ = ("_index", "_limit_refused", "_pending", "_records", "_size", "_tuple")

    _records: list[CallRecord]
    _index: dict[str, int]
    _size: int
    _pending: int
    _limit_refused: int
    _tuple: tuple[CallRecord, ...] | None

    def __init__(self, records: Iterable[CallRecord] = ()) -> None:
        items = list(records)
        index: dict[str, int] = {}
        for position, record in enumerate(items):
            index.setdefault(record.id, position)  # the first of a (forged) duplicate id wins, as before
        self._records = items
        self._index = index
        self._size = len(items)
        self._pending = sum(1 for r in items if r.status is CallStatus.PENDING)
        self._limit_refused = sum(1 for r in items if r.denial_reason is DenialReason.LIMIT_EXCEEDED)
        self._tuple = None

    @classmethod
    def of(cls, value: Iterable[CallRecord]) -> CallTable:
        """``value`` itself when it is a table, else a table of its records (the field's converter)."""
        return value if type(value) is CallTable else cls(value)

    def _grown(
        self, records: list[CallRecord], index: dict[str, int], size: int, pending: int, refused: int
    ) -> CallTable:
        table: CallTable = CallTable.__new__(CallTable)
        table._records = records
        table._index = index
        table._size = size
        table._pending = pending
        table._limit_refused = refused
        table._tuple = None
        return table

    def append(self, record: CallRecord) -> CallTable:
        """This table with ``record`` last (O(1) amortized when ``self`` is the newest version)."""
        records, index = self._records, self._index
        if not self._size:
            records, index = [], {}  # every table starts lists of its own (the shared empty table is never grown)
        elif len(records) != self._size or len(index) != self._size:
            # A branch (or a table holding a duplicate id): start a list and an index of its own.
            records = records[: self._size]
            index = {}
            for position, old in enumerate(records):
                index.setdefault(old.id, position)
        records.append(record)
        index.setdefault(record.id, self._size)
        return self._grown(
            records,
            index,
            self._size + 1,
            self._pending + (record.status is CallStatus.PENDING),
            self._limit_refused + (record.denial_reason is DenialReason.LIMIT_EXCEEDED),
        )

    def position(self, call_id: str) -> int | None:
        position = self._index.get(call_id)
        if position is None or position >= self._size or self._records[position].id != call_id:
            return None
        return position

    def get(self, call_id: str) -> CallRecord | None:
        position = self.position(call_id)
        return None if position is None else self._records[position]

    def replaced(self, changes: Iterable[tuple[int, CallRecord]]) -> CallTable:
        """This table with the record at each position replaced by one of the same id; one copy of the list."""
        records = self._records[: self._size]
        pending, refused = self._pending, self._limit_refused
        for position, record in changes:
            old = records[position]
            pending += (record.status is CallStatus.PENDING) - (old.status is CallStatus.PENDING)
            refused += (record.denial_reason is DenialReason.LIMIT_EXCEEDED) - (
                old.denial_reason is DenialReason.LIMIT_EXCEEDED
            )
            records[position] = record
        # Every record keeps its id and position, but the index is copied with the list all the same: a
        # shared index would grow in place from two different lists (this one's and the table it was
        # replaced from, each the tip of its own line), and an entry one of them added could then be taken
        # for the other's (found by tests/test_machine_scaling.py). The copy costs what the list's does.
        return self._grown(records, dict(self._index), self._size, pending, refused)

    @property
    def pending_count(self) -> int:
        return self._pending

    @property
    def limit_refused_count(self) -> int:
        return self._limit_refused

    @property
    def items(self) -> tuple[CallRecord, ...]:
        if self._tuple is None:
            self._tuple = tuple(islice(self._records, self._size))
        return self._tuple

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, item: int) -> CallRecord: ...

    @overload
    def __getitem__(self, item: slice) -> tuple[CallRecord, ...]: ...

    def __getitem__(self, item: int | slice) -> CallRecord | tuple[CallRecord, ...]:
        if isinstance(item, slice):
            start, stop, step = item.indices(self._size)
            if step == 1:
                return tuple(self._records[start:stop])
            return self.items[item]
        if not -self._size <= item < self._size:
            raise IndexError("call index out of range")
        return self._records[item % self._size]

    def __iter__(self) -> Iterator[CallRecord]:
        return islice(self._records, self._size)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CallTable):
            return self is other or (self._size == other._size and self.items == other.items)
        if isinstance(other, tuple):
            return self.items == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"CallTable({list(self)!r})"


_EMPTY_CALLS = CallTable()


def _call_table(value: Iterable[CallRecord]) -> CallTable:
    return CallTable.of(value)


@final
class TextRun:
    """A response's streamed text as a persistent append-only run of pieces: ``append`` is O(1) amortized.

    Versions grown one from another share one list; only the newest (the tip) extends it, and each version
    reads only its first ``len`` pieces, so an older state never sees a later delta (appending to an older
    version copies its prefix: a branch, which the reducer never makes). Unlike a chain of nodes, a version
    holds no reference to the one it grew from: a long answer keeps one list and its strings (which the
    garbage collector does not track) alive, not one tracked object per delta.
    """

    __slots__ = ("_pieces", "_size")

    _pieces: list[str]
    _size: int

    def __init__(self) -> None:
        self._pieces = []
        self._size = 0

    def append(self, text: str) -> TextRun:
        pieces = self._pieces
        if not self._size:
            pieces = []  # every run starts a list of its own (the shared empty run is never grown)
        elif len(pieces) != self._size:
            pieces = pieces[: self._size]  # a branch: a list of its own
        pieces.append(text)
        grown: TextRun = TextRun.__new__(TextRun)
        grown._pieces = pieces
        grown._size = self._size + 1
        return grown

    def __len__(self) -> int:
        return self._size

    @property
    def items(self) -> tuple[str, ...]:
        return tuple(islice(self._pieces, self._size))

    def joined(self) -> str:
        return "".join(islice(self._pieces, self._size))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TextRun):
            return NotImplemented
        return self is other or (self._size == other._size and self.items == other.items)

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"TextRun({list(self.items)!r})"


_EMPTY_TEXT = TextRun()
_EMPTY_BLOCKS: Log[ContentBlock] = Log()


def _block_log(value: Log[ContentBlock] | Iterable[ContentBlock] | None) -> Log[ContentBlock]:
    if value is None:
        return _EMPTY_BLOCKS
    if isinstance(value, Log):
        return value
    log = _EMPTY_BLOCKS
    for block in value:
        log = log.append(block)
    return log


@final
@attrs.frozen(kw_only=True, slots=False)
class Draft:
    """The current iteration's assistant message: finished blocks plus the text segment still growing.

    ``open`` is true until `MessageStop` (or a settle) closes it; the closed message is then part
    of the turn's messages and the draft is kept only so the UI can read this iteration's text.
    (An instance ``__dict__``, not slots: the cached properties are read in every iteration, and on a
    slotted attrs class their first read goes through a generated ``__getattr__``.)
    """

    blocks: Log[ContentBlock] = attrs.field(default=_EMPTY_BLOCKS, converter=_block_log)
    text: TextRun = _EMPTY_TEXT
    open: bool = True

    def with_text(self, text: str) -> Draft:
        return Draft(blocks=self.blocks, text=self.text.append(text), open=self.open)

    def with_call(self, block: ToolCallBlock) -> Draft:
        # An append to a persistent log: O(1), whatever the number of calls already in the message.
        return Draft(blocks=self._finished_blocks.append(block), open=self.open)

    def with_block(self, block: ContentBlock) -> Draft:
        """A finished non-text block (a thinking block) after what streamed so far."""
        return Draft(blocks=self._finished_blocks.append(block), open=self.open)

    def closed(self) -> Draft:
        return Draft(blocks=self._finished_blocks, open=False)

    @property
    def _finished_blocks(self) -> Log[ContentBlock]:
        if not len(self.text):
            return self.blocks
        return self.blocks.append(TextBlock(text=self.text.joined()))

    @_cached
    def message(self) -> Message | None:
        """The assistant message so far, or None while it holds nothing (an empty message is never sent)."""
        blocks = self._finished_blocks.items
        return Message(role="assistant", content=blocks) if blocks else None

    @_cached
    def plain_text(self) -> str:
        segments = [b.text for b in self.blocks if isinstance(b, TextBlock)]
        segments.extend(self.text.items)
        return "".join(segments)


_NO_USAGE = Usage()
_EMPTY_VIOLATIONS: Log[ViolationRecord] = Log()
_EMPTY_NOTICES: Log[str] = Log()


@final
@attrs.frozen(kw_only=True, slots=False)
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
    tool_set: ToolRegistry[Any] = attrs.field(factory=create_tool_registry)
    limits: TurnLimits = DEFAULT_TURN_LIMITS
    budget: TurnBudget = attrs.field(factory=TurnBudget)
    base_messages: tuple[Message, ...] = ()
    calls: CallTable = attrs.field(default=_EMPTY_CALLS, converter=_call_table)
    grants: tuple[Grant, ...] = ()
    denials: tuple[Denial, ...] = ()
    error: StreamError | None = None
    usage: Usage = _NO_USAGE
    #: Why the model's last response ended (None before the first one ends), and the model the server named
    #: in its last response ("" when it named none): what observers report (``gen_ai.response.*``).
    stop_reason: StopReason | None = None
    response_model: str = ""
    # Internal bookkeeping; only the reducer builds these.
    closed_messages: tuple[Message, ...] = ()
    draft: Draft | None = None
    answered: int = 0
    violation_log: Log[ViolationRecord] = _EMPTY_VIOLATIONS
    notice_log: Log[str] = _EMPTY_NOTICES
    usage_before_iteration: Usage = _NO_USAGE
    base_call_ids: frozenset[str] = frozenset()
    # Where the current iteration's calls begin in ``calls`` (calls are appended in iteration order).
    iteration_first_call: int = 0

    @classmethod
    def idle(cls) -> TurnState:
        """The state before a turn: one shared value (states are immutable), not a new one per turn."""
        return _IDLE

    @property
    def is_settled(self) -> bool:
        """Whether the turn has ended (it then takes no input but undo)."""
        return self.phase is Phase.SETTLED

    @property
    def is_live(self) -> bool:
        """Whether the turn has started and not settled."""
        return self.phase is not Phase.IDLE and self.phase is not Phase.SETTLED

    @property
    def undo_snapshot_key(self) -> str:
        """The key of this turn's pre-turn document in the undo history (its turn id)."""
        return self.turn_id

    def call(self, call_id: str) -> CallRecord | None:
        """The call with id ``call_id``, or None."""
        return self.calls.get(call_id)

    @property
    def current_calls(self) -> tuple[CallRecord, ...]:
        """The calls the model opened in the current iteration, in emission order."""
        recent = self.calls[self.iteration_first_call :]
        return tuple(c for c in recent if c.iteration == self.iteration)

    @property
    def current_call_count(self) -> int:
        """How many calls the model opened in the current iteration (O(1); the reducer's cap reads it)."""
        return len(self.calls) - self.iteration_first_call

    @property
    def violations(self) -> tuple[ViolationRecord, ...]:
        """Every refused input of the turn, in order (which rule, which call, and why)."""
        return self.violation_log.items

    @property
    def notices(self) -> tuple[str, ...]:
        """Every notice of the turn, in order: retries, skipped frames, limits reached."""
        return self.notice_log.items

    @property
    def streaming_text(self) -> str:
        """The assistant text of the current iteration so far."""
        return "" if self.draft is None else self.draft.plain_text

    @_cached
    def turn_messages(self) -> tuple[Message, ...]:
        """This turn's messages only: the user's text, then assistant messages and tool results."""
        if self.draft is not None and self.draft.open and self.draft.message is not None:
            return (*self.closed_messages, self.draft.message)
        return self.closed_messages

    @_cached
    def messages(self) -> tuple[Message, ...]:
        return self.base_messages + self.turn_messages

    def evolved(self, **changes: Any) -> TurnState:
        """``attrs.evolve(self, **changes)`` made cheaper: the reducer makes several states per iteration.

        ``TurnState`` keeps its fields in an instance ``__dict__`` (not slots) so that this is one dict
        copy and update (about 1.5 us) where ``attrs.evolve`` walks the fields and calls ``__init__``
        (about 10 us): setting 21 slots one by one costs more than the copy. The cached properties'
        entries are dropped so they start empty, as in a constructed state. ``calls`` still goes
        through its converter, and an unknown name is a ``TypeError`` as in ``evolve``.
        ``tests/test_machine.py`` checks it against ``attrs.evolve`` for every field.
        """
        if not changes.keys() <= _STATE_FIELD_SET:
            raise TypeError(f"TurnState has no field(s) {sorted(changes.keys() - _STATE_FIELD_SET)}")
        if "calls" in changes:
            changes["calls"] = _call_table(changes["calls"])
        values = self.__dict__.copy()
        if len(values) != _STATE_FIELD_COUNT:  # a cached property was computed: its value is not a field
            for name in _STATE_CACHED:
                values.pop(name, None)
        values.update(changes)
        new: TurnState = _new_object(TurnState)
        _set_field(new, "__dict__", values)
        return new


_IDLE = TurnState()
_STATE_FIELDS: tuple[str, ...] = tuple(field.name for field in attrs.fields(TurnState))
_STATE_FIELD_SET: frozenset[str] = frozenset(_STATE_FIELDS)
_STATE_FIELD_COUNT = len(_STATE_FIELDS)
_STATE_CACHED: tuple[str, ...] = tuple(name for name, value in vars(TurnState).items() if isinstance(value, _cached))
_new_object = object.__new__
_set_field = object.__setattr__
