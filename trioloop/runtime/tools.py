"""A tool at run time: the `ToolExecutionContext` a running call sees (its private document, its cancel scope,
progress, questions to the person, sampling), and `define_executable_tool`, which turns an attrs input class and
a function of (input, context) into a `RegisteredTool` the machine can offer and the runner can run.
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Generic, TypeAlias, TypeVar

import attrs
import trio

from trioloop.machine.canonical import input_digest
from trioloop.machine.card import input_details
from trioloop.machine.preview import Preview, PreviewFn
from trioloop.machine.questions import Answer, Question, QuestionField, QuestionRefused, Sampled, SamplingRequest
from trioloop.machine.tool_input import json_schema_for, structure_input, unstructure_input
from trioloop.machine.tools import Effect, InvokeFn, PreparedCall, PrepareFailure, RegisteredTool, ToolOutcome

__all__ = ["ToolExecutionContext", "define_executable_tool"]

T = TypeVar("T")
D = TypeVar("D")


#: Where a running call's progress goes: (progress, total or None, message).
ProgressSink: TypeAlias = Callable[[float, "float | None", str], None]
#: Where a running call's questions go: the runner numbers the question, shows it and returns the answer.
AskSink: TypeAlias = Callable[[Question], Awaitable[Answer]]
#: Where a running call's sampling requests go: a question card, then (approved) the session's model.
SampleSink: TypeAlias = Callable[[Question], Awaitable[Sampled]]


@typing.final
class ToolExecutionContext(Generic[D]):
    """What a running tool may see: the document snapshot it starts from and its own cancel scope.

    ``ToolExecutionContext(document=..., cancel_scope=...)`` hands over a document as is. The runner
    uses ``ToolExecutionContext.deferred``: the tool's private copy of the document is made the first
    time it reads ``document``, so a tool that never looks at the document costs no copy, and Stop
    does not have to free one while that tool unwinds. Either way ``document`` is the same object on
    every read.
    """

    __slots__ = (
        "_cancel_scope",
        "_document",
        "_make_document",
        "_on_ask",
        "_on_progress",
        "_on_sample",
        "fencing_epoch",
    )

    _document: D

    def __init__(
        self,
        *,
        document: D,
        cancel_scope: trio.CancelScope | None = None,
        on_progress: ProgressSink | None = None,
        on_ask: AskSink | None = None,
        on_sample: SampleSink | None = None,
    ) -> None:
        scope = trio.CancelScope() if cancel_scope is None else cancel_scope
        self._fill(document, None, scope, on_progress, on_ask, on_sample)

    def _fill(
        self,
        document: D | None,
        make_document: Callable[[], D] | None,
        cancel_scope: trio.CancelScope,
        on_progress: ProgressSink | None = None,
        on_ask: AskSink | None = None,
        on_sample: SampleSink | None = None,
    ) -> None:
        """Every field of a new context: its document (or how to make it on first read) and its sinks."""
        if make_document is None:
            self._document = document  # type: ignore[assignment]  # D itself may include None
        self._make_document = make_document
        self._cancel_scope = cancel_scope
        self._on_progress = on_progress
        self._on_ask = on_ask
        self._on_sample = on_sample
        #: The fencing epoch of the journal lease this call runs under (None without a journal, or with a store
        #: that has none): larger than every earlier lease's on the session, so an external system that accepts
        #: fencing tokens can refuse a write from a holder whose lease was taken over.
        self.fencing_epoch: int | None = None

    @classmethod
    def deferred(
        cls,
        make_document: Callable[[], D],
        *,
        cancel_scope: trio.CancelScope,
        on_progress: ProgressSink | None = None,
        on_ask: AskSink | None = None,
        on_sample: SampleSink | None = None,
    ) -> ToolExecutionContext[D]:
        """A context whose ``document`` is ``make_document()``, called once, on the first read."""
        context = cls.__new__(cls)
        context._fill(None, make_document, cancel_scope, on_progress, on_ask, on_sample)
        return context

    async def sample(self, *, source: str, request: SamplingRequest) -> Sampled:
        """Ask the person to let the session's model answer ``request`` on ``source``'s behalf: a card shows the
        messages, the system prompt, the preferred model and the token budget; only if the person accepts is
        it sent, through the session's provider, the asker's text fenced as untrusted and no tools offered.

        Returns `Sampled` (the person's action; the model's text once accepted). Raises `QuestionRefused` as
        `ask` does; the request counts against ``max_questions_per_turn``."""
        question = Question(id="", call_id="", source=source, kind="sampling", sampling=request)
        sink = self._on_sample
        if sink is None:
            await trio.lowlevel.checkpoint()
            raise QuestionRefused("No one can be asked: the call is not running in a turn.")
        return await sink(question)

    async def ask(
        self,
        *,
        source: str,
        message: str,
        fields: Sequence[QuestionField] = (),
        url: str = "",
    ) -> Answer:
        """Put a question to the person and wait for the answer: a form (``fields``) or a page at ``url``
        they may open themselves. The card shows ``source`` (who asks) and ``message`` as that asker's text.

        The turn deadline stands still while the person answers (``review_timeout_ms`` bounds the wait).
        Returns the person's `Answer`; Stop, the call's end and the turn's end make it ``cancel``. Raises
        `QuestionRefused` when there is no one to ask (outside a turn, the turn ending, or the turn's
        ``max_questions_per_turn`` spent), ``ValueError`` for a question that cannot be shown."""
        question = Question(
            id="", call_id="", source=source, kind="url" if url else "form", message=message, fields=fields, url=url
        )
        sink = self._on_ask
        if sink is None:
            await trio.lowlevel.checkpoint()
            raise QuestionRefused("No one can be asked: the call is not running in a turn.")
        return await sink(question)

    def report_progress(self, progress: float, total: float | None = None, message: str = "") -> None:
        """Say how far a long run has got (``progress`` of ``total``, and a short ``message``), for the person
        watching; the face shows it beside the running call. Never raises; does nothing outside a turn."""
        sink = self._on_progress
        if sink is None:
            return
        with contextlib.suppress(TypeError, ValueError):  # a value that is not a number: nothing is shown
            sink(float(progress), None if total is None else float(total), str(message))

    @property
    def document(self) -> D:
        """The tool's private copy of the document, made on first read (changing it changes nothing live)."""
        make = self._make_document
        if make is not None:
            self._document = make()
            self._make_document = None
        return self._document

    @property
    def cancel_scope(self) -> trio.CancelScope:
        """The call's own cancel scope: cancelled on Stop, at the deadline and when the call is no longer wanted.

        The runner has already entered it around an `async def` tool's run: read it (``cancel_called``,
        ``deadline``) or call ``cancel()``, but never enter it again (``with ctx.cancel_scope:`` raises
        RuntimeError, as entering any Trio cancel scope twice does). For a bound of your own inside the tool,
        open a new scope (``with trio.move_on_after(...)``)."""
        return self._cancel_scope

    @property
    def cancelled(self) -> bool:
        """Whether the call has been cancelled (a long tool checks it between steps)."""
        return self._cancel_scope.cancel_called

    def __repr__(self) -> str:
        # Nothing here asks Trio (``cancel_called`` needs a running loop): a repr must never raise.
        document = "not yet made" if self._make_document is not None else "ready"
        return f"ToolExecutionContext(document={document})"


def define_executable_tool(
    *,
    name: str,
    description: str,
    effect: Effect,
    destructive: bool,
    input_type: type[T],
    run: Callable[[T, ToolExecutionContext[D]], ToolOutcome[D] | Awaitable[ToolOutcome[D]]],
    summarize: Callable[[T], str],
    preview: PreviewFn | None = None,
    needs_approval: Callable[[Any], Any] | None = None,
) -> RegisteredTool[D]:
    """Build a tool whose schema and validation both come from ``input_type`` (an attrs class).

    ``preview``, if given, is a pure ``(document, input) -> Preview`` dry run shown on the review card.
    """
    if not attrs.has(input_type):
        raise TypeError("input_type must be an attrs class")
    schema = json_schema_for(input_type)

    def prepare(raw: Any) -> PreparedCall[D] | PrepareFailure:
        structured: Any = structure_input(raw, input_type)
        if isinstance(structured, PrepareFailure):
            return structured
        validated: T = structured
        canonical = unstructure_input(validated)
        digest = input_digest(canonical)

        invoke = partial(run, validated)
        bound = None if preview is None else partial(_bound_preview, preview, validated)
        return PreparedCall(
            summary=summarize(validated),
            input_digest=digest,
            run=partial(_run_invoked, invoke),
            # Lines for a card, made only if one is shown: ``canonical`` is this call's own (unstructure
            # builds it anew), so the lines are the same whenever they are made.
            details=partial(input_details, canonical),
            preview=bound,
            invoke=invoke,
            canonical=canonical,
        )

    return RegisteredTool(
        name=name,
        description=description,
        effect=effect,
        destructive=destructive,
        json_schema=schema,
        prepare_fn=prepare,
        needs_approval=needs_approval,
    )


async def _run_invoked(invoke: InvokeFn[D], ctx: ToolExecutionContext[D]) -> ToolOutcome[D]:
    """A prepared call's ``run``: its ``invoke``, awaited when the tool is a coroutine function, and
    followed by a checkpoint when it is a plain one."""
    produced = invoke(ctx)
    if inspect.isawaitable(produced):
        return await produced
    await trio.lowlevel.checkpoint()
    return produced


def _bound_preview(preview: PreviewFn, validated: Any, document: Any) -> Preview:
    return preview(document, validated)
