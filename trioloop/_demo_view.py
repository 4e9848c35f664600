"""The terminal view shared by `trioloop demo` and `trioloop chat`: streamed text, review cards,
tool status lines, the outcome, the document diff and undo. It only observes states and calls the
session's review controls; it never touches the document itself.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import AsyncGenerator, Callable
from typing import Literal, TypeAlias, cast

import trio
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from trioloop.loop.machine import CallRecord, CallStatus, Outcome, Phase, TurnState
from trioloop.loop.session import Session
from trioloop.threatmodel import ThreatModel, dump_thf
from trioloop.tools.untrusted_text import START_MARKER

__all__ = ["ApproveMode", "TurnView", "document_diff", "outcome_line"]

ApproveMode: TypeAlias = Literal["ask", "safe", "none"]
Prompt: TypeAlias = Callable[[str], str]

_STATUS_MARK = {
    CallStatus.SUCCEEDED: "done",
    CallStatus.FAILED: "failed",
    CallStatus.DENIED: "not run",
    CallStatus.UNDONE: "undone",
}


def document_diff(before: ThreatModel, after: ThreatModel) -> str:
    """A unified diff of the two documents as written to disk (empty when equal)."""
    lines = difflib.unified_diff(
        dump_thf(before).splitlines(keepends=True),
        dump_thf(after).splitlines(keepends=True),
        fromfile="before.thf",
        tofile="after.thf",
    )
    return "".join(lines)


def outcome_line(state: TurnState) -> str:
    outcome = state.outcome
    if outcome is Outcome.COMPLETED:
        return "Turn completed."
    if outcome is Outcome.CANCELLED:
        return "Turn stopped. Changes already applied stay applied and can be undone."
    if outcome is Outcome.BOUNDED:
        notice = state.notices[-1] if state.notices else "The turn reached a limit."
        return f"Turn ended at a limit: {notice}"
    if outcome is Outcome.FAILED:
        detail = state.error.message if state.error is not None else "unknown error"
        return f"Turn failed: {detail}"
    return "Turn is still running."


class TurnView:
    """Prints one session's turns and answers approval requests according to ``mode``."""

    def __init__(
        self, console: Console, session: Session[ThreatModel], mode: ApproveMode, prompt: Prompt = input
    ) -> None:
        self.console = console
        self.session = session
        self.mode = mode
        self.prompt = prompt
        self._shown_text: dict[int, int] = {}
        self._carded: set[str] = set()
        self._status_shown: dict[str, CallStatus] = {}
        self._phase: Phase | None = None
        self._mid_line = False

    async def watch(self) -> None:
        """Follow the session's states until cancelled (or interrupted: the generator is closed either way)."""
        states = cast(AsyncGenerator[TurnState, None], self.session.states())  # an async generator
        async with contextlib.aclosing(states):
            async for state in states:
                await self.render(state)

    async def render(self, state: TurnState) -> None:
        self._stream_text(state)
        self._tool_lines(state)
        if state.phase is Phase.AWAITING_APPROVAL:
            pending = [c for c in state.current_calls if c.status is CallStatus.PENDING and c.id not in self._carded]
            if pending:
                self._end_text_line()
                for call in pending:
                    self._carded.add(call.id)
                    self._card(call)
                await self._decide(pending)
        self._phase = state.phase

    # -- text ------------------------------------------------------------------------------------

    def _stream_text(self, state: TurnState) -> None:
        text = state.streaming_text
        shown = self._shown_text.get(state.iteration, 0)
        if len(text) > shown:
            if shown == 0:
                self._end_text_line()
                self.console.print("[bold cyan]assistant>[/] ", end="")
            self.console.print(Text(text[shown:]), end="", soft_wrap=True)
            self._shown_text[state.iteration] = len(text)
            self._mid_line = True

    def _end_text_line(self) -> None:
        if self._mid_line:
            self.console.print()
            self._mid_line = False

    # -- tools -----------------------------------------------------------------------------------

    def _tool_lines(self, state: TurnState) -> None:
        for call in state.calls:
            previous = self._status_shown.get(call.id)
            if previous is call.status:
                continue
            self._status_shown[call.id] = call.status
            if call.status is CallStatus.RUNNING:
                self._end_text_line()
                self.console.print(Text(f"  … running {call.tool_name}: {call.summary}", style="yellow"))
            elif call.status in _STATUS_MARK and call.id not in self._carded and previous is None:
                # Calls that never needed review (read tools, refused input): one line each.
                self._end_text_line()
                self.console.print(self._result_line(call))
            elif call.status in _STATUS_MARK:
                self._end_text_line()
                self.console.print(self._result_line(call))

    def _result_line(self, call: CallRecord) -> Text:
        mark = _STATUS_MARK.get(call.status, call.status.value)
        style = {"done": "green", "failed": "red", "not run": "magenta", "undone": "blue"}.get(mark, "")
        result = (call.result or "").splitlines()[0] if call.result else ""
        if result == START_MARKER:
            result = f"returned document data ({len((call.result or '').encode('utf-8'))} bytes)"
        if len(result) > 160:
            result = result[:159] + "…"
        return Text(f"  [{mark}] {call.tool_name}: {result}", style=style)

    def _card(self, call: CallRecord) -> None:
        body = Text()
        body.append(call.summary)  # plain text: never interpreted as markup
        if call.destructive:
            body.append("\nDESTRUCTIVE", style="bold red")
        title = f"review {escape(call.id)} · {escape(call.tool_name)}"
        panel = Panel(body, title=title, expand=False, border_style="red" if call.destructive else "cyan")
        self.console.print(panel, soft_wrap=False)

    async def _decide(self, pending: list[CallRecord]) -> None:
        if self.mode == "none":
            for call in pending:
                self.console.print(Text(f"  denied {call.id} (--approve none)"))
                self.session.deny(call.id)
            return
        if self.mode == "safe":
            safe = tuple(c.id for c in pending if not c.destructive)
            if safe:
                self.console.print(Text(f"  approved all safe: {', '.join(safe)}"))
                self.session.approve_batch(safe)
            for call in pending:
                if call.destructive:
                    self.console.print(Text(f"  denied destructive {call.id} (--approve safe)"))
                    self.session.deny(call.id)
            return
        for index, call in enumerate(pending):
            answer = await trio.to_thread.run_sync(
                self.prompt, f"{call.id}: [a]pprove, [d]eny, approve all [s]afe, s[t]op? ", abandon_on_cancel=True
            )
            choice = answer.strip().lower()[:1]
            if choice == "a":
                self.session.approve(call.id)
            elif choice == "s":
                self.session.approve_batch(tuple(c.id for c in pending[index:] if not c.destructive))
                for rest in pending[index:]:
                    if rest.destructive:
                        self.session.deny(rest.id)
                return
            elif choice == "t":
                self.session.stop()
                return
            else:
                self.session.deny(call.id)
