"""Approval rules in the chat, driven in a pseudo terminal (issue 50): "always tool" on a card adds a session rule
that approves the next call unasked, the rule survives a SIGKILL and ``--resume``, ``/rules`` lists it and
``/forget 1`` brings the card back."""

from __future__ import annotations

import signal
from pathlib import Path

import pexpect

from tests.test_cli_pty import chat_in, end_chat, model_server, screen_lines

__all__ = ["model_server"]  # the fixture, shared with the other terminal tests


def test_always_from_a_card_survives_a_sigkill_and_resume_and_can_be_forgotten(
    tmp_path: Path, model_server: int
) -> None:
    child = chat_in(tmp_path, model_server)
    try:
        child.expect_exact("you> ")
        child.sendline("add threat 1")
        child.expect_exact("toolu_1: a approve")
        assert any("always tool" in line for line in screen_lines(child.before))  # the card offers it
        child.sendline("always tool")
        child.expect_exact("add_threat whatever its input is approved unasked from now on")
        child.expect_exact("you> ")
        child.sendline("add threat 2")
        child.expect_exact("approved by session rule 1: add_threat")
        child.expect_exact('[done] add_threat: Added threat "T2"')
        child.expect_exact("you> ")
        child.kill(signal.SIGKILL)  # no goodbye: the journal alone carries the rule over
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.signalstatus == signal.SIGKILL

    child = chat_in(tmp_path, model_server, "--resume", "model.thf.journal")
    try:
        child.expect_exact("you> ")
        child.sendline("/rules")
        child.expect_exact("session rule 1: allow add_threat")
        child.expect_exact("you> ")
        child.sendline("add threat 3")
        child.expect_exact("approved by session rule 1: add_threat")
        child.expect_exact("you> ")
        child.sendline("/forget 1")
        child.expect_exact("Removed session rule 1")
        child.expect_exact("you> ")
        child.sendline("add threat 4")
        child.expect_exact("toolu_4: a approve")  # a card again
        child.sendline("a")
        child.expect_exact('[done] add_threat: Added threat "T4"')
        end_chat(child)
    finally:
        child.close()
    assert child.exitstatus == 0


PROJECT_RULES = """
[[rules]]
tool = "add_threat"
verdict = "deny"
reason = "Low-severity threats go to the backlog, not the model."
when = [ { pointer = "/threat/severity", equals = "low" } ]

[[rules]]
tool = "add_*"
verdict = "allow"
"""


def test_a_project_rule_file_denies_at_once_and_allows_only_once_trusted(tmp_path: Path, model_server: int) -> None:
    rules = tmp_path / ".trioloop" / "rules.toml"
    rules.parent.mkdir()
    rules.write_text(PROJECT_RULES, encoding="utf-8")
    child = chat_in(tmp_path, model_server)
    try:
        child.expect_exact("allow rule of")  # the untrusted file's allow rule is withheld, and the chat says so
        child.expect_exact("you> ")
        child.sendline("/rules")
        child.expect_exact("rule 1 of")
        child.expect_exact('deny add_threat threat/severity = "low"')
        child.expect_exact("you> ")
        child.sendline("add threat 1")  # severity low: denied by the project's rule, no card
        child.expect_exact("The document is unchanged.")
        shown = " ".join(" ".join(screen_lines(child.before)).split())  # the reason is folded to the terminal
        end_chat(child)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "toolu_1: a approve" not in shown
    assert "rule 1 of" in shown and "Low-severity threats go to the backlog, not the model." in shown
