"""`trioloop audit`: a journaled session's trail, verified as it is printed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from trioloop.cli.common import error
from trioloop.cli.exit_codes import EXIT_INVALID, EXIT_OK, EXIT_UNVERIFIED, EXIT_USAGE

if TYPE_CHECKING:
    from trioloop.durable.signing import JournalKeys, JournalSigner

__all__ = ["run_audit"]


def run_audit(
    target: str,
    session: str | None,
    *,
    as_json: bool,
    public_keys: Sequence[str] = (),
    key_files: Sequence[str] = (),
) -> int:
    """``trioloop audit``: every session's trail (or one's), verified. Exit 0 when every session is verified with a
    public key, 1 naming the first bad entry, `EXIT_UNVERIFIED` when the chain holds but no key was there to check who
    wrote it (nothing verified: never 0), 2 when there is nothing to audit (no journal at ``target``, no session
    ``session`` in it) or a key given is not one (a ``TRIOLOOP_JOURNAL_KEY`` that names no key file included)."""
    if "://" not in target and not Path(target).is_file():
        error(f"no journal at {target}")
        return EXIT_USAGE
    from trioloop.durable.signing import JournalKeyError

    try:
        keys, own = _keys(public_keys, key_files)
    except JournalKeyError as exc:
        error(f"error: {exc}")
        return EXIT_USAGE
    return trio.run(_audit, target, session, as_json, keys, own)


def _keys(public_keys: Sequence[str], key_files: Sequence[str]) -> tuple[JournalKeys | None, JournalSigner | None]:
    """The public keys that check the seals (those given, in files, and this user's own signing key when it exists:
    never made here, an audit writes nothing), and that own key (what checks the witness's MACs)."""
    from trioloop.durable.signing import JournalSigner, given_public_keys

    keys = given_public_keys(public_keys, key_files)
    own = JournalSigner.existing()
    if own is not None:
        keys = own.keys if keys is None else keys | own.keys
    return keys, own


async def _audit(
    target: str, session: str | None, as_json: bool, keys: JournalKeys | None, own: JournalSigner | None
) -> int:
    from trioloop.durable.audit import audit_lines, audit_records, verify_session
    from trioloop.durable.journal import JournalError
    from trioloop.durable.store import JournalStoreError
    from trioloop.durable.targets import open_store
    from trioloop.durable.witness import FileWitness

    try:
        store = open_store(target, read_only=True)
    except (ValueError, ImportError) as exc:
        error(str(exc))
        return EXIT_USAGE
    witness = FileWitness(signer=own)
    verdicts = []
    async with store:
        try:
            ids = [session] if session is not None else list(await store.session_ids())
            for session_id in ids:
                stored, verdict = await verify_session(store, session_id, keys=keys, witness=witness)
                if verdict.verdict == "missing":
                    error(f"no journal for session {session_id!r}")
                    if session is not None:
                        return EXIT_USAGE  # a session the store does not hold: nothing was verified, nor failed
                    continue
                if as_json:
                    print(json.dumps({"session": session_id, **verdict.record()}, ensure_ascii=True))
                else:
                    print(f"session {session_id}: {len(stored)} entries")
                try:  # the trail, as far as it holds (the verdict above or below says why it stops)
                    if as_json:
                        for record in audit_records(stored):
                            print(json.dumps({"session": session_id, **record}, ensure_ascii=True))
                    else:
                        for line in audit_lines(stored):
                            print(line)
                except JournalError:
                    pass
                if not as_json:
                    (error if verdict.verdict != "verified" else print)(verdict.describe())
                verdicts.append(verdict.verdict)
        except JournalStoreError as exc:
            error(f"the journal store could not be read: {exc}")
            return EXIT_USAGE
    if "refused" in verdicts:
        return EXIT_INVALID
    return EXIT_UNVERIFIED if "unverified" in verdicts else EXIT_OK
