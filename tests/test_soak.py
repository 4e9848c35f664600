"""The soak's short run (``python -m benchmarks.soak --short``): faults on every edge, and every invariant held;
and how the soak gives each late leg its cause (`benchmarks._soak_causes`) and judges it.

The short run is a subprocess (the soak starts its own server, proxies, worker processes, MCP servers and, when
the binaries exist, a PostgreSQL server) and must exit 0: no unauthorized run, no call run twice, no lost commit,
every leg settled, no leg over the deadline bound of the process's own making, nothing hung. Nothing here asserts a
time: whether a leg was late is the soak's own judgement (what made it late is checked to be accounted for, not
how long it took), and the wall-clock limit below is a hang guard, far above the ~20 s the short run takes. The
attribution and the verdict are checked on made-up legs, collections and samples.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks._soak_causes import CAUSE_FIELDS, MACHINE_CAUSES, OWN_CAUSES, Causes, classify
from benchmarks._soak_report import OVERSHOOT_BOUND_MS, Tally, growth, verdict
from benchmarks._soak_sessions import Leg
from benchmarks._soak_wiring import AppendTimes

ROOT = Path(__file__).resolve().parent.parent


def test_short_soak_holds_every_invariant(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--short", "--seed", "20261205", "--keep", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    summary = next((r for r in records if r.get("case") == "summary"), None)
    assert summary is not None, f"no summary (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"verdict: {summary['verdict']}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert summary["verdict"] == "held"
    assert summary["turns"] > 0 and summary["faults_total"] > 0
    for invariant in ("unauthorized_runs", "calls_run_twice", "lost_commits", "unsettled_legs"):
        assert summary[invariant] == 0, invariant
    assert summary["conversations_checked"] == summary["conversations"]
    # Every late leg has a cause, its figures, and none is the process's own (the run held).
    late = summary["late_legs"]
    assert sum(late["by_cause"].values()) == summary["legs_over_bound"]
    assert set(late["by_cause"]) == {*MACHINE_CAUSES, *OWN_CAUSES}
    assert not any(late["by_cause"][cause] for cause in OWN_CAUSES)
    for leg in late["legs"]:
        assert set(CAUSE_FIELDS) <= set(leg) and leg["cause"] in MACHINE_CAUSES
    # The instruments ran: the collections of the load (CPU and wall), the loop thread's time.
    assert {"max_pause_cpu_ms", "max_pause_ms", "by_generation", "frozen_objects"} <= set(summary["gc"])
    assert summary["gc"]["frozen_objects"] > 0
    assert summary["loop_thread"]["ran_s"] >= 0


# -- the attribution, on made-up legs ------------------------------------------------------------------------------


def leg(overshoot: float, **figures: float) -> dict[str, Any]:
    return {"overshoot_ms": overshoot, "starved_ms": 0.0, "journal_ms": 0.0, "gc_cpu_ms": 0.0, **figures}


def test_each_cause_explains_the_excess_over_the_bound() -> None:
    bound = OVERSHOOT_BOUND_MS
    # 150 ms over the deadline: 100 over the bound to explain.
    assert classify(leg(150, starved_ms=100), bound) == "starvation"
    assert classify(leg(150, journal_ms=120, starved_ms=10), bound) == "journal"
    assert classify(leg(150, starved_ms=60, journal_ms=40), bound) == "starvation"  # the machine's, together
    assert classify(leg(150, starved_ms=40, journal_ms=60), bound) == "journal"
    assert classify(leg(150, starved_ms=30, journal_ms=30, gc_cpu_ms=40), bound) == "gc"  # the collector needed
    assert classify(leg(150, gc_cpu_ms=99.6, starved_ms=0.5), bound) == "gc"
    assert classify(leg(150, starved_ms=30, journal_ms=30, gc_cpu_ms=30), bound) == "ours"
    assert classify(leg(150), bound) == "ours"
    assert classify({"overshoot_ms": 150}, bound) == "ours"  # a leg no instrument explained is the process's


def figures_of(*late: dict[str, Any]) -> dict[str, Any]:
    tally = Tally()
    for number, figures in enumerate(late):
        tally.feed(
            {
                "e": "leg",
                "sid": f"s{number}",
                "store": "sqlite",
                "kind": "send",
                "outcome": "bounded:deadline",
                "machine_ms": 2500 + figures["overshoot_ms"],
                "settle_ms": 2500 + figures["overshoot_ms"],
                "unwind_ms": 1.0,
                "person_overshoot_ms": figures["overshoot_ms"],
                "journal_late_ms": 0.0,
                **figures,
            }
        )
    return tally.figures()


def test_only_late_legs_of_the_process_own_making_fail_the_run() -> None:
    machine = figures_of(leg(900, starved_ms=880), leg(300, journal_ms=290), leg(20))
    samples = [{"t": 0.0, "turns": 0, "rss_mib": 1.0, "fds": 1, "tasks": 1}]
    assert machine["legs_over_bound"] == 2
    assert machine["late_legs"]["by_cause"] == {"starvation": 1, "journal": 1, "gc": 0, "ours": 0}
    assert machine["late_legs"]["worst"]["starvation"]["overshoot_ms"] == 900
    assert verdict(machine, growth(samples, 60.0), []) == []

    own = figures_of(leg(900, starved_ms=880), leg(120, gc_cpu_ms=80), leg(75))
    assert own["late_legs"]["by_cause"] == {"starvation": 1, "journal": 0, "gc": 1, "ours": 1}
    failed = verdict(own, growth(samples, 60.0), [])
    assert len(failed) == 1 and "gc: 1, ours: 1" in failed[0] and "worst 120" in failed[0]
    # The invariants are judged as before, beside it.
    assert verdict(machine | {"lost_commits": 1}, growth(samples, 60.0), ["slot m1 failed"]) == [
        "slot m1 failed",
        "1 commits seen succeed but missing from the reopened journal's document",
    ]


def test_a_window_is_split_into_journal_writes_the_wait_for_a_core_and_collections() -> None:
    """Trio's clock = perf_counter + 100 here; the leg's window is 10.0 .. 10.4 (Trio's clock)."""
    times = AppendTimes()
    times.add("sqlite", "s", 10.1, 10.2)  # a journal write in flight for 100 ms of it
    times.add("sqlite", "other", 10.0, 10.4)  # another session's: not this leg's
    causes = Causes(times)
    causes.installed, causes.offset = True, 100.0
    run = causes.run
    # Cumulative (ran, waited for a core, idle; the other threads: ran, waited), in seconds, sampled at perf_counter
    # times -90.0, -89.8, -89.6: in each 200 ms the loop thread waited 100 ms for a core, ran 50 and idled 50.
    for t, ran, waited, idle in ((-90.0, 1.0, 2.0, 3.0), (-89.8, 1.05, 2.1, 3.05), (-89.6, 1.1, 2.2, 3.1)):
        run.samples.add(t, ran, waited, idle, 0.0, 0.0)
    causes.gc.recent.add(-89.83, 0.05, 0.02, 2)  # a collection: 50 ms wall (30 of them in the write), 20 ms CPU
    found = causes.explain("s", 10.0, 10.4)
    assert found["journal_ms"] == 100.0
    assert found["core_wait_ms"] == 200.0 and found["ran_ms"] == 100.0 and found["idle_ms"] == 100.0
    assert found["starved_ms"] == 150.0  # outside the write
    assert found["gc_pauses"] == 1 and found["gc_wall_ms"] == 20.0 and found["gc_cpu_ms"] == 8.0
    # Over the bound by 250 ms: the wait for a core and the write explain it; by 255: the collection too; by 350:
    # nothing does (150 + 100 + 8 < 350).
    assert classify({**found, "overshoot_ms": 300.0}, OVERSHOOT_BOUND_MS) == "starvation"
    assert classify({**found, "overshoot_ms": 305.0}, OVERSHOOT_BOUND_MS) == "gc"
    assert classify({**found, "overshoot_ms": 400.0}, OVERSHOOT_BOUND_MS) == "ours"
    assert Causes(times).explain("s", 10.0, 10.4) == {}  # not installed: nothing measured, nothing said


def test_the_loop_thread_blocked_while_another_thread_waited_for_a_core_was_starved() -> None:
    """The loop thread neither ran, waited for a core nor idled for 90 ms of 100 (the GIL, held by a thread the
    machine did not run): the other threads' wait for a core, 60 ms, counts as the process starved."""
    causes = Causes(None)
    causes.installed = True
    causes.run.samples.add(0.0, 1.0, 2.0, 3.0, 10.0, 20.0)
    causes.run.samples.add(0.1, 1.01, 2.0, 3.0, 10.0, 20.06)
    found = causes.explain("s", 0.0, 0.1)
    assert (found["ran_ms"], found["blocked_ms"], found["others_core_wait_ms"]) == (10.0, 90.0, 60.0)
    assert found["starved_ms"] == 60.0 and found["journal_ms"] == 0.0


def test_a_session_writes_are_kept_in_arrays_and_forgotten_when_it_retires() -> None:
    times = AppendTimes()
    for n in range(40):
        times.add("sqlite", "s", float(n), n + 0.5)
    assert times.writes("s")[-1] == (39.0, 39.5) and len(times.writes("s")) == AppendTimes.KEEP_PER_SESSION
    assert times.busy("s", 39.2, 40.0) == pytest.approx(0.3)
    times.forget("s")
    assert times.writes("s") == [] and list(times.seconds["sqlite"]) == [0.5] * 40


def test_a_continued_leg_carries_the_review_lag_its_budget_was_charged_with() -> None:
    """A leg suspended in review used machine time up to the review's publication, which holds the cards' journal
    writes the runner kept off its deadline: the continued leg's budget is smaller by them, so they go with it and
    count as the store's time there, as they did in the leg that wrote them."""
    first = Leg(kind="send", turn="t", start=10.0, budget=(2.5, 2.5), review_lag=0.04)
    first.waited = [0.3, 0.35]
    carried = first.carry(11.0, "t")  # published the review (and was suspended in it) at 11.0
    assert carried.kind == "continue" and carried.turn == "t"
    assert carried.budget == pytest.approx((2.5 - 0.7, 2.5 - 0.65))
    assert carried.review_lag == 0.04
    spent = first.carry(20.0, "t")  # past the deadline already: nothing left, never negative
    assert spent.budget == (0.0, 0.0)
