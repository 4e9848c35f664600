"""Request preflight: a curated model table and the checks a request passes before any network call.

Tools asked of a model the table says cannot call them fail with ``unsupported_capability``. A model
the table does not know (a local model, a model newer than the table) is allowed with a one-line
warning: it is assumed to call tools, and its request is sent as it is (pass a ``model_table`` with an
entry to give its limits). For known models the history is budgeted into the context window (system
prompt and tool schemas counted as fixed tokens) and ``max_tokens`` is clamped to the output limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, final

import attrs

from trioloop.protocol.budget import budget_messages, estimate_text_tokens, estimate_tools_tokens
from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode
from trioloop.protocol.tools import ChatRequest

__all__ = [
    "MODEL_TABLE",
    "ModelCapabilities",
    "lookup_model",
    "model_table",
    "preflight_request",
    "unknown_model_warning",
]


def _positive(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive int, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class ModelCapabilities:
    """What one model id can do, as the provider documents it (limits in tokens)."""

    id: str
    provider: str
    tool_calling: bool
    parallel_tool_calls: bool
    streaming: bool = True
    max_input_tokens: int = attrs.field(validator=_positive)
    max_output_tokens: int = attrs.field(validator=_positive)


def model_table(entries: Iterable[ModelCapabilities]) -> Mapping[str, ModelCapabilities]:
    """A read-only table keyed by model id; a later entry with the same id replaces an earlier one."""
    return MappingProxyType({entry.id: entry for entry in entries})


def _family(
    provider: str,
    ids: tuple[str, ...],
    *,
    max_input: int,
    max_output: int,
    tools: bool = True,
    parallel: bool = True,
) -> list[ModelCapabilities]:
    return [
        ModelCapabilities(
            id=model_id,
            provider=provider,
            tool_calling=tools,
            parallel_tool_calls=parallel and tools,
            max_input_tokens=max_input,
            max_output_tokens=max_output,
        )
        for model_id in ids
    ]


# Context windows and output limits as the providers' model pages state them. An alias and its dated
# snapshot are listed separately so an id that is neither fails closed instead of being guessed.
_ANTHROPIC = "anthropic"
_OPENAI = "openai"
# The 4.6 limits are the conservative ones (200k in, 64k out): budgeting tighter than the model is safe.
MODEL_TABLE: Final[Mapping[str, ModelCapabilities]] = model_table(
    [
        *_family(_ANTHROPIC, ("claude-opus-4-6",), max_input=200_000, max_output=64_000),
        *_family(_ANTHROPIC, ("claude-sonnet-4-6",), max_input=200_000, max_output=64_000),
        *_family(_ANTHROPIC, ("claude-opus-4-5", "claude-opus-4-5-20251101"), max_input=200_000, max_output=64_000),
        *_family(_ANTHROPIC, ("claude-opus-4-1", "claude-opus-4-1-20250805"), max_input=200_000, max_output=32_000),
        *_family(_ANTHROPIC, ("claude-opus-4-0", "claude-opus-4-20250514"), max_input=200_000, max_output=32_000),
        *_family(_ANTHROPIC, ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929"), max_input=200_000, max_output=64_000),
        *_family(_ANTHROPIC, ("claude-sonnet-4-0", "claude-sonnet-4-20250514"), max_input=200_000, max_output=64_000),
        *_family(_ANTHROPIC, ("claude-haiku-4-5", "claude-haiku-4-5-20251001"), max_input=200_000, max_output=64_000),
        *_family(
            _ANTHROPIC,
            ("claude-3-7-sonnet-latest", "claude-3-7-sonnet-20250219"),
            max_input=200_000,
            max_output=64_000,
        ),
        *_family(
            _ANTHROPIC, ("claude-3-5-haiku-latest", "claude-3-5-haiku-20241022"), max_input=200_000, max_output=8_192
        ),
        *_family(
            _OPENAI,
            ("gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20", "gpt-4o-mini", "gpt-4o-mini-2024-07-18"),
            max_input=128_000,
            max_output=16_384,
        ),
        *_family(
            _OPENAI,
            (
                "gpt-4.1",
                "gpt-4.1-2025-04-14",
                "gpt-4.1-mini",
                "gpt-4.1-mini-2025-04-14",
                "gpt-4.1-nano",
                "gpt-4.1-nano-2025-04-14",
            ),
            max_input=1_047_576,
            max_output=32_768,
        ),
        *_family(
            _OPENAI,
            (
                "gpt-5",
                "gpt-5-2025-08-07",
                "gpt-5-mini",
                "gpt-5-mini-2025-08-07",
                "gpt-5-nano",
                "gpt-5-nano-2025-08-07",
                "gpt-5.1",
                "gpt-5.1-2025-11-13",
            ),
            max_input=272_000,
            max_output=128_000,
        ),
        # Reasoning models call tools; the table does not promise parallel calls for them.
        *_family(
            _OPENAI,
            ("o3", "o3-2025-04-16", "o4-mini", "o4-mini-2025-04-16", "o3-mini", "o3-mini-2025-01-31", "o1"),
            max_input=200_000,
            max_output=100_000,
            parallel=False,
        ),
        # Streams text but has no function calling.
        *_family(_OPENAI, ("o1-mini", "o1-mini-2024-09-12"), max_input=128_000, max_output=65_536, tools=False),
    ]
)


def lookup_model(
    model: str,
    *,
    provider: str | None = None,
    table: Mapping[str, ModelCapabilities] = MODEL_TABLE,
) -> ModelCapabilities | None:
    """The exact entry for ``model``; an entry for another provider counts as unknown."""
    entry = table.get(model)
    if entry is None or (provider is not None and entry.provider != provider):
        return None
    return entry


def _quoted(model: str) -> str:
    shown = model if len(model) <= 80 else model[:79] + "…"
    return f'"{shown}"'


def unknown_model_warning(model: str) -> str:
    """The one line said about a model the table does not know."""
    return (
        f"Model {_quoted(model)} is not in trioloop's model table; assuming it can call tools "
        "and leaving its context window to the server."
    )


def preflight_request(
    request: ChatRequest,
    *,
    provider: str | None = None,
    table: Mapping[str, ModelCapabilities] = MODEL_TABLE,
) -> ChatRequest:
    """The request as it may be sent, or ``ProtocolError`` (unsupported_capability / context_overflow).

    Known model: ``max_tokens`` is clamped to the output limit and the history trimmed to the newest
    whole turn groups that fit. Unknown model: sent untouched (the provider logs ``unknown_model_warning`` once).
    """
    entry = lookup_model(request.model, provider=provider, table=table)
    if entry is None:
        return request
    if not entry.streaming:
        raise ProtocolError(
            ProtocolErrorCode.UNSUPPORTED_CAPABILITY,
            f"Model {_quoted(request.model)} cannot stream responses. Choose a model that can.",
        )
    if request.tools and not entry.tool_calling:
        raise ProtocolError(
            ProtocolErrorCode.UNSUPPORTED_CAPABILITY,
            f"Model {_quoted(request.model)} cannot call tools. Choose a model that can, or continue without tools.",
        )
    max_tokens = min(request.max_tokens, entry.max_output_tokens)
    fixed = estimate_text_tokens(request.system) + estimate_tools_tokens(request.tools)
    messages = budget_messages(request.messages, entry.max_input_tokens, max_tokens, fixed_tokens=fixed)
    return attrs.evolve(request, messages=messages, max_tokens=max_tokens)
