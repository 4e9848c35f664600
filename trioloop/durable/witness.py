"""A witness of journal heads: what a journal cannot prove about itself, that it is the session's one journal and
was not emptied, cut short or rolled back.

A signed journal proves every entry it holds was written by the key's holder, but not that it holds every entry,
nor that it is the journal the session had: cutting off its last batches, putting back an older copy, emptying it,
or putting in its place another journal of the same session (another run, another store) signed by the same key
leaves a journal that verifies. So after each durable append the session tells a `HeadWitness` kept outside the
store the new signed head, under a name the app gives and the journal cannot choose: the store's identity and the
session id (`witness_name`). The head says which journal it is (the id its first snapshot carries), the last
entry's number and hash. On opening, a journal that does not extend the head witnessed under its name is refused,
naming both heads: an empty one, another journal, a shorter one, one that differs at the witnessed entry. Starting
over under a witnessed name is an explicit act (`Session.retire`), recorded in the witness as a retired head.

The default `FileWitness` keeps one small file per name under ``$XDG_CONFIG_HOME/trioloop/witness``, each head
authenticated with a MAC made from the journal key, so an edited file is refused like a damaged one (deleting the
file stays the limit of a local witness); an app may keep heads in its own database instead (any object with the
two methods of `HeadWitness`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import struct
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, final, runtime_checkable

import attrs
import trio

from trioloop.durable.files import config_folder
from trioloop.durable.journal import JournalEntry, JournalError

if TYPE_CHECKING:
    from trioloop.durable.signing import JournalSigner

__all__ = [
    "MAX_WITNESS_FILE_BYTES",
    "FileWitness",
    "HeadWitness",
    "MemoryWitness",
    "WitnessedHead",
    "check_witnessed",
    "default_witness_path",
    "replaces",
    "witness_name",
]


def witness_name(store: str, session: str) -> str:
    """The name a session's heads are witnessed under: its store's identity and its id (never the journal's own
    say: a journal cannot choose which witnessed head it is checked against)."""
    return f"{store}\x00{session}" if store else session


@final
@attrs.frozen(kw_only=True)
class WitnessedHead:
    """The head of a session's journal as it was last made durable: which journal (its id), the session, the last
    entry's number and hash, the store's identity, and whether the journal was retired (`Session.retire`)."""

    journal: str
    session: str
    seq: int
    hash: str
    #: The identity of the store the journal is in (`store_identity`); "" in heads witnessed before it was kept.
    store: str = ""
    #: The journal was retired: a new journal may start under the session's name, and this one never opens again.
    retired: bool = False

    @property
    def name(self) -> str:
        """What the head is witnessed under (`witness_name`)."""
        return witness_name(self.store, self.session)


def replaces(new: WitnessedHead, old: WitnessedHead | None) -> bool:
    """Whether a witness keeps ``new`` in place of ``old`` (the head it holds under the same name): a retirement
    always; after a retirement, any head (the new journal's); else only a later head of the same journal."""
    if old is None or new.retired or old.retired:
        return True
    return new.journal == old.journal and new.seq > old.seq


@runtime_checkable
class HeadWitness(Protocol):
    """Keeps the newest head of each session's journal, by name (`witness_name`), outside the journal's store."""

    async def last_head(self, name: str) -> WitnessedHead | None:
        """The head last witnessed under ``name``, or None (never witnessed)."""
        ...

    async def witness(self, head: WitnessedHead) -> None:
        """Remember ``head`` under ``head.name`` when it `replaces` the head kept there (a later head of the same
        journal, or a retirement; never an earlier head, nor another journal's over one not retired)."""
        ...


def default_witness_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/trioloop/witness`` (``~/.config/trioloop/witness`` when it is not set)."""
    return config_folder(environ) / "witness"


#: A witness file: this line, then two slots of `_SLOT` bytes. A slot is the head's JSON, its length first
#: (4 bytes, big-endian) and its SHA-256 after it, the rest zeros; a slot of length 0 is empty. The JSON carries
#: the MAC of the head (``mac``: HMAC-SHA256 with a key derived from the journal key, `JournalSigner.witness_mac`)
#: and that key's id (``key``).
_MAGIC: Final = b"trioloop witness 2\n"
_SLOT: Final = 1024
_LENGTH: Final = struct.Struct(">I")
_FILE_BYTES: Final = len(_MAGIC) + _LENGTH.size + 2 * _SLOT
#: The largest witness file read: its size is checked before any byte is (a head never needs more than a few
#: slots' worth; a file past this is refused unread).
MAX_WITNESS_FILE_BYTES: Final = 64 * 1024
_HEAD_FIELDS: Final = ("hash", "journal", "retired", "seq", "session", "store")


def _head_text(head: WitnessedHead) -> bytes:
    """The head's fields as canonical JSON: what its MAC is over."""
    return json.dumps(attrs.asdict(head), sort_keys=True, separators=(",", ":")).encode("utf-8")


def _slot_bytes(head: WitnessedHead, size: int, signer: JournalSigner | None) -> bytes | None:
    """``head`` as a slot of ``size`` bytes (with its MAC when there is a ``signer``), or None when it does not fit."""
    fields: dict[str, Any] = attrs.asdict(head)
    if signer is not None:
        fields["key"], fields["mac"] = signer.key_id, signer.witness_mac(_head_text(head))
    text = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("utf-8")
    body = _LENGTH.pack(len(text)) + text + hashlib.sha256(text).digest()
    return body.ljust(size, b"\0") if len(body) <= size else None


class _Edited(Exception):
    """A slot whose MAC the journal key does not make: the file was edited."""


def _slot_head(slot: bytes, signer: JournalSigner | None) -> WitnessedHead | None:
    """The head a slot holds; None for an empty slot, or one whose check fails (a write torn by a crash). A head
    whose MAC is by ``signer``'s key but wrong raises `_Edited`; one without a MAC, or by another key, is read as
    it stands (no worse than a deleted file, the documented limit of a local witness)."""
    if len(slot) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(slot)
    text = slot[_LENGTH.size : _LENGTH.size + length]
    digest = slot[_LENGTH.size + length : _LENGTH.size + length + 32]
    if length == 0 or len(text) != length or hashlib.sha256(text).digest() != digest:
        return None
    try:
        value = json.loads(text)
        head = _head_from(value)
    except (ValueError, KeyError, TypeError):
        return None
    if (
        signer is not None
        and value.get("key") == signer.key_id
        and value.get("mac") != signer.witness_mac(_head_text(head))
    ):
        raise _Edited
    return head


def _head_from(value: Any) -> WitnessedHead:
    head = WitnessedHead(
        journal=value["journal"],
        session=value["session"],
        seq=value["seq"],
        hash=value["hash"],
        store=value.get("store", ""),
        retired=value.get("retired", False),
    )
    if not (
        type(head.journal) is str
        and type(head.session) is str
        and type(head.seq) is int
        and type(head.hash) is str
        and type(head.store) is str
        and type(head.retired) is bool
    ):
        raise TypeError("not a witnessed head")
    return head


#: How many witness files a `FileWitness` keeps the last bytes of (the sessions of a process writing at once).
_KNOWN_FILES: Final = 256


@final
class FileWitness:
    """Heads in files, one per name (`witness_name`), in ``folder`` (default: `default_witness_path`), made
    readable by their owner alone. Reads and writes run in a worker thread (or the store's own, see `witness_now`).

    With ``signer`` (the journal key; `Session.open` passes its own), each head carries a MAC only that key makes
    (`JournalSigner.witness_mac`): a head the key authenticated that was edited since is refused like a damaged
    file. A head without a MAC (an earlier version's, or a witness without a key) or by another key is read as it
    stands: no worse than a deleted file, the limit of a witness kept beside the journal's reader.

    A file holds two slots, each with its own check: a new head overwrites, in place, the slot holding the older
    one, so a write torn by a crash leaves the other slot, one head behind (never a false alarm), and a write is
    one open, one read, one write: no temporary file, no rename. A file's size is checked before it is read
    (`MAX_WITNESS_FILE_BYTES`). Files of the earlier format (one head in JSON, ``.json``) are read, and converted
    at the next write."""

    def __init__(self, folder: str | os.PathLike[str] | None = None, *, signer: JournalSigner | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_witness_path()
        self.signer = signer
        self._files: dict[str, str] = {}  # name -> its file's path (a path built once, not per write)
        # name -> the file's bytes as last read or written, and what they hold: a write finding them unchanged
        # reuses the slots' heads instead of decoding and checking both again.
        self._known: OrderedDict[str, tuple[bytes, tuple[int, list[WitnessedHead | None]]]] = OrderedDict()

    def _path(self, name: str, suffix: str = ".head") -> Path:
        return self.folder / (hashlib.sha256(name.encode("utf-8")).hexdigest()[:32] + suffix)

    def _file(self, name: str) -> str:
        file = self._files.get(name)
        if file is None:
            if len(self._files) >= 1024:
                self._files.clear()
            file = self._files[name] = str(self._path(name))
        return file

    def _unreadable(self, name: str, path: Path, why: str = "is not a witnessed head") -> JournalError:
        return JournalError(f"the witness file for {_shown(name)} {why}: {path}")

    def _read_legacy(self, name: str) -> WitnessedHead | None:
        path = self._path(name, ".json")
        try:
            data = _read_at_most(path, MAX_WITNESS_FILE_BYTES)
        except FileNotFoundError:
            return None
        except OSError:
            raise self._unreadable(name, path) from None
        if data is None:
            raise self._unreadable(name, path, f"is over {MAX_WITNESS_FILE_BYTES} bytes (not read)")
        try:
            head = _head_from(json.loads(data.decode("ascii")))
        except (ValueError, KeyError, TypeError):
            raise self._unreadable(name, path) from None
        if head.journal != name:  # an earlier version kept heads by journal id
            raise self._unreadable(name, path)
        return head

    def _slots(self, name: str, data: bytes) -> tuple[int, list[WitnessedHead | None]]:
        """The slot size and the two slots' heads of a witness file's bytes (`JournalError` if it is not one)."""
        known = self._known.get(name)
        if known is not None and known[0] == data:
            self._known.move_to_end(name)
            return known[1][0], list(known[1][1])
        slots = self._decode_slots(name, data)
        self._remember(name, data, slots[0], list(slots[1]))
        return slots

    def _remember(self, name: str, data: bytes, size: int, heads: list[WitnessedHead | None]) -> None:
        """Keep the last bytes seen of ``name``'s file: the sessions writing now (most recent last; bounded, as a
        witness serves every journal a process ever opens)."""
        self._known[name] = (data, (size, heads))
        self._known.move_to_end(name)
        while len(self._known) > _KNOWN_FILES:
            self._known.popitem(last=False)

    def _decode_slots(self, name: str, data: bytes) -> tuple[int, list[WitnessedHead | None]]:
        path = self._path(name)
        if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _LENGTH.size:
            raise self._unreadable(name, path)
        (size,) = _LENGTH.unpack_from(data, len(_MAGIC))
        first = len(_MAGIC) + _LENGTH.size
        if size < _SLOT or len(data) != first + 2 * size:
            raise self._unreadable(name, path)
        try:
            heads = [_slot_head(data[first + i * size : first + (i + 1) * size], self.signer) for i in (0, 1)]
        except _Edited:
            raise self._unreadable(name, path, "was edited (its MAC is not the journal key's)") from None
        if heads == [None, None]:
            raise self._unreadable(name, path)  # a file is made holding a head: no crash leaves both failing
        if any(head is not None and name not in (head.name, head.journal) for head in heads):
            raise self._unreadable(name, path)
        return size, heads

    def _read(self, name: str) -> WitnessedHead | None:
        path = self._path(name)
        try:
            data = _read_at_most(path, MAX_WITNESS_FILE_BYTES)
        except FileNotFoundError:
            return self._read_legacy(name)
        except OSError:
            raise self._unreadable(name, path) from None
        if data is None:
            raise self._unreadable(name, path, f"is over {MAX_WITNESS_FILE_BYTES} bytes (not read)")
        return _newest(self._slots(name, data)[1])

    def _create(self, head: WitnessedHead) -> None:
        """A new file holding ``head`` (or the head of an earlier format's file when that one is to be kept), put
        in place by one rename."""
        legacy = self._read_legacy(head.name)
        if legacy is not None and not replaces(head, legacy):
            head = legacy
        size = _SLOT
        while (slot := _slot_bytes(head, size, self.signer)) is None:
            size *= 2
        data = _MAGIC + _LENGTH.pack(size) + slot + bytes(size)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self._path(head.name)
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
                self._path(head.name, ".json").unlink()

    def _write(self, head: WitnessedHead) -> None:
        name = head.name
        try:
            descriptor = os.open(self._file(name), os.O_RDWR)
        except FileNotFoundError:
            self._create(head)
            return
        try:
            data = os.pread(descriptor, _FILE_BYTES, 0)
            if len(data) > len(_MAGIC) + _LENGTH.size and _LENGTH.unpack_from(data, len(_MAGIC))[0] != _SLOT:
                # A file with larger slots: its size judged before it is read.
                size = os.fstat(descriptor).st_size
                if size > MAX_WITNESS_FILE_BYTES:
                    raise self._unreadable(name, self._path(name), f"is over {MAX_WITNESS_FILE_BYTES} bytes (not read)")
                data = os.pread(descriptor, size, 0)
            size, heads = self._slots(name, data)
            newest = _newest(heads)
            if not replaces(head, newest):
                return
            slot = _slot_bytes(head, size, self.signer)
            # A retirement, or the first head after one, is written as a new file (the other slot must not keep
            # the other journal's head); so is a head longer than the file's slots (a file with larger ones).
            if slot is not None and not head.retired and not (newest is not None and newest.retired):
                # The slot of the older head (an empty or torn one first): the newer one stays whole meanwhile.
                older = 0 if heads[0] is None or (heads[1] is not None and heads[0].seq < heads[1].seq) else 1
                at = len(_MAGIC) + _LENGTH.size + older * size
                os.pwrite(descriptor, slot, at)
                heads[older] = head
                self._remember(name, data[:at] + slot + data[at + size :], size, heads)
                return
        finally:
            os.close(descriptor)
        self._create(head)

    async def last_head(self, name: str) -> WitnessedHead | None:
        """The newest head in ``name``'s file, or None; `JournalError` for a file that is not a witness file, is
        too large, or was edited."""
        return await trio.to_thread.run_sync(self._read, name)

    def witness_now(self, head: WitnessedHead) -> None:
        """`witness`, in the calling thread: what a store's own thread runs right after the append ``head`` follows
        (`SQLiteJournalStore`), so one hand-over to a thread serves both."""
        self._write(head)

    async def witness(self, head: WitnessedHead) -> None:
        """Write ``head`` into its name's file when it `replaces` the newest head there."""
        # Abandoned when cancelled (a turn's append cut short by Stop or its deadline): the write finishes on its
        # own, and a head never replaces a newer one.
        await trio.to_thread.run_sync(self._write, head, abandon_on_cancel=True)

    def __repr__(self) -> str:
        return f"FileWitness({str(self.folder)!r})"


def _shown(name: str) -> str:
    """A witness name as a person reads it: the session, and its store."""
    store, _, session = name.rpartition("\x00")
    return f"session {session!r}" + (f" in {store}" if store else "")


def _read_at_most(path: Path, limit: int) -> bytes | None:
    """The file's bytes, or None when it is larger than ``limit`` (judged by its size before any byte is read)."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size > limit:
            return None
        data = file.read(limit + 1)
    return None if len(data) > limit else data


def _newest(heads: Sequence[WitnessedHead | None]) -> WitnessedHead | None:
    present = [head for head in heads if head is not None]
    return max(present, key=lambda head: head.seq) if present else None


@final
class MemoryWitness:
    """Heads in this process's memory: for tests, and the shape of a witness an app keeps in its own database."""

    def __init__(self) -> None:
        self.heads: dict[str, WitnessedHead] = {}

    async def last_head(self, name: str) -> WitnessedHead | None:
        """The head last witnessed under ``name``, or None."""
        await trio.lowlevel.checkpoint()
        return self.heads.get(name)

    async def witness(self, head: WitnessedHead) -> None:
        """Keep ``head`` when it `replaces` the one kept under its name."""
        await trio.lowlevel.checkpoint()
        if replaces(head, self.heads.get(head.name)):
            self.heads[head.name] = head


def check_witnessed(entries: Sequence[JournalEntry], head: WitnessedHead | None, journal: str | None = None) -> None:
    """Refuse (`JournalError`, naming both heads) a journal that does not extend ``head``, the head witnessed under
    its session's name: an empty one (unless that journal was retired), a retired one, another journal (``journal``,
    its id, differs from the head's), a shorter one, one whose entry at the witnessed number differs."""
    if head is None:
        return
    witnessed = f"entry {head.seq} ({head.hash[:12]}…) of journal {head.journal}"
    if not entries:
        if head.retired:
            return
        raise JournalError(
            f"session {head.session!r} has no journal, but {witnessed} was witnessed: its entries were deleted "
            "(to start the session over, retire its journal first: Session.retire)"
        )
    last = entries[-1]
    found = f"entry {last.seq} ({last.hash[:12]}…) of journal {journal}" if journal else f"entry {last.seq}"
    if head.retired:
        raise JournalError(
            f"session {head.session!r}'s journal was retired at {witnessed}; this journal ends at {found}",
            seq=entries[0].seq,
        )
    if journal is not None and head.store and head.journal != journal:
        raise JournalError(
            f"the witnessed head of session {head.session!r} is {witnessed}, but this journal ends at {found}: "
            "another journal of the same session was put in its place",
            seq=entries[0].seq,
        )
    if last.seq < head.seq:
        raise JournalError(
            f"the journal ends at {found}, but {witnessed} was witnessed: its newest entries were cut off, or an "
            "older copy was put back",
            seq=last.seq,
        )
    first = entries[0].seq
    if head.seq >= first and entries[head.seq - first].hash != head.hash:
        raise JournalError(
            f"journal entry {head.seq} is not the entry that was witnessed ({witnessed}): the journal was rolled "
            "back and written again",
            seq=head.seq,
        )
