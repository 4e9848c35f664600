"""Question cards in the terminal: a running call's question (an MCP server's elicitation) shown as a panel of
its own, answered field by field at the prompt. The asker's text is labelled as such; a URL is shown as text,
its host on a line of its own, and never opened. Only the person's typed answers answer it."""

from __future__ import annotations

from typing import Any, Final, Literal

import trio
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from trioloop.cli.review import LinePrompt
from trioloop.machine.questions import AnswerError, Question, QuestionField
from trioloop.runtime.session import Session

__all__ = ["QuestionCards", "parse_field"]

_ACTIONS: Final = {"a": "accept", "accept": "accept", "d": "decline", "decline": "decline", "c": "cancel"}
_ACTIONS_MORE: Final = {"cancel": "cancel", "q": "stop", "stop": "stop"}
_YES: Final = frozenset({"y", "yes", "true"})
_NO: Final = frozenset({"n", "no", "false"})


def _hint(field: QuestionField) -> str:
    kind = field.kind
    if kind in ("choice", "choices"):
        listed = ", ".join(f"{n}) {label}" for n, (_, label) in enumerate(field.options, 1))
        return ("one of " if kind == "choice" else "any of, comma-separated: ") + listed
    bounds = []
    unit = " characters" if kind == "text" else ""
    if field.minimum is not None:
        bounds.append(f"at least {field.minimum:g}{unit}")
    if field.maximum is not None:
        bounds.append(f"at most {field.maximum:g}{unit}")
    words = {"text": field.format or "text", "number": "a number", "integer": "a whole number", "boolean": "y/n"}
    return ", ".join([words[kind], *bounds])


def parse_field(field: QuestionField, typed: str) -> Any:
    """The value a typed line gives ``field`` (checked by the field), None for an empty line; `AnswerError`
    if it does not fit. Choices are typed by number or value."""
    typed = typed.strip()
    if not typed:
        return None
    value: Any = typed
    if field.kind in ("number", "integer"):
        value = field.number(typed)
    elif field.kind == "boolean":
        low = typed.lower()
        if low not in _YES | _NO:
            raise AnswerError(f'"{field.label}" takes y or n')
        value = low in _YES
    elif field.kind == "choice":
        value = _option(field, typed)
    elif field.kind == "choices":
        value = [_option(field, part) for part in typed.split(",") if part.strip()]
    return field.check(value)


def _option(field: QuestionField, typed: str) -> str:
    typed = typed.strip()
    if typed.isdigit() and 1 <= int(typed) <= len(field.options):
        return field.options[int(typed) - 1][0]
    return typed


class QuestionCards:
    """Shows each question once and asks the person for the answer (``mode`` "ask"); in the unattended modes
    nobody is there to answer, so it is cancelled, and the line says so."""

    def __init__(
        self, console: Console, session: Session[Any], lines: LinePrompt, mode: Literal["ask", "safe", "none"]
    ) -> None:
        self.console = console
        self.session = session
        self.lines = lines
        self.mode = mode
        self._shown: set[str] = set()
        #: The input ended at a question, so it was cancelled unanswered (`TurnView.input_ended`).
        self.input_ended = False

    def new(self) -> list[Question]:
        """The open questions not shown yet (each is then marked shown)."""
        fresh = [q for q in self.session.questions if q.id not in self._shown]
        self._shown.update(q.id for q in fresh)
        return fresh

    def show(self, question: Question) -> None:
        body = Text()
        if question.message or question.kind != "sampling":  # a sampling request's words are its messages
            body.append(f"{question.source} asks, during {question.tool_name}. Its own words:\n", style="bold")
            body.append(question.message or "(no message)")  # plain text: never markup
        else:
            body.append(f"{question.source} asks, during {question.tool_name}.", style="bold")
        if question.kind == "url":
            body.append("\nIt asks you to open this page yourself (trioloop does not open it):", style="bold")
            body.append(f"\n  {question.url}")
            body.append(f"\n  which leads to: {question.host}", style="bold")
        elif question.sampling is not None:
            request = question.sampling
            body.append(
                "\nIt asks the model to answer this (no tools; the answer goes to the server only):", style="bold"
            )
            if request.system_prompt:
                body.append("\n  system prompt:", style="bold")
                body.append("\n" + _indented(request.system_prompt))
            for role, text in request.messages:
                body.append(f"\n  {role}:", style="bold")
                body.append("\n" + _indented(text))
            hint = f"; it prefers {request.model_hint}" if request.model_hint else ""
            body.append(f"\n  at most {request.max_tokens} tokens, from this session's model{hint}")
        else:
            body.append("\nThe form:", style="bold")
            for field in question.fields:
                need = "required" if field.required else "optional"
                line = f"\n  {field.label} ({need}; {_hint(field)})"
                if field.default is not None:
                    line += f" [default: {_shown_value(field, field.default)}]"
                body.append(line)
                if field.description:
                    body.append(f"\n      {field.description}", style="dim")
        if self.mode == "ask":
            accept = {"form": "a accept (fill in the form)", "url": "a accept", "sampling": "a send it to the model"}
            keys = accept[question.kind] + " · d decline · c cancel"
            body.append(f"\nkeys: {keys} · q stop the turn", style="dim")
        panel = Panel(body, title=f"question {question.id}", expand=False, border_style="magenta")
        self.console.print(panel, soft_wrap=False)

    async def answer(self, question: Question) -> None:
        """Ask the person until they answer; a question that closes meanwhile (Stop, the call ended) stops
        the asking, and the line says so."""
        async with trio.open_nursery() as nursery:

            async def until_closed() -> None:
                async for _ in self.session.states():
                    if all(q.id != question.id for q in self.session.questions):
                        self.console.print(Text(f"\n  question {question.id} was closed before it was answered"))
                        nursery.cancel_scope.cancel()

            nursery.start_soon(until_closed)
            await self._ask(question)
            nursery.cancel_scope.cancel()

    async def _ask(self, question: Question) -> None:
        if self.mode != "ask":
            self.console.print(Text(f"  cancelled question {question.id} (--approve {self.mode}: nobody to answer it)"))
            self.session.answer(question.id, "cancel")
            return
        while True:
            try:
                typed = (await self.lines.ask(f"{question.id}: a accept, d decline, c cancel, q stop ")).strip().lower()
            except EOFError:
                typed = "c"  # the input ended: nobody is there to answer
                self.input_ended = True
            action = _ACTIONS.get(typed) or _ACTIONS_MORE.get(typed)
            if action is None:
                self.console.print(Text("  Please answer a, d, c or q."))
                continue
            if action == "stop":
                self.session.stop()
                return
            if action != "accept":
                self.session.answer(question.id, action)  # type: ignore[arg-type]
                return
            values = await self._fill(question) if question.kind == "form" else {}
            if values is None:
                continue  # gave up filling in: ask what to do again
            try:
                self.session.answer(question.id, "accept", values)
            except AnswerError as exc:
                self.console.print(Text(f"  {exc}. Nothing was sent; answer again."))
                continue
            self.console.print(Text(f"  sent your answer to {question.source}"))
            return

    async def _fill(self, question: Question) -> dict[str, Any] | None:
        values: dict[str, Any] = {}
        for field in question.fields:
            default = "" if field.default is None else f" [{_shown_value(field, field.default)}]"
            while True:
                try:
                    typed = await self.lines.ask(f"  {field.label}{default}: ")
                except EOFError:
                    return None
                try:
                    value = parse_field(field, typed)
                except AnswerError as exc:
                    self.console.print(Text(f"  {exc}."))
                    continue
                if value is None and field.required and field.default is None:
                    self.console.print(Text(f'  "{field.label}" is required.'))
                    continue
                if value is not None:
                    values[field.name] = value
                break
        return values


def _indented(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines() or [""])


def _shown_value(field: QuestionField, value: Any) -> str:
    if field.kind == "boolean":
        return "y" if value else "n"
    if isinstance(value, list):
        return ", ".join(value)
    return str(value)
