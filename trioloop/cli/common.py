"""What `trioloop demo` and `trioloop chat` share: the console, errors, loading and saving the document, one
turn with its live view and Ctrl-C as Stop, the report after it."""

from __future__ import annotations

import datetime
import errno
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from rich.console import Console
from rich.text import Text

from trioloop.cli.exit_codes import EXIT_INVALID, EXIT_OK, EXIT_TURN_FAILED, EXIT_UNANSWERED, EXIT_USAGE
from trioloop.cli.view import TurnView, outcome_line
from trioloop.machine.reducer import TurnState
from trioloop.runtime.session import Session
from trioloop.threatmodel import ThfError, ThfFile, ThreatModel, load_thf_file, save_thf
from trioloop.threatmodel._safe_yaml import MAX_DOCUMENT_BYTES


class _Console(Console):
    """rich's console, but a closed output raises `BrokenPipeError` for the entry point to end on quietly
    (rich's own answer is ``SystemExit(1)``, which a Trio nursery would report with a traceback)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # what is still printed on the way out (a save's line) is dropped, not raised again
        raise BrokenPipeError(errno.EPIPE, "the output was closed")


def make_console(*, stderr: bool = False) -> Console:
    return _Console(stderr=stderr, highlight=False, soft_wrap=True)


def error(text: str) -> None:
    # Never hard-wrapped: an error line stays one line to copy (the terminal wraps it for the eye).
    make_console(stderr=True).print(Text(text), style="red")


def load_document(path: Path) -> ThfFile | int:
    """The document at ``path``, or the exit status after saying why not: 1 (`EXIT_INVALID`) for a file that
    is not a valid document, 2 (`EXIT_USAGE`) for one that cannot be read, as ``trioloop validate`` exits."""
    try:
        return load_thf_file(path)
    except ThfError as exc:
        error(f"error: {type(exc).__name__}: {exc.message}")
        return EXIT_INVALID
    except OSError as exc:
        error(f"error: cannot read {path.name}: {exc.strerror or type(exc).__name__}")
        return EXIT_USAGE


async def one_turn(session: Session[ThreatModel], view: TurnView, text: str | None) -> TurnState:
    """A turn for ``text`` (None: the turn the journal left open) with its live view and Ctrl-C as Stop."""
    async with trio.open_nursery() as nursery:
        await nursery.start(ctrl_c_stops, session, view.console)
        nursery.start_soon(view.watch)
        nursery.start_soon(view.waiting)
        state = await (session.continue_turn() if text is None else session.send(text))
        view.clear_waiting()
        await view.render(state)
        view.end_text_line()
        nursery.cancel_scope.cancel()
    return state


async def ctrl_c_stops(
    session: Session[ThreatModel], console: Console, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """During a turn, Ctrl-C is Stop (approved changes are kept); a second Ctrl-C quits the program."""
    with trio.open_signal_receiver(signal.SIGINT) as interrupts:
        task_status.started()
        async for _ in interrupts:
            if not session.stop():
                raise KeyboardInterrupt
            console.print(Text("\nStopping the turn (Ctrl-C again quits)…", style="bold"))
            async for _ in interrupts:
                raise KeyboardInterrupt


def exit_status(*, failed: bool = False, unanswered: bool = False) -> int:
    """What a chat or the demo exits with once it ends: `EXIT_TURN_FAILED` when a turn failed, `EXIT_UNANSWERED`
    when the input ended at a card (its turn stopped there, with cards nobody answered), else `EXIT_OK`."""
    return EXIT_TURN_FAILED if failed else EXIT_UNANSWERED if unanswered else EXIT_OK


def interruptible(run: Callable[..., Any], *args: Any) -> int:
    """``trio.run(run, *args)``; a Ctrl-C that quits ends with one line and status 130, never a traceback."""
    code = 130
    try:
        code = trio.run(run, *args)
    except* KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    return code


def report(console: Console, session: Session[ThreatModel], state: TurnState, before: ThreatModel) -> None:
    console.print()
    console.print(Text(outcome_line(state), style="bold"))
    diff = session.kind.diff(before, session.document)
    if diff:
        console.print(Text("Document changes:", style="bold"))
        for line in diff.splitlines():
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
            console.print(Text(line, style=style))
    else:
        console.print(Text("The document is unchanged."))


class Saver:
    """Writes the document when it changed since the last save (atomically, keeping the file's layout).

    Every save is compare-and-swap: when the file on disk is no longer what this chat last read or wrote there
    (someone edited it meanwhile), it is left alone and the approved change is written beside it, under a name
    the person is told, so neither their edit nor the approved change is lost."""

    def __init__(self, console: Console, loaded: ThfFile, target: Path, *, source: Path | None = None) -> None:
        self.console = console
        self.file = loaded
        self.target = target
        # What the target holds as far as this chat knows: the document it read, when it saves in place.
        self._on_disk: bytes | None = loaded.encoded() if source in (None, target) else _current(target)
        self.beside: Path | None = None  # where the changes go once the file changed under this chat

    def save(self, document: ThreatModel) -> None:
        if document is self.file.model or document == self.file.model:
            return
        if self.beside is not None or _current(self.target) != self._on_disk:
            self._save_beside(document)
            return
        try:
            self.file = save_thf(self.target, document, self.file)
            self._on_disk = self.file.encoded()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if "the new content is in place" in reason:  # the rename happened; only its durability is unknown
                error(f"warning: {self.target} was written, but {reason}")
            else:
                error(f"error: could not save {self.target}: {reason}; the file was left as it was")
            return
        self.console.print(Text(f"Saved {self.target}"))

    def _save_beside(self, document: ThreatModel) -> None:
        if self.beside is None:
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
            self.beside = self.target.with_name(f"{self.target.stem}.conflict-{stamp}{self.target.suffix}")
            error(
                f"error: {self.target} changed on disk since this chat last read or wrote it; it was left as it is. "
                f"The approved changes go to {self.beside} instead: compare the two and keep what you want"
            )
        try:
            written = save_thf(self.beside, document, self.file)
        except OSError as exc:
            error(f"error: could not save {self.beside}: {exc.strerror or exc}")
            return
        self.file = written
        self.console.print(Text(f"Saved {self.beside} (not {self.target}: it changed on disk)"))


def warn(text: str) -> None:
    make_console(stderr=True).print(Text(text), style="yellow")


def _current(path: Path) -> bytes | None:
    """The file's bytes now (None when there is none), read bounded: only to compare with what was written."""
    try:
        with open(path, "rb") as file:
            return file.read(MAX_DOCUMENT_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError:
        return b""  # unreadable now: not what was written, so the save goes beside it
