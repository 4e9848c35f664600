"""`benchmarks.journal`'s figures: each contender's phases summarised, the targets judged, the tables printed.

Per contender: ``per_iteration_*`` are the send alone divided by K (the figures earlier runs reported, kept
comparable); ``whole_per_iteration_*`` are the whole session (open + send + close) divided by K, what a one-turn
journaled session really costs per iteration, and the headline; ``per_session_us`` gives each phase per session.
Every ratio is of CPU medians of this run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from benchmarks._common import load_line, print_table, summarize
from benchmarks._floor import PHASES
from benchmarks._journal_run import Phases

__all__ = ["FLOOR_TARGET", "FLOOR_TARGETS", "baseline", "floor_rows", "phase_stats", "print_tables"]

#: Issue 51: trioloop's durable overhead (journaled whole session - plain whole session, CPU per iteration) at most
#: this many times the floor's cost per iteration (`benchmarks._floor`).
FLOOR_TARGET: Final = 2.0
#: (what is printed, the journaled contender, its plain baseline, its floor).
FLOOR_TARGETS: Final = (
    ("SQLite durable, in process", "sqlite_durable", "no_store", "floor_sqlite_durable"),
    ("SQLite durable, over loopback HTTP", "http_sqlite_durable", "http_no_store", "floor_http_sqlite_durable"),
    ("PostgreSQL, in process", "postgres_durable", "no_store", "floor_postgres_durable"),
    ("PostgreSQL, over loopback HTTP", "http_postgres_durable", "http_no_store", "floor_http_postgres_durable"),
)


def baseline(name: str) -> str:
    """The contender a row's CPU ratio is taken over."""
    if name.startswith("http_"):
        return "http_no_store"
    if name.startswith("langgraph_"):
        return "langgraph_no_checkpointer"
    return "no_store"


def phase_stats(samples: Sequence[Phases], k: int) -> dict[str, Any]:
    """A contender's figures: the send per iteration (as before), the whole session per iteration, each phase per
    session; a floor's also the CPU of its signing and of its transactions per session."""
    stats: dict[str, Any] = {
        "per_iteration_wall_us": summarize([s.send_wall / k for s in samples]),
        "per_iteration_cpu_us": summarize([s.send_cpu / k for s in samples]),
        "whole_per_iteration_wall_us": summarize([s.whole_wall / k for s in samples]),
        "whole_per_iteration_cpu_us": summarize([s.whole_cpu / k for s in samples]),
        "per_session_us": {
            phase: {
                "wall": summarize([getattr(s, f"{phase}_wall") for s in samples]),
                "cpu": summarize([getattr(s, f"{phase}_cpu") for s in samples]),
            }
            for phase in PHASES
        },
    }
    for phase in ("reopen", "cold_reopen"):
        if any(getattr(s, f"{phase}_cpu") for s in samples):
            stats["per_session_us"][phase] = {
                "wall": summarize([getattr(s, f"{phase}_wall") for s in samples]),
                "cpu": summarize([getattr(s, f"{phase}_cpu") for s in samples]),
            }
    if any(s.sign_cpu or s.txn_cpu for s in samples):
        stats["per_session_sign_cpu_us"] = summarize([s.sign_cpu for s in samples])
        stats["per_session_txn_cpu_us"] = summarize([s.txn_cpu for s in samples])
    return stats


def floor_rows(stats: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each journaled contender's durable overhead over its floor (`FLOOR_TARGETS` whose contenders ran)."""
    found = []
    for label, name, base, floor in FLOOR_TARGETS:
        if name not in stats or floor not in stats:
            continue
        whole = {n: stats[n]["whole_per_iteration_cpu_us"]["median"] for n in (name, base, floor)}
        overhead = round(whole[name] - whole[base], 1)
        ratio = round(overhead / whole[floor], 3) if whole[floor] > 0 else None
        found.append(
            {
                "target": f"durable overhead / floor, {label}",
                "contender": name,
                "overhead_cpu_us_per_iteration": overhead,
                "floor_cpu_us_per_iteration": whole[floor],
                "value": ratio,
                "at_most": FLOOR_TARGET,
                "met": ratio is not None and ratio <= FLOOR_TARGET,
            }
        )
    return found


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.3f}x" if base > 0 else "-"


def print_tables(stats: dict[str, dict[str, Any]], work: dict[str, dict[str, Any]], k: int) -> None:
    """The per-iteration table (send alone and whole session), then the per-session phases with what the journal
    wrote (appends, seals, bytes per session, from the warm-up's recording)."""
    cpu = {name: s["whole_per_iteration_cpu_us"]["median"] for name, s in stats.items()}
    send = {name: s["per_iteration_cpu_us"]["median"] for name, s in stats.items()}
    rows = []
    for name, s in stats.items():
        base = baseline(name)
        rows.append(
            (
                name,
                s["per_iteration_wall_us"]["median"],
                send[name],
                _ratio(send[name], send.get(base, 0.0)) if not name.startswith("floor_") else "",
                s["whole_per_iteration_wall_us"]["median"],
                cpu[name],
                s["whole_per_iteration_cpu_us"]["p99"],
                _ratio(cpu[name], cpu.get(base, 0.0)) if not name.startswith("floor_") else "",
                round(cpu[name] - cpu.get(base, 0.0), 1) if not name.startswith(("floor_", "langgraph_no")) else "",
            )
        )
    print()
    headers = (f"per iteration, K={k}, us", "send wall", "send cpu", "send / base")
    headers += ("whole wall", "whole cpu", "whole p99", "whole / base", "whole - base")
    print_table(headers, rows)
    print("(send: send() alone / K, as reported before; whole: open + send + close, / K; medians of this run;")
    print(" base: no_store, http_no_store over HTTP, langgraph_no_checkpointer for LangGraph; floor_*: no trioloop)")
    rows = []
    for name, s in stats.items():
        phases = s["per_session_us"]
        written = work.get(name, {}).get("per_session", {})
        rows.append(
            (
                name,
                *(phases[phase]["cpu"]["median"] for phase in PHASES),
                *(phases[phase]["wall"]["median"] for phase in PHASES),
                written.get("appends", ""),
                written.get("seals", ""),
                written.get("bytes", ""),
            )
        )
    print()
    headers = ("per session, medians, us", "open cpu", "send cpu", "close cpu", "open wall", "send wall", "close wall")
    print_table((*headers, "appends", "seals", "bytes"), rows)
    for name, written in work.items():
        phases = written["per_phase"]
        split = ", ".join(f"{p} {phases[p]['appends']} ({phases[p]['seals']} seals)" for p in PHASES)
        print(f"  {name}: appends by phase: {split}; other store calls: {written['other_store_calls']}")
    print()
    print(load_line())
