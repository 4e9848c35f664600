"""What an app holds across turns: the live document, its undo history, the conversation, the provider.

A `Session` is generic over the document type ``D``: the app passes the document, the `DocumentKind` that
validates and copies it, and its tools. It is an async context manager, like `trio.open_nursery`: inside
``async with session:`` it owns the nursery that every tool task (and every toolset connection) lives in,
and leaving the block cancels and awaits them, abandoned tools included. An app that already has a nursery
may pass it as ``nursery=`` instead.

``Session.send`` runs one turn at a time through ``run_turn``. The review controls (approve, deny, stop,
undo) are synchronous so a UI task can call them directly; each becomes exactly one reducer input of
the live turn. Observers read states through ``states()``, which only ever yields the latest state, so
a slow observer can never hold the turn back.

The session is the app's handle, a facade over parts that each own their state (`SessionView` composes them and
holds what an app reads); what it does with them is here: its lifecycle, turns and decisions, undo, and the
session files, journals and transcripts (`trioloop.runtime.session_files`, `trioloop.runtime.session_journal`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

import trio

from trioloop.durable.session_file import MAX_SESSION_BYTES, SessionFileError
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.durable.store import JournalStore
from trioloop.durable.witness import HeadWitness, WitnessedHead
from trioloop.machine.document import TextDocumentKind
from trioloop.machine.limits import DEFAULT_TURN_LIMITS, SpendLimits, TurnLimits
from trioloop.machine.prices import ModelPrice
from trioloop.machine.questions import AnswerAction
from trioloop.machine.rules import Always, ApprovalRule
from trioloop.machine.state import TurnState
from trioloop.machine.tools import RegisteredTool, ToolRegistry, create_tool_registry
from trioloop.machine.transaction import UndoAvailability
from trioloop.protocol.messages import Message
from trioloop.protocol.provider import ChatProvider, HoldsConnections
from trioloop.runtime import session_files
from trioloop.runtime.answers import ANSWER_TOOL, answer_form, output_as
from trioloop.runtime.approvals import ApprovalQuery
from trioloop.runtime.session_files import TranscriptError
from trioloop.runtime.session_fork import SessionForks
from trioloop.runtime.session_journal import (
    DEFAULT_SIGNER,
    DEFAULT_WITNESS,
    DocumentMismatch,
    JournalOpening,
    SessionJournalError,
    ToolsMissing,
    resume_point,
)
from trioloop.runtime.session_turns import APPROVED_ALREADY, SessionBusy
from trioloop.runtime.session_view import SessionClosed, default_system_prompt
from trioloop.runtime.toolsets import Toolset

__all__ = [
    "DocumentMismatch",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "SessionJournalError",
    "ToolsMissing",
    "Toolset",
    "TranscriptError",
    "default_system_prompt",
]

D = TypeVar("D")
T = TypeVar("T")
#: `Session.continue_turn` without ``output``: the type the turn's ``send`` gave.
_SAME_OUTPUT: Any = object()


class Session(SessionForks[D]):
    """A conversation about one document, one turn at a time."""

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Session[D]:
        """Open the session's nursery and, when the provider offers it (``HoldsConnections``), hold its
        connections open until the block ends: every turn then shares one keep-alive connection."""
        if self._nursery is not None:
            raise RuntimeError("This session already has a nursery; enter it only once.")
        held = self.provider.hold_connections() if isinstance(self.provider, HoldsConnections) else None
        if held is not None:
            await held.__aenter__()
        manager = trio.open_nursery()
        try:
            self._nursery = await manager.__aenter__()
        except BaseException:
            if held is not None:
                await held.__aexit__(None, None, None)
            raise
        self._nursery_manager = manager
        self._held = held
        if self._journal.journal is not None:
            self._nursery.start_soon(self._journal.journal.keep_alive, name="trioloop lease renewal")
        self._listen_for_decisions()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        manager, nursery, held = self._nursery_manager, self._nursery, self._held
        self._nursery_manager = self._held = None
        if self._turns.controls is not None:
            self._turns.controls.stop()
        if nursery is not None:
            nursery.cancel_scope.cancel()  # toolsets and abandoned tools: cancelled again, then awaited
        try:
            return bool(await manager.__aexit__(exc_type, exc, tb))
        finally:
            self._nursery = None
            if self._remote is not None:  # decisions a suspended turn took, journaled since: answered applied
                await self._remote.settle_deferred()
            if held is not None:
                await held.__aexit__(None, None, None)
            await self.aclose()

    async def aclose(self) -> None:
        """Write what the journal still holds and release its lease (another process may then open it).
        Leaving ``async with session:`` does this; a session opened from a store but never entered must call it."""
        if self._journal.journal is not None:
            await self._journal.journal.close()

    async def add_toolset(
        self, toolset: Toolset[D], *, needs_approval: Callable[[ApprovalQuery], Any] | None = None
    ) -> tuple[RegisteredTool[D], ...]:
        """Start ``toolset`` in the session's nursery and offer its tools from the next turn on; ``needs_approval``
        (a function of each valid call: allow, ask or deny) decides its tools' calls in code, under the same safety
        rules as approval rules."""
        if self._turns.controls is not None:
            raise SessionBusy("Tools cannot change while a turn is running.")
        return await self._toolsets.add(toolset, self.nursery, needs_approval)

    # -- turns -----------------------------------------------------------------------------------

    async def send(self, text: str, *, output: Any = None, output_tool: str = ANSWER_TOOL) -> TurnState:
        """Run one turn for ``text`` and return its state: settled, or live if it was suspended in review.

        ``output`` (an attrs class, or a type such as ``list[int]`` or a ``Literal``) asks for a typed answer: the
        model ends the turn by calling the final tool ``output_tool`` with it, checked strictly against the type
        and asked for again (within ``TurnLimits.max_output_retries``) while it does not match. Read it with
        `output_as`; the settled state's ``output`` holds it as JSON."""
        answer = None if output is None else answer_form(output, tool_name=output_tool, taken=self.registry.names)
        return await self._turns.send(text, self._setup(), answer)

    async def continue_turn(self, *, output: Any = _SAME_OUTPUT) -> TurnState:
        """Take up the suspended turn (see `suspended`) where it stood and run it on: the same cards, with the
        decisions already made, the remaining turn deadline and review timeout. After a crash, a call that
        was running is settled failed and never run again, a call whose tool changed since its card was
        shown is refused, and a request that was in flight is asked again as a retry. A turn that asks for a
        typed answer checks it against the type its ``send`` gave, or ``output`` (a reopened session's)."""
        return await self._turns.continue_turn(self._setup(), self._turns.answer_for(output, _SAME_OUTPUT))

    def output_as(self, output: type[T] | Any) -> T | None:
        """The last turn's typed answer (`send` with ``output=``) structured as ``output``, or None when that turn
        gave none (it failed, was bounded or stopped, or asked for no typed answer). A reopened session's too."""
        return output_as(self.state, output)

    async def suspend(self) -> TurnState | None:
        """Make the current turn durable and end its tasks, so a later process can take it up (`Session.open`
        on the same journal, then `continue_turn`). In review, the turn is suspended as it stands, with the
        decisions already made; in any other phase it is stopped first (settled cancelled, committed work
        kept). Returns the turn's state (None before any turn)."""
        return await self._turns.suspend()

    def approve(
        self, call_id: str, edited_input: dict[str, Any] | None = None, *, always: Always | str | None = None
    ) -> bool:
        """Approve one call of the current turn's review (or of a suspended turn's: it applies when the turn
        continues); ``edited_input`` approves the person's edit of the input instead. ``always`` also adds a
        session rule: ``"tool"`` allows every later call of this tool, ``"input"`` those with this very input
        (the edited one, if edited); never for a destructive tool. False when no turn can take it, or the call has
        no card open (a late click on a card that is gone)."""
        always = None if always is None else Always(always)
        controls = self._turns.deciding_on((call_id,))
        return controls is not None and controls.approve(call_id, edited_input, always)

    def approve_batch(self, call_ids: Iterable[str]) -> bool:
        """Approve the listed calls together (destructive ones are never included). A call already approved (by the
        person, or the read-only policy), running or run is covered; an unknown id, another turn's call or one
        decided against (denied, failed) refuses the whole batch (False)."""
        ids = tuple(call_ids)
        controls = self._turns.deciding_on(ids, covered=APPROVED_ALREADY)
        return controls is not None and controls.approve_batch(ids)

    def deny(self, call_id: str, reason: str = "", *, always: Always | str | None = None) -> bool:
        """Decline one call; ``reason`` reaches the model as the person's words. ``always="tool"`` also adds a
        session rule denying every later call of this tool, with that reason."""
        always = None if always is None else Always(always)
        controls = self._turns.deciding_on((call_id,))
        return controls is not None and controls.deny(call_id, reason, always)

    @property
    def rules(self) -> tuple[ApprovalRule, ...]:
        """The approval rules in effect: the app's and the files' (``rules=``), then the session's own (a person's
        "always" from a card, numbered in the order they were added), as the running or suspended turn has them."""
        live = self._turns.live_rules()
        return live.rules if live is not None else self._rule_set().rules

    def remove_rule(self, number: int) -> bool:
        """Remove session rule ``number`` (see `rules`): later calls are decided without it. Journaled (between
        turns, with the next append, as `undo_last_turn` is). False when the session has no such rule; the app's and
        the files' rules are not the session's to remove."""
        return self._turns.forget_rule(number, self.actor)

    def stop(self) -> bool:
        """Stop the current turn (approved work already committed is kept); a suspended turn is stopped when it
        continues. False when there is no turn to stop."""
        controls = self._turns.deciding()
        return controls is not None and controls.stop()

    def answer(self, question_id: str, action: AnswerAction, content: Mapping[str, Any] | None = None) -> bool:
        """Answer an open question: ``"accept"`` with the form's values (a left-out field takes its default),
        ``"decline"`` or ``"cancel"``. False if it is not open any more.

        Raises `AnswerError` (naming the field) for values that do not fit the form; nothing is answered
        then, so ask the person again."""
        controls = self._turns.controls
        return controls is not None and controls.answer(question_id, action, content)

    # -- undo ------------------------------------------------------------------------------------

    def undo_availability(self) -> UndoAvailability:
        """Whether the last turn can be undone now, and if not, why (nothing to undo, already undone, superseded)."""
        return self._undo.availability()

    def undo_last_turn(self) -> bool:
        """Restore the document from before the last turn, if nothing has superseded it since."""
        return self._undo.undo_last_turn(self.actor)

    async def undo(self) -> bool:
        """`undo_last_turn`, made durable before it returns (with a journal; `undo_last_turn` alone leaves
        the journal entry to the next write)."""
        undone = self.undo_last_turn()
        if self._journal.journal is not None:
            await self._journal.journal.flush()
        return undone

    def undo_step(self) -> str | None:
        """Undo the newest turn the undo history still holds, whichever it is, one turn a call, as far as the
        history reaches (20 turns by default): the turn id undone, or None (nothing left, or a turn running).
        `redo_last_undo` takes it back while nothing newer was committed."""
        return self._undo.undo_step(self.actor)

    def redo_last_undo(self) -> str | None:
        """Re-apply the turn undone last (by `undo_step` or `undo_last_turn`), if nothing newer was committed
        since: the turn id redone, or None."""
        return self._undo.redo(self.actor)

    # -- session files, journals and transcripts -------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the session to ``path`` atomically (the previous file survives any failure), so
        `Session.resume` can continue the conversation on the same document, undo of the last turn
        included. Needs a kind with a text form (`TextDocumentKind`); refused while a turn runs."""
        if self._turns.controls is not None or self._turns.resume is not None:
            raise SessionBusy(
                "A session cannot be saved while a turn is running or suspended; save it once the turn settles "
                "(a journal, Session.open, keeps a suspended turn)."
            )
        session_files.save_snapshot(self.snapshot(), self.kind, path)

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike[str],
        *,
        kind: TextDocumentKind[D],
        provider: ChatProvider | Sequence[ChatProvider],
        model: str | None = None,
        tools: ToolRegistry[D] | Iterable[RegisteredTool[D]] = (),
        limits: TurnLimits = DEFAULT_TURN_LIMITS,
        system_prompt: str | None = None,
        max_output_tokens: int = 4096,
        nursery: trio.Nursery | None = None,
        max_bytes: int = MAX_SESSION_BYTES,
        session_limits: SpendLimits | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
        rules: Iterable[ApprovalRule] = (),
        trust_allow_rules: bool = False,
    ) -> Session[D]:
        """A session continued from a file `save` wrote: same conversation, document and undo history,
        turn ids continuing after the saved ones. A file that is not a valid session (too large, not
        UTF-8 JSON, wrong shape, an unpairable conversation, a document ``kind.load`` refuses) raises
        `SessionFileError`; reading stops after ``max_bytes``, so memory stays bounded.

        The file's session rules (a person's "always" and "never") come back too, but a session file is not signed:
        anyone who can write it could add an allow rule. So its deny and ask rules are restored, and its allow rules
        only with ``trust_allow_rules=True`` (the file is the app's own, kept where no one else writes);
        `withheld_rules` lists those left out. A journal (`Session.open`) proves its entries and restores them all."""
        snapshot = session_files.read_session_file(path, kind, max_bytes)
        chosen = model if model is not None else snapshot.model
        if chosen is None:
            raise SessionFileError("the session file names no model: pass model=")
        kept, withheld = session_files.restorable_rules(snapshot.rules, trust_allow_rules)
        session = cls._continued(
            snapshot,
            kept,
            kind=kind,
            provider=provider,
            model=chosen,
            tools=tools,
            limits=limits,
            system_prompt=system_prompt,
            max_output_tokens=max_output_tokens,
            nursery=nursery,
            source=snapshot.source,
            session_limits=session_limits,
            prices=prices,
            rules=rules,
        )
        session.withheld_rules = withheld
        return session

    @classmethod
    async def open(
        cls,
        store: JournalStore,
        session_id: str,
        *,
        kind: TextDocumentKind[D],
        provider: ChatProvider | Sequence[ChatProvider],
        document: D | None = None,
        model: str | None = None,
        tools: ToolRegistry[D] | Iterable[RegisteredTool[D]] = (),
        limits: TurnLimits = DEFAULT_TURN_LIMITS,
        system_prompt: str | None = None,
        max_output_tokens: int = 4096,
        nursery: trio.Nursery | None = None,
        wait_s: float = 0.0,
        compact: bool = False,
        signer: JournalSigner | Literal["default"] | None = DEFAULT_SIGNER,
        keys: JournalKeys | None = None,
        witness: HeadWitness | Literal["default"] | None = DEFAULT_WITNESS,
        source: str | None = None,
        session_limits: SpendLimits | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
        rules: Iterable[ApprovalRule] = (),
    ) -> Session[D]:
        """A session whose every turn is journaled in ``store`` under ``session_id``, taking its lease.

        A new id starts from ``document`` and ``model``; for an existing one, ``document`` (if given) must be the
        replayed document or the one before its latest change (the app stopped between a commit and saving it: save
        the session's, which is newer), else `DocumentMismatch`. An existing journal is verified before anything of it
        is replayed (numbering, hash chain, and every batch's signature: a forged, edited, reordered, inserted or
        transplanted entry, or entries nobody signed, raise `JournalError` naming the first bad entry) and then
        replayed: the conversation, document, undo history and, if a turn was suspended in review or cut short by a
        crash, that turn (`suspended`, `state`; take it up with `continue_turn`). The ``tools`` must be the ones the
        journaled calls used (`ToolsMissing` names any not given): each call is prepared again from its tool, and one
        whose digest changed is refused, never run. ``compact`` drops the entries before the snapshot the last turn
        started from (the audit trail then starts there).

        ``signer`` signs every append: by default the key ``TRIOLOOP_JOURNAL_KEY`` names, else a per-user key
        made on first use (`JournalSigner.default`); ``None`` opts out (the journal is unsigned, and
        `journal_integrity` says so). ``keys`` adds public keys that verify entries an earlier key signed.
        ``witness`` keeps each new signed head outside the store (by default a `FileWitness` under the user's
        config folder, for a signed journal), so a journal cut short or rolled back to an older copy is refused
        too (`JournalError` naming the witnessed entry). ``source`` names the document (`Session.source`): a new
        journal records it, an existing one must record the same (or none), and its kind's name must be
        ``kind``'s, else `DocumentMismatch`. Raises `SessionLocked` while another lease drives the session (after
        waiting up to ``wait_s``). While the session is open its lease is renewed (SQLite and PostgreSQL leases
        have a time to live); a lease lost meanwhile (the process frozen past it, another process taking over)
        stops the turn before anything more is written or run, and the session raises `SessionJournalError`.
        """
        registry = tools if isinstance(tools, ToolRegistry) else create_tool_registry(tools)
        options: dict[str, Any] = {
            "kind": kind,
            "provider": provider,
            "tools": registry,
            "limits": limits,
            "system_prompt": system_prompt,
            "max_output_tokens": max_output_tokens,
            "nursery": nursery,
            "session_limits": session_limits,
            "prices": prices,
            "rules": rules,
        }
        opening = await JournalOpening.acquire(
            store, session_id, signer=signer, keys=keys, witness=witness, wait_s=wait_s
        )
        async with opening:
            replayed = await opening.read(kind=kind, registry=registry, source=source, document=document)
            if replayed is None:
                if document is None or model is None:
                    raise ValueError(f"session {session_id!r} is new: pass document= and model= to start it")
                session = cls(document=document, model=model, source=source, **options)
                session._attach(await opening.start(session.snapshot(), kind, compact))
                return session
            chosen = model if model is not None else replayed.model
            if chosen is None:
                raise ValueError("the journal names no model: pass model=")
            session = cls(
                document=replayed.document,
                history=replayed.messages,
                model=chosen,
                source=replayed.source if replayed.source is not None else source,
                **options,
            )
            session._restore(
                replayed.undo,
                replayed.turn_count,
                replayed.last_turn_id,
                replayed.usage,
                state=replayed.state,
                resume=resume_point(replayed),
                journal=await opening.take_over(replayed, kind, compact),
                rules=replayed.rules,
                settled=replayed.settled_state,
            )
            return session

    @classmethod
    async def retire(
        cls,
        store: JournalStore,
        session_id: str,
        *,
        signer: JournalSigner | Literal["default"] | None = DEFAULT_SIGNER,
        witness: HeadWitness | Literal["default"] | None = DEFAULT_WITNESS,
        wait_s: float = 0.0,
    ) -> WitnessedHead | None:
        """Retire ``session_id``'s journal in ``store``, so a new session may start under that id: its last head
        (or, for a journal already emptied, the head last witnessed) is witnessed as retired, then its entries
        are erased. `Session.open` refuses an emptied session, and another journal of the same session, until
        then, and the retired journal for ever after. Takes the session's lease (`SessionLocked` after
        ``wait_s``); ``signer`` and ``witness`` as in `open`. The head retired, or None when there was none."""
        opening = await JournalOpening.acquire(
            store, session_id, signer=signer, keys=None, witness=witness, wait_s=wait_s
        )
        try:
            return await opening.retire()
        finally:
            with trio.CancelScope(shield=True):
                await opening.lease.release()

    async def journal_into(
        self,
        store: JournalStore,
        session_id: str,
        *,
        wait_s: float = 0.0,
        compact: bool = False,
        signer: JournalSigner | Literal["default"] | None = DEFAULT_SIGNER,
        witness: HeadWitness | Literal["default"] | None = DEFAULT_WITNESS,
    ) -> None:
        """Journal this session from now on in ``store`` under the new id ``session_id`` (taking its lease):
        the first entry is a snapshot of the session as it stands (its conversation, document and undo
        history), so a session resumed from a file, say, goes on durably; ``signer`` and ``witness`` as in `open`.
        `SessionLocked` if another lease holds the id; ValueError if it already has a journal (open that with
        `Session.open`)."""
        if self._journal.journal is not None and not self._journal.journal.closed:
            raise RuntimeError("this session is already journaled")
        kind = self.kind
        if not isinstance(kind, TextDocumentKind):
            raise TypeError(f"the {kind.name} kind has no text form (dump/load), so it cannot be journaled")
        opening = await JournalOpening.acquire(
            store, session_id, signer=signer, keys=None, witness=witness, wait_s=wait_s
        )
        async with opening:
            if await opening.lease.last_seq() != 0:
                raise ValueError(f"session {session_id!r} already has a journal: open it with Session.open")
            self._attach(await opening.start(self.snapshot(), kind, compact))

    def transcript(self) -> dict[str, Any]:
        """The conversation as a versioned JSON-ready dict (`save_transcript` writes it)."""
        return session_files.transcript_of(self.model, self._turns.history)

    def save_transcript(self, path: str | os.PathLike[str]) -> None:
        """Write the transcript atomically: on any failure the file at ``path`` is left as it was."""
        session_files.save_transcript(self.transcript(), path)

    @staticmethod
    def load_transcript(path: str | os.PathLike[str]) -> tuple[Message, ...]:
        """Read a saved conversation; refuse one that is malformed or not pairable."""
        return session_files.load_transcript(path)
