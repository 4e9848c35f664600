"""A resumed chat belongs to its file: `trioloop chat FILE --resume J` goes on only when FILE holds J's document.

J (a journal or a session file) records its document: the kind, the file it was started on (``source``), and
every committed document. The file the chat will write (FILE, or ``--out``) must hold the document J last
committed, or the one before J's latest change: the chat stopped between committing a change and saving it
(killed, say), and the change is saved now. Anything else is another document, or this one changed outside
the chat: the chat stops before it writes anything and says what differs and how to go on (naming the conflict
file the chat saved its changes to, when FILE changed under it). A ``--out`` file that does not exist yet is a
new home for J's document, and always fine.

J's document in another file while the file J records still exists is a copy, not a move: refused too, both
named. A move (J's file is gone) goes on in the new place.

The decision is made before anything is written: a journal is first read read-only (`read_latest_chat`: no
lease, no entry, not a byte of it changed), and only a chat that may go on opens it for writing.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import final

import attrs
import trio
from rich.console import Console
from rich.text import Text

from trioloop.cli.common import Saver, error
from trioloop.durable.journal import JournalError, decode_entries, verify_journal
from trioloop.durable.replay import replay_journal
from trioloop.durable.signing import JournalKeyError, JournalKeys, JournalSigner
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.store import JournalStoreError, StoredEntry
from trioloop.machine.transaction import DocumentMatch, UndoHistory, match_document
from trioloop.runtime.session import Session
from trioloop.threatmodel import THREAT_MODEL, ThfError, ThfFile, ThreatModel, create_ai_tool_registry, load_thf_file

__all__ = ["JournaledChat", "check_resumed", "read_latest_chat", "resume_refusal"]

Match = Callable[[ThreatModel], DocumentMatch]

_CONFLICTS_LOOKED_AT = 16  # the newest conflict files beside the document that are read, at most


@final
@attrs.frozen(kw_only=True)
class JournaledChat:
    """A journal's latest chat as it records its document: its id, its file, its document and undo history."""

    session_id: str
    source: str | None
    document: ThreatModel
    undo: UndoHistory[ThreatModel]

    def match(self, document: ThreatModel) -> DocumentMatch:
        """How ``document`` stands to the chat's: the same, one change behind, or another."""
        return match_document(THREAT_MODEL, document, self.document, self.undo)


async def read_latest_chat(journal: Path, keys: JournalKeys | None = None) -> JournaledChat | str:
    """The latest chat in ``journal``, verified (hash chain, and signatures with this user's key when there is one)
    and replayed, or the error line saying why it cannot be resumed. Read-only: no lease is taken and nothing is
    written beside the journal (a copy of it is read). `Session.open` verifies it again, the witnessed head too,
    once the chat may go on."""
    copy = journal
    try:
        with tempfile.TemporaryDirectory(prefix="trioloop-resume-") as folder:
            copy = await trio.to_thread.run_sync(_copy_of, journal, Path(folder))
            async with SQLiteJournalStore(copy, read_only=True) as store:
                chats = [i for i in await store.session_ids() if i.startswith("chat-")]
                if not chats:
                    return f"error: {journal} holds no chat to resume"
                session_id = chats[-1]
                stored = await store.read(session_id)
        chat = await trio.to_thread.run_sync(_replayed, stored, session_id, keys)  # CPU work: off the event loop
    except (JournalError, JournalStoreError, JournalKeyError) as exc:
        return f"error: the journal {journal} cannot be used: {str(exc).replace(str(copy), str(journal))}"
    except OSError as exc:
        return f"error: cannot read the journal {journal}: {exc.strerror or exc}"
    return chat


def _replayed(stored: Sequence[StoredEntry], session_id: str, given: JournalKeys | None) -> JournaledChat:
    """The chat ``stored`` records, verified (with this user's key, when it exists: never made here, and the public
    keys ``given``) and replayed."""
    own = JournalSigner.existing()
    keys = given if own is None else own.keys if given is None else own.keys | given
    entries = decode_entries(stored)
    verify_journal(entries, session_id=session_id, keys=keys)
    replayed = replay_journal(
        entries, load_document=THREAT_MODEL.load, registry=create_ai_tool_registry(), load_data=THREAT_MODEL.from_data
    )
    return JournaledChat(session_id=session_id, source=replayed.source, document=replayed.document, undo=replayed.undo)


def _copy_of(journal: Path, folder: Path) -> Path:
    """A copy of ``journal`` (and of its write-ahead log, which holds what a killed chat wrote last) in ``folder``.

    SQLite reads a journal in WAL mode only with its log and index beside it: a read-only connection makes them
    when they are missing, and cannot remove them. The copy is read instead, so J's folder is left as it was."""
    copy = folder / "journal"
    log = Path(f"{journal}-wal")
    shutil.copyfile(journal, copy)
    with contextlib.suppress(FileNotFoundError):
        shutil.copyfile(log, f"{copy}-wal")
    return copy


def resume_refusal(
    source: str | None, match: Match, path: Path, loaded: ThfFile, out: Path | None, resumed: Path
) -> str | None:
    """Why the chat on ``path`` (read as ``loaded``; written to ``out`` when given) may not go on with the chat
    ``resumed`` holds (started on ``source``, its documents told apart by ``match``), as the error to print; None
    when it may. Reads files, writes none."""
    on_disk = _target_document(path, loaded, out)
    if on_disk is None or isinstance(on_disk, str):
        return on_disk
    return _refusal(source, match, on_disk, path, out, resumed)


def check_resumed(
    session: Session[ThreatModel],
    path: Path,
    loaded: ThfFile,
    out: Path | None,
    resumed: Path,
    saver: Saver,
    console: Console,
) -> bool:
    """Whether the chat on ``path`` (read as ``loaded``; written to ``out`` when given) may go on with ``session``,
    resumed from ``resumed``; says why not (on stderr) when it may not. When it may, the session's source becomes
    the file written, and a file one change behind is brought up to date at once."""
    target = out or path
    here = str(target.resolve())
    recorded = session.source
    on_disk = _target_document(path, loaded, out)
    if on_disk is None:  # a new file for J's document
        session.source = here
        return True
    if isinstance(on_disk, str):
        error(on_disk)
        return False
    refusal = _refusal(recorded, session.match_document, on_disk, path, out, resumed)
    if refusal is not None:
        error(refusal)
        return False
    if recorded is not None and recorded != here:
        console.print(Text(f"This chat was started on {recorded}; it goes on in {target}.", style="dim"))
    session.source = here
    if session.match_document(on_disk.model) is DocumentMatch.BEHIND:
        console.print(
            Text(
                f"{target} is one change behind {resumed} (the chat stopped before saving it); "
                "saving the chat's document now.",
                style="bold",
            )
        )
        saver.save(session.document)
    return True


def _target_document(path: Path, loaded: ThfFile, out: Path | None) -> ThfFile | str | None:
    """What the file the chat would write holds: None for a ``--out`` file that does not exist yet (a new home for
    the chat's document), the error line when it cannot be read."""
    target = out or path
    if target == path:
        return loaded
    if out is not None and out.resolve() != path.resolve() and not out.exists():
        return None
    try:
        return load_thf_file(target)
    except ThfError as exc:
        return f"error: {target} cannot be resumed into: {type(exc).__name__}: {exc.message}"
    except OSError as exc:
        return f"error: cannot read {target}: {exc.strerror or type(exc).__name__}"


def _refusal(
    source: str | None, match: Match, on_disk: ThfFile, path: Path, out: Path | None, resumed: Path
) -> str | None:
    target = out or path
    ways = (
        f"  To continue that chat into a new file: trioloop chat {path} --resume {resumed} --out NEW.thf\n"
        f"  To start a new chat on {target} as it is: trioloop chat {target}"
    )
    elsewhere = source is not None and not _same_file(source, target)
    if match(on_disk.model) is DocumentMatch.OTHER:
        if elsewhere:
            what = f"{resumed} is the chat of {source}, not of {target}"
        else:
            what = f"{target} is not the document {resumed} last committed: it changed outside the chat"
            conflict = _conflict_file(target, match)
            if conflict is not None:
                what += f", and the chat saved its approved changes to {conflict} instead (compare the two)"
        return f"error: {what}; nothing was written.\n{ways}"
    if elsewhere and source is not None and os.path.lexists(source):
        return (
            f"error: {target} is a copy of {source}, the file {resumed} is the chat of, which is still there "
            f"(a chat goes on in its own file, or in the file it was moved to); nothing was written.\n"
            f"  To go on in the chat's own file: trioloop chat {source} --resume {resumed}\n{ways}"
        )
    return None


def _same_file(recorded: str, target: Path) -> bool:
    """Whether the file a chat records is ``target``: the same path, or the same file by another (a symlink, a
    hard link, a folder renamed and linked back)."""
    if recorded == str(target.resolve()):
        return True
    try:
        return os.path.samefile(recorded, target)
    except OSError:
        return False


def _conflict_file(target: Path, match: Match) -> Path | None:
    """The newest conflict file beside ``target`` (``STEM.conflict-TIME.thf``, what a chat saves to when the file
    changed under it) that holds the chat's document, or the one before its latest change."""
    folders = dict.fromkeys([target.parent, Path(os.path.realpath(target)).parent])
    pattern = f"{glob.escape(target.stem)}.conflict-*{glob.escape(target.suffix)}"
    found = sorted((p for folder in folders for p in folder.glob(pattern)), key=lambda p: p.name, reverse=True)
    for candidate in found[:_CONFLICTS_LOOKED_AT]:
        try:
            held = load_thf_file(candidate)
        except (ThfError, OSError):
            continue
        if match(held.model) is not DocumentMatch.OTHER:
            return candidate
    return None
