import copy
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from strategies_document import models_with_actions

from trioloop.machine.tool_input import unstructure_input
from trioloop.machine.tools import PreparedCall, PrepareFailure, ToolOutcome
from trioloop.runtime.tools import ToolExecutionContext
from trioloop.threatmodel import ThreatModel, load_thf, validate_threat_model
from trioloop.threatmodel.graph_tools import GRAPH_ACTION_TOOLS

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
NAMES = (
    "add_element",
    "update_element",
    "delete_element",
    "add_data_flow",
    "update_data_flow",
    "delete_data_flow",
    "add_trust_boundary",
    "update_trust_boundary",
    "delete_trust_boundary",
    "add_threat",
    "update_threat",
    "delete_threat",
)
TOOLS = {tool.name: tool for tool in GRAPH_ACTION_TOOLS}


@pytest.fixture(scope="module")
def model() -> ThreatModel:
    return load_thf(EXAMPLE)


def prepared(name: str, raw: Any) -> PreparedCall:
    result = TOOLS[name].prepare(raw)
    assert isinstance(result, PreparedCall), result
    return result


def issues(name: str, raw: Any) -> tuple[str, ...]:
    result = TOOLS[name].prepare(raw)
    assert isinstance(result, PrepareFailure), result
    return result.issues


async def run(name: str, raw: Any, document: ThreatModel) -> ToolOutcome:
    return await prepared(name, raw).run(ToolExecutionContext(document=document))


def test_twelve_tools_in_order_all_mutate_and_deletes_destructive() -> None:
    assert tuple(tool.name for tool in GRAPH_ACTION_TOOLS) == NAMES
    for tool in GRAPH_ACTION_TOOLS:
        assert tool.effect == "mutate"
        assert tool.destructive == tool.name.startswith("delete_")
        assert "comp-3" in tool.description  # tells the model what ids look like


def test_schemas_carry_the_constraints() -> None:
    element = TOOLS["add_element"].json_schema["properties"]["element"]
    assert element["additionalProperties"] is False
    assert element["required"] == ["type", "name"]
    assert element["properties"]["name"]["minLength"] == 1 and element["properties"]["name"]["maxLength"] == 200
    threat = TOOLS["add_threat"].json_schema["properties"]["threat"]["properties"]
    assert threat["category"]["enum"][0] == "Spoofing" and len(threat["category"]["enum"]) == 6
    assert threat["severity"]["enum"] == ["critical", "high", "medium", "low", "info"]
    assert threat["mitigation"]["properties"]["status"]["enum"][0] == "not_started"
    update = TOOLS["update_element"].json_schema
    assert update["required"] == ["id", "updates"]
    assert "required" not in update["properties"]["updates"]  # every update field is optional
    assert TOOLS["delete_threat"].json_schema["required"] == ["id"]


@pytest.mark.parametrize(
    ("name", "raw", "fragment"),
    [
        ("add_element", {"element": {"type": "process"}}, "element.name: required field is missing"),
        ("add_element", {"element": {"type": "process", "name": ""}}, "element.name: must be at least 1"),
        ("add_element", {"element": {"type": "p", "name": "n", "colour": "red"}}, "'colour' is not an accepted key"),
        ("add_element", {"action": "add_element", "element": {"type": "p", "name": "n"}}, "'action'"),
        ("add_threat", {"threat": {"title": "t", "category": "Phishing", "severity": "high"}}, "threat.category"),
        ("add_threat", {"threat": {"title": "t", "category": "Spoofing", "severity": "High"}}, "threat.severity"),
        ("update_element", {"id": "", "updates": {}}, "id: must be at least 1"),
        ("update_threat", {"id": "t", "updates": {"mitigation": {"status": "done", "description": ""}}}, "status"),
        ("delete_element", {"id": 7}, "id: expected a string"),
        ("add_data_flow", {"data_flow": {"source": "a", "target": "b", "flow_number": 0}}, "flow_number: must be >="),
    ],
)
def test_prepare_refuses_bad_input(name: str, raw: Any, fragment: str) -> None:
    assert any(fragment in issue for issue in issues(name, raw)), issues(name, raw)


@pytest.mark.parametrize(
    ("name", "raw", "summary"),
    [
        (
            "add_element",
            {"element": {"type": "data_store", "name": "Card vault"}},
            'Add element "Card vault" (data_store)',
        ),
        (
            "update_element",
            {"id": "comp-3", "updates": {"name": "Vault", "layer": "", "tags": ["x"]}},
            'Update element "comp-3": name → "Vault", clear layer, tags',
        ),
        (
            "delete_element",
            {"id": "db-1"},
            'Delete element "db-1" with its data flows, relationships, threats and memberships',
        ),
        (
            "add_data_flow",
            {"data_flow": {"source": "a", "target": "b", "name": "Sync"}},
            'Add data flow "a" → "b" ("Sync")',
        ),
        (
            "update_data_flow",
            {"id": "flow-2", "updates": {"authenticated": True, "flow_number": 4}},
            'Update data flow "flow-2": authenticated → true, flow_number → 4',
        ),
        ("delete_data_flow", {"id": "flow-2"}, 'Delete data flow "flow-2" with the threats that target it'),
        (
            "add_trust_boundary",
            {"trust_boundary": {"name": "DMZ", "contains": ["a", "b"]}},
            'Add trust boundary "DMZ" around 2 element(s)',
        ),
        ("update_trust_boundary", {"id": "boundary-1", "updates": {}}, 'Update trust boundary "boundary-1": no fields'),
        ("delete_trust_boundary", {"id": "boundary-1"}, 'Delete trust boundary "boundary-1"'),
        (
            "add_threat",
            {"threat": {"title": "Replay", "category": "Spoofing", "severity": "high", "flow": "flow-1"}},
            'Add threat "Replay" (Spoofing, high) on data flow "flow-1"',
        ),
        (
            "update_threat",
            {"id": "threat-1", "updates": {"severity": "low"}},
            'Update threat "threat-1": severity → "low"',
        ),
        ("delete_threat", {"id": "threat-1"}, 'Delete threat "threat-1"'),
    ],
)
def test_summaries_are_one_line_from_input_alone(name: str, raw: Any, summary: str) -> None:
    assert prepared(name, raw).summary == summary


def test_summaries_escape_control_and_bidi_characters() -> None:
    summary = prepared("add_element", {"element": {"type": "p\nq", "name": "x\u202e\n[approved]"}}).summary
    assert "\n" not in summary and "\u202e" not in summary
    assert summary == 'Add element "x\\u202e\\u000a[approved]" (p\\u000aq)'


async def test_success_returns_the_next_document_and_a_short_result(model: ThreatModel) -> None:
    description = "x" * 3000
    raw = {"element": {"type": "data_store", "name": "Cache", "description": description}}
    outcome = await run("add_element", raw, model)
    assert outcome.ok and outcome.document is not None
    assert outcome.result == 'Added element "Cache" ("data_store") with id "comp-1".'
    assert description not in outcome.result
    assert validate_threat_model(outcome.document) is None
    assert outcome.document.elements[-1].description == description
    assert model == load_thf(EXAMPLE)  # the context's document is not touched


async def test_failure_names_what_is_missing(model: ThreatModel) -> None:
    outcome = await run("add_data_flow", {"data_flow": {"source": "browser", "target": "nowhere"}}, model)
    assert not outcome.ok and outcome.document is None
    assert outcome.result == 'Cannot add data flow: endpoint "nowhere" does not exist (no element with that id).'
    outcome = await run("delete_threat", {"id": "threat-99"}, model)
    assert outcome.result == 'Cannot delete threat: no threat with id "threat-99".'


async def test_destructive_delete_cascades_to_a_valid_document(model: ThreatModel) -> None:
    outcome = await run("delete_element", {"id": "card-vault"}, model)
    assert outcome.ok and outcome.document is not None
    assert validate_threat_model(outcome.document) is None
    assert outcome.result == (
        'Deleted element "card-vault" with 1 data flow, 1 threat, 0 relationships; removed it from 2 trust boundaries.'
    )


async def test_summary_does_not_depend_on_the_document(model: ThreatModel) -> None:
    call = prepared("delete_element", {"id": "payment-service"})
    other = prepared("delete_element", {"id": "payment-service"})
    assert call.summary == other.summary and call.input_digest == other.input_digest
    await call.run(ToolExecutionContext(document=model))
    await call.run(ToolExecutionContext(document=ThreatModel()))
    assert prepared("delete_element", {"id": "payment-service"}).summary == call.summary


@settings(max_examples=60, deadline=None)
@given(models_with_actions())
def test_any_tool_call_yields_a_valid_document_or_a_failure(pair: tuple[ThreatModel, Any]) -> None:
    import trio

    model, action = pair
    name = {
        "AddElement": "add_element",
        "UpdateElement": "update_element",
        "DeleteElement": "delete_element",
        "AddDataFlow": "add_data_flow",
        "UpdateDataFlow": "update_data_flow",
        "DeleteDataFlow": "delete_data_flow",
        "AddTrustBoundary": "add_trust_boundary",
        "UpdateTrustBoundary": "update_trust_boundary",
        "DeleteTrustBoundary": "delete_trust_boundary",
        "AddThreat": "add_threat",
        "UpdateThreat": "update_threat",
        "DeleteThreat": "delete_threat",
    }[type(action).__name__]
    raw = _without_nones(unstructure_input(action))
    call = TOOLS[name].prepare(raw)
    if isinstance(call, PrepareFailure):
        return  # drawn values outside the tool's bounds (e.g. an id longer than allowed)
    snapshot = copy.deepcopy(model)
    outcome = trio.run(call.run, ToolExecutionContext(document=model))
    assert model == snapshot
    assert "\n" not in outcome.result and "\n" not in call.summary
    if outcome.ok:
        assert outcome.document is not None and validate_threat_model(outcome.document) is None
    else:
        assert outcome.document is None and outcome.result.startswith("Cannot ")


def _without_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nones(item) for key, item in value.items() if item is not None}
    if isinstance(value, list | tuple):
        return [_without_nones(item) for item in value]
    return value


def test_action_inputs_are_frozen() -> None:
    from trioloop.threatmodel import DeleteElement

    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        DeleteElement(id="x").id = "y"  # type: ignore[misc]
