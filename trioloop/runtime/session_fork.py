"""A journaled session's past: its settled turns (`Session.settled_turns`) and new sessions started from the state after
any of them (`Session.fork`), each with a journal of its own whose snapshots name where it came from.

`SessionForks` is the part of `Session` that continues a session from elsewhere: it restores a saved or journaled
session's state into a new one (`_restore`, `_attach`, which `Session.open`, `Session.resume` and
`Session.journal_into` use too) and reads another session's journal, without its lease, verified as `Session.open`
and ``trioloop audit`` verify it (`trioloop.durable.audit.verified_journal`), then folded turn by turn
(`trioloop.durable.history`). A fork writes nothing into its source: only the new session's journal is written.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Literal, Self, TypeVar

import trio

from trioloop.durable.audit import verified_journal
from trioloop.durable.document_form import DocumentCodec
from trioloop.durable.history import ForkError, ForkOrigin, JournalPoint, SettledTurn, journal_points, snapshot_at
from trioloop.durable.journal import JournalError, journal_id_of
from trioloop.durable.replay import tools_used
from trioloop.durable.session_file import SessionSnapshot
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.durable.store import JournalStore
from trioloop.durable.witness import HeadWitness, check_witnessed
from trioloop.machine.document import TextDocumentKind
from trioloop.machine.limits import DEFAULT_TURN_LIMITS, SpendLimits, TurnLimits
from trioloop.machine.prices import ModelPrice
from trioloop.machine.rules import ApprovalRule
from trioloop.machine.state import TurnState
from trioloop.machine.tools import RegisteredTool, ToolRegistry, create_tool_registry
from trioloop.machine.transaction import UndoHistory
from trioloop.protocol.events import Usage
from trioloop.protocol.provider import ChatProvider
from trioloop.runtime.journaling import ResumePoint
from trioloop.runtime.session_journal import (
    DEFAULT_SIGNER,
    DEFAULT_WITNESS,
    DocumentMismatch,
    JournalOpening,
    SessionJournal,
    ToolsMissing,
    choose_witness,
    resolve_signer,
)
from trioloop.runtime.session_view import SessionView

__all__ = ["ForkError", "ForkOrigin", "SessionForks", "SettledTurn", "fork_point", "read_points"]

D = TypeVar("D")
Signer = JournalSigner | Literal["default"] | None
Witness = HeadWitness | Literal["default"] | None


class SessionForks(SessionView[D]):
    """How a session continues another's state: restored from a saved or journaled session, or forked from a
    settled turn of a journaled one (`Session` is the class an app uses)."""

    @classmethod
    def _continued(cls, snapshot: SessionSnapshot[D], kept_rules: tuple[ApprovalRule, ...], **options: Any) -> Self:
        """A new session that continues ``snapshot`` (a saved session file, or a journal's state after a settled
        turn): its conversation and document, then its undo history, turn numbering, tokens and the session rules
        ``kept_rules``. ``options`` are the constructor's others (model, source, kind, provider, ...)."""
        session = cls(document=snapshot.document, history=snapshot.messages, **options)
        session._restore(
            snapshot.undo_history(), snapshot.turns_started(), snapshot.last_turn_id, snapshot.usage, rules=kept_rules
        )
        return session

    def _restore(
        self,
        undo: UndoHistory[D],
        turns_started: int,
        last_turn_id: str | None,
        usage: Usage,
        *,
        state: TurnState | None = None,
        resume: ResumePoint | None = None,
        journal: SessionJournal | None = None,
        rules: tuple[ApprovalRule, ...] = (),
        settled: Callable[[], TurnState | None] | None = None,
    ) -> None:
        """This new session continues a saved or journaled one: its undo history, turn numbering and tokens, and
        (from a journal) its last state (or ``settled``, what folds it when it is first read), the live turn it
        left, and the journal itself."""
        self._workspace.undo = undo
        self._turns.restore(started=turns_started, last_turn_id=last_turn_id, usage=usage, rules=rules)
        self._publisher.state = state
        if settled is not None:
            self._publisher.state_later(partial(_last_state, settled))
        if resume is not None:
            self._turns.take_up(resume)
        if journal is not None:
            self._attach(journal)

    def _attach(self, journal: SessionJournal) -> None:
        """``journal`` is this session's; its lease is renewed in the session's nursery while there is one (else
        from when the session is entered), and decisions made elsewhere are listened for."""
        self._journal.journal = journal
        if self._nursery is not None:
            self._nursery.start_soon(journal.keep_alive, name="trioloop lease renewal")
            self._listen_for_decisions()

    @property
    def forked_from(self) -> ForkOrigin | None:
        """Where this session was forked from (`fork`): the source session and journal, and the entry and chained
        head after which its state was the source's, as its journal records them; None for any other session."""
        journal = self._journal.journal
        return None if journal is None else journal.forked_from

    @classmethod
    async def settled_turns(
        cls,
        store: JournalStore,
        session_id: str,
        *,
        kind: TextDocumentKind[D],
        tools: ToolRegistry[D] | Iterable[RegisteredTool[D]] = (),
        signer: Signer = DEFAULT_SIGNER,
        keys: JournalKeys | None = None,
        witness: Witness = DEFAULT_WITNESS,
    ) -> tuple[SettledTurn, ...]:
        """The settled turns of ``session_id``'s journal in ``store``, oldest first: each a point `fork` can start a
        new session from. The journal is read without its lease (a running session can be listed: its live turn is
        not listed) and verified first as `open` verifies it (`JournalError` naming the first entry that does not
        hold); ``kind``, ``tools`` (`ToolsMissing`), ``signer``, ``keys`` and ``witness`` as in `open`. A compacted
        journal lists the turns it still holds. `ForkError` when the session has no journal."""
        registry = tools if isinstance(tools, ToolRegistry) else create_tool_registry(tools)
        points = await read_points(store, session_id, kind, registry, signer=signer, keys=keys, witness=witness)
        return tuple(point.turn for point in points if point.turn is not None)

    @classmethod
    async def fork(
        cls,
        store: JournalStore,
        session_id: str,
        *,
        after: SettledTurn | str | None,
        kind: TextDocumentKind[D],
        provider: ChatProvider | Sequence[ChatProvider],
        new_session_id: str | None = None,
        model: str | None = None,
        tools: ToolRegistry[D] | Iterable[RegisteredTool[D]] = (),
        limits: TurnLimits = DEFAULT_TURN_LIMITS,
        system_prompt: str | None = None,
        max_output_tokens: int = 4096,
        nursery: trio.Nursery | None = None,
        wait_s: float = 0.0,
        compact: bool = False,
        signer: Signer = DEFAULT_SIGNER,
        keys: JournalKeys | None = None,
        witness: Witness = DEFAULT_WITNESS,
        source: str | None = None,
        session_limits: SpendLimits | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
        rules: Iterable[ApprovalRule] = (),
    ) -> Self:
        """A new session, journaled in ``store`` under ``new_session_id`` (by default a fresh id,
        ``<session_id>.fork-<hex>``), that starts from ``session_id``'s state once the turn ``after`` settled: a
        `SettledTurn` from `settled_turns`, a turn id, or None for the state its journal starts from (before its first
        turn). Its conversation, document, undo history (that turn can be undone), approval rules, turn numbering and
        tokens are the source's then; no live turn, grant or pending card comes along, since only settled turns are
        fork points (`ForkError` for any other: unknown, compacted away, suspended in review, cut short).

        The source is read without its lease and verified first as `open` verifies it (`JournalError`: a forged,
        edited, cut or transplanted entry refuses the fork); nothing is written into it. The new journal's first
        entry, a snapshot signed like any, names where it came from (`forked_from`: the source session, journal,
        entry and chained head). The other options are `open`'s (``source`` defaults to the source's); `ForkError`
        when ``new_session_id`` already has a journal, `SessionLocked` while another lease holds it."""
        registry = tools if isinstance(tools, ToolRegistry) else create_tool_registry(tools)
        points = await read_points(store, session_id, kind, registry, signer=signer, keys=keys, witness=witness)
        point = fork_point(points, after, session_id)
        snapshot = snapshot_at(point.replayed)
        chosen = model if model is not None else snapshot.model
        if chosen is None:
            raise ValueError("the journal names no model: pass model=")
        session = cls._continued(
            snapshot,
            snapshot.rules,
            kind=kind,
            provider=provider,
            model=chosen,
            tools=registry,
            limits=limits,
            system_prompt=system_prompt,
            max_output_tokens=max_output_tokens,
            nursery=nursery,
            source=snapshot.source if source is None else source,
            session_limits=session_limits,
            prices=prices,
            rules=rules,
        )
        new_id = new_session_id if new_session_id is not None else f"{session_id}.fork-{secrets.token_hex(4)}"
        opening = await JournalOpening.acquire(store, new_id, signer=signer, keys=keys, witness=witness, wait_s=wait_s)
        opening.forked_from = point.origin
        async with opening:
            if await opening.lease.last_seq() != 0:
                raise ForkError(f"session {new_id!r} already has a journal: fork into another id")
            if opening.heads is not None:  # an emptied session's id is refused, as `open` refuses it
                check_witnessed((), await opening.heads.last_head(opening.name))
            session._attach(await opening.start(session.snapshot(), kind, compact))
        return session


async def read_points(
    store: JournalStore,
    session_id: str,
    kind: TextDocumentKind[D],
    registry: ToolRegistry[D],
    *,
    signer: Signer,
    keys: JournalKeys | None,
    witness: Witness,
) -> Iterator[JournalPoint[D]]:
    """``session_id``'s journal read without its lease, verified (with the keys and the witness a session opened
    with these options accepts), and its points as they are folded: the first snapshot, then each settled turn (one
    at a time: a caller keeps only the points it needs). `DocumentMismatch` once the last is folded, if its kind is
    another than ``kind``."""
    key = await resolve_signer(signer, keys)
    verifying = None if key is None else key.keys if keys is None else key.keys | keys
    _, entries, verdict = await verified_journal(
        store, session_id, keys=verifying, witness=choose_witness(witness, key, store)
    )
    if verdict.verdict == "missing":
        raise ForkError(f"session {session_id!r} has no journal")
    if verdict.verdict == "refused":
        raise JournalError(f"session {session_id!r} does not verify: {verdict.error}", seq=verdict.entry)
    missing = tools_used(entries, every_turn=True) - set(registry.names)
    if missing:
        raise ToolsMissing(missing)
    journal_id = journal_id_of(entries, session_id)
    load_data = DocumentCodec.of(kind).from_data
    points = journal_points(
        entries,
        session_id=session_id,
        journal_id=journal_id,
        load_document=kind.load,
        registry=registry,
        load_data=load_data,
    )
    return _kind_checked(points, kind.name)


def _kind_checked(points: Iterator[JournalPoint[D]], name: str) -> Iterator[JournalPoint[D]]:
    last = None
    for last in points:
        yield last
    recorded = None if last is None else last.replayed.kind
    if recorded not in (None, name):
        raise DocumentMismatch("kind", recorded, name)


def fork_point(points: Iterable[JournalPoint[D]], after: SettledTurn | str | None, session_id: str) -> JournalPoint[D]:
    """The point ``after`` names among ``points``: the first (None), or the settled turn of that id (a `SettledTurn`
    must also be this journal's: the same session, entry and head). Every point is read (replay and its checks run
    to the journal's end), only the one named is kept. `ForkError` when there is none."""
    turn_id = after if isinstance(after, str) else None if after is None else after.turn_id
    chosen: JournalPoint[D] | None = None
    for point in points:  # the first point (the journal's first snapshot) is the only one with no turn
        if chosen is None and (None if point.turn is None else point.turn.turn_id) == turn_id:
            chosen = point
    if chosen is None:
        raise ForkError(
            f"turn {turn_id!r} is not a settled turn of session {session_id!r}: only a turn that settled (not one "
            "suspended in review or cut short, nor one compacted away) is a point to fork from"
        )
    turn = chosen.turn
    if (
        isinstance(after, SettledTurn)
        and turn is not None
        and (after.session, after.seq, after.head)
        != (
            session_id,
            turn.seq,
            turn.head,
        )
    ):
        raise ForkError(
            f"turn {turn_id!r} of session {session_id!r} is not the one listed (entry {after.seq}): the journal "
            "was replaced since, or the turn is another session's"
        )
    return chosen


def _last_state(fold: Callable[[], TurnState | None]) -> TurnState | None:
    """A reopened session's last state, its settled turn replayed now (a signed journal's entries, verified at open:
    what its writer folded, so this holds; if it did not, the session goes on and says so, showing no last state)."""
    try:
        return fold()
    except JournalError as exc:
        logging.getLogger("trioloop.journal").error("the last turn could not be replayed to show it: %s", exc)
        return None
