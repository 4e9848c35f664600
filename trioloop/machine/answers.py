"""A typed answer, as the machine knows it: the final tool the model answers with (`AnswerSpec`, plain JSON data
fixed at submit and journaled with the turn) and the check of one call of it (`AnswerChecked`, an input).

The answer's type is the app's (an attrs class, ``list[int]``, a ``Literal``): the machine never sees it. The
runtime checks each call of the final tool against it, strictly, as every tool input is checked
(`trioloop.machine.tool_input.structure_input`), and feeds what it found as `AnswerChecked` just before the
call's `ToolCallComplete`; the journal keeps it with the response, so replay needs neither the type nor the check.
The reducer decides what follows (`trioloop.machine.on_answer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs

__all__ = ["ANSWER_TOOL", "AnswerChecked", "AnswerSpec"]

#: The final tool's name unless the app picks another.
ANSWER_TOOL: Final = "final_answer"


def _name(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if type(value) is not str or not value:
        raise ValueError(f"{attribute.name} must be a non-empty str, got {value!r}")


def _schema(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return dict(value)


@final
@attrs.frozen(kw_only=True)
class AnswerSpec:
    """The final tool of a typed answer: its name, description and input schema, and whether the answer is the
    input itself (an object type) or its ``value`` field (``wrapped``: any other type)."""

    tool_name: str = attrs.field(validator=_name)
    description: str
    json_schema: Mapping[str, Any] = attrs.field(converter=_schema, eq=False, hash=False)
    wrapped: bool = False

    def output_of(self, raw: Any) -> Any:
        """The answer a valid call's input holds (its ``value`` when wrapped)."""
        if self.wrapped and type(raw) is dict:
            return raw.get("value")
        return raw

    def to_json(self) -> dict[str, Any]:
        """The spec as the journal keeps it (with the turn's ``submit`` entry); `from_json` reads it back."""
        return {
            "tool": self.tool_name,
            "description": self.description,
            "schema": dict(self.json_schema),
            "wrapped": self.wrapped,
        }

    @classmethod
    def from_json(cls, data: object) -> AnswerSpec:
        """The spec a journal wrote (ValueError when it is not one)."""
        if type(data) is not dict:
            raise ValueError("a typed answer's spec must be an object")
        tool, description, schema, wrapped = (data.get(k) for k in ("tool", "description", "schema", "wrapped"))
        if not (type(tool) is type(description) is str and type(schema) is dict and type(wrapped) is bool):
            raise ValueError("a typed answer's spec is malformed")
        return cls(tool_name=tool, description=description, json_schema=schema, wrapped=wrapped)


def _issues(value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple | list) or not all(type(i) is str for i in value):
        raise TypeError("issues must be a sequence of str")
    return tuple(value)


@final
@attrs.frozen(kw_only=True)
class AnswerChecked:
    """What the runtime found checking the next call of the final tool ``tool_name`` with the server's
    ``call_id``: no ``issues`` (a valid answer), or each problem as ``path: problem`` text for the model."""

    call_id: str
    tool_name: str
    issues: tuple[str, ...] = attrs.field(default=(), converter=_issues)

    @property
    def valid(self) -> bool:
        """Whether the call's input is a valid answer (no issues)."""
        return not self.issues

    def to_json(self) -> dict[str, Any]:
        """The check as the journal keeps it (with the response it was made in); `from_json` reads it back."""
        return {
            "type": "answer_check",
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "issues": list(self.issues),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AnswerChecked:
        """The check a journal kept (ValueError when it is malformed)."""
        call_id, tool_name, issues = data.get("call_id"), data.get("tool_name"), data.get("issues")
        if type(call_id) is not str or type(tool_name) is not str or type(issues) is not list:
            raise ValueError("an answer check is malformed")
        try:
            return cls(call_id=call_id, tool_name=tool_name, issues=tuple(issues))
        except TypeError:
            raise ValueError("an answer check is malformed") from None
