"""`trioloop audit`: a journaled session's trail, verified as it is printed."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from trioloop.cli.common import error

__all__ = ["run_audit"]


def run_audit(target: str, session: str | None, *, as_json: bool) -> int:
    """``trioloop audit``: every session's trail (or one's), verified; exit 1 naming the first bad entry."""
    if "://" not in target and not Path(target).is_file():
        error(f"no journal at {target}")
        return 2
    return trio.run(_audit, target, session, as_json)


async def _audit(target: str, session: str | None, as_json: bool) -> int:
    from trioloop.durable.audit import audit_lines, audit_records
    from trioloop.durable.journal import JournalError
    from trioloop.durable.store import JournalStoreError
    from trioloop.durable.targets import open_store

    try:
        store = open_store(target)
    except (ValueError, ImportError) as exc:
        error(str(exc))
        return 2
    failed = False
    async with store:
        try:
            ids = [session] if session is not None else list(await store.session_ids())
            for session_id in ids:
                stored = await store.read(session_id)
                if not stored:
                    error(f"no journal for session {session_id!r}")
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
                        print(f"session {session_id}: hash chain verified ({len(stored)} entries)")
                except JournalError as exc:
                    error(f"session {session_id}: entry {exc.seq} does not verify: {exc}")
                    failed = True
        except JournalStoreError as exc:
            error(f"the journal store could not be read: {exc}")
            return 2
    return 1 if failed else 0
