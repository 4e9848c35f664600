"""What the inbox's tests share: journals with a review waiting (made by a real `Session` on the scripted model), a
reviewers file, the forms a page offers (read from its HTML as a browser would), and a real ``trioloop serve``
process on a free port.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from trioloop import (
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    define_document_kind,
    function_tool,
)
from trioloop.durable.journal import JournalEntry, decode_entries, encode_entry, entry_hash
from trioloop.durable.signing import SEAL_VERSION, JournalSigner, head_message
from trioloop.durable.store import StoredEntry
from trioloop.providers.scripted import ScriptedCall, ScriptStep

ROOT = Path(__file__).resolve().parent.parent
NOTES = define_document_kind("notes", dump=str, load=str)
BASE = "http://inbox.test"


@function_tool(summary="Append {line!r} to the notes")
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the notes."""
    return ToolOutcome.success("Appended.", document=f"{ctx.document}{line}\n")


@function_tool(destructive=True, summary="Erase the notes")
async def erase_notes(ctx: ToolExecutionContext[str], why: str) -> ToolOutcome[str]:
    """Erase every note."""
    return ToolOutcome.success("Erased.", document="")


TOOLS = [append_line, erase_notes]


async def waiting_session(
    store: Any,
    session_id: str,
    signer: JournalSigner,
    calls: Sequence[tuple[str, dict[str, Any]]] = (("append_line", {"line": "- renew the passport"}),),
    *,
    request: str = "Remind me to renew my passport.",
    text: str = "I will add it.",
    approve: Sequence[str] = (),
) -> None:
    """Journal a turn in ``store`` whose cards (``calls``: tool name, input) wait for a review, then suspend it."""
    script = [ScriptedCall(id=f"c{n}", name=name, input=given) for n, (name, given) in enumerate(calls, start=1)]
    async with ScriptedProvider([ScriptStep(text=text, tool_calls=script)]) as model:
        session = await Session.open(
            store, session_id, kind=NOTES, provider=model, tools=TOOLS, model="scripted-1", document="# Errands\n",
            signer=signer, witness=None,
        )  # fmt: skip
        session.actor = "carol"
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, request)
            async with contextlib.aclosing(session.states()) as states:
                async for state in states:
                    if session.busy and state.phase is Phase.AWAITING_APPROVAL:
                        break
            for call_id in approve:  # decided in the app before the suspension
                assert session.approve(call_id)
            await trio.testing.wait_all_tasks_blocked()
            await session.suspend()


def resigned(entries: Sequence[JournalEntry], session_id: str, signer: JournalSigner) -> list[StoredEntry]:
    """The same journal under another session id, chained and sealed again (a cheap way to make many)."""
    out: list[StoredEntry] = []
    prev = entries[0].prev
    for entry in entries:
        data = dict(entry.data)
        if entry.kind == "seal":
            message = head_message(session_id, entry.seq - 1, prev, entry.at_ms)
            data = {"session": session_id, "v": SEAL_VERSION, "key": signer.key_id, "sig": signer.sign(message)}
        raw = encode_entry(entry.seq, entry.kind, prev, entry.at_ms, data)
        out.append(StoredEntry(entry.seq, raw))
        prev = entry_hash(raw)
    return out


async def copy_session(store: Any, source: str, session_id: str, signer: JournalSigner) -> None:
    entries = decode_entries(await store.read(source))
    async with await store.acquire(session_id) as lease:
        await lease.append(resigned(entries, session_id, signer))


@attrs.frozen
class ReviewerFile:
    path: Path
    tokens: dict[str, str]


def reviewers_file(folder: Path, people: Sequence[tuple[str, str]] = (("ada", "Ada"), ("bob", "Bob"))) -> ReviewerFile:
    tokens = {reviewer_id: secrets.token_urlsafe(32) for reviewer_id, _ in people}
    lines = []
    for reviewer_id, name in people:
        digest = hashlib.sha256(tokens[reviewer_id].encode()).hexdigest()
        lines += ["[[reviewer]]", f'id = "{reviewer_id}"', f'name = "{name}"', f'token_sha256 = "{digest}"', ""]
    path = folder / "reviewers.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    return ReviewerFile(path, tokens)


@attrs.define
class Form:
    action: str
    method: str
    fields: list[tuple[str, str]] = attrs.field(factory=list)
    options: dict[str, list[str]] = attrs.field(factory=dict)  # checkboxes and selects: the values offered

    def get(self, name: str) -> str:
        return next(value for key, value in self.fields if key == name)

    def data(self, **changes: str) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in self.fields:
            found.setdefault(key, []).append(value)
        for key, value in changes.items():
            found[key] = [value]
        return {key: values if len(values) > 1 else values[0] for key, values in found.items()}


class _Forms(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self._textarea: str | None = None
        self._select: str | None = None
        self._text: list[str] = []
        self._by_id: dict[str, Form] = {}

    def handle_starttag(self, tag: str, attrs_: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs_}
        if tag == "form":
            form = Form(a.get("action", ""), a.get("method", "get").lower())
            self.forms.append(form)
            if "id" in a:
                self._by_id[a["id"]] = form
            return
        form = self._by_id.get(a["form"]) if "form" in a else (self.forms[-1] if self.forms else None)
        if form is None:
            return
        if tag == "input" and "name" in a:
            if a.get("type") == "checkbox":
                form.options.setdefault(a["name"], []).append(a.get("value", "on"))
            elif a.get("type") != "submit":
                form.fields.append((a["name"], a.get("value", "")))
        elif tag == "textarea":
            self._textarea, self._text = a.get("name", ""), []
        elif tag == "select":
            self._select = a.get("name", "")
            form.fields.append((self._select, ""))
        elif tag == "option" and self._select is not None:
            form.options.setdefault(self._select, []).append(a.get("value", ""))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea" and self._textarea is not None and self.forms:
            self.forms[-1].fields.append((self._textarea, "".join(self._text)))
            self._textarea = None
        elif tag == "select":
            self._select = None


def forms(html: str, action: str | None = None) -> list[Form]:
    """The forms of a page (with ``action``, only those posting there)."""
    parser = _Forms()
    parser.feed(html)
    return [form for form in parser.forms if action is None or form.action == action]


def card_form(html: str, call_id: str, action: str) -> Form:
    """The /decide form of one card for one action (approve, deny, edit)."""
    for form in forms(html, "/decide"):
        if form.get("call_id") == call_id and form.get("action") == action:
            return form
    raise AssertionError(f"no {action} form for card {call_id}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@attrs.frozen
class Served:
    base: str
    links: dict[str, list[str]]  # each reviewer's one-time links, in the order printed
    public_key: str
    process: subprocess.Popen[str]


@contextlib.contextmanager
def serve_process(store: str, reviewers: Path, keys: Path, key: Path, *extra: str) -> Iterator[Served]:
    """``python -m trioloop.web.serve`` on a free port, until its login links are printed; killed at the end."""
    port = free_port()
    command = [sys.executable, "-m", "trioloop.web.serve", store, "--reviewers", str(reviewers), "--port", str(port)]
    command += ["--keys", str(keys), "--signing-key", str(key), *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert process.stdout is not None
        links: dict[str, list[str]] = {}
        public_key = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                raise AssertionError(f"trioloop serve ended: {process.stderr.read() if process.stderr else ''}")
            if match := re.match(r"one-time login for (\S+) \(15 minutes\): (\S+)", line):
                links.setdefault(match[1], []).append(match[2])
            if match := re.match(r"decisions are signed with the inbox key (\S+ \S+)", line):
                public_key = match[1]
            if line.startswith("Ctrl-C stops it.") and _accepting(port):
                break
        yield Served(f"http://127.0.0.1:{port}", links, public_key, process)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def _accepting(port: int) -> bool:
    for _ in range(100):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
        time.sleep(0.05)
    return False


@attrs.define
class Env:
    """A SQLite store with a review waiting, the inbox app over it, and the keys around it."""

    store: Any
    app: Any
    journal_key: JournalSigner
    inbox_key: JournalSigner
    people: ReviewerFile

    def client(self) -> Any:
        import httpx

        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=BASE)

    async def login(self, reviewer: str = "ada") -> Any:
        client = self.client()
        token = self.app.links.issue(reviewer)
        answer = await client.post("/login/link", data={"token": token}, headers={"origin": BASE})
        assert answer.status_code == 303, answer.text
        return client

    async def box(self, session_id: str = "notes") -> list[Any]:
        return list(await self.store.decisions(session_id))


@contextlib.asynccontextmanager
async def inbox_env(store: Any, folder: Path, *, session: bool = True, **settings: Any) -> Any:
    """`Env` over ``store`` (a session ``notes`` waiting, unless ``session=False``)."""
    from trioloop.web.app import InboxSettings, open_inbox
    from trioloop.web.reviewers import load_reviewers

    journal_key, inbox_key = JournalSigner.generate(), JournalSigner.generate()
    people = reviewers_file(folder)
    if session:
        await waiting_session(store, "notes", journal_key)
    config = InboxSettings(
        reviewers=load_reviewers(people.path), signer=inbox_key, origins=frozenset({BASE}), **settings
    )
    async with open_inbox(store, journal_key.keys, config) as app:
        yield Env(store, app, journal_key, inbox_key, people)
