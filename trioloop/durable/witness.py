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
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, final, runtime_checkable

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


#: A witness file: this line, then two slots of `_SLOT` bytes. A slot is the head's JSON, its length first
#: (4 bytes, big-endian) and its SHA-256 after it, the rest zeros; a slot of length 0 is empty.
_MAGIC: Final = b"trioloop witness 2\n"
_SLOT: Final = 1024
_LENGTH: Final = struct.Struct(">I")
_FILE_BYTES: Final = len(_MAGIC) + _LENGTH.size + 2 * _SLOT


def _slot_bytes(head: WitnessedHead, size: int) -> bytes | None:
    """``head`` as a slot of ``size`` bytes, or None when it does not fit."""
    text = json.dumps(attrs.asdict(head), sort_keys=True, separators=(",", ":")).encode("utf-8")
    body = _LENGTH.pack(len(text)) + text + hashlib.sha256(text).digest()
    return body.ljust(size, b"\0") if len(body) <= size else None


def _slot_head(slot: bytes) -> WitnessedHead | None:
    """The head a slot holds; None for an empty slot, or one whose check fails (a write torn by a crash)."""
    if len(slot) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(slot)
    text = slot[_LENGTH.size : _LENGTH.size + length]
    digest = slot[_LENGTH.size + length : _LENGTH.size + length + 32]
    if length == 0 or len(text) != length or hashlib.sha256(text).digest() != digest:
        return None
    try:
        return _head_from(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return None


def _head_from(value: Any) -> WitnessedHead:
    head = WitnessedHead(journal=value["journal"], session=value["session"], seq=value["seq"], hash=value["hash"])
    if type(head.journal) is not str or type(head.seq) is not int or type(head.hash) is not str:
        raise TypeError("not a witnessed head")
    return head


@final
class FileWitness:
    """Heads in files, one per journal, in ``folder`` (default: `default_witness_path`), made readable by their
    owner alone. Reads and writes run in a worker thread (or the store's own, see `witness_now`).

    A file holds two slots, each with its own check: a new head overwrites, in place, the slot holding the older
    one, so a write torn by a crash leaves the other slot, one head behind (never a false alarm), and a write is
    one open, one read, one write: no temporary file, no rename. Files of the earlier format (one head in JSON,
    ``.json``) are read, and converted at the next write."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_witness_path()
        self._files: dict[str, str] = {}  # journal -> its file's path (a path built once, not per write)

    def _path(self, journal: str, suffix: str = ".head") -> Path:
        return self.folder / (hashlib.sha256(journal.encode("utf-8")).hexdigest()[:32] + suffix)

    def _file(self, journal: str) -> str:
        file = self._files.get(journal)
        if file is None:
            if len(self._files) >= 1024:
                self._files.clear()
            file = self._files[journal] = str(self._path(journal))
        return file

    def _unreadable(self, journal: str, path: Path) -> JournalError:
        return JournalError(f"the witness file for journal {journal} is not a witnessed head: {path}")

    def _read_legacy(self, journal: str) -> WitnessedHead | None:
        path = self._path(journal, ".json")
        try:
            head = _head_from(json.loads(path.read_text(encoding="ascii")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            raise self._unreadable(journal, path) from None
        if head.journal != journal:
            raise self._unreadable(journal, path)
        return head

    def _slots(self, journal: str, data: bytes) -> tuple[int, list[WitnessedHead | None]]:
        """The slot size and the two slots' heads of a witness file's bytes (`JournalError` if it is not one)."""
        path = self._path(journal)
        if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _LENGTH.size:
            raise self._unreadable(journal, path)
        (size,) = _LENGTH.unpack_from(data, len(_MAGIC))
        first = len(_MAGIC) + _LENGTH.size
        if size < _SLOT or len(data) != first + 2 * size:
            raise self._unreadable(journal, path)
        heads = [_slot_head(data[first + i * size : first + (i + 1) * size]) for i in (0, 1)]
        if heads == [None, None]:
            raise self._unreadable(journal, path)  # a file is made holding a head: no crash leaves both failing
        if any(head is not None and head.journal != journal for head in heads):
            raise self._unreadable(journal, path)
        return size, heads

    def _read(self, journal: str) -> WitnessedHead | None:
        try:
            data = self._path(journal).read_bytes()
        except FileNotFoundError:
            return self._read_legacy(journal)
        except OSError:
            raise self._unreadable(journal, self._path(journal)) from None
        return _newest(self._slots(journal, data)[1])

    def _create(self, head: WitnessedHead) -> None:
        """A new file holding ``head`` (and the head of an earlier format's file, which then goes), put in place
        by one rename."""
        legacy = self._read_legacy(head.journal)
        if legacy is not None and legacy.seq >= head.seq:
            head = legacy
        size = _SLOT
        while (slot := _slot_bytes(head, size)) is None:
            size *= 2
        data = _MAGIC + _LENGTH.pack(size) + slot + bytes(size)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self._path(head.journal)
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        if legacy is not None:
            with contextlib.suppress(OSError):
                self._path(head.journal, ".json").unlink()

    def _write(self, head: WitnessedHead) -> None:
        try:
            descriptor = os.open(self._file(head.journal), os.O_RDWR)
        except FileNotFoundError:
            self._create(head)
            return
        try:
            data = os.pread(descriptor, _FILE_BYTES, 0)
            if len(data) > len(_MAGIC) + _LENGTH.size and _LENGTH.unpack_from(data, len(_MAGIC))[0] != _SLOT:
                data = os.pread(descriptor, os.fstat(descriptor).st_size, 0)  # a file with larger slots
            size, heads = self._slots(head.journal, data)
            newest = _newest(heads)
            if newest is not None and newest.seq >= head.seq:
                return
            slot = _slot_bytes(head, size)
            if slot is not None:
                # The slot of the older head (an empty or torn one first): the newer one stays whole meanwhile.
                older = 0 if heads[0] is None or (heads[1] is not None and heads[0].seq < heads[1].seq) else 1
                os.pwrite(descriptor, slot, len(_MAGIC) + _LENGTH.size + older * size)
                return
        finally:
            os.close(descriptor)
        self._create(head)  # a head longer than the file's slots: a new file with larger ones

    async def last_head(self, journal: str) -> WitnessedHead | None:
        """The newest head in ``journal``'s file, or None; `JournalError` for a file that is not a witness file."""
        return await trio.to_thread.run_sync(self._read, journal)

    def witness_now(self, head: WitnessedHead) -> None:
        """`witness`, in the calling thread: what a store's own thread runs right after the append ``head`` follows
        (`SQLiteJournalStore`), so one hand-over to a thread serves both."""
        self._write(head)

    async def witness(self, head: WitnessedHead) -> None:
        """Write ``head`` into the journal's file when it is newer than the newest head there."""
        # Abandoned when cancelled (a turn's append cut short by Stop or its deadline): the write finishes on its
        # own, and a head never replaces a newer one.
        await trio.to_thread.run_sync(self._write, head, abandon_on_cancel=True)

    def __repr__(self) -> str:
        return f"FileWitness({str(self.folder)!r})"


def _newest(heads: Sequence[WitnessedHead | None]) -> WitnessedHead | None:
    present = [head for head in heads if head is not None]
    return max(present, key=lambda head: head.seq) if present else None


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
