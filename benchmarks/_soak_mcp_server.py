"""The soak's MCP server over stdio (the SDK's ``MCPServer``): two tools, and faults of its own.

``python -m benchmarks._soak_mcp_server --sid SID --ledger FILE --pids DIR --seed N`` serves ``count_words``
(the app classifies it as a read) and ``stamp`` (left unclassified, so a destructive call the person must
approve). Each call writes its run to the soak's ledger file first (``run``, with the session id and the call
id the input carries), then, drawn from its own seeded generator: stalls for 10 s (past any turn deadline),
writes a line that is not JSON-RPC to its stdout, or dies (``os._exit``) before answering; each such fault is
written to the ledger too (``mcp_fault``). The process writes its pid as a file in ``--pids`` so the soak can
find it to freeze (SIGSTOP) or kill it, and removes it when it exits normally.
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

from benchmarks._soak_tools import Ledger

server = MCPServer("notes")
_state: dict[str, object] = {}


def _fault(call: str, tool: str) -> None:
    ledger = _state["ledger"]
    assert isinstance(ledger, Ledger)
    ledger.emit("run", sid=_state["sid"], call=call, tool=f"notes__{tool}")
    rng = _state["rng"]
    assert isinstance(rng, random.Random)
    roll = rng.random()
    if roll < 0.04:
        ledger.emit("mcp_fault", kind="stall", sid=_state["sid"], call=call)
        time.sleep(10.0)  # blocks the server: every call behind it waits too
    elif roll < 0.08:
        ledger.emit("mcp_fault", kind="garble", sid=_state["sid"], call=call)
        os.write(1, b"this is not JSON-RPC \xff\xfe\n")
    elif roll < 0.11:
        ledger.emit("mcp_fault", kind="die", sid=_state["sid"], call=call)
        os._exit(3)


@server.tool()
def count_words(call: str, text: str) -> int:
    """Count the words in a text."""
    _fault(call, "count_words")
    return len(text.split())


@server.tool()
def stamp(call: str, text: str) -> str:
    """Stamp a text in the notes service (an effect outside the document)."""
    _fault(call, "stamp")
    return f"stamped {len(text)} characters"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sid", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--pids", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    _state.update(sid=args.sid, ledger=Ledger(path=args.ledger), rng=random.Random(f"{args.seed}/{os.getpid()}"))
    pid_file = Path(args.pids) / str(os.getpid())
    pid_file.write_text(args.sid)
    atexit.register(lambda: pid_file.unlink(missing_ok=True))
    server.run("stdio")


if __name__ == "__main__":
    main()
