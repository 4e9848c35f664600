"""`trioloop demo` and `trioloop chat`: a Session driven from the terminal through ``TurnView``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from rich.console import Console
from rich.text import Text

from trioloop._demo_view import ApproveMode, LinePrompt, TurnView, document_diff, outcome_line
from trioloop.loop.machine import TurnState
from trioloop.loop.session import Session
from trioloop.protocol.provider import ChatProvider
from trioloop.providers.scripted import ScriptedProvider
from trioloop.threatmodel import ThfError, ThreatModel, dump_thf, load_thf
from trioloop.threatmodel.demo import DEMO_EDITS, DEMO_LIMITS, DEMO_PROMPT, DEMO_SCRIPT

__all__ = ["DEFAULT_DEMO_FILE", "run_chat", "run_demo"]

_SOURCE_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
_PACKAGED_EXAMPLE = Path(__file__).resolve().parent / "_data" / "payment.thf"  # in a wheel install
DEFAULT_DEMO_FILE = _SOURCE_EXAMPLE if _SOURCE_EXAMPLE.exists() else _PACKAGED_EXAMPLE
_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _error(text: str) -> None:
    Console(stderr=True, highlight=False).print(Text(text), style="red")


def _load(path: Path) -> ThreatModel | None:
    try:
        return load_thf(path)
    except ThfError as exc:
        _error(f"error: {type(exc).__name__}: {exc.message}")
        return None
    except OSError as exc:
        _error(f"error: cannot read {path.name}: {exc.strerror}")
        return None


async def _one_turn(session: Session, view: TurnView, text: str) -> TurnState:
    async with trio.open_nursery() as nursery:
        await nursery.start(_ctrl_c_stops, session, view.console)
        nursery.start_soon(view.watch)
        state = await session.send(text)
        await view.render(state)
        nursery.cancel_scope.cancel()
    return state


async def _ctrl_c_stops(
    session: Session, console: Console, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
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


def _interruptible(run: Callable[..., Any], *args: Any) -> int:
    """``trio.run(run, *args)``; a Ctrl-C that quits ends with one line and status 130, never a traceback."""
    code = 130
    try:
        code = trio.run(run, *args)
    except* KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    return code


def _report(console: Console, session: Session, state: TurnState, before: ThreatModel) -> None:
    console.print()
    console.print(Text(outcome_line(state), style="bold"))
    diff = document_diff(before, session.document)
    if diff:
        console.print(Text("Document changes:", style="bold"))
        for line in diff.splitlines():
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
            console.print(Text(line, style=style))
    else:
        console.print(Text("The document is unchanged."))


async def _demo(path: Path, mode: ApproveMode, out: Path | None, undo: bool, prompt: Callable[[str], str]) -> int:
    console = _console()
    document = _load(path)
    if document is None:
        return 1
    async with ScriptedProvider(DEMO_SCRIPT, wire="anthropic") as provider:
        session = Session(document=document, provider=provider, model="scripted-1", limits=DEMO_LIMITS)
        console.print(Text(f"you> {DEMO_PROMPT}", style="bold"))
        view = TurnView(console, session, mode, LinePrompt(prompt), scripted_edits=DEMO_EDITS)
        state = await _one_turn(session, view, DEMO_PROMPT)
        _report(console, session, state, document)
        if session.undo_availability().undoable:
            wants_undo = undo
            if mode == "ask" and not undo:
                answer = await view.lines.ask("Undo this turn? [y/N] ")
                wants_undo = answer.strip().lower().startswith("y")
            if wants_undo:
                session.undo_last_turn()
                same = session.document == document
                console.print(
                    Text(f"Undone: the document is {'back to' if same else 'NOT'} its state before the turn.")
                )
            else:
                console.print(Text("Undo is available for this turn (trioloop demo --undo shows it)."))
        if out is not None:
            await trio.Path(out).write_text(dump_thf(session.document), encoding="utf-8")
            console.print(Text(f"Wrote {out}"))
    return 0


def run_demo(
    file: str | None, mode: ApproveMode, out: str | None, undo: bool, prompt: Callable[[str], str] = input
) -> int:
    path = Path(file) if file else DEFAULT_DEMO_FILE
    return _interruptible(_demo, path, mode, Path(out) if out else None, undo, prompt)


def _real_provider(name: str, key: str) -> ChatProvider:
    if name == "anthropic":
        from trioloop.providers.anthropic import AnthropicProvider

        return AnthropicProvider(api_key=key)
    from trioloop.providers.openai import OpenAIProvider

    return OpenAIProvider(api_key=key)


async def _chat(path: Path, provider_name: str, model: str, mode: ApproveMode, prompt: Callable[[str], str]) -> int:
    console = _console()
    key = os.environ.get(_KEY_ENV[provider_name], "")
    if not key:
        _error(f"error: set {_KEY_ENV[provider_name]} to use --provider {provider_name}")
        return 2
    document = _load(path)
    if document is None:
        return 1
    session = Session(document=document, provider=_real_provider(provider_name, key), model=model)
    console.print(Text("Type a request; an empty line or Ctrl-D ends the chat.", style="dim"))
    lines = LinePrompt(prompt)  # one reader for the whole chat: a read a Stop abandoned is not lost
    while True:
        try:
            text = await lines.ask("you> ")
        except EOFError:
            break
        if not text.strip():
            break
        before = session.document
        state = await _one_turn(session, TurnView(console, session, mode, lines), text)
        _report(console, session, state, before)
    path_out = path.with_suffix(".chat.thf")
    if session.document != document:
        await trio.Path(path_out).write_text(dump_thf(session.document), encoding="utf-8")
        console.print(Text(f"Wrote {path_out}"))
    return 0


def run_chat(file: str, provider: str, model: str, mode: ApproveMode, prompt: Callable[[str], str] = input) -> int:
    return _interruptible(_chat, Path(file), provider, model, mode, prompt)
