"""`trioloop rules`: the approval rules a document's files give (``show``), a rule file checked (``check``), and a
project rule file trusted or no longer trusted (``trust``, ``untrust``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from trioloop.cli.exit_codes import EXIT_INVALID, EXIT_OK, EXIT_USAGE
from trioloop.machine.rules import ApprovalRule, Verdict
from trioloop.machine.untrusted_text import strip_and_cap
from trioloop.runtime.rule_files import (
    RuleFileError,
    RuleTrust,
    load_rules,
    read_rules,
    trust_file,
    untrust_file,
    user_rules_path,
)

__all__ = ["rules_check", "rules_show", "rules_trust", "rules_untrust"]

_LINE_MAX: Final = 400
_STANDING: Final = {
    RuleTrust.TRUSTED: "trusted: its allow rules are in effect",
    RuleTrust.UNTRUSTED: "not trusted: its deny and ask rules are in effect, its allow rules are not",
    RuleTrust.CHANGED: "changed since you trusted it: its deny and ask rules are in effect, its allow rules are not",
}


def _shown(text: object) -> str:
    """Text from a file (a path, a rule, an error naming a key) with no control character left for the terminal."""
    clean, _ = strip_and_cap(str(text), _LINE_MAX)
    return clean


def _say(text: object) -> None:
    print(_shown(text))


def _error(text: object) -> None:
    print(_shown(text), file=sys.stderr)


def rule_text(rule: ApprovalRule) -> str:
    """One rule of a file: ``path:line: rule N: verdict tool conditions — reason``."""
    where = f"{rule.source}:{rule.line}" if rule.line is not None else rule.source
    reason = f" — {rule.reason}" if rule.reason else ""
    return f"{where}: rule {rule.number}: {rule.verdict.value} {rule.describe()}{reason}"


def _list(rules: Iterable[ApprovalRule], suffix: str = "") -> None:
    for rule in rules:
        _say(f"  {rule_text(rule)}{suffix}")


def _counts(rules: tuple[ApprovalRule, ...]) -> str:
    each = [f"{sum(r.verdict is v for r in rules)} {v.value}" for v in Verdict]
    return f"{len(rules)} rule{'' if len(rules) == 1 else 's'} ({', '.join(each)})"


def rules_show(document: str | None) -> int:
    """``trioloop rules show [DOCUMENT]``: the rules the files give ``document`` (default: the current folder's),
    those of an untrusted project file not in effect, and the notices. Exit 1 for a file that does not parse."""
    start = document if document is not None else os.curdir
    try:
        loaded = load_rules(start)
    except RuleFileError as exc:
        _error(f"error: {exc}")
        return EXIT_INVALID
    user, project = loaded.user_file, loaded.project_file
    _say(
        f"user rule file: {user}" if user is not None else f"user rule file: none ({user_rules_path()} does not exist)"
    )
    if project is None:
        folder = Path(os.path.abspath(start))
        _say(f"project rule file: none found from {folder if folder.is_dir() else folder.parent} upward")
    else:
        standing = _STANDING[loaded.project_trust or RuleTrust.UNTRUSTED]
        _say(f"project rule file: {project} ({standing})")
    if loaded.rules:
        _say("Rules in effect (deny beats ask beats allow, whatever their order):")
        _list(loaded.rules)
    else:
        _say("No rules in effect from files: every change is shown on a card.")
    if loaded.withheld:
        _say("Not in effect until you trust the file:")
        _list(loaded.withheld)
    for notice in loaded.notices:
        _say(f"note: {notice}")
    return EXIT_OK


def _missing(path: str) -> int | None:
    if not Path(path).exists():
        _error(f"error: no rule file at {path}")
        return EXIT_USAGE
    return None


def rules_check(path: str) -> int:
    """``trioloop rules check PATH``: parse a rule file; ``path:line: reason`` and exit 1 when it is malformed."""
    missing = _missing(path)
    if missing is not None:
        return missing
    try:
        rules = read_rules(path)
    except RuleFileError as exc:
        _error(exc)
        return EXIT_INVALID
    except OSError as exc:  # removed since it was looked for
        _error(f"error: cannot read {path}: {exc.strerror or exc}")
        return EXIT_USAGE
    _say(f"{path}: {_counts(rules)}")
    _list(rules)
    return EXIT_OK


def rules_trust(path: str) -> int:
    """``trioloop rules trust PATH``: record the digest of the file's exact content; its allow rules take effect
    until it changes. The rules trusted are printed. Exit 1 for a file that does not parse (nothing recorded)."""
    missing = _missing(path)
    if missing is not None:
        return missing
    try:
        digest, rules = trust_file(path)
    except RuleFileError as exc:
        _error(f"error: {exc}")
        return EXIT_INVALID
    except OSError as exc:  # removed since it was looked for
        _error(f"error: cannot read {path}: {exc.strerror or exc}")
        return EXIT_USAGE
    allows = tuple(rule for rule in rules if rule.verdict is Verdict.ALLOW)
    _say(f"Trusted {os.path.realpath(path)} ({digest}): {_counts(rules)}.")
    if allows:
        _say("These allow rules now take effect (until the file changes):")
        _list(allows)
    return EXIT_OK


def rules_untrust(path: str) -> int:
    """``trioloop rules untrust PATH``: forget the file's digest; its allow rules no longer take effect."""
    try:
        was = untrust_file(path)
    except RuleFileError as exc:
        _error(f"error: {exc}")
        return EXIT_USAGE
    if was:
        _say(f"{os.path.realpath(path)} is no longer trusted: its allow rules are not in effect.")
    else:
        _say(f"{os.path.realpath(path)} was not trusted: nothing changed.")
    return EXIT_OK
