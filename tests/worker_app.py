"""The app the worker tests run (``--app tests.worker_app:app``), in their own processes and in the test's.

A note document and two tools: ``append_line`` (appends its line to the note) and ``block`` (says it started, then
waits for ever: a worker killed while it runs). Every tool run is written, as one line, to ``runs.log`` in the folder
``TRIOLOOP_TEST_RUNS`` names, so a test counts how many times each call ran across every process. The scripted
model answers by the session id's prefix: ``again-`` sessions ask for one more line (the turn waits in review
again), every other session ends its turn with "Done." once its calls have run; a call denied with a reason is
answered "Understood, I will not: <the reason>." instead. The journal key is the file
``TRIOLOOP_TEST_APP_KEY`` names (the app's and the fleet's); the inbox server's public key comes with ``--key``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from trioloop import ScriptedProvider, ToolExecutionContext, ToolOutcome, define_document_kind, function_tool
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.protocol.events import StreamEvent
from trioloop.protocol.messages import ToolResultBlock
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.web.worker_app import WorkerApp

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)


def record_run(what: str) -> None:
    """One line in ``runs.log`` (with the wall-clock time after a tab, for ``benchmarks/inbox.py``): a single
    append, whole, from any process."""
    folder = os.environ.get("TRIOLOOP_TEST_RUNS")
    if folder:
        fd = os.open(Path(folder) / "runs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{what}\t{time.time():.6f}\n".encode())
        finally:
            os.close(fd)


def runs(folder: Path) -> list[str]:
    """Every tool run recorded in ``folder``, in order."""
    log = folder / "runs.log"
    return [line.split("\t")[0] for line in log.read_text().splitlines()] if log.exists() else []


@function_tool(summary="Append {line!r}")
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    record_run(line)
    return ToolOutcome.success(f"appended {line}", document=ctx.document + line + "\n")


@function_tool(summary="Block on {tag!r}")
async def block(ctx: ToolExecutionContext[str], tag: str) -> ToolOutcome[str]:
    """Start something that never ends (the test kills the process running it)."""
    record_run(f"started {tag}")
    await trio.sleep_forever()
    raise AssertionError("unreachable")


TOOLS = (append_line, block)


def script_for(session_id: str) -> list[ScriptStep]:
    """What the model answers when a worker carries ``session_id``'s turn on."""
    if session_id.startswith("again-"):
        call = ScriptedCall(id="c2", name="append_line", input={"line": f"{session_id} two"})
        return [ScriptStep(tool_calls=(call,)), ScriptStep(text="Done.")]
    return [ScriptStep(text="Done.")]


_REASON = "The user gave this reason, in their own words: "


def denial_reason(request: ChatRequest) -> str | None:
    """The reason a person gave for denying a call whose result the model reads now (None: no such call)."""
    if not request.messages:
        return None
    for block in request.messages[-1].content:
        if isinstance(block, ToolResultBlock) and block.is_error and _REASON in block.content:
            quoted = block.content.split(_REASON, 1)[1]
            try:
                return str(json.loads(quoted))
            except ValueError:
                return quoted
    return None


class _Answering:
    """The scripted model, but a denial with a reason is answered with the reason."""

    def __init__(self, scripted: ScriptedProvider) -> None:
        self._scripted = scripted

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        reason = denial_reason(request)
        if reason is None:
            await self._scripted.stream(request, send, cancel_scope=cancel_scope)
            return
        async with ScriptedProvider([ScriptStep(text=f"Understood, I will not: {reason}")]) as once:
            await once.stream(request, send, cancel_scope=cancel_scope)


@contextlib.asynccontextmanager
async def provider(session_id: str) -> AsyncIterator[_Answering]:
    async with ScriptedProvider(script_for(session_id)) as scripted:
        yield _Answering(scripted)


def make_app(signer: JournalSigner, server: JournalKeys | None) -> WorkerApp:
    """The app, with ``signer`` (the journals' key) accepting the inbox server's keys ``server``."""
    return WorkerApp(kind=NOTE, tools=TOOLS, provider=provider, keys=server, signer=signer, witness=None, model="m")


def app() -> WorkerApp:
    """The factory ``--app tests.worker_app:app`` names (the server's key is given with ``--key``)."""
    return make_app(JournalSigner.load(os.environ["TRIOLOOP_TEST_APP_KEY"]), None)


def not_an_app() -> object:
    """A factory that returns something else (the loader refuses it)."""
    return "nope"
