"""A witness of journal heads: what a journal cannot prove about itself, that it was not cut short or rolled back.

A signed journal proves every entry it holds was written by the key's holder, but not that it holds every entry:
cutting off its last batches, or putting back an older copy, leaves a journal that verifies. So after each
durable append the session tells a `HeadWitness` kept outside the store the new signed head (which journal, its
session, the last entry's number and hash). On opening, a journal shorter than the head last witnessed, or whose
entry at that number differs, is refused naming both. The default `FileWitness` keeps one small file per journal
under ``$XDG_CONFIG_HOME/trioloop/witness``; an app may keep heads in its own database instead (any object with
the two methods below).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, final, runtime_checkable

import attrs
import trio

from trioloop.durable.files import config_folder
from trioloop.durable.journal import JournalEntry, JournalError

__all__ = [
    "FileWitness",
    "HeadWitness",
    "MemoryWitness",
    "WitnessedHead",
    "check_witnessed",
    "default_witness_path",
]


@final
@attrs.frozen(kw_only=True)
class WitnessedHead:
    """The head of one journal as it was last made durable: its id, session, last entry's number and hash."""

    journal: str
    session: str
    seq: int
    hash: str


@runtime_checkable
class HeadWitness(Protocol):
    """Keeps the newest head of each journal, outside the journal's store."""

    async def last_head(self, journal: str) -> WitnessedHead | None:
        """The head last witnessed for ``journal``, or None (never witnessed)."""
        ...

    async def witness(self, head: WitnessedHead) -> None:
        """Remember ``head`` (a later head of the same journal replaces an earlier one, never the reverse)."""
        ...


def default_witness_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/trioloop/witness`` (``~/.config/trioloop/witness`` when it is not set)."""
    return config_folder(environ) / "witness"


@final
class FileWitness:
    """Heads in files, one per journal, in ``folder`` (default: `default_witness_path`), made readable by their
    owner alone. Reads and writes run in a worker thread; a write replaces the file atomically."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_witness_path()

    def _path(self, journal: str) -> Path:
        return self.folder / (hashlib.sha256(journal.encode("utf-8")).hexdigest()[:32] + ".json")

    def _read(self, journal: str) -> WitnessedHead | None:
        try:
            value = json.loads(self._path(journal).read_text(encoding="ascii"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            raise JournalError(
                f"the witness file for journal {journal} cannot be read: {self._path(journal)}"
            ) from None
        try:
            head = WitnessedHead(
                journal=value["journal"], session=value["session"], seq=value["seq"], hash=value["hash"]
            )
        except (KeyError, TypeError):
            raise JournalError(f"the witness file {self._path(journal)} is not a witnessed head") from None
        if head.journal != journal or type(head.seq) is not int or type(head.hash) is not str:
            raise JournalError(f"the witness file {self._path(journal)} is not a witnessed head")
        return head

    def _write(self, head: WitnessedHead) -> None:
        last = self._read(head.journal)
        if last is not None and last.seq >= head.seq:
            return
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self._path(head.journal)
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
        text = json.dumps(attrs.asdict(head), sort_keys=True).encode("ascii")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(text)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise

    async def last_head(self, journal: str) -> WitnessedHead | None:
        """The head in ``journal``'s file, or None; `JournalError` for a file that is not a witnessed head."""
        return await trio.to_thread.run_sync(self._read, journal)

    def witness_now(self, head: WitnessedHead) -> None:
        """`witness`, in the calling thread: what a store's own thread runs right after the append ``head`` follows
        (`SQLiteJournalStore`), so one hand-over to a thread serves both."""
        self._write(head)

    async def witness(self, head: WitnessedHead) -> None:
        """Replace the journal's file with ``head`` when it is newer than the one there."""
        # Abandoned when cancelled (a turn's append cut short by Stop or its deadline): the write finishes on its
        # own, and a head never replaces a newer one.
        await trio.to_thread.run_sync(self._write, head, abandon_on_cancel=True)

    def __repr__(self) -> str:
        return f"FileWitness({str(self.folder)!r})"


@final
class MemoryWitness:
    """Heads in this process's memory: for tests, and the shape of a witness an app keeps in its own database."""

    def __init__(self) -> None:
        self.heads: dict[str, WitnessedHead] = {}

    async def last_head(self, journal: str) -> WitnessedHead | None:
        """The head last witnessed for ``journal``, or None."""
        await trio.lowlevel.checkpoint()
        return self.heads.get(journal)

    async def witness(self, head: WitnessedHead) -> None:
        """Keep ``head`` when it is newer than the one kept."""
        await trio.lowlevel.checkpoint()
        last = self.heads.get(head.journal)
        if last is None or last.seq < head.seq:
            self.heads[head.journal] = head


def check_witnessed(entries: Sequence[JournalEntry], head: WitnessedHead | None) -> None:
    """Refuse (`JournalError`) a journal shorter than the witnessed head, or whose entry there differs."""
    if head is None or not entries:
        return
    last = entries[-1].seq
    if last < head.seq:
        raise JournalError(
            f"the journal ends at entry {last}, but entry {head.seq} of it was witnessed: its newest entries were "
            "cut off, or an older copy was put back",
            seq=last,
        )
    first = entries[0].seq
    if head.seq >= first and entries[head.seq - first].hash != head.hash:
        raise JournalError(
            f"journal entry {head.seq} is not the entry that was witnessed ({head.hash[:12]}…): the journal was "
            "rolled back and written again",
            seq=head.seq,
        )
