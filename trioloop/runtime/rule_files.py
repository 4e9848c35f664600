"""Approval rules from files: a project's ``.trioloop/rules.toml`` and the user's own, parsed, placed and trusted.

A rule file is TOML, one ``[[rules]]`` table per rule (the format is in docs/reference/rules-files.md)::

    [[rules]]
    tool = "write_file"
    verdict = "allow"
    reason = "docs are fine"
    when = [{ pointer = "/path", glob = "docs/**" }, { pointer = "/size", range = [0, 1000] }]

`parse_rules` turns a file's text into `ApprovalRule` values numbered 1.. in file order, each with its file and
the line of its header; anything malformed (an unknown key, a condition with no matcher or two, a bad verdict,
pointer or value) is refused with a `RuleFileError` naming the file, the line and the reason. `load_rules` finds
and reads the files for a document: the user's (all its rules) and the project's, whose deny and ask rules apply
at once but whose allow rules only once the person trusts the file's exact content (`trust_file`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, final

import attrs

from trioloop.durable.files import config_folder
from trioloop.machine.conditions import Condition, Match, RuleError
from trioloop.machine.rules import ApprovalRule, Verdict
from trioloop.runtime.rule_file_places import Statement, statements
from trioloop.runtime.rule_trust import RuleFileError, RuleTrust, record_trust, remove_trust, trust_of

__all__ = [
    "MAX_RULE_FILE_BYTES",
    "PROJECT_RULES",
    "LoadedRules",
    "RuleFileError",
    "RuleTrust",
    "find_project_rules",
    "is_trusted",
    "load_rules",
    "parse_rules",
    "read_rule_file",
    "read_rules",
    "trust_file",
    "untrust_file",
    "user_rules_path",
]

#: The largest rule file read (1 MiB): a bigger one is refused before it is read whole.
MAX_RULE_FILE_BYTES: Final = 1024 * 1024
#: Where a project's rule file is, relative to a folder at or above the document's.
PROJECT_RULES: Final = Path(".trioloop") / "rules.toml"

_RULE_KEYS: Final = ("tool", "verdict", "reason", "when")
_MATCHERS: Final = tuple(m.value for m in Match)
_CONDITION_KEYS: Final = ("pointer", *_MATCHERS)
_RANGE_KEYS: Final = ("min", "max")
_TOML_LINE: Final = re.compile(r"\(at line (\d+), column \d+\)")


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)


def _unknown(key: str, known: tuple[str, ...], what: str) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else "" if ":" in what else f" (known: {', '.join(known)})"
    return f"unknown key {_quoted(key)} in {what}{hint}"


@attrs.define
class _Place:
    """Where one rule (or one ``[[rules.when]]`` condition) is: its header's line and its keys' lines."""

    line: int
    keys: dict[str, int] = attrs.Factory(dict)
    conditions: list[_Place] = attrs.Factory(list)

    def of(self, key: str) -> int:
        return self.keys.get(key, self.line)


def _places(found: list[Statement]) -> tuple[list[_Place], dict[str, int]]:
    """Each ``[[rules]]`` table's place, and the line of each other top-level name (a key or table)."""
    rules: list[_Place] = []
    top: dict[str, int] = {}
    table: tuple[str, ...] = ()
    for statement in found:
        key = statement.key
        if statement.kind != "key":
            table = key
        full = key if statement.kind != "key" else (*table, *key)
        if statement.kind == "array" and full == ("rules",):
            rules.append(_Place(statement.line))
            continue
        if full[0] != "rules" or not rules or (statement.kind == "key" and not table):
            top.setdefault(full[0], statement.line)
            continue
        rule = rules[-1]
        if statement.kind == "array" and full == ("rules", "when"):
            rule.conditions.append(_Place(statement.line))
        elif len(full) > 2 and full[:2] == ("rules", "when") and table == ("rules", "when") and rule.conditions:
            rule.conditions[-1].keys.setdefault(full[2], statement.line)
        elif len(full) > 1:
            rule.keys.setdefault(full[1], statement.line)
    return rules, top


def _range(value: Any, error: Any) -> tuple[Any, Any]:
    if type(value) is list:
        if len(value) != 2:
            raise error("range is [min, max] (for an open end write { min = N } or { max = N })")
        return value[0], value[1]
    if type(value) is dict:
        for key in value:
            if key not in _RANGE_KEYS:
                raise error(_unknown(key, _RANGE_KEYS, "a range"))
        return value.get("min"), value.get("max")
    raise error("range is [min, max], { min = N }, { max = N } or { min = N, max = N }")


def _condition(data: Any, place: _Place, number: int, source: str) -> Condition:
    def error(reason: str, key: str = "") -> RuleFileError:
        return RuleFileError(source, place.of(key), f"rule {number}: {reason}")

    if type(data) is not dict:
        raise error("each condition of when is a table: { pointer = ..., <matcher> = ... }", "when")
    for key in data:
        if key not in _CONDITION_KEYS:
            raise error(_unknown(key, _CONDITION_KEYS, "a condition"), key)
    matchers = [key for key in _MATCHERS if key in data]
    if "pointer" not in data:
        raise error('a condition needs a pointer (a JSON pointer such as "/path"; "" for the whole input)')
    if not matchers:
        raise error(f"a condition needs one matcher: {', '.join(_MATCHERS)}")
    if len(matchers) > 1:
        raise error(
            f"a condition has exactly one matcher, this one has {' and '.join(matchers)} "
            "(write one condition for each: all of them must hold)",
            matchers[1],
        )
    match, pointer = matchers[0], data["pointer"]
    try:  # the pointer alone first, so its error is placed at its line
        Condition.prefix(pointer, "")
    except RuleError as exc:
        raise error(str(exc), "pointer") from None
    value = data[match]
    if match == Match.RANGE:
        value = _range(value, lambda reason: error(reason, match))
    try:
        return Condition(pointer=pointer, match=Match(match), value=value)
    except RuleError as exc:
        raise error(str(exc), match) from None
    except RecursionError:
        raise error("the value is nested too deeply", match) from None


def _rule(data: Any, place: _Place, number: int, source: str) -> ApprovalRule:
    def error(reason: str, key: str = "") -> RuleFileError:
        return RuleFileError(source, place.of(key), f"rule {number}: {reason}")

    for key in data:
        if key not in _RULE_KEYS:
            raise error(_unknown(key, _RULE_KEYS, "a rule"), key)
    for key in ("tool", "verdict"):
        if key not in data:
            raise error(f"a rule needs a {key}" + (" (allow, ask or deny)" if key == "verdict" else ""))
    tool, verdict, reason = data["tool"], data["verdict"], data.get("reason", "")
    if type(tool) is not str or not tool:
        raise error("tool is a tool's name or a glob (a non-empty string)", "tool")
    if type(verdict) is not str or verdict not in tuple(Verdict):
        shown = _quoted(verdict) if type(verdict) is str else type(verdict).__name__
        raise error(f"verdict is allow, ask or deny, not {shown}", "verdict")
    if type(reason) is not str:
        raise error("reason is a string", "reason")
    when = data.get("when", [])
    if type(when) is not list:
        raise error("when is an array of conditions: when = [{ pointer = ..., <matcher> = ... }]", "when")
    inline = _Place(place.of("when"))  # the conditions of an inline array are placed at its line
    conditions = place.conditions if len(place.conditions) == len(when) else [inline] * len(when)
    made = tuple(_condition(c, where, number, source) for c, where in zip(when, conditions, strict=True))
    try:
        return ApprovalRule(
            tool=tool, verdict=verdict, when=made, reason=reason, source=source, number=number, line=place.line
        )
    except RuleError as exc:
        raise error(str(exc)) from None


def parse_rules(text: str, source: str) -> tuple[ApprovalRule, ...]:
    """The rules of a rule file's ``text``, numbered 1.. in file order, each with ``source`` (the path as given)
    and the line of its ``[[rules]]`` header. `RuleFileError` naming ``source``, the line and the reason for
    anything that is not a valid rule file (a TOML syntax error carries tomllib's line)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_LINE.search(message)
        line = getattr(exc, "lineno", None) or (int(found.group(1)) if found else None)
        raise RuleFileError(source, line, f"not valid TOML: {message}") from None
    except RecursionError:
        raise RuleFileError(source, None, "not valid TOML: values nested too deeply") from None
    try:
        rule_places, top = _places(statements(text))
    except (ValueError, RecursionError) as exc:  # not expected: tomllib accepted the text
        raise RuleFileError(source, None, f"cannot place the rules: {exc}") from None
    for key in data:
        if key != "rules":
            reason = _unknown(key, ("rules",), "the file: it holds [[rules]] tables only")
            raise RuleFileError(source, top.get(key), reason)
    rules = data.get("rules", [])
    if "rules" in top or type(rules) is not list or len(rule_places) != len(rules):
        raise RuleFileError(
            source, top.get("rules"), "write each rule as a [[rules]] table (not rules = [...] or [rules])"
        )
    placed = zip(rules, rule_places, strict=True)
    return tuple(_rule(item, place, number, source) for number, (item, place) in enumerate(placed, 1))


def read_rule_file(path: str | os.PathLike[str]) -> bytes:
    """A rule file's bytes: at most `MAX_RULE_FILE_BYTES` (a bigger file is refused before it is read whole), a
    regular file only (a pipe or a device never blocks or floods the reader). `RuleFileError` otherwise; a file
    that does not exist raises `FileNotFoundError`."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RuleFileError(path, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise RuleFileError(path, None, "not a regular file")
        if status.st_size > MAX_RULE_FILE_BYTES:
            raise RuleFileError(path, None, f"the file is {status.st_size} bytes, over {MAX_RULE_FILE_BYTES}")
        with open(descriptor, "rb", closefd=False) as file:
            content = file.read(MAX_RULE_FILE_BYTES + 1)
    except OSError as exc:
        raise RuleFileError(path, None, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(descriptor)
    if len(content) > MAX_RULE_FILE_BYTES:
        raise RuleFileError(path, None, f"the file is over {MAX_RULE_FILE_BYTES} bytes")
    return content


def _decoded(content: bytes, source: str) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = content.count(b"\n", 0, exc.start) + 1
        raise RuleFileError(source, line, "not UTF-8 text") from None


def _read_rules(path: str | os.PathLike[str]) -> tuple[bytes, tuple[ApprovalRule, ...]]:
    content = read_rule_file(path)
    return content, parse_rules(_decoded(content, os.fspath(path)), os.fspath(path))


def read_rules(path: str | os.PathLike[str]) -> tuple[ApprovalRule, ...]:
    """The rules of the file at ``path`` (read with `read_rule_file`, parsed with `parse_rules`, ``path`` as
    their source), whatever its trust. `RuleFileError` for a file that cannot be read or parsed,
    `FileNotFoundError` for no file."""
    return _read_rules(path)[1]


def user_rules_path(environ: Mapping[str, str] | None = None) -> Path:
    """The user's own rule file: ``$XDG_CONFIG_HOME/trioloop/rules.toml`` (``~/.config/trioloop/rules.toml``)."""
    return config_folder(environ) / "rules.toml"


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except (OSError, ValueError):  # missing, unreadable folder, a name the platform refuses
        return False


def find_project_rules(start: str | os.PathLike[str]) -> Path | None:
    """The project rule file for a document: ``.trioloop/rules.toml`` in the document's folder (``start`` itself
    when it is a folder) or the nearest folder above it that has one, as an absolute path; None when none has.

    The search stops at the filesystem root, and, for a document inside the user's home folder, at the home
    folder itself: a folder above it (``/home``) is not the user's, and a file there is nobody's project."""
    here = Path(os.path.abspath(start))
    try:
        if not stat.S_ISDIR(here.stat().st_mode):
            here = here.parent
    except (OSError, ValueError):  # a document not written yet: its folder
        here = here.parent
    home = Path(os.path.abspath(os.path.expanduser("~")))
    for folder in (here, *here.parents):
        candidate = folder / PROJECT_RULES
        if _is_file(candidate):
            return candidate
        if folder == home:
            return None
    return None


def trust_file(path: str | os.PathLike[str]) -> tuple[str, tuple[ApprovalRule, ...]]:
    """Trust the rule file at ``path``: record the SHA-256 of its exact bytes (under its real path) in the user's
    ``trusted-rules.json``, so its allow rules take effect until it changes. Returns the digest and the file's
    rules (what was trusted, to show). `RuleFileError` for a file that does not parse (nothing is recorded)."""
    content, rules = _read_rules(path)
    return record_trust(path, content), rules


def untrust_file(path: str | os.PathLike[str]) -> bool:
    """Stop trusting the rule file at ``path``: its allow rules no longer take effect. Whether it was trusted."""
    return remove_trust(path)


def is_trusted(path: str | os.PathLike[str], content: bytes) -> bool:
    """Whether the file at ``path``, holding exactly ``content``, is trusted (a store that cannot be read trusts
    nothing)."""
    try:
        return trust_of(path, content) is RuleTrust.TRUSTED
    except RuleFileError:
        return False


@final
@attrs.frozen(kw_only=True)
class LoadedRules:
    """The rules the files give a document: ``rules`` in effect (the user file's, then the project file's),
    ``withheld`` (the project file's allow rules, not in effect while the file is not trusted), ``notices`` for
    the person, the files read (``user_file``, ``project_file``: None when there was none) and the project file's
    ``project_trust`` (None without a project file)."""

    rules: tuple[ApprovalRule, ...] = ()
    withheld: tuple[ApprovalRule, ...] = ()
    notices: tuple[str, ...] = ()
    user_file: Path | None = None
    project_file: Path | None = None
    project_trust: RuleTrust | None = None

    @property
    def files(self) -> tuple[Path, ...]:
        """The rule files read, the user's first."""
        return tuple(path for path in (self.user_file, self.project_file) if path is not None)


def _shell_word(path: Path) -> str:
    """``path`` as a person can paste it into a shell, with no control character left to reach the terminal."""
    text = shlex.quote(str(path))
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def load_rules(document: str | os.PathLike[str] | None, *, user: bool = True) -> LoadedRules:
    """The rules in effect for ``document`` (a path; None: the user's file alone) from its files: the user's own
    (`user_rules_path`, every rule: the user wrote it) unless ``user`` is False, and the project's
    (`find_project_rules`): its deny and ask rules always, its allow rules only while the person trusts the file's
    exact content (`trust_file`); otherwise they are ``withheld`` and a notice says why and what to run.
    `RuleFileError` (file, line, reason) for a file that cannot be read or parsed: a malformed file is never
    skipped, since its deny rules would be lost with it."""
    rules: list[ApprovalRule] = []
    user_file = None
    if user:
        path = user_rules_path()
        try:
            rules.extend(_read_rules(path)[1])
            user_file = path
        except FileNotFoundError:
            pass
    project = find_project_rules(document) if document is not None else None
    if project is None or (user_file is not None and os.path.samefile(project, user_file)):
        return LoadedRules(rules=tuple(rules), user_file=user_file)
    try:
        content, found = _read_rules(project)
    except FileNotFoundError:  # removed since it was found
        return LoadedRules(rules=tuple(rules), user_file=user_file)
    notices = []
    try:
        trust = trust_of(project, content)
    except RuleFileError as exc:
        trust = RuleTrust.UNTRUSTED
        notices.append(f"{exc}: no project rule file is trusted")
    withheld = () if trust is RuleTrust.TRUSTED else tuple(r for r in found if r.verdict is Verdict.ALLOW)
    if withheld:
        n = len(withheld)
        what = f"{n} allow rule{'' if n == 1 else 's'} of {_shell_word(project)} {'is' if n == 1 else 'are'}"
        why = "the file changed since you trusted it" if trust is RuleTrust.CHANGED else "the file is not trusted"
        then = "review it, then run" if trust is RuleTrust.CHANGED else "run"
        notices.append(f"{what} not in effect: {why} ({then} `trioloop rules trust {_shell_word(project)}`)")
    rules.extend(r for r in found if trust is RuleTrust.TRUSTED or r.verdict is not Verdict.ALLOW)
    return LoadedRules(
        rules=tuple(rules),
        withheld=withheld,
        notices=tuple(notices),
        user_file=user_file,
        project_file=project,
        project_trust=trust,
    )
