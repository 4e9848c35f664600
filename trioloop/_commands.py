"""`trioloop demo` and `trioloop chat`: a Session driven from the terminal through ``TurnView``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import trio
from rich.console import Console
from rich.text import Text

from trioloop._demo_view import ApproveMode, TurnView, document_diff, outcome_line
from trioloop.loop.machine import TurnState
from trioloop.loop.session import Session
from trioloop.protocol.provider import ChatProvider
from trioloop.providers.scripted import ScriptedProvider
from trioloop.threatmodel import ThfError, ThfFile, ThreatModel, load_thf_file, save_thf
from trioloop.threatmodel.demo import DEMO_LIMITS, DEMO_PROMPT, DEMO_SCRIPT
from trioloop.threatmodel.session import threat_model_session

__all__ = ["DEFAULT_DEMO_FILE", "chat_session", "run_chat", "run_demo"]

_SOURCE_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
_PACKAGED_EXAMPLE = Path(__file__).resolve().parent / "_data" / "payment.thf"  # in a wheel install
DEFAULT_DEMO_FILE = _SOURCE_EXAMPLE if _SOURCE_EXAMPLE.exists() else _PACKAGED_EXAMPLE
_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _error(text: str) -> None:
    Console(stderr=True, highlight=False).print(Text(text), style="red")


def _load(path: Path) -> ThfFile | None:
    try:
        return load_thf_file(path)
    except ThfError as exc:
        _error(f"error: {type(exc).__name__}: {exc.message}")
        return None
    except OSError as exc:
        _error(f"error: cannot read {path.name}: {exc.strerror}")
        return None


async def _one_turn(session: Session[ThreatModel], view: TurnView, text: str) -> TurnState:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(view.watch)
        state = await session.send(text)
        await view.render(state)
        nursery.cancel_scope.cancel()
    return state


def _report(console: Console, session: Session[ThreatModel], state: TurnState, before: ThreatModel) -> None:
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


class _Saver:
    """Writes the document when it changed since the last save (atomically, keeping the file's layout)."""

    def __init__(self, console: Console, loaded: ThfFile, target: Path) -> None:
        self.console = console
        self.file = loaded
        self.target = target

    def save(self, document: ThreatModel) -> None:
        if document is self.file.model or document == self.file.model:
            return
        try:
            self.file = save_thf(self.target, document, self.file)
        except OSError as exc:
            _error(f"error: could not save {self.target}: {exc.strerror or exc}; the file was left as it was")
            return
        self.console.print(Text(f"Saved {self.target}"))


async def _demo(path: Path, mode: ApproveMode, out: Path | None, undo: bool, prompt: Callable[[str], str]) -> int:
    console = _console()
    loaded = _load(path)
    if loaded is None:
        return 1
    document = loaded.model
    async with (
        ScriptedProvider(DEMO_SCRIPT, wire="anthropic") as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1", limits=DEMO_LIMITS) as session,
    ):
        console.print(Text(f"you> {DEMO_PROMPT}", style="bold"))
        view = TurnView(console, session, mode, prompt)
        state = await _one_turn(session, view, DEMO_PROMPT)
        _report(console, session, state, document)
        if session.undo_availability().undoable:
            wants_undo = undo
            if mode == "ask" and not undo:
                answer = await trio.to_thread.run_sync(prompt, "Undo this turn? [y/N] ", abandon_on_cancel=True)
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
            await trio.to_thread.run_sync(save_thf, out, session.document, loaded)
            console.print(Text(f"Wrote {out}"))
    return 0


def run_demo(
    file: str | None, mode: ApproveMode, out: str | None, undo: bool, prompt: Callable[[str], str] = input
) -> int:
    path = Path(file) if file else DEFAULT_DEMO_FILE
    return trio.run(_demo, path, mode, Path(out) if out else None, undo, prompt)


def _real_provider(name: str, key: str) -> ChatProvider:
    if name == "anthropic":
        from trioloop.providers.anthropic import AnthropicProvider

        return AnthropicProvider(api_key=key)
    from trioloop.providers.openai import OpenAIProvider

    return OpenAIProvider(api_key=key)


McpOptions = tuple[Sequence[str], str | None]
"""``--mcp`` command lines and the ``--mcp-config`` file, if any."""


async def _chat(
    path: Path,
    provider_name: str,
    model: str,
    mode: ApproveMode,
    prompt: Callable[[str], str],
    out: Path | None,
    mcp_servers: McpOptions = ((), None),
) -> int:
    key = os.environ.get(_KEY_ENV[provider_name], "")
    if not key:
        _error(f"error: set {_KEY_ENV[provider_name]} to use --provider {provider_name}")
        return 2
    return await chat_session(path, _real_provider(provider_name, key), model, mode, prompt, out, mcp_servers)


async def chat_session(
    path: Path,
    provider: ChatProvider,
    model: str,
    mode: ApproveMode,
    prompt: Callable[[str], str],
    out: Path | None = None,
    mcp_servers: McpOptions = ((), None),
) -> int:
    """The chat loop over any provider, with the tools of any MCP servers named.

    After every turn that changed the document it is saved (to ``out``, else in place), and on Ctrl-C at
    any point whatever the settled tools committed is saved."""
    console = _console()
    loaded = _load(path)
    if loaded is None:
        return 1
    saver = _Saver(console, loaded, out or path)
    async with threat_model_session(document=loaded.model, provider=provider, model=model) as session:
        if not await _add_mcp_servers(session, mcp_servers):
            return 1  # servers that did start close with the session
        console.print(
            Text(
                f"Type a request; an empty line or Ctrl-D ends the chat. Changes are saved to {saver.target}.",
                style="dim",
            )
        )
        try:
            while True:
                try:
                    text = await trio.to_thread.run_sync(prompt, "you> ", abandon_on_cancel=True)
                except EOFError:
                    break
                if not text.strip():
                    break
                before = session.document
                state = await _one_turn(session, TurnView(console, session, mode, prompt), text)
                _report(console, session, state, before)
                saver.save(session.document)
        except BaseException:
            # Ctrl-C (trio may deliver it inside an exception group) or any other end: the document only
            # ever holds whole, committed tool results, so what it holds now is worth keeping.
            saver.save(session.document)
            raise
    return 0


async def _add_mcp_servers(session: Session[ThreatModel], mcp_servers: McpOptions) -> bool:
    """Connect every MCP server as a toolset of ``session`` (its connection lives in the session's nursery)."""
    commands, config = mcp_servers
    if not commands and config is None:
        return True
    try:
        from trioloop import mcp
    except ImportError:
        _error('error: --mcp needs the mcp extra: pip install "trioloop[mcp]"')
        return False
    try:
        servers: list[mcp.McpServer] = []
        if config is not None:
            servers.extend(mcp.load_mcp_config(await trio.Path(config).read_text(encoding="utf-8")))
        for command in commands:
            servers.append(mcp.stdio_server_from_command(command, taken=[server.name for server in servers]))
        console = _console()
        for server in servers:
            toolset = mcp.McpToolset(server)
            added = await session.add_toolset(toolset)
            console.print(Text(f'MCP server "{server.name}": {len(added)} tool(s)', style="dim"))
            for skipped in toolset.skipped:
                console.print(Text(f"  skipped {skipped.name}: {skipped.reason}", style="dim"))
        return True
    except OSError as exc:
        _error(f"error: cannot read the MCP config {config}: {exc.strerror}")
    except (mcp.McpConfigError, mcp.McpConnectionError, ValueError) as exc:
        _error(f"error: {exc}")
    return False


def run_chat(
    file: str,
    provider: str,
    model: str,
    mode: ApproveMode,
    prompt: Callable[[str], str] = input,
    out: str | None = None,
    *,
    mcp: Sequence[str] = (),
    mcp_config: str | None = None,
) -> int:
    try:
        return trio.run(
            _chat, Path(file), provider, model, mode, prompt, Path(out) if out else None, (tuple(mcp), mcp_config)
        )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is None:
            raise
        print("interrupted", file=sys.stderr)
        return 130
