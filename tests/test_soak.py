"""The soak's short run (``python -m benchmarks.soak --short``): faults on every edge, and every invariant held.

It runs as a subprocess (the soak starts its own server, proxies, worker processes, MCP servers and, when the
binaries exist, a PostgreSQL server) and must exit 0: no unauthorized run, no call run twice, no lost commit,
every turn settled within its deadline + 50 ms (time waiting for the person excluded), nothing hung. The only
timing assertion is that deadline bound, which the soak checks itself; the wall-clock limit below is a hang
guard, far above the ~20 s the short run takes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    assert summary["max_overshoot_ms"] is None or summary["max_overshoot_ms"] <= summary["setup"]["overshoot_bound_ms"]
