"""trioloop: a bounded, cancellable, reviewable AI tool loop for Trio.

What an app uses is gathered here: the `Session` over any document type (with its `DocumentKind`), tools
from typed functions (`function_tool`) or attrs input classes (`define_executable_tool`), the providers,
the limits, the state an observer reads, and the provider-neutral messages and stream events. The threat
model, the first shipped domain, is re-exported for convenience (`trioloop.threatmodel` holds all of it).
The reducer, its commands, grants and tables live in `trioloop.lowlevel`, for those who drive the machine
themselves.

The code is in layers (a lower one never imports a higher one; a test walks the imports): `protocol`
(vocabulary, `ChatProvider`) -> `machine` (the pure turn machine: decides) -> `durable` (journals and stores:
outlives a process) -> `runtime` (the Trio shell: waits), beside `providers` (wire formats, HTTP) -> `tools`
(domain-free tool helpers) -> domains (`threatmodel`) -> faces (`cli`, `ui`).

Importing ``trioloop`` loads none of them: each name below is imported the first time it is used (PEP 562),
so an app that needs the core never pays for the threat-model domain, YAML or a provider it does not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from trioloop._lazy import lazy_names

if TYPE_CHECKING:  # what type checkers and the docs see; at run time each name loads on first use (below)
    from trioloop.durable.history import ForkError, ForkOrigin, SettledTurn
    from trioloop.durable.journal import JournalError, JournalIntegrity
    from trioloop.durable.leases import LeaseLost
    from trioloop.durable.session_file import SessionFileError
    from trioloop.durable.signing import JournalKeys, JournalSigner
    from trioloop.durable.store import (
        JournalConflict,
        JournalStore,
        JournalStoreError,
        MemoryJournalStore,
        SessionLocked,
    )
    from trioloop.durable.witness import FileWitness, HeadWitness, MemoryWitness
    from trioloop.machine.card import CardDetails, one_line
    from trioloop.machine.conditions import Condition, RuleError
    from trioloop.machine.document import (
        DataDocumentKind,
        DocumentKind,
        SimpleDocumentKind,
        TextDocumentKind,
        define_document_kind,
        text_diff,
    )
    from trioloop.machine.limits import DEFAULT_TURN_LIMITS, SpendLimits, TurnLimits
    from trioloop.machine.preview import EntityChange, FieldChange, Preview, preview_call
    from trioloop.machine.prices import PRICE_TABLE, ModelPrice
    from trioloop.machine.questions import (
        Answer,
        AnswerError,
        Question,
        QuestionField,
        QuestionRefused,
        Sampled,
        SamplingRequest,
    )
    from trioloop.machine.reducer import CallRecord, CallStatus, Outcome, Phase, TurnState
    from trioloop.machine.rules import Always, ApprovalRule, Decider, DeciderKind, Verdict
    from trioloop.machine.tool_input import tool_field
    from trioloop.machine.tools import (
        Effect,
        PreparedCall,
        PrepareFailure,
        RegisteredTool,
        ToolOutcome,
        ToolRegistry,
        create_tool_registry,
    )
    from trioloop.machine.transaction import DocumentMatch, UndoAvailability, UndoHistory
    from trioloop.protocol import (
        Aborted,
        ChatProvider,
        ChatRequest,
        Message,
        MessageStart,
        MessageStop,
        ProtocolError,
        ProtocolErrorCode,
        StreamError,
        StreamEvent,
        TextBlock,
        TextDelta,
        ToolCallBlock,
        ToolCallComplete,
        ToolCallInputDelta,
        ToolCallStart,
        ToolDefinition,
        ToolResultBlock,
        Usage,
        assert_tool_pairing,
        redact_provider_detail,
    )
    from trioloop.providers.anthropic import AnthropicProvider
    from trioloop.providers.fallback import FallbackProvider
    from trioloop.providers.openai import OpenAIProvider
    from trioloop.providers.openai_responses import OpenAIResponsesProvider
    from trioloop.providers.scripted import ScriptedProvider
    from trioloop.runtime.approvals import ApprovalQuery
    from trioloop.runtime.controls import TurnControls
    from trioloop.runtime.rule_files import LoadedRules, RuleFileError, load_rules, parse_rules, trust_file
    from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
    from trioloop.runtime.session import (
        DocumentMismatch,
        Session,
        SessionBusy,
        SessionClosed,
        SessionJournalError,
        Toolset,
        ToolsMissing,
        TranscriptError,
    )
    from trioloop.runtime.spending import PriceUnknown
    from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
    from trioloop.threatmodel import (
        THREAT_MODEL,
        ThfError,
        ThreatModel,
        apply_action,
        create_ai_tool_registry,
        dump_thf,
        load_thf,
        threat_model_session,
        validate_threat_model,
    )
    from trioloop.tools.functions import ToolError, function_tool

    __version__: str

#: Where each public name lives (a test holds it to the imports above).
_HOMES: Final[dict[str, str]] = {
    "load_rules": "trioloop.runtime.rule_files",
    "LoadedRules": "trioloop.runtime.rule_files",
    "RuleFileError": "trioloop.runtime.rule_files",
    "parse_rules": "trioloop.runtime.rule_files",
    "trust_file": "trioloop.runtime.rule_files",
    "Always": "trioloop.machine.rules",
    "ApprovalQuery": "trioloop.runtime.approvals",
    "ApprovalRule": "trioloop.machine.rules",
    "Condition": "trioloop.machine.conditions",
    "Decider": "trioloop.machine.rules",
    "DeciderKind": "trioloop.machine.rules",
    "RuleError": "trioloop.machine.conditions",
    "Verdict": "trioloop.machine.rules",
    "Aborted": "trioloop.protocol",
    "Answer": "trioloop.machine.questions",
    "AnswerError": "trioloop.machine.questions",
    "AnthropicProvider": "trioloop.providers.anthropic",
    "CallRecord": "trioloop.machine.reducer",
    "CallStatus": "trioloop.machine.reducer",
    "CardDetails": "trioloop.machine.card",
    "ChatProvider": "trioloop.protocol",
    "ChatRequest": "trioloop.protocol",
    "DEFAULT_TURN_LIMITS": "trioloop.machine.limits",
    "ModelPrice": "trioloop.machine.prices",
    "PRICE_TABLE": "trioloop.machine.prices",
    "PriceUnknown": "trioloop.runtime.spending",
    "SpendLimits": "trioloop.machine.limits",
    "DocumentKind": "trioloop.machine.document",
    "DocumentMatch": "trioloop.machine.transaction",
    "DocumentMismatch": "trioloop.runtime.session",
    "Effect": "trioloop.machine.tools",
    "EntityChange": "trioloop.machine.preview",
    "FieldChange": "trioloop.machine.preview",
    "FallbackProvider": "trioloop.providers.fallback",
    "FileWitness": "trioloop.durable.witness",
    "ForkError": "trioloop.durable.history",
    "ForkOrigin": "trioloop.durable.history",
    "HeadWitness": "trioloop.durable.witness",
    "JournalConflict": "trioloop.durable.store",
    "JournalError": "trioloop.durable.journal",
    "JournalIntegrity": "trioloop.durable.journal",
    "JournalKeys": "trioloop.durable.signing",
    "JournalSigner": "trioloop.durable.signing",
    "JournalStore": "trioloop.durable.store",
    "JournalStoreError": "trioloop.durable.store",
    "MemoryJournalStore": "trioloop.durable.store",
    "MemoryWitness": "trioloop.durable.witness",
    "Message": "trioloop.protocol",
    "MessageStart": "trioloop.protocol",
    "MessageStop": "trioloop.protocol",
    "OpenAIProvider": "trioloop.providers.openai",
    "OpenAIResponsesProvider": "trioloop.providers.openai_responses",
    "Outcome": "trioloop.machine.reducer",
    "Phase": "trioloop.machine.reducer",
    "PrepareFailure": "trioloop.machine.tools",
    "PreparedCall": "trioloop.machine.tools",
    "Preview": "trioloop.machine.preview",
    "ProtocolError": "trioloop.protocol",
    "ProtocolErrorCode": "trioloop.protocol",
    "Question": "trioloop.machine.questions",
    "QuestionField": "trioloop.machine.questions",
    "QuestionRefused": "trioloop.machine.questions",
    "RegisteredTool": "trioloop.machine.tools",
    "Sampled": "trioloop.machine.questions",
    "SamplingRequest": "trioloop.machine.questions",
    "ScriptedProvider": "trioloop.providers.scripted",
    "Session": "trioloop.runtime.session",
    "SettledTurn": "trioloop.durable.history",
    "SessionBusy": "trioloop.runtime.session",
    "SessionClosed": "trioloop.runtime.session",
    "SessionFileError": "trioloop.durable.session_file",
    "SessionJournalError": "trioloop.runtime.session",
    "SessionLocked": "trioloop.durable.store",
    "LeaseLost": "trioloop.durable.leases",
    "SimpleDocumentKind": "trioloop.machine.document",
    "StreamError": "trioloop.protocol",
    "StreamEvent": "trioloop.protocol",
    "THREAT_MODEL": "trioloop.threatmodel",
    "TextBlock": "trioloop.protocol",
    "TextDelta": "trioloop.protocol",
    "TextDocumentKind": "trioloop.machine.document",
    "DataDocumentKind": "trioloop.machine.document",
    "ThfError": "trioloop.threatmodel",
    "ThreatModel": "trioloop.threatmodel",
    "ToolCallBlock": "trioloop.protocol",
    "ToolCallComplete": "trioloop.protocol",
    "ToolCallInputDelta": "trioloop.protocol",
    "ToolCallStart": "trioloop.protocol",
    "ToolDefinition": "trioloop.protocol",
    "ToolError": "trioloop.tools.functions",
    "ToolExecutionContext": "trioloop.runtime.tools",
    "ToolOutcome": "trioloop.machine.tools",
    "ToolRegistry": "trioloop.machine.tools",
    "ToolResultBlock": "trioloop.protocol",
    "ToolsMissing": "trioloop.runtime.session",
    "Toolset": "trioloop.runtime.session",
    "TranscriptError": "trioloop.runtime.session",
    "TurnControls": "trioloop.runtime.controls",
    "TurnLimits": "trioloop.machine.limits",
    "TurnRequest": "trioloop.runtime.runner",
    "TurnState": "trioloop.machine.reducer",
    "UndoAvailability": "trioloop.machine.transaction",
    "UndoHistory": "trioloop.machine.transaction",
    "Usage": "trioloop.protocol",
    "Workspace": "trioloop.runtime.runner",
    "apply_action": "trioloop.threatmodel",
    "assert_tool_pairing": "trioloop.protocol",
    "create_ai_tool_registry": "trioloop.threatmodel",
    "create_tool_registry": "trioloop.machine.tools",
    "define_document_kind": "trioloop.machine.document",
    "define_executable_tool": "trioloop.runtime.tools",
    "dump_thf": "trioloop.threatmodel",
    "function_tool": "trioloop.tools.functions",
    "load_thf": "trioloop.threatmodel",
    "one_line": "trioloop.machine.card",
    "preview_call": "trioloop.machine.preview",
    "redact_provider_detail": "trioloop.protocol",
    "run_turn": "trioloop.runtime.runner",
    "text_diff": "trioloop.machine.document",
    "threat_model_session": "trioloop.threatmodel",
    "tool_field": "trioloop.machine.tool_input",
    "validate_threat_model": "trioloop.threatmodel",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trioloop")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


if not TYPE_CHECKING:  # type checkers see the imports above, and an unknown name stays an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __version__=_version)


__all__ = [
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
