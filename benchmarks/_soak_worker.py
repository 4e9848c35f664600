"""A soak worker: a few of the soak's sessions in a process the soak kills (SIGKILL) and starts again.

``python -m benchmarks._soak_worker CONFIG WORKER`` reads the soak's configuration (JSON, written by
``benchmarks.soak``) and runs its slots (`benchmarks._soak_sessions.run_slot`) until the soak's end, writing
everything to its own ledger file. Started again after a kill, it reads that file first: each slot takes up
the conversation it was in (the last one it opened and did not retire), reopening its journal, so a turn the
kill cut short is continued (``continue_turn``) and checked like any other. It leaves with status 0 once every
slot has retired its conversation.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

import trio

from benchmarks._soak_dump import dump_on_signal
from benchmarks._soak_sessions import SlotPlan, run_slot
from benchmarks._soak_tools import read_events
from benchmarks._soak_wiring import opened_context


def unfinished(ledger: Path) -> dict[str, str]:
    """slot -> the session id it opened last and did not retire, from an earlier life's ledger."""
    current: dict[str, str] = {}
    retired: set[str] = set()
    for event in read_events(ledger):
        if event["e"] == "conversation":
            current[event["slot"]] = event["sid"]
        elif event["e"] in ("final_doc", "retire_failed"):
            retired.add(event["sid"])
    return {slot: sid for slot, sid in current.items() if sid not in retired}


async def main(config: dict[str, Any], worker: int) -> None:
    ledger_path = Path(config["folder"]) / f"worker-{worker}.jsonl"
    resume = unfinished(ledger_path)
    async with opened_context(config, ledger_path, process=f"w{worker}") as (ctx, stores):
        gc.collect()
        gc.freeze()  # as the soak's own process does: startup's objects leave the collector's generations
        ctx.causes.install()
        ctx.ledger.emit("worker_start", worker=worker, resumed=sorted(resume.values()))
        async with trio.open_nursery() as outer:
            outer.start_soon(dump_on_signal)
            async with trio.open_nursery() as slots:
                for index in range(config["worker_sessions"]):
                    slot = f"w{worker}s{index}"
                    name = "postgres" if "postgres" in stores and index == 0 else "sqlite"
                    plan = SlotPlan(slot=slot, store=stores[name], store_name=name)
                    slots.start_soon(run_slot, ctx, plan, resume.get(slot))
            outer.cancel_scope.cancel()
        ctx.ledger.emit("worker_end", worker=worker)


if __name__ == "__main__":
    trio.run(main, json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]))
