"""Where a session's journal lives: the small protocol the core calls out through, and a store in memory.

The core never does storage I/O itself: `Session` hands numbered, already-encoded entries to a
`JournalStore` and reads them back. A store knows nothing of what an entry means; it keeps, per session id,
an ordered run of ``(seq, bytes)`` with three promises:

- **Numbered appends.** `JournalLease.append` writes a batch atomically (all or nothing), and only when its
  first ``seq`` is exactly one past the last stored one (1 for an empty journal) and the batch counts up by
  one. Anything else raises `JournalConflict` and writes nothing: a stale writer (one that lost its lease, or
  a second process that never had it) cannot fork a journal, and nothing already stored is lost.
- **An unknown outcome is possible.** `JournalStoreError` from ``append`` (a connection lost during the
  commit) does not say whether the batch was written: read `JournalLease.last_seq` before writing again.
  A lease also ends when the store loses it (a PostgreSQL connection that dropped): its calls then raise.
- **Durable when it returns.** Once ``append`` returns, the entries survive a crash of the process (and, for
  the stores that promise it, of the machine): the session publishes a decision's effect only after that.
- **One driver per session.** `JournalStore.acquire` grants a lease; while it is held no other lease on the
  same session id is granted, in this process or another (`SessionLocked`, or a wait up to ``wait_s``). A
  lease ends with `JournalLease.release` or with its process (a killed process never leaves a session locked
  for longer than the store documents).
- **Fenced.** Each lease has an ``epoch`` larger than every earlier lease's on the session. The SQL stores'
  leases also have a time to live their holder renews (`JournalLease.renew`; the session does it while it is
  open): a frozen holder loses its lease, and its appends then raise `LeaseLost` (the epoch is checked in the
  append's own transaction). `JournalLease.check_held` asks the holder's clock (no I/O) right before a tool
  starts.

Stores run their blocking calls in worker threads under a limiter of their own, never on the event loop.
`MemoryJournalStore` keeps everything in the process: for tests, and for an app that wants the journal's
audit trail without persistence.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Sequence
from types import TracebackType
from typing import Protocol, final, runtime_checkable

import attrs
import trio

from trioloop.durable.decision_box import MemoryDecisions

__all__ = [
    "JournalConflict",
    "JournalLease",
    "JournalStore",
    "JournalStoreError",
    "MemoryJournalStore",
    "SessionLocked",
    "StoredEntry",
    "check_batch",
    "outline_of",
    "store_identity",
]


class JournalStoreError(Exception):
    """A store could not do what was asked (I/O failed, the database went away); the message says why."""


class JournalConflict(JournalStoreError):
    """An append whose numbering does not continue the stored journal: nothing was written."""


class SessionLocked(JournalStoreError):
    """Another lease (in this process or another) drives this session; try again once it is released."""


@final
@attrs.frozen
class StoredEntry:
    """One journal entry as a store keeps it: its number (1, 2, ...) and its encoded bytes."""

    seq: int
    data: bytes


def outline_of(entries: Sequence[StoredEntry], short: int = 4096) -> tuple[tuple[int, int, bytes | None], ...]:
    """Entries as an outline: (number, length, bytes when at most ``short`` long), what a journal's tail is judged
    by before the rest is read (a store that can, reads only that much)."""
    return tuple((e.seq, len(e.data), e.data if len(e.data) <= short else None) for e in entries)


def store_identity(store: object) -> str:
    """Which store ``store`` is, as a witness names it (`witness_name`): its ``identity`` when it has one (the
    stores here do: a SQLite file's real path, a PostgreSQL server and database), else its class."""
    identity = getattr(store, "identity", None)
    if isinstance(identity, str) and identity:
        return identity
    return f"{type(store).__module__}.{type(store).__qualname__}"


def check_batch(last_seq: int, entries: Sequence[StoredEntry]) -> None:
    """Refuse (`JournalConflict`) a batch that does not continue a journal whose last entry is ``last_seq``.

    Every store calls this (inside its own transaction, against the last number it really holds), so all of
    them refuse the same batches.
    """
    expected = last_seq + 1
    for entry in entries:
        if type(entry.seq) is not int or entry.seq != expected:
            raise JournalConflict(
                f"journal entry {entry.seq!r} does not follow entry {expected - 1}: another writer appended first"
            )
        if not isinstance(entry.data, bytes):
            raise TypeError("a journal entry's data is bytes")
        expected += 1


@runtime_checkable
class JournalLease(Protocol):
    """The right to drive one session's journal, until `release` (or the end of ``async with``)."""

    @property
    def session_id(self) -> str: ...

    @property
    def epoch(self) -> int:
        """The fencing epoch: larger than every earlier lease's on this session (a token for external systems)."""
        ...

    async def renew(self) -> None:
        """Keep the lease alive for its time to live; raises (`LeaseLost`) when it is no longer this holder's."""
        ...

    def check_held(self) -> None:
        """Raise (`LeaseLost`) when the lease may have run out, by the holder's own clock (no I/O)."""
        ...

    async def entries(self, *, after: int = 0) -> Sequence[StoredEntry]:
        """The stored entries with ``seq > after``, in order."""
        ...

    async def last_seq(self) -> int:
        """The number of the last stored entry (0 when there is none)."""
        ...

    async def append(self, entries: Sequence[StoredEntry]) -> None:
        """Store ``entries`` durably, all or nothing; `JournalConflict` if they do not continue the journal."""
        ...

    async def discard_before(self, seq: int) -> None:
        """Drop the entries numbered below ``seq`` (compaction: the entry at ``seq`` is a snapshot). The last
        entry is always kept, so the numbering goes on and a stale writer still cannot start over at 1."""
        ...

    async def release(self) -> None: ...

    async def __aenter__(self) -> JournalLease: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@runtime_checkable
class JournalStore(Protocol):
    """Journals by session id; see the module docstring for what every store promises."""

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> JournalLease:
        """A lease on ``session_id`` (created empty if new); `SessionLocked` if another holds it past ``wait_s``."""
        ...

    async def session_ids(self) -> Sequence[str]:
        """The ids of every session with a journal, sorted."""
        ...

    async def read(self, session_id: str) -> Sequence[StoredEntry]:
        """Every stored entry of ``session_id``, in order, without a lease (an auditor reads a session that
        another process may be driving: it sees every entry appended before the read)."""
        ...


class _MemoryLease:
    """A lease on one journal of a `MemoryJournalStore`: given the journal's list (which it alone changes while it
    holds the session), whether appends are to fail, and what hands the session back to its store."""

    def __init__(
        self,
        session_id: str,
        epoch: int,
        journal: list[StoredEntry],
        *,
        failing: Callable[[], bool],
        free: Callable[[], None],
    ) -> None:
        self._session_id = session_id
        self._epoch = epoch
        self._entries = journal
        self._failing = failing
        self._free = free
        self._released = False

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def epoch(self) -> int:
        return self._epoch

    async def renew(self) -> None:  # nothing outside this process can take a memory lease over
        self._journal()
        await trio.lowlevel.checkpoint()

    def check_held(self) -> None:
        self._journal()

    def _journal(self) -> list[StoredEntry]:
        if self._released:
            raise JournalStoreError("this lease was released")
        return self._entries

    async def entries(self, *, after: int = 0) -> Sequence[StoredEntry]:
        await trio.lowlevel.checkpoint()
        return tuple(e for e in self._journal() if e.seq > after)

    async def last_seq(self) -> int:
        await trio.lowlevel.checkpoint()
        journal = self._journal()
        return journal[-1].seq if journal else 0

    async def append(self, entries: Sequence[StoredEntry]) -> None:
        await trio.lowlevel.checkpoint()
        journal = self._journal()
        check_batch(journal[-1].seq if journal else 0, entries)
        if self._failing():
            raise JournalStoreError("the memory store was told to fail appends")
        journal.extend(entries)

    async def outline(self, *, after: int = 0) -> Sequence[tuple[int, int, bytes | None]]:
        await trio.lowlevel.checkpoint()
        return outline_of([e for e in self._journal() if e.seq > after])

    async def discard_before(self, seq: int) -> None:
        await trio.lowlevel.checkpoint()
        journal = self._journal()
        if journal:
            keep_from = min(seq, journal[-1].seq)
            journal[:] = [e for e in journal if e.seq >= keep_from]

    async def erase(self) -> None:
        """Delete every entry of the session (`Session.retire`)."""
        await trio.lowlevel.checkpoint()
        self._journal().clear()

    async def release(self) -> None:
        if not self._released:
            self._released = True
            self._free()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> _MemoryLease:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with trio.CancelScope(shield=True):
            await self.release()


_TURN_MARK = re.compile(rb'^\{"seq":\d+,"kind":"(submit|resume|suspend|snapshot)"')


class MemoryJournalStore(MemoryDecisions):
    """Journals in this process's memory (lost with it): tests, and an audit trail without persistence.

    ``fail_appends`` makes every append raise `JournalStoreError`, as a failing disk would.
    """

    #: Its journals end with the process, so nothing outside it need witness their heads.
    outlives_process = False

    @property
    def identity(self) -> str:
        """Which store this is, for a witness: this object (a memory store is witnessed only if asked)."""
        return f"memory:{id(self):x}"

    def __init__(self) -> None:
        self._journals: dict[str, list[StoredEntry]] = {}
        self._leased: set[str] = set()
        self._epochs: dict[str, int] = {}
        self._freed = trio.lowlevel.ParkingLot()
        self.fail_appends = False

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> JournalLease:
        """A lease on ``session_id`` (created empty if new); `SessionLocked` if another lease holds it past
        ``wait_s``."""
        await trio.lowlevel.checkpoint()
        with trio.move_on_after(wait_s):
            while session_id in self._leased:
                await self._freed.park()
        if session_id in self._leased:  # checked and taken with no checkpoint in between
            raise SessionLocked(f"session {session_id!r} is driven by another lease")
        self._leased.add(session_id)
        journal = self._journals.setdefault(session_id, [])
        self._epochs[session_id] = epoch = self._epochs.get(session_id, 0) + 1
        return _MemoryLease(
            session_id, epoch, journal, failing=self._failing, free=functools.partial(self._free, session_id)
        )

    def _failing(self) -> bool:
        return self.fail_appends

    def _free(self, session_id: str) -> None:
        """A lease on ``session_id`` ended: another may be granted (a waiting `acquire` looks again)."""
        self._leased.discard(session_id)
        self._freed.unpark_all()

    async def session_ids(self) -> Sequence[str]:
        """The ids of every session with a journal, sorted."""
        await trio.lowlevel.checkpoint()
        return sorted(k for k, v in self._journals.items() if v)

    async def heads(self, only: Collection[str] | None = None) -> dict[str, int]:
        """Every session with a journal (or those of ``only`` that have one) and the number of its last entry."""
        await trio.lowlevel.checkpoint()
        return {k: v[-1].seq for k, v in self._journals.items() if v and (only is None or k in only)}

    async def turn_marks(self, only: Collection[str] | None = None) -> dict[str, tuple[int, str]]:
        """Each session's last entry that says where its last turn stands (as `SqlJournals.turn_marks`)."""
        await trio.lowlevel.checkpoint()
        found = {}
        for session_id, entries in self._journals.items():
            if only is not None and session_id not in only:
                continue
            for entry in reversed(entries):
                kind = _TURN_MARK.match(entry.data[:48])
                if kind is not None:
                    found[session_id] = (entry.seq, kind.group(1).decode())
                    break
        return found

    async def read(self, session_id: str) -> Sequence[StoredEntry]:
        """Every stored entry of ``session_id``, in order, without a lease."""
        await trio.lowlevel.checkpoint()
        return tuple(self._journals.get(session_id, ()))

    async def outline(self, session_id: str) -> Sequence[tuple[int, int, bytes | None]]:
        """Every entry of ``session_id`` as an outline (`outline_of`), without a lease."""
        await trio.lowlevel.checkpoint()
        return outline_of(self._journals.get(session_id, ()))
