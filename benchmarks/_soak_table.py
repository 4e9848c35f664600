"""The soak's report: the summary record (every figure and the verdict), the samples record, and the table.

Late legs are listed by cause (`benchmarks._soak_causes`): how many each cause explains, whether it fails the
run, and the worst leg of each with the figures it was judged on, so a person can check the attribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchmarks._common import case_record, emit, print_table
from benchmarks._soak_causes import OWN_CAUSES
from benchmarks._soak_report import OVERSHOOT_BOUND_MS, Tally, growth, verdict

if TYPE_CHECKING:
    from benchmarks.soak import Plan

PEERS = ("psutil", "psycopg", "mcp")


def faults_of(result: dict[str, Any], proxies: dict[str, dict[str, Any]], server: dict[str, Any]) -> dict[str, Any]:
    tally: Tally = result["tally"]
    faults: dict[str, Any] = {}
    for edge, counters in proxies.items():
        for kind, count in counters.get("fired", {}).items():
            faults[f"{edge}_{kind}"] = count
    for kind in ("http_429", "http_529"):
        faults[f"provider_{kind}"] = server.get(kind, 0)
    faults["worker_sigkill"] = result["kills"]
    faults.update(result["mcp_chaos"])
    for kind, count in tally.mcp_faults.items():
        faults[f"mcp_server_{kind}"] = count
    return faults


def report(
    plan: Plan,
    result: dict[str, Any],
    proxies: dict[str, dict[str, Any]],
    server: dict[str, Any],
    load_s: float,
    wall_s: float,
) -> int:
    tally: Tally = result["tally"]
    figures = tally.figures()
    faults = faults_of(result, proxies, server)
    growth_figures = growth(result["samples"], plan.duration_s)
    lag = sorted(result["lag"])
    failed = verdict(figures, growth_figures, result["problems"])
    setup = {
        "sessions": plan.sessions,
        "in_process": plan.local_sessions,
        "in_workers": plan.workers * plan.worker_sessions,
        "workers": plan.workers,
        "postgres_sessions": plan.postgres_sessions + (plan.workers if plan.postgres_sessions else 0),
        "mcp_sessions": plan.mcp_sessions,
        "minutes": round(plan.duration_s / 60, 2),
        "seed": plan.seed,
        "deadline_ms": plan.deadline_ms,
        "review_timeout_ms": plan.review_timeout_ms,
        "overshoot_bound_ms": OVERSHOOT_BOUND_MS,
    }
    summary = {
        "setup": setup,
        **figures,
        "faults": faults,
        "faults_total": sum(faults.values()),
        "worker_starts": result["worker_starts"],
        "loop_lag_ms": {
            "p99": round(lag[max(0, int(len(lag) * 0.99) - 1)], 3) if lag else None,
            "max": round(lag[-1], 3) if lag else None,
        },
        "longest_task_steps": result["slow_steps"],
        "gc": result["gc"],
        "loop_thread": result["loop_thread"],
        **({"census": result["census"]} if result["census"] else {}),
        "journal_append_ms": result["append_ms"],
        "growth": growth_figures,
        "provider_server": server,
        "proxy_connections": {edge: counters.get("connections") for edge, counters in proxies.items()},
        "load_s": round(load_s, 1),
        "wall_s": round(wall_s, 1),
        "verdict": failed or "held",
    }
    emit(case_record("soak", "summary", PEERS, **summary))
    emit(case_record("soak", "samples", PEERS, samples=result["samples"]))
    rows: list[tuple[str, Any]] = [
        ("turns", figures["turns"]),
        ("turns/s", round(figures["turns"] / max(load_s, 1e-9), 1)),
        *((f"legs: {kind}", count) for kind, count in figures["legs_by_kind"].items()),
        *((f"outcome: {kind}", count) for kind, count in figures["outcomes"].items()),
        *((f"fault: {kind}", count) for kind, count in sorted(faults.items())),
        ("max overshoot ms (review excluded)", figures["max_overshoot_ms"]),
        ("p99 overshoot ms", figures["p99_overshoot_ms"]),
        ("legs over the bound", figures["legs_over_bound"]),
        ("  of which journal writes covered all but 50 ms of", figures["legs_over_bound_journal_covered"]),
        *cause_rows(figures["late_legs"], "late legs"),
        *cause_rows(figures["late_legs_after_crash"], "late legs after a crash", quiet=True),
        ("max overshoot ms, review ending at the click", figures["max_overshoot_person_ms"]),
        ("legs over the bound, review ending at the click", figures["legs_over_bound_person"]),
        ("max overshoot after a crash ms (lower bound)", figures["max_overshoot_after_crash_ms_lower_bound"]),
        ("p99 settle ms (review excluded)", figures["p99_settle_ms_review_excluded"]),
        ("max unwind ms (settled -> send returns)", figures["max_unwind_ms"]),
        ("loop lag ms p99 / max", f"{summary['loop_lag_ms']['p99']} / {summary['loop_lag_ms']['max']}"),
        ("longest task step ms", result["slow_steps"][0]["ms"] if result["slow_steps"] else None),
        *gc_rows(result["gc"], result["loop_thread"]),
        *(
            (f"journal append ms, {store}: p50 / p99 / max", f"{t['p50']} / {t['p99']} / {t['max']}")
            for store, t in result["append_ms"].items()
        ),
        ("runs / approvals", f"{figures['runs']} / {figures['approvals']}"),
        ("unauthorized runs", figures["unauthorized_runs"]),
        ("calls run twice", figures["calls_run_twice"]),
        ("commits seen / lost", f"{figures['commits_seen']} / {figures['lost_commits']}"),
        ("conversations / checked", f"{figures['conversations']} / {figures['conversations_checked']}"),
        ("journal errors / reopens", f"{figures['journal_errors']} / {figures['reopens']}"),
        ("worker kills / starts", f"{result['kills']} / {result['worker_starts']}"),
    ]
    for key in ("rss_mib", "fds", "tasks"):
        metric = growth_figures[key]
        judged = "" if growth_figures["judged"] else ", not judged: too few turns"
        rows.append((f"{key}: first / peak / last", f"{metric['first']} / {metric['peak']} / {metric['last']}"))
        rows.append(
            (
                f"{key}: per 1,000 turns (bound)",
                f"{metric['per_1000_turns']} ({metric['bound_per_1000_turns']}{judged})",
            )
        )
    rows.append(("verdict", "; ".join(failed) if failed else "every invariant held"))
    print()
    print_table(["soak", "value"], rows)
    print_worst(figures)
    return 1 if failed else 0


def _leg_line(leg: dict[str, Any]) -> str:
    """A late leg and what its window held (ms): enough to check its cause by hand."""
    return (
        f"{leg['overshoot_ms']:.1f} ms over ({leg['sid']}, {leg['kind']}, {leg['store']}, {leg['outcome']}): "
        f"starved {leg.get('starved_ms')}, journal writes {leg.get('journal_ms')}, gc {leg.get('gc_cpu_ms')} CPU / "
        f"{leg.get('gc_wall_ms')} wall in {leg.get('gc_pauses')} pauses; the loop thread ran {leg.get('ran_ms')}, "
        f"waited for a core {leg.get('core_wait_ms')}, idle {leg.get('idle_ms')}, blocked {leg.get('blocked_ms')}; "
        f"other threads ran {leg.get('others_ran_ms')}, waited for a core {leg.get('others_core_wait_ms')}"
    )


def cause_rows(late: dict[str, Any], what: str, *, quiet: bool = False) -> list[tuple[str, Any]]:
    """Per cause: how many late legs, and whether they fail the run."""
    if quiet and not late["legs"]:
        return []
    return [
        (f"{what}: {cause} ({'trioloop: fails' if cause in OWN_CAUSES else 'the machine: does not fail'})", count)
        for cause, count in late["by_cause"].items()
    ]


def print_worst(figures: dict[str, Any]) -> None:
    """The worst late leg of each cause, with the figures it was judged on and where its tasks waited."""
    for key, what in (("late_legs", "late legs"), ("late_legs_after_crash", "late legs after a crash")):
        worst = figures[key]["worst"]
        if not worst:
            continue
        print(f"\n{what}, the worst of each cause (window: the deadline to the settle; ms):")
        for cause, leg in worst.items():
            judged = "fails" if cause in OWN_CAUSES else "does not fail"
            print(f"  {cause} ({judged}): {_leg_line(leg)}")
            for line in (leg.get("late_at") or [])[:6]:
                print(f"      {line}")


def gc_rows(gc: dict[str, Any], loop_thread: dict[str, Any]) -> list[tuple[str, Any]]:
    """The collector's pauses (wall and CPU) and the loop thread's time, over the load."""
    worst = gc["worst_by_cpu"][0] if gc["worst_by_cpu"] else None
    by_generation = " / ".join(str(n) for n in gc["by_generation"])
    rows: list[tuple[str, Any]] = [
        ("gc: collections, generation 0 / 1 / 2", f"{gc['collections']}: {by_generation}"),
        ("gc: longest pause ms, wall / CPU", f"{gc['max_pause_ms']} / {gc['max_pause_cpu_ms']}"),
        (
            "gc: longest generation-2 pause ms, wall / CPU",
            f"{gc['max_pause_ms_by_generation'][2]} / {gc['max_pause_cpu_ms_by_generation'][2]}",
        ),
        ("gc: pauses over 5 ms, wall / CPU", f"{gc['pauses_over_5ms']} / {gc['pauses_over_5ms_cpu']}"),
        ("gc: total pause ms, wall / CPU", f"{gc['total_pause_ms']} / {gc['total_pause_cpu_ms']}"),
        ("gc: objects frozen / thresholds", f"{gc['frozen_objects']} / {gc['thresholds']}"),
    ]
    if worst is not None:
        rows.append(("gc: costliest pause", f"generation {worst['generation']}, {worst['collected']} collected"))
    if loop_thread:
        rows.append(
            (
                "loop thread s: wall / ran / waited for a core / idle",
                f"{loop_thread['wall_s']} / {loop_thread['ran_s']} / {loop_thread['waited_for_a_core_s']} / "
                f"{loop_thread['idle_s']} ({loop_thread['source']})",
            )
        )
        rows.append(
            (
                "other threads s: ran / waited for a core",
                f"{loop_thread['other_threads_ran_s']} / {loop_thread['other_threads_waited_for_a_core_s']}",
            )
        )
    return rows
