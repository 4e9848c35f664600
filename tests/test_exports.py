"""The public surface: DESIGN.md's names importable from `trioloop`, `__all__` complete and sorted."""

from __future__ import annotations

import importlib
import runpy
from pathlib import Path

import pytest

import trioloop
import trioloop.lowlevel

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
    # Each DESIGN.md name is public: at the top level (what an app uses) or in trioloop.lowlevel (the machine).
    missing = [name for name in DESIGN_NAMES if not hasattr(trioloop, name) and not hasattr(trioloop.lowlevel, name)]
    assert missing == []


#: What an app uses. Pinned: a name added or dropped here is a public API change, made on purpose.
TOP_LEVEL = [
    "DEFAULT_TURN_LIMITS",
    "PRICE_TABLE",
    "THREAT_MODEL",
    "Aborted",
    "Always",
    "Answer",
    "AnswerError",
    "AnthropicProvider",
    "ApprovalQuery",
    "ApprovalRule",
    "CallRecord",
    "CallStatus",
    "CardDetails",
    "ChatProvider",
    "ChatRequest",
    "Condition",
    "DataDocumentKind",
    "Decider",
    "DeciderKind",
    "DocumentKind",
    "DocumentMatch",
    "DocumentMismatch",
    "Effect",
    "EntityChange",
    "FallbackProvider",
    "FieldChange",
    "FileWitness",
    "ForkError",
    "ForkOrigin",
    "HeadWitness",
    "JournalConflict",
    "JournalError",
    "JournalIntegrity",
    "JournalKeys",
    "JournalSigner",
    "JournalStore",
    "JournalStoreError",
    "LeaseLost",
    "LoadedRules",
    "MemoryJournalStore",
    "MemoryWitness",
    "Message",
    "MessageStart",
    "MessageStop",
    "ModelPrice",
    "OpenAIProvider",
    "OpenAIResponsesProvider",
    "Outcome",
    "Phase",
    "PrepareFailure",
    "PreparedCall",
    "Preview",
    "PriceUnknown",
    "ProtocolError",
    "ProtocolErrorCode",
    "Question",
    "QuestionField",
    "QuestionRefused",
    "RegisteredTool",
    "RuleError",
    "RuleFileError",
    "Sampled",
    "SamplingRequest",
    "ScriptedProvider",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "SessionFileError",
    "SessionJournalError",
    "SessionLocked",
    "SettledTurn",
    "SimpleDocumentKind",
    "SpendLimits",
    "StreamError",
    "StreamEvent",
    "TextBlock",
    "TextDelta",
    "TextDocumentKind",
    "ThfError",
    "ThreatModel",
    "ToolCallBlock",
    "ToolCallComplete",
    "ToolCallInputDelta",
    "ToolCallStart",
    "ToolDefinition",
    "ToolError",
    "ToolExecutionContext",
    "ToolOutcome",
    "ToolRegistry",
    "ToolResultBlock",
    "ToolsMissing",
    "Toolset",
    "TranscriptError",
    "TurnControls",
    "TurnLimits",
    "TurnRequest",
    "TurnState",
    "UndoAvailability",
    "UndoHistory",
    "Usage",
    "Verdict",
    "Workspace",
    "__version__",
    "apply_action",
    "assert_tool_pairing",
    "create_ai_tool_registry",
    "create_tool_registry",
    "define_document_kind",
    "define_executable_tool",
    "dump_thf",
    "function_tool",
    "load_rules",
    "load_thf",
    "one_line",
    "parse_rules",
    "preview_call",
    "redact_provider_detail",
    "run_turn",
    "text_diff",
    "threat_model_session",
    "tool_field",
    "trust_file",
    "validate_threat_model",
]

#: The reducer, its commands, grants, tables and the pure commit/undo functions.
LOW_LEVEL = [
    "CALL_STATUS_EDGES",
    "PHASE_TRANSITIONS",
    "Advance",
    "AnswerChecked",
    "AnswerSpec",
    "ApproveBatch",
    "ApproveCall",
    "BeforeRequest",
    "Bound",
    "CallSettled",
    "Cancel",
    "ClaimingCall",
    "Committed",
    "Denial",
    "DenialReason",
    "DenyCall",
    "Grant",
    "IdClaim",
    "IdRefused",
    "IdScheme",
    "InputKind",
    "Overrun",
    "Refusal",
    "Refused",
    "Reservation",
    "Retry",
    "Revoke",
    "Spending",
    "StartCall",
    "Submit",
    "TurnBudget",
    "TurnCommand",
    "TurnInput",
    "Unchanged",
    "UndoEntry",
    "UndoTurn",
    "Violation",
    "ViolationRecord",
    "authorize_start",
    "auto_grant_read_only",
    "bound_notice",
    "budget_exhaustion",
    "canonical_json",
    "commit_tool_outcome",
    "grant_for_batch",
    "grant_for_call",
    "input_digest",
    "overrun_notice",
    "reduce_turn",
    "spend_overrun",
    "tool_call_cap",
    "turn_undo_availability",
    "undo_turn",
    "usage_cost",
]


def test_the_two_public_lists_are_pinned() -> None:
    assert trioloop.__all__ == TOP_LEVEL
    assert trioloop.lowlevel.__all__ == LOW_LEVEL
    assert not set(TOP_LEVEL) & set(LOW_LEVEL)  # each name has one home


def test_the_machine_is_not_at_the_top_level() -> None:
    for name in ("reduce_turn", "Submit", "ApproveCall", "grant_for_call", "PHASE_TRANSITIONS", "commit_tool_outcome"):
        assert name in trioloop.lowlevel.__all__ and name not in trioloop.__all__


def test_version_matches_the_project_metadata() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert trioloop.__version__ == project["version"]


@pytest.mark.parametrize(
    "module",
    [
        "trioloop",
        "trioloop.lowlevel",
        "trioloop.protocol",
        "trioloop.threatmodel",
        "trioloop.stores",
        "trioloop.audit",
        "trioloop.inbox",
        "trioloop.aio",
        "trioloop.tools",
        "trioloop.providers",
    ],
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


@pytest.mark.parametrize("package", ["trioloop", "trioloop.providers"])
def test_each_lazy_name_loads_from_the_module_the_type_checker_sees(package: str) -> None:
    # A lazy package names every public name twice: imported under TYPE_CHECKING (what mypy and the docs read)
    # and in _HOMES (what loads it at run time). The two must agree, name for name and module for module.
    import ast

    module = importlib.import_module(package)
    assert module.__file__ is not None
    source = Path(module.__file__).read_text(encoding="utf-8")
    guarded = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    )
    seen = {
        alias.name: node.module for node in guarded.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    homes = module._HOMES
    assert seen == homes
    assert set(module.__all__) - {"__version__"} == set(seen)
    for name, home in seen.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name)
    assert set(dir(module)) >= set(module.__all__)
    with pytest.raises(AttributeError, match="no attribute"):
        module.NotAName  # noqa: B018


LIGHT_IMPORT_PROBE = """
import sys
import trioloop
heavy = ("yaml", "trioloop.threatmodel", "mcp", "trioloop.mcp", "opentelemetry", "trioloop.otel", "psycopg",
         "PySide6", "trioloop.ui", "rich", "httpx", "trioloop.providers", "sqlite3", "jsonschema")
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m in heavy)))
from trioloop import Session, MemoryJournalStore, function_tool
optional = ("yaml", "mcp", "PySide6", "psycopg", "opentelemetry", "trioloop.threatmodel", "trioloop.mcp",
            "trioloop.otel")
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in optional or m in optional)))
"""


def test_import_trioloop_is_light() -> None:
    # `import trioloop` loads no optional layer, no domain and no provider; a core name loads the core only.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LIGHT_IMPORT_PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    at_import, after_core_names = done.stdout.splitlines()
    assert at_import == ""
    assert after_core_names == ""
