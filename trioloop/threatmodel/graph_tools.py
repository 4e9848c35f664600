"""The twelve graph edit tools: thin wrappers that apply one `trioloop.threatmodel` action.

Every tool is `mutate`; the four deletes are also destructive, so they always need their own grant.
A run applies its action to the document snapshot in `ctx.document` and returns the whole next
document, or a failure that says what was missing. Summaries are built from the validated input
alone (never from the document), so what the reviewer approves is exactly what was asked; each tool
also declares a dry-run preview (`trioloop.threatmodel.preview`) naming every entity it would add,
change or remove on the document as it stands, cascades included. The four adds claim the id of what
they add (`trioloop.threatmodel.new_ids`): bound to the reservation the step made, the preview names
that id and the run adds exactly it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Final, TypeVar

import attrs
import trio

from trioloop.machine.canonical import input_digest
from trioloop.machine.card import CardDetails, input_details
from trioloop.machine.preview import Preview
from trioloop.machine.reservations import IdClaim, Reservation
from trioloop.machine.tool_input import json_schema_for, structure_input, unstructure_input
from trioloop.machine.tools import ClaimingCall, PreparedCall, PrepareFailure, RegisteredTool, ToolOutcome
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel.action_inputs import (
    AddDataFlow,
    AddElement,
    AddThreat,
    AddTrustBoundary,
    DeleteDataFlow,
    DeleteElement,
    DeleteThreat,
    DeleteTrustBoundary,
    UpdateDataFlow,
    UpdateElement,
    UpdateThreat,
    UpdateTrustBoundary,
)
from trioloop.threatmodel.actions import ActionFailure, apply_action_with_report
from trioloop.threatmodel.errors import quote
from trioloop.threatmodel.model import ThreatModel
from trioloop.threatmodel.new_ids import claim_of, reserved_action
from trioloop.threatmodel.preview import graph_preview

__all__ = ["GRAPH_ACTION_TOOLS"]

A = TypeVar("A")

_IDS: Final = (
    "Ids look like comp-3 (elements), flow-2 (data flows), boundary-1 (trust boundaries) and threat-4 "
    "(threats), though a document may use other ids; read them from the document, never guess."
)


def _run(input: Any, ctx: ToolExecutionContext[ThreatModel]) -> ToolOutcome[ThreatModel]:
    result = apply_action_with_report(ctx.document, input)
    if isinstance(result, ActionFailure):
        return ToolOutcome.failure(result.message)
    return ToolOutcome.success(result.report, document=result.model)


def _set_fields(updates: Any) -> str:
    """What an update sets: short scalar values shown quoted, lists and objects by name only."""
    parts = []
    for field in attrs.fields(type(updates)):
        value = getattr(updates, field.name)
        if value is None:
            continue
        if isinstance(value, str):
            parts.append(f"{field.name} → {quote(value, limit=40)}" if value else f"clear {field.name}")
        elif isinstance(value, bool | int | float):
            parts.append(f"{field.name} → {str(value).lower() if isinstance(value, bool) else value}")
        else:
            parts.append(field.name)
    return ", ".join(parts) if parts else "no fields"


def _tool(
    name: str,
    description: str,
    input_type: type[A],
    summarize: Callable[[A], str],
    *,
    destructive: bool = False,
) -> RegisteredTool[ThreatModel]:
    return define_executable_tool(
        name=name,
        description=f"{description} {_IDS}",
        effect="mutate",
        destructive=destructive,
        input_type=input_type,
        run=_run,
        summarize=summarize,
        preview=graph_preview,
    )


def _add_tool(
    name: str, description: str, input_type: type[A], key: str, summarize: Callable[[A], str]
) -> RegisteredTool[ThreatModel]:
    """An add: as `_tool` makes it, and its call claims the id of the entity under ``key`` in its input."""
    schema = json_schema_for(input_type)

    def prepare(raw: Any) -> PreparedCall[ThreatModel] | PrepareFailure:
        action = structure_input(raw, input_type)
        if isinstance(action, PrepareFailure):
            return action
        canonical = unstructure_input(action)
        # Lines for a card, made only if one is shown (``canonical`` is this call's own).
        details = partial(input_details, canonical)
        made = _AddCall(
            action=action,
            summary=summarize(action),
            digest=input_digest(canonical),
            details=details,
            canonical=canonical,
        )
        return made.bound(claim_of(key, action), ())

    return RegisteredTool(
        name=name,
        description=f"{description} {_IDS}",
        effect="mutate",
        destructive=False,
        json_schema=schema,
        prepare_fn=prepare,
    )


@attrs.frozen(kw_only=True)
class _AddCall:
    """One validated add, and how to make its prepared call bound to the reservation of the id it claims."""

    action: Any
    summary: str
    digest: str
    details: Callable[[], CardDetails]
    canonical: Any = None

    def bound(self, claim: IdClaim, reservations: tuple[Reservation, ...]) -> ClaimingCall[ThreatModel]:
        """The prepared call whose preview and run use the id ``reservations`` give (none: the next free one)."""
        invoke = partial(_run_reserved, self.action, reservations)
        return ClaimingCall(
            summary=self.summary,
            input_digest=self.digest,
            run=partial(_run_async, invoke),
            details=self.details,
            preview=partial(_preview_reserved, self.action, reservations),
            invoke=invoke,
            claims=(claim,),
            reservations=reservations,
            with_ids=partial(self.bound, claim),
            canonical=self.canonical,
        )


def _run_reserved(
    action: Any, reservations: tuple[Reservation, ...], ctx: ToolExecutionContext[ThreatModel]
) -> ToolOutcome[ThreatModel]:
    resolved = reserved_action(action, reservations, ctx.document)
    return ToolOutcome.failure(resolved) if isinstance(resolved, str) else _run(resolved, ctx)


async def _run_async(
    invoke: Callable[[ToolExecutionContext[ThreatModel]], ToolOutcome[ThreatModel]],
    ctx: ToolExecutionContext[ThreatModel],
) -> ToolOutcome[ThreatModel]:
    outcome = invoke(ctx)
    await trio.lowlevel.checkpoint()
    return outcome


def _preview_reserved(action: Any, reservations: tuple[Reservation, ...], document: ThreatModel) -> Preview:
    resolved = reserved_action(action, reservations, document)
    return Preview(failure=resolved) if isinstance(resolved, str) else graph_preview(document, resolved)


def _flow_summary(action: AddDataFlow) -> str:
    flow = action.data_flow
    label = f" ({quote(flow.name)})" if flow.name else ""
    return f"Add data flow {quote(flow.source)} → {quote(flow.target)}{label}"


def _threat_summary(action: AddThreat) -> str:
    threat = action.threat
    targets = []
    if threat.element is not None:
        targets.append(f"element {quote(threat.element)}")
    if threat.flow is not None:
        targets.append(f"data flow {quote(threat.flow)}")
    on = f" on {' and '.join(targets)}" if targets else ""
    return f"Add threat {quote(threat.title)} ({threat.category}, {threat.severity}){on}"


GRAPH_ACTION_TOOLS: Final[tuple[RegisteredTool[ThreatModel], ...]] = (
    _add_tool(
        "add_element",
        "Add a component (process, data store, external entity, ...) to the threat model. Omit element.id "
        "to get the next free comp-N id; layer and group must name existing ones. The result gives the new id.",
        AddElement,
        "element",
        lambda a: f"Add element {quote(a.element.name)} ({quote(a.element.type, limit=40)[1:-1]})",
    ),
    _tool(
        "update_element",
        "Change fields of an existing element. Only fields present in updates change; an empty string clears "
        "an optional text field; lists are replaced whole.",
        UpdateElement,
        lambda a: f"Update element {quote(a.id)}: {_set_fields(a.updates)}",
    ),
    _tool(
        "delete_element",
        "Delete an element. Its data flows, its relationships, the threats targeting it or those flows, and "
        "its trust boundary memberships are removed with it.",
        DeleteElement,
        lambda a: f"Delete element {quote(a.id)} with its data flows, relationships, threats and memberships",
        destructive=True,
    ),
    _add_tool(
        "add_data_flow",
        "Add a directed data flow from one existing element (source) to another (target). Omit data_flow.id "
        "to get the next free flow-N id; flow_number defaults to the next number.",
        AddDataFlow,
        "data_flow",
        _flow_summary,
    ),
    _tool(
        "update_data_flow",
        "Change fields of an existing data flow. Only fields present in updates change; source and target "
        "must stay existing element ids.",
        UpdateDataFlow,
        lambda a: f"Update data flow {quote(a.id)}: {_set_fields(a.updates)}",
    ),
    _tool(
        "delete_data_flow",
        "Delete a data flow and the threats that target it.",
        DeleteDataFlow,
        lambda a: f"Delete data flow {quote(a.id)} with the threats that target it",
        destructive=True,
    ),
    _add_tool(
        "add_trust_boundary",
        "Add a trust boundary around existing elements (contains lists element ids). Omit trust_boundary.id "
        "to get the next free boundary-N id.",
        AddTrustBoundary,
        "trust_boundary",
        lambda a: (
            f"Add trust boundary {quote(a.trust_boundary.name)} around {len(a.trust_boundary.contains)} element(s)"
        ),
    ),
    _tool(
        "update_trust_boundary",
        "Change an existing trust boundary. Only fields present in updates change; contains replaces the "
        "member list and must list existing element ids.",
        UpdateTrustBoundary,
        lambda a: f"Update trust boundary {quote(a.id)}: {_set_fields(a.updates)}",
    ),
    _tool(
        "delete_trust_boundary",
        "Delete a trust boundary. The elements inside it stay.",
        DeleteTrustBoundary,
        lambda a: f"Delete trust boundary {quote(a.id)}",
        destructive=True,
    ),
    _add_tool(
        "add_threat",
        "Add a threat against an existing element, an existing data flow, or both (at least one is required). "
        "category is a STRIDE category; severity is critical, high, medium, low or info. Omit threat.id to "
        "get the next free threat-N id.",
        AddThreat,
        "threat",
        _threat_summary,
    ),
    _tool(
        "update_threat",
        "Change fields of an existing threat. Only fields present in updates change; mitigation replaces "
        "the whole mitigation; the threat must still target an element or a data flow.",
        UpdateThreat,
        lambda a: f"Update threat {quote(a.id)}: {_set_fields(a.updates)}",
    ),
    _tool(
        "delete_threat",
        "Delete a threat.",
        DeleteThreat,
        lambda a: f"Delete threat {quote(a.id)}",
        destructive=True,
    ),
)
