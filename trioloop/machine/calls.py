"""A turn's phases and its calls: the closed sets of phases, outcomes, call statuses, denial reasons and
violations, one `CallRecord` per call the model opened, and the `CallTable` that holds them in order, indexed by
id."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, final, overload

import attrs

from trioloop.machine.rules import Decider
from trioloop.machine.tools import Effect, PreparedCall

__all__ = [
    "NO_CALLS",
    "CallRecord",
    "CallStatus",
    "CallTable",
    "DenialReason",
    "Outcome",
    "Phase",
    "Violation",
    "ViolationRecord",
    "call_table",
]


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
    """Why a call was not run: the person declined it, a rule (or a ``needs_approval`` function) denied it, the
    turn was cancelled, or a limit was reached."""

    USER_DECLINED = "user_declined"
    RULE_DENIED = "rule_denied"
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
    becomes ``undone`` when the turn is undone. ``decided_by`` says who decided the call (the person, the
    read-only policy, a rule, a ``needs_approval`` function); while the call is pending, the rule or function
    that asked for its card, if any.
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
    decided_by: Decider | None = None

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
        decided_by: Decider | None = None,
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
        if decided_by is not None:
            values["decided_by"] = decided_by
        moved: CallRecord = _new_object(CallRecord)
        _set_field(moved, "__dict__", values)
        return moved

    def with_prepared(self, prepared: PreparedCall[Any]) -> CallRecord:
        """This record with ``prepared`` in its place (the same call and input: its ids sealed, its run wrapped),
        in one dict copy as `moved_to` makes it."""
        values = self.__dict__.copy()
        values["prepared"] = prepared
        changed: CallRecord = _new_object(CallRecord)
        _set_field(changed, "__dict__", values)
        return changed


@final
class Violation(enum.StrEnum):
    """Why the reducer refused an input; recorded, never raised."""

    NO_GRANT = "no_grant"
    DIGEST_MISMATCH = "digest_mismatch"
    FOREIGN_ITERATION = "foreign_iteration"
    GRANT_ALREADY_CONSUMED = "grant_already_consumed"
    UNKNOWN_TOOL = "unknown_tool"
    DENIED_REPLAY = "denied_replay"
    LIMIT_EXCEEDED = "limit_exceeded"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    POST_SETTLEMENT_EVENT = "post_settlement_event"


@final
@attrs.frozen(kw_only=True)
class ViolationRecord:
    """A refused input: which rule, which call (if any), and a short account for logs and tests."""

    violation: Violation
    call_id: str | None
    detail: str


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

    def __init__(
        self,
        records: list[CallRecord] | None = None,
        index: dict[str, int] | None = None,
        size: int = 0,
        pending: int = 0,
        limit_refused: int = 0,
    ) -> None:
        """The table of ``records`` (none: the empty table), or, given every field, one version of a line.

        ``CallTable(records)`` copies, indexes and counts the records (the first of a duplicate id wins).
        ``append`` and ``replaced`` pass every field, so each new version is made whole here: the first ``size``
        of ``records``, a list the versions of a line share; ``index``, an id's first position; and the counts of
        pending calls and of calls a cap refused among them. Positional: a keyword call costs about 100 ns more
        on Python 3.11, and a table grows per call.
        """
        if index is None or records is None:
            records, index, size, pending, limit_refused = _fields_of(records or ())
        self._records = records
        self._index = index
        self._size = size
        self._pending = pending
        self._limit_refused = limit_refused
        self._tuple = None

    @classmethod
    def of(cls, value: Iterable[CallRecord]) -> CallTable:
        """``value`` itself when it is a table, else a table of its records (the field's converter)."""
        return value if type(value) is CallTable else cls(*_fields_of(value))

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
        return CallTable(
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
        return CallTable(records, dict(self._index), self._size, pending, refused)

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
            return self is other or (self._size == len(other) and self.items == other.items)
        if isinstance(other, tuple):
            return self.items == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"CallTable({list(self)!r})"


def _fields_of(records: Iterable[CallRecord]) -> tuple[list[CallRecord], dict[str, int], int, int, int]:
    """Every field of the table of ``records``: a list of their own, the index and the counts."""
    items = list(records)
    index: dict[str, int] = {}
    for position, record in enumerate(items):
        index.setdefault(record.id, position)  # the first of a (forged) duplicate id wins, as before
    pending = sum(1 for r in items if r.status is CallStatus.PENDING)
    refused = sum(1 for r in items if r.denial_reason is DenialReason.LIMIT_EXCEEDED)
    return items, index, len(items), pending, refused


#: The calls of a turn that has none yet (one shared value: every version grows from it).
NO_CALLS = CallTable()


def call_table(value: Iterable[CallRecord]) -> CallTable:
    """`CallTable.of`, as a function (what `TurnState.calls` converts with)."""
    return CallTable.of(value)


_new_object = object.__new__
_set_field = object.__setattr__
