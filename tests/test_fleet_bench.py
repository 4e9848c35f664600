"""The fleet benchmark's smallest run keeps its invariants: 20 sessions suspended in review on PostgreSQL, two
worker processes continuing them as a decider decides, one worker killed (SIGKILL) in the middle of a call and
started again. Every decided session is continued, no call runs twice, and the call cut short by the kill is
settled interrupted, having started once and never again. Figures are not asserted (``python -m
benchmarks.fleet`` reports them)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name

from benchmarks import fleet

N = 20


@pytest.fixture
def fleet_url(postgres_url: str) -> Iterator[str]:  # noqa: F811 -- the fixture imported above
    """A database of its own on the tests' server: the benchmark drops and makes its tables."""
    server, _ = postgres_url.rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS trioloop_fleet")
        admin.execute("CREATE DATABASE trioloop_fleet")
    yield f"{server}/trioloop_fleet"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS trioloop_fleet WITH (FORCE)")


def test_a_killed_worker_runs_no_call_twice_and_every_decided_session_is_continued(fleet_url: str) -> None:
    args = fleet.parse_args(["--sizes", str(N), "--workers", "2", "--rates", "50", "--hold", "5"])
    args.no_kill = False
    setups, fleets = fleet.run(fleet_url, args)
    assert list(fleets) == [(N, 2, 50.0, False), (N, 2, 50.0, True)]
    for result in fleets.values():
        assert result["decided"] == result["continued"] == N
        assert result["calls_run_twice"] == 0
    killed = fleets[(N, 2, 50.0, True)]
    assert killed["killed"] is not None
    assert killed["interrupted_started_once"] >= 1  # the kill landed while the victim's tool ran
    never_started = killed["interrupted"] - killed["interrupted_started_once"]  # killed between start and tool
    assert killed["calls_run"] == N - never_started
    assert setups[N]["held_suspended"] == 5 and setups[N]["entries_per_session"] > 0
