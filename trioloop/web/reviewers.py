"""Who may decide in the inbox: the reviewers file, logins (a token, or a one-time link), the server-side login
sessions behind the cookie, their CSRF tokens, and the rate limit on failed logins.

Nothing here does I/O but `load_reviewers` (read once at start). A reviewer's secret never leaves the reviewer: the
file holds the SHA-256 of each token, and a one-time link is kept only as the hash of its token, for 15 minutes,
spent by its first use. A login session is a random cookie value naming server-side state (the reviewer, a CSRF
token, a flash message); it ends after an idle time. Every comparison of a secret is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import tomllib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final, final

import attrs

__all__ = [
    "LINK_TTL_S",
    "FailedLogins",
    "LoginLinks",
    "LoginSession",
    "LoginSessions",
    "Reviewer",
    "ReviewerError",
    "Reviewers",
    "load_reviewers",
    "origin_refusal",
    "token_hash",
]

#: How long a one-time login link stays valid.
LINK_TTL_S: Final = 15 * 60
_MAX_FILE_BYTES: Final = 256 * 1024
_MAX_LINKS: Final = 1000
_MAX_SESSIONS: Final = 10_000

Clock = Callable[[], float]


class ReviewerError(ValueError):
    """A reviewers file that cannot be used; the message names the file and what is wrong."""


def token_hash(token: str) -> str:
    """The hex SHA-256 of a token, as the reviewers file keeps it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@final
@attrs.frozen(kw_only=True)
class Reviewer:
    """A person who may decide: an id (what a decision names), a display name, and the hash of their token."""

    id: str
    name: str
    token_sha256: str = attrs.field(repr=False)


@final
class Reviewers:
    """The reviewers, by id."""

    def __init__(self, reviewers: Iterable[Reviewer]) -> None:
        self._by_id: dict[str, Reviewer] = {}
        for reviewer in reviewers:
            if reviewer.id in self._by_id:
                raise ReviewerError(f"the reviewer id {reviewer.id!r} is given twice")
            self._by_id[reviewer.id] = reviewer

    def __iter__(self) -> Iterator[Reviewer]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, reviewer_id: str) -> Reviewer | None:
        return self._by_id.get(reviewer_id)

    def by_token(self, token: str) -> Reviewer | None:
        """The reviewer whose token this is (every hash compared, in constant time each)."""
        given = token_hash(token)
        found = None
        for reviewer in self._by_id.values():
            if hmac.compare_digest(given, reviewer.token_sha256):
                found = reviewer
        return found


def _text(entry: Mapping[str, object], key: str, where: str, *, limit: int = 200) -> str:
    value = entry.get(key)
    if type(value) is not str or not value.strip() or len(value) > limit:
        raise ReviewerError(f"{where}: {key} must be text of 1 to {limit} characters")
    return value


def load_reviewers(path: str | Path) -> Reviewers:
    """The ``[[reviewer]]`` tables of a TOML file: ``id``, ``name`` and ``token_sha256`` (the hex SHA-256 of a
    random token: ``python -c "import secrets; print(secrets.token_urlsafe(32))"``, then ``sha256sum``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()[: _MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise ReviewerError(f"the reviewers file {path} could not be read ({exc.strerror})") from None
    if len(raw) > _MAX_FILE_BYTES:
        raise ReviewerError(f"the reviewers file {path} is over {_MAX_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ReviewerError(f"the reviewers file {path} is not TOML: {exc}") from None
    tables = data.get("reviewer")
    if type(tables) is not list or not tables:
        raise ReviewerError(f"the reviewers file {path} names no reviewer (a [[reviewer]] table)")
    reviewers = []
    for number, entry in enumerate(tables, start=1):
        where = f"{path}, reviewer {number}"
        if type(entry) is not dict:
            raise ReviewerError(f"{where}: not a table")
        digest = _text(entry, "token_sha256", where).lower()
        if len(digest) != 64 or digest.strip("0123456789abcdef"):
            raise ReviewerError(f"{where}: token_sha256 must be 64 hex digits (the SHA-256 of the token)")
        reviewer_id = _text(entry, "id", where)
        name = _text(entry, "name", where) if "name" in entry else reviewer_id
        reviewers.append(Reviewer(id=reviewer_id, name=name, token_sha256=digest))
    try:
        return Reviewers(reviewers)
    except ReviewerError as exc:
        raise ReviewerError(f"{path}: {exc}") from None


@final
class LoginLinks:
    """One-time login links: a random 32-byte token per link, valid once, for `LINK_TTL_S` seconds."""

    def __init__(self, reviewers: Reviewers, *, clock: Clock = time.monotonic, ttl_s: float = LINK_TTL_S) -> None:
        self._reviewers = reviewers
        self._clock = clock
        self._ttl_s = ttl_s
        self._links: OrderedDict[str, tuple[str, float]] = OrderedDict()  # token hash -> (reviewer id, expiry)

    def issue(self, reviewer_id: str) -> str:
        """A new link token for ``reviewer_id`` (`ReviewerError` for an unknown id)."""
        if self._reviewers.get(reviewer_id) is None:
            raise ReviewerError(f"there is no reviewer {reviewer_id!r} in the reviewers file")
        token = secrets.token_urlsafe(32)
        self._links[token_hash(token)] = (reviewer_id, self._clock() + self._ttl_s)
        while len(self._links) > _MAX_LINKS:
            self._links.popitem(last=False)
        return token

    def _find(self, token: str) -> tuple[str, Reviewer] | None:
        key = token_hash(token)
        found = self._links.get(key)
        if found is None:
            return None
        reviewer_id, expiry = found
        reviewer = self._reviewers.get(reviewer_id)
        if self._clock() >= expiry or reviewer is None:
            del self._links[key]
            return None
        return key, reviewer

    def peek(self, token: str) -> Reviewer | None:
        """Whose link this is, without spending it (what the confirm page shows)."""
        found = self._find(token)
        return None if found is None else found[1]

    def consume(self, token: str) -> Reviewer | None:
        """The reviewer the link logs in, spending it; None for a link unknown, spent or expired."""
        found = self._find(token)
        if found is None:
            return None
        del self._links[found[0]]
        return found[1]


@final
@attrs.define(kw_only=True)
class LoginSession:
    """A reviewer's login: who, the CSRF token every form carries, when last seen, and one flash message."""

    reviewer: Reviewer
    csrf: str = attrs.field(factory=lambda: secrets.token_urlsafe(32), repr=False)
    last_seen: float
    flash: list[str] = attrs.field(factory=list)

    def csrf_matches(self, given: str) -> bool:
        """Whether a form's token is this session's (constant-time)."""
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.csrf.encode("utf-8"))

    def take_flash(self) -> list[str]:
        taken, self.flash = self.flash, []
        return taken


@final
class LoginSessions:
    """Server-side login sessions keyed by the hash of a random cookie value; idle ones end."""

    def __init__(self, *, idle_s: float = 8 * 3600, clock: Clock = time.monotonic) -> None:
        self._idle_s = idle_s
        self._clock = clock
        self._sessions: OrderedDict[str, LoginSession] = OrderedDict()

    def create(self, reviewer: Reviewer) -> tuple[str, LoginSession]:
        """A new login for ``reviewer``: the cookie value to set, and the session."""
        cookie = secrets.token_urlsafe(32)
        login = LoginSession(reviewer=reviewer, last_seen=self._clock())
        self._sessions[token_hash(cookie)] = login
        while len(self._sessions) > _MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return cookie, login

    def get(self, cookie: str | None) -> LoginSession | None:
        """The live login the cookie names (its idle time restarts), or None (unknown, or idle too long)."""
        if not cookie or len(cookie) > 200:
            return None
        key = token_hash(cookie)
        login = self._sessions.get(key)
        if login is None:
            return None
        now = self._clock()
        if now - login.last_seen > self._idle_s:
            del self._sessions[key]
            return None
        login.last_seen = now
        self._sessions.move_to_end(key)
        return login

    def end(self, cookie: str | None) -> None:
        if cookie:
            self._sessions.pop(token_hash(cookie), None)


@final
class FailedLogins:
    """Failed logins per client address: after ``limit`` within ``window_s``, every login from it waits."""

    def __init__(self, *, limit: int = 5, window_s: float = 60.0, clock: Clock = time.monotonic) -> None:
        self._limit = limit
        self._window_s = window_s
        self._clock = clock
        self._failures: OrderedDict[str, list[float]] = OrderedDict()

    def _recent(self, address: str) -> list[float]:
        now = self._clock()
        times = [t for t in self._failures.get(address, ()) if now - t < self._window_s]
        if times:
            self._failures[address] = times
        else:
            self._failures.pop(address, None)
        return times

    def retry_after(self, address: str) -> int | None:
        """Seconds the address must wait before its next login is even checked, or None."""
        times = self._recent(address)
        if len(times) < self._limit:
            return None
        return max(1, int(times[0] + self._window_s - self._clock()) + 1)

    def failed(self, address: str) -> None:
        self._failures.setdefault(address, []).append(self._clock())
        self._failures.move_to_end(address)
        while len(self._failures) > _MAX_SESSIONS:
            self._failures.popitem(last=False)


def origin_refusal(headers: Mapping[str, str], origins: frozenset[str]) -> str | None:
    """Why a POST with these headers does not come from one of the server's own ``origins`` (None: it does).

    ``Sec-Fetch-Site: cross-site`` is refused; then ``Origin`` must be one of ``origins``, or, when a browser sent
    none, the ``Referer``'s origin must be; a request with neither is refused."""
    if headers.get("sec-fetch-site", "").lower() == "cross-site":
        return "the request came from another site (Sec-Fetch-Site: cross-site)"
    origin = headers.get("origin")
    if origin is not None:
        return None if origin in origins else f"the request came from another origin ({origin[:100]})"
    referer = headers.get("referer")
    if referer is None:
        return "the request names no origin (no Origin or Referer header)"
    scheme, sep, rest = referer.partition("://")
    host = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if not sep or f"{scheme}://{host}" not in origins:
        return "the request came from another origin (its Referer)"
    return None
