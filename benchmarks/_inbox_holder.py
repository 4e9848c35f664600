"""The app of ``benchmarks/inbox_held.py``: S sessions open, each waiting in review, each hearing of decisions
itself, until SIGTERM.

    python -m benchmarks._inbox_holder TARGET SESSIONS FOLDER INBOX_PUBLIC_KEY
"""

from __future__ import annotations

import signal
import sys
from contextlib import aclosing
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tests.test_worker import APP
from tests.worker_app import NOTE, TOOLS
from trioloop import Phase, ScriptedProvider, Session
from trioloop.durable.signing import JournalKeys, public_key_from_text
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import open_store


async def hold(store: object, session_id: str, keys: JournalKeys, ready: trio.Event, stop: trio.Event) -> None:
    call = ScriptedCall(id="c1", name="append_line", input={"line": f"{session_id} one"})
    steps = [ScriptStep(tool_calls=(call,)), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = await Session.open(
            store,  # type: ignore[arg-type]
            session_id,
            kind=NOTE,
            provider=provider,
            tools=TOOLS,
            document="",
            model="m",
            signer=APP.signer,  # type: ignore[arg-type]
            keys=keys,
            witness=None,
        )
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "add a line")
            async with aclosing(session.states()) as states:
                async for state in states:
                    if state.phase is Phase.AWAITING_APPROVAL:
                        break
            ready.set()
            await stop.wait()
            nursery.cancel_scope.cancel()


async def main(target: str, sessions: int, folder: Path, inbox_key: str) -> None:
    keys = JournalKeys([public_key_from_text(inbox_key)])
    async with open_store(target) as store:
        stop = trio.Event()
        readies = [trio.Event() for _ in range(sessions)]
        async with trio.open_nursery() as nursery:
            for n in range(sessions):
                nursery.start_soon(hold, store, f"held-{n}", keys, readies[n], stop)
            for ready in readies:
                await ready.wait()
            (folder / "ready").touch()
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            stop.set()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
