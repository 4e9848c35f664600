"""The inbox's web app (Starlette): the pages, the login, the decision forms, the live-update stream, and the
headers every response carries.

Every POST is checked in the same order before anything is read or written: its origin (`origin_refusal`: 403), a
live login (401), a bounded form (413, 415), the login's CSRF token (403). A decision is then checked against the
session's journal as it is now (re-read and verified): a card no longer waiting, or whose turn or digest is not the
one the page showed, decides nothing (409). Only then is it sealed with the server's key and posted to the decision
box, where at most one decision per card holds. Every page is a template with autoescape on; untrusted text reaches
it through `trioloop.web.display`. There is no inline script or style, so the Content-Security-Policy forbids both.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final, final

import attrs
import jinja2
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from trioloop.durable.bounded_json import parse_bounded_json
from trioloop.durable.decisions import DecisionError, ReviewDecision, seal_decision
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.web.events import ChangeHub, TooManyListeners
from trioloop.web.inbox import Inbox, ReviewStore, SessionReview
from trioloop.web.pages import list_context, session_context, session_url, when
from trioloop.web.reviewers import (
    FailedLogins,
    LoginLinks,
    LoginSession,
    LoginSessions,
    Reviewer,
    Reviewers,
    origin_refusal,
)

__all__ = ["SECURITY_HEADERS", "InboxApp", "InboxSettings", "open_inbox"]

HERE: Final = Path(__file__).resolve().parent
SECURITY_HEADERS: Final = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
_FORM_BYTES: Final = 400_000
_EDIT_BYTES: Final = 200_000
_PING_S: Final = 15.0


@final
@attrs.frozen(kw_only=True)
class InboxSettings:
    """How one inbox server runs: who may decide, the key its decisions are sealed with, its own origins (every
    POST must come from one; their hosts are the only ``Host`` headers served), cookies marked ``Secure`` (TLS)."""

    reviewers: Reviewers
    signer: JournalSigner
    origins: frozenset[str]
    secure_cookies: bool = False
    idle_s: float = 8 * 3600
    max_listeners: int = 64
    poll_s: float = 0.1
    #: Other inboxes' keys, so the decisions they posted in a shared store are shown as proven.
    decision_keys: JournalKeys | None = None

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset(urllib.parse.urlsplit(origin).netloc.lower() for origin in self.origins)

    @property
    def cookie(self) -> str:
        return "__Host-trioloop-inbox" if self.secure_cookies else "trioloop-inbox"


class _Refused(Exception):
    def __init__(self, status: int, title: str, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.title, self.message, self.headers = status, title, message, headers or {}


def _first(form: dict[str, list[str]], name: str, limit: int = 2000) -> str:
    values = form.get(name) or [""]
    if len(values[0]) > limit:
        raise _Refused(400, "Refused", f"the field {name} is longer than {limit} characters")
    return values[0]


@final
class InboxApp:
    """The ASGI app: the Starlette routes behind the headers every response carries and the ``Host`` check."""

    def __init__(self, inbox: Inbox, hub: ChangeHub, settings: InboxSettings) -> None:
        self.inbox = inbox
        self.hub = hub
        self.settings = settings
        self.links = LoginLinks(settings.reviewers)
        self.logins = LoginSessions(idle_s=settings.idle_s)
        self.failed_logins = FailedLogins()
        self._templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
        )
        self._templates.filters["session_url"] = session_url
        self._templates.filters["when"] = when
        get, post = ["GET"], ["POST"]
        self._app = Starlette(
            routes=[
                Route("/", self._guarded(self.list_page), methods=get),
                Route("/fragment/list", self._guarded(self.list_fragment), methods=get),
                Route("/session", self._guarded(self.session_page), methods=get),
                Route("/fragment/session", self._guarded(self.session_fragment), methods=get),
                Route("/login", self._guarded(self.login_page), methods=get),
                Route("/login", self._guarded(self.login), methods=post),
                Route("/login/link/{token}", self._guarded(self.link_page), methods=get),
                Route("/login/link", self._guarded(self.link_login), methods=post),
                Route("/logout", self._guarded(self.logout), methods=post),
                Route("/decide", self._guarded(self.decide), methods=post),
                Route("/batch", self._guarded(self.batch), methods=post),
                Route("/events", self._guarded(self.events), methods=get),
                Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
            ],
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                return await self._app(scope, receive, send)
            return None
        static = str(scope.get("path", "")).startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                headers.append((b"cache-control", b"no-cache" if static else b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()
        if host not in self.settings.hosts:
            response = Response("This server does not answer for that host name.\n", 400, media_type="text/plain")
            return await response(scope, receive, send_with_headers)
        return await self._app(scope, receive, send_with_headers)

    # -- helpers -------------------------------------------------------------------------------------------------

    def _guarded(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except _Refused as refused:
                return self._message(request, refused.status, refused.title, refused.message, refused.headers)

        return run

    def _render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        login = self._login(request)
        context.setdefault("login", login)
        context.setdefault("flash", [])
        context.setdefault("csrf", login.csrf if login else "")
        body = self._templates.get_template(name).render(**context)
        return HTMLResponse(body, status_code=status)

    def _message(
        self, request: Request, status: int, title: str, message: str, headers: dict[str, str] | None = None
    ) -> HTMLResponse:
        response = self._render(request, "message.html", status, title=title, message=message, back=request.url.path)
        response.headers.update(headers or {})
        return response

    def _login(self, request: Request) -> LoginSession | None:
        return self.logins.get(request.cookies.get(self.settings.cookie))

    def _require_login(self, request: Request) -> LoginSession:
        login = self._login(request)
        if login is None:
            raise _Refused(401, "Log in first", "You are not logged in (or your login ended). Log in to continue.")
        return login

    async def _form(self, request: Request) -> dict[str, list[str]]:
        refusal = origin_refusal(request.headers, self.settings.origins)
        if refusal is not None:
            raise _Refused(403, "Refused", f"Refused: {refusal}.")
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
            raise _Refused(415, "Refused", "A form is sent as application/x-www-form-urlencoded.")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > _FORM_BYTES:
                raise _Refused(413, "Too large", f"The form is over {_FORM_BYTES} bytes.")
        try:
            return urllib.parse.parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=500)
        except (UnicodeDecodeError, ValueError):
            raise _Refused(400, "Refused", "The form could not be read.") from None

    async def _decision_form(self, request: Request) -> tuple[LoginSession, dict[str, list[str]]]:
        refusal = origin_refusal(request.headers, self.settings.origins)
        if refusal is not None:
            raise _Refused(403, "Refused", f"Refused: {refusal}. Nothing was decided.")
        login = self._require_login(request)
        form = await self._form(request)
        if not login.csrf_matches(_first(form, "csrf", 200)):
            raise _Refused(403, "Refused", "The form's token is not this login's (an old page?). Nothing was decided.")
        return login, form

    def _session_id(self, request: Request) -> str:
        session_id = request.query_params.get("id", "")
        if not session_id or len(session_id) > 1000:
            raise _Refused(404, "Not found", "No such session.")
        return session_id

    def _client(self, request: Request) -> str:
        return request.client.host if request.client else "unknown"

    def _logged_in(self, reviewer: Reviewer) -> Response:
        cookie, login = self.logins.create(reviewer)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            self.settings.cookie,
            cookie,
            httponly=True,
            samesite="strict",
            path="/",
            secure=self.settings.secure_cookies,
        )
        login.flash.append(f"Logged in as {login.reviewer.name} ({login.reviewer.id}).")
        return response

    # -- login ---------------------------------------------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        return self._render(request, "login.html", title="Log in")

    def _check_rate(self, request: Request) -> None:
        wait = self.failed_logins.retry_after(self._client(request))
        if wait is not None:
            message = f"Too many failed logins from your address: try again in {wait} seconds."
            raise _Refused(429, "Too many attempts", message, headers={"retry-after": str(wait)})

    async def login(self, request: Request) -> Response:
        form = await self._form(request)
        self._check_rate(request)
        reviewer = self.settings.reviewers.by_token(_first(form, "token", 500).strip())
        if reviewer is None:
            self.failed_logins.failed(self._client(request))
            raise _Refused(401, "Log in failed", "That token is not a reviewer's.")
        return self._logged_in(reviewer)

    async def link_page(self, request: Request) -> Response:
        token = request.path_params["token"]
        reviewer = self.links.peek(token) if len(token) < 200 else None
        return self._render(request, "link.html", title="Log in", reviewer=reviewer, token=token)

    async def link_login(self, request: Request) -> Response:
        form = await self._form(request)
        self._check_rate(request)
        reviewer = self.links.consume(_first(form, "token", 200))
        if reviewer is None:
            self.failed_logins.failed(self._client(request))
            raise _Refused(401, "Log in failed", "That login link was used already, has expired, or is unknown.")
        return self._logged_in(reviewer)

    async def logout(self, request: Request) -> Response:
        await self._decision_form(request)
        self.logins.end(request.cookies.get(self.settings.cookie))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(self.settings.cookie, path="/")
        return response

    # -- pages ---------------------------------------------------------------------------------------------------

    async def list_page(self, request: Request) -> Response:
        login = self._require_login(request)
        context = await list_context(self.inbox, request.query_params)
        return self._render(request, "list.html", title="Reviews waiting", flash=login.take_flash(), **context)

    async def list_fragment(self, request: Request) -> Response:
        self._require_login(request)
        return self._render(request, "list_region.html", **await list_context(self.inbox, request.query_params))

    async def session_page(self, request: Request) -> Response:
        login = self._require_login(request)
        context = await session_context(self.inbox, self._session_id(request))
        return self._render(request, "session.html", title="Review", flash=login.take_flash(), **context)

    async def session_fragment(self, request: Request) -> Response:
        self._require_login(request)
        return self._render(
            request, "session_region.html", **await session_context(self.inbox, self._session_id(request))
        )

    # -- decisions -----------------------------------------------------------------------------------------------

    async def _fresh(self, session_id: str, turn_id: str, cards: list[tuple[str, str]]) -> SessionReview:
        """The session as its journal says now; `_Refused` (409) unless every (call id, digest) still waits as the
        page showed it."""
        review = await self.inbox.current(session_id)
        if review.refused:
            raise _Refused(409, "Not decided", f"The session's journal was refused: {review.refused}")
        view = review.view
        if view is None:
            raise _Refused(409, "Not decided", "Nothing waits in this session any more: the turn moved on.")
        if view.turn_id != turn_id:
            raise _Refused(409, "Not decided", "The card changed: the session is on another turn now.")
        for call_id, digest in cards:
            card = review.card(call_id)
            if card is None:
                raise _Refused(409, "Not decided", "The card changed: it is not in the review that waits now.")
            if card.digest != digest:
                raise _Refused(409, "Not decided", "The card changed: its input is not the one the page showed.")
            if card.status != "waiting":
                by = f" by {card.decided_by}" if card.decided_by else ""
                raise _Refused(409, "Not decided", f"This card was {card.status}{by} meanwhile.")
        return review

    async def _post(self, login: LoginSession, decision_fields: dict[str, Any]) -> tuple[bool, str]:
        decision = ReviewDecision(
            **decision_fields,
            reviewer=login.reviewer.id,
            reviewer_name=login.reviewer.name,
            at=int(time.time() * 1000),
        )
        raw = seal_decision(decision, self.settings.signer)
        won, record = await self.inbox.store.post_decision(decision.session_id, decision.slot, raw)
        if won:
            return True, f"{decision.describe()}: waiting for the session's process"
        held = self.inbox.shown(record)
        if held.decision is None:
            return False, f"another decision holds this card ({held.describe()})"
        who = held.decision.reviewer_name or held.decision.reviewer
        done = "approved" if held.decision.action == "approve" else "denied"
        return False, f"{who} decided first: {done}"

    async def decide(self, request: Request) -> Response:
        login, form = await self._decision_form(request)
        session_id = _first(form, "session_id", 1000)
        turn_id, call_id, digest = (_first(form, name, 200) for name in ("turn_id", "call_id", "digest"))
        action = _first(form, "action", 20)
        always = _first(form, "always", 20) or None
        if action not in ("approve", "deny", "edit") or always not in (None, "tool", "input"):
            raise _Refused(400, "Refused", "Unknown action. Nothing was decided.")
        edited = None
        if action == "edit":
            text = _first(form, "edited_input", _EDIT_BYTES)
            try:
                edited = parse_bounded_json(
                    text, max_bytes=_EDIT_BYTES, max_depth=64, error=ValueError, subject="the edited input"
                )
            except ValueError as exc:
                message = f"The edited input is not valid JSON: {exc}. Nothing was decided."
                raise _Refused(400, "Not valid JSON", message) from None
            if type(edited) is not dict:
                raise _Refused(400, "Not a JSON object", "The edited input must be a JSON object. Nothing was decided.")
        review = await self._fresh(session_id, turn_id, [(call_id, digest)])
        card = review.card(call_id)
        assert card is not None
        if always is not None and f"{'deny' if action == 'deny' else 'approve'}:{always}" not in card.rule_options:
            raise _Refused(400, "Refused", "That rule option is not offered for this card. Nothing was decided.")
        fields = {
            "session_id": session_id,
            "turn_id": turn_id,
            "call_id": call_id,
            "digest": digest,
            "action": "deny" if action == "deny" else "approve",
            "edited_input": edited,
            "reason": _first(form, "reason", 2000) if action == "deny" else "",
            "always": always if action != "edit" else None,
        }
        try:
            won, said = await self._post(login, fields)
        except DecisionError as exc:
            raise _Refused(400, "Refused", f"{exc}. Nothing was decided.") from None
        if not won:
            raise _Refused(409, "Decided already", said[0].upper() + said[1:] + ".")
        login.flash.append(said[0].upper() + said[1:] + ".")
        return RedirectResponse(session_url(session_id), status_code=303)

    async def batch(self, request: Request) -> Response:
        login, form = await self._decision_form(request)
        session_id, turn_id = _first(form, "session_id", 1000), _first(form, "turn_id", 200)
        digests = dict(zip(form.get("call", []), form.get("digest", []), strict=False))
        chosen = form.get("card", [])
        if not chosen:
            raise _Refused(400, "Nothing chosen", "Choose the cards to approve. Nothing was decided.")
        if any(call_id not in digests for call_id in chosen):
            raise _Refused(400, "Refused", "A chosen card is not on the page. Nothing was decided.")
        review = await self._fresh(session_id, turn_id, [(call_id, digests[call_id]) for call_id in chosen])
        for call_id in chosen:
            card = review.card(call_id)
            if card is not None and card.destructive:
                message = f"A destructive call ({card.tool}) is never approved in a batch. Nothing was decided."
                raise _Refused(400, "Refused", message)
        said = []
        for call_id in dict.fromkeys(chosen):
            fields = {"session_id": session_id, "turn_id": turn_id, "call_id": call_id, "digest": digests[call_id]}
            _, text = await self._post(login, {**fields, "action": "approve"})
            said.append(text)
        login.flash.extend(text[0].upper() + text[1:] + "." for text in said)
        return RedirectResponse(session_url(session_id), status_code=303)

    # -- live updates --------------------------------------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        self._require_login(request)
        if self.hub.full:
            raise _Refused(503, "Busy", "Too many open pages are listening; reload later.")

        async def stream() -> AsyncIterator[str]:
            try:
                with self.hub.listen() as listener:
                    yield "retry: 2000\n\n"
                    while True:
                        change = None
                        with trio.move_on_after(_PING_S):
                            change = await listener.next()
                            if change is None:
                                return
                        if change is None:
                            yield ": ping\n\n"
                            continue
                        sessions, everything = change
                        yield f"event: change\ndata: {json.dumps({'sessions': sessions, 'all': everything})}\n\n"
            except TooManyListeners:
                return

        headers = {"x-accel-buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)


@contextlib.asynccontextmanager
async def open_inbox(store: ReviewStore, keys: JournalKeys, settings: InboxSettings) -> AsyncIterator[InboxApp]:
    """The inbox app over ``store`` (journals verified with ``keys``), with its change-polling task running for as
    long as the block does."""
    decision_keys = settings.signer.keys
    if settings.decision_keys:
        decision_keys = decision_keys | settings.decision_keys
    inbox = Inbox(store, keys, decision_keys)
    hub = ChangeHub(inbox, max_listeners=settings.max_listeners, poll_s=settings.poll_s)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hub.run)
        try:
            yield InboxApp(inbox, hub, settings)
        finally:
            hub.close()
            nursery.cancel_scope.cancel()
