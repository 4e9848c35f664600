"""A session's journal: the lease it writes under, the appends (with compaction), and the two ways a session
gets one: `open_session` (a new id, or an existing journal verified and replayed) and `journal_into` (a session
that already exists, from its snapshot on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from trioloop.durable.journal import GENESIS, decode_entries
from trioloop.durable.journal_writer import JournalWriter
from trioloop.durable.replay import replay_journal
from trioloop.durable.store import JournalLease, JournalStore, StoredEntry
from trioloop.machine.document import TextDocumentKind
from trioloop.machine.limits import TurnLimits
from trioloop.machine.tools import RegisteredTool, ToolRegistry, create_tool_registry
from trioloop.protocol.provider import ChatProvider
from trioloop.runtime.journaling import ResumePoint, TurnJournal

if TYPE_CHECKING:
    from trioloop.runtime.session import Session

__all__ = ["SessionJournal", "SessionJournalError", "journal_into", "open_session"]

D = TypeVar("D")


class SessionJournalError(RuntimeError):
    """The session's journal could not be written. The turn was stopped at once (nothing runs that could not
    be recorded) and the session refuses new turns; reopening its journal resumes from what was recorded."""


class SessionJournal:
    """Where a session's turns are journaled: its lease on the store, and the `TurnJournal` the runner fills."""

    def __init__(self, lease: JournalLease, writer: JournalWriter, compact: bool) -> None:
        self.lease = lease
        self.compact = compact
        self.closed = False
        self.turns = TurnJournal(writer, self._append)

    async def _append(self, entries: Sequence[StoredEntry]) -> None:
        await self.lease.append(entries)
        if self.compact:
            snapshots = [e.seq for e in entries if e.data.startswith(b'{"seq":%d,"kind":"snapshot"' % e.seq)]
            if snapshots:
                await self.lease.discard_before(snapshots[-1])

    def add(self, kind: str, data: Mapping[str, Any]) -> None:
        """Journal a session-level entry (an undo, a redo, a resume) with the next append."""
        self.turns.writer.add(kind, data)

    def check(self) -> None:
        """`SessionJournalError` if an append failed (now or earlier)."""
        error = self.turns.error
        if error is not None:
            raise SessionJournalError(
                f"the session journal could not be written ({type(error).__name__}: {error}); "
                "reopen the session from its store"
            ) from error

    async def flush(self) -> None:
        """Append what the journal holds; `SessionJournalError` if the store failed (now or earlier)."""
        await self.turns.flush()
        self.check()

    async def close(self) -> None:
        """Write what is still held (unless an append already failed) and release the lease, once."""
        if self.closed:
            return
        self.closed = True
        with trio.CancelScope(shield=True):
            try:
                if self.turns.error is None:
                    await self.flush()  # a failure already reported is not raised again here
            finally:
                await self.lease.release()


async def open_session(
    cls: type[Session[D]],
    store: JournalStore,
    session_id: str,
    *,
    kind: TextDocumentKind[D],
    provider: ChatProvider,
    document: D | None,
    model: str | None,
    tools: ToolRegistry[D] | Iterable[RegisteredTool[D]],
    limits: TurnLimits,
    system_prompt: str | None,
    max_output_tokens: int,
    nursery: trio.Nursery | None,
    wait_s: float,
    compact: bool,
) -> Session[D]:
    """`Session.open`: take the lease, then start a new journal or verify and replay the one there."""
    registry = tools if isinstance(tools, ToolRegistry) else create_tool_registry(tools)
    options: dict[str, Any] = {
        "kind": kind,
        "provider": provider,
        "tools": registry,
        "limits": limits,
        "system_prompt": system_prompt,
        "max_output_tokens": max_output_tokens,
        "nursery": nursery,
    }
    lease = await store.acquire(session_id, wait_s=wait_s)
    try:
        stored = await lease.entries()
        if not stored:
            if document is None or model is None:
                raise ValueError(f"session {session_id!r} is new: pass document= and model= to start it")
            session = cls(document=document, model=model, **options)
            await _start(session, lease, compact)
            return session
        replayed = replay_journal(decode_entries(stored), load_document=kind.load, registry=registry)
        chosen = model if model is not None else replayed.model
        if chosen is None:
            raise ValueError("the journal names no model: pass model=")
        session = cls._restored(
            document=replayed.document,
            history=replayed.messages,
            undo=replayed.undo,
            turns_started=replayed.turn_count,
            last_turn_id=replayed.last_turn_id,
            model=chosen,
            **options,
        )
        resume = None
        live = replayed.live
        if live is not None:
            machine_ms = replayed.suspended_machine_ms
            resume = ResumePoint(
                state=live,
                machine_ms=replayed.advanced_machine_ms if machine_ms is None else machine_ms,
                review_waited_ms=replayed.suspended_review_ms or 0,
                card_digests=replayed.card_digests,
            )
        session._take_up(replayed.state, resume)
        writer = JournalWriter(last_seq=replayed.last_seq, last_hash=replayed.last_hash, dump_document=kind.dump)
        session._journal = SessionJournal(lease, writer, compact)
        return session
    except BaseException:
        with trio.CancelScope(shield=True):
            await lease.release()
        raise


async def journal_into(
    session: Session[Any], store: JournalStore, session_id: str, *, wait_s: float, compact: bool
) -> None:
    """`Session.journal_into`: a new journal under ``session_id`` whose first entry is the session's snapshot."""
    if session._journal is not None and not session._journal.closed:
        raise RuntimeError("this session is already journaled")
    if not isinstance(session.kind, TextDocumentKind):
        raise TypeError(f"the {session.kind.name} kind has no text form (dump/load), so it cannot be journaled")
    lease = await store.acquire(session_id, wait_s=wait_s)
    try:
        if await lease.last_seq() != 0:
            raise ValueError(f"session {session_id!r} already has a journal: open it with Session.open")
        await _start(session, lease, compact)
    except BaseException:
        session._journal = None
        with trio.CancelScope(shield=True):
            await lease.release()
        raise


async def _start(session: Session[Any], lease: JournalLease, compact: bool) -> None:
    """A new journal for ``session``: its first entry is the session as it stands."""
    kind = session.kind
    assert isinstance(kind, TextDocumentKind)
    journal = SessionJournal(lease, JournalWriter(last_seq=0, last_hash=GENESIS, dump_document=kind.dump), compact)
    session._journal = journal
    journal.turns.writer.snapshot(session.snapshot())
    await journal.flush()
