"""`trioloop audit`: a journaled session's trail, verified as it is printed."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from trioloop.cli.common import error
from trioloop.cli.exit_codes import EXIT_INVALID, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from trioloop.durable.signing import JournalKeys, JournalSigner

__all__ = ["run_audit"]


def run_audit(target: str, session: str | None, *, as_json: bool, public_keys: Sequence[str] = ()) -> int:
    """``trioloop audit``: every session's trail (or one's), verified; exit 1 naming the first bad entry, 2 when
    there is nothing to audit (no journal at ``target``, no session ``session`` in it) or a key is not one."""
    if "://" not in target and not Path(target).is_file():
        error(f"no journal at {target}")
        return EXIT_USAGE
    try:
        keys = _keys(public_keys)
    except ValueError as exc:
        error(str(exc))
        return EXIT_USAGE
    return trio.run(_audit, target, session, as_json, keys)


def _keys(public_keys: Sequence[str]) -> JournalKeys | None:
    """The public keys that check the seals: those given, and the signing key of this user when it exists (never
    made here: an audit writes nothing)."""
    import base64
    import binascii

    from trioloop.durable.signing import KEY_ENV, JournalKeys, JournalSigner, default_key_path

    given: list[bytes] = []
    for text in public_keys:
        try:
            given.append(base64.b64decode(text.split()[-1], validate=True))
        except (binascii.Error, ValueError, IndexError):
            raise ValueError(f"not a public key (base64 of 32 bytes, as `trioloop key` prints): {text!r}") from None
    own = os.environ.get(KEY_ENV) or default_key_path()
    if Path(own).is_file():
        given.append(JournalSigner.load(own).public_key)
    return JournalKeys(given) if given else None


async def _audit(target: str, session: str | None, as_json: bool, keys: JournalKeys | None) -> int:
    from trioloop.durable.audit import audit_lines, audit_records
    from trioloop.durable.journal import JournalError, decode_entries, journal_id_of, verify_journal
    from trioloop.durable.store import JournalStoreError, store_identity
    from trioloop.durable.targets import open_store
    from trioloop.durable.witness import FileWitness, check_witnessed, witness_name

    try:
        store = open_store(target, read_only=True)
    except (ValueError, ImportError) as exc:
        error(str(exc))
        return EXIT_USAGE
    witness = FileWitness(signer=_own_signer())
    failed = False
    async with store:
        try:
            ids = [session] if session is not None else list(await store.session_ids())
            for session_id in ids:
                try:
                    stored = await store.read(session_id)
                except JournalError as exc:  # an entry too large to read, or not stored as bytes
                    error(_refusal(session_id, exc))
                    failed = True
                    continue
                if not stored:
                    error(f"no journal for session {session_id!r}")
                    if session is not None:
                        return EXIT_USAGE  # a session the store does not hold: nothing was verified, nor failed
                    failed = True
                    continue
                if not as_json:
                    print(f"session {session_id}: {len(stored)} entries")
                try:
                    if as_json:
                        for record in audit_records(stored):
                            print(json.dumps({"session": session_id, **record}, ensure_ascii=True))
                    else:
                        for line in audit_lines(stored):
                            print(line)
                    entries = decode_entries(stored)
                    integrity = verify_journal(entries, session_id=session_id, keys=keys)
                    journal_id = journal_id_of(entries, session_id)
                    head = await witness.last_head(witness_name(store_identity(store), session_id))
                    if head is None:  # a head an earlier version kept under the journal's own id
                        legacy = await witness.last_head(journal_id)
                        head = legacy if legacy is not None and not legacy.store else None
                    check_witnessed(entries, head, journal_id)
                    if not as_json:
                        witnessed = "" if head is None else f"; witnessed up to entry {head.seq}"
                        verdict = f"hash chain verified ({len(stored)} entries); {integrity.describe()}{witnessed}"
                        print(f"session {session_id}: {verdict}")
                except JournalError as exc:
                    error(_refusal(session_id, exc))
                    failed = True
        except JournalStoreError as exc:
            error(f"the journal store could not be read: {exc}")
            return EXIT_USAGE
    return EXIT_INVALID if failed else EXIT_OK


def _own_signer() -> JournalSigner | None:
    """This user's signing key when it exists (never made here): what checks the witness's MACs."""
    from trioloop.durable.signing import KEY_ENV, JournalKeyError, JournalSigner, default_key_path

    own = os.environ.get(KEY_ENV) or default_key_path()
    try:
        return JournalSigner.load(own) if Path(own).is_file() else None
    except JournalKeyError:
        return None


def _refusal(session_id: str, exc: Exception) -> str:
    seq = getattr(exc, "seq", None)
    where = f"entry {seq}" if seq is not None else "the journal"
    return f"session {session_id}: {where} does not verify: {exc}"
