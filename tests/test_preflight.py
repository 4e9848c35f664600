"""Request preflight: the model table, capability refusals before the network, and history budgeting."""

from __future__ import annotations

import logging
import math

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.protocol import (
    ChatRequest,
    Message,
    ProtocolError,
    ProtocolErrorCode,
    StreamError,
    StreamEvent,
    TextBlock,
    ToolCallBlock,
    ToolDefinition,
    ToolResultBlock,
    assert_tool_pairing,
    turn_groups,
)
from trioloop.protocol.budget import estimate_message_tokens, estimate_text_tokens, estimate_tools_tokens
from trioloop.protocol.preflight import (
    MODEL_TABLE,
    ModelCapabilities,
    lookup_model,
    model_table,
    preflight_request,
    unknown_model_warning,
)
from trioloop.providers import AnthropicProvider, OpenAIProvider
from trioloop.providers._loopback import open_loopback_server, replay

TOOL = ToolDefinition(name="get_entity", description="Read one entity.", json_schema={"type": "object"})


def request(model: str, *, tools: bool = False, messages: tuple[Message, ...] = (), **kw: object) -> ChatRequest:
    return ChatRequest(
        model=model,
        messages=messages or (Message.user("hi"),),
        tools=(TOOL,) if tools else (),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("claude-opus-4-0", "anthropic"),
        ("claude-opus-4-20250514", "anthropic"),
        ("claude-sonnet-4-0", "anthropic"),
        ("claude-sonnet-4-20250514", "anthropic"),
        ("claude-sonnet-4-5", "anthropic"),
        ("claude-3-5-haiku-latest", "anthropic"),
        ("claude-3-5-haiku-20241022", "anthropic"),
        ("gpt-4o", "openai"),
        ("gpt-4.1", "openai"),
        ("gpt-4.1-mini", "openai"),
        ("o3", "openai"),
        ("o4-mini", "openai"),
    ],
)
def test_curated_models_are_known_and_tool_capable(model: str, provider: str) -> None:
    entry = lookup_model(model, provider=provider)
    assert entry is not None and entry.tool_calling and entry.streaming
    assert entry.max_output_tokens < entry.max_input_tokens


def test_table_is_read_only_and_consistent() -> None:
    with pytest.raises(TypeError):
        MODEL_TABLE["x"] = MODEL_TABLE["gpt-4o"]  # type: ignore[index]
    for model_id, entry in MODEL_TABLE.items():
        assert entry.id == model_id and entry.provider in ("anthropic", "openai")
        assert not entry.parallel_tool_calls or entry.tool_calling


def test_capabilities_reject_nonsense_limits() -> None:
    with pytest.raises(ValueError):
        ModelCapabilities(
            id="m", provider="p", tool_calling=True, parallel_tool_calls=True, max_input_tokens=0, max_output_tokens=1
        )


@pytest.mark.parametrize("model", ["gpt-4o", "some-future-model", "claude-sonnet-4", "qwen2.5-coder:7b"])
def test_unknown_or_foreign_model_with_tools_is_sent_untouched(model: str) -> None:
    original = request(model, tools=True, max_tokens=999_999)
    assert preflight_request(original, provider="anthropic") is original
    assert "assuming it can call tools" in unknown_model_warning(model)


async def test_the_provider_warns_once_per_unknown_model(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    send, _receive = trio.open_memory_channel[StreamEvent](math.inf)
    async with open_loopback_server(replay([])) as server:
        chat = AnthropicProvider("k", base_url=server.url, retry=None)
        with caplog.at_level(logging.WARNING, logger="trioloop.providers"):
            for _ in range(2):
                await chat.stream(request("claude-from-the-future", tools=True), send)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [unknown_model_warning("claude-from-the-future")]
    assert len(server.requests) == 2  # sent, not refused


def test_unknown_model_text_only_passes_untouched() -> None:
    original = request("some-future-model", max_tokens=999_999)
    assert preflight_request(original, provider="openai") is original


def test_model_without_tool_calling_is_refused_with_tools_only() -> None:
    with pytest.raises(ProtocolError) as caught:
        preflight_request(request("o1-mini", tools=True), provider="openai")
    assert caught.value.code is ProtocolErrorCode.UNSUPPORTED_CAPABILITY
    assert "cannot call tools" in caught.value.message
    assert preflight_request(request("o1-mini"), provider="openai").model == "o1-mini"


def test_non_streaming_model_is_refused() -> None:
    table = model_table(
        [
            ModelCapabilities(
                id="batch-only",
                provider="openai",
                tool_calling=True,
                parallel_tool_calls=False,
                streaming=False,
                max_input_tokens=1000,
                max_output_tokens=100,
            )
        ]
    )
    with pytest.raises(ProtocolError):
        preflight_request(request("batch-only"), provider="openai", table=table)


def test_max_tokens_is_clamped_to_the_model() -> None:
    assert preflight_request(request("claude-3-5-haiku-latest", max_tokens=50_000)).max_tokens == 8_192
    assert preflight_request(request("claude-3-5-haiku-latest", max_tokens=1_000)).max_tokens == 1_000


SMALL = model_table(
    [
        ModelCapabilities(
            id="small",
            provider="anthropic",
            tool_calling=True,
            parallel_tool_calls=True,
            max_input_tokens=200,
            max_output_tokens=50,
        )
    ]
)


def test_system_prompt_and_tools_count_as_fixed_tokens() -> None:
    history = (Message.user("a" * 400), Message.assistant("b" * 40), Message.user("c" * 40))
    # Budget: 200 - 50 reserved = 150; the messages alone cost 104 + 14 + 14 = 132.
    plain = preflight_request(request("small", messages=history, max_tokens=50), table=SMALL)
    assert plain.messages == history
    heavy = request("small", messages=history, max_tokens=50, system="s" * 80)  # 20 fixed tokens: 152 > 150
    assert preflight_request(heavy, table=SMALL).messages == history[1:]
    with_tools = request("small", messages=history, max_tokens=50, tools=True)
    assert estimate_tools_tokens((TOOL,)) > 0
    fits = 132 + estimate_tools_tokens((TOOL,)) <= 150
    assert (preflight_request(with_tools, table=SMALL).messages == history) is fits


def test_history_that_cannot_fit_is_context_overflow() -> None:
    with pytest.raises(ProtocolError) as caught:
        preflight_request(request("small", messages=(Message.user("x" * 10_000),)), table=SMALL)
    assert caught.value.code is ProtocolErrorCode.CONTEXT_OVERFLOW


def _group(index: int, size: int, with_call: bool) -> list[Message]:
    if not with_call:
        return [Message.user("u" * size)]
    call = ToolCallBlock(id=f"c{index}", name="get_entity", input={"n": index})
    return [
        Message(role="assistant", content=(TextBlock(text="t" * size), call)),
        Message(role="user", content=(ToolResultBlock(call_id=f"c{index}", content="r" * size),)),
    ]


@settings(max_examples=100, deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(0, 300), st.booleans()), min_size=1, max_size=8),
    system=st.integers(0, 200),
)
def test_budgeted_history_is_a_fitting_suffix_of_whole_groups(groups: list[tuple[int, bool]], system: int) -> None:
    history = tuple(m for i, (size, call) in enumerate(groups) for m in _group(i, size, call))
    original = request("small", messages=history, max_tokens=50, system="s" * system)
    try:
        prepared = preflight_request(original, table=SMALL)
    except ProtocolError as exc:
        assert exc.code is ProtocolErrorCode.CONTEXT_OVERFLOW
        return
    kept = prepared.messages
    assert kept and history[len(history) - len(kept) :] == kept
    suffixes = [tuple(m for g in turn_groups(history)[i:] for m in g) for i in range(len(turn_groups(history)))]
    assert tuple(kept) in suffixes
    assert not assert_tool_pairing(kept)
    cost = sum(estimate_message_tokens(m) for m in kept) + estimate_text_tokens(original.system)
    assert cost <= 200 - 50


@pytest.mark.parametrize("provider_class", [AnthropicProvider, OpenAIProvider])
async def test_refusal_happens_before_any_network_call(
    provider_class: type[AnthropicProvider] | type[OpenAIProvider], autojump_clock: trio.testing.MockClock
) -> None:
    provider_name = "anthropic" if provider_class is AnthropicProvider else "openai"
    table = model_table(
        [
            SMALL["small"],
            attrs.evolve(SMALL["small"], id="small-openai", provider="openai"),
            attrs.evolve(SMALL["small"], id="no-tools", provider=provider_name, tool_calling=False),
        ]
    )
    small = "small" if provider_class is AnthropicProvider else "small-openai"
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    async with open_loopback_server(replay([])) as server:
        chat = provider_class("k", base_url=server.url, retry=None, model_table=table)
        await chat.stream(request("no-tools", tools=True), send)
        await chat.stream(request(small, messages=(Message.user("x" * 10_000),)), send)
    send.close()
    events = [event async for event in receive]
    assert [(type(e), getattr(e, "code", None)) for e in events] == [
        (StreamError, ProtocolErrorCode.UNSUPPORTED_CAPABILITY),
        (StreamError, ProtocolErrorCode.CONTEXT_OVERFLOW),
    ]
    assert server.requests == []
