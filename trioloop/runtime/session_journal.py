"""A session's journal: the lease it writes under, the appends (signed, and compacted when asked), and the two
ways a session gets one: `open_session` (a new id, or an existing journal verified and replayed) and
`journal_into` (a session that already exists, from its snapshot on).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypeVar

import trio

from trioloop.durable._store_thread import AppendsThen
from trioloop.durable.journal import (
    GENESIS,
    JournalEntry,
    JournalIntegrity,
    decode_entries,
    entry_hash,
    journal_id_of,
    verify_journal,
)
from trioloop.durable.journal_writer import JournalWriter
from trioloop.durable.leases import LeaseLost
from trioloop.durable.replay import replay_journal, replay_start, tools_used
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.durable.store import JournalLease, JournalStore, JournalStoreError, StoredEntry
from trioloop.durable.witness import FileWitness, HeadWitness, WitnessedHead, check_witnessed
from trioloop.machine.document import TextDocumentKind
from trioloop.machine.limits import TurnLimits
from trioloop.machine.tools import RegisteredTool, ToolRegistry, create_tool_registry
from trioloop.protocol.provider import ChatProvider
from trioloop.runtime.journaling import ResumePoint, TurnJournal

if TYPE_CHECKING:
    from trioloop.runtime.session import Session

__all__ = [
    "DEFAULT_SIGNER",
    "DEFAULT_WITNESS",
    "DocumentMismatch",
    "SessionJournal",
    "SessionJournalError",
    "ToolsMissing",
    "journal_into",
    "open_session",
]

#: ``signer=`` meaning the key named by ``TRIOLOOP_JOURNAL_KEY``, else the per-user key (`JournalSigner.default`).
DEFAULT_SIGNER: Final = "default"
Signer: TypeAlias = "JournalSigner | Literal['default'] | None"
#: ``witness=`` meaning a `FileWitness` under the user's config folder for a signed journal in a store that outlives
#: the process, else none.
DEFAULT_WITNESS: Final = "default"
Witness: TypeAlias = "HeadWitness | Literal['default'] | None"

D = TypeVar("D")


class SessionJournalError(RuntimeError):
    """The session's journal could not be written. The turn was stopped at once (nothing runs that could not
    be recorded) and the session refuses new turns; reopening its journal resumes from what was recorded."""


class ToolsMissing(ValueError):
    """`Session.open` was not given every tool the journal's calls used: replaying without one would record a
    call that had run as failed. ``names`` lists them."""

    def __init__(self, names: frozenset[str]) -> None:
        listed = ", ".join(sorted(names))
        super().__init__(f"the journal's calls used tools this session was not given: {listed} (pass them in tools=)")
        self.names = names


class DocumentMismatch(ValueError):
    """`Session.open` found a journal recorded for another document: of another kind, or (when ``source=`` was
    given) from another source. Nothing was replayed; ``recorded`` and ``given`` say what differs."""

    def __init__(self, what: str, recorded: str, given: str) -> None:
        super().__init__(f"the journal's document {what} is {recorded!r}, not {given!r}")
        self.what, self.recorded, self.given = what, recorded, given


class SessionJournal:
    """Where a session's turns are journaled: its lease on the store, and the `TurnJournal` the runner fills.

    With ``compact``, once an append holds a snapshot the entries before the replay point go: the snapshot
    before the last turn, so that turn (and `Session.state`) comes back on reopening, as it does uncompacted."""

    def __init__(
        self,
        lease: JournalLease,
        writer: JournalWriter,
        compact: bool,
        integrity: JournalIntegrity | None = None,
        replay_from: int = 1,
        witness: HeadWitness | None = None,
        journal_id: str = "",
    ) -> None:
        self.lease = lease
        self.witness = witness
        self.journal_id = journal_id
        self.compact = compact
        self.closed = False
        self.turns = TurnJournal(
            writer, self._append, getattr(lease, "check_held", None), getattr(lease, "epoch", None)
        )
        #: What opening proved of the journal (a new journal: what it will be).
        self.integrity = integrity
        self._snapshot = replay_from  # the newest snapshot's number
        self._replay_from = replay_from  # the snapshot the last turn started after: where replay starts
        self._discarded_to = replay_from

    async def _append(self, entries: Sequence[StoredEntry]) -> None:
        witness = self.witness
        if witness is None or not entries:
            await self.lease.append(entries)
        else:
            last = entries[-1]
            witnessed = WitnessedHead(
                journal=self.journal_id, session=self.lease.session_id, seq=last.seq, hash=entry_hash(last.data)
            )
            if isinstance(self.lease, AppendsThen) and isinstance(witness, FileWitness):
                # One hand-over to the store's thread for both: the witness is written there once the append is durable.
                await self.lease.append_then(entries, partial(witness.witness_now, witnessed))
            else:
                await self.lease.append(entries)
                await witness.witness(witnessed)
        if not self.compact:
            return
        for entry in entries:
            head = entry.data[:48]
            if head.startswith(b'{"seq":%d,"kind":"snapshot"' % entry.seq):
                self._snapshot = entry.seq
            elif head.startswith(b'{"seq":%d,"kind":"submit"' % entry.seq):
                self._replay_from = self._snapshot
        if self._replay_from > self._discarded_to:
            await self.lease.discard_before(self._replay_from)
            self._discarded_to = self._replay_from

    async def keep_alive(self) -> None:
        """Renew the lease a few times per time to live while the session is open (a store whose leases do not
        expire has nothing to renew). A lease found lost, or not renewed before it may have run out, fails the
        journal: the turn stops at its next append or tool start, and the session refuses new turns."""
        every = getattr(self.lease, "renew_every_s", None)
        if every is None:
            return
        while not self.closed:
            await trio.sleep(every)
            if self.closed:
                return
            try:
                await self.lease.renew()
            except LeaseLost as exc:
                self.turns.fail(exc)
                return
            except JournalStoreError:
                pass  # the store did not answer this time; the holder's clock decides below
            try:
                self.lease.check_held()
            except LeaseLost as exc:
                self.turns.fail(exc)
                return

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
    signer: Signer,
    keys: JournalKeys | None,
    witness: Witness,
    source: str | None,
) -> Session[D]:
    """`Session.open`: take the lease, then start a new journal or verify and replay the one there."""
    key = await _resolve(signer, keys)
    heads = _witness(witness, key, store)
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
            session = cls(document=document, model=model, source=source, **options)
            await _start(session, lease, compact, session_id, key, heads)
            return session
        verifying = None if key is None else key.keys if keys is None else key.keys | keys
        entries, integrity, journal_id = await _verified(stored, session_id, verifying)
        if heads is not None:
            check_witnessed(entries, await heads.last_head(journal_id))
        missing = tools_used(entries) - set(registry.names)
        if missing:
            raise ToolsMissing(missing)
        replayed = replay_journal(entries, load_document=kind.load, registry=registry)
        if replayed.kind not in (None, kind.name):
            raise DocumentMismatch("kind", replayed.kind, kind.name)
        if source is not None and replayed.source not in (None, source):
            raise DocumentMismatch("source", replayed.source, source)
        chosen = model if model is not None else replayed.model
        if chosen is None:
            raise ValueError("the journal names no model: pass model=")
        session = cls._restored(
            document=replayed.document,
            history=replayed.messages,
            undo=replayed.undo,
            turns_started=replayed.turn_count,
            last_turn_id=replayed.last_turn_id,
            usage=replayed.usage,
            model=chosen,
            source=replayed.source if replayed.source is not None else source,
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
        writer = JournalWriter(
            last_seq=replayed.last_seq,
            last_hash=replayed.last_hash,
            dump_document=kind.dump,
            session_id=session_id,
            signer=key,
            compact=compact,
            last_seal=_last_seal(entries),
            journal_id=journal_id,
        )
        replay_from = entries[replay_start(entries)].seq
        _attach(session, SessionJournal(lease, writer, compact, integrity, replay_from, heads, journal_id))
        if heads is not None:  # a journal written before it had a witness is witnessed from now on
            last = entries[-1]
            await heads.witness(WitnessedHead(journal=journal_id, session=session_id, seq=last.seq, hash=last.hash))
        return session
    except BaseException:
        with trio.CancelScope(shield=True):
            await lease.release()
        raise


async def journal_into(
    session: Session[Any],
    store: JournalStore,
    session_id: str,
    *,
    wait_s: float,
    compact: bool,
    signer: Signer = DEFAULT_SIGNER,
    witness: Witness = DEFAULT_WITNESS,
) -> None:
    """`Session.journal_into`: a new journal under ``session_id`` whose first entry is the session's snapshot."""
    if session._journal is not None and not session._journal.closed:
        raise RuntimeError("this session is already journaled")
    if not isinstance(session.kind, TextDocumentKind):
        raise TypeError(f"the {session.kind.name} kind has no text form (dump/load), so it cannot be journaled")
    key = await _resolve(signer, None)
    heads = _witness(witness, key, store)
    lease = await store.acquire(session_id, wait_s=wait_s)
    try:
        if await lease.last_seq() != 0:
            raise ValueError(f"session {session_id!r} already has a journal: open it with Session.open")
        await _start(session, lease, compact, session_id, key, heads)
    except BaseException:
        session._journal = None
        with trio.CancelScope(shield=True):
            await lease.release()
        raise


async def _start(
    session: Session[Any],
    lease: JournalLease,
    compact: bool,
    session_id: str,
    key: JournalSigner | None,
    heads: HeadWitness | None,
) -> None:
    """A new journal for ``session``: its first entry is the session as it stands."""
    kind = session.kind
    assert isinstance(kind, TextDocumentKind)
    journal_id = secrets.token_hex(16)
    writer = JournalWriter(
        last_seq=0,
        last_hash=GENESIS,
        dump_document=kind.dump,
        session_id=session_id,
        signer=key,
        compact=compact,
        journal_id=journal_id,
    )
    integrity = JournalIntegrity(
        signed=key is not None,
        verified=key is not None,
        key_ids=frozenset() if key is None else frozenset({key.key_id}),
    )
    journal = SessionJournal(lease, writer, compact, integrity, witness=heads, journal_id=journal_id)
    _attach(session, journal)
    journal.turns.writer.snapshot(session.snapshot())
    await journal.flush()


def _attach(session: Session[Any], journal: SessionJournal) -> None:
    """``journal`` is the session's; its lease is renewed in the session's nursery while there is one (else
    from when the session is entered)."""
    session._journal = journal
    if session._nursery is not None:
        session._nursery.start_soon(journal.keep_alive, name="trioloop lease renewal")


async def _resolve(signer: Signer, keys: JournalKeys | None) -> JournalSigner | None:
    """The key that signs (None: unsigned, as asked); the default one is read (or made) in a worker thread."""
    if signer is None:
        if keys is not None:
            raise ValueError(
                "keys= verifies a signed journal, which this session would go on writing unsigned: pass signer= too"
            )
        return None
    if signer == DEFAULT_SIGNER:
        return await trio.to_thread.run_sync(JournalSigner.default)
    if not isinstance(signer, JournalSigner):
        raise TypeError(f"signer= is a JournalSigner, None (unsigned) or {DEFAULT_SIGNER!r}, not {signer!r}")
    return signer


#: A journal this long (its entries' bytes) is decoded and verified in a worker thread: the work is CPU (about
#: 0.2 ms per KiB), and on the event loop it would hold every other task (and their deadlines) meanwhile.
VERIFY_IN_THREAD_BYTES: Final = 32 * 1024


async def _verified(
    stored: Sequence[StoredEntry], session_id: str, keys: JournalKeys | None
) -> tuple[list[JournalEntry], JournalIntegrity, str]:
    """The stored entries decoded and verified, what verifying proved, and the journal's id."""

    def verify() -> tuple[list[JournalEntry], JournalIntegrity, str]:
        entries = decode_entries(stored)
        integrity = verify_journal(entries, session_id=session_id, keys=keys)
        return entries, integrity, journal_id_of(entries, session_id)

    if sum(len(entry.data) for entry in stored) < VERIFY_IN_THREAD_BYTES:
        await trio.lowlevel.checkpoint()
        return verify()
    return await trio.to_thread.run_sync(verify)


def _witness(witness: Witness, key: JournalSigner | None, store: JournalStore) -> HeadWitness | None:
    """The witness asked for; by default a `FileWitness` for a signed journal in a store that outlives the
    process (a journal in memory ends with it: there is nothing to witness it against)."""
    if witness == DEFAULT_WITNESS:
        return FileWitness() if key is not None and getattr(store, "outlives_process", True) else None
    if witness is not None and not isinstance(witness, HeadWitness):
        raise TypeError(f"witness= is a HeadWitness, None or {DEFAULT_WITNESS!r}, not {witness!r}")
    return witness


def _last_seal(entries: Sequence[JournalEntry]) -> bytes | None:
    """The last entry's bytes when it is a seal (a snapshot written next names it)."""
    last = entries[-1]
    return last.raw if last.kind == "seal" else None
