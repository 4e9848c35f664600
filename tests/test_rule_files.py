"""Rule files (issue 50): the TOML format with every matcher, each malformed shape refused at its line, the
upward search for a project's file, trust (a project's allow rules only once its exact content is trusted), and
`trioloop rules` run as a program. Property tests: any rule set written out as TOML parses back equal, at the
lines it was written at, and any byte edit of a trusted file makes it untrusted."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trioloop.machine.conditions import Condition, RuleError
from trioloop.machine.rules import ApprovalRule, RuleSet, Verdict
from trioloop.runtime.rule_file_places import statements
from trioloop.runtime.rule_files import (
    MAX_RULE_FILE_BYTES,
    RuleFileError,
    RuleTrust,
    find_project_rules,
    is_trusted,
    load_rules,
    parse_rules,
    read_rule_file,
    read_rules,
    trust_file,
    untrust_file,
    user_rules_path,
)
from trioloop.runtime.rule_trust import file_digest, trusted_rules_path

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own config folder (the user's rule file and the trusted digests)."""
    folder = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder))
    return folder


# -- the format: every matcher -------------------------------------------------------------------------------

EVERY_MATCHER = """\
# Every matcher, inline and as [[rules.when]] tables.
[[rules]]
tool = "write_file"
verdict = "allow"
reason = "docs are fine"
when = [ { pointer = "/path", glob = "docs/**" }, { pointer = "/size", range = [0, 1000] } ]

[[rules]]
tool = "write_file"
verdict = "deny"
reason = "written by hand"
when = [{ pointer = "/path", prefix = "secrets/" }]

  [[ rules ]]   # a header with spaces and a comment
tool = "gh__*"
verdict = "ask"
[[rules.when]]
pointer = "/mode"
one_of = ["a", "w"]
[[rules.when]]
pointer = "/size"
range = { min = 10 }

[[rules]]
tool = "set_*"
verdict = "allow"
when = [
  { pointer = "/value", equals = { a = [1, "x"] } },
  { pointer = "/flag", equals = true },
  { pointer = "/n", range = { max = 5 } },
]

[[rules]]
tool = "**"
verdict = "deny"
when = [{ pointer = "", equals = 3 }]
"""


def test_a_file_with_every_matcher_parses_into_the_rules_it_says() -> None:
    rules = parse_rules(EVERY_MATCHER, "rules.toml")
    assert rules == (
        ApprovalRule(
            tool="write_file",
            verdict="allow",
            when=(Condition.glob("/path", "docs/**"), Condition.in_range("/size", 0, 1000)),
            reason="docs are fine",
            source="rules.toml",
            number=1,
            line=2,
        ),
        ApprovalRule(
            tool="write_file",
            verdict="deny",
            when=(Condition.prefix("/path", "secrets/"),),
            reason="written by hand",
            source="rules.toml",
            number=2,
            line=8,
        ),
        ApprovalRule(
            tool="gh__*",
            verdict="ask",
            when=(Condition.one_of("/mode", ["a", "w"]), Condition.in_range("/size", min=10)),
            source="rules.toml",
            number=3,
            line=14,
        ),
        ApprovalRule(
            tool="set_*",
            verdict="allow",
            when=(
                Condition.equals("/value", {"a": [1, "x"]}),
                Condition.equals("/flag", True),
                Condition.in_range("/n", max=5),
            ),
            source="rules.toml",
            number=4,
            line=24,
        ),
        ApprovalRule(
            tool="**", verdict="deny", when=(Condition.equals("", 3),), source="rules.toml", number=5, line=33
        ),
    )
    assert rules[0].label == "rule 1 of rules.toml"


@pytest.mark.parametrize(
    ("tool", "matching", "other", "number"),
    [
        ("write_file", {"path": "docs/a/b.md", "size": 1000}, {"path": "docs/a.md", "size": 1001}, 1),
        ("write_file", {"path": "secrets/key"}, {"path": "a/secrets/key"}, 2),
        ("gh__create_issue", {"mode": "w", "size": 10}, {"mode": "x", "size": 10}, 3),
        ("gh__create_issue", {"mode": "a", "size": 99.5}, {"mode": "a", "size": 9}, 3),
        ("set_value", {"value": {"a": [1.0, "x"]}, "flag": True, "n": -4}, {"value": {"a": [1, "x"]}, "flag": 1}, 4),
        ("set_value", {"value": {"a": [1, "x"]}, "flag": True, "n": 5}, {"value": {"a": [1, "x"]}, "flag": True}, 4),
        ("anything/at all", 3, "3", 5),
    ],
)
def test_each_rule_decides_the_input_it_matches_and_not_another(
    tool: str, matching: Any, other: Any, number: int
) -> None:
    rules = RuleSet(parse_rules(EVERY_MATCHER, "rules.toml"))
    decided = rules.deciding(tool, matching)
    assert decided is not None and decided.number == number
    assert rules.deciding_plainly(tool, matching) == decided
    left = rules.deciding(tool, other)
    assert left is None or left.number != number


def test_an_empty_file_has_no_rules_and_a_deny_beats_an_allow_wherever_it_is() -> None:
    assert parse_rules("", "r.toml") == ()
    assert parse_rules("# nothing yet\n", "r.toml") == ()
    rules = RuleSet(parse_rules(EVERY_MATCHER, "rules.toml"))
    assert rules.deciding("write_file", {"path": "secrets/docs/**"}).verdict is Verdict.DENY  # type: ignore[union-attr]


def test_a_header_in_a_string_or_an_array_is_not_a_rule() -> None:
    text = (
        '[[rules]]\ntool = "a"\nverdict = "deny"\nreason = """one\n[[rules]]\ntwo"""\n'
        "[[rules]]\ntool = 'b'\nverdict = 'ask'\nreason = '''\n[[rules]]'''\n"
        '[["rules"]]\ntool = "c"\nverdict = "allow"\nwhen = [{ pointer = "/x", one_of = [\n[["rules"]],\n2,\n] }]\n'
        '[[rules]]\ntool = "d"  # [[rules]]\nverdict = "deny"\n'
    )
    rules = parse_rules(text, "r.toml")
    assert [(r.tool, r.line) for r in rules] == [("a", 1), ("b", 7), ("c", 12), ("d", 19)]
    assert rules[0].reason == "one\n[[rules]]\ntwo"
    assert rules[2].when[0].value == ([["rules"]], 2)


def test_statements_are_found_with_their_lines_and_quoted_keys_read() -> None:
    text = 'a = 1\n"b.c" = [\n  1,\n]\n[t . "u\\u0076"]\nk.l = { m = [\n1] }\n[[x]]\n'
    found = [(s.line, s.kind, s.key) for s in statements(text)]
    assert found == [
        (1, "key", ("a",)),
        (2, "key", ("b.c",)),
        (5, "table", ("t", "uv")),
        (6, "key", ("k", "l")),
        (8, "array", ("x",)),
    ]


# -- malformed shapes, each at its line ----------------------------------------------------------------------

RULE = '[[rules]]\ntool = "write_file"\nverdict = "deny"\n'


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (RULE + 'verdcit = "allow"\n', 4, 'unknown key "verdcit" in a rule (did you mean "verdict"?)'),
        (RULE + 'when = [{ pointer = "/p", glob = "a", prefix = "b" }]\n', 4, "exactly one matcher"),
        (RULE + "[[rules.when]]\npointer = '/p'\nglob = 'a'\nprefix = 'b'\n", 7, "glob and prefix"),
        (RULE + "[[rules.when]]\npointer = '/p'\n", 4, "a condition needs one matcher"),
        (RULE + 'when = [{ glob = "a" }]\n', 4, "a condition needs a pointer"),
        (RULE + 'when = [{ pointer = "/p", globb = "a" }]\n', 4, 'unknown key "globb" in a condition'),
        ('[[rules]]\ntool = "w"\n\nverdict = "Allow"\n', 4, 'verdict is allow, ask or deny, not "Allow"'),
        ('[[rules]]\ntool = "w"\n', 1, "a rule needs a verdict"),
        ('[[rules]]\nverdict = "deny"\n', 1, "a rule needs a tool"),
        ('[[rules]]\ntool = ""\nverdict = "deny"\n', 2, "a non-empty string"),
        ('[[rules]]\ntool = 3\nverdict = "deny"\n', 2, "a non-empty string"),
        (RULE + "reason = 3\n", 4, "reason is a string"),
        (
            RULE + 'when = [{ pointer = "path", glob = "a" }]\n',
            4,
            'JSON pointer "path" must be empty or start with "/"',
        ),
        (RULE + 'when = [{ pointer = "/a~2", glob = "a" }]\n', 4, '"~" that is not "~0" or "~1"'),
        (RULE + "[[rules.when]]\npointer = 3\nequals = 1\n", 5, "a JSON pointer must be a string"),
        (RULE + 'when = [{ pointer = "/p", glob = 3 }]\n', 4, "glob needs a string"),
        (RULE + "[[rules.when]]\npointer = '/p'\n\nprefix = ['a']\n", 7, "prefix needs a string"),
        (RULE + 'when = [{ pointer = "/p", range = [5, 1] }]\n', 4, "range min 5 is above max 1"),
        (RULE + 'when = [{ pointer = "/p", range = [1, 2, 3] }]\n', 4, "range is [min, max]"),
        (RULE + 'when = [{ pointer = "/p", range = { low = 1 } }]\n', 4, 'unknown key "low" in a range'),
        (RULE + 'when = [{ pointer = "/p", range = {} }]\n', 4, "range needs a min, a max or both"),
        (RULE + 'when = [{ pointer = "/p", range = ["a", 2] }]\n', 4, "a range bound must be a finite number"),
        (RULE + 'when = [{ pointer = "/p", range = [0, inf] }]\n', 4, "a range bound must be a finite number"),
        (RULE + 'when = [{ pointer = "/p", one_of = [] }]\n', 4, "one_of needs a non-empty list"),
        (RULE + 'when = [{ pointer = "/p", equals = 1979-05-27 }]\n', 4, "date is not a JSON value"),
        (RULE + 'when = { pointer = "/p", glob = "a" }\n', 4, "when is an array of conditions"),
        (RULE + "when = [1]\n", 4, "each condition of when is a table"),
        (RULE + "[rules.when]\npointer = '/p'\n", 4, "when is an array of conditions"),
        ('rules = [{ tool = "a", verdict = "deny" }]\n', 1, "write each rule as a [[rules]] table"),
        ('# rules\n[rules]\ntool = "a"\n', 2, "write each rule as a [[rules]] table"),
        (
            RULE + '\n[rule]\ntool = "b"\n',
            5,
            'unknown key "rule" in the file: it holds [[rules]] tables only (did you mean "rules"?)',
        ),
        ('verdict = "deny"\n' + RULE, 1, 'unknown key "verdict" in the file: it holds [[rules]] tables only'),
        (
            RULE + '[[rules]]\ntool = "b"\nverdict = "allow"\nwhen = [{ pointer = "/p", match = "glob" }]\n',
            7,
            "rule 2:",
        ),
        (RULE + 'reason = "unclosed\n', 4, "not valid TOML"),
        (RULE + 'when = [{ pointer = "/p",\n  glob = "a" }]\n', 4, "not valid TOML"),
        (RULE + 'tool = "again"\n', 4, "not valid TOML"),
        (RULE + "when = " + "[" * 20000 + "]" * 20000 + "\n", None, "nested too deeply"),
    ],
)
def test_a_malformed_file_is_refused_with_its_line_and_reason(text: str, line: int | None, reason: str) -> None:
    with pytest.raises(RuleFileError) as caught:
        parse_rules(text, "proj/.trioloop/rules.toml")
    error = caught.value
    assert isinstance(error, RuleError)  # what a caller of the machine's rules already catches
    assert (error.path, error.line) == ("proj/.trioloop/rules.toml", line), error
    assert reason in error.reason
    assert str(error) == f"proj/.trioloop/rules.toml:{line}: {error.reason}" if line else error.reason in str(error)


def test_a_toml_syntax_error_carries_tomllibs_line() -> None:
    with pytest.raises(RuleFileError) as caught:
        parse_rules('[[rules]]\ntool = "a"\nverdict = "deny"\n\nwhen = [1,,]\n', "r.toml")
    assert caught.value.line == 5
    assert str(caught.value).startswith("r.toml:5: not valid TOML: ")


def test_an_oversized_file_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    big = tmp_path / "rules.toml"
    big.write_bytes(b"# " + b"x" * MAX_RULE_FILE_BYTES + b"\n")
    with pytest.raises(RuleFileError, match=f"over {MAX_RULE_FILE_BYTES}") as caught:
        read_rule_file(big)
    assert caught.value.path == str(big) and caught.value.line is None
    just = tmp_path / "just.toml"
    just.write_bytes(RULE.encode() + b"#" * (MAX_RULE_FILE_BYTES - len(RULE) - 1) + b"\n")
    assert len(read_rules(just)) == 1


def test_text_that_is_not_utf8_or_not_a_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "rules.toml"
    bad.write_bytes(RULE.encode() + b'reason = "\xff"\n')
    with pytest.raises(RuleFileError, match=r"rules.toml:4: not UTF-8 text"):
        read_rules(bad)
    with pytest.raises(RuleFileError, match="not a regular file"):
        read_rules(tmp_path)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe")
        with pytest.raises(RuleFileError, match="not a regular file"):  # opened without blocking, never read
            read_rule_file(tmp_path / "pipe")
    with pytest.raises(FileNotFoundError):
        read_rules(tmp_path / "none.toml")


# -- where the files are -------------------------------------------------------------------------------------


def _project(folder: Path, text: str = RULE) -> Path:
    path = folder / ".trioloop" / "rules.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_project_file_is_found_from_the_documents_folder_upward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = tmp_path / "home" / "repo"
    deep = repo / "a" / "b"
    deep.mkdir(parents=True)
    assert find_project_rules(deep / "model.thf") is None
    top = _project(repo)
    assert find_project_rules(deep / "model.thf") == top  # a document that does not exist yet: its folder
    assert find_project_rules(deep) == top  # a folder: the search starts in it
    nearer = _project(repo / "a")
    assert find_project_rules(deep / "model.thf") == nearer
    assert find_project_rules(repo / "model.thf") == top
    (repo / "a" / "b" / ".trioloop").mkdir()
    (repo / "a" / "b" / ".trioloop" / "rules.toml").mkdir()  # not a file: passed over
    assert find_project_rules(deep / "model.thf") == nearer
    relative = os.path.relpath(deep / "model.thf")
    assert find_project_rules(relative) == nearer and nearer.is_absolute()


def test_the_search_stops_at_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / "repo").mkdir(parents=True)
    _project(tmp_path)  # above home: not the user's
    monkeypatch.setenv("HOME", str(home))
    assert find_project_rules(home / "repo" / "model.thf") is None
    mine = _project(home)
    assert find_project_rules(home / "repo" / "model.thf") == mine
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))  # a document outside home: up to the root
    mine.unlink()
    assert find_project_rules(home / "repo" / "model.thf") == tmp_path / ".trioloop" / "rules.toml"


def test_the_user_file_is_in_the_config_folder(config_home: Path) -> None:
    assert user_rules_path() == config_home / "trioloop" / "rules.toml"
    assert user_rules_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/trioloop/rules.toml")


# -- trust ---------------------------------------------------------------------------------------------------

PROJECT = """\
[[rules]]
tool = "write_file"
verdict = "allow"
when = [{ pointer = "/path", glob = "docs/**" }]

[[rules]]
tool = "write_file"
verdict = "ask"
when = [{ pointer = "/path", glob = "docs/big/**" }]

[[rules]]
tool = "*"
verdict = "deny"
reason = "written by hand"
when = [{ pointer = "/path", prefix = "secrets/" }]

[[rules]]
tool = "read_*"
verdict = "allow"
"""


def test_an_untrusted_projects_allow_rules_wait_for_trust_and_an_edit_untrusts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = _project(tmp_path / "repo", PROJECT)
    document = tmp_path / "repo" / "model.thf"

    loaded = load_rules(document)
    assert loaded.project_file == path and loaded.user_file is None and loaded.files == (path,)
    assert loaded.project_trust is RuleTrust.UNTRUSTED
    assert [(r.number, r.verdict.value) for r in loaded.rules] == [(2, "ask"), (3, "deny")]
    assert [r.number for r in loaded.withheld] == [1, 4]
    assert loaded.notices == (
        f"2 allow rules of {path} are not in effect: the file is not trusted (run `trioloop rules trust {path}`)",
    )
    rules = RuleSet(loaded.rules)
    assert rules.deciding("write_file", {"path": "docs/a.md"}) is None  # the allow is not in effect
    assert rules.deciding("write_file", {"path": "docs/big/a.md"}).verdict is Verdict.ASK  # type: ignore[union-attr]
    assert rules.deciding("write_file", {"path": "secrets/k"}).verdict is Verdict.DENY  # type: ignore[union-attr]

    digest, trusted = trust_file(path)
    assert digest == file_digest(path.read_bytes()) and len(trusted) == 4
    assert is_trusted(path, path.read_bytes())
    loaded = load_rules(document)
    assert loaded.project_trust is RuleTrust.TRUSTED and loaded.notices == () and loaded.withheld == ()
    assert [r.number for r in loaded.rules] == [1, 2, 3, 4]
    assert RuleSet(loaded.rules).deciding("write_file", {"path": "docs/a.md"}).verdict is Verdict.ALLOW  # type: ignore[union-attr]
    assert stat.S_IMODE(trusted_rules_path().stat().st_mode) == 0o600 or os.name == "nt"

    path.write_text(PROJECT.replace("docs/**", "**"), encoding="utf-8")  # edited after it was trusted
    loaded = load_rules(document)
    assert loaded.project_trust is RuleTrust.CHANGED
    assert [r.number for r in loaded.withheld] == [1, 4]
    assert loaded.notices == (
        f"2 allow rules of {path} are not in effect: the file changed since you trusted it "
        f"(review it, then run `trioloop rules trust {path}`)",
    )

    assert untrust_file(path) and not untrust_file(path)
    assert load_rules(document).project_trust is RuleTrust.UNTRUSTED


def test_trust_is_kept_under_the_real_path_and_a_malformed_file_is_not_trusted(tmp_path: Path) -> None:
    path = _project(tmp_path / "repo", PROJECT)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "repo")
    trust_file(link / ".trioloop" / "rules.toml")
    assert is_trusted(path, path.read_bytes())
    store = json.loads(trusted_rules_path().read_text(encoding="utf-8"))
    assert store["files"] == {os.path.realpath(path): file_digest(path.read_bytes())}

    path.write_text(PROJECT + "verdcit = 1\n", encoding="utf-8")
    with pytest.raises(RuleFileError, match="verdcit"):
        trust_file(path)
    assert not is_trusted(path, path.read_bytes())  # nothing recorded for the new content


def test_a_store_that_cannot_be_read_trusts_nothing_and_says_so(tmp_path: Path) -> None:
    path = _project(tmp_path / "repo", PROJECT)
    trusted_rules_path().parent.mkdir(parents=True)
    trusted_rules_path().write_text("{ not json", encoding="utf-8")
    assert not is_trusted(path, path.read_bytes())
    loaded = load_rules(tmp_path / "repo" / "model.thf")
    assert loaded.project_trust is RuleTrust.UNTRUSTED and len(loaded.withheld) == 2
    assert loaded.notices[0].startswith(f"{trusted_rules_path()}: not valid JSON")
    with pytest.raises(RuleFileError, match="not valid JSON"):
        trust_file(path)  # never written over: the person decides what to do with it


def test_the_users_own_rules_all_apply_and_come_first(tmp_path: Path) -> None:
    user_rules_path().parent.mkdir(parents=True)
    user_rules_path().write_text('[[rules]]\ntool = "write_file"\nverdict = "allow"\n', encoding="utf-8")
    _project(tmp_path / "repo", PROJECT)
    loaded = load_rules(tmp_path / "repo" / "model.thf")
    assert loaded.user_file == user_rules_path()
    assert (loaded.rules[0].source, loaded.rules[0].number) == (str(user_rules_path()), 1)
    assert loaded.rules[0].verdict is Verdict.ALLOW
    assert load_rules(None).rules == loaded.rules[:1] and load_rules(None).project_file is None
    assert user_rules_path() not in load_rules(tmp_path / "repo" / "model.thf", user=False).files

    user_rules_path().write_text('[[rules]]\ntool = "write_file"\nverdict = "alow"\n', encoding="utf-8")
    with pytest.raises(RuleFileError) as caught:  # never skipped: its deny rules would go with it
        load_rules(None)
    assert (caught.value.path, caught.value.line) == (str(user_rules_path()), 3)


def test_a_malformed_project_file_is_refused_not_skipped(tmp_path: Path) -> None:
    _project(tmp_path / "repo", PROJECT + "\n[[rules]]\ntool = 'x'\n")
    with pytest.raises(RuleFileError, match=r"rules.toml:21: rule 5: a rule needs a verdict"):
        load_rules(tmp_path / "repo" / "model.thf")


# -- the command line ----------------------------------------------------------------------------------------


def _trioloop(*args: str, config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(config), "HOME": str(cwd), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "trioloop", "rules", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_the_rules_commands(tmp_path: Path, config_home: Path) -> None:
    path = _project(tmp_path / "repo", PROJECT)
    run = lambda *args: _trioloop(*args, config=config_home, cwd=tmp_path)  # noqa: E731

    shown = run("show", "repo/model.thf")
    assert shown.returncode == 0, shown.stderr
    assert f"project rule file: {path} (not trusted" in shown.stdout
    assert f"user rule file: none ({config_home / 'trioloop' / 'rules.toml'} does not exist)" in shown.stdout
    assert f"{path}:11: rule 3: deny * path starts with secrets/ — written by hand" in shown.stdout
    assert f"{path}:1: rule 1: allow write_file path docs/**" in shown.stdout.split("Not in effect")[1]
    assert "2 allow rules of" in shown.stdout and "trioloop rules trust" in shown.stdout

    trusted = run("trust", "repo/.trioloop/rules.toml")
    assert trusted.returncode == 0, trusted.stderr
    assert "4 rules (2 allow, 1 ask, 1 deny)" in trusted.stdout and "rule 4: allow read_*" in trusted.stdout
    shown = run("show", "repo/model.thf")
    assert "(trusted: its allow rules are in effect)" in shown.stdout and "Not in effect" not in shown.stdout

    path.write_text(PROJECT + "# edited\n", encoding="utf-8")
    shown = run("show", "repo/model.thf")
    assert "changed since you trusted it" in shown.stdout

    checked = run("check", "repo/.trioloop/rules.toml")
    assert checked.returncode == 0 and "4 rules (2 allow, 1 ask, 1 deny)" in checked.stdout
    path.write_text(PROJECT.replace('verdict = "ask"', 'verdcit = "ask"'), encoding="utf-8")
    checked = run("check", "repo/.trioloop/rules.toml")
    assert checked.returncode == 1
    assert checked.stderr.strip() == (
        'repo/.trioloop/rules.toml:8: rule 2: unknown key "verdcit" in a rule (did you mean "verdict"?)'
    )
    assert run("show", "repo/model.thf").returncode == 1
    assert run("trust", "repo/.trioloop/rules.toml").returncode == 1

    untrusted = run("untrust", "repo/.trioloop/rules.toml")
    assert untrusted.returncode == 0 and "no longer trusted" in untrusted.stdout
    assert "was not trusted" in run("untrust", "repo/.trioloop/rules.toml").stdout
    missing = run("check", "nothing.toml")
    assert missing.returncode == 2 and "no rule file at nothing.toml" in missing.stderr
    shown = run("show")
    assert shown.returncode == 0 and "project rule file: none found" in shown.stdout
    assert "No rules in effect from files" in shown.stdout

    user_rules_path().parent.mkdir(parents=True, exist_ok=True)
    user_rules_path().write_text('[[rules]]\ntool = "read_*"\nverdict = "allow"\n', encoding="utf-8")
    shown = run("show")
    assert f"user rule file: {user_rules_path()}\n" in shown.stdout
    assert f"  {user_rules_path()}:1: rule 1: allow read_*\n" in shown.stdout


# -- properties ----------------------------------------------------------------------------------------------

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=8,
)


def _toml_char(char: str) -> str:
    if char in '"\\':
        return "\\" + char
    return f"\\u{ord(char):04x}" if ord(char) < 0x20 or char == "\x7f" else char


def _toml_string(text: str) -> str:
    return '"' + "".join(map(_toml_char, text)) + '"'


def _toml(value: Any) -> str:
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) in (int, float):
        return repr(value)
    if type(value) is str:
        return _toml_string(value)
    if type(value) is list:
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{ " + ", ".join(f"{_toml_string(k)} = {_toml(v)}" for k, v in value.items()) + " }"


@st.composite
def _conditions(draw: st.DrawFn) -> tuple[Condition, str]:
    tokens = draw(st.lists(_TEXT, max_size=3))
    pointer = "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)
    kind = draw(st.sampled_from(["equals", "one_of", "glob", "prefix", "range"]))
    if kind == "equals":
        value = draw(_JSON)
        return Condition.equals(pointer, value), f"equals = {_toml(value)}"
    if kind == "one_of":
        values = draw(st.lists(_JSON, min_size=1, max_size=3))
        return Condition.one_of(pointer, values), "one_of = [\n  " + ",\n  ".join(_toml(v) for v in values) + ",\n]"
    if kind in ("glob", "prefix"):
        text = draw(_TEXT)
        return Condition(pointer=pointer, match=kind, value=text), f"{kind} = {_toml_string(text)}"  # type: ignore[arg-type]
    number = st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6))
    low, high = draw(st.one_of(st.tuples(number, st.none()), st.tuples(st.none(), number), st.tuples(number, number)))
    if low is not None and high is not None and low > high:
        low, high = high, low
    if low is not None and high is not None:
        written = f"range = [{low!r}, {high!r}]"
    else:
        written = "range = { " + ("min" if high is None else "max") + f" = {low if high is None else high!r} }}"
    return Condition.in_range(pointer, low, high), written


@st.composite
def _rule_files(draw: st.DrawFn) -> tuple[str, list[ApprovalRule]]:
    lines: list[str] = []
    rules: list[ApprovalRule] = []
    for number in range(1, draw(st.integers(0, 4)) + 1):
        lines.extend(draw(st.lists(st.sampled_from(["", "# [[rules]]", "  "]), max_size=2)))
        line = len(lines) + 1
        lines.append(draw(st.sampled_from(["[[rules]]", "[[ rules ]] # a rule", '[["rules"]]'])))
        tool = draw(st.from_regex(r"[a-z_*?]{1,10}", fullmatch=True))
        verdict = draw(st.sampled_from(list(Verdict)))
        reason = draw(st.one_of(_TEXT, st.just("one\n[[rules]]\ntwo")))
        made = [draw(_conditions()) for _ in range(draw(st.integers(0, 3)))]
        lines += [f"tool = {_toml_string(tool)}", f'verdict = "{verdict.value}"']
        literal = all(c.isprintable() or c == "\n" for c in reason) and "'''" not in reason
        if reason and literal and not reason.endswith("'") and draw(st.booleans()):
            lines.append(f"reason = '''\n{reason}'''")
        elif reason:
            lines.append(f"reason = {_toml_string(reason)}")
        if made and draw(st.booleans()):
            for condition, written in made:
                lines += ["[[rules.when]]", "pointer = " + _toml_string(condition.pointer), written]
        elif made:
            inline = [f"{{ pointer = {_toml_string(c.pointer)}, {w.replace(chr(10), ' ')} }}" for c, w in made]
            lines.append("when = [\n" + ",\n".join(inline) + "\n]")
        rules.append(
            ApprovalRule(
                tool=tool,
                verdict=verdict,
                when=tuple(c for c, _ in made),
                reason=reason,
                source="r.toml",
                number=number,
                line=line,
            )
        )
        lines = "\n".join(lines).split("\n")  # a multi-line value counts its lines
    return "\n".join(lines) + "\n", rules


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_rule_files())
def test_any_rule_set_written_as_toml_parses_back_equal_at_its_lines(written: tuple[str, list[ApprovalRule]]) -> None:
    text, rules = written
    assert parse_rules(text, "r.toml") == tuple(rules), text


@pytest.fixture(scope="module")
def trusted_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, Path]:
    folder = tmp_path_factory.mktemp("trusted")
    path = _project(folder, PROJECT)
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(folder / "config")
    try:
        trust_file(path)
    finally:
        if old is not None:
            os.environ["XDG_CONFIG_HOME"] = old
    return path, path.read_bytes(), folder / "config"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_byte_edit_of_a_trusted_file_makes_it_untrusted(
    trusted_file: tuple[Path, bytes, Path], monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    path, content, config = trusted_file
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    assert is_trusted(path, content)
    at = data.draw(st.integers(0, len(content)))
    kind = data.draw(st.sampled_from(["change", "insert", "delete"]))
    if kind == "change" and at < len(content):
        byte = data.draw(st.integers(0, 255).filter(lambda b: b != content[at]))
        edited = content[:at] + bytes([byte]) + content[at + 1 :]
    elif kind == "delete" and at < len(content):
        edited = content[:at] + content[at + 1 :]
    else:
        edited = content[:at] + bytes([data.draw(st.integers(0, 255))]) + content[at:]
    assert not is_trusted(path, edited)
