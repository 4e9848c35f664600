"""Typed answers in the runtime: the app's answer type made into the final tool the model answers with, each call of
that tool checked against the type, and the settled turn's answer structured back into it.

The type stays here: the machine sees only the tool (`trioloop.machine.answers.AnswerSpec`) and each check's result
(`AnswerChecked`, journaled with the response), so a reopened session replays its answers without the type. An
attrs class is the tool's input itself; any other type (``list[int]``, ``int``, a ``Literal``, an enum) is wrapped as
the object ``{"value": ...}``, since tool inputs are JSON objects. Both go through `json_schema_for` and the strict
`structure_input` every tool input takes: no coercion, no extra keys, every problem named by its path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Generic, TypeVar, cast, final

import attrs

from trioloop.machine.answers import ANSWER_TOOL, AnswerChecked, AnswerSpec
from trioloop.machine.state import TurnState
from trioloop.machine.tool_input import json_schema_for, structure_input
from trioloop.machine.tools import PrepareFailure
from trioloop.protocol.events import ToolCallComplete

__all__ = ["ANSWER_TOOL", "AnswerForm", "answer_form", "output_as"]

T = TypeVar("T")

_DESCRIPTION: Final = (
    "Give your final answer to the user's request by calling this tool, once, when you are done; its input is the"
    " answer. Call it alone, not beside other tools."
)

_wrappers: dict[Any, type[Any]] = {}


def _input_type(output: Any) -> tuple[type[Any], bool]:
    """The attrs class the final tool's input is (``output`` itself, or a wrapper holding it as ``value``)."""
    if isinstance(output, type) and attrs.has(output):
        return output, False
    wrapper = _wrappers.get(output)
    if wrapper is None:
        wrapper = attrs.make_class("Answer", {"value": attrs.field(type=output)}, frozen=True, kw_only=True)
        _wrappers[output] = wrapper
    return wrapper, True


@final
@attrs.frozen(kw_only=True)
class AnswerForm(Generic[T]):
    """One turn's typed answer: the machine's spec of the final tool, and the class its input is checked with."""

    spec: AnswerSpec
    input_type: type[Any] = attrs.field(eq=False)
    output: Any = attrs.field(eq=False)

    def check(self, event: ToolCallComplete) -> AnswerChecked:
        """The check of one call of the final tool (its problems, each named by its path, or none)."""
        checked = structure_input(event.input, self.input_type)
        issues = checked.issues if isinstance(checked, PrepareFailure) else ()
        return AnswerChecked(call_id=event.id, tool_name=event.name, issues=issues)


def answer_form(output: type[T] | Any, *, tool_name: str = ANSWER_TOOL, taken: Iterable[str] = ()) -> AnswerForm[T]:
    """The final tool for answers of type ``output``, named ``tool_name``; ValueError when a tool in ``taken`` has
    that name, TypeError when the type cannot be a tool input (`json_schema_for` says which part)."""
    if tool_name in set(taken):
        raise ValueError(f"the typed answer's tool {tool_name!r} has the name of one of the session's tools")
    input_type, wrapped = _input_type(output)
    schema = json_schema_for(input_type)
    spec = AnswerSpec(tool_name=tool_name, description=_DESCRIPTION, json_schema=schema, wrapped=wrapped)
    return AnswerForm(spec=spec, input_type=input_type, output=output)


def output_as(state: TurnState | None, output: type[T] | Any) -> T | None:
    """The typed answer ``state`` settled with, structured as ``output`` (strictly, as it was checked), or None
    when the turn gave none. ValueError when the answer is not of that type (another type than the turn's)."""
    if state is None or not state.has_output:
        return None
    input_type, wrapped = _input_type(output)
    raw = {"value": state.output} if wrapped else state.output
    value = structure_input(raw, input_type)
    if isinstance(value, PrepareFailure):
        raise ValueError(f"the turn's answer is not a {output!r}: {value.message}")
    return cast("T", value.value if wrapped else value)
