"""The journal benchmark's smallest run prints issue 42's targets, the LangGraph peer's figures and PostgreSQL's.

Each run is one round of one turn per contender, so the figures are noise: the tests assert what is printed and
that each figure is a number, never a value. Without LangGraph or PostgreSQL's binaries here the run must still
finish and say what it skipped; the second test takes both away to check that path wherever it runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import journal
from benchmarks.journal_peers import langgraph_missing

ROOT = Path(__file__).resolve().parent.parent
SMALLEST = ["--rounds", "1", "--turns", "1"]
RATIO_LINES = (
    "SQLite durable / no store, in process: ",
    "SQLite durable / no store, over loopback HTTP: ",
    "memory journal / no store, in process: ",
)
PEER_LINE = "durable overhead per iteration, ours (sqlite_durable - no_store) / LangGraph SqliteSaver's: "
POSTGRES_LINE = "PostgreSQL durable (reported, no target): "


def _run(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    assert journal.main(SMALLEST) == 0
    out = capsys.readouterr().out.splitlines()
    records = {record["case"]: record for record in (json.loads(line) for line in out if line.startswith("{"))}
    return records, [line for line in out if not line.startswith("{")]


def _line(lines: list[str], start: str) -> str:
    found = [line.strip() for line in lines if line.strip().startswith(start)]
    assert len(found) == 1, f"one line starting {start!r} in {lines}"
    return found[0]


def _postgres_here() -> bool:
    sys.path.insert(0, str(ROOT))
    try:
        import psycopg  # noqa: F401

        from tests.pg_support import find_postgres_bin
    except ImportError:
        return False
    finally:
        sys.path.remove(str(ROOT))
    return find_postgres_bin() is not None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.mark.usefixtures("young_heap")  # the benchmark collects before every contender's round
def test_the_summary_prints_each_target_and_the_peers_figures(capsys: pytest.CaptureFixture[str]) -> None:
    records, lines = _run(capsys)
    summary = records["summary"]
    for start in RATIO_LINES:
        assert _line(lines, start).endswith((": met", ": NOT met"))
    targets = {t["target"]: t for t in summary["issue42_targets"]}
    for label, _, _, most in journal.RATIO_TARGETS:
        assert targets[label]["at_most"] == most and _is_number(targets[label]["value"])
        assert isinstance(targets[label]["met"], bool)
    assert _is_number(summary["durable_overhead_cpu_us"])

    peer = _line(lines, PEER_LINE)
    if langgraph_missing() is None:
        for case in ("langgraph_no_checkpointer", "langgraph_sqlite_saver"):
            assert _is_number(records[case]["per_iteration_cpu_us"]["median"])
        assert records["langgraph_sqlite_saver"]["settings"] == {
            "journal_mode": "WAL",
            "synchronous": "FULL",
            "durability": "sync",
        }
        assert _is_number(summary["langgraph_overhead_cpu_us"]) and summary["langgraph_overhead_cpu_us"] > 0
        assert _is_number(summary["ours_over_langgraph"])
        assert f"= {summary['ours_over_langgraph']} (at most 1/6 = 0.167" in peer
        assert peer.endswith((": met", ": NOT met"))
    else:
        assert "langgraph" in summary["skipped"] and "skipped" in peer

    postgres = _line(lines, POSTGRES_LINE)
    if _postgres_here():
        for case in ("postgres_durable", "http_postgres_durable"):
            assert _is_number(records[case]["per_iteration_cpu_us"]["median"])
            assert records[case]["settings"]["synchronous_commit"] == "on"
        assert _is_number(summary["postgres_overhead_cpu_us"]) and "per iteration" in postgres
    else:
        assert os.environ.get("TRIOLOOP_REQUIRE_POSTGRES") != "1", "TRIOLOOP_REQUIRE_POSTGRES=1 but no PostgreSQL"
        assert "postgres" in summary["skipped"] and "skipped" in postgres


@pytest.mark.usefixtures("young_heap")
def test_without_langgraph_or_postgresql_the_rest_runs_and_says_what_it_skipped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ["langgraph", *(name for name in sys.modules if name.startswith("langgraph."))]:
        monkeypatch.setitem(sys.modules, name, None)  # `import langgraph...` raises ImportError, even once imported
    monkeypatch.setitem(sys.modules, "psycopg", None)
    records, lines = _run(capsys)
    assert any(line.startswith("LangGraph peer skipped: ") for line in lines)
    assert any(line.startswith("PostgreSQL journaling skipped: ") for line in lines)
    assert "skipped (" in _line(lines, PEER_LINE) and "skipped (" in _line(lines, POSTGRES_LINE)
    summary = records["summary"]
    assert set(summary["skipped"]) == {"langgraph", "postgres"}
    assert summary["langgraph_overhead_cpu_us"] is None and summary["ours_over_langgraph"] is None
    assert [t["target"] for t in summary["issue42_targets"]] == [label for label, *_ in journal.RATIO_TARGETS]
    assert not any(case.startswith(("langgraph_", "postgres_", "http_postgres_")) for case in records)
    for start in RATIO_LINES:
        assert _line(lines, start).endswith((": met", ": NOT met"))
