"""The terminal view shared by `trioloop demo` and `trioloop chat`: streamed text, review cards,
tool status lines, the outcome, the document diff and undo. It only observes states and calls the
session's review controls; it never touches the document itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeAlias

import trio
from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from trioloop.cli.cards import Edit, card, change_lines, help_text, make_edit
from trioloop.cli.questions import QuestionCards
from trioloop.cli.review import LinePrompt, edit_in_editor, editable_json, parse_answer
from trioloop.machine.reducer import CallRecord, CallStatus, Outcome, Phase, TurnState
from trioloop.machine.rules import DeciderKind
from trioloop.machine.step_ids import reserve_ids, step_calls
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


_CHOICES: Final = "a approve, d deny, e edit, all (every safe card), always, always tool, never, q stop, ?"
_CHOICES_AFTER_ALL: Final = "a approve, d deny, e edit, always, always tool, never, q stop, ?"
_DESTRUCTIVE_CHOICES: Final = "a approve, d deny, e edit, never, q stop, ?"
_AUTOMATIC: Final = frozenset({DeciderKind.RULE, DeciderKind.CODE})
_ALWAYS: Final = {"always_input": "input", "always_tool": "tool"}
_EDIT_CHOICES: Final = "a approve the edit, e edit again, d deny, q stop, ?"


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
        self._mid_line = False  # the streamed text's line is open (the cursor is after its last character)
        self._text_of: int | None = None  # the iteration whose answer is the last thing printed, if it is
        self._reported: tuple[str, int, int] = ("", 0, 0)  # turn id, notices and violations already printed
        self._waiting_shown = False  # the live "waiting for the model" line is on screen (a terminal only)
        self._waiting_since: float | None = None
        self._input_ended = False  # the input ended at a card: the turn stopped with cards nobody answered

    @property
    def input_ended(self) -> bool:
        """Whether the input ended (Ctrl-D, a closed pipe) at a card or a question of this view's turns, which
        stopped the turn there: a command then exits `EXIT_UNANSWERED`, so a script can tell it from success."""
        return self._input_ended or self.questions.input_ended

    async def watch(self) -> None:
        """Follow the session's states until cancelled (or interrupted)."""
        async for state in self.session.states():
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
                self.end_text_line()
                self.console.file.write("\r" + progress.ljust(60))
                self.console.file.flush()
                self._waiting_shown = True
                continue
            streaming = self.session.input_streaming
            if streaming is not None and self.console.is_terminal:
                self.end_text_line()
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
                self.end_text_line()
                line = f"  waiting for the model: {waited:.0f} s (Ctrl-C stops)"
                self.console.file.write("\r" + line.ljust(60))
                self.console.file.flush()
                self._waiting_shown = True
            elif not announced:
                self.end_text_line()
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
        # A state can carry the last step's settled calls together with the next answer's first text (the
        # journal holds a state back until its entries are durable): those calls' lines come first.
        self._tool_lines(state, earlier_only=True)
        self._stream_text(state)
        self._tool_lines(state)
        self._report_lines(state)
        for question in self.questions.new():
            self.end_text_line()
            self.questions.show(question)
            await self.questions.answer(question)
        if state.phase is Phase.AWAITING_APPROVAL:
            pending = [c for c in state.current_calls if c.status is CallStatus.PENDING and c.id not in self._carded]
            if pending:
                for call in pending:
                    self._carded.add(call.id)
                    self._say(self._card(call))
                await self._decide(pending)
        self._phase = state.phase

    # -- the one writer: streamed text, and whole lines of every other kind ---------------------------

    def _stream_text(self, state: TurnState) -> None:
        text = state.streaming_text
        shown = self._shown_text.get(state.iteration, 0)
        if len(text) <= shown:
            return
        if self._text_of != state.iteration:
            # A new answer, or one that goes on after a line of another kind: it starts a line of its own.
            self.end_text_line()
            self.console.print(Text("assistant> " if shown == 0 else "assistant> …", style="bold cyan"), end="")
            self._text_of = state.iteration
        self.console.print(Text(text[shown:]), end="", soft_wrap=True)
        self._shown_text[state.iteration] = len(text)
        self._mid_line = not text.endswith("\n")

    def end_text_line(self) -> None:
        """End the streamed text's line (if it is open): what is printed next starts a line of its own."""
        if self._mid_line:
            self.console.print()
            self._mid_line = False
        self._text_of = None

    def _say(self, renderable: RenderableType) -> None:
        """Print a line, a card or a table, on lines of its own: never inside the streamed text. A `Text` line
        stays one line (the terminal folds it); a card or a table is laid out to the terminal's width."""
        self.end_text_line()
        self.console.print(renderable, soft_wrap=isinstance(renderable, Text))

    # -- what the turn reports: retries, notices, refused inputs --------------------------------------

    def _report_lines(self, state: TurnState) -> None:
        """Each notice (a retry, a skipped frame, a limit) and each violation, printed once as it appears."""
        turn, notices, violations = self._reported
        if turn != state.turn_id:
            notices = violations = 0
        for notice in state.notices[notices:]:
            self._say(Text(f"  ! {notice}", style="yellow"))
        for violation in state.violations[violations:]:
            self._say(Text(f"  ! refused ({violation.violation.value}): {violation.detail}", style="magenta"))
        self._reported = (state.turn_id, len(state.notices), len(state.violations))

    # -- tools -----------------------------------------------------------------------------------

    def _tool_lines(self, state: TurnState, *, earlier_only: bool = False) -> None:
        """A line for each call whose status changed (with ``earlier_only``, of the steps before this one)."""
        for call in state.calls:
            if earlier_only and call.iteration >= state.iteration:
                continue
            previous = self._status_shown.get(call.id)
            if previous is call.status:
                continue
            self._status_shown[call.id] = call.status
            if call.status is CallStatus.RUNNING:
                self._say(Text(f"  … running {call.tool_name}: {call.summary}", style="yellow"))
            elif call.status in _STATUS_MARK:
                self._result_line(call)

    def _result_line(self, call: CallRecord) -> None:
        decider = call.decided_by
        if decider is not None and decider.kind in _AUTOMATIC and call.status is not CallStatus.DENIED:
            self._say(Text(f"  {call.tool_name} {call.id}: {decider.describe()}", style="dim"))
        mark = _STATUS_MARK.get(call.status, call.status.value)
        style = {"done": "green", "failed": "red", "not run": "magenta", "undone": "blue"}.get(mark, "")
        if call.status is CallStatus.DENIED:
            # Why it did not run, the person's own reason included, is shown whole: folded, never cut.
            reason = " ".join((call.result or "").split())
            grid = Table.grid()
            grid.add_column(no_wrap=True)
            grid.add_column(overflow="fold")
            grid.add_row(Text(f"  [{mark}] "), Text(f"{call.tool_name}: {reason}"), style=style)
            self._say(grid if self.console.is_terminal else Text(f"  [{mark}] {call.tool_name}: {reason}", style))
            return
        result = (call.result or "").splitlines()[0] if call.result else ""
        if result == START_MARKER:
            result = f"returned document data ({len((call.result or '').encode('utf-8'))} bytes)"
        if len(result) > 160:
            result = result[:159] + "…"
        self._say(Text(f"  [{mark}] {call.tool_name}: {result}", style=style))

    def _card(self, call: CallRecord, edit: Edit | None = None) -> Panel:
        return card(call, self.session.document, width=self.console.width, keys=self.mode == "ask", edit=edit)

    # -- decisions -------------------------------------------------------------------------------

    async def _decide(self, pending: list[CallRecord]) -> None:
        if self.mode == "none":
            for call in pending:
                self._say(Text(f"  denied {call.id} (--approve none)"))
                self.session.deny(call.id, "The user's session denies every change (--approve none).")
            return
        if self.mode == "safe":
            self._decide_safe(pending)
            return
        queue = list(pending)
        edits: dict[str, Edit] = {}  # the current card's edit, shown and waiting for its key
        batch_done = False
        while queue:
            call = queue[0]
            edit = edits.get(call.id)
            if edit is not None:
                choices = _EDIT_CHOICES
            elif call.destructive:
                choices = _DESTRUCTIVE_CHOICES
            else:
                choices = _CHOICES_AFTER_ALL if batch_done else _CHOICES
            try:
                answer = await self.lines.ask(f"{call.id}{'' if edit is None else ' (edited)'}: {choices} ")
            except EOFError:
                # The input ended: nothing more may run on an answer nobody gave.
                self._input_ended = True
                self._say(Text("  The input ended at this card: the turn stops here, and nothing of this step runs."))
                answer = "stop"
            action = parse_answer(answer)
            if action in _ALWAYS and call.destructive:
                self._say(Text("  A destructive call always gets its own card: no rule may approve it unasked."))
                continue
            if action is None or (action == "safe" and (batch_done or edit is not None)):
                hint = " (s is no answer: q or stop stops the turn, all approves every safe card)"
                shown = hint if answer.strip().lower() in ("s", "safe", "t") and edit is None else ""
                self._say(Text(f"  Please answer one of: {choices}{shown}."))
                continue
            if action == "help":
                self._say(help_text(call, self.session.document, edit))
                continue
            if action == "stop":
                self.session.stop()
                return
            if action == "safe":
                batch_done = True
                safe = tuple(c.id for c in queue if not c.destructive)
                if safe:
                    self._say(Text(f"  approved all safe: {', '.join(safe)}"))
                    self.session.approve_batch(safe)
                queue = [c for c in queue if c.destructive]
                if queue:
                    names = ", ".join(f"{c.id} ({c.summary})" for c in queue)
                    self._say(Text(f"  Not included, destructive: {names}. Decide each one:", style="red"))
                continue
            if action == "edit":
                edited = await self._edit(call, edit)
                if edited is not None:
                    if edited.changes:
                        edits[call.id] = edited
                    else:
                        edits.pop(call.id, None)
                        self._say(Text("  That is the model's own input again: the card is as the model sent it."))
                    self._say(self._card(call, edits.get(call.id)))
                continue
            if action == "approve" and edit is not None:
                self._say(Text(f"  approved {call.id} with your edit: {edit.prepared.summary}"))
                for line in change_lines(edit.changes):
                    self._say(line)
                self.session.approve(call.id, edit.input)
            elif action == "approve":
                self.session.approve(call.id)
            elif action in _ALWAYS:
                always = _ALWAYS[action]
                what = "with this input" if always == "input" else "whatever its input"
                self._say(Text(f"  approved {call.id}; {call.tool_name} {what} is approved unasked from now on"))
                self.session.approve(call.id, edit.input if edit is not None else None, always=always)
            else:
                try:
                    reason = await self.lines.ask("  Reason for the model (optional, Enter for none): ")
                except EOFError:  # denied all the same, without a reason; the next card finds the input ended
                    reason = ""
                if action == "never":
                    self._say(Text(f"  denied {call.id}; every {call.tool_name} call is denied from now on"))
                    self.session.deny(call.id, reason, always="tool")
                else:
                    self.session.deny(call.id, reason)
            queue.pop(0)

    def _decide_safe(self, pending: list[CallRecord]) -> None:
        """``--approve safe``: every non-destructive call approved (the demo's scripted reviewer edits one
        first), every destructive one denied."""
        for call in pending:
            edited = self.scripted_edits.get(call.id)
            if edited is not None and not call.destructive:
                self._say(
                    Text(
                        f"  approved {call.id} with an edit by the demo's scripted reviewer (under --approve "
                        "safe the demo plays a reviewer who edits this call before approving it):"
                    )
                )
                checked = self._checked(call, edited)
                for line in () if isinstance(checked, str) else change_lines(checked.changes):
                    self._say(line)
                self.session.approve(call.id, edited)
        safe = tuple(c.id for c in pending if not c.destructive and c.id not in self.scripted_edits)
        if safe:
            self._say(Text(f"  approved all safe: {', '.join(safe)}"))
            self.session.approve_batch(safe)
        for call in pending:
            if call.destructive:
                self._say(Text(f"  denied destructive {call.id} (--approve safe)"))
                self.session.deny(call.id, "The user's session denies destructive changes (--approve safe).")

    def _checked(self, call: CallRecord, edited: Any) -> Edit | str:
        """``edited`` as the call's own tool prepares it, or why it cannot be approved."""
        state = self.session.state
        tool = state.tool_set.get(call.tool_name) if state is not None else None
        if state is None or tool is None or call.prepared is None:
            return "This call cannot be edited."
        if not isinstance(edited, dict):
            return "The input must be a JSON object."
        checked = tool.prepare(edited)
        if not isinstance(checked, PrepareFailure):
            # Bound as the reducer binds the approved edit: the card previews the id this call keeps.
            checked = reserve_ids(step_calls(state), checked, call.prepared.reservations)
        if isinstance(checked, PrepareFailure):
            return f"The tool refused this input: {checked.message}."
        return make_edit(call, edited, checked)

    async def _edit(self, call: CallRecord, edit: Edit | None) -> Edit | None:
        """The person's edit of the call's input (of their last ``edit``, when there is one): $VISUAL or $EDITOR
        on it as indented JSON, else a line of JSON prefilled with it, checked by the call's own tool. None when
        nothing usable came back (said why); the card then stays as it was. Nothing is approved here."""
        current = editable_json(self._call_input(call) if edit is None else edit.input)
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if editor:
            try:
                text = await trio.to_thread.run_sync(edit_in_editor, current, editor)
            except (OSError, ValueError) as exc:
                self._say(Text(f"  The editor could not be used ({exc}). The card is as it was."))
                return None
            if text.strip() == current.strip():
                self._say(Text("  The input was not changed. The card is as it was."))
                return None
        else:
            self._say(Text("  The input now (edit the line below; Enter on an empty line goes back):"))
            flat = json.dumps(json.loads(current), ensure_ascii=True)
            self._say(Text(f"  {flat}", style="dim"))
            try:
                text = await self.lines.ask("  Edited input: ", prefill=flat)
            except EOFError:  # nothing typed: the card stays as it was (and finds the input ended)
                return None
        if not text.strip():
            return None
        try:
            edited: Any = json.loads(text)
        except ValueError as exc:
            self._say(Text(f"  Not JSON: {exc}. The card is as it was."))
            return None
        checked = self._checked(call, edited)
        if isinstance(checked, str):
            self._say(Text(f"  {checked} The card is as it was."))
            return None
        return checked

    def _call_input(self, call: CallRecord) -> Any:
        """The input the model sent for ``call``, from the turn's messages (``{}`` if it cannot be found)."""
        state = self.session.state
        if state is not None:
            for message in reversed(state.turn_messages):
                for block in message.content:
                    if isinstance(block, ToolCallBlock) and block.id == call.id:
                        return block.input
        return {}
