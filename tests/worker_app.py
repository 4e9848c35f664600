"""The app the worker tests run (``--app tests.worker_app:app``), in their own processes and in the test's.

A note document and two tools: ``append_line`` (appends its line to the note) and ``block`` (says it started, then
waits for ever: a worker killed while it runs). Every tool run is written, as one line, to ``runs.log`` in the folder
``TRIOLOOP_TEST_RUNS`` names, so a test counts how many times each call ran across every process. The scripted
model answers by the session id's prefix: ``again-`` sessions ask for one more line (the turn waits in review
again), every other session ends its turn with "Done." once its calls have run. The journal key is the file
``TRIOLOOP_TEST_APP_KEY`` names (the app's and the fleet's); the inbox server's public key comes with ``--key``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import trio

from trioloop import ScriptedProvider, ToolExecutionContext, ToolOutcome, define_document_kind, function_tool
from trioloop.durable.signing import JournalKeys, JournalSigner
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


def provider(session_id: str) -> Any:
    return ScriptedProvider(script_for(session_id))


def make_app(signer: JournalSigner, server: JournalKeys | None) -> WorkerApp:
    """The app, with ``signer`` (the journals' key) accepting the inbox server's keys ``server``."""
    return WorkerApp(kind=NOTE, tools=TOOLS, provider=provider, keys=server, signer=signer, witness=None, model="m")


def app() -> WorkerApp:
    """The factory ``--app tests.worker_app:app`` names (the server's key is given with ``--key``)."""
    return make_app(JournalSigner.load(os.environ["TRIOLOOP_TEST_APP_KEY"]), None)


def not_an_app() -> object:
    """A factory that returns something else (the loader refuses it)."""
    return "nope"
