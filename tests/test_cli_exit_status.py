"""Every exit status is the one docs/reference/cli.md gives: the test reads the table and runs real commands for
each row. A closed output ends every command quietly with 141 (128 + SIGPIPE), never a traceback."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pexpect
import pytest
import trio

from tests.http_support import ProviderHandler, serving
from tests.test_cli_autosave import add_threat, answers
from tests.test_cli_pty import proposal
from trioloop import ScriptedProvider, Session, define_document_kind
from trioloop.cli.chat import chat_session
from trioloop.cli.demo import run_demo
from trioloop.cli.exit_codes import EXIT_OK, EXIT_UNANSWERED
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.scripted import ScriptStep
from trioloop.stores import SQLiteJournalStore

ROOT = Path(__file__).resolve().parent.parent
PAYMENT = ROOT / "examples" / "payment.thf"
INVALID = ROOT / "tests" / "fixtures" / "thf_invalid" / "dangling_threat_flow.thf"
CLI_DOC = ROOT / "docs" / "reference" / "cli.md"
NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
KEY = {"ANTHROPIC_API_KEY": "sk-ant-exit-status-test"}


def documented_statuses() -> dict[int, str]:
    """The rows of the "Exit status" table: status -> meaning."""
    text = CLI_DOC.read_text(encoding="utf-8")
    section = text.split("\n## Exit status\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", section, flags=re.MULTILINE)
    assert rows, "the exit status table was not found"
    return {int(status): meaning for status, meaning in rows}


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioloop", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONIOENCODING": "utf-8", **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """A journal of one settled turn, signed with this test run's key (the commands below find it too)."""
    path = tmp_path / "notes.journal"

    async def record() -> None:
        async with ScriptedProvider([ScriptStep(text="Hello.")]) as provider, SQLiteJournalStore(path) as store:
            session = await Session.open(store, "notes", kind=NOTE, provider=provider, document="", model="scripted-1")
            async with session:
                await session.send("Say hello.")

    trio.run(record)
    return path


def no_key(folder: Path) -> dict[str, str]:
    """The environment of an auditor who has no signing key of their own."""
    return {"XDG_CONFIG_HOME": str(folder / "auditor"), "TRIOLOOP_JOURNAL_KEY": ""}


def forged(journal: Path) -> Path:
    """``journal`` with one byte of an entry changed: it no longer verifies."""
    with closing(sqlite3.connect(journal)) as db, db:
        seq, data = db.execute(
            "SELECT seq, data FROM trioloop_journal WHERE CAST(data AS TEXT) LIKE '%Say hello.%'"
        ).fetchone()
        db.execute("UPDATE trioloop_journal SET data = ? WHERE seq = ?", (bytes(data).replace(b"hello", b"HELLO"), seq))
    return journal


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def interrupted_demo(tmp_path: Path) -> int:
    """Ctrl-C outside a turn (at the demo's undo question, after a turn that changed the document)."""
    env = {**os.environ, "TERM": "xterm", "PYTHONUNBUFFERED": "1"}
    env.pop("EDITOR", None)
    env.pop("VISUAL", None)
    child = pexpect.spawn(
        sys.executable, ["-m", "trioloop", "demo"], cwd=str(tmp_path), env=env, encoding="utf-8", timeout=60
    )
    try:
        child.expect_exact("toolu_03: a approve")
        child.sendline("all")
        child.expect_exact("toolu_05: a approve")
        child.sendline("d")
        child.expect_exact("Reason for the model")
        child.sendline("")
        child.expect_exact("toolu_07: a approve")
        child.sendline("q")
        child.expect_exact("Undo this turn? [y/N]")
        child.sendintr()
        child.expect_exact("interrupted")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert "Traceback" not in (child.before or "")
    code: int = child.exitstatus
    return code


def closed_output(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a command whose standard output is a pipe nobody reads: its read end is closed before the command
    starts writing, so its first write fails (what `| head` does once it has its lines)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "trioloop", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read().decode("utf-8", "replace")
    process.stderr.close()
    return process.wait(timeout=120), err


Case = Callable[[], int]


@pytest.fixture
def proposing_server() -> Iterator[int]:
    """A provider whose model proposes an add_threat call for review at every request."""

    class Handler(ProviderHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_body("text/event-stream", ANTHROPIC_WIRE.render_stream(proposal(1)))

    with serving(Handler) as port:
        yield port


def test_every_row_of_the_exit_status_table_holds(
    tmp_path: Path, journal: Path, closed_port: int, proposing_server: int
) -> None:
    chat = ("chat", "--provider", "anthropic", "--no-session")
    proposing = ("--base-url", f"http://127.0.0.1:{proposing_server}")
    document = tmp_path / "model.thf"
    document.write_bytes(PAYMENT.read_bytes())
    pristine = tmp_path / "pristine.journal"  # the case of status 1 forges the journal in place
    pristine.write_bytes(journal.read_bytes())
    cases: dict[int, list[Case]] = {
        0: [
            lambda: run("validate", str(PAYMENT), cwd=tmp_path).returncode,
            lambda: run("demo", "--approve", "safe", cwd=tmp_path).returncode,
            lambda: run("audit", str(journal), "--session", "notes", cwd=tmp_path).returncode,
            lambda: run("key", cwd=tmp_path).returncode,
        ],
        1: [
            lambda: run("validate", str(INVALID), cwd=tmp_path).returncode,
            lambda: run("demo", str(INVALID), cwd=tmp_path).returncode,
            lambda: run(chat[0], str(INVALID), *chat[1:], cwd=tmp_path, env=KEY).returncode,
            lambda: run("audit", str(forged(journal)), cwd=tmp_path).returncode,
        ],
        2: [
            lambda: run("frobnicate", cwd=tmp_path).returncode,
            lambda: run("demo", "--approve", "maybe", cwd=tmp_path).returncode,
            lambda: run("validate", "missing.thf", cwd=tmp_path).returncode,
            lambda: run("demo", "missing.thf", cwd=tmp_path).returncode,
            lambda: run(chat[0], "missing.thf", *chat[1:], cwd=tmp_path, env=KEY).returncode,
            lambda: run(chat[0], str(PAYMENT), *chat[1:], cwd=tmp_path, env={"ANTHROPIC_API_KEY": ""}).returncode,
            lambda: run(*chat, str(PAYMENT), "--base-url", "http://example.com", cwd=tmp_path, env=KEY).returncode,
            lambda: run(*chat, str(PAYMENT), "--resume", "nothing.journal", cwd=tmp_path, env=KEY).returncode,
            lambda: run("audit", "missing.journal", cwd=tmp_path).returncode,
            lambda: run("audit", str(journal), "--session", "nope", cwd=tmp_path).returncode,
        ],
        3: [
            lambda: (
                run(
                    *chat, str(PAYMENT), "--base-url", f"http://127.0.0.1:{closed_port}", cwd=tmp_path, env=KEY
                ).returncode
            ),
        ],
        4: [  # standard input is the null device: the input ends at the first card
            lambda: run("demo", cwd=tmp_path).returncode,
            lambda: run(*chat, str(document), *proposing, "--prompt", "add a threat", cwd=tmp_path, env=KEY).returncode,
        ],
        5: [  # an auditor with no public key and no signing key of their own: nothing verified, never 0
            lambda: run("audit", str(pristine), cwd=tmp_path, env=no_key(tmp_path)).returncode,
        ],
        130: [lambda: interrupted_demo(tmp_path)],
        141: [lambda: closed_output("validate", str(PAYMENT), cwd=tmp_path)[0]],
    }
    documented = documented_statuses()
    assert sorted(documented) == sorted(cases), "a row of the table without a case here, or a case without a row"
    for status, runs in cases.items():
        for number, case in enumerate(runs):
            assert case() == status, f"case {number} of status {status} ({documented[status]})"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A provider that lists its models (the check before the first prompt passes) and is never asked more."""
    with serving(ProviderHandler) as port:
        yield port


def test_a_closed_output_ends_every_command_quietly_with_141(tmp_path: Path, journal: Path, silent_server: int) -> None:
    document = tmp_path / "model.thf"
    document.write_text(PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    url = f"http://127.0.0.1:{silent_server}"
    commands = [
        ("validate", str(PAYMENT)),
        ("demo", "--approve", "safe"),  # inside Trio's nurseries: the error comes in exception groups
        ("demo",),  # at the review prompt
        ("chat", str(document), "--provider", "anthropic", "--base-url", url, "--no-session"),
        ("audit", str(journal)),
        ("audit", str(journal), "--json"),
        ("key",),
    ]
    for args in commands:
        code, err = closed_output(*args, cwd=tmp_path, env=KEY)
        assert (code, err) == (141, ""), args
    assert document.read_text(encoding="utf-8") == PAYMENT.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("command", "lines"),
    [(("audit", "{journal}"), 1), (("demo", "--approve", "safe"), 2), (("validate", str(PAYMENT)), 0)],
)
def test_head_takes_its_lines_and_the_command_ends_quietly(
    command: tuple[str, ...], lines: int, tmp_path: Path, journal: Path
) -> None:
    # A real pipeline: whether the command is still writing when head leaves is up to the scheduler, so it
    # ends either way, but always quietly, with head's lines intact.
    args = [arg.format(journal=journal) for arg in command]
    producer = subprocess.Popen(
        [sys.executable, "-m", "trioloop", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert producer.stdout is not None and producer.stderr is not None
    head = subprocess.run(["head", f"-{lines}"], stdin=producer.stdout, capture_output=True, check=False)
    producer.stdout.close()
    err = producer.stderr.read().decode("utf-8", "replace")
    producer.stderr.close()
    assert producer.wait(timeout=120) in (0, 141)
    assert err == ""
    assert head.stdout.decode("utf-8").count("\n") == lines


async def test_a_one_shot_chat_whose_input_ends_at_a_card_exits_unanswered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = tmp_path / "model.thf"
    document.write_bytes(PAYMENT.read_bytes())
    async with ScriptedProvider([add_threat("c1", "Never"), ScriptStep(text="unreached")]) as provider:
        code = await chat_session(document, provider, "scripted-1", "ask", answers(), one_shot="add a threat")
    assert code == EXIT_UNANSWERED
    assert "The input ended at this card: the turn stops here" in capsys.readouterr().out
    assert document.read_bytes() == PAYMENT.read_bytes()  # nothing of the card ran


@pytest.mark.parametrize(
    ("replies", "status"),
    [
        (("add one",), EXIT_UNANSWERED),  # a piped request, then the input ends at its card
        (("add one", "d"), EXIT_UNANSWERED),  # ends at the deny's reason: denied, and the next card finds it ended
        (("add one", EOFError(), "add another", "a"), EXIT_OK),  # Ctrl-D at a card, then a turn answered in full
    ],
)
async def test_a_chat_exits_unanswered_when_its_last_turn_stopped_at_a_card(
    tmp_path: Path, replies: tuple[str | BaseException, ...], status: int
) -> None:
    document = tmp_path / "model.thf"
    document.write_bytes(PAYMENT.read_bytes())
    steps = [add_threat("c1", "First"), add_threat("c2", "Second"), ScriptStep(text="ok")]
    async with ScriptedProvider(steps) as provider:
        assert await chat_session(document, provider, "scripted-1", "ask", answers(*replies), journal=None) == status


@pytest.mark.parametrize(
    ("replies", "status"),
    [((), EXIT_UNANSWERED), (("a", "d"), EXIT_UNANSWERED), (("all", "d", "", "a"), EXIT_OK)],
)
def test_the_demo_exits_unanswered_when_its_input_ends_at_a_card(
    replies: tuple[str, ...], status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # All answered, the input may end at the undo question: its default keeps the turn.
    assert run_demo(None, "ask", None, False, answers(*replies)) == status
    assert "Traceback" not in capsys.readouterr().err
