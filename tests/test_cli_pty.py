"""The terminal commands driven for real in a pseudo terminal (pexpect): a chat that waits on a server that never
answers (the live waiting line), is stopped with Ctrl-C, undone, saved and resumed; the demo's review keys."""

from __future__ import annotations

import http.server
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
TIMEOUT = 30


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A provider that hangs: it lists its models (the check before the first prompt passes) and never answers
    a request for a turn."""
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"data": []}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            release.wait(60)  # never answers while the test runs

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def spawn(*args: str, cwd: Path) -> pexpect.spawn:
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
        child.expect(r"a approve, d deny, e edit, all \(every safe card\), q stop, \?")
        child.sendline("s")
        child.expect_exact("s is no answer")
        child.sendline("q")  # stop the turn at the first card
        child.expect_exact("Turn stopped.")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert (tmp_path / "out.thf").exists()
