"""The audit trail of a journaled session: who approved which exact input, when, what the card showed, what
changed; and whether the journal is the one that was written (its hash chain).

`audit_session` reads a session's entries from a store (no lease: a running session can be audited) and
yields printable lines; `audit_records` gives the same as JSON-ready dicts (``trioloop audit --json`` prints
one per line). Both verify numbering and the hash chain as they go and stop at the first entry that does not
match, raising `JournalError` naming it, after yielding every entry before it. `verify_session` judges a whole
session as one consistent view (its `AuditVerdict`: verified, unverified without a key, refused, missing). (The
code is in `trioloop.durable.audit`.)
"""

from trioloop.durable.audit import (
    AuditVerdict,
    audit_lines,
    audit_records,
    audit_session,
    verified_entries,
    verify_session,
)

__all__ = ["AuditVerdict", "audit_lines", "audit_records", "audit_session", "verified_entries", "verify_session"]
