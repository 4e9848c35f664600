"""Streaming model providers: SSE framing, the Anthropic, OpenAI Chat Completions and OpenAI Responses wire
mappers, the httpx transport, bounded retry, fallback across providers, and the scripted provider that serves a
real wire format over loopback.

Each name loads on first use, so the runtime (which needs `is_retriable`) or an app using one provider never
imports the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from trioloop._lazy import lazy_names

if TYPE_CHECKING:
    from trioloop.providers.anthropic import AnthropicProvider
    from trioloop.providers.base import ChatProvider, TransientFailure, is_retriable
    from trioloop.providers.fallback import FallbackProvider
    from trioloop.providers.openai import OpenAIProvider
    from trioloop.providers.openai_responses import OpenAIResponsesProvider
    from trioloop.providers.retry import RetryPolicy
    from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep

#: Where each public name lives (a test holds it to the imports above).
_HOMES: Final[dict[str, str]] = {
    "AnthropicProvider": "trioloop.providers.anthropic",
    "ChatProvider": "trioloop.providers.base",
    "FallbackProvider": "trioloop.providers.fallback",
    "OpenAIProvider": "trioloop.providers.openai",
    "OpenAIResponsesProvider": "trioloop.providers.openai_responses",
    "RetryPolicy": "trioloop.providers.retry",
    "ScriptStep": "trioloop.providers.scripted",
    "ScriptedCall": "trioloop.providers.scripted",
    "ScriptedProvider": "trioloop.providers.scripted",
    "TransientFailure": "trioloop.providers.base",
    "is_retriable": "trioloop.providers.base",
}

if not TYPE_CHECKING:  # type checkers see the imports above, and an unknown name stays an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

__all__ = [
    "AnthropicProvider",
    "ChatProvider",
    "FallbackProvider",
    "OpenAIProvider",
    "OpenAIResponsesProvider",
    "RetryPolicy",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedProvider",
    "TransientFailure",
    "is_retriable",
]
