"""The terminal commands driven for real in a pseudo terminal (pexpect): a chat that waits on a server that never
answers (the live waiting line), is stopped with Ctrl-C, undone, saved and resumed; a chat whose tool lines never
land inside the model's answers and whose token totals survive --resume; the demo's review keys, an edit shown
again before it is approved, a deny reason shown whole, and its first run ending as a completed turn."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from tests.http_support import ProviderHandler, serving
from trioloop.protocol.events import StopReason
from trioloop.protocol.messages import ToolCallBlock
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireResponse

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
TIMEOUT = 30
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen_lines(text: str) -> list[str]:
    """What a transcript shows, line by line: no colour codes, no carriage returns."""
    return _ANSI.sub("", text).replace("\r", "").split("\n")


def proposal(n: int) -> WireResponse:
    """The model's first answer of turn ``n``: a sentence, then an add_threat call for review."""
    threat = {"title": f"T{n}", "category": "Spoofing", "severity": "low", "element": "psp"}
    return WireResponse(
        model="claude-sonnet-4-5",
        text=f"I will add threat T{n} to the model now, as you asked.",
        tool_calls=(ToolCallBlock(id=f"toolu_{n}", name="add_threat", input={"threat": threat}),),
        stop_reason=StopReason.TOOL_USE,
        input_tokens=100 * n,
        output_tokens=10 * n,
    )


def closing(n: int) -> WireResponse:
    """The model's answer after the call of turn ``n`` ran."""
    return WireResponse(
        model="claude-sonnet-4-5",
        text=f"Threat T{n} is in place: the document records it now, and nothing else changed in this step.",
        input_tokens=100 * n + 50,
        output_tokens=20,
    )


@pytest.fixture
def model_server() -> Iterator[int]:
    """A provider whose model proposes one add_threat call per turn and then closes the turn, for ever: turn n
    answers `proposal(n)`, then `closing(n)`, as Anthropic streams them."""
    answers = iter(r(n) for n in range(1, 1000) for r in (proposal, closing))
    lock = threading.Lock()

    class Handler(ProviderHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            with lock:
                answer = next(answers)
            self.send_body("text/event-stream", ANTHROPIC_WIRE.render_stream(answer))

    with serving(Handler) as port:
        yield port


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A provider that hangs: it lists its models (the check before the first prompt passes) and never answers
    a request for a turn."""
    release = threading.Event()

    class Handler(ProviderHandler):
        def do_POST(self) -> None:
            release.wait(60)  # never answers while the test runs

    with serving(Handler, on_close=release.set) as port:
        yield port


def spawn(*args: str, cwd: Path, editor: str | None = None) -> pexpect.spawn:
    env = {
        **os.environ,
        "ANTHROPIC_API_KEY": "sk-ant-pty-test",
        "TERM": "xterm",
        "COLUMNS": "120",
        "LINES": "40",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("EDITOR", None)
    env.pop("VISUAL", None)
    if editor is not None:
        env["EDITOR"] = editor
    child = pexpect.spawn(
        sys.executable,
        ["-m", "trioloop", *args],
        cwd=str(cwd),
        env=env,
        encoding="utf-8",
        timeout=TIMEOUT,
        dimensions=(40, 120),
    )
    return child


def test_a_chat_waits_visibly_stops_on_ctrl_c_saves_and_resumes(tmp_path: Path, silent_server: int) -> None:
    document = tmp_path / "model.thf"
    document.write_text(PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    url = f"http://127.0.0.1:{silent_server}"
    child = spawn("chat", str(document), "--provider", "anthropic", "--base-url", url, cwd=tmp_path)
    try:
        child.expect_exact("you> ")
        child.sendline("add a threat on the PSP")
        # The live line: the time waited, updated in place, and how to stop.
        child.expect(r"waiting for the model: 1 s \(Ctrl-C stops\)")
        child.expect(r"waiting for the model: [23] s \(Ctrl-C stops\)")
        child.sendintr()
        child.expect_exact("Stopping the turn")
        child.expect_exact("Turn stopped.")
        child.expect_exact("you> ")
        child.sendline("/undo")
        child.expect_exact("Nothing to undo.")
        child.sendline("/save work.session.json")
        child.expect_exact("Saved the session to work.session.json")
        child.sendline("/help")
        child.expect_exact("/redo")
        child.expect_exact("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert (tmp_path / "work.session.json").exists()
    assert (tmp_path / "model.thf.journal").exists()  # every turn was journaled

    # A new process continues the saved conversation (the stopped turn is in its history).
    child = spawn(
        "chat", str(document), "--provider", "anthropic", "--base-url", url, "--resume", "work.session.json",
        cwd=tmp_path,
    )  # fmt: skip
    try:
        child.expect_exact("you> ")
        child.sendline("/usage")
        child.expect_exact("This session:")
        child.expect_exact("you> ")  # Ctrl-D only once the line editor reads again
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before


def test_a_one_shot_chat_with_a_timeout_exits_non_zero_at_the_limit(tmp_path: Path, silent_server: int) -> None:
    document = tmp_path / "model.thf"
    document.write_text(PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    url = f"http://127.0.0.1:{silent_server}"
    child = spawn(
        "chat", str(document), "--provider", "anthropic", "--base-url", url, "--timeout", "2", "--prompt", "hello",
        "--no-session", cwd=tmp_path,
    )  # fmt: skip
    try:
        child.expect(r"waiting for the model: 1 s")
        child.expect_exact("Turn ended at a limit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 3, child.before
    assert not (tmp_path / "model.thf.journal").exists()


def test_the_demo_shows_the_keys_and_refuses_s(tmp_path: Path) -> None:
    child = spawn("demo", "--out", str(tmp_path / "out.thf"), cwd=tmp_path)
    try:
        child.expect_exact("keys: a approve · d deny · e edit · all (every safe card) · q stop · ? help")
        child.expect(r"a approve, d deny, e edit, all \(every safe card\), always, always tool, never, q stop, \?")
        child.sendline("s")
        child.expect_exact("s is no answer")
        child.sendline("q")  # stop the turn at the first card
        child.expect_exact("Turn stopped.")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert (tmp_path / "out.thf").exists()


def chat_in(tmp_path: Path, port: int, *args: str) -> pexpect.spawn:
    document = tmp_path / "model.thf"
    if not document.exists():
        document.write_text(PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    url = f"http://127.0.0.1:{port}"
    return spawn("chat", str(document), "--provider", "anthropic", "--base-url", url, *args, cwd=tmp_path)


def approve_turns(child: pexpect.spawn, turns: range) -> list[str]:
    """Ask for a threat per turn and approve its card; the session totals each turn ends on."""
    totals = []
    for n in turns:
        child.expect_exact("you> ")
        child.sendline(f"add threat {n}")
        child.expect_exact(f"toolu_{n}: a approve")
        child.sendline("a")
        child.expect(r"; session: ([^\r\n]*? out)")
        totals.append(child.match.group(1))
    return totals


def end_chat(child: pexpect.spawn) -> None:
    child.expect_exact("you> ")  # Ctrl-D only once the line editor reads again
    child.sendeof()
    child.expect(pexpect.EOF)


def test_tool_lines_never_land_inside_an_answer(tmp_path: Path, model_server: int) -> None:
    # The journal holds each state back until its entries are durable, so the view often gets the settled call
    # and the next answer's first text in one state: the call's line must still come first, the answer whole.
    child = chat_in(tmp_path, model_server)
    transcript = []
    try:
        for n in range(1, 5):
            approve_turns(child, range(n, n + 1))
            transcript.append(child.before)
        end_chat(child)
    finally:
        child.close()
    assert child.exitstatus == 0
    for n, shown in enumerate(transcript, 1):
        lines = screen_lines(shown)
        done = next(i for i, line in enumerate(lines) if line.startswith(f'  [done] add_threat: Added threat "T{n}"'))
        answer = f"assistant> {closing(n).text}"
        assert answer in lines, shown  # the answer on a line of its own, whole
        assert done < lines.index(answer), shown
        assert all(line.startswith("  [") for line in lines if "[done]" in line), shown


def test_token_totals_survive_resume(tmp_path: Path, model_server: int) -> None:
    child = chat_in(tmp_path, model_server)
    try:
        totals = approve_turns(child, range(1, 3))
        end_chat(child)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert totals == ["250 in, 30 out", "700 in, 70 out"]  # turn n: 100n + (100n + 50) in, 10n + 20 out

    child = chat_in(tmp_path, model_server, "--resume", "model.thf.journal")
    try:
        child.expect_exact("you> ")
        child.sendline("/usage")
        child.expect_exact("This session: 700 in, 70 out")
        after = approve_turns(child, range(3, 4))
        end_chat(child)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert after == ["1350 in, 120 out"]  # and the resumed chat counts on from there


EDITOR_SCRIPT = """
import json, sys
path = sys.argv[1]
value = json.load(open(path))
description = value["updates"]["description"]
value["updates"]["description"] = "Edited in the editor." if "Edited" not in description else description + " Again."
json.dump(value, open(path, "w"))
"""


def test_an_edit_is_shown_as_its_card_and_approved_only_with_a_key(tmp_path: Path) -> None:
    script = tmp_path / "editor.py"
    script.write_text(EDITOR_SCRIPT, encoding="utf-8")
    out = tmp_path / "out.thf"
    child = spawn("demo", "--out", str(out), cwd=tmp_path, editor=f"{sys.executable} {script}")
    try:
        child.expect_exact("toolu_03: a approve")
        child.sendline("a")
        child.expect_exact("toolu_04: a approve")
        child.sendline("e")
        # The editor exited: the edited input comes back as its card, the changed field marked with what it
        # was, and nothing is approved until a key says so.
        child.expect_exact("review toolu_04 · update_element · edited (1 field(s) changed)")
        child.expect_exact("* updates.description: Edited in the editor.")
        child.expect_exact("was: Back-office tool; SSO with MFA required.")
        child.expect_exact("keys: a approve the edit · e edit again · d deny · q stop · ? help")
        child.expect_exact("toolu_04 (edited): a approve the edit, e edit again, d deny, q stop, ?")
        assert "approved toolu_04" not in child.before
        child.sendline("e")  # again: the editor starts from the edit
        child.expect_exact("* updates.description: Edited in the editor. Again.")
        child.expect_exact("toolu_04 (edited): a approve the edit")
        child.sendline("a")
        child.expect_exact("approved toolu_04 with your edit")
        child.expect_exact("toolu_05: a approve")
        child.sendline("d")
        child.expect_exact("Reason for the model")
        child.sendline("")
        child.expect_exact("toolu_07: a approve")
        child.sendline("a")
        child.expect_exact("Undo this turn? [y/N]")
        child.sendline("n")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert "description: Edited in the editor. Again." in out.read_text(encoding="utf-8")


REASON = (
    "Keep the flow: the notification service still reads payment events from it, and the receipts team depends "
    "on those events for customer emails; removing it would break refunds and disputes too. Ask the platform "
    "team before proposing this again."
)


def test_a_deny_reason_is_shown_whole_wrapped_to_the_terminal(tmp_path: Path) -> None:
    child = spawn("demo", cwd=tmp_path)
    try:
        for answer in ("a", "a", "d"):
            child.expect(r"toolu_0\d: a approve")
            child.sendline(answer)
        child.expect_exact("Reason for the model")
        child.sendline(REASON)
        child.expect_exact("toolu_07: a approve")
        shown = screen_lines(child.before)
        child.sendline("a")
        child.expect_exact("Undo this turn? [y/N]")
        child.sendline("n")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    denied = "  [not run] delete_data_flow: The user declined"
    first = next(i for i, line in enumerate(shown) if line.startswith(denied))
    block = [shown[first]]
    for line in shown[first + 1 :]:
        if not line.startswith("      "):  # the reason's own lines hang under the tool's name
            break
        block.append(line)
    assert len(block) > 1 and all(len(line) <= 120 for line in block)  # folded to the terminal's width
    assert REASON in " ".join(" ".join(block).split())  # and whole: not a word cut


def test_the_demo_completes_its_turn_and_shows_the_limit_on_request(tmp_path: Path) -> None:
    child = spawn("demo", "--approve", "safe", cwd=tmp_path)
    try:
        child.expect_exact("Turn completed.")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "at a limit" not in child.before

    child = spawn("demo", "--approve", "safe", "--show-limit", cwd=tmp_path)
    try:
        child.expect_exact("Turn ended at a limit: This turn stopped because it used all of its model steps.")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
