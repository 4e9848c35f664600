"""A session written to a file and read back: the session file (`Session.save`, `Session.resume`: the
conversation, the document, the undo history, the turn numbering) and the transcript (the conversation alone,
versioned JSON). Every write is atomic; every read is bounded and checked (a conversation must be pairable).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from trioloop.durable.files import write_atomic
from trioloop.durable.session_file import (
    SessionFileError,
    SessionSnapshot,
    UndoRecord,
    decode_session,
    encode_session,
)
from trioloop.machine.document import TextDocumentKind
from trioloop.machine.limits import TurnLimits
from trioloop.machine.tools import RegisteredTool, ToolRegistry
from trioloop.protocol.messages import Message, assert_tool_pairing
from trioloop.protocol.provider import ChatProvider
from trioloop.protocol.serialization import SerializationError, messages_from_json, messages_to_json

if TYPE_CHECKING:
    from collections.abc import Iterable

    from trioloop.runtime.session import Session

__all__ = ["TranscriptError", "load_transcript", "resume_session", "save_session", "snapshot_of", "transcript_of"]

D = TypeVar("D")
_TRANSCRIPT_VERSION = 1


class TranscriptError(ValueError):
    """A transcript file that is not a valid, pairable conversation."""


def snapshot_of(session: Session[D]) -> SessionSnapshot[D]:
    """What a session file holds: conversation, document, undo history, the last turn, the turn count, the tokens."""
    undo = session.undo_history
    return SessionSnapshot(
        messages=session.history,
        document=session.document,
        undo=tuple(UndoRecord(turn_id=e.turn_id, document=e.document) for e in undo.entries),
        undo_max_entries=undo.max_entries,
        last_turn_id=session._last_turn_id,
        turn_count=session._turns_started,
        model=session.model,
        kind=session.kind.name,
        source=session.source,
        usage=session.usage,
    )


def save_session(session: Session[Any], path: str | os.PathLike[str]) -> None:
    """`Session.save`: the session file, written atomically."""
    kind = session.kind
    if not isinstance(kind, TextDocumentKind):
        raise TypeError(f"the {kind.name} kind has no text form (dump/load), so this session cannot be saved")
    write_atomic(path, encode_session(snapshot_of(session), dump_document=kind.dump))


def resume_session(
    cls: type[Session[D]],
    path: str | os.PathLike[str],
    *,
    kind: TextDocumentKind[D],
    provider: ChatProvider,
    model: str | None,
    tools: ToolRegistry[D] | Iterable[RegisteredTool[D]],
    limits: TurnLimits,
    system_prompt: str | None,
    max_output_tokens: int,
    nursery: trio.Nursery | None,
    max_bytes: int,
) -> Session[D]:
    """`Session.resume`: a session continued from the file at ``path`` (read up to ``max_bytes``)."""
    try:
        with open(path, "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise SessionFileError(f"the session file could not be read ({exc.strerror or type(exc).__name__})") from None
    snapshot = decode_session(data, load_document=kind.load, max_bytes=max_bytes)
    if snapshot.kind not in (None, kind.name):
        raise SessionFileError(f"the session file holds a {snapshot.kind} document, not a {kind.name}")
    chosen = model if model is not None else snapshot.model
    if chosen is None:
        raise SessionFileError("the session file names no model: pass model=")
    return cls._restored(
        document=snapshot.document,
        history=snapshot.messages,
        undo=snapshot.undo_history(),
        turns_started=snapshot.turns_started(),
        last_turn_id=snapshot.last_turn_id,
        usage=snapshot.usage,
        kind=kind,
        provider=provider,
        model=chosen,
        tools=tools,
        limits=limits,
        system_prompt=system_prompt,
        max_output_tokens=max_output_tokens,
        nursery=nursery,
        source=snapshot.source,
    )


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
