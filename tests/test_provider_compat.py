"""Real servers as they really stream: one contract test per reported quirk, over real loopback HTTP.

Each fixture in ``fixtures/providers/compat`` imitates one server's documented or reported stream and is
named after it (Gemini's OpenAI endpoint, vLLM, TGI, llama.cpp, Ollama, Mistral, Azure, Anthropic, SGLang,
LM Studio, DeepSeek, Moonshot, Groq, OpenRouter); its opening SSE comment says where the behaviour is
documented or reported. Whole tool loops against servers that need reasoning back are in
``test_provider_reasoning.py``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_machine import run, submit

from trioloop.machine.authorization import Violation
from trioloop.machine.reducer import CallStatus, Phase
from trioloop.protocol import (
    ChatRequest,
    Message,
    MessageStart,
    MessageStop,
    ProtocolErrorCode,
    RedactedThinkingBlock,
    StopReason,
    StreamError,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingComplete,
    ThinkingDelta,
    ToolCallBlock,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    ToolDefinition,
    ToolResultBlock,
    Usage,
    is_terminal,
)
from trioloop.providers import AnthropicProvider, OpenAIProvider
from trioloop.providers._loopback import LoopbackResponse, open_loopback_server, replay
from trioloop.providers._redact import EventScrubber
from trioloop.providers.anthropic import AnthropicRequestOptions, AnthropicStreamMapper, build_anthropic_body
from trioloop.providers.base import Messages, map_chunks
from trioloop.providers.openai import OpenAIRequestOptions, OpenAIStreamMapper
from trioloop.providers.retry import RetryPolicy
from trioloop.providers.transport import HttpChatProvider

COMPAT = Path(__file__).parent / "fixtures" / "providers" / "compat"
PROVIDERS = Path(__file__).parent / "fixtures" / "providers"
KEY = "sk-compat-canary-0123456789abcdef"
REQUEST = ChatRequest(model="local-model", messages=(Message.user("weather?"),))


def compat(name: str) -> bytes:
    return (COMPAT / f"{name}.sse").read_bytes()


async def collect(chat: HttpChatProvider, request: ChatRequest = REQUEST) -> list[StreamEvent]:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    await chat.stream(request, send)
    send.close()
    async with receive:
        events = [event async for event in receive]
    assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1]), events
    return events


async def over_loopback(body: bytes, *, wire: str = "openai", **options: Any) -> tuple[list[StreamEvent], Any]:
    response = LoopbackResponse(body=body, chunk_size=61)
    async with open_loopback_server(replay([response], fallback=response)) as server:
        if wire == "openai":
            chat: HttpChatProvider = OpenAIProvider(KEY, base_url=server.url + "/v1", **options)
        else:
            chat = AnthropicProvider(KEY, base_url=server.url, **options)
        events = await collect(chat)
    return events, server


def weather(call_id: str, city: str | None = None) -> ToolCallComplete:
    return ToolCallComplete(id=call_id, name="get_weather", input={} if city is None else {"city": city})


# -- case 1: a completed call is a call whatever the finish reason says -----------------------------


async def test_gemini_tool_call_finished_with_stop_is_a_tool_call(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("gemini_openai_tool_call_stop"))
    assert events == [
        MessageStart(model=""),
        ToolCallStart(id="c1", name="get_weather"),
        ToolCallInputDelta(id="c1", partial_json="{}"),
        weather("c1"),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ]


async def test_vllm_named_tool_choice_finished_with_stop(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("vllm_named_tool_choice_stop"))
    assert [e for e in events if not isinstance(e, ToolCallInputDelta)] == [
        MessageStart(model="Qwen/Qwen2.5-7B-Instruct"),
        ToolCallStart(id="chatcmpl-tool-8b3f", name="get_weather"),
        weather("chatcmpl-tool-8b3f", "Paris"),
        Usage(input_tokens=40, output_tokens=12),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ]


def test_a_call_ended_by_stop_waits_for_approval_instead_of_not_running() -> None:
    # The Gemini-shaped stream, naming a tool of the reducer's test registry: it awaits approval.
    body = compat("gemini_openai_tool_call_stop").replace(
        b'"name":"get_weather","arguments":"{}"', b'"name":"update","arguments":"{\\"name\\":\\"web\\"}"'
    )
    events = map_chunks(OpenAIStreamMapper(), [body])
    state = run([submit(), *events])
    assert state.phase is Phase.AWAITING_APPROVAL
    assert [(c.id, c.status) for c in state.calls] == [("c1", CallStatus.PENDING)]


# -- case 2: end of body after the finish completes; before it, still a failure ---------------------


async def test_tgi_stream_without_done_completes(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("tgi_no_done"))
    assert events == [MessageStart(model=""), TextDelta(text="hi"), MessageStop(stop_reason=StopReason.END_TURN)]


async def test_llamacpp_last_event_without_blank_line_is_read(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("llamacpp_no_trailing_blank_line"))
    assert events == [
        MessageStart(model="llama-3.2-3b-instruct"),
        TextDelta(text="Hello"),
        TextDelta(text=" there"),
        MessageStop(stop_reason=StopReason.END_TURN),
    ]


async def test_eof_before_any_finish_is_still_a_failure(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("eof_before_finish"))
    assert events[:-1] == [MessageStart(model="llama-3.2-3b-instruct"), TextDelta(text="The answer is")]
    assert events[-1] == StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)


def test_a_cut_last_event_is_dropped_not_reported() -> None:
    body = compat("llamacpp_no_trailing_blank_line")
    events = map_chunks(OpenAIStreamMapper(), [body[:-20]])
    assert events[-1] == StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)
    assert not any(isinstance(e, StreamError) and not e.terminal for e in events)


# -- cases 3 and 4: Ollama's tool-call indexes -------------------------------------------------------


async def test_ollama_parallel_calls_at_index_zero_are_two_calls(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("ollama_parallel_index_zero"))
    complete = [e for e in events if isinstance(e, ToolCallComplete)]
    assert complete == [
        ToolCallComplete(
            id="call_hello", name="file_write", input={"filePath": "hello.py", "content": "print('hello')"}
        ),
        ToolCallComplete(
            id="call_world", name="file_write", input={"filePath": "world.py", "content": "print('world')"}
        ),
    ]
    assert events[-1] == MessageStop(stop_reason=StopReason.TOOL_USE)
    assert not any(isinstance(e, StreamError) for e in events)


async def test_ollama_calls_without_index_are_kept_with_the_rest_of_the_chunk(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events, _ = await over_loopback(compat("ollama_0_4_no_index"))
    assert [e for e in events if isinstance(e, ToolCallComplete)] == [
        weather("call_a", "Paris"),
        weather("call_b", "Oslo"),
    ]
    assert events[-1] == MessageStop(stop_reason=StopReason.TOOL_USE)  # the finish in the same chunk was read
    assert not any(isinstance(e, StreamError) for e in events)


def test_fragments_without_index_or_id_continue_the_open_call_in_order() -> None:
    def chunk(fragment: dict[str, Any]) -> bytes:
        return f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'tool_calls': [fragment]}}]})}\n\n".encode()

    body = b"".join(
        [
            chunk({"id": "a", "function": {"name": "get_weather", "arguments": '{"city":'}}),
            chunk({"function": {"arguments": '"Rome"}'}}),
            chunk({"id": "b", "index": None, "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}),
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
        ]
    )
    events = map_chunks(OpenAIStreamMapper(), [body])
    assert [e for e in events if isinstance(e, ToolCallComplete)] == [weather("a", "Rome"), weather("b", "Oslo")]


def test_the_open_calls_header_repeated_continues_it() -> None:
    frame = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x","function":{"name":"f"}}]}}]}\n\n'
    events = map_chunks(
        OpenAIStreamMapper(), [frame, frame, b'data: {"choices":[{"index":0,"finish_reason":"stop"}]}\n\n']
    )
    assert [e for e in events if isinstance(e, ToolCallComplete)] == [ToolCallComplete(id="x", name="f", input={})]


def _calls_frame(*fragments: dict[str, Any]) -> bytes:
    return f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'tool_calls': list(fragments)}}]})}\n\n".encode()


def _update(call_id: str | None, index: int | None, name: str | None = "update", target: str = "web") -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": json.dumps({"name": target})}
    if name is not None:
        function["name"] = name
    fragment: dict[str, Any] = {"function": function}
    if call_id is not None:
        fragment["id"] = call_id
    if index is not None:
        fragment["index"] = index
    return fragment


_TOOL_CALLS_STOP = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'


@pytest.mark.parametrize("keyed", ["index", "id"])
def test_an_id_repeated_for_a_new_call_is_a_second_call_the_reducer_answers(keyed: str) -> None:
    # A server that reuses an id for a genuinely new call (after another one began) gives two calls: the
    # reducer renames the repeat, answers it with a duplicate_call_id error and never runs it.
    def fragment(call_id: str, index: int, target: str) -> dict[str, Any]:
        return _update(call_id, index if keyed == "index" else None, target=target)

    body = b"".join(
        [
            _calls_frame(fragment("x", 0, "web")),
            _calls_frame(fragment("y", 1, "db")),
            _calls_frame(fragment("x", 0 if keyed == "index" else 2, "psp")),
            _TOOL_CALLS_STOP,
        ]
    )
    events = map_chunks(OpenAIStreamMapper(), [body])
    assert [(e.id, e.input) for e in events if isinstance(e, ToolCallComplete)] == [
        ("x", {"name": "web"}),
        ("y", {"name": "db"}),
        ("x", {"name": "psp"}),
    ]
    assert not any(isinstance(e, StreamError) for e in events)
    state = run([submit(), *events])
    assert [v.violation for v in state.violations] == [Violation.DUPLICATE_CALL_ID]
    assert [c.status for c in state.calls] == [CallStatus.PENDING, CallStatus.PENDING, CallStatus.FAILED]
    assert state.calls[2].id != "x" and len({c.id for c in state.calls}) == 3


def test_a_call_without_a_function_name_is_reported_once_and_the_person_sees_it() -> None:
    body = b"".join(
        [
            _calls_frame(_update("a", 0)),
            _calls_frame({"index": 1, "id": "b", "function": {"arguments": '{"name":'}}),
            _calls_frame({"index": 1, "function": {"arguments": '"db"}'}}),
            _calls_frame(_update("c", 2, target="psp")),
            _TOOL_CALLS_STOP,
        ]
    )
    events = map_chunks(OpenAIStreamMapper(), [body])
    notices = [e for e in events if isinstance(e, StreamError)]
    assert notices == [
        StreamError(
            code=ProtocolErrorCode.MALFORMED_STREAM,
            message=Messages.ORPHAN_ARGUMENTS,
            provider_detail='{"name":',
            terminal=False,
        )
    ]
    assert [e.id for e in events if isinstance(e, ToolCallComplete)] == ["a", "c"]
    state = run([submit(), *events])
    assert Messages.ORPHAN_ARGUMENTS in state.notices
    assert [c.id for c in state.calls] == ["a", "c"]


def test_an_empty_fragment_for_a_finished_call_is_no_notice() -> None:
    body = b"".join(
        [
            _calls_frame(_update("a", 0)),
            _calls_frame(_update("b", 1)),
            _calls_frame({"index": 0, "function": {"arguments": ""}}),
            _TOOL_CALLS_STOP,
        ]
    )
    events = map_chunks(OpenAIStreamMapper(), [body])
    assert not any(isinstance(e, StreamError) for e in events)
    assert [e.id for e in events if isinstance(e, ToolCallComplete)] == ["a", "b"]


async def test_sglang_call_without_id_past_index_zero_is_still_a_call(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("sglang_parallel_call_without_id"))
    assert [e for e in events if isinstance(e, ToolCallComplete)] == [
        weather("call_3e9a1f0c2b7d", "Paris"),
        weather("call_1", "Oslo"),
    ]
    assert not any(isinstance(e, StreamError) for e in events)


async def test_gemini_empty_tool_call_ids_get_ids_of_their_own(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("gemini_openai_empty_tool_call_id"))
    calls = [e for e in events if isinstance(e, ToolCallComplete)]
    assert calls == [weather("call_0", "Paris"), weather("call_1", "Oslo")]
    assert [e.id for e in events if isinstance(e, ToolCallStart)] == ["call_0", "call_1"]
    # Ids of our own never collide with one the server sent in the same response.
    clash = b"".join(
        [
            _calls_frame({"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": "{}"}}),
            _calls_frame({"index": 1, "id": "", "function": {"name": "get_weather", "arguments": "{}"}}),
            _TOOL_CALLS_STOP,
        ]
    )
    assert [e.id for e in map_chunks(OpenAIStreamMapper(), [clash]) if isinstance(e, ToolCallComplete)] == [
        "call_1",
        "call_1_1",
    ]


async def test_lmstudio_new_id_on_every_fragment_is_one_call(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("lmstudio_new_id_every_fragment"))
    assert [e for e in events if isinstance(e, ToolCallComplete)] == [
        ToolCallComplete(id="716283911", name="search_entities", input={"kind": "elements"})
    ]
    assert not any(isinstance(e, StreamError) for e in events)


# -- finish reasons and usage as each server reports them -------------------------------------------


async def test_deepseek_insufficient_resource_is_a_failure_not_a_short_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events, server = await over_loopback(compat("deepseek_insufficient_system_resource"))
    assert events[:-1] == [MessageStart(model="deepseek-v4-pro"), TextDelta(text="The model has three")]
    assert events[-1] == StreamError(
        code=ProtocolErrorCode.HTTP_STATUS,
        message=Messages.STREAM_PROVIDER_ERROR,
        provider_detail="insufficient_system_resource",
    )
    assert len(server.requests) == 1  # content was shown: not retried
    # Before any content it is a temporary server error, retried like a 5xx (nothing was shown).
    early = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"insufficient_system_resource"}]}\n\n'
    [failure] = map_chunks(OpenAIStreamMapper(), [early])
    assert isinstance(failure, StreamError) and failure.message == Messages.SERVER_ERROR and failure.terminal
    fine = LoopbackResponse(body=(PROVIDERS / "openai" / "text_answer.sse").read_bytes())
    async with open_loopback_server(replay([LoopbackResponse(body=early), fine])) as retried:
        chat = OpenAIProvider(KEY, base_url=retried.url + "/v1", retry=RetryPolicy(max_attempts=2))
        again = await collect(chat)
    assert len(retried.requests) == 2 and again[-1] == MessageStop(stop_reason=StopReason.END_TURN)


def test_an_error_finish_without_an_error_object_still_fails() -> None:
    # OpenRouter and Mistral end a response that failed mid-stream with finish_reason "error".
    body = b'data: {"choices":[{"index":0,"delta":{"content":"Par"},"finish_reason":"error"}]}\n\ndata: [DONE]\n\n'
    events = map_chunks(OpenAIStreamMapper(), [body])
    assert events[-1] == StreamError(
        code=ProtocolErrorCode.HTTP_STATUS, message=Messages.STREAM_PROVIDER_ERROR, provider_detail="error"
    )
    assert sum(is_terminal(e) for e in events) == 1


@pytest.mark.parametrize(
    ("usage_at", "expected"),
    [
        # OpenAI and OpenRouter: cached tokens in prompt_tokens_details, reasoning in completion_tokens_details.
        (
            {
                "usage": {
                    "prompt_tokens": 9,
                    "completion_tokens": 5,
                    "prompt_tokens_details": {"cached_tokens": 4},
                    "completion_tokens_details": {"reasoning_tokens": 3},
                }
            },
            Usage(input_tokens=9, output_tokens=5, cache_read_input_tokens=4, reasoning_tokens=3),
        ),
        # DeepSeek (api-docs.deepseek.com): prompt_cache_hit_tokens.
        (
            {
                "usage": {
                    "prompt_tokens": 9,
                    "completion_tokens": 5,
                    "prompt_cache_hit_tokens": 6,
                    "prompt_cache_miss_tokens": 3,
                }
            },
            Usage(input_tokens=9, output_tokens=5, cache_read_input_tokens=6),
        ),
        # Moonshot: the usage in the choice, cached_tokens at its top level (vercel/ai#19546).
        (
            {"choice_usage": {"prompt_tokens": 9, "completion_tokens": 5, "cached_tokens": 2}},
            Usage(input_tokens=9, output_tokens=5, cache_read_input_tokens=2),
        ),
        # Top-level usage wins over the choice's when a server sends both.
        (
            {"usage": {"prompt_tokens": 1, "completion_tokens": 1}, "choice_usage": {"prompt_tokens": 9}},
            Usage(input_tokens=1, output_tokens=1),
        ),
        # Groq: x_groq.usage on the finishing chunk (vercel/ai#1651).
        (
            {"x_groq": {"id": "req_1", "usage": {"prompt_tokens": 7, "completion_tokens": 2}}},
            Usage(input_tokens=7, output_tokens=2),
        ),
        # Hostile shapes in the optional places are ignored, never a crash.
        ({"x_groq": {"usage": [1]}, "choice_usage": "none"}, None),
    ],
)
def test_usage_is_read_wherever_the_server_puts_it(usage_at: dict[str, Any], expected: Usage | None) -> None:
    choice: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": "stop"}
    if "choice_usage" in usage_at:
        choice["usage"] = usage_at["choice_usage"]
    chunk = {"choices": [choice], **{k: v for k, v in usage_at.items() if k != "choice_usage"}}
    events = map_chunks(OpenAIStreamMapper(), [f"data: {json.dumps(chunk)}\n\n".encode()])
    assert [e for e in events if isinstance(e, Usage)] == ([expected] if expected else [])
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)


# -- case 5: list content, reasoning kept out of the answer, and the notice cap ----------------------


async def test_mistral_list_content_is_text_and_thinking_stays_out(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("mistral_thinking_parts"))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "The answer is 42."
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    assert thinking == "".join(f"step {i}. " for i in range(29))
    assert not any(isinstance(e, StreamError) for e in events)
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)


def test_reasoning_content_fields_are_thinking_not_answer() -> None:
    body = (
        b'data: {"model":"deepseek-r1","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"reasoning":"m","content":"A"},"finish_reason":"stop"}]}\n\n'
    )
    events = map_chunks(OpenAIStreamMapper(), [body])
    assert events == [
        MessageStart(model="deepseek-r1"),
        ThinkingDelta(text="hm"),
        ThinkingDelta(text="m"),
        # The whole run, for the assistant message, before the answer it preceded; named after its first field.
        ThinkingComplete(block=ThinkingBlock(thinking="hmm", source="reasoning_content")),
        TextDelta(text="A"),
        MessageStop(stop_reason=StopReason.END_TURN),
    ]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_notices_are_capped_with_a_count_of_what_was_folded(wire: str) -> None:
    if wire == "openai":
        bad, done = b"data: {not json\n\n", b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        mapper: Any = OpenAIStreamMapper()
    else:
        bad = b"event: content_block_delta\ndata: {not json\n\n"
        done = b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}\n\n'
        mapper = AnthropicStreamMapper()
    events = map_chunks(mapper, [bad * 58, done])
    notices = [e for e in events if isinstance(e, StreamError) and not e.terminal]
    assert [n.message for n in notices] == [Messages.UNDECODABLE_EVENT] * 3 + [Messages.NOTICES_FOLDED.format(count=55)]
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)


# -- case 6: the model name from the first chunk that has one (Azure) -------------------------------


async def test_azure_prompt_filter_chunk_does_not_hide_the_model(autojump_clock: trio.testing.MockClock) -> None:
    events, _ = await over_loopback(compat("azure_prompt_filter_first_chunk"))
    assert events == [
        MessageStart(model="gpt-4.1-2025-04-14"),
        TextDelta(text="Hi."),
        MessageStop(stop_reason=StopReason.END_TURN),
    ]


# -- case 7: an in-stream overload before any content is retried like HTTP 529 -----------------------


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
async def test_in_stream_overload_before_content_is_retried(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    overloaded = LoopbackResponse(body=(PROVIDERS / wire / "overloaded_in_stream.sse").read_bytes())
    fine = LoopbackResponse(body=(PROVIDERS / wire / "text_answer.sse").read_bytes())
    async with open_loopback_server(replay([overloaded, fine])) as server:
        if wire == "anthropic":
            chat: HttpChatProvider = AnthropicProvider(KEY, base_url=server.url, retry=RetryPolicy(max_attempts=2))
        else:
            chat = OpenAIProvider(KEY, base_url=server.url + "/v1", retry=RetryPolicy(max_attempts=2))
        events = await collect(chat)
    assert len(server.requests) == 2
    assert events[0] == MessageStart(model="fixture-model-1")
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)


# -- cases 8 and 9: request fields per server, Azure's query string and api-key header ---------------


async def test_compatible_servers_get_max_tokens_and_openai_gets_the_current_field(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, server = await over_loopback(compat("tgi_no_done"))
    body = server.requests[0].json()
    assert body["max_tokens"] == REQUEST.max_tokens and "max_completion_tokens" not in body
    assert body["stream_options"] == {"include_usage": True}
    assert OpenAIRequestOptions.for_base_url(None) == OpenAIRequestOptions()
    assert OpenAIRequestOptions.for_base_url("https://api.openai.com/v1").max_tokens_field == "max_completion_tokens"
    assert OpenAIRequestOptions.for_base_url("https://res.openai.azure.com/openai/v1").auth == "api-key"
    assert OpenAIRequestOptions.for_base_url("http://localhost:11434/v1").max_tokens_field == "max_tokens"


async def test_request_options_override_what_is_sent(autojump_clock: trio.testing.MockClock) -> None:
    options = OpenAIRequestOptions(max_tokens_field=None, include_usage=False)
    _, server = await over_loopback(compat("tgi_no_done"), options=options)
    body = server.requests[0].json()
    assert not {"max_tokens", "max_completion_tokens", "stream_options"} & set(body)


async def test_azure_base_url_keeps_its_query_and_sends_the_api_key_header(
    autojump_clock: trio.testing.MockClock,
) -> None:
    response = LoopbackResponse(body=compat("azure_prompt_filter_first_chunk"))
    async with open_loopback_server(replay([response])) as server:
        chat = OpenAIProvider(
            KEY,
            base_url=server.url + "/openai/deployments/gpt41/?api-version=2024-10-21",
            options=OpenAIRequestOptions(auth="api-key"),
        )
        events = await collect(chat)
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)
    [request] = server.requests
    assert request.target == "/openai/deployments/gpt41/chat/completions?api-version=2024-10-21"
    assert request.header("api-key") == KEY and request.header("authorization") is None


# -- case 11: extended thinking is opt-in, kept in history and sent back verbatim -------------------


async def test_anthropic_thinking_blocks_stream_in_order_with_cache_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events, _ = await over_loopback(compat("anthropic_thinking_tool_use"), wire="anthropic")
    signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxDYhmRtXJFKNPbWWkiMPVU"
    assert [e for e in events if not isinstance(e, ToolCallInputDelta | ToolCallStart)] == [
        MessageStart(model="claude-sonnet-4-5-20250929"),
        ThinkingDelta(text="The user wants the weather. "),
        ThinkingDelta(text="I should call get_weather."),
        ThinkingComplete(
            block=ThinkingBlock(thinking="The user wants the weather. I should call get_weather.", signature=signature)
        ),
        ThinkingComplete(
            block=RedactedThinkingBlock(data="EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP")
        ),
        weather("toolu_01W", "Paris"),
        Usage(input_tokens=4250, output_tokens=90, cache_read_input_tokens=3000, cache_creation_input_tokens=1200),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ]


def test_the_reducer_keeps_thinking_in_the_assistant_message_in_stream_order() -> None:
    body = (
        compat("anthropic_thinking_tool_use")
        .replace(b'"get_weather"', b'"update"')
        .replace(b'{\\"city\\": \\"Paris\\"}', b'{\\"name\\": \\"web\\"}')
    )
    state = run([submit(), *map_chunks(AnthropicStreamMapper(), [body])])
    assert state.phase is Phase.AWAITING_APPROVAL
    assistant = state.messages[-1]
    kinds = [type(b).__name__ for b in assistant.content]
    assert kinds == ["ThinkingBlock", "RedactedThinkingBlock", "ToolCallBlock"]
    assert state.usage.cache_read_input_tokens == 3000 and state.usage.cache_creation_input_tokens == 1200


def test_thinking_goes_back_verbatim_and_thinking_is_opt_in() -> None:
    thinking = ThinkingBlock(thinking="Let me look.", signature="sig==")
    history = (
        Message.user("weather?"),
        Message(
            role="assistant",
            content=(thinking, RedactedThinkingBlock(data="opaque"), ToolCallBlock(id="t", name="w", input={})),
        ),
        Message(role="user", content=(ToolResultBlock(call_id="t", content="sunny"),)),
    )
    request = ChatRequest(model="m", messages=history, max_tokens=1000)
    plain = build_anthropic_body(request, AnthropicRequestOptions(prompt_caching=False))
    assert "thinking" not in plain and plain["max_tokens"] == 1000
    assert plain["messages"][1]["content"][:2] == [
        {"type": "thinking", "thinking": "Let me look.", "signature": "sig=="},
        {"type": "redacted_thinking", "data": "opaque"},
    ]
    on = build_anthropic_body(request, AnthropicRequestOptions(thinking_budget_tokens=2048, prompt_caching=False))
    assert on["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert on["max_tokens"] > 2048  # the budget must stay below max_tokens
    with pytest.raises(ValueError, match="1024"):
        AnthropicRequestOptions(thinking_budget_tokens=100)


# -- prompt caching: breakpoints on the system prompt, the tools and the conversation prefix ---------


def test_cache_breakpoints_on_system_tools_and_prefix() -> None:
    tool = ToolDefinition(name="w", description="Weather.", json_schema={"type": "object"})
    history = (
        Message.user("first"),
        Message(role="assistant", content=(ThinkingBlock(thinking="t", signature="s"), TextBlock(text="ok"))),
        Message.user("second"),
    )
    body = build_anthropic_body(ChatRequest(model="m", system="Be terse.", messages=history, tools=(tool, tool)))
    ephemeral = {"type": "ephemeral"}
    assert body["system"] == [{"type": "text", "text": "Be terse.", "cache_control": ephemeral}]
    assert [t.get("cache_control") for t in body["tools"]] == [None, ephemeral]
    marked = [
        (i, block["type"]) for i, m in enumerate(body["messages"]) for block in m["content"] if "cache_control" in block
    ]
    assert marked == [(2, "text")]  # the newest message: the whole prefix before it is reread from cache


# -- case 13: the key never reaches a log line, header echoes included -------------------------------


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
async def test_key_echoed_in_headers_is_masked_in_debug_logs(
    wire: str, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    body = (PROVIDERS / wire / "text_answer.sse").read_bytes()
    echo = (("content-type", "text/event-stream"), ("x-echo-key", KEY), ("x-echo-auth", f"Bearer {KEY}"))
    rejected = LoopbackResponse(status=401, headers=echo, body=f'{{"error": {{"message": "bad key {KEY}"}}}}'.encode())
    responses = [LoopbackResponse(headers=echo, body=body), rejected]
    with caplog.at_level(logging.DEBUG):
        async with open_loopback_server(replay(responses)) as server:
            if wire == "anthropic":
                chat: HttpChatProvider = AnthropicProvider(KEY, base_url=server.url, retry=None)
            else:
                chat = OpenAIProvider(KEY, base_url=server.url + "/v1", retry=None)
            await collect(chat)
            failed = await collect(chat)
            logging.getLogger("trioloop.providers").debug("echo %s and %r", KEY, {"key": KEY})
    assert isinstance(failed[-1], StreamError) and KEY not in repr(failed)
    messages = [record.getMessage() for record in caplog.records]
    headers = [m for m in messages if "receive_response_headers.complete" in m]
    assert headers and all("[redacted-key]" in m for m in headers)  # the echo was logged, masked
    assert not any(KEY in m for m in messages)
    assert KEY not in caplog.text


def test_thinking_text_is_scrubbed_of_the_key_like_answer_text() -> None:
    scrubber = EventScrubber(KEY)
    half = len(KEY) // 2
    out = [
        *scrubber.process(ThinkingDelta(text=f"I see {KEY[:half]}")),
        *scrubber.process(ThinkingDelta(text=f"{KEY[half:]} here")),
        *scrubber.process(ThinkingComplete(block=ThinkingBlock(thinking=f"I see {KEY} here", signature="s"))),
        *scrubber.process(ThinkingComplete(block=RedactedThinkingBlock(data=KEY))),
    ]
    assert KEY not in repr(out)
    assert "".join(e.text for e in out if isinstance(e, ThinkingDelta)) == "I see [redacted-key] here"


def test_deeply_nested_thinking_parts_neither_crash_nor_leak_into_the_answer() -> None:
    part: Any = [{"type": "text", "text": "deep"}]
    for _ in range(300):
        part = [{"type": "thinking", "thinking": part}]
    chunk = {"choices": [{"index": 0, "delta": {"content": [*part, {"type": "text", "text": "ok"}]}}]}
    body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    events = map_chunks(OpenAIStreamMapper(), [body])
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["ok"]
    assert isinstance(events[-1], MessageStop)
