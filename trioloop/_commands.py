"""`trioloop demo` and `trioloop chat`: a Session driven from the terminal through ``TurnView``."""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import trio
from rich.console import Console
from rich.text import Text

from trioloop._demo_view import ApproveMode, LinePrompt, TurnView, outcome_line
from trioloop.loop.machine import Outcome, TurnState
from trioloop.loop.session import Session
from trioloop.protocol.events import Usage, usage_sum
from trioloop.protocol.preflight import lookup_model, unknown_model_warning
from trioloop.protocol.provider import ChatProvider
from trioloop.providers.retry import RetryNotice
from trioloop.providers.scripted import ScriptedProvider
from trioloop.providers.transport import is_loopback_host
from trioloop.threatmodel import ThfError, ThfFile, ThreatModel, load_thf_file, save_thf
from trioloop.threatmodel.demo import DEMO_EDITS, DEMO_LIMITS, DEMO_PROMPT, DEMO_SCRIPT
from trioloop.threatmodel.session import threat_model_session

__all__ = ["DEFAULT_DEMO_FILE", "DEFAULT_MODELS", "chat_session", "run_chat", "run_demo"]

_SOURCE_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
_PACKAGED_EXAMPLE = Path(__file__).resolve().parent / "_data" / "payment.thf"  # in a wheel install
DEFAULT_DEMO_FILE = _SOURCE_EXAMPLE if _SOURCE_EXAMPLE.exists() else _PACKAGED_EXAMPLE
_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY", "openai-responses": "OPENAI_API_KEY"}
_BASE_URL_ENV = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL", "openai-responses": "OPENAI_BASE_URL"}
DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4.1", "openai-responses": "gpt-5"}
_MODEL_VENDOR = {"openai-responses": "openai"}  # the model table is per vendor: both OpenAI APIs serve its models
_LOCAL_PLACEHOLDER_KEY = "no-key-needed-locally"  # local servers (Ollama, llama.cpp) ignore the key
EXIT_USAGE, EXIT_TURN_FAILED, EXIT_INTERRUPTED = 2, 3, 130


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _error(text: str) -> None:
    # Never hard-wrapped: an error line stays one line to copy (the terminal wraps it for the eye).
    Console(stderr=True, highlight=False, soft_wrap=True).print(Text(text), style="red")


def _load(path: Path) -> ThfFile | None:
    try:
        return load_thf_file(path)
    except ThfError as exc:
        _error(f"error: {type(exc).__name__}: {exc.message}")
        return None
    except OSError as exc:
        _error(f"error: cannot read {path.name}: {exc.strerror}")
        return None


async def _one_turn(session: Session[ThreatModel], view: TurnView, text: str | None) -> TurnState:
    """A turn for ``text`` (None: the turn the journal left open) with its live view and Ctrl-C as Stop."""
    async with trio.open_nursery() as nursery:
        await nursery.start(_ctrl_c_stops, session, view.console)
        nursery.start_soon(view.watch)
        state = await (session.continue_turn() if text is None else session.send(text))
        await view.render(state)
        nursery.cancel_scope.cancel()
    return state


async def _ctrl_c_stops(
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


def _interruptible(run: Callable[..., Any], *args: Any) -> int:
    """``trio.run(run, *args)``; a Ctrl-C that quits ends with one line and status 130, never a traceback."""
    code = 130
    try:
        code = trio.run(run, *args)
    except* KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    return code


def _report(console: Console, session: Session[ThreatModel], state: TurnState, before: ThreatModel) -> None:
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
            reason = exc.strerror or str(exc)
            if "the new content is in place" in reason:  # the rename happened; only its durability is unknown
                _error(f"warning: {self.target} was written, but {reason}")
            else:
                _error(f"error: could not save {self.target}: {reason}; the file was left as it was")
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
            await trio.to_thread.run_sync(save_thf, out, session.document, loaded)
            console.print(Text(f"Wrote {out}"))
    return 0


def run_demo(
    file: str | None, mode: ApproveMode, out: str | None, undo: bool, prompt: Callable[[str], str] = input
) -> int:
    path = Path(file) if file else DEFAULT_DEMO_FILE
    return _interruptible(_demo, path, mode, Path(out) if out else None, undo, prompt)


def _warn(text: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(Text(text), style="yellow")


def _show_retry(notice: RetryNotice) -> None:
    _warn(notice.describe())


def _real_provider(
    name: str, key: str, base_url: str | None = None, thinking_budget: int | None = None
) -> ChatProvider:
    if name == "anthropic":
        from trioloop.providers.anthropic import AnthropicProvider, AnthropicRequestOptions

        options = AnthropicRequestOptions(thinking_budget_tokens=thinking_budget)
        return AnthropicProvider(api_key=key, base_url=base_url, options=options, on_retry=_show_retry)
    if name == "openai-responses":
        from trioloop.providers.openai_responses import OpenAIResponsesProvider

        return OpenAIResponsesProvider(api_key=key, base_url=base_url, on_retry=_show_retry)
    from trioloop.providers.openai import OpenAIProvider

    return OpenAIProvider(api_key=key, base_url=base_url, on_retry=_show_retry)


McpOptions = tuple[Sequence[str], str | None]
"""``--mcp`` command lines and the ``--mcp-config`` file, if any."""


def _host(base_url: str | None, provider_name: str) -> str:
    default = "api.anthropic.com" if provider_name == "anthropic" else "api.openai.com"
    if base_url is None:
        return default
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        return base_url
    return f"{url.host}:{url.port}" if url.port else url.host


def _checked_base_url(base_url: str | None) -> tuple[str | None, str | None]:
    """The base URL, or an error line: it must parse, and be https unless it points at this machine."""
    if base_url is None:
        return None, None
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        return None, f"error: --base-url is not a URL: {base_url}"
    if url.scheme == "https" and url.host:
        return base_url, None
    if url.scheme == "http" and is_loopback_host(url.host):
        return base_url, None
    return None, f"error: --base-url must be https, or http to this machine only: {base_url}"


def _turn_failure(state: TurnState, host: str) -> str | None:
    """The failed turn's error naming the host and the cause, with the redacted provider message."""
    if state.outcome is not Outcome.FAILED or state.error is None:
        return None
    detail = f" ({state.error.provider_detail})" if state.error.provider_detail else ""
    return f"error: {host}: {state.error.message}{detail}"


async def _chat(
    path: Path,
    provider_name: str,
    model: str | None,
    mode: ApproveMode,
    prompt: Callable[[str], str],
    base_url: str | None = None,
    thinking_budget: int | None = None,
    mcp_servers: McpOptions = ((), None),
    out: Path | None = None,
    journal: Path | None = None,
    resume: bool = False,
) -> int:
    # Everything that can be checked is checked before the first prompt: URL, key, model, options.
    base_url, problem = _checked_base_url(base_url or os.environ.get(_BASE_URL_ENV[provider_name]) or None)
    if problem is not None:
        _error(problem)
        return EXIT_USAGE
    key = os.environ.get(_KEY_ENV[provider_name], "")
    if not key and base_url is not None and is_loopback_host(httpx.URL(base_url).host):
        key = _LOCAL_PLACEHOLDER_KEY
    if not key:
        _error(f"error: set {_KEY_ENV[provider_name]} to use --provider {provider_name}")
        return EXIT_USAGE
    if thinking_budget is not None and (provider_name != "anthropic" or thinking_budget < 1024):
        _error("error: --thinking-budget needs --provider anthropic and at least 1024 tokens")
        return EXIT_USAGE
    model = model or DEFAULT_MODELS[provider_name]
    if lookup_model(model, provider=_MODEL_VENDOR.get(provider_name, provider_name)) is None:
        _warn(f"warning: {unknown_model_warning(model)}")
    logging.getLogger("trioloop").addHandler(logging.NullHandler())  # the CLI says it; no stray log line
    host = _host(base_url, provider_name)
    provider = _real_provider(provider_name, key, base_url, thinking_budget)
    return await chat_session(
        path, provider, model, mode, prompt, out, mcp_servers, host=host, journal=journal, resume=resume
    )


async def chat_session(
    path: Path,
    provider: ChatProvider,
    model: str,
    mode: ApproveMode,
    prompt: Callable[[str], str],
    out: Path | None = None,
    mcp_servers: McpOptions = ((), None),
    *,
    host: str = "the provider",
    journal: Path | None = None,
    resume: bool = False,
) -> int:
    """The chat loop over any provider, with the tools of any MCP servers named.

    After every turn that changed the document it is saved (to ``out``, else in place), and on Ctrl-C at
    any point whatever the settled tools committed is saved. With ``journal`` (a SQLite file) every turn is
    journaled as it runs, so a killed terminal loses nothing: ``resume`` continues the file's latest chat,
    its conversation, document and any review left open. Exit status: 0, or `EXIT_TURN_FAILED` when a turn
    failed, 1 when the document or an MCP server could not be loaded, 2 when the journal cannot be used."""
    console = _console()
    loaded = _load(path)
    if loaded is None:
        return 1
    saver = _Saver(console, loaded, out or path)
    if journal is None:
        async with threat_model_session(document=loaded.model, provider=provider, model=model) as session:
            code = await _chat_in(console, session, mode, prompt, host, saver, mcp_servers, model)
        return code
    from trioloop.loop.journal import JournalError
    from trioloop.loop.journal_store import JournalStoreError, SessionLocked
    from trioloop.stores import SQLiteJournalStore

    try:
        async with SQLiteJournalStore(journal) as store:
            opened = await _open_chat(store, loaded.model, provider, model, resume)
            if opened is None:
                _error(f"error: {journal} holds no chat to resume")
                return EXIT_USAGE
            async with opened as session:
                console.print(Text(f"Journal: {journal} (resume with --resume {journal})", style="dim"))
                code = await _chat_in(console, session, mode, prompt, host, saver, mcp_servers, model)
            return code
    except SessionLocked:
        _error(f"error: another trioloop process is using {journal}")
        return EXIT_USAGE
    except (JournalError, JournalStoreError) as exc:
        _error(f"error: the journal {journal} cannot be used: {exc}")
        return EXIT_USAGE


async def _open_chat(
    store: Any, document: ThreatModel, provider: ChatProvider, model: str, resume: bool
) -> Session[ThreatModel] | None:
    """The file's latest chat (``resume``), or a new one numbered by the time it started."""
    from trioloop.threatmodel import THREAT_MODEL, create_ai_tool_registry
    from trioloop.threatmodel.session import THREAT_MODEL_SYSTEM_PROMPT

    options: dict[str, Any] = {
        "kind": THREAT_MODEL,
        "provider": provider,
        "model": model,
        "tools": create_ai_tool_registry(),
        "system_prompt": THREAT_MODEL_SYSTEM_PROMPT,
    }
    if resume:
        chats = [i for i in await store.session_ids() if i.startswith("chat-")]
        if not chats:
            return None
        return await Session.open(store, chats[-1], **options)
    started = datetime.datetime.now(datetime.UTC).strftime("chat-%Y%m%dT%H%M%S.%fZ")
    return await Session.open(store, started, document=document, **options)


async def _chat_in(
    console: Console,
    session: Session[ThreatModel],
    mode: ApproveMode,
    prompt: Callable[[str], str],
    host: str,
    saver: _Saver,
    mcp_servers: McpOptions,
    model: str,
) -> int:
    if not await _add_mcp_servers(session, mcp_servers):
        return 1  # servers that did start close with the session
    console.print(Text(f"{model} at {host}; changes are saved to {saver.target}", style="dim"))
    try:
        failed = await _chat_loop(console, session, mode, prompt, host, saver)
    except BaseException:
        # Ctrl-C (trio may deliver it inside an exception group) or any other end: the document only
        # ever holds whole, committed tool results, so what it holds now is worth keeping.
        saver.save(session.document)
        raise
    return EXIT_TURN_FAILED if failed else 0


async def _chat_loop(
    console: Console,
    session: Session[ThreatModel],
    mode: ApproveMode,
    prompt: Callable[[str], str],
    host: str,
    saver: _Saver,
) -> bool:
    """Turns until an empty line or Ctrl-D; True when any turn failed."""
    console.print(Text("Type a request; an empty line or Ctrl-D ends the chat.", style="dim"))
    lines = LinePrompt(prompt)  # one reader for the whole chat: a read a Stop abandoned is not lost
    failed = False
    totals = Usage()
    if session.suspended:  # a review left open (or a turn a crash cut short): take it up first
        console.print(Text("Continuing the turn the journal left open.", style="bold"))
        before = session.document
        state = await _one_turn(session, TurnView(console, session, mode, lines), None)
        _report(console, session, state, before)
        saver.save(session.document)
        totals = usage_sum(totals, state.usage)
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
        saver.save(session.document)
        failure = _turn_failure(state, host)
        if failure is not None:
            failed = True
            _error(failure)
        totals = usage_sum(totals, state.usage)
        _show_usage(console, state.usage, totals)
    return failed


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


def _usage_text(usage: Usage) -> str:
    cache = ""
    if usage.cache_read_input_tokens or usage.cache_creation_input_tokens:
        cache = f" (cache: {usage.cache_read_input_tokens} read, {usage.cache_creation_input_tokens} written)"
    return f"{usage.input_tokens} in{cache}, {usage.output_tokens} out"


def _show_usage(console: Console, turn: Usage, totals: Usage) -> None:
    """The turn's tokens (cache reads and writes apart) and the session's running totals."""
    if not (turn.input_tokens or turn.output_tokens):
        return
    console.print(Text(f"tokens: {_usage_text(turn)}; session: {_usage_text(totals)}", style="dim"))


def run_chat(
    file: str,
    provider: str,
    model: str | None,
    mode: ApproveMode,
    prompt: Callable[[str], str] = input,
    *,
    mcp: Sequence[str] = (),
    mcp_config: str | None = None,
    base_url: str | None = None,
    thinking_budget: int | None = None,
    out: str | None = None,
    journal: str | None = None,
    resume: bool = False,
) -> int:
    return _interruptible(
        _chat,
        Path(file),
        provider,
        model,
        mode,
        prompt,
        base_url,
        thinking_budget,
        (tuple(mcp), mcp_config),
        Path(out) if out else None,
        Path(journal) if journal else None,
        resume,
    )


def run_audit(target: str, session: str | None, *, as_json: bool) -> int:
    """``trioloop audit``: every session's trail (or one's), verified; exit 1 naming the first bad entry."""
    if "://" not in target and not Path(target).is_file():
        _error(f"no journal at {target}")
        return 2
    return trio.run(_audit, target, session, as_json)


async def _audit(target: str, session: str | None, as_json: bool) -> int:
    from trioloop.audit import audit_lines, audit_records
    from trioloop.loop.journal import JournalError
    from trioloop.loop.journal_store import JournalStoreError
    from trioloop.stores import open_store

    try:
        store = open_store(target)
    except (ValueError, ImportError) as exc:
        _error(str(exc))
        return 2
    failed = False
    async with store:
        try:
            ids = [session] if session is not None else list(await store.session_ids())
            for session_id in ids:
                stored = await store.read(session_id)
                if not stored:
                    _error(f"no journal for session {session_id!r}")
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
                    _error(f"session {session_id}: entry {exc.seq} does not verify: {exc}")
                    failed = True
        except JournalStoreError as exc:
            _error(f"the journal store could not be read: {exc}")
            return 2
    return 1 if failed else 0
