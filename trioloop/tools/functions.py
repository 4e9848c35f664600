"""Tools from typed Python functions: ``@function_tool`` turns a function into a `RegisteredTool`.

The parameters' annotations give the JSON schema the model sees and the strict validation of what it
sends (str, int, float, bool, Literal, Enum, list/tuple, optional, attrs classes); the docstring gives the
description and each parameter's description (Google ``Args:`` or Sphinx ``:param x:`` style). What a tool
may do is static and explicit: ``effect`` ("read" or "mutate") and ``destructive`` are keyword-only flags,
and the default is a non-destructive mutation, which is never auto-approved. A parameter annotated
``ToolExecutionContext[D]`` receives the call's context (its private document and cancel scope).

A coroutine function runs in the tool's task. A plain function runs in a worker thread
(``trio.to_thread.run_sync`` with ``abandon_on_cancel=True``), so it never blocks the event loop; on Stop
the thread is abandoned and whatever it returns is discarded. The function returns a `ToolOutcome`, or a
``str`` (a successful result that changes nothing), or raises `ToolError` (a failure whose message the
model receives); any other exception fails only its own call.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal, Protocol, TypeVar, overload

import attrs
import trio

from trioloop.machine.card import input_details, one_line
from trioloop.machine.tool_input import json_schema_for, unstructure_input
from trioloop.machine.tools import Effect, RegisteredTool, ToolOutcome
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool

__all__ = ["ToolError", "function_tool", "parse_docstring"]

D = TypeVar("D")
_SUMMARY_VALUE_MAX: Final = 60  # per value: the card's details show every value whole
_TOOL_NAME: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ToolError(Exception):
    """Raised by a function tool to fail its call with ``message`` as the result the model reads."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------------------------------------
# Docstrings


_SECTION: Final = re.compile(r"^(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_GOOGLE_PARAM: Final = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM: Final = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google- or Sphinx-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for raw in lines:
        line = raw.strip()
        header = _SECTION.match(line)
        if header and not raw.startswith((" ", "\t")):
            section = header.group(1)
            current = None
            continue
        sphinx = _SPHINX_PARAM.match(line)
        if sphinx:
            section, current = "Args", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        if line.startswith(":"):  # :returns:, :raises ...: and the like end a Sphinx parameter
            section, current = "other", None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            google = _GOOGLE_PARAM.match(line)
            indented_more = current is not None and raw.startswith(" " * 8)
            if google and not indented_more:
                current = google.group(1).lstrip("*")
                params[current] = google.group(2).strip()
            elif current is not None and line:
                params[current] = f"{params[current]} {line}".strip()
        elif current is not None and line:
            params[current] = f"{params[current]} {line}".strip()
    description = "\n".join(summary).strip()
    description = re.sub(r"\n{3,}", "\n\n", description)
    return description, params


# ---------------------------------------------------------------------------------------------
# The input class


def _is_context(annotation: Any) -> bool:
    return annotation is ToolExecutionContext or typing.get_origin(annotation) is ToolExecutionContext


def _input_class(fn: Callable[..., Any], name: str, param_docs: Mapping[str, str]) -> tuple[type[Any], str | None]:
    """An attrs class with one field per model-facing parameter, and the name of the context parameter."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise TypeError(f'Tool "{name}": its annotations could not be resolved ({exc}).') from None
    context_param: str | None = None
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f'Tool "{name}": *args and **kwargs cannot be described to a model.')
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(f'Tool "{name}": positional-only parameter {param.name!r} has no name for the model.')
        annotation = hints.get(param.name, inspect.Parameter.empty)
        if annotation is inspect.Parameter.empty:
            raise TypeError(f'Tool "{name}": parameter {param.name!r} needs a type annotation.')
        if _is_context(annotation):
            if context_param is not None:
                raise TypeError(f'Tool "{name}": only one parameter may take the ToolExecutionContext.')
            context_param = param.name
            continue
        metadata = {"trioloop": {"description": param_docs[param.name]}} if param.name in param_docs else {}
        default = attrs.NOTHING if param.default is inspect.Parameter.empty else param.default
        annotations[param.name] = annotation
        namespace[param.name] = attrs.field(default=default, metadata=metadata)
    namespace["__annotations__"] = annotations
    namespace["__qualname__"] = namespace["__name__"] = f"{name}_input"
    namespace["__module__"] = getattr(fn, "__module__", __name__)
    cls = attrs.frozen(kw_only=True)(type(f"{name}_input", (), namespace))
    try:
        json_schema_for(cls)
    except TypeError as exc:
        raise TypeError(f'Tool "{name}": {exc}') from None
    return cls, context_param


def _default_summary(name: str, canonical_input: Any) -> str:
    """``name(path=value, ...)`` from the card's own view of the input, each value cut to one line."""
    parts = (f"{path}={one_line(value, _SUMMARY_VALUE_MAX)}" for path, value in input_details(canonical_input))
    return f"{name}({', '.join(parts)})"


# ---------------------------------------------------------------------------------------------
# The decorator


def _outcome(produced: Any) -> ToolOutcome[Any]:
    if isinstance(produced, str):
        return ToolOutcome.success(produced)
    outcome: ToolOutcome[Any] = produced  # anything else is checked by the runner, never trusted here
    return outcome


def _build(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    effect: Effect,
    destructive: bool,
    summary: str | Callable[..., str] | None,
    needs_approval: Callable[[Any], Any] | None = None,
) -> RegisteredTool[Any]:
    tool_name = name if name is not None else fn.__name__
    if not _TOOL_NAME.match(tool_name):
        raise ValueError(f"Tool name {tool_name!r} must be 1-64 of a-z, A-Z, 0-9, _ and -.")
    doc_description, param_docs = parse_docstring(fn.__doc__)
    tool_description = description if description is not None else doc_description
    if not tool_description:
        raise ValueError(f'Tool "{tool_name}" needs a description: give the function a docstring.')
    input_type, context_param = _input_class(fn, tool_name, param_docs)
    is_async = inspect.iscoroutinefunction(fn)

    def arguments(validated: Any) -> dict[str, Any]:
        return {field.name: getattr(validated, field.name) for field in attrs.fields(input_type)}

    async def run(validated: Any, ctx: ToolExecutionContext[Any]) -> ToolOutcome[Any]:
        kwargs = arguments(validated)
        if context_param is not None:
            kwargs[context_param] = ctx
        try:
            if is_async:
                produced = await fn(**kwargs)
            else:
                produced = await trio.to_thread.run_sync(functools.partial(fn, **kwargs), abandon_on_cancel=True)
        except ToolError as exc:
            return ToolOutcome.failure(exc.message)
        return _outcome(produced)

    def summarize(validated: Any) -> str:
        values = arguments(validated)
        if summary is None:
            return _default_summary(tool_name, unstructure_input(validated))
        if isinstance(summary, str):
            return summary.format(**values)
        return summary(**values)

    return define_executable_tool(
        name=tool_name,
        description=tool_description,
        effect=effect,
        destructive=destructive,
        input_type=input_type,
        run=run,
        summarize=summarize,
        needs_approval=needs_approval,
    )


class _Decorator(Protocol):
    @overload
    def __call__(self, fn: Callable[..., Awaitable[ToolOutcome[D]]], /) -> RegisteredTool[D]: ...
    @overload
    def __call__(self, fn: Callable[..., ToolOutcome[D]], /) -> RegisteredTool[D]: ...
    @overload
    def __call__(self, fn: Callable[..., Awaitable[str] | str], /) -> RegisteredTool[Any]: ...


@overload
def function_tool(fn: Callable[..., Awaitable[ToolOutcome[D]]], /) -> RegisteredTool[D]: ...
@overload
def function_tool(fn: Callable[..., ToolOutcome[D]], /) -> RegisteredTool[D]: ...
@overload
def function_tool(fn: Callable[..., Awaitable[str] | str], /) -> RegisteredTool[Any]: ...
@overload
def function_tool(
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Literal["read", "mutate"] = "mutate",
    destructive: bool = False,
    summary: str | Callable[..., str] | None = None,
    needs_approval: Callable[[Any], Any] | None = None,
) -> _Decorator: ...


def function_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Literal["read", "mutate"] = "mutate",
    destructive: bool = False,
    summary: str | Callable[..., str] | None = None,
    needs_approval: Callable[[Any], Any] | None = None,
) -> Any:
    """Turn a typed function into a `RegisteredTool` (use bare, ``@function_tool``, or with keywords).

    ``name`` defaults to the function's name and ``description`` to its docstring's text before the
    parameter section. ``effect`` and ``destructive`` say what the tool may do; they are never inferred.
    ``summary`` is the one-line card text: a format string over the parameters (``"Delete {heading}"``),
    a function of them, or by default ``name(field=value, ...)`` as the card shows the input (each value
    stripped of control and bidi code points and cut to one line). ``needs_approval`` decides each valid call
    in code (`trioloop.runtime.approvals`): allow, ask or deny, held to the same safety rules as approval rules.
    """

    def decorate(function: Callable[..., Any]) -> RegisteredTool[Any]:
        return _build(
            function,
            name=name,
            description=description,
            effect=effect,
            destructive=destructive,
            summary=summary,
            needs_approval=needs_approval,
        )

    return decorate if fn is None else decorate(fn)
