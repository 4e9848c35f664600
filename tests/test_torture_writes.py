"""Write failures: every file trioloop writes survives a failure at any system call of the write.

For each writer (a `.thf` save patched into the file's text, a session file, a transcript-shaped
JSON file) the write is first run once under a counter of the system calls `write_atomic` makes
(open, write, fsync, close, chmod, replace; writes are cut into 4 KiB pieces so a document takes
several), then once per call index k with call k failing: ENOSPC (a full disk), EIO, or a
KeyboardInterrupt. What must hold every time: the target holds the old bytes or the new bytes,
whole (the old ones whenever the failure came before the rename), no temporary file is left, and
the error reaches the caller as the same type with its errno.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from torture_support import PAYMENT, payment, record

from trioloop.durable.files import write_atomic
from trioloop.durable.session_file import SessionSnapshot, UndoRecord, encode_session
from trioloop.protocol import Message
from trioloop.threatmodel import dump_thf, load_thf_file, save_thf

STEPS = ("open", "write", "fsync", "close", "chmod", "replace")
FAULTS: dict[str, Callable[[], BaseException]] = {
    "ENOSPC": lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    "EIO": lambda: OSError(errno.EIO, os.strerror(errno.EIO)),
    "KeyboardInterrupt": KeyboardInterrupt,
}
PIECE = 4096


class _Faults:
    """Wraps the os functions write_atomic uses; call number ``fail_at`` (0-based, over all of them) fails."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int | None, fault: Callable[[], BaseException]):
        self.calls: list[str] = []
        self.fail_at = fail_at
        self.fault = fault
        for name in STEPS:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            index = len(self.calls)
            self.calls.append(name)
            if name == "write":
                args = (args[0], bytes(args[1][:PIECE]))
            if index == self.fail_at:
                if name == "close":
                    real(*args, **kwargs)  # the descriptor is gone, and the close still reports an error
                raise self.fault()
            return real(*args, **kwargs)

        return step


def _writers(folder: Path) -> dict[str, tuple[Path, bytes, Callable[[], object]]]:
    """name -> (target, old bytes, a write of new bytes)."""
    thf = folder / "model.thf"
    thf.write_text("# hand-written header\n" + PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    loaded = load_thf_file(thf)
    edited = attrs.evolve(loaded.model, threats=loaded.model.threats[:-1])

    session = folder / "chat.session.json"
    snapshot = SessionSnapshot(messages=(Message.user("hi"), Message.assistant("hello")), document=payment())
    session.write_bytes(encode_session(snapshot, dump_document=dump_thf))
    newer = attrs.evolve(snapshot, undo=(UndoRecord(turn_id="turn-1", document=payment()),), turn_count=1)
    newer_bytes = encode_session(newer, dump_document=dump_thf)

    transcript = folder / "transcript.json"
    transcript.write_text(json.dumps({"version": 1, "messages": []}), encoding="utf-8")
    text = json.dumps({"version": 1, "messages": [{"role": "user", "content": "x" * 20_000}]})
    return {
        ".thf save": (thf, thf.read_bytes(), lambda: save_thf(thf, edited, loaded)),
        "session file": (session, session.read_bytes(), lambda: write_atomic(session, newer_bytes)),
        "transcript": (transcript, transcript.read_bytes(), lambda: write_atomic(transcript, text.encode())),
    }


@pytest.mark.parametrize("writer", [".thf save", "session file", "transcript"])
def test_a_failure_at_every_system_call_of_a_write_loses_nothing(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, old, write = _writers(tmp_path)[writer]
    counter = _Faults(monkeypatch, None, FAULTS["EIO"])
    write()
    monkeypatch.undo()
    new = target.read_bytes()
    assert new != old
    steps = list(counter.calls)
    assert steps.count("write") >= 2 and "replace" in steps
    tried = held = 0
    for name, fault in FAULTS.items():
        for index, step in enumerate(steps):
            target.write_bytes(old)
            faults = _Faults(monkeypatch, index, fault)
            raised: BaseException | None = None
            try:
                write()
            except BaseException as error:  # the torture checks what escaped
                raised = error
            monkeypatch.undo()
            tried += 1
            content = target.read_bytes()
            before_rename = index < steps.index("replace") or (index == steps.index("replace"))
            ok = (
                raised is not None
                and type(raised) is type(fault())
                and (not isinstance(raised, OSError) or raised.errno == fault().errno)
                and content in ((old,) if before_rename else (old, new))
                and sorted(os.listdir(tmp_path)) == sorted(p.name for p in _targets(tmp_path))
                and faults.calls[index] == step
            )
            assert ok, (writer, name, index, step, raised)
            held += 1
    record(
        f"write failure at every system call: {writer}",
        tried=tried,
        held=held,
        note=f"{len(steps)} calls x {len(FAULTS)} faults",
    )


def _targets(folder: Path) -> list[Path]:
    return [folder / "model.thf", folder / "chat.session.json", folder / "transcript.json"]
