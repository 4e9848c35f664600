"""A trioloop session in an asyncio web app: Starlette on Hypercorn's asyncio worker, Trio a guest on the same loop.

    python examples/asyncio_chat.py [--host 127.0.0.1] [--port 8000]

    curl -N -X POST localhost:8000/chat -H 'content-type: application/json' -d '{"text": "Add milk"}'
    curl -X POST localhost:8000/calls/c1/approve        # in another terminal, when the card shows

``POST /chat`` runs one turn and streams it as Server-Sent Events: a ``state`` event as the turn moves (the newest
state: a slow client skips states, never holds the turn back), then one ``settled`` event with the final state.
The review happens beside it: ``POST /calls/{id}/approve``, ``POST /calls/{id}/deny`` (``{"reason": ...}``) and
``POST /stop``. A client that disconnects mid-turn stops the turn, as Stop does. ``GET /state`` is the newest
state; ``GET /state?wait=settled`` waits until no turn runs first.

The model is trioloop's scripted provider (no network, no key): it asks to append a line, then says it did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from trioloop import ScriptedProvider, Session, ToolExecutionContext, ToolOutcome, TurnState, define_document_kind
from trioloop import function_tool as tool
from trioloop.aio import TrioHost
from trioloop.providers.scripted import ScriptedCall, ScriptStep


def _check(note: str) -> str | None:
    return None if note.startswith("# ") else "a note must start with a '# ' title line"


NOTE = define_document_kind("Markdown note", validate=_check)


@tool(summary="Append {line!r} to the note")  # a mutation: the person reviews it
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line (the text, without a newline) to the note."""
    return ToolOutcome.success("Appended.", document=f"{ctx.document}{line}\n")


SCRIPT = (
    ScriptStep(
        text="I'll add milk to your list.",
        tool_calls=[ScriptedCall(id="c1", name="append_line", input={"line": "- milk"})],
    ),
    ScriptStep(text="Added milk."),
)


def state_json(state: TurnState) -> dict[str, Any]:
    """What a client sees of a turn: its phase, outcome, streamed text, calls and notices."""
    return {
        "turn_id": state.turn_id,
        "phase": state.phase.value,
        "outcome": None if state.outcome is None else state.outcome.value,
        "text": state.streaming_text,
        "calls": [
            {"id": c.id, "tool": c.tool_name, "summary": c.summary, "status": c.status.value, "result": c.result}
            for c in state.calls
        ],
        "notices": list(state.notices),
    }


def _event(name: str, data: dict[str, Any]) -> Message:
    body = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
    return {"type": "http.response.body", "body": body, "more_body": True}


class Chat:
    """The app's one session, the host its Trio side runs in, and the lock that lets one turn run at a time."""

    def __init__(self, host: TrioHost, session: Session[str]) -> None:
        self.host = host
        self.session = session
        self.turn = asyncio.Lock()


class TurnStream(Response):
    """The response of ``POST /chat``: runs the turn while streaming its states; the client leaving stops it."""

    media_type = "text/event-stream"

    def __init__(self, chat: Chat, text: str) -> None:
        self.chat = chat
        self.text = text
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-store"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async with asyncio.TaskGroup() as tasks:
            streaming = tasks.create_task(self._stream(send))
            watching = tasks.create_task(_cancel_on_disconnect(receive, streaming))
            streaming.add_done_callback(lambda _: watching.cancel())

    async def _stream(self, send: Send) -> None:
        host, session = self.chat.host, self.chat.session
        async with self.chat.turn:
            before = await host.run_sync(lambda: session.state)
            try:
                async with asyncio.TaskGroup() as tasks:
                    relaying = tasks.create_task(self._relay(send, before))
                    state = await host.run(session.send, self.text)  # cancelled: Stop (the turn settles cancelled)
                    relaying.cancel()
            except* Exception as failed:
                await send(_event("error", {"error": repr(failed.exceptions[0])}))
            else:
                await send(_event("settled", state_json(state)))
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay(self, send: Send, before: TurnState | None) -> None:
        async with self.chat.host.iterate(self.chat.session.states) as states:
            async for state in states:
                if before is None or state.turn_id != before.turn_id:  # not the previous turn's last state
                    await send(_event("state", state_json(state)))


async def _cancel_on_disconnect(receive: Receive, streaming: asyncio.Task[None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    streaming.cancel()


def _chat(request: Request) -> Chat:
    chat: Chat = request.app.state.chat
    return chat


async def post_chat(request: Request) -> Response:
    chat = _chat(request)
    body = await request.json()
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str) or not text.strip():
        return JSONResponse({"error": 'send {"text": "..."}'}, status_code=400)
    if chat.turn.locked():
        return JSONResponse({"error": "a turn is running"}, status_code=409)
    return TurnStream(chat, text)


async def approve(request: Request) -> Response:
    chat = _chat(request)
    ok = await chat.host.run_sync(chat.session.approve, request.path_params["call_id"])
    return JSONResponse({"ok": ok}, status_code=200 if ok else 409)


async def deny(request: Request) -> Response:
    chat = _chat(request)
    body = await request.json() if await request.body() else {}
    reason = body.get("reason", "") if isinstance(body, dict) else ""
    ok = await chat.host.run_sync(chat.session.deny, request.path_params["call_id"], str(reason))
    return JSONResponse({"ok": ok}, status_code=200 if ok else 409)


async def stop(request: Request) -> Response:
    chat = _chat(request)
    ok = await chat.host.run_sync(chat.session.stop)
    return JSONResponse({"ok": ok}, status_code=200 if ok else 409)


async def get_state(request: Request) -> Response:
    chat = _chat(request)
    if request.query_params.get("wait") == "settled":
        async with chat.turn:
            pass
    state = await chat.host.run_sync(lambda: chat.session.state)
    document = await chat.host.run_sync(lambda: chat.session.document)
    return JSONResponse({"state": None if state is None else state_json(state), "document": document})


def create_app(script: Sequence[ScriptStep] = SCRIPT, document: str = "# Shopping\n") -> Starlette:
    """The app: its lifespan opens the Trio host, the scripted model and the session, and closes them in turn."""

    def open_session(provider: ScriptedProvider) -> Session[str]:
        return Session(document=document, kind=NOTE, provider=provider, model="scripted-1", tools=[append_line])

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            TrioHost() as host,
            host.enter(ScriptedProvider, script) as provider,
            host.enter(open_session, provider) as session,
        ):
            app.state.chat = Chat(host, session)
            yield

    routes = [
        Route("/chat", post_chat, methods=["POST"]),
        Route("/calls/{call_id}/approve", approve, methods=["POST"]),
        Route("/calls/{call_id}/deny", deny, methods=["POST"]),
        Route("/stop", stop, methods=["POST"]),
        Route("/state", get_state, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    config = Config()
    config.bind = [f"{args.host}:{args.port}"]
    # Ctrl-C shuts down: the lifespan stops a running turn, closes the session, the provider, then the host.
    asyncio.run(serve(create_app(), config, mode="asgi"))  # type: ignore[arg-type]  # Starlette's ASGI types


if __name__ == "__main__":
    main()
