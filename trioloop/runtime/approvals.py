"""``needs_approval``: a tool's (or a toolset's) own function of each valid call, asked by the runtime just before
the reducer decides the call. What it says becomes a `CodeVerdict` input, journaled with the response, so replay
never calls it again. It is held to the rules' table (`trioloop.machine.rules.decide_call`): an allow never covers
a destructive call, and a read-only tool can only be made stricter. An exception, or anything that is not a
verdict, means ask, and the person is told which function failed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from trioloop.machine.rules import CodeVerdict, Verdict
from trioloop.machine.tools import PreparedCall, RegisteredTool
from trioloop.protocol.events import ToolCallComplete

__all__ = ["ApprovalQuery", "ask_needs_approval"]

_REASON_MAX: Final = 500


@final
@attrs.frozen(kw_only=True)
class ApprovalQuery:
    """What a ``needs_approval`` function is given: the tool's name, the call's canonical input (a copy of its
    own: changing it changes nothing), its effect, whether it is destructive, and the card's summary."""

    name: str
    input: Any
    effect: str
    destructive: bool
    summary: str


def _name(function: object) -> str:
    module = getattr(function, "__module__", None) or ""
    qualname = getattr(function, "__qualname__", None) or type(function).__name__
    return f"{module}.{qualname}" if module else str(qualname)


def _private(value: Any) -> Any:
    if type(value) is dict:
        return {k: _private(v) for k, v in value.items()}
    if type(value) is list:
        return [_private(v) for v in value]
    return value


def ask_needs_approval(tool: RegisteredTool[Any], event: ToolCallComplete) -> CodeVerdict | None:
    """The verdict of ``tool``'s ``needs_approval`` on the call ``event`` opens, or None when the tool has none
    or the call is not valid (an invalid input is answered with its problems; no function sees it)."""
    function = tool.needs_approval
    if function is None or event.input_error is not None:
        return None
    prepared = tool.prepare(event.input)
    if not isinstance(prepared, PreparedCall):
        return None
    name = _name(function)
    common: Mapping[str, str] = {"call_id": event.id, "tool_name": tool.name, "function": name}
    query = ApprovalQuery(
        name=tool.name,
        input=_private(prepared.canonical),
        effect=tool.effect,
        destructive=tool.destructive,
        summary=prepared.summary,
    )
    try:
        said = function(query)
    except Exception as exc:  # the app's code: a failure asks the person, who is told
        return CodeVerdict(**common, verdict=Verdict.ASK, note=f"raised {type(exc).__name__}")
    reason = ""
    if isinstance(said, tuple) and len(said) == 2 and type(said[1]) is str:
        said, reason = said  # (verdict, reason): the reason a denial gives the model
    try:
        verdict = Verdict(said)
    except ValueError:
        return CodeVerdict(**common, verdict=Verdict.ASK, note="returned something that is not allow, ask or deny")
    return CodeVerdict(**common, verdict=verdict, reason=reason[:_REASON_MAX])
