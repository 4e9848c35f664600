"""A session written to a file and read back: the session file (`Session.save`, `Session.resume`: the
conversation, the document, the undo history, the turn numbering) and the transcript (the conversation alone,
versioned JSON). Every write is atomic; every read is bounded and checked (a conversation must be pairable).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

from trioloop.durable.files import write_atomic
from trioloop.durable.session_file import (
    SessionFileError,
    SessionSnapshot,
    UndoRecord,
    decode_session,
    encode_session,
)
from trioloop.machine.document import DocumentKind, TextDocumentKind
from trioloop.machine.rules import ApprovalRule, Verdict
from trioloop.protocol.events import Usage
from trioloop.protocol.messages import Message, assert_tool_pairing
from trioloop.protocol.serialization import SerializationError, messages_from_json, messages_to_json
from trioloop.runtime.workspace import Workspace

__all__ = [
    "TranscriptError",
    "load_transcript",
    "read_session_file",
    "restorable_rules",
    "save_snapshot",
    "save_transcript",
    "snapshot_of",
    "transcript_of",
]

D = TypeVar("D")
_TRANSCRIPT_VERSION = 1


class TranscriptError(ValueError):
    """A transcript file that is not a valid, pairable conversation."""


def snapshot_of(
    workspace: Workspace[D],
    *,
    history: tuple[Message, ...],
    last_turn_id: str | None,
    turn_count: int,
    usage: Usage,
    model: str,
    source: str | None,
    rules: tuple[ApprovalRule, ...] = (),
) -> SessionSnapshot[D]:
    """What a session file holds: conversation, document, undo history, the last turn, the turn count, the tokens."""
    undo = workspace.undo
    return SessionSnapshot(
        messages=history,
        document=workspace.document,
        undo=tuple(UndoRecord(turn_id=e.turn_id, document=e.document) for e in undo.entries),
        undo_max_entries=undo.max_entries,
        last_turn_id=last_turn_id,
        turn_count=turn_count,
        model=model,
        kind=workspace.kind.name,
        source=source,
        usage=usage,
        rules=rules,
    )


def save_snapshot(snapshot: SessionSnapshot[D], kind: DocumentKind[D], path: str | os.PathLike[str]) -> None:
    """`Session.save`: the session file, written atomically."""
    if not isinstance(kind, TextDocumentKind):
        raise TypeError(f"the {kind.name} kind has no text form (dump/load), so this session cannot be saved")
    write_atomic(path, encode_session(snapshot, dump_document=kind.dump))


def read_session_file(path: str | os.PathLike[str], kind: TextDocumentKind[D], max_bytes: int) -> SessionSnapshot[D]:
    """`Session.resume`: the session file at ``path`` (read up to ``max_bytes``), checked against ``kind``."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > max_bytes:  # judged by its size before a byte of it is read
                raise SessionFileError(f"the session file is larger than {max_bytes} bytes ({size}): it was not read")
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise SessionFileError(f"the session file could not be read ({exc.strerror or type(exc).__name__})") from None
    snapshot = decode_session(data, load_document=kind.load, max_bytes=max_bytes)
    if snapshot.kind not in (None, kind.name):
        raise SessionFileError(f"the session file holds a {snapshot.kind} document, not a {kind.name}")
    return snapshot


def transcript_of(model: str, history: tuple[Message, ...]) -> dict[str, Any]:
    """The conversation as a versioned JSON-ready dict."""
    return {"version": _TRANSCRIPT_VERSION, "model": model, "messages": messages_to_json(history)}


def save_transcript(transcript: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``transcript`` atomically: on any failure the file at ``path`` is left as it was."""
    text = json.dumps(transcript, ensure_ascii=False, indent=2) + "\n"
    write_atomic(path, text.encode("utf-8"))


def load_transcript(path: str | os.PathLike[str]) -> tuple[Message, ...]:
    """Read a saved conversation; refuse one that is malformed or not pairable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TranscriptError(f"The transcript could not be read ({type(exc).__name__}).") from None
    if not isinstance(data, dict) or data.get("version") != _TRANSCRIPT_VERSION:
        raise TranscriptError("The transcript is not a trioloop transcript of a known version.")
    try:
        messages = messages_from_json(data.get("messages"))
    except SerializationError as exc:
        raise TranscriptError(f"The transcript has an invalid message: {exc}") from None
    problems = assert_tool_pairing(messages)
    if problems:
        first = problems[0]
        raise TranscriptError(f"The transcript is not pairable: {first.kind.value} for call {first.call_id!r}.")
    return messages


def restorable_rules(
    rules: tuple[ApprovalRule, ...], trust_allow: bool
) -> tuple[tuple[ApprovalRule, ...], tuple[ApprovalRule, ...]]:
    """A session file's session rules as `Session.resume` restores them, and those it withholds: an unsigned file's
    allow rules only when the app trusts the file (its deny and ask rules can only make the review stricter)."""
    if trust_allow:
        return rules, ()
    allows = tuple(rule for rule in rules if rule.verdict is Verdict.ALLOW)
    return tuple(rule for rule in rules if rule.verdict is not Verdict.ALLOW), allows
