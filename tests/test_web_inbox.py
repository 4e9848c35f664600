"""The review inbox (trioloop.web) over real journals: what it lists and shows, and the decisions it posts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)
from web_support import BASE, Env, card_form, copy_session, forms, inbox_env, serve_process, waiting_session

from trioloop.durable.decisions import open_decision
from trioloop.durable.signing import JournalSigner
from trioloop.stores import PostgresJournalStore, SQLiteJournalStore
from trioloop.web.events import ChangeHub
from trioloop.web.inbox import Inbox

ORIGIN = {"origin": BASE}


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with SQLiteJournalStore(tmp_path / "journal.db") as store, inbox_env(store, tmp_path) as made:
        yield made


async def page(client: httpx.AsyncClient, session_id: str = "notes") -> str:
    answer = await client.get("/session", params={"id": session_id})
    assert answer.status_code == 200, answer.text
    return answer.text


def opened(env: Env, record: Any) -> Any:
    decision, key_id = open_decision(record.data, env.inbox_key.keys)
    assert key_id == env.inbox_key.key_id
    return decision


async def test_the_list_shows_the_waiting_review(env: Env) -> None:
    client = await env.login()
    answer = await client.get("/")
    assert answer.status_code == 200
    assert 'href="/session?id=notes"' in answer.text
    assert "append_line" in answer.text and "Remind me to renew my passport." in answer.text
    assert "1 waiting" in answer.text


async def test_the_card_page_shows_what_the_digest_covers(env: Env) -> None:
    client = await env.login()
    html = await page(client)
    review = await env.app.inbox.current("notes")
    card = review.view.cards[0]
    assert "<dt>line</dt>" in html and "- renew the passport" in html
    assert card.digest[:12] in html and "(mutate)" in html
    assert "I will add it." in html and "Remind me to renew my passport." in html
    assert "Waiting for a decision." in html
    assert "always approve this tool" in html and "always approve this exact input" in html
    form = card_form(html, "c1", "edit")
    assert '"line": "- renew the passport"' in form.get("edited_input")


async def test_approving_posts_one_signed_record_and_redirects(env: Env) -> None:
    client = await env.login()
    form = card_form(await page(client), "c1", "approve")
    answer = await client.post("/decide", data=form.data(always="tool"), headers=ORIGIN)
    assert answer.status_code == 303 and answer.headers["location"] == "/session?id=notes"
    (record,) = await env.box()
    decision = opened(env, record)
    review = await env.app.inbox.current("notes")
    assert (decision.session_id, decision.turn_id, decision.call_id) == ("notes", review.view.turn_id, "c1")
    assert decision.digest == review.view.cards[0].digest
    assert (decision.action, decision.always, decision.reviewer, decision.reviewer_name) == (
        "approve",
        "tool",
        "ada",
        "Ada",
    )
    html = await page(client)
    assert "Approved by Ada (ada): waiting for the session&#39;s process." in html  # the flash, once
    assert "Posted: approved by Ada (ada): waiting for the session's process." in html  # the card's status
    assert not forms(html, "/decide")  # nothing more to decide on it
    assert "Approved by Ada" not in await page(client)
    await env.store.answer_decision(record.id, "refused", "the <card> moved on")
    html = await page(client)
    assert "refused: the &lt;card&gt; moved on" in html and forms(html, "/decide")  # free again


async def test_denying_and_editing(env: Env) -> None:
    client = await env.login()
    deny = card_form(await page(client), "c1", "deny")
    answer = await client.post("/decide", data=deny.data(reason="not today", always="tool"), headers=ORIGIN)
    assert answer.status_code == 303
    (record,) = await env.box()
    decision = opened(env, record)
    assert (decision.action, decision.reason, decision.always, decision.edited_input) == (
        "deny",
        "not today",
        "tool",
        None,
    )
    await env.store.answer_decision(record.id, "refused", "test")
    edit = card_form(await page(client), "c1", "edit")
    for bad, why in (('{"line": ', "not valid JSON"), ('["a list"]', "must be a JSON object")):
        answer = await client.post("/decide", data=edit.data(edited_input=bad), headers=ORIGIN)
        assert answer.status_code == 400 and why in answer.text
    assert len(await env.box()) == 1
    answer = await client.post("/decide", data=edit.data(edited_input='{"line": "- renew it <soon>"}'), headers=ORIGIN)
    assert answer.status_code == 303
    decision = opened(env, (await env.box())[-1])
    assert decision.edited_input == {"line": "- renew it <soon>"} and decision.action == "approve"


async def test_a_stale_page_decides_nothing(env: Env) -> None:
    client = await env.login()
    form = card_form(await page(client), "c1", "approve")
    for field, value, said in (
        ("digest", "0" * 64, "its input is not the one the page showed"),
        ("turn_id", "turn-9", "on another turn now"),
        ("call_id", "c9", "not in the review that waits now"),
    ):
        answer = await client.post("/decide", data=form.data(**{field: value}), headers=ORIGIN)
        assert answer.status_code == 409 and "The card changed" in answer.text and said in answer.text
    assert await env.box() == []


async def test_a_card_decided_meanwhile_is_refused(tmp_path: Path) -> None:
    calls = [("append_line", {"line": "one"}), ("append_line", {"line": "two"})]
    async with SQLiteJournalStore(tmp_path / "j.db") as store, inbox_env(store, tmp_path, session=False) as env:
        await waiting_session(store, "early", env.journal_key, calls)
        client = await env.login()
        stale = card_form(await page(client, "early"), "c1", "approve")
        await waiting_session(store, "notes", env.journal_key, calls, approve=["c1"])
        data = card_form(await page(client), "c2", "approve").data(call_id="c1")
        data["digest"] = (await env.app.inbox.current("notes")).card("c1").digest
        answer = await client.post("/decide", data=data, headers=ORIGIN)
        assert answer.status_code == 409 and "This card was approved by carol meanwhile." in answer.text
        assert stale.get("digest") == data["digest"]  # the same card, decided in the journal since
        assert await env.box() == []


async def test_two_reviewers_one_card_exactly_one_wins(env: Env) -> None:
    ada, bob = await env.login("ada"), await env.login("bob")
    ada_form = card_form(await page(ada), "c1", "approve")
    bob_form = card_form(await page(bob), "c1", "deny")
    answers: dict[str, httpx.Response] = {}

    async def post(name: str, client: httpx.AsyncClient, data: dict[str, Any]) -> None:
        answers[name] = await client.post("/decide", data=data, headers=ORIGIN)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(post, "ada", ada, ada_form.data())
        nursery.start_soon(post, "bob", bob, bob_form.data(reason="no"))
    assert sorted(a.status_code for a in answers.values()) == [303, 409]
    (record,) = await env.box()
    winner = opened(env, record)
    loser = answers["bob" if winner.reviewer == "ada" else "ada"]
    said = "Ada decided first: approved" if winner.reviewer == "ada" else "Bob decided first: denied"
    assert said in loser.text


async def test_batch_approves_the_chosen_non_destructive_cards(tmp_path: Path) -> None:
    calls = [
        ("append_line", {"line": "one"}),
        ("append_line", {"line": "two"}),
        ("erase_notes", {"why": "clean slate"}),
    ]
    async with SQLiteJournalStore(tmp_path / "j.db") as store, inbox_env(store, tmp_path, session=False) as env:
        await waiting_session(store, "notes", env.journal_key, calls)
        client = await env.login()
        html = await page(client)
        assert "DESTRUCTIVE" in html and "always approve" not in html.split('id="card-2"')[1]
        (batch,) = forms(html, "/batch")
        assert batch.options["card"] == ["c1", "c2"]  # the destructive card is never offered
        forged = batch.data()
        forged["card"] = ["c1", "c3"]
        forged["call"], forged["digest"] = (
            [*forged["call"], "c3"],
            [*forged["digest"], card_form(html, "c3", "deny").get("digest")],
        )
        answer = await client.post("/batch", data=forged, headers=ORIGIN)
        assert answer.status_code == 400 and "never approved in a batch" in answer.text
        assert await env.box() == []
        chosen = batch.data()
        chosen["card"] = ["c1", "c2"]
        answer = await client.post("/batch", data=chosen, headers=ORIGIN)
        assert answer.status_code == 303
        decided = [opened(env, record) for record in await env.box()]
        assert [(d.call_id, d.action) for d in decided] == [("c1", "approve"), ("c2", "approve")]
        destructive = card_form(await page(client), "c3", "approve")
        answer = await client.post("/decide", data=destructive.data(always="tool"), headers=ORIGIN)
        assert answer.status_code == 400 and "not offered" in answer.text


HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>\u202eevil\u2066 ok\x1b[2J'


async def test_hostile_content_is_escaped_made_visible_and_bounded(tmp_path: Path) -> None:
    calls = [("append_line", {"line": HOSTILE}), ("append_line", {"line": "x" * 1_000_000})]
    async with SQLiteJournalStore(tmp_path / "j.db") as store, inbox_env(store, tmp_path, session=False) as env:
        await waiting_session(store, "notes", env.journal_key, calls, request=HOSTILE, text=HOSTILE)
        client = await env.login()
        for answer in (await client.get("/session", params={"id": "notes"}), await client.get("/")):
            html = answer.text
            assert answer.status_code == 200
            assert "<script>alert" not in html and "<img src=x" not in html
            assert "\u202e" not in html and "\u2066" not in html and "\x1b" not in html
        html = (await client.get("/session", params={"id": "notes"})).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "⟨U+202E⟩evil⟨U+2066⟩ ok⟨U+001B⟩[2J" in html
        assert "more characters" in html
        assert len(html.encode()) < 200_000


async def test_a_journal_that_does_not_verify_is_listed_as_refused(env: Env) -> None:
    stranger = JournalSigner.generate()
    await copy_session(env.store, "notes", "<b>forged</b>", stranger)
    client = await env.login()
    html = (await client.get("/")).text
    assert "&lt;b&gt;forged&lt;/b&gt;" in html and "<b>forged" not in html
    assert "refused: journal entry" in html and "not among the keys given" in html
    html = await page(client, "<b>forged</b>")
    assert "refused:" in html and not forms(html, "/decide")


async def test_filters(env: Env) -> None:
    await copy_session(env.store, "notes", "other-session", env.journal_key)
    client = await env.login()
    assert "other-session" in (await client.get("/", params={"q": "other"})).text
    assert "other-session" not in (await client.get("/", params={"q": "zzz"})).text
    assert "other-session" in (await client.get("/", params={"tool": "append_line", "kind": "notes"})).text
    assert "Nothing waits" in (await client.get("/", params={"tool": "erase_notes"})).text
    assert "Nothing waits" in (await client.get("/", params={"kind": "spreadsheet"})).text


class CountingStore:
    def __init__(self, store: Any) -> None:
        self.store, self.reads = store, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def read(self, session_id: str) -> Any:
        self.reads += 1
        return await self.store.read(session_id)


async def test_a_thousand_waiting_sessions_are_read_once_then_listed_from_the_cache(tmp_path: Path, env: Env) -> None:
    # How fast the page is with 1,000 waiting sessions is benchmarks/inbox.py's (--page); this is what makes it so.
    async with SQLiteJournalStore(tmp_path / "many.db", durable=False) as store:
        await waiting_session(store, "s0000", env.journal_key)
        for n in range(1, 1000):
            await copy_session(store, "s0000", f"s{n:04}", env.journal_key)
        counting = CountingStore(store)
        inbox = Inbox(counting, env.journal_key.keys, env.inbox_key.keys)
        assert len(await inbox.reviews()) == 1000 and counting.reads == 1000
        listed = await inbox.reviews()
        assert len(listed) == 1000 and counting.reads == 1000  # nothing read again: every journal's head is the same
        await copy_session(store, "s0000", "s1000", env.journal_key)
        assert len(await inbox.reviews()) == 1001 and counting.reads == 1001  # only the new one read


async def test_the_hub_tells_listeners_what_changed(env: Env) -> None:
    hub = ChangeHub(env.app.inbox, poll_s=0.01)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hub.run)
        with hub.listen() as listener:
            await copy_session(env.store, "notes", "arrived", env.journal_key)
            with trio.fail_after(5):
                change = await listener.next()
                while change is not None and "arrived" not in change[0]:
                    change = await listener.next()
            assert change == (["arrived"], False)
            hub.close()
            assert await listener.next() is None
        nursery.cancel_scope.cancel()


async def test_postgres(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url: str = request.getfixturevalue("postgres_url")
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS trioloop_journal")
        admin.execute("DROP TABLE IF EXISTS trioloop_decisions")
    async with PostgresJournalStore(url) as store, inbox_env(store, tmp_path) as env:
        client = await env.login()
        assert 'href="/session?id=notes"' in (await client.get("/")).text
        form = card_form(await page(client), "c1", "approve")
        assert (await client.post("/decide", data=form.data(), headers=ORIGIN)).status_code == 303
        (record,) = await env.box()
        assert opened(env, record).reviewer == "ada"


def test_trioloop_serve_as_a_process(tmp_path: Path) -> None:
    journal_key = JournalSigner.generate()
    journal = tmp_path / "journal.db"

    async def make() -> None:
        async with SQLiteJournalStore(journal) as store:
            await waiting_session(store, "notes", journal_key)

    trio.run(make)
    keys = tmp_path / "keys"
    keys.write_text(f"{journal_key.key_id} {journal_key.public_key_text}\n")
    from web_support import reviewers_file

    people = reviewers_file(tmp_path)
    with serve_process(str(journal), people.path, keys, tmp_path / "inbox-key") as served:
        assert served.public_key.endswith(JournalSigner.load(tmp_path / "inbox-key").public_key_text)
        with httpx.Client(base_url=served.base, timeout=10) as client:
            link = served.links["bob"][0]
            confirm = client.get(link)
            assert confirm.status_code == 200 and "Log in as Bob" in confirm.text
            assert "content-security-policy" in confirm.headers
            token = link.rsplit("/", 1)[1]
            answer = client.post("/login/link", data={"token": token}, headers={"origin": served.base})
            assert answer.status_code == 303
            assert 'href="/session?id=notes"' in client.get("/").text
            with client.stream("GET", "/events") as events:
                assert events.headers["content-type"].startswith("text/event-stream")
                assert next(events.iter_text()).startswith("retry:")
        served.process.terminate()
        assert served.process.wait(timeout=10) == 0
