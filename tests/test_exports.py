"""The public surface: DESIGN.md's names importable from `trioloop`, `__all__` complete and sorted."""

from __future__ import annotations

import importlib
import runpy
from pathlib import Path

import pytest

import trioloop

DESIGN_NAMES = [
    "ThreatModel",
    "load_thf",
    "dump_thf",
    "validate_threat_model",
    "ThfError",
    "apply_action",
    "Message",
    "TextBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "assert_tool_pairing",
    "MessageStart",
    "TextDelta",
    "ToolCallStart",
    "ToolCallInputDelta",
    "ToolCallComplete",
    "Usage",
    "MessageStop",
    "StreamError",
    "Aborted",
    "StreamEvent",
    "ProtocolError",
    "ProtocolErrorCode",
    "redact_provider_detail",
    "TurnLimits",
    "DEFAULT_TURN_LIMITS",
    "budget_exhaustion",
    "Grant",
    "grant_for_call",
    "grant_for_batch",
    "auto_grant_read_only",
    "authorize_start",
    "Violation",
    "TurnState",
    "Phase",
    "CallStatus",
    "Outcome",
    "reduce_turn",
    "Submit",
    "ApproveCall",
    "ApproveBatch",
    "DenyCall",
    "StartCall",
    "CallSettled",
    "Advance",
    "Retry",
    "Cancel",
    "UndoTurn",
    "define_executable_tool",
    "RegisteredTool",
    "PreparedCall",
    "ToolOutcome",
    "ToolExecutionContext",
    "create_tool_registry",
    "canonical_json",
    "input_digest",
    "commit_tool_outcome",
    "UndoHistory",
    "turn_undo_availability",
    "run_turn",
    "Session",
    "AnthropicProvider",
    "OpenAIProvider",
    "ScriptedProvider",
    "create_ai_tool_registry",
]


def test_design_names_are_exported() -> None:
    missing = [name for name in DESIGN_NAMES if name not in trioloop.__all__ or not hasattr(trioloop, name)]
    assert missing == []


@pytest.mark.parametrize(
    "module",
    ["trioloop", "trioloop.protocol", "trioloop.threatmodel", "trioloop.loop", "trioloop.tools", "trioloop.providers"],
)
def test_all_is_sorted_and_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    names = list(mod.__all__)
    assert names == sorted(names, key=lambda n: (not n.isupper(), n)) or names == sorted(names)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(mod, name), f"{module}.{name}"


def test_py_typed_ships() -> None:
    assert (Path(trioloop.__file__).parent / "py.typed").exists()


def test_embedding_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "embed.py"
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert "review: Add threat" in out and "completed 1 threat added" in out and "undone: True" in out
