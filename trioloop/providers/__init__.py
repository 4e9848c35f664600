"""Streaming model providers: SSE framing, the Anthropic, OpenAI Chat Completions and OpenAI Responses wire
mappers, the httpx transport, bounded retry, and the scripted provider that serves a real wire format over
loopback."""

from trioloop.providers.anthropic import AnthropicProvider
from trioloop.providers.base import ChatProvider, TransientFailure, is_retriable
from trioloop.providers.openai import OpenAIProvider
from trioloop.providers.openai_responses import OpenAIResponsesProvider
from trioloop.providers.retry import RetryPolicy
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep

__all__ = [
    "AnthropicProvider",
    "ChatProvider",
    "OpenAIProvider",
    "OpenAIResponsesProvider",
    "RetryPolicy",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedProvider",
    "TransientFailure",
    "is_retriable",
]
