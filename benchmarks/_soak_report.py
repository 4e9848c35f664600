"""What the soak concludes from its ledgers and samples: the invariants, the figures, and growth per 1,000 turns.

`Tally` folds every event of every process (the soak's own as they happen, the workers' and the MCP servers'
from their files at the end) and `Tally.verdict` checks:

- **no unauthorized run**: every run of a tool that changes something (``append_line``, ``archive_line``, the
  MCP server's ``stamp``) is of a call the person approved while its card was pending (late clicks are not
  approvals);
- **no call run twice**: one run per (session, call id), whatever was killed, reset or reopened;
- **no lost commit**: every call an observer saw succeed is in the document its journal gives back when the
  conversation retires (an appended line's token is there; an archived one is marked), and that document is
  the live one when the session ended cleanly;
- **every turn settled, on time**: no leg left unsettled, and settle - start - time waiting for the person -
  the leg's budget (the deadline, less what an earlier leg of the turn used) at most `OVERSHOOT_BOUND_MS`, the
  wait running until the state that left the review (the runner's own account; see `Leg`), unless the machine
  explains the excess: each leg over the bound gets a cause (`attribute`, `benchmarks._soak_causes.classify`),
  and only those of the process's own making (a collection, or nothing the machine explains) fail the run. The
  same figure with the wait ending at the person's click, and the late legs during whose deadline a journal
  append of the session was in flight, are reported beside it;
- **no growth**: RSS, open file descriptors and Trio tasks of the soak's own process, sampled over time, grow
  by at most `GROWTH_BOUNDS` per 1,000 turns (the slope of a least-squares line over the samples after the
  first quarter of the run; judged only past `GROWTH_MIN_TURNS` turns, where noise no longer dominates);
- nothing unexpected: no task failed, no conversation could not be reopened, no worker ended badly.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Final

from benchmarks._soak_causes import CAUSE_FIELDS, MACHINE_CAUSES, OVERSHOOT_BOUND_MS, OWN_CAUSES, classify
from benchmarks._soak_sessions import percentile
from benchmarks._soak_tools import READS, Event, token_lines

#: Growth allowed per 1,000 turns once the run is warm: the working set of a steady load must not climb.
GROWTH_BOUNDS: Final = {"rss_mib": 4.0, "fds": 2.0, "tasks": 2.0}
GROWTH_MIN_TURNS: Final = 3000


def token_of(call: str) -> str:
    """The line token the model gave call ``toolu_<nonce>_<i>_<n>``: ``T-<nonce>-<i>-<n>``."""
    return "T-" + call.removeprefix("toolu_").replace("_", "-")


class Tally:
    """Every event of the run, folded."""

    def __init__(self) -> None:
        self.runs: Counter[tuple[str, str]] = Counter()
        self.run_tool: dict[tuple[str, str], str] = {}
        self.archived_token: dict[tuple[str, str], str] = {}
        self.approved: set[tuple[str, str]] = set()
        self.succeeded: dict[tuple[str, str], str] = {}
        self.final_docs: dict[str, str] = {}
        self.live_mismatch: list[str] = []
        self.legs: list[Event] = []
        self.clicks: Counter[str] = Counter()
        self.late_clicks = Counter[str]()
        self.events: Counter[str] = Counter()
        self.mcp_faults: Counter[str] = Counter()
        self.sessions: dict[str, str] = {}  # sid -> store
        self.retire_failed: list[str] = []

    def feed(self, event: Event) -> None:
        kind = event["e"]
        self.events[kind] += 1
        if kind == "run":
            key = (event["sid"], event["call"])
            self.runs[key] += 1
            self.run_tool[key] = event["tool"]
            if "token" in event:
                self.archived_token[key] = event["token"]
        elif kind == "approve":
            self.approved.add((event["sid"], event["call"]))
        elif kind == "succeeded":
            self.succeeded[(event["sid"], event["call"])] = event["tool"]
        elif kind == "final_doc":
            self.final_docs[event["sid"]] = event["document"]
            if event.get("live_equal") is False:
                self.live_mismatch.append(event["sid"])
        elif kind == "leg":
            self.legs.append(event)
        elif kind == "click":
            self.clicks[event["what"]] += 1
        elif kind == "late_click":
            self.late_clicks["taken" if event["taken"] else "refused"] += 1
        elif kind == "mcp_fault":
            self.mcp_faults[event["kind"]] += 1
        elif kind == "conversation":
            self.sessions[event["sid"]] = event["store"]
        elif kind == "retire_failed":
            self.retire_failed.append(event["sid"])

    def feed_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.feed(event)

    # -- invariants ------------------------------------------------------------------------------

    def unauthorized(self) -> list[tuple[str, str, str]]:
        """Runs of changing tools with no approval of their call in time."""
        return sorted(
            (sid, call, self.run_tool[(sid, call)])
            for (sid, call) in self.runs
            if self.run_tool[(sid, call)] not in READS and (sid, call) not in self.approved
        )

    def twice(self) -> list[tuple[str, str, int]]:
        return sorted((sid, call, n) for (sid, call), n in self.runs.items() if n > 1)

    def lost_commits(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        """(calls seen succeeded whose change is not in the retired journal's document, sessions never checked)."""
        lost: list[tuple[str, str, str]] = []
        unchecked: set[str] = set()
        lines_of: dict[str, dict[str, bool]] = {}
        for (sid, call), tool in sorted(self.succeeded.items()):
            if tool not in ("append_line", "archive_line"):
                continue
            if sid not in self.final_docs:
                unchecked.add(sid)
                continue
            lines = lines_of.get(sid)
            if lines is None:
                lines = lines_of[sid] = token_lines(self.final_docs[sid])
            if (tool == "append_line" and token_of(call) not in lines) or (
                tool == "archive_line" and not lines.get(self.archived_token.get((sid, call), "?"), False)
            ):
                lost.append((sid, call, tool))
        return lost, sorted(unchecked)

    def overshoots(self, kinds: Sequence[str], key: str = "overshoot_ms") -> list[float]:
        return [leg[key] for leg in self.legs if leg["kind"] in kinds and leg[key] is not None]

    def unsettled(self) -> list[Event]:
        return [leg for leg in self.legs if leg["outcome"] == "unsettled"]

    def figures(self) -> dict[str, Any]:
        sends = [leg for leg in self.legs if leg["kind"] == "send"]
        machine = [leg["machine_ms"] for leg in self.legs if leg["machine_ms"] is not None]
        settle = [leg["settle_ms"] for leg in self.legs if leg["settle_ms"] is not None]
        unwind = [leg["unwind_ms"] for leg in self.legs if leg["unwind_ms"] is not None]
        timed = self.overshoots(("send", "continue"))
        after_crash = self.overshoots(("after_crash",))
        person = self.overshoots(("send", "continue"), "person_overshoot_ms")
        late = [
            leg
            for leg in self.legs
            if leg["kind"] in ("send", "continue") and (leg["overshoot_ms"] or 0) > OVERSHOOT_BOUND_MS
        ]
        journal_bound = [leg for leg in late if leg["journal_late_ms"] + OVERSHOOT_BOUND_MS >= leg["overshoot_ms"]]
        late_after_crash = [
            leg for leg in self.legs if leg["kind"] == "after_crash" and (leg["overshoot_ms"] or 0) > OVERSHOOT_BOUND_MS
        ]
        lost, unchecked = self.lost_commits()
        by_store = Counter(leg["store"] for leg in sends)
        return {
            "turns": len(sends),
            "turns_by_store": dict(by_store),
            "legs_by_kind": dict(Counter(leg["kind"] for leg in self.legs)),
            "outcomes": dict(Counter(leg["outcome"] for leg in self.legs).most_common()),
            "max_overshoot_ms": round(max(timed), 3) if timed else None,
            "p99_overshoot_ms": round(percentile(timed, 99), 3) if timed else None,
            "max_overshoot_after_crash_ms_lower_bound": round(max(after_crash), 3) if after_crash else None,
            "max_overshoot_person_ms": round(max(person), 3) if person else None,
            "p99_overshoot_person_ms": round(percentile(person, 99), 3) if person else None,
            "legs_over_bound_person": sum(1 for value in person if value > OVERSHOOT_BOUND_MS),
            "legs_over_bound": len(late),
            "legs_over_bound_journal_covered": len(journal_bound),
            "legs_over_bound_by_store": dict(Counter(leg["store"] for leg in late)),
            "late_legs": attribute(late),
            "late_legs_after_crash": attribute(late_after_crash),
            "p99_settle_ms_review_excluded": round(percentile(machine, 99), 3),
            "p50_settle_ms_review_excluded": round(percentile(machine, 50), 3),
            "p99_settle_ms_wall": round(percentile(settle, 99), 3),
            "max_unwind_ms": round(max(unwind), 3) if unwind else None,
            "p99_unwind_ms": round(percentile(unwind, 99), 3),
            "runs": sum(self.runs.values()),
            "approvals": len(self.approved),
            "unauthorized_runs": len(self.unauthorized()),
            "calls_run_twice": len(self.twice()),
            "commits_seen": sum(1 for tool in self.succeeded.values() if tool in ("append_line", "archive_line")),
            "lost_commits": len(lost),
            "conversations": len(self.sessions),
            "conversations_checked": len(self.final_docs),
            "unchecked_conversations": len(unchecked),
            "live_vs_journal_mismatch": len(self.live_mismatch),
            "retire_failed": len(self.retire_failed),
            "unsettled_legs": len(self.unsettled()),
            "clicks": dict(self.clicks.most_common()),
            "late_clicks": dict(self.late_clicks),
            "journal_errors": self.events["journal_error"],
            "reopens": self.events["reopen"],
            "open_retries": self.events["open_retry"],
            "observer_errors": self.events["observer_error"],
        }


def slope_per_1000(samples: Sequence[dict[str, Any]], key: str) -> float | None:
    """Least-squares slope of ``key`` against the turn count, per 1,000 turns (None: too few points)."""
    xs = [s["turns"] for s in samples]
    ys = [s[key] for s in samples]
    if len(xs) < 3 or max(xs) == min(xs):
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return sxy / sxx * 1000


def growth(samples: Sequence[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    """Per metric: first and last value, peak, slope per 1,000 turns after warm-up, bound, and whether judged."""
    warm = [s for s in samples if s["t"] >= duration_s / 4] or list(samples)
    turns = (warm[-1]["turns"] - warm[0]["turns"]) if warm else 0
    judged = turns >= GROWTH_MIN_TURNS
    out: dict[str, Any] = {"turns_in_window": turns, "judged": judged}
    for key, bound in GROWTH_BOUNDS.items():
        slope = slope_per_1000(warm, key)
        out[key] = {
            "first": samples[0][key] if samples else None,
            "last": samples[-1][key] if samples else None,
            "peak": max((s[key] for s in samples), default=None),
            "per_1000_turns": None if slope is None else round(slope, 3),
            "bound_per_1000_turns": bound,
            "ok": (not judged) or slope is None or slope <= bound,
        }
    return out


def verdict(figures: dict[str, Any], growth_figures: dict[str, Any], problems: Sequence[str]) -> list[str]:
    """Every invariant that failed, as a sentence (empty: the run held)."""
    failed = list(problems)
    checks = (
        ("unauthorized_runs", "tool runs without an approval in time"),
        ("calls_run_twice", "calls run more than once"),
        ("lost_commits", "commits seen succeed but missing from the reopened journal's document"),
        ("unchecked_conversations", "conversations whose journal was never read back"),
        ("live_vs_journal_mismatch", "conversations whose reopened document differs from the live one"),
        ("retire_failed", "conversations that could not be reopened to retire"),
        ("unsettled_legs", "legs that never settled"),
        ("observer_errors", "observer errors"),
    )
    for key, what in checks:
        if figures[key]:
            failed.append(f"{figures[key]} {what}")
    # A leg over the bound fails the run when the process's own work made it late (`benchmarks._soak_causes`): a
    # collection's CPU, or nothing the machine explains; the ones a busy core or a journal write explains are
    # reported (the table lists them by cause, with the worst of each) and do not.
    for key, what in (("late_legs", "legs"), ("late_legs_after_crash", "legs continued after a crash")):
        own = {cause: n for cause, n in figures[key]["by_cause"].items() if cause in OWN_CAUSES and n}
        if own:
            worst = max(figures[key]["worst"][cause]["overshoot_ms"] for cause in own)
            causes = ", ".join(f"{cause}: {n}" for cause, n in own.items())
            failed.append(
                f"{sum(own.values())} {what} over the {OVERSHOOT_BOUND_MS} ms bound of the process's own making "
                f"({causes}; worst {worst} ms)"
            )
    if figures["turns"] == 0:
        failed.append("no turn ran")
    for key in GROWTH_BOUNDS:
        metric = growth_figures[key]
        if not metric["ok"]:
            failed.append(f"{key} grew {metric['per_1000_turns']} per 1,000 turns > {metric['bound_per_1000_turns']}")
    return failed


def attribute(late: Sequence[Event]) -> dict[str, Any]:
    """The late legs by cause (`benchmarks._soak_causes.classify`): counts, whether each cause fails the run, the
    worst leg of each with every figure it was judged on, and the legs themselves (the worst 200)."""
    by_cause: dict[str, list[Event]] = {cause: [] for cause in (*MACHINE_CAUSES, *OWN_CAUSES)}
    for leg in late:
        by_cause[classify(leg, OVERSHOOT_BOUND_MS)].append(leg)

    def brief(leg: Event) -> dict[str, Any]:
        keys = ("sid", "kind", "store", "outcome", "overshoot_ms", *CAUSE_FIELDS, "late_at")
        return {key: leg.get(key) for key in keys} | {"cause": classify(leg, OVERSHOOT_BOUND_MS)}

    ordered = sorted(late, key=lambda leg: leg["overshoot_ms"], reverse=True)
    return {
        "by_cause": {cause: len(legs) for cause, legs in by_cause.items()},
        "fails": {cause: cause in OWN_CAUSES for cause in by_cause},
        "worst": {
            cause: brief(max(legs, key=lambda leg: leg["overshoot_ms"])) for cause, legs in by_cause.items() if legs
        },
        "legs": [brief(leg) for leg in ordered[:200]],
    }


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
