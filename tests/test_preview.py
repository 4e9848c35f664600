"""Dry-run previews: what a card's call would add, change and remove, cascades named, nothing run."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import given, settings
from strategies_document import models_with_actions

from trioloop.machine.preview import EntityChange, FieldChange, Preview, preview_call
from trioloop.machine.tool_input import tool_field, unstructure_input
from trioloop.machine.tools import PreparedCall, ToolOutcome
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import ThreatModel, load_thf, validate_threat_model
from trioloop.threatmodel.graph_tools import GRAPH_ACTION_TOOLS
from trioloop.threatmodel.model import SECTION_NAMES
from trioloop.threatmodel.preview import diff_models

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
TOOLS = {tool.name: tool for tool in GRAPH_ACTION_TOOLS}
TOOL_FOR_ACTION = {"".join(part.title() for part in tool.name.split("_")): tool for tool in GRAPH_ACTION_TOOLS}


@pytest.fixture
def document() -> ThreatModel:
    return load_thf(PAYMENT)


def preview(name: str, raw: Any, document: ThreatModel) -> Preview:
    call = TOOLS[name].prepare(raw)
    assert isinstance(call, PreparedCall), call
    result = preview_call(call, document)
    assert result is not None
    return result


MINIMAL = {
    "add_element": {"element": {"type": "process", "name": "x"}},
    "add_data_flow": {"data_flow": {"source": "a", "target": "b"}},
    "add_trust_boundary": {"trust_boundary": {"name": "b", "contains": []}},
    "add_threat": {"threat": {"title": "t", "category": "Spoofing", "severity": "high", "element": "a"}},
}


@pytest.mark.parametrize("tool", GRAPH_ACTION_TOOLS, ids=lambda tool: tool.name)
def test_every_graph_tool_declares_a_preview(tool: Any) -> None:
    raw = MINIMAL.get(tool.name) or ({"id": "x"} if tool.name.startswith("delete_") else {"id": "x", "updates": {}})
    call = tool.prepare(raw)
    assert isinstance(call, PreparedCall) and call.preview is not None
    result = preview_call(call, ThreatModel())
    assert result is not None and (result.failure is not None or not result.is_empty)


def test_an_add_preview_names_the_new_entity_with_every_field() -> None:
    added = preview("add_element", {"element": {"type": "process", "name": "KMS"}}, ThreatModel())
    assert [(e.kind, e.id, e.name) for e in added.added] == [("element", "comp-1", "KMS")]
    fields = {f.field: (f.before, f.after) for f in added.added[0].fields}
    assert fields["name"] == (None, "KMS") and fields["type"] == (None, "process")


def test_the_issue_delete_card_names_the_threat_it_takes_with_it(document: ThreatModel) -> None:
    result = preview("delete_data_flow", {"id": "flow-10"}, document)
    assert [(e.kind, e.id) for e in result.removed] == [("data flow", "flow-10"), ("threat", "threat-7")]
    assert result.lines() == (
        "Removes data flow flow-10 (Consume payment event)",
        "Removes threat threat-7 (Customer email leaked through notifications)",
    )


def test_a_delete_element_preview_lists_its_whole_cascade(document: ThreatModel) -> None:
    result = preview("delete_element", {"id": "card-vault"}, document)
    assert [(e.kind, e.id) for e in result.removed] == [
        ("element", "card-vault"),
        ("data flow", "flow-5"),
        ("threat", "threat-4"),
    ]
    boundary = next(e for e in result.changed if e.id == "boundary-2")
    assert boundary.fields == (FieldChange(field="contains", before="[card-vault]", after="[]"),)
    assert result.added == ()


def test_an_update_preview_shows_before_and_after_field_by_field(document: ThreatModel) -> None:
    result = preview("update_threat", {"id": "threat-1", "updates": {"severity": "low"}}, document)
    assert result.changed == (
        EntityChange(
            kind="threat",
            id="threat-1",
            name="Forged settlement webhook",
            fields=(FieldChange(field="severity", before="high", after="low"),),
        ),
    )
    assert result.lines()[-1] == "  severity: high -> low"


def test_a_refused_edit_previews_as_its_failure(document: ThreatModel) -> None:
    result = preview("delete_threat", {"id": "nope"}, document)
    assert result.failure is not None and "nope" in result.failure and result.is_empty
    assert result.lines()[0].startswith("Would fail:")


def test_the_preview_follows_the_document_as_it_stands(document: ThreatModel) -> None:
    """Recomputed after an earlier approved edit commits, a card shows what will really happen."""
    second = preview("delete_threat", {"id": "threat-7"}, document)
    assert [e.id for e in second.removed] == ["threat-7"]
    first = TOOLS["delete_data_flow"].prepare({"id": "flow-10"})
    assert isinstance(first, PreparedCall)
    outcome = trio.run(first.run, ToolExecutionContext(document=document))
    assert outcome.ok and outcome.document is not None
    after = preview("delete_threat", {"id": "threat-7"}, outcome.document)
    assert after.failure is not None and "threat-7" in after.failure


@attrs.frozen(kw_only=True)
class Note:
    text: str = tool_field(min_length=1)


def test_a_preview_never_runs_the_tool_nor_touches_the_document(document: ThreatModel) -> None:
    ran: list[str] = []

    def run(value: Note, ctx: ToolExecutionContext) -> ToolOutcome:
        ran.append(value.text)
        return ToolOutcome.success("ran")

    def dry(doc: ThreatModel, value: Note) -> Preview:
        return Preview(changed=(EntityChange(kind="metadata", id="metadata", name=doc.metadata.title or ""),))

    tool = define_executable_tool(
        name="note",
        description="d",
        effect="mutate",
        destructive=False,
        input_type=Note,
        run=run,
        summarize=str,
        preview=dry,
    )
    call = tool.prepare({"text": "hi"})
    assert isinstance(call, PreparedCall)
    snapshot = copy.deepcopy(document)
    result = preview_call(call, document)
    assert result is not None and result.changed[0].name == document.metadata.title
    assert ran == [] and document == snapshot
    # Graph previews leave the document as they found it too.
    for name, raw in (
        ("delete_element", {"id": "card-vault"}),
        ("update_element", {"id": "card-vault", "updates": {"name": "V"}}),
    ):
        preview(name, raw, document)
    assert document == snapshot


def test_a_failing_or_missing_preview_never_raises(document: ThreatModel) -> None:
    def broken(doc: Any, value: Note) -> Preview:
        raise RuntimeError("boom")

    def plain(value: Note, ctx: ToolExecutionContext) -> ToolOutcome:
        return ToolOutcome.success("ran")

    for dry, expected in ((broken, "RuntimeError"), (lambda doc, value: "not a preview", "could not")):
        tool = define_executable_tool(
            name="n",
            description="d",
            effect="mutate",
            destructive=False,
            input_type=Note,
            run=plain,
            summarize=str,
            preview=dry,
        )
        call = tool.prepare({"text": "x"})
        assert isinstance(call, PreparedCall)
        result = preview_call(call, document)
        assert result is not None and result.failure is not None and expected in result.failure
    no_preview = define_executable_tool(
        name="n", description="d", effect="mutate", destructive=False, input_type=Note, run=plain, summarize=str
    ).prepare({"text": "x"})
    assert preview_call(no_preview, document) is None


@settings(max_examples=40, deadline=None)
@given(models_with_actions())
def test_the_committed_document_differs_from_the_snapshot_by_exactly_the_preview(pair: tuple[ThreatModel, Any]) -> None:
    model, action = pair
    call = TOOL_FOR_ACTION[type(action).__name__].prepare(unstructure_input(action))
    if not isinstance(call, PreparedCall):
        return  # drawn values outside the tool's bounds
    snapshot = copy.deepcopy(model)
    shown = preview_call(call, model)
    assert shown is not None and model == snapshot
    outcome = trio.run(call.run, ToolExecutionContext(document=model))
    committed = outcome.document if outcome.ok else None
    if committed is None or validate_threat_model(committed) is not None:
        assert shown.failure is not None  # the card said it would not happen
        return
    assert shown.failure is None and diff_models(snapshot, committed) == shown
    # Exactly: every entity the preview does not name is the same object value, in the same order.
    named = {(e.kind, e.id) for e in (*shown.added, *shown.changed, *shown.removed)}
    for section in SECTION_NAMES:
        kind = {"data_flows": "data flow", "trust_boundaries": "trust boundary"}.get(section, section[:-1])
        before = [e for e in snapshot.section(section) if (kind, e.id) not in named]
        after = [e for e in committed.section(section) if (kind, e.id) not in named]
        assert before == after, section
        assert {e.id for e in committed.section(section)} - {e.id for e in snapshot.section(section)} == {
            e.id for e in shown.added if e.kind == kind
        }
        assert {e.id for e in snapshot.section(section)} - {e.id for e in committed.section(section)} == {
            e.id for e in shown.removed if e.kind == kind
        }
    for field in ("version", "metadata", "extra"):
        if (field, field) not in named:
            assert getattr(snapshot, field) == getattr(committed, field)
