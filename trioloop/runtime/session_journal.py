"""A session's journal: the lease it writes under, the appends (signed, and compacted when asked), and how a
session gets one (`JournalOpening`): a new journal started from the session's snapshot, or an existing one verified
and replayed.
"""

from __future__ import annotations

import secrets
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, TypeAlias, TypeVar

import attrs
import trio

from trioloop.durable._store_thread import AppendsThen
from trioloop.durable.audit import verify_stored
from trioloop.durable.decision_box import DecisionBox
from trioloop.durable.document_form import DocumentCodec
from trioloop.durable.history import ForkOrigin
from trioloop.durable.journal import (
    GENESIS,
    JournalEntry,
    JournalIntegrity,
    decode_numbered,
    document_digest,
    entry_hash,
    journal_id_of,
    refuse_unsigned_tail,
)
from trioloop.durable.journal_writer import JournalWriter
from trioloop.durable.leases import LeaseLost
from trioloop.durable.replay import Replayed, replay_journal, replay_start, tools_used
from trioloop.durable.session_file import SessionSnapshot
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.durable.store import (
    JournalLease,
    JournalStore,
    JournalStoreError,
    StoredEntry,
    store_identity,
)
from trioloop.durable.witness import FileWitness, HeadWitness, WitnessedHead, check_witnessed, witness_name
from trioloop.machine.document import TextDocumentKind
from trioloop.machine.tools import ToolRegistry
from trioloop.machine.transaction import DocumentMatch, match_document
from trioloop.runtime.journaling import ResumePoint, TurnJournal

__all__ = [
    "DEFAULT_SIGNER",
    "DEFAULT_WITNESS",
    "DocumentMismatch",
    "JournalHandle",
    "JournalOpening",
    "SessionJournal",
    "SessionJournalError",
    "ToolsMissing",
    "resume_point",
]

#: ``signer=`` meaning the key named by ``TRIOLOOP_JOURNAL_KEY``, else the per-user key (`JournalSigner.default`).
DEFAULT_SIGNER: Final = "default"
Signer: TypeAlias = "JournalSigner | Literal['default'] | None"
#: ``witness=`` meaning a `FileWitness` under the user's config folder for a signed journal in a store that outlives
#: the process, else none.
DEFAULT_WITNESS: Final = "default"
Witness: TypeAlias = "HeadWitness | Literal['default'] | None"

D = TypeVar("D")
OTHER: Final = DocumentMatch.OTHER


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
    given) from another source, or (when ``document=`` was given for an existing session) with other content.
    Nothing of the session was taken up; ``recorded`` and ``given`` say what differs."""

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
        store: str = "",
    ) -> None:
        self.lease = lease
        self.witness = witness
        self.journal_id = journal_id
        self.store = store  # the store's identity: the witness keeps heads under it and the session id
        self.compact = compact
        self.closed = False
        # Reached weakly: the session journal and its turns' journal hold no reference cycle (see `SessionView`).
        self.turns = TurnJournal(
            writer, _weakly(self._append), getattr(lease, "check_held", None), getattr(lease, "epoch", None)
        )
        #: What opening proved of the journal (a new journal: what it will be).
        self.integrity = integrity
        #: Where this session was forked from (`Session.fork`), as its journal's snapshots record it; else None.
        self.forked_from: ForkOrigin | None = None
        self._snapshot = replay_from  # the newest snapshot's number
        self._replay_from = replay_from  # the snapshot the last turn started after: where replay starts
        self._discarded_to = replay_from
        #: The keys the session accepts (`JournalOpening.verifying`): a decision record must be signed by one.
        self.keys: JournalKeys | None = None
        #: The store's decision box, if it has one (`trioloop.runtime.remote_review`).
        self.box: DecisionBox | None = None

    async def _append(self, entries: Sequence[StoredEntry]) -> None:
        witness = self.witness
        if witness is None or not entries:
            await self.lease.append(entries)
        else:
            last = entries[-1]
            witnessed = WitnessedHead(
                journal=self.journal_id,
                session=self.lease.session_id,
                seq=last.seq,
                hash=entry_hash(last.data),
                store=self.store,
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


class JournalHandle:
    """The session's journal once it has one (``journal``; None before): what the session's parts write through."""

    def __init__(self) -> None:
        self.journal: SessionJournal | None = None


class JournalOpening:
    """A session's journal being opened: the lease taken, the key and witness chosen; then either a new journal
    started (`start`) or the one in the store verified and replayed (`read`, then `take_over`). Used as
    ``async with``: the lease is released if anything fails before a `SessionJournal` holds it."""

    def __init__(
        self,
        lease: JournalLease,
        session_id: str,
        key: JournalSigner | None,
        heads: HeadWitness | None,
        keys: JournalKeys | None,
        store: str,
    ) -> None:
        self.lease = lease
        self.session_id = session_id
        self.key = key
        self.heads = heads
        self.keys = keys
        self.store = store  # the store's identity (`store_identity`)
        #: The store's decision box, when it has one: where a reviewer's decisions made elsewhere wait.
        self.box: DecisionBox | None = None
        #: What the witness keeps this session's heads under: the store and the session, never the journal's say.
        self.name = witness_name(store, session_id)
        self.entries: list[JournalEntry] = []
        self.integrity: JournalIntegrity | None = None
        self.journal_id = ""
        #: Where a new journal `start` writes was forked from (`Session.fork`), if it is a fork's.
        self.forked_from: ForkOrigin | None = None

    @classmethod
    async def acquire(
        cls,
        store: JournalStore,
        session_id: str,
        *,
        signer: Signer,
        keys: JournalKeys | None,
        witness: Witness,
        wait_s: float,
    ) -> JournalOpening:
        """Choose the key and the witness, then take the session's lease (`SessionLocked` after ``wait_s``)."""
        key = await resolve_signer(signer, keys)
        heads = choose_witness(witness, key, store)
        lease = await store.acquire(session_id, wait_s=wait_s)
        opening = cls(lease, session_id, key, heads, keys, store_identity(store))
        opening.box = store if isinstance(store, DecisionBox) else None
        return opening

    async def __aenter__(self) -> JournalOpening:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            with trio.CancelScope(shield=True):
                await self.lease.release()

    @property
    def verifying(self) -> JournalKeys | None:
        """The keys this session accepts (its own and ``keys=``): what verifies its journal and a reviewer's
        decision record (`trioloop.durable.decisions`); None for an unsigned session, which accepts none."""
        key, keys = self.key, self.keys
        return None if key is None else key.keys if keys is None else key.keys | keys

    async def start(self, snapshot: SessionSnapshot[Any], kind: TextDocumentKind[Any], compact: bool) -> SessionJournal:
        """A new journal whose first entry is ``snapshot`` (the session as it stands), appended before it returns;
        a fork's (`forked_from` set) names, in it and every later snapshot, where the fork came from."""
        journal_id = secrets.token_hex(16)
        key = self.key
        writer = JournalWriter(
            last_seq=0,
            last_hash=GENESIS,
            codec=DocumentCodec.of(kind),
            session_id=self.session_id,
            signer=key,
            compact=compact,
            journal_id=journal_id,
            forked_from=None if self.forked_from is None else self.forked_from.to_json(),
        )
        integrity = JournalIntegrity(
            signed=key is not None,
            verified=key is not None,
            key_ids=frozenset() if key is None else frozenset({key.key_id}),
        )
        journal = SessionJournal(
            self.lease, writer, compact, integrity, witness=self.heads, journal_id=journal_id, store=self.store
        )
        journal.keys, journal.box, journal.forked_from = self.verifying, self.box, self.forked_from
        journal.turns.writer.snapshot(snapshot)
        await journal.flush()
        return journal

    async def read(
        self,
        *,
        kind: TextDocumentKind[D],
        registry: ToolRegistry[D],
        source: str | None,
        document: D | None = None,
    ) -> Replayed[D] | None:
        """The journal in the store, verified (numbering, chain, signatures, the witnessed head) and replayed; None
        for a new session. `ToolsMissing` if a journaled call's tool is not in ``registry``; `DocumentMismatch`
        for a journal of another kind, or (``source`` given) another source, or (``document`` given) of another
        document: one that is neither the replayed document nor the one before its latest change (the app
        stopped between a commit and its save: the session's is the newer)."""
        heads = self.heads
        witnessed = None if heads is None else await heads.last_head(self.name)
        verifying = self.verifying
        outline = getattr(self.lease, "outline", None)
        outlined = None
        if verifying is not None and outline is not None:  # judged by position and length before it is read
            outlined = await outline()
            refuse_unsigned_tail(outlined, session_id=self.session_id, keys=verifying)
        # No entry in the outline: none to read (the lease is held, so nobody appends meanwhile).
        stored = () if outlined is not None and not outlined else await self.lease.entries()
        if not stored:
            check_witnessed((), witnessed)  # an emptied session is refused: it never starts afresh unasked
            return None
        entries, self.integrity, self.journal_id = await verify_stored(
            stored, session_id=self.session_id, keys=verifying, signatures="newest", lazy=True
        )
        self.entries = entries
        if heads is not None:
            if witnessed is None:  # a head an earlier version kept under the journal's own id
                legacy = await heads.last_head(self.journal_id)
                if legacy is not None and not legacy.store and legacy.session == self.session_id:
                    witnessed = legacy
            check_witnessed(entries, witnessed, self.journal_id)
        missing = tools_used(entries) - set(registry.names)
        if missing:
            raise ToolsMissing(missing)
        load_data = DocumentCodec.of(kind).from_data
        verified = self.integrity.verified  # a settled last turn is replayed when first looked at
        replayed = replay_journal(
            entries, load_document=kind.load, registry=registry, load_data=load_data, defer_settled=verified
        )
        if replayed.kind not in (None, kind.name):
            raise DocumentMismatch("kind", replayed.kind, kind.name)
        if source is not None and replayed.source not in (None, source):
            raise DocumentMismatch("source", replayed.source, source)
        if document is not None and match_document(kind, document, replayed.document, replayed.undo) is OTHER:
            recorded, given = (document_digest(kind.dump(d))[:12] for d in (replayed.document, document))
            raise DocumentMismatch("content (SHA-256)", recorded, given)
        return replayed

    async def take_over(self, replayed: Replayed[Any], kind: TextDocumentKind[Any], compact: bool) -> SessionJournal:
        """The journal `read` replayed, written on from its last entry (witnessed from now on, if it was not)."""
        entries = self.entries
        origin = ForkOrigin.from_json(entries[0].data.get("forked_from")) if entries[0].kind == "snapshot" else None
        writer = JournalWriter(
            last_seq=replayed.last_seq,
            last_hash=replayed.last_hash,
            codec=DocumentCodec.of(kind),
            session_id=self.session_id,
            signer=self.key,
            compact=compact,
            last_seal=_last_seal(entries),
            journal_id=self.journal_id,
            forked_from=None if origin is None else origin.to_json(),
        )
        replay_from = entries[replay_start(entries)].seq
        journal = SessionJournal(
            self.lease, writer, compact, self.integrity, replay_from, self.heads, self.journal_id, self.store
        )
        journal.keys, journal.box, journal.forked_from = self.verifying, self.box, origin
        if self.heads is not None:  # a journal written before it had a witness is witnessed from now on
            last = entries[-1]
            await self.heads.witness(
                WitnessedHead(
                    journal=self.journal_id, session=self.session_id, seq=last.seq, hash=last.hash, store=self.store
                )
            )
        return journal

    async def retire(self) -> WitnessedHead | None:
        """Retire the session's journal: its head (or the head witnessed, for an emptied journal) is witnessed as
        retired, then its entries are erased, so a new journal may start under the session's id and the retired
        one never opens again. The head retired, or None when there was nothing (no journal, no witnessed head)."""
        witnessed = None if self.heads is None else await self.heads.last_head(self.name)
        stored = await self.lease.entries()
        retired: WitnessedHead | None = None
        if stored:
            first, last = decode_numbered(stored[0]), decode_numbered(stored[-1])
            retired = WitnessedHead(
                journal=journal_id_of([first], self.session_id),
                session=self.session_id,
                seq=last.seq,
                hash=last.hash,
                store=self.store,
                retired=True,
            )
        elif witnessed is not None:
            retired = attrs.evolve(witnessed, store=self.store, retired=True)
        if retired is not None and self.heads is not None:
            await self.heads.witness(retired)
        if stored:
            erase = getattr(self.lease, "erase", None)
            if erase is None:
                raise ValueError(
                    f"this store cannot erase session {self.session_id!r}'s entries: delete them there, then retire "
                    "it again"
                )
            await erase()
        return retired


def resume_point(replayed: Replayed[Any]) -> ResumePoint | None:
    """The live turn a replayed journal left (suspended in review, or cut short by a crash), if any."""
    live = replayed.live
    if live is None:
        return None
    machine_ms = replayed.suspended_machine_ms
    return ResumePoint(
        state=live,
        machine_ms=replayed.advanced_machine_ms if machine_ms is None else machine_ms,
        review_waited_ms=replayed.suspended_review_ms or 0,
        card_digests=replayed.card_digests,
    )


async def resolve_signer(signer: Signer, keys: JournalKeys | None) -> JournalSigner | None:
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


def choose_witness(witness: Witness, key: JournalSigner | None, store: JournalStore) -> HeadWitness | None:
    """The witness asked for; by default a `FileWitness` for a signed journal in a store that outlives the
    process (a journal in memory ends with it: there is nothing to witness it against)."""
    if witness == DEFAULT_WITNESS:
        return FileWitness(signer=key) if key is not None and getattr(store, "outlives_process", True) else None
    if witness is not None and not isinstance(witness, HeadWitness):
        raise TypeError(f"witness= is a HeadWitness, None or {DEFAULT_WITNESS!r}, not {witness!r}")
    return witness


def _last_seal(entries: Sequence[JournalEntry]) -> bytes | None:
    """The last entry's bytes when it is a seal (a snapshot written next names it)."""
    last = entries[-1]
    return last.raw if last.kind == "seal" else None


_Append: TypeAlias = Callable[[Sequence[StoredEntry]], Awaitable[None]]


def _weakly(append: _Append) -> _Append:
    """``append`` (a bound method) called through a weak reference to its object: `JournalStoreError` once it is
    gone."""
    method = weakref.WeakMethod(append)

    async def call(entries: Sequence[StoredEntry]) -> None:
        bound = method()
        if bound is None:
            raise JournalStoreError("the session's journal is gone")
        await bound(entries)

    return call
