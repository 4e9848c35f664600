"""The inbox in a real browser (Playwright driving the system's Chromium): log in with a one-time link, decide with
the keyboard and the mouse, two reviewers racing for one card, a hostile card that runs nothing, and live updates.

Skipped without /usr/bin/chromium, unless ``TRIOLOOP_REQUIRE_BROWSER=1`` (then a failure). With
``TRIOLOOP_SCREENSHOTS=1`` it saves docs/inbox-list.png and docs/inbox-card.png.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from playwright.sync_api import expect
from web_support import ROOT, Served, reviewers_file, serve_process, waiting_session

from trioloop.durable.signing import JournalSigner
from trioloop.stores import SQLiteJournalStore

CHROMIUM = "/usr/bin/chromium"
HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>\u202eevil\u2066'


def _need_browser() -> None:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("TRIOLOOP_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TRIOLOOP_REQUIRE_BROWSER=1 but there is no {CHROMIUM}")
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package); TRIOLOOP_REQUIRE_BROWSER=1 fails instead")


class Setup:
    def __init__(self, folder: Path) -> None:
        self.journal = folder / "journal.db"
        self.key = JournalSigner.generate()

    def add(self, session_id: str, calls: Any = None, **given: Any) -> None:
        async def make() -> None:
            async with SQLiteJournalStore(self.journal) as store:
                if calls is None:
                    await waiting_session(store, session_id, self.key, **given)
                else:
                    await waiting_session(store, session_id, self.key, calls, **given)

        trio.run(make)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Setup]]:
    _need_browser()
    folder = tmp_path_factory.mktemp("inbox")
    setup = Setup(folder)
    setup.add("payments/refund-policy", request="Note that refunds need a second approver.")
    setup.add(
        "notes",
        [("append_line", {"line": "- renew the passport"}), ("erase_notes", {"why": "start over"})],
        text="I will add the line. Erasing first keeps the list short.",
    )
    for session_id in ("deny-me", "edit-me", "race"):
        setup.add(session_id)
    setup.add("hostile", [("append_line", {"line": HOSTILE})], request=HOSTILE, text=HOSTILE)
    keys = folder / "keys"
    keys.write_text(f"{setup.key.key_id} {setup.key.public_key_text}\n")
    people = reviewers_file(folder)
    links = ["--login-link", "ada"] * 5 + ["--login-link", "bob"] * 3
    with serve_process(str(setup.journal), people.path, keys, folder / "inbox-key", *links) as served:
        yield served, setup


@pytest.fixture(scope="module")
def browser(server: Any) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def logged_in(browser: Any, served: Served, reviewer: str, *, live: bool = True) -> Any:
    """A page of a new browser context, logged in with a one-time link (confirmed with the keyboard)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    if not live:  # a page that hears of nothing: stays as it was loaded (a stale tab)
        page.route("**/events", lambda route: route.abort())
    page.goto(served.links[reviewer].pop())
    assert page.locator("#confirm").evaluate("el => el === document.activeElement")
    page.keyboard.press("Enter")
    page.wait_for_url(served.base + "/")
    return page


def tab_to(page: Any, element_id: str, limit: int = 40) -> list[str]:
    seen = []
    for _ in range(limit):
        page.keyboard.press("Tab")
        focused = page.evaluate("document.activeElement.id || document.activeElement.tagName")
        seen.append(focused)
        if focused == element_id:
            return seen
    raise AssertionError(f"Tab never reached #{element_id}: {seen}")


def test_approve_with_the_keyboard_only(browser: Any, server: Any) -> None:
    served, _ = server
    page = logged_in(browser, served, "ada")
    assert page.get_by_role("link", name="notes").is_visible()
    if os.environ.get("TRIOLOOP_SCREENSHOTS") == "1":
        page.screenshot(path=str(ROOT / "docs" / "inbox-list.png"))
    page.get_by_role("link", name="notes").focus()
    page.keyboard.press("Enter")
    page.wait_for_url("**/session?id=notes")
    assert page.get_by_text("DESTRUCTIVE").first.is_visible()
    if os.environ.get("TRIOLOOP_SCREENSHOTS") == "1":
        page.screenshot(path=str(ROOT / "docs" / "inbox-card.png"), full_page=True)
    order = tab_to(page, "approve-0")
    assert order.index("approve-always-0") < order.index("approve-0")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"  # the focus is visible
    page.keyboard.press("Enter")  # the form posts; the page comes back (PRG) with the card's new status
    expect(page.locator("#card-0 .status")).to_contain_text("approved by Ada (ada): waiting for the session's process")
    assert page.get_by_role("status").first.is_visible()
    page.context.close()


def test_deny_with_a_reason_and_edit_an_input(browser: Any, server: Any) -> None:
    served, _ = server
    page = logged_in(browser, served, "bob")
    page.goto(served.base + "/session?id=deny-me")
    page.get_by_label("Reason for denying").fill("Not this week.")
    page.get_by_role("button", name="Deny").click()
    page.wait_for_load_state()
    expect(page.locator("#card-0 .status")).to_contain_text("denied by Bob (bob): waiting for the session's process")
    page.goto(served.base + "/session?id=edit-me")
    page.get_by_text("Edit the input, then approve").click()
    page.get_by_label("The whole input, as a JSON object").fill("{not json")
    page.get_by_role("button", name="Approve with this input").click()
    expect(page.locator(".message")).to_contain_text("not valid JSON")
    page.go_back()
    page.get_by_text("Edit the input, then approve").click()
    page.get_by_label("The whole input, as a JSON object").fill('{"line": "- renew it in May"}')
    page.get_by_role("button", name="Approve with this input").click()
    page.wait_for_load_state()
    edited = "approved with an edited input by Bob (bob): waiting for the session's process"
    expect(page.locator("#card-0 .status")).to_contain_text(edited)
    page.context.close()


def test_two_reviewers_on_one_card(browser: Any, server: Any) -> None:
    served, _ = server
    ada = logged_in(browser, served, "ada", live=False)
    bob = logged_in(browser, served, "bob", live=False)
    for page in (ada, bob):
        page.goto(served.base + "/session?id=race")
    ada.get_by_role("button", name="Approve", exact=True).click()
    expect(ada.locator("#card-0 .status")).to_contain_text("approved by Ada (ada)")  # posted before Bob clicks
    bob.get_by_role("button", name="Approve", exact=True).click()
    bob.wait_for_load_state()
    expect(bob.locator(".message")).to_contain_text("Ada decided first: approved.")
    expect(ada.locator("#card-0 .status")).to_contain_text("approved by Ada (ada)")
    ada.context.close()
    bob.context.close()


def test_a_hostile_card_runs_nothing(browser: Any, server: Any) -> None:
    served, _ = server
    page = logged_in(browser, served, "ada")
    dialogs: list[str] = []
    errors: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(served.base + "/session?id=hostile")
    page.wait_for_timeout(300)
    assert dialogs == [] and errors == []
    assert page.locator("img").count() == 0 and page.locator("script:not([src])").count() == 0
    assert "⟨U+202E⟩evil⟨U+2066⟩" in page.locator(".context .untrusted").first.inner_text()  # the request
    assert "\u202e" not in page.locator("body").inner_text() and "\u2066" not in page.locator("body").inner_text()
    assert "<script>alert(1)</script>" in page.locator("#card-0 dd").inner_text()  # shown as text
    page.context.close()


def test_a_new_review_appears_without_reload(browser: Any, server: Any) -> None:
    served, setup = server
    page = logged_in(browser, served, "ada")
    page.evaluate("window.sameDocument = true")
    page.wait_for_timeout(300)  # the stream is open
    setup.add("arrived-later", request="A card that came while the page was open.")
    page.get_by_role("link", name="arrived-later").wait_for(timeout=5000)
    assert page.evaluate("window.sameDocument") is True
    page.context.close()
