"""The audit trail of a journaled session: who approved which exact input, when, what the card showed, what
changed; and whether the journal is the one that was written (its hash chain).

`audit_session` reads a session's entries from a store (no lease: a running session can be audited) and
yields printable lines; `audit_records` gives the same as JSON-ready dicts (``trioloop audit --json`` prints
one per line). Both verify numbering and the hash chain as they go and stop at the first entry that does not
match, raising `JournalError` naming it, after yielding every entry before it. (The code is in
`trioloop.durable.audit`.)
"""

from trioloop.durable.audit import audit_lines, audit_records, audit_session, verified_entries

__all__ = ["audit_lines", "audit_records", "audit_session", "verified_entries"]
