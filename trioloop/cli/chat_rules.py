"""The chat's rule commands: ``/rules`` lists the approval rules in effect (the files', the app's, the session's own
from "always" and "never" on a card) and ``/forget N`` removes session rule N."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.text import Text

from trioloop.cli.common import error
from trioloop.machine.conditions import RuleError
from trioloop.machine.rules import SESSION_SOURCE, ApprovalRule
from trioloop.machine.untrusted_text import sanitize_scalar
from trioloop.runtime.rule_files import load_rules
from trioloop.runtime.session import Session

__all__ = ["RULES_HELP", "load_chat_rules", "rule_line", "rules_command", "withheld_notice"]

RULES_HELP: Final = (
    "  /rules        the approval rules in effect: files, app, and this session's (always / never on a card)\n"
    "  /forget N     remove session rule N (later calls are decided without it)\n"
)
_LINE_MAX: Final = 200


def rule_line(rule: ApprovalRule) -> str:
    """One rule as ``/rules`` shows it: its label, where (file and line), its verdict and what it covers."""
    where = f" (line {rule.line})" if rule.line is not None else ""
    reason = f" — {rule.reason}" if rule.reason else ""
    text, _ = sanitize_scalar(f"{rule.label}{where}: {rule.verdict.value} {rule.describe()}{reason}", _LINE_MAX)
    return text


def load_chat_rules(console: Console, document: Path) -> tuple[ApprovalRule, ...] | None:
    """The rules of ``document``'s files (the user's, the project's: its allow rules once trusted), with a line on
    what was loaded and every notice (allow rules withheld from an untrusted or changed file); None, after saying
    why on stderr, when a file is malformed or unreadable (its deny rules cannot be dropped in silence)."""
    try:
        loaded = load_rules(document)
    except (RuleError, OSError) as exc:
        error(f"error: the approval rules cannot be used: {exc}")
        return None
    if loaded.rules:
        files = ", ".join(str(path) for path in loaded.files)
        console.print(Text(f"Rules: {len(loaded.rules)} in effect from {files} (/rules lists them)", style="dim"))
    for notice in loaded.notices:
        console.print(Text(f"! {notice}", style="yellow"))
    return loaded.rules


def withheld_notice(console: Console, session: Session[Any], file: Path) -> None:
    """Say which allow rules a resumed session file's rules had that were not restored (the file is not signed)."""
    count = len(session.withheld_rules)
    if count:
        console.print(
            Text(
                f"! {count} allow rule(s) of {file} not restored: a session file is not signed, so only its deny and "
                "ask rules come back (answer always on a card again to allow)",
                style="yellow",
            )
        )


def rules_command(console: Console, session: Session[Any], name: str, argument: str) -> bool:
    """Run ``/rules`` or ``/forget N``; False for any other command."""
    if name == "/rules":
        rules = session.rules
        if not rules:
            console.print(Text("No approval rules: every change is shown on a card."))
        for rule in rules:
            console.print(Text(f"  {rule_line(rule)}"))
        return True
    if name == "/forget":
        if not argument.isdigit():
            console.print(Text("Usage: /forget N (N: a session rule's number, as /rules shows it)."))
            return True
        number = int(argument)
        if session.remove_rule(number):
            console.print(Text(f"Removed session rule {number}: later calls are decided without it."))
        else:
            numbers = [r.number for r in session.rules if r.source == SESSION_SOURCE]
            have = ", ".join(map(str, numbers)) if numbers else "none"
            console.print(Text(f"There is no session rule {number} (session rules: {have})."))
        return True
    return False
