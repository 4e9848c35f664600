"""`trioloop chat`: a Session on a real provider, driven from the terminal through ``TurnView``."""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import trio
from rich.console import Console
from rich.text import Text

from trioloop.cli.chat_rules import RULES_HELP, load_chat_rules, rules_command, withheld_notice
from trioloop.cli.common import (
    Saver,
    error,
    exit_status,
    interruptible,
    load_document,
    make_console,
    one_turn,
    report,
    warn,
)
from trioloop.cli.document_lock import DocumentLock
from trioloop.cli.exit_codes import EXIT_TURN_FAILED, EXIT_USAGE
from trioloop.cli.mcp_servers import McpOptions, add_mcp_servers
from trioloop.cli.resume_check import check_resumed, read_latest_chat, resume_refusal
from trioloop.cli.review import LinePrompt
from trioloop.cli.usage import show_turn_usage, usage_report
from trioloop.cli.view import ApproveMode, TurnView
from trioloop.durable.journal import JournalError
from trioloop.durable.session_file import SessionFileError
from trioloop.durable.signing import JournalKeys
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.store import JournalStoreError, SessionLocked
from trioloop.machine.limits import DEFAULT_TURN_LIMITS, TurnLimits
from trioloop.machine.reducer import Outcome, TurnState
from trioloop.protocol.events import StreamError
from trioloop.protocol.preflight import lookup_model, unknown_model_warning
from trioloop.protocol.provider import ChatProvider
from trioloop.providers.retry import RetryNotice
from trioloop.providers.transport import is_loopback_host
from trioloop.runtime.session import DocumentMismatch, Session, SessionBusy
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, create_ai_tool_registry
from trioloop.threatmodel.session import THREAT_MODEL_SYSTEM_PROMPT
from trioloop.threatmodel.thf_file import ThfFile

__all__ = ["DEFAULT_MODELS", "chat_session", "run_chat"]

_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY", "openai-responses": "OPENAI_API_KEY"}


_BASE_URL_ENV = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL", "openai-responses": "OPENAI_BASE_URL"}


DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4.1", "openai-responses": "gpt-5"}


_MODEL_VENDOR = {"openai-responses": "openai"}  # the model table is per vendor: both OpenAI APIs serve its models


_LOCAL_PLACEHOLDER_KEY = "no-key-needed-locally"  # local servers (Ollama, llama.cpp) ignore the key


def _show_retry(notice: RetryNotice) -> None:
    warn(notice.describe())


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
    session_file: Path | None = None,
    limits: TurnLimits = DEFAULT_TURN_LIMITS,
    one_shot: str | None = None,
    keys: JournalKeys | None = None,
) -> int:
    # Everything that can be checked is checked before the first prompt: URL, key, model, options.
    base_url, problem = _checked_base_url(base_url or os.environ.get(_BASE_URL_ENV[provider_name]) or None)
    if problem is not None:
        error(problem)
        return EXIT_USAGE
    key = os.environ.get(_KEY_ENV[provider_name], "")
    if not key and base_url is not None and is_loopback_host(httpx.URL(base_url).host):
        key = _LOCAL_PLACEHOLDER_KEY
    if not key:
        error(f"error: set {_KEY_ENV[provider_name]} to use --provider {provider_name}")
        return EXIT_USAGE
    if thinking_budget is not None and (provider_name != "anthropic" or thinking_budget < 1024):
        error("error: --thinking-budget needs --provider anthropic and at least 1024 tokens")
        return EXIT_USAGE
    model = model or DEFAULT_MODELS[provider_name]
    if lookup_model(model, provider=_MODEL_VENDOR.get(provider_name, provider_name)) is None:
        warn(f"warning: {unknown_model_warning(model)}")
    logging.getLogger("trioloop").addHandler(logging.NullHandler())  # the CLI says it; no stray log line
    document = load_document(path)  # a wrong file name is said before any request to the provider
    if isinstance(document, int):
        return document
    host = _host(base_url, provider_name)
    provider = _real_provider(provider_name, key, base_url, thinking_budget)
    problem_found = await _check_provider(provider)
    if problem_found is not None:
        detail = f" ({problem_found.provider_detail})" if problem_found.provider_detail else ""
        error(f"error: {host}: {problem_found.message}{detail}")
        return EXIT_TURN_FAILED
    return await chat_session(
        path,
        provider,
        model,
        mode,
        prompt,
        out,
        mcp_servers,
        host=host,
        journal=journal,
        resume=resume,
        session_file=session_file,
        limits=limits,
        one_shot=one_shot,
        document=document,
        keys=keys,
    )


async def _check_provider(provider: ChatProvider) -> StreamError | None:
    """The URL and key checked once, before the first prompt, with the server's models list (when the provider
    offers the check): a refused port or a wrong key is said at once, not after a request and its retries."""
    check = getattr(provider, "check", None)
    if check is None:
        return None
    result = await check()
    return result if isinstance(result, StreamError) else None


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
    session_file: Path | None = None,
    limits: TurnLimits = DEFAULT_TURN_LIMITS,
    one_shot: str | None = None,
    document: ThfFile | None = None,
    keys: JournalKeys | None = None,
) -> int:
    """The chat loop over any provider, with the tools of any MCP servers named.

    After every turn that changed the document it is saved (to ``out``, else in place), and on Ctrl-C at
    any point whatever the settled tools committed is saved. With ``journal`` (a SQLite file) every turn is
    journaled as it runs, so a killed terminal loses nothing: ``resume`` continues the file's latest chat,
    its conversation, document and any review left open. ``session_file`` continues a session `/save` wrote.
    ``one_shot`` runs that one request and ends; ``document`` is the file at ``path`` already read; ``keys`` are
    public keys that also verify a resumed journal (keys since rotated).

    One chat per file: the file written is locked (`DocumentLock`: by its path and by the real file, so a symlink
    or a hard link is the same file) until the chat ends, however it ends, and its lock files are removed then.

    Exit status: 0, or `EXIT_TURN_FAILED` when a turn failed (or, in a one-shot run, ended at a limit),
    `EXIT_UNANSWERED` when the input ended at a card, 1 when the document is not valid or an MCP server could not
    be started, 2 when the document, the journal or the session file cannot be read or used, another chat holds
    the file, or ``resume`` is refused (nothing written, to the file or the journal)."""
    target = out or path
    lock = DocumentLock(target)
    try:
        holder = lock.acquire()
    except OSError as exc:
        error(f"error: cannot lock {target} for this chat: {exc.strerror or exc}; nothing was read or written")
        return EXIT_USAGE
    if holder is not None:
        error(f"error: {target} is being edited by another trioloop chat ({holder}); nothing was read or written")
        return EXIT_USAGE
    try:
        console = make_console()
        loaded = document if document is not None else load_document(path)
        if isinstance(loaded, int):
            return loaded
        saver = Saver(console, loaded, out or path, source=path)
        chat = _Chat(console, mode, prompt, host, saver, mcp_servers, model, one_shot)
        options: dict[str, Any] = {
            "kind": THREAT_MODEL,
            "provider": provider,
            "model": model,
            "tools": create_ai_tool_registry(),
            "system_prompt": THREAT_MODEL_SYSTEM_PROMPT,
            "limits": limits,
            "rules": load_chat_rules(console, path),
        }
        if options["rules"] is None:
            return EXIT_USAGE
        here = str(target.resolve())
        if session_file is not None:
            try:
                restored: Session[ThreatModel] | None = Session.resume(session_file, **options)
            except SessionFileError as exc:
                error(f"error: {session_file} cannot be resumed: {exc}")
                return EXIT_USAGE
            assert restored is not None
            withheld_notice(console, restored, session_file)
            if not check_resumed(restored, path, loaded, out, session_file, saver, console):
                return EXIT_USAGE
        else:
            restored = None
        if journal is None:
            async with restored or Session(document=loaded.model, source=here, **options) as session:
                code = await chat.run(session)
            return code
        if resume and not await trio.Path(journal).is_file():  # nothing to resume, and no file made by looking
            error(f"error: no journal at {journal} to resume")
            return EXIT_USAGE
        resumed_id = None
        if resume:  # decided on the journal read read-only: a refusal writes nothing, to the file or the journal
            latest = await read_latest_chat(journal, keys)
            if isinstance(latest, str):
                error(latest)
                return EXIT_USAGE
            refusal = resume_refusal(latest.source, latest.match, path, loaded, out, journal)
            if refusal is not None:
                error(refusal)
                return EXIT_USAGE
            resumed_id = latest.session_id
        try:
            async with SQLiteJournalStore(journal) as store:
                journaled = await _open_chat(store, loaded.model, options, resumed_id, restored, here, keys)
                if resume and not check_resumed(journaled, path, loaded, out, journal, saver, console):
                    await journaled.aclose()
                    return EXIT_USAGE
                async with journaled as session:
                    console.print(Text(f"Journal: {journal} (resume with --resume {journal})", style="dim"))
                    code = await chat.run(session)
                return code
        except SessionLocked:
            error(f"error: another trioloop process is using {journal}")
            return EXIT_USAGE
        except (JournalError, JournalStoreError, DocumentMismatch) as exc:
            error(f"error: the journal {journal} cannot be used: {exc}")
            return EXIT_USAGE

    finally:
        lock.release()


async def _open_chat(
    store: Any,
    document: ThreatModel,
    options: dict[str, Any],
    resumed_id: str | None,
    restored: Session[ThreatModel] | None,
    source: str,
    keys: JournalKeys | None = None,
) -> Session[ThreatModel]:
    """The chat ``resumed_id`` (the journal's latest, already checked), or a new one numbered by the time it
    started (``restored``'s conversation and document when a session file was resumed)."""
    if resumed_id is not None:
        return await Session.open(store, resumed_id, keys=keys, **options)
    started = datetime.datetime.now(datetime.UTC).strftime("chat-%Y%m%dT%H%M%S.%fZ")
    if restored is not None:
        await restored.journal_into(store, started)
        return restored
    return await Session.open(store, started, document=document, source=source, **options)


_COMMANDS_HELP: Final = (
    "  /undo         undo the newest turn still undoable (again: the one before, as far as the history reaches)\n"
    "  /redo         take the last /undo back (until a new change is made)\n"
    "  /save [FILE]  save the session (conversation, document, undo) to FILE (default: DOCUMENT.session.json);\n"
    "                continue it later with: trioloop chat DOCUMENT --resume FILE\n"
    "  /usage        tokens and cost of this session and the last turn, cache reads and writes included\n"
    f"{RULES_HELP}"
    "  /help         this list\n"
    "  an empty line or Ctrl-D ends the chat; Ctrl-C during a turn stops it"
)


class _Chat:
    """One chat in the terminal: the loop of requests and slash commands over an open session."""

    def __init__(
        self,
        console: Console,
        mode: ApproveMode,
        prompt: Callable[[str], str],
        host: str,
        saver: Saver,
        mcp_servers: McpOptions,
        model: str,
        one_shot: str | None,
    ) -> None:
        self.console = console
        self.mode = mode
        self.lines = LinePrompt(prompt)  # one reader for the whole chat: a read a Stop abandoned is not lost
        self.host = host
        self.saver = saver
        self.mcp_servers = mcp_servers
        self.model = model
        self.one_shot = one_shot
        self.failed = False
        self.unanswered = False  # the last turn stopped at a card because the input ended

    async def run(self, session: Session[ThreatModel]) -> int:
        if not await add_mcp_servers(session, self.mcp_servers):
            return 1  # servers that did start close with the session
        self.console.print(Text(f"{self.model} at {self.host}; changes are saved to {self.saver.target}", style="dim"))
        try:
            await self.loop(session)
        except BaseException:
            # Ctrl-C (trio may deliver it inside an exception group) or any other end: the document only
            # ever holds whole, committed tool results, so what it holds now is worth keeping.
            self.saver.save(session.document)
            raise
        return exit_status(failed=self.failed, unanswered=self.unanswered)

    async def loop(self, session: Session[ThreatModel]) -> None:
        """Turns and commands until an empty line or Ctrl-D (or the one request of a one-shot run)."""
        if session.suspended:  # a review left open (or a turn a crash cut short): take it up first
            self.console.print(Text("Continuing the turn the journal left open.", style="bold"))
            await self.turn(session, None)
        if self.one_shot is not None:
            state = await self.turn(session, self.one_shot)
            if state.outcome is Outcome.BOUNDED:
                self.failed = True  # a one-shot run that ended at a limit did not do what was asked
            return
        self.console.print(Text("Type a request, or /help; an empty line or Ctrl-D ends the chat.", style="dim"))
        while True:
            try:
                text = await self.lines.ask("you> ")
            except EOFError:
                break
            if not text.strip():
                break
            if text.strip().startswith("/"):
                self.command(session, text.strip())
                continue
            await self.turn(session, text)

    async def turn(self, session: Session[ThreatModel], text: str | None) -> TurnState:
        before = session.document
        view = TurnView(self.console, session, self.mode, self.lines)
        state = await one_turn(session, view, text)
        self.unanswered = view.input_ended
        report(self.console, session, state, before)
        self.saver.save(session.document)
        failure = _turn_failure(state, self.host)
        if failure is not None:
            self.failed = True
            error(failure)
        # The session's tokens: a resumed journal's or session file's earlier turns included.
        show_turn_usage(self.console, session, state)
        return state

    def command(self, session: Session[ThreatModel], text: str) -> None:
        name, _, argument = text.partition(" ")
        name, argument = name.lower(), argument.strip()
        if name in ("/undo", "/redo"):
            before = session.document
            turn_id = session.undo_step() if name == "/undo" else session.redo_last_undo()
            if turn_id is None:
                what = "undo" if name == "/undo" else "redo (nothing was undone since the last change)"
                self.console.print(Text(f"Nothing to {what}."))
                return
            self.console.print(Text(f"{'Undid' if name == '/undo' else 'Redid'} {turn_id}.", style="bold"))
            _print_diff(self.console, session, before)
            self.saver.save(session.document)
        elif name == "/save":
            target = (
                Path(argument) if argument else self.saver.target.with_name(self.saver.target.name + ".session.json")
            )
            try:
                session.save(target)
            except (OSError, SessionBusy, TypeError) as exc:
                error(f"error: could not save the session to {target}: {exc}")
                return
            self.console.print(Text(f"Saved the session to {target} (continue with --resume {target})"))
        elif name == "/usage":
            self.console.print(Text(usage_report(session)))
        elif name == "/help":
            self.console.print(Text(_COMMANDS_HELP))
        elif rules_command(self.console, session, name, argument):
            pass
        else:
            self.console.print(Text(f"Unknown command {name!r}; /help lists them."))


def _print_diff(console: Console, session: Session[ThreatModel], before: ThreatModel) -> None:
    diff = session.kind.diff(before, session.document)
    for line in diff.splitlines():
        style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
        console.print(Text(line, style=style))


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
    session_file: str | None = None,
    timeout: float | None = None,
    one_shot: str | None = None,
    mcp_env: Sequence[str] | None = None,
    keys: JournalKeys | None = None,
) -> int:
    limits = DEFAULT_TURN_LIMITS if timeout is None else TurnLimits(turn_deadline_ms=max(1, round(timeout * 1000)))
    return interruptible(
        _chat,
        Path(file),
        provider,
        model,
        mode,
        prompt,
        base_url,
        thinking_budget,
        (tuple(mcp), mcp_config, None if mcp_env is None else tuple(mcp_env)),
        Path(out) if out else None,
        Path(journal) if journal else None,
        resume,
        Path(session_file) if session_file else None,
        limits,
        one_shot,
        keys,
    )
