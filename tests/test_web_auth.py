"""Who may decide in the inbox: logins (token, one-time link), cookies, CSRF, origins, the rate limit, headers."""

from __future__ import annotations

import argparse
import io
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from web_support import BASE, Env, card_form, inbox_env, reviewers_file

from trioloop.stores import SQLiteJournalStore
from trioloop.web.app import SECURITY_HEADERS
from trioloop.web.reviewers import FailedLogins, LoginLinks, LoginSessions, ReviewerError, load_reviewers
from trioloop.web.serve import add_serve_arguments, run_serve

ORIGIN = {"origin": BASE}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with SQLiteJournalStore(tmp_path / "journal.db") as store, inbox_env(store, tmp_path) as made:
        yield made


async def approve_form(env: Env, client: httpx.AsyncClient) -> dict[str, str]:
    html = (await client.get("/session", params={"id": "notes"})).text
    return card_form(html, "c1", "approve").data()


async def test_no_login_no_page_and_no_decision(env: Env) -> None:
    ada = await env.login()
    data = await approve_form(env, ada)
    anonymous = env.client()
    for answer in (await anonymous.get("/"), await anonymous.get("/session", params={"id": "notes"})):
        assert answer.status_code == 401 and 'href="/login"' in answer.text
    answer = await anonymous.post("/decide", data=data, headers=ORIGIN)
    assert answer.status_code == 401 and "not logged in" in answer.text
    assert await env.box() == []


async def test_csrf_and_origin_are_checked_on_every_post(env: Env) -> None:
    client = await env.login()
    data = await approve_form(env, client)
    refused = [
        await client.post("/decide", data={**data, "csrf": "x" * 43}, headers=ORIGIN),
        await client.post("/decide", data={k: v for k, v in data.items() if k != "csrf"}, headers=ORIGIN),
        await client.post("/decide", data=data, headers={"origin": "http://evil.test"}),
        await client.post("/decide", data=data, headers={"origin": "null"}),
        await client.post("/decide", data=data),  # neither Origin nor Referer
        await client.post("/decide", data=data, headers={"referer": "http://evil.test/x"}),
        await client.post("/decide", data=data, headers={**ORIGIN, "sec-fetch-site": "cross-site"}),
        await client.post("/batch", data={**data, "card": "c1", "call": "c1", "csrf": "no"}, headers=ORIGIN),
        await client.post("/logout", data={"csrf": "no"}, headers=ORIGIN),
    ]
    assert [answer.status_code for answer in refused] == [403] * len(refused)
    assert await env.box() == []
    answer = await client.post("/decide", data=data, headers={"referer": f"{BASE}/session?id=notes"})
    assert answer.status_code == 303 and len(await env.box()) == 1


async def test_token_login_and_its_rate_limit(env: Env) -> None:
    client = env.client()
    for _ in range(5):
        answer = await client.post("/login", data={"token": "wrong"}, headers=ORIGIN)
        assert answer.status_code == 401
    answer = await client.post("/login", data={"token": env.people.tokens["ada"]}, headers=ORIGIN)
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) > 0
    other = httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app, client=("10.0.0.2", 1)), base_url=BASE)
    answer = await other.post("/login", data={"token": env.people.tokens["ada"]}, headers=ORIGIN)
    assert answer.status_code == 303
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie and "Secure" not in cookie
    assert (await other.get("/")).status_code == 200
    assert (await other.post("/login", data={"token": "x"})).status_code == 403  # no origin: not even counted


async def test_a_one_time_link_logs_in_once_and_only_by_post(env: Env) -> None:
    client = env.client()
    token = env.app.links.issue("bob")
    for _ in range(2):  # a prefetcher's GET logs nobody in and spends nothing
        answer = await client.get(f"/login/link/{token}")
        assert answer.status_code == 200 and "Log in as Bob" in answer.text and "set-cookie" not in answer.headers
    assert (await client.get("/")).status_code == 401
    answer = await client.post("/login/link", data={"token": token}, headers=ORIGIN)
    assert answer.status_code == 303 and (await client.get("/")).status_code == 200
    again = env.client()
    answer = await again.post("/login/link", data={"token": token}, headers=ORIGIN)
    assert answer.status_code == 401 and "used already" in answer.text
    assert "used already" in (await again.get(f"/login/link/{token}")).text


async def test_logout_ends_the_login(env: Env) -> None:
    client = await env.login()
    html = (await client.get("/")).text
    csrf = html.split('name="csrf" value="')[1].split('"')[0]
    answer = await client.post("/logout", data={"csrf": csrf}, headers=ORIGIN)
    assert answer.status_code == 303 and (await client.get("/")).status_code == 401


async def test_every_response_carries_the_security_headers(env: Env) -> None:
    client = await env.login()
    answers = [
        await client.get("/"),
        await client.get("/session", params={"id": "notes"}),
        await client.get("/fragment/list"),
        await client.get("/login"),
        await client.get("/static/inbox.js"),
        await client.get("/static/inbox.css"),
        await client.get("/nowhere"),
        await env.client().get("/"),
        await client.post("/decide", data={}, headers={"origin": "http://evil.test"}),
        await client.get("/", headers={"host": "evil.test"}),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 200, 200, 404, 401, 403, 400]
    for answer in answers:
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "same-origin"
        assert answer.headers["cache-control"] == ("no-cache" if "static" in str(answer.url) else "no-store")
    assert SECURITY_HEADERS["content-security-policy"] == CSP
    for answer in answers[:4]:
        assert "<script>" not in answer.text and "style=" not in answer.text and "<style" not in answer.text
        assert not re.search(r"\son[a-z]+\s*=", answer.text)  # no inline event handler


async def test_secure_cookies_over_tls(tmp_path: Path) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db") as store, inbox_env(store, tmp_path, secure_cookies=True) as env:
        token = env.app.links.issue("ada")
        answer = await env.client().post("/login/link", data={"token": token}, headers=ORIGIN)
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith("__Host-trioloop-inbox=") and "Secure" in cookie and "HttpOnly" in cookie


def test_links_expire_and_logins_end_when_idle(tmp_path: Path) -> None:
    now = [0.0]
    reviewers = load_reviewers(reviewers_file(tmp_path).path)
    links = LoginLinks(reviewers, clock=lambda: now[0])
    token = links.issue("ada")
    now[0] = 15 * 60 + 1
    assert links.consume(token) is None
    with pytest.raises(ReviewerError):
        links.issue("nobody")
    logins = LoginSessions(idle_s=60, clock=lambda: now[0])
    cookie, login = logins.create(reviewers.get("ada"))  # type: ignore[arg-type]
    now[0] += 59
    assert logins.get(cookie) is login
    now[0] += 61
    assert logins.get(cookie) is None
    failed = FailedLogins(limit=2, window_s=10, clock=lambda: now[0])
    failed.failed("a")
    failed.failed("a")
    assert failed.retry_after("a") == 11
    now[0] += 10
    assert failed.retry_after("a") is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "names no reviewer"),
        ('[[reviewer]]\nid = "a"\ntoken_sha256 = "abc"\n', "64 hex digits"),
        ('[[reviewer]]\nname = "A"\ntoken_sha256 = "' + "0" * 64 + '"\n', "id must be text"),
        ("[[reviewer]\n", "not TOML"),
        ('[[reviewer]]\nid = "a"\ntoken_sha256 = "' + "0" * 64 + '"\n' * 2, "not TOML"),
    ],
)
def test_a_bad_reviewers_file_is_refused(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "reviewers.toml"
    path.write_text(text)
    with pytest.raises(ReviewerError, match=said):
        load_reviewers(path)


async def test_serve_refuses_plain_http_off_loopback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    people = reviewers_file(tmp_path)
    args = parser.parse_args([str(tmp_path / "j.db"), "--reviewers", str(people.path), "--host", "0.0.0.0"])
    assert await run_serve(args, out=io.StringIO()) == 2
    assert "refusing to serve 0.0.0.0 over plain HTTP" in capsys.readouterr().err
