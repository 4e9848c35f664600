"""trioloop: a bounded, cancellable, reviewable AI tool loop for Trio.

What an app uses is gathered here: the `Session` over any document type (with its `DocumentKind`), tools
from typed functions (`function_tool`) or attrs input classes (`define_executable_tool`), the providers,
the limits, the state an observer reads, and the provider-neutral messages and stream events. The threat
model, the first shipped domain, is re-exported for convenience (`trioloop.threatmodel` holds all of it).
The reducer, its commands, grants and tables live in `trioloop.lowlevel`, for those who drive the machine
themselves.

Layers (a lower one never imports a higher one): `protocol` (vocabulary, `ChatProvider`) -> `providers`
(wire formats, HTTP) and `loop` (document interface, limits, authorization, tool runtime, reducer,
transaction, runner, session; generic over the document) -> `tools` (domain-free tool helpers) -> domains
(`threatmodel`) -> faces (`cli`, `ui`). A test walks the imports and enforces it.
"""

from importlib.metadata import PackageNotFoundError, version

from trioloop.loop.card import CardDetails, one_line
from trioloop.loop.document import (
    DocumentKind,
    SimpleDocumentKind,
    TextDocumentKind,
    define_document_kind,
    text_diff,
)
from trioloop.loop.journal import JournalError
from trioloop.loop.journal_store import (
    JournalConflict,
    JournalStore,
    JournalStoreError,
    MemoryJournalStore,
    SessionLocked,
)
from trioloop.loop.limits import DEFAULT_TURN_LIMITS, TurnLimits
from trioloop.loop.machine import CallRecord, CallStatus, Outcome, Phase, TurnState
from trioloop.loop.preview import EntityChange, FieldChange, Preview, preview_call
from trioloop.loop.questions import (
    Answer,
    AnswerError,
    Question,
    QuestionField,
    QuestionRefused,
    Sampled,
    SamplingRequest,
)
from trioloop.loop.runner import TurnControls, TurnRequest, Workspace, run_turn
from trioloop.loop.session import Session, SessionBusy, SessionClosed, SessionJournalError, Toolset, TranscriptError
from trioloop.loop.session_file import SessionFileError
from trioloop.loop.tool_runtime import (
    Effect,
    PreparedCall,
    PrepareFailure,
    RegisteredTool,
    ToolExecutionContext,
    ToolOutcome,
    ToolRegistry,
    create_tool_registry,
    define_executable_tool,
    tool_field,
)
from trioloop.loop.transaction import UndoAvailability, UndoHistory
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
from trioloop.providers.openai import OpenAIProvider
from trioloop.providers.openai_responses import OpenAIResponsesProvider
from trioloop.providers.scripted import ScriptedProvider
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

try:
    __version__ = version("trioloop")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_TURN_LIMITS",
    "THREAT_MODEL",
    "Aborted",
    "Answer",
    "AnswerError",
    "AnthropicProvider",
    "CallRecord",
    "CallStatus",
    "CardDetails",
    "ChatProvider",
    "ChatRequest",
    "DocumentKind",
    "Effect",
    "EntityChange",
    "FieldChange",
    "JournalConflict",
    "JournalError",
    "JournalStore",
    "JournalStoreError",
    "MemoryJournalStore",
    "Message",
    "MessageStart",
    "MessageStop",
    "OpenAIProvider",
    "OpenAIResponsesProvider",
    "Outcome",
    "Phase",
    "PrepareFailure",
    "PreparedCall",
    "Preview",
    "ProtocolError",
    "ProtocolErrorCode",
    "Question",
    "QuestionField",
    "QuestionRefused",
    "RegisteredTool",
    "Sampled",
    "SamplingRequest",
    "ScriptedProvider",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "SessionFileError",
    "SessionJournalError",
    "SessionLocked",
    "SimpleDocumentKind",
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
    "Toolset",
    "TranscriptError",
    "TurnControls",
    "TurnLimits",
    "TurnRequest",
    "TurnState",
    "UndoAvailability",
    "UndoHistory",
    "Usage",
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
    "load_thf",
    "one_line",
    "preview_call",
    "redact_provider_detail",
    "run_turn",
    "text_diff",
    "threat_model_session",
    "tool_field",
    "validate_threat_model",
]
