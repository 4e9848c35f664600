"""The inbox as a person uses it, end to end: a real ``trioloop serve`` process, real ``trioloop worker`` processes
(``tests.worker_app``) and Chromium (Playwright), on one store, SQLite and PostgreSQL.

A card arrives on an open page, is approved with the keyboard, the worker runs the tool and the page shows the turn
went on; a denial's reason reaches the model, whose answer the session page shows; a browser without a login gets
the login page and a decision form posted without one decides nothing; a worker killed mid-tool is replaced and the
turn finishes, the interrupted call reported failed and run once.

The browser is skipped without /usr/bin/chromium unless ``TRIOLOOP_REQUIRE_BROWSER=1``; PostgreSQL is skipped
without its binaries unless ``TRIOLOOP_REQUIRE_POSTGRES=1`` (both then fail).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)
from web_support import ROOT, Served, reviewers_file, serve_process

from tests.worker_app import NOTE, TOOLS, runs
from trioloop import Phase, ScriptedProvider, Session
from trioloop.durable.signing import JournalSigner
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import open_store

CHROMIUM = "/usr/bin/chromium"
APP_KEY = JournalSigner.generate()  # the app's and the workers' journal key
WAIT_MS = 15_000


def _need_browser() -> None:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("TRIOLOOP_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TRIOLOOP_REQUIRE_BROWSER=1 but there is no {CHROMIUM}")
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package); TRIOLOOP_REQUIRE_BROWSER=1 fails instead")


def _fresh_database(url: str) -> str:
    import psycopg

    name = f"e2e_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 15) -> None:
    """Poll ``condition`` (another process's doing: a file, the store) until it holds, bounded."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}")
        time.sleep(0.05)


class Fleet:
    """One store, the inbox serving it, and the workers carrying its sessions on."""

    def __init__(self, target: str, folder: Path, served: Served) -> None:
        self.target = target
        self.folder = folder
        self.served = served
        self.workers: list[subprocess.Popen[bytes]] = []

    def spawn(self) -> subprocess.Popen[bytes]:
        """A worker process accepting the inbox's key (the public key ``trioloop serve`` printed)."""
        command = [sys.executable, "-m", "trioloop.web.worker", "--app", "tests.worker_app:app"]
        command += [
            "--store",
            self.target,
            "--key",
            self.served.public_key,
            "--poll-s",
            "0.02",
            "--scan-s",
            "0.2",
            "-v",
        ]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TRIOLOOP_TEST_APP_KEY": str(self.folder / "app-key"),
            "TRIOLOOP_TEST_RUNS": str(self.folder),
        }
        with (self.folder / f"worker-{len(self.workers)}.log").open("wb") as log:
            worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    def suspend_in_review(self, session_id: str, call: tuple[str, dict[str, Any]], request: str) -> None:
        """The app: a turn whose model asks for ``call`` (tool, input), suspended while its card waits."""

        async def make() -> None:
            step = ScriptStep(text="I will do it.", tool_calls=(ScriptedCall(id="c1", name=call[0], input=call[1]),))
            store = open_store(self.target)
            try:
                async with ScriptedProvider([step]) as model:
                    session = await Session.open(
                        store, session_id, kind=NOTE, provider=model, tools=TOOLS, document="", model="m",
                        signer=APP_KEY, witness=None,
                    )  # fmt: skip
                    async with session, trio.open_nursery() as nursery:
                        nursery.start_soon(session.send, request)
                        async with contextlib.aclosing(session.states()) as states:
                            async for state in states:
                                if session.busy and state.phase is Phase.AWAITING_APPROVAL:
                                    break
                        await session.suspend()
            finally:
                await store.close()

        trio.run(make)

    def decisions(self, session_id: str) -> list[Any]:
        async def read() -> list[Any]:
            store = open_store(self.target)
            try:
                return list(await store.decisions(session_id))
            finally:
                await store.close()

        return trio.run(read)

    def runs(self) -> list[str]:
        return runs(self.folder)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    _need_browser()
    folder = tmp_path_factory.mktemp(f"e2e-{request.param}")
    if request.param == "postgres":
        target = _fresh_database(request.getfixturevalue("postgres_url"))
    else:
        target = str(folder / "journal.db")

    async def schema() -> None:  # made once, before two processes would race to make it
        store = open_store(target)
        try:
            await store.heads()
        finally:
            await store.close()

    trio.run(schema)
    APP_KEY.save(folder / "app-key")
    keys = folder / "keys"
    keys.write_text(f"{APP_KEY.key_id} {APP_KEY.public_key_text}\n")
    people = reviewers_file(folder)
    with serve_process(target, people.path, keys, folder / "inbox-key", *["--login-link", "ada"] * 8) as served:
        assert served.public_key
        where = Fleet(target, folder, served)
        where.spawn()
        try:
            yield where
        finally:
            where.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def reviewer(browser: Any, fleet: Fleet) -> Iterator[Any]:
    """A browser context logged in as Ada with a one-time link (confirmed with the keyboard)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto(fleet.served.links["ada"].pop())
    page.locator("#confirm").click()
    page.wait_for_url(fleet.served.base + "/")
    page.close()
    yield context
    context.close()


def live(context: Any, url: str) -> Any:
    """A page of ``url`` whose stream of changes is open (so nothing after this is missed), marked to tell a reload."""
    page = context.new_page()
    with page.expect_response(lambda response: response.url.endswith("/events")):
        page.goto(url)
    page.evaluate("window.sameDocument = true")
    return page


def not_reloaded(page: Any) -> None:
    assert page.evaluate("window.sameDocument") is True


def session_page(fleet: Fleet, session_id: str) -> str:
    return f"{fleet.served.base}/session?id={session_id}"


def test_a_card_arrives_is_approved_with_the_keyboard_and_the_worker_runs_it(fleet: Fleet, reviewer: Any) -> None:
    inbox = live(reviewer, fleet.served.base + "/")
    fleet.suspend_in_review("approve-1", ("append_line", {"line": "approve-1 line"}), "Add a line, please.")
    link = inbox.get_by_role("link", name="approve-1")
    link.wait_for()  # arrived without a reload
    not_reloaded(inbox)
    watcher = live(reviewer, session_page(fleet, "approve-1"))  # another tab on the session, open before deciding
    link.focus()
    inbox.keyboard.press("Enter")
    inbox.wait_for_url("**/session?id=approve-1")
    for _ in range(40):  # Tab to the card's Approve button, and press Enter
        inbox.keyboard.press("Tab")
        if inbox.evaluate("document.activeElement.id") == "approve-0":
            break
    else:
        raise AssertionError("Tab never reached the Approve button")
    inbox.keyboard.press("Enter")
    inbox.wait_for_url("**/session?id=approve-1")
    _wait(lambda: fleet.runs().count("approve-1 line") == 1, "the worker to run the tool")
    state = watcher.locator(".last-turn .turn-state")
    state.filter(has_text="The turn went on and ended: completed.").wait_for()
    assert watcher.locator(".model-last").inner_text() == "Done."
    assert "append_line: succeeded" in watcher.locator(".turn-calls").inner_text()
    not_reloaded(watcher)
    inbox.goto(fleet.served.base + "/")
    assert inbox.get_by_role("link", name="approve-1").count() == 0  # the card left the list
    assert [r.status for r in fleet.decisions("approve-1")] == ["applied"]
    assert fleet.runs().count("approve-1 line") == 1


def test_a_denial_reaches_the_model_and_its_answer_the_page(fleet: Fleet, reviewer: Any) -> None:
    fleet.suspend_in_review("deny-1", ("append_line", {"line": "deny-1 line"}), "Add a line.")
    inbox = live(reviewer, fleet.served.base + "/")
    watcher = live(reviewer, session_page(fleet, "deny-1"))
    page = reviewer.new_page()
    page.goto(session_page(fleet, "deny-1"))
    page.get_by_label("Reason for denying").fill("Not <b>this</b> week.")
    page.get_by_role("button", name="Deny").click()
    page.wait_for_url("**/session?id=deny-1")
    said = watcher.locator(".model-last").filter(has_text="Understood, I will not:")
    said.wait_for()
    # The model read the reason as quoted untrusted text (its markup escaped), and the page shows its answer as text.
    answer = said.inner_text()
    assert answer.startswith("Understood, I will not: Not ") and answer.endswith("week.") and "this" in answer
    assert watcher.locator(".model-last b").count() == 0
    assert "append_line: denied: Not <b>this</b> week." in watcher.locator(".turn-calls").inner_text()
    assert "completed" in watcher.locator(".turn-state").inner_text()
    inbox.get_by_role("link", name="deny-1").wait_for(state="detached")  # left the list, live
    not_reloaded(watcher)
    not_reloaded(inbox)
    page.reload()  # the page as the server renders it says the same
    assert page.locator(".model-last").inner_text() == answer
    assert "deny-1 line" not in fleet.runs()


def test_without_a_login_nothing_is_shown_or_decided(fleet: Fleet, browser: Any, reviewer: Any) -> None:
    fleet.suspend_in_review("nologin-1", ("append_line", {"line": "nologin-1 line"}), "Add a line.")
    page = reviewer.new_page()
    page.goto(session_page(fleet, "nologin-1"))
    approve = page.locator("#card-0 form.approve")
    fields = dict(approve.evaluate("f => Array.from(new FormData(f).entries())"))
    stranger = browser.new_context()
    try:
        answer = stranger.new_page().goto(fleet.served.base + "/")
        assert answer is not None and answer.status == 401
        other = stranger.pages[0]
        assert other.get_by_role("link", name="Log in").is_visible()
        assert other.get_by_role("link", name="nologin-1").count() == 0
        # The form a logged-in page holds, posted from the inbox's own origin, but without the login.
        posted = stranger.request.post(
            fleet.served.base + "/decide", form=fields, headers={"origin": fleet.served.base}, max_redirects=0
        )
        assert posted.status == 401, posted.text()
        assert "Log in" in posted.text()
    finally:
        stranger.close()
    assert fleet.decisions("nologin-1") == []
    page.reload()
    assert "Waiting for a decision." in page.locator("#card-0 .status").inner_text()


def test_a_worker_killed_mid_tool_is_replaced_and_the_turn_finishes(fleet: Fleet, reviewer: Any) -> None:
    fleet.suspend_in_review("kill-1", ("block", {"tag": "kill-1"}), "Start the long job.")
    watcher = live(reviewer, session_page(fleet, "kill-1"))
    page = reviewer.new_page()
    page.goto(session_page(fleet, "kill-1"))
    page.get_by_role("button", name="Approve", exact=True).click()
    page.wait_for_url("**/session?id=kill-1")
    _wait(lambda: "started kill-1" in fleet.runs(), "the worker to start the tool")
    watcher.locator(".turn-state").filter(has_text="The turn is going on.").wait_for()
    (running,) = [w for w in fleet.workers if w.poll() is None]
    running.send_signal(signal.SIGKILL)
    running.wait(timeout=10)
    fleet.spawn()
    state = watcher.locator(".last-turn .turn-state")
    state.filter(has_text="The turn went on and ended: completed.").wait_for()
    calls = watcher.locator(".turn-calls").inner_text()
    assert "block: failed: Interrupted: the session stopped while this call was running." in calls
    assert watcher.locator(".model-last").inner_text() == "Done."
    not_reloaded(watcher)
    assert fleet.runs().count("started kill-1") == 1  # never a second time
