import attrs
import pytest

import trioloop.tools
from trioloop.machine.tools import ToolRegistry
from trioloop.threatmodel import GRAPH_ACTION_TOOLS, READ_TOOLS, create_ai_tool_registry
from trioloop.threatmodel import registry as registry_module
from trioloop.tools import END_MARKER, START_MARKER, fence

GRAPH_ORDER = [
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
]
READ_ORDER = ["get_document_summary", "get_entity", "search_entities", "search_component_catalog"]


def test_registry_is_the_read_tools_then_the_graph_tools() -> None:
    registry = create_ai_tool_registry()
    assert isinstance(registry, ToolRegistry)
    assert list(registry.names) == READ_ORDER + GRAPH_ORDER
    assert registry.tools == (*READ_TOOLS, *GRAPH_ACTION_TOOLS)
    assert [d.name for d in registry.definitions()] == READ_ORDER + GRAPH_ORDER


def test_read_tools_are_the_only_read_effect_tools() -> None:
    registry = create_ai_tool_registry()
    read = [tool.name for tool in registry if tool.effect == "read"]
    assert read == READ_ORDER
    assert all(not tool.destructive for tool in READ_TOOLS)


def test_registry_is_frozen_and_resolves_exact_names_only() -> None:
    registry = create_ai_tool_registry()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        registry.tools = ()  # type: ignore[misc]
    assert isinstance(registry.tools, tuple)
    assert registry.get("get_entity") is READ_TOOLS[1]
    for near_miss in ["Get_Entity", "get_entity ", "get_entity\u200b", "run_shell", ""]:
        assert registry.get(near_miss) is None


def test_each_call_builds_an_equal_registry() -> None:
    assert create_ai_tool_registry() == create_ai_tool_registry()


def test_package_exports() -> None:
    assert trioloop.tools.__all__ == sorted(trioloop.tools.__all__)
    assert set(trioloop.tools.__all__) == {
        "END_MARKER",
        "START_MARKER",
        "ToolError",
        "fence",
        "function_tool",
        "parse_docstring",
        "sanitize_scalar",
    }
    assert START_MARKER == "<<<UNTRUSTED_DOCUMENT_DATA>>>" and END_MARKER == "<<<END_UNTRUSTED_DOCUMENT_DATA>>>"
    assert callable(fence)
    assert registry_module.READ_TOOLS is READ_TOOLS
    assert set(registry_module.__all__) == {"GRAPH_ACTION_TOOLS", "READ_TOOLS", "create_ai_tool_registry"}
