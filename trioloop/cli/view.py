"""The terminal view shared by `trioloop demo` and `trioloop chat`: streamed text, review cards,
tool status lines, the outcome, the document diff and undo. It only observes states and calls the
session's review controls; it never touches the document itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Literal, TypeAlias, cast

import trio
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from trioloop.cli.questions import QuestionCards
from trioloop.cli.review import HELP, KEYS, LinePrompt, edit_in_editor, editable_json, parse_answer
from trioloop.machine.card import changed_fields, one_line
from trioloop.machine.preview import preview_call
from trioloop.machine.reducer import CallRecord, CallStatus, Outcome, Phase, TurnState
from trioloop.machine.tools import PrepareFailure
from trioloop.machine.untrusted_text import START_MARKER, sanitize_scalar
from trioloop.protocol.messages import ToolCallBlock
from trioloop.runtime.session import Session
from trioloop.threatmodel import ThreatModel

__all__ = ["ApproveMode", "TurnView", "outcome_line"]

ApproveMode: TypeAlias = Literal["ask", "safe", "none"]
Prompt: TypeAlias = Callable[[str], str]

_STATUS_MARK = {
    CallStatus.SUCCEEDED: "done",
    CallStatus.FAILED: "failed",
    CallStatus.DENIED: "not run",
    CallStatus.UNDONE: "undone",
}


def _size(characters: int) -> str:
    return f"{characters} characters" if characters < 10_000 else f"{characters / 1000:.0f}k characters"


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
        self,
        console: Console,
        session: Session[ThreatModel],
        mode: ApproveMode,
        prompt: Prompt | LinePrompt = input,
        scripted_edits: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        self.console = console
        self.session = session
        self.mode = mode
        #: ``--approve safe`` in the demo: call id -> the edited input the scripted reviewer approves instead.
        self.scripted_edits = dict(scripted_edits or {})
        self.lines = prompt if isinstance(prompt, LinePrompt) else LinePrompt(prompt)
        self.questions = QuestionCards(console, session, self.lines, mode)
        self._shown_text: dict[int, int] = {}
        self._carded: set[str] = set()
        self._status_shown: dict[str, CallStatus] = {}
        self._phase: Phase | None = None
        self._mid_line = False
        self._reported: tuple[str, int, int] = ("", 0, 0)  # turn id, notices and violations already printed
        self._waiting_shown = False  # the live "waiting for the model" line is on screen (a terminal only)
        self._waiting_since: float | None = None

    async def watch(self) -> None:
        """Follow the session's states until cancelled (or interrupted: the generator is closed either way)."""
        states = cast(AsyncGenerator[TurnState, None], self.session.states())  # an async generator
        async with contextlib.aclosing(states):
            async for state in states:
                await self.render(state)

    async def waiting(self, *, interval_s: float = 0.5, first_s: float = 1.0) -> None:
        """While a request is open and nothing has come back yet, say so with the time waited and how to stop:
        a line updated in place on a terminal, one line otherwise. Runs until cancelled."""
        announced = False
        while True:
            await trio.sleep(interval_s)
            state = self.session.state
            progress = self._progress_line(state)
            if progress is not None and self.console.is_terminal:
                self._end_text_line()
                self.console.file.write("\r" + progress.ljust(60))
                self.console.file.flush()
                self._waiting_shown = True
                continue
            streaming = self.session.input_streaming
            if streaming is not None and self.console.is_terminal:
                self._end_text_line()
                name, size = streaming
                line = f"  writing the input of {name}: {_size(size)} so far (Ctrl-C stops)"
                self.console.file.write("\r" + line.ljust(60))
                self.console.file.flush()
                self._waiting_shown = True
                continue
            waiting = state is not None and state.phase is Phase.REQUESTING and self.session.busy
            if not waiting:
                self._waiting_since = None
                announced = False
                self.clear_waiting()
                continue
            now = trio.current_time()
            if self._waiting_since is None:
                self._waiting_since = now
            waited = now - self._waiting_since
            if waited < first_s:
                continue
            if self.console.is_terminal:
                self._end_text_line()
                line = f"  waiting for the model: {waited:.0f} s (Ctrl-C stops)"
                self.console.file.write("\r" + line.ljust(60))
                self.console.file.flush()
                self._waiting_shown = True
            elif not announced:
                self._end_text_line()
                self.console.print(Text("  waiting for the model (Ctrl-C stops)…", style="dim"))
                announced = True

    def _progress_line(self, state: TurnState | None) -> str | None:
        """The first running call that reported progress, as a status line (its message is the tool's own text:
        stripped of control and bidi code points, capped)."""
        if state is None or state.phase is not Phase.EXECUTING:
            return None
        for call in state.current_calls:
            if call.status is not CallStatus.RUNNING:
                continue
            reported = self.session.call_progress(call.id)
            if reported is None:
                continue
            done, total, message = reported
            amount = f"{done:g} of {total:g}" if total else f"{done:g}"
            said = sanitize_scalar(message, 60)[0]
            return f"  … {call.tool_name}: {amount}" + (f" ({said})" if said else "") + " (Ctrl-C stops)"
        return None

    def clear_waiting(self) -> None:
        if self._waiting_shown:
            self.console.file.write("\r" + " " * 60 + "\r")
            self.console.file.flush()
            self._waiting_shown = False

    async def render(self, state: TurnState) -> None:
        self.clear_waiting()
        if state.phase is not Phase.REQUESTING:
            self._waiting_since = None
        self._stream_text(state)
        self._tool_lines(state)
        self._report_lines(state)
        for question in self.questions.new():
            self._end_text_line()
            self.questions.show(question)
            await self.questions.answer(question)
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

    # -- what the turn reports: retries, notices, refused inputs --------------------------------------

    def _report_lines(self, state: TurnState) -> None:
        """Each notice (a retry, a skipped frame, a limit) and each violation, printed once as it appears."""
        turn, notices, violations = self._reported
        if turn != state.turn_id:
            notices = violations = 0
        new_notices = state.notices[notices:]
        new_violations = state.violations[violations:]
        if new_notices or new_violations:
            self._end_text_line()
        for notice in new_notices:
            self.console.print(Text(f"  ! {notice}", style="yellow"))
        for violation in new_violations:
            self.console.print(Text(f"  ! refused ({violation.violation.value}): {violation.detail}", style="magenta"))
        self._reported = (state.turn_id, notices + len(new_notices), violations + len(new_violations))

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
        details = call.prepared.details if call.prepared is not None else ()
        if details:
            body.append("\nInput:", style="bold")
            unset = 0
            for path, value in details:
                if value == "null":
                    unset += 1  # a field left out (null) writes nothing; "?" lists every field
                    continue
                body.append(f"\n  {path}: {one_line(value, self._value_width(path))}")
            if unset:
                body.append(f"\n  ({unset} more field(s) left null; ? shows every field, whole)", style="dim")
        for line in self._preview_lines(call):
            body.append(f"\n{line}", style="bold" if not line.startswith(" ") else "")
        if self.mode == "ask":
            body.append(f"\n{KEYS}", style="dim")
        title = f"review {escape(call.id)} · {escape(call.tool_name)}"
        panel = Panel(body, title=title, expand=False, border_style="red" if call.destructive else "cyan")
        self.console.print(panel, soft_wrap=False)

    def _value_width(self, path: str) -> int:
        """How much of a value a card line shows: what the terminal's width leaves (about four lines of it),
        at least 60 characters; ``?`` shows every value whole."""
        room = max(self.console.width - len(path) - 10, 20)
        return max(60, room * 4)

    def _preview_lines(self, call: CallRecord) -> tuple[str, ...]:
        preview = None if call.prepared is None else preview_call(call.prepared, self.session.document)
        if preview is None:
            return ()
        return ("Preview:", *(f"  {line}" for line in preview.lines()))

    def _help(self, call: CallRecord) -> None:
        body = Text(HELP)
        details = call.prepared.details if call.prepared is not None else ()
        body.append(f"\nThe whole input of {call.id}:", style="bold")
        for path, value in details:
            body.append(f"\n  {path}: {value}")
        for line in self._preview_lines(call):
            body.append(f"\n{line}")
        self.console.print(body)

    async def _decide(self, pending: list[CallRecord]) -> None:
        if self.mode == "none":
            for call in pending:
                self.console.print(Text(f"  denied {call.id} (--approve none)"))
                self.session.deny(call.id, "The user's session denies every change (--approve none).")
            return
        if self.mode == "safe":
            for call in pending:
                edited = self.scripted_edits.get(call.id)
                if edited is not None and not call.destructive:
                    self.console.print(
                        Text(
                            f"  approved {call.id} with an edit by the demo's scripted reviewer (under --approve "
                            "safe the demo plays a reviewer who edits this call before approving it):"
                        )
                    )
                    self._print_edit(call, edited)
                    self.session.approve(call.id, edited)
            safe = tuple(c.id for c in pending if not c.destructive and c.id not in self.scripted_edits)
            if safe:
                self.console.print(Text(f"  approved all safe: {', '.join(safe)}"))
                self.session.approve_batch(safe)
            for call in pending:
                if call.destructive:
                    self.console.print(Text(f"  denied destructive {call.id} (--approve safe)"))
                    self.session.deny(call.id, "The user's session denies destructive changes (--approve safe).")
            return
        queue = list(pending)
        batch_done = False
        while queue:
            call = queue[0]
            choices = "a approve, d deny, e edit" + ("" if batch_done else ", all (every safe card)") + ", q stop, ?"
            try:
                answer = await self.lines.ask(f"{call.id}: {choices} ")
            except EOFError:
                answer = "stop"  # the input ended: nothing more may run on an answer nobody gave
            action = parse_answer(answer)
            if action is None or (action == "safe" and batch_done):
                hint = " (s is no answer: q or stop stops the turn, all approves every safe card)"
                shown = hint if answer.strip().lower() in ("s", "safe", "t") else ""
                self.console.print(Text(f"  Please answer one of: {choices}{shown}."))
                continue
            if action == "help":
                self._help(call)
                continue
            if action == "stop":
                self.session.stop()
                return
            if action == "safe":
                batch_done = True
                safe = tuple(c.id for c in queue if not c.destructive)
                if safe:
                    self.console.print(Text(f"  approved all safe: {', '.join(safe)}"))
                    self.session.approve_batch(safe)
                queue = [c for c in queue if c.destructive]
                if queue:
                    names = ", ".join(f"{c.id} ({c.summary})" for c in queue)
                    self.console.print(Text(f"  Not included, destructive: {names}. Decide each one:", style="red"))
                continue
            if action == "approve":
                self.session.approve(call.id)
            elif action == "deny":
                reason = await self.lines.ask("  Reason for the model (optional, Enter for none): ")
                self.session.deny(call.id, reason)
            elif not await self._edit(call):
                continue
            queue.pop(0)

    def _print_edit(self, call: CallRecord, edited: dict[str, Any]) -> None:
        tool = self.session.state.tool_set.get(call.tool_name) if self.session.state is not None else None
        checked = None if tool is None else tool.prepare(edited)
        if call.prepared is None or checked is None or isinstance(checked, PrepareFailure):
            return
        for path, old, new in changed_fields(call.prepared.details, checked.details):
            self.console.print(Text(f"    {path}: {old if old is not None else '(absent)'} -> {new}"))

    async def _edit(self, call: CallRecord) -> bool:
        """Let the person edit the call's input ($VISUAL or $EDITOR on it as indented JSON, else a line of JSON
        prefilled with it), check it with the call's own tool, and approve it; False to ask again."""
        tool = self.session.state.tool_set.get(call.tool_name) if self.session.state is not None else None
        if tool is None or call.prepared is None:
            return False
        current = editable_json(self._call_input(call))
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if editor:
            try:
                text = await trio.to_thread.run_sync(edit_in_editor, current, editor)
            except (OSError, ValueError) as exc:
                self.console.print(Text(f"  The editor could not be used ({exc}). Nothing was approved."))
                return False
            if text.strip() == current.strip():
                self.console.print(Text("  The input was not changed. Nothing was approved."))
                return False
        else:
            self.console.print(Text("  The input now (edit the line below; Enter on an empty line goes back):"))
            flat = json.dumps(json.loads(current), ensure_ascii=True)
            self.console.print(Text(f"  {flat}", style="dim"))
            text = await self.lines.ask("  Edited input: ", prefill=flat)
        if not text.strip():
            return False
        try:
            edited: Any = json.loads(text)
        except ValueError as exc:
            self.console.print(Text(f"  Not JSON: {exc}. Nothing was approved."))
            return False
        if not isinstance(edited, dict):
            self.console.print(Text("  The input must be a JSON object. Nothing was approved."))
            return False
        checked = tool.prepare(edited)
        if isinstance(checked, PrepareFailure):
            self.console.print(Text(f"  The tool refused this input: {checked.message}. Nothing was approved."))
            return False
        self.console.print(Text(f"  approved {call.id} with your edit: {checked.summary}"))
        self._print_edit(call, edited)
        self.session.approve(call.id, edited)
        return True

    def _call_input(self, call: CallRecord) -> Any:
        """The input the model sent for ``call``, from the turn's messages (``{}`` if it cannot be found)."""
        state = self.session.state
        if state is not None:
            for message in reversed(state.turn_messages):
                for block in message.content:
                    if isinstance(block, ToolCallBlock) and block.id == call.id:
                        return block.input
        return {}
