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
    assert "approved all safe: toolu_03" in text
    # One card approved with an edit, and the model told exactly what changed.
    assert "approved toolu_04 with an edit by the demo's scripted reviewer" in text
    assert "updates.description: Back-office tool; SSO with MFA required. -> " in text
    # A card with its whole input and its preview, the cascade named.
    assert "threat.mitigation.status: not_started" in text
    assert "Removes threat threat-7 (Customer email leaked through notifications)" in text
    assert "denied destructive toolu_05" in text
    # The invalid call was refused with a field-level issue, and corrected in the next iteration.
    assert "element.name" in text
    assert 'with id "comp-1"' in text
    # The identical destructive call was refused as a replay without asking.
    assert "already declined an identical action" in text
    # The model's closing answer completed the turn; the diff shows the approved changes.
    assert "Turn completed." in text and "at a limit" not in text
    assert "+    name: Key management service" in text
    assert "+    title: Card vault encryption keys exfiltrated" in text
    assert "Traceback" not in text + done.stderr
    result = load_thf(out)
    assert len(result.threats) == len(load_thf(PAYMENT).threats) + 1
    assert any(flow.id == "flow-10" for flow in result.data_flows)  # the destructive delete never ran
    admin = next(e for e in result.elements if e.id == "admin-console")
    assert admin.description == "Back-office tool; SSO with MFA and an IP allow-list required."


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
    from trioloop.cli.demo import run_demo

    # approve toolu_03, deny 04 (no reason) and 05 (with one), approve 07, no undo
    answers = iter(["a", "d", "", "deny", "It is still in use.", "approve", "n"])
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


_CTRL_C_SCRIPT = """
import os, signal, sys, time
from trioloop.cli.demo import run_demo

answers = iter(sys.argv[2].split(",") if sys.argv[2] else [])
presses = int(sys.argv[3])

def prompt(text):
    print(text, flush=True)
    for answer in answers:
        return answer
    for _ in range(presses):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
    return "n"

sys.exit(run_demo(None, "ask", sys.argv[1], False, prompt=prompt))
"""


def _ctrl_c_demo(out: Path, answers: str, presses: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CTRL_C_SCRIPT, str(out), answers, str(presses)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        check=False,
    )


def test_ctrl_c_at_a_card_stops_the_turn_and_keeps_approved_changes(tmp_path: Path) -> None:
    out = tmp_path / "stopped.thf"
    # Decide the second step (approve toolu_03, deny 04 and 05), then press Ctrl-C at toolu_07's card.
    done = _ctrl_c_demo(out, "a,d,,d,", 1)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr and "ExceptionGroup" not in done.stderr
    assert "Stopping the turn" in done.stdout and "Turn stopped." in done.stdout
    result = load_thf(out)
    assert len(result.threats) == len(load_thf(PAYMENT).threats) + 1  # toolu_03's threat was kept
    assert not any(e.name == "Key management service" for e in result.elements)  # toolu_07 never ran


def test_a_second_ctrl_c_quits_without_a_traceback(tmp_path: Path) -> None:
    # The first Ctrl-C stops the turn at toolu_07's card; the second comes at the undo question.
    done = _ctrl_c_demo(tmp_path / "never.thf", "a,d,,d,", 2)
    assert done.returncode == 130
    assert done.stderr.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in done.stdout + done.stderr


def test_answers_are_matched_whole_and_stop_never_approves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trioloop.cli.demo import run_demo

    # "stop" used to approve all safe calls (only its first letter was read); "x", "yes" and "" used to deny.
    answers = iter(["x", "yes", "", "stop"])
    assert run_demo(str(PAYMENT), "ask", str(tmp_path / "o.thf"), False, prompt=lambda _: next(answers)) == 0
    out = capsys.readouterr().out
    assert out.count("Please answer one of") == 3
    assert "Turn stopped." in out
    assert load_thf(tmp_path / "o.thf") == load_thf(PAYMENT)  # nothing ran


def test_approve_all_safe_names_the_destructive_cards_and_asks_about_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trioloop.cli.demo import run_demo

    # At toolu_03: approve all safe (03, 04), then decide the destructive toolu_05 (deny, with a reason);
    # approve toolu_07; no undo.
    # "s" and "safe" are no answers (a person typing "s" for stop must not approve anything): asked again.
    answers = iter(["s", "safe", "all", "d", "Other services read it.", "a", "n"])
    assert run_demo(str(PAYMENT), "ask", str(tmp_path / "o.thf"), False, prompt=lambda _: next(answers)) == 0
    out = capsys.readouterr().out
    assert "approved all safe: toolu_03, toolu_04" in out
    assert out.count("s is no answer: q or stop stops the turn, all approves every safe card") == 2
    assert "keys: a approve · d deny · e edit · all (every safe card) · q stop · ? help" in out
    assert 'Not included, destructive: toolu_05 (Delete data flow "flow-10" with the threats that target it)' in out
    result = load_thf(tmp_path / "o.thf")
    assert any(flow.id == "flow-10" for flow in result.data_flows)


def test_a_card_shows_the_whole_input_and_the_preview(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--approve", "none"]) == 0
    out = capsys.readouterr().out
    assert "threat.mitigation.status: not_started" in out  # a field the one-line summary leaves out
    assert "Removes threat threat-7 (Customer email leaked through notifications)" in out  # the cascade, named


def test_edit_on_approve_at_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioloop.cli.demo import run_demo

    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.delenv("EDITOR", raising=False)  # no editor: a line of JSON, prefilled where readline allows

    edited = '{"id": "admin-console", "updates": {"description": "Back-office tool; SSO, MFA and IP allow-list."}}'
    # toolu_03: a; toolu_04: edit (a bad JSON first, then an input the tool refuses, then a good one, shown as
    # its card and approved with a), deny 05.
    answers = iter(["a", "e", "{nope", "e", '{"id": ""}', "edit", edited, "a", "d", "", "d", "", "n"])
    assert run_demo(str(PAYMENT), "ask", str(tmp_path / "o.thf"), False, prompt=lambda _: next(answers)) == 0
    out = capsys.readouterr().out
    assert "Not JSON" in out and "The tool refused this input" in out
    assert "review toolu_04 · update_element · edited (1 field(s) changed)" in out
    result = load_thf(tmp_path / "o.thf")
    admin = next(e for e in result.elements if e.id == "admin-console")
    assert admin.description == "Back-office tool; SSO, MFA and IP allow-list."


def test_edit_opens_the_editor_on_the_input_as_indented_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioloop.cli.demo import run_demo

    seen = tmp_path / "seen.json"
    script = tmp_path / "editor.py"
    script.write_text(
        "import json, shutil, sys\n"
        "path = sys.argv[1]\n"
        f"shutil.copy(path, {str(seen)!r})\n"
        "value = json.load(open(path))\n"
        "value['updates']['description'] = 'Edited in the editor.'\n"
        "json.dump(value, open(path, 'w'))\n",
        encoding="utf-8",
    )
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    answers = iter(["a", "e", "a", "d", "", "d", "", "n"])  # toolu_03 approved, toolu_04 edited, the rest denied
    assert run_demo(str(PAYMENT), "ask", str(tmp_path / "o.thf"), False, prompt=lambda _: next(answers)) == 0
    out = capsys.readouterr().out
    shown = seen.read_text(encoding="utf-8")
    assert shown.startswith("{\n  ") and shown.isascii()  # indented, every non-ASCII character escaped
    assert "approved toolu_04 with your edit" in out
    admin = next(e for e in load_thf(tmp_path / "o.thf").elements if e.id == "admin-console")
    assert admin.description == "Edited in the editor."


def test_ctrl_c_at_the_undo_prompt_still_writes_out(tmp_path: Path) -> None:
    from trioloop.cli.demo import run_demo

    replies: list[str | BaseException] = ["all", "d", "", "a", KeyboardInterrupt()]

    def prompt(_: str) -> str:
        reply = replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    out = tmp_path / "o.thf"
    assert run_demo(str(PAYMENT), "ask", str(out), False, prompt=prompt) == 130
    written = load_thf(out)  # the document as it stood at the Ctrl-C, with the turn's changes
    assert len(written.threats) > len(load_thf(PAYMENT).threats)


def test_an_edit_can_be_denied_or_taken_back_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioloop.cli.demo import run_demo

    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.delenv("EDITOR", raising=False)
    own = '{"id": "admin-console", "updates": {"description": "Back-office tool; SSO with MFA required."}}'
    edited = '{"id": "admin-console", "updates": {"description": "Edited."}}'
    # toolu_04: edit, then edit back to the model's own input (the card is the model's again: "all" is offered
    # again), edit once more, and deny: the edit never runs, nor the call.
    replies = ["a", "e", edited, "all", "e", own, "e", edited, "d", "No.", "d", "", "a", "n"]
    answers = iter(replies)
    assert run_demo(str(PAYMENT), "ask", str(tmp_path / "o.thf"), False, prompt=lambda _: next(answers)) == 0
    out = capsys.readouterr().out
    assert "Please answer one of: a approve the edit, e edit again, d deny, q stop, ?." in out  # no "all" on an edit
    assert "That is the model's own input again: the card is as the model sent it." in out
    assert "approved toolu_04" not in out
    admin = next(e for e in load_thf(tmp_path / "o.thf").elements if e.id == "admin-console")
    assert admin.description == next(e for e in load_thf(PAYMENT).elements if e.id == "admin-console").description
