"""`trioloop demo` is the main job: it must run green with no network and no key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trioloop.cli import main
from trioloop.threatmodel import load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONIOENCODING": "utf-8", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "trioloop", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        check=False,
    )


def test_demo_approve_safe_runs_the_whole_script(tmp_path: Path) -> None:
    out = tmp_path / "result.thf"
    done = run_cli("demo", "--approve", "safe", "--out", str(out))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    # Read tools ran without review.
    assert "[done] get_document_summary" in text and "[done] search_entities" in text
    # Review cards, the batch of safe calls, and the destructive one denied.
    assert "review toolu_03" in text and "DESTRUCTIVE" in text
    assert "approved all safe: toolu_03, toolu_04" in text
    assert "denied destructive toolu_05" in text
    # The invalid call was refused with a field-level issue, and corrected in the next iteration.
    assert "element.name" in text
    assert 'with id "comp-1"' in text
    # The identical destructive call was refused as a replay without asking.
    assert "already declined an identical action" in text
    # The step limit ended the turn, keeping the approved changes; the diff shows them.
    assert "Turn ended at a limit" in text
    assert "+    name: Key management service" in text
    assert "+    title: Card vault encryption keys exfiltrated" in text
    assert "Traceback" not in text + done.stderr
    result = load_thf(out)
    assert len(result.threats) == len(load_thf(PAYMENT).threats) + 1
    assert any(flow.id == "flow-10" for flow in result.data_flows)  # the destructive delete never ran


def test_demo_undo_restores_the_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "undone.thf"
    assert main(["demo", "--approve", "safe", "--undo", "--out", str(out)]) == 0
    assert "back to its state before the turn" in capsys.readouterr().out
    assert load_thf(out) == load_thf(PAYMENT)


def test_demo_approve_none_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "none.thf"
    assert main(["demo", str(PAYMENT), "--approve", "none", "--out", str(out)]) == 0
    assert "The document is unchanged." in capsys.readouterr().out
    assert load_thf(out) == load_thf(PAYMENT)


def test_demo_interactive_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trioloop._commands import run_demo

    answers = iter(["a", "d", "d", "a", "n"])  # approve toolu_03, deny 04 and 05, approve 07, no undo
    assert run_demo(str(PAYMENT), "ask", str(tmp_path / "o.thf"), False, prompt=lambda _: next(answers)) == 0
    result = load_thf(tmp_path / "o.thf")
    admin = next(e for e in result.elements if e.id == "admin-console")
    assert admin.description == next(e for e in load_thf(PAYMENT).elements if e.id == "admin-console").description
    assert len(result.threats) == len(load_thf(PAYMENT).threats) + 1


def test_demo_on_invalid_document_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.thf"
    bad.write_text('version: "2.0"\nmetadata: {}\n')
    assert main(["demo", str(bad), "--approve", "safe"]) == 1
    assert "UnsupportedVersion" in capsys.readouterr().err


def test_chat_without_key_is_a_one_line_error() -> None:
    done = run_cli("chat", str(PAYMENT), "--provider", "openai", "--model", "gpt-4.1", env={"OPENAI_API_KEY": ""})
    assert done.returncode == 2
    assert done.stderr.strip() == "error: set OPENAI_API_KEY to use --provider openai"
