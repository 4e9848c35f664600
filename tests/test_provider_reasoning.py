"""Reasoning on the Chat Completions wire: kept in the assistant message, sent back where a server needs it.

The mapper turns each run of streamed reasoning into one unsigned ``ThinkingBlock`` naming its field, and
OpenRouter's ``reasoning_details`` into a ``ProviderBlock``; the request body sends them back on assistant
messages with tool calls as ``OpenAIRequestOptions`` says. Then one contract test per server: a whole tool
loop through a ``Session`` against a loopback server that behaves as that server is documented or reported
to (its fixture file names the source), refusing the second request the way the real one does.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from torture_support import payment

from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.protocol import (
    ChatRequest,
    Message,
    MessageStart,
    MessageStop,
    ProviderBlock,
    ProviderBlockComplete,
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
    ToolResultBlock,
    assert_tool_pairing,
)
from trioloop.providers import OpenAIProvider
from trioloop.providers._loopback import LoopbackRequest, LoopbackResponse, open_loopback_server
from trioloop.providers.base import Messages, map_chunks
from trioloop.providers.openai import OpenAIRequestOptions, OpenAIStreamMapper, build_openai_body
from trioloop.providers.sse import SseFrame
from trioloop.threatmodel import threat_model_session

COMPAT = Path(__file__).parent / "fixtures" / "providers" / "compat"
KEY = "sk-reasoning-canary-0123456789abcdef"


def compat(name: str) -> bytes:
    return (COMPAT / f"{name}.sse").read_bytes()


def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


def fragment(index: int, call_id: str | None = None, name: str | None = None, arguments: str = "") -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    item: dict[str, Any] = {"index": index, "function": function}
    if call_id is not None:
        item["id"] = call_id
    return {"tool_calls": [item]}


def mapped(*frames: bytes) -> list[StreamEvent]:
    return map_chunks(OpenAIStreamMapper(), [b"".join(frames)])


def blocks(events: list[StreamEvent]) -> list[ThinkingBlock]:
    return [e.block for e in events if isinstance(e, ThinkingComplete) and isinstance(e.block, ThinkingBlock)]


# -- the mapper: reasoning lands in the message, in stream order ------------------------------------


def test_reasoning_is_one_block_before_the_first_call_and_still_streams_live() -> None:
    events = mapped(
        frame({"role": "assistant", "content": None, "reasoning_content": ""}),
        frame({"reasoning_content": "Read the "}),
        frame({"reasoning_content": "summary."}),
        frame(fragment(0, "c1", "get_document_summary", "{}")),
        frame({}, "tool_calls"),
        DONE,
    )
    assert events == [
        MessageStart(model="m"),
        ThinkingDelta(text="Read the "),
        ThinkingDelta(text="summary."),
        ThinkingComplete(block=ThinkingBlock(thinking="Read the summary.", source="reasoning_content")),
        ToolCallStart(id="c1", name="get_document_summary"),
        ToolCallInputDelta(id="c1", partial_json="{}"),
        ToolCallComplete(id="c1", name="get_document_summary", input={}),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ]


def test_a_field_sent_twice_with_the_same_text_is_read_once() -> None:
    # vLLM renamed reasoning_content to reasoning and kept both for a while; OpenRouter streams `reasoning`.
    events = mapped(frame({"reasoning_content": "same", "reasoning": "same"}), frame({"content": "A"}, "stop"))
    assert [e.text for e in events if isinstance(e, ThinkingDelta)] == ["same"]
    assert blocks(events) == [ThinkingBlock(thinking="same", source="reasoning_content")]
    different = mapped(frame({"reasoning_content": "one ", "reasoning": "two"}), frame({}, "stop"))
    assert blocks(different) == [ThinkingBlock(thinking="one two", source="reasoning_content")]


def test_reasoning_after_the_answer_is_a_second_block_in_stream_order() -> None:
    events = mapped(
        frame({"reasoning": "first"}),
        frame({"content": "Answer."}),
        frame({"reasoning": "second"}),
        frame({}, "stop"),
    )
    kinds = [type(e).__name__ for e in events if not isinstance(e, ThinkingDelta)]
    assert kinds == ["MessageStart", "ThinkingComplete", "TextDelta", "ThinkingComplete", "MessageStop"]
    assert blocks(events) == [
        ThinkingBlock(thinking="first", source="reasoning"),
        ThinkingBlock(thinking="second", source="reasoning"),
    ]


def test_reasoning_streamed_as_content_parts_names_content_as_its_source() -> None:
    part = {"type": "thinking", "thinking": [{"type": "text", "text": "mull"}]}
    events = mapped(frame({"content": [part, {"type": "text", "text": "ok"}]}, "stop"))
    assert blocks(events) == [ThinkingBlock(thinking="mull", source="content")]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["ok"]


def test_a_failed_stream_keeps_no_thinking_block() -> None:
    events = mapped(frame({"reasoning": "half a thought"}), b'data: {"error": {"message": "boom"}}\n\n')
    assert blocks(events) == [] and isinstance(events[-1], StreamError) and events[-1].terminal
    cut = map_chunks(OpenAIStreamMapper(), [frame({"reasoning": "cut"})])
    assert blocks(cut) == [] and isinstance(cut[-1], StreamError)


def test_openrouter_reasoning_details_fragments_merge_into_one_provider_block() -> None:
    events = map_chunks(OpenAIStreamMapper(), [compat("openrouter_gemini_reasoning_details_tool_call")])
    [block] = [e.block for e in events if isinstance(e, ProviderBlockComplete)]
    assert (block.wire, block.kind) == ("openai", "reasoning_details")
    assert json.loads(block.data) == {
        "reasoning_details": [
            {
                "type": "reasoning.text",
                "text": "**Reading the model**\n\nI will start from the summary.",
                "format": "google-gemini-v1",
                "index": 0,
            },
            {
                "type": "reasoning.encrypted",
                "data": "CiQB0e2Kb7xq9Yw3pG5tHsLrM1nVaE8dZ4uFkJ6cQyR2oW0iXg==",
                "id": "tool_get_document_summary_7hQ2mZ",
                "format": "google-gemini-v1",
                "index": 1,
            },
        ]
    }
    assert events[-2:] == [ProviderBlockComplete(block=block), MessageStop(stop_reason=StopReason.TOOL_USE)]


def test_an_anthropic_signature_in_the_last_fragment_is_kept_whole() -> None:
    # Claude via OpenRouter: text in pieces, then a text-less fragment with the signature (agno-agi/agno#8794).
    detail = {"type": "reasoning.text", "format": "anthropic-claude-v1", "index": 0}
    events = mapped(
        frame({"reasoning": "Let", "reasoning_details": [{**detail, "text": "Let"}]}),
        frame({"reasoning": " me", "reasoning_details": [{**detail, "text": " me"}]}),
        frame({"reasoning_details": [{**detail, "signature": "Et8BCmUIDxgC"}, 7]}),
        frame({}, "stop"),
    )
    [block] = [e.block for e in events if isinstance(e, ProviderBlockComplete)]
    assert json.loads(block.data)["reasoning_details"] == [{**detail, "text": "Let me", "signature": "Et8BCmUIDxgC"}]
    notices = [e for e in events if isinstance(e, StreamError)]
    assert [n.message for n in notices] == [Messages.UNDECODABLE_EVENT]  # the stray 7 is reported, not kept


# -- properties: any chunking gives the same blocks and calls; reasoning never leaks into the answer ---

_reasoning_text = st.text(alphabet="abcdefgh .", min_size=1, max_size=40)
_answer_text = st.text(alphabet="XYZ!", max_size=20)  # disjoint from the reasoning alphabet
_argument_values = st.dictionaries(st.sampled_from(["id", "kind", "n"]), st.integers(0, 99), max_size=3)


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if text[a:b]]


@settings(max_examples=120, deadline=None)
@given(
    reasoning=_reasoning_text,
    answer=_answer_text,
    calls=st.lists(_argument_values, max_size=3),
    field=st.sampled_from(["reasoning_content", "reasoning"]),
    reasoning_cuts=st.lists(st.integers(0, 60), max_size=8),
    argument_cuts=st.lists(st.integers(0, 60), max_size=6),
    byte_cut=st.floats(0, 1),
)
def test_any_chunking_gives_the_same_thinking_block_and_calls(
    reasoning: str,
    answer: str,
    calls: list[dict[str, int]],
    field: str,
    reasoning_cuts: list[int],
    argument_cuts: list[int],
    byte_cut: float,
) -> None:
    frames = [frame({field: piece}) for piece in _pieces(reasoning, reasoning_cuts)]
    frames += [frame({"content": piece}) for piece in _pieces(answer, reasoning_cuts)]
    for index, arguments in enumerate(calls):
        text = json.dumps(arguments)
        pieces = _pieces(text, argument_cuts) or [""]
        frames.append(frame(fragment(index, f"call_{index}", "f", pieces[0])))
        frames += [frame(fragment(index, arguments=piece)) for piece in pieces[1:]]
    body = b"".join([*frames, frame({}, "tool_calls" if calls else "stop"), DONE])
    at = int(byte_cut * len(body))
    events = map_chunks(OpenAIStreamMapper(), [body[:at], body[at:]])
    assert events == map_chunks(OpenAIStreamMapper(), [body])
    assert blocks(events) == [ThinkingBlock(thinking=reasoning, source=field)]
    assert "".join(e.text for e in events if isinstance(e, ThinkingDelta)) == reasoning
    answer_text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert answer_text == answer and not set(answer_text) & set(reasoning)
    assert [(c.id, c.input) for c in events if isinstance(c, ToolCallComplete)] == [
        (f"call_{i}", arguments) for i, arguments in enumerate(calls)
    ]
    # The block is in the message before anything the model said after its reasoning.
    first_after = next((i for i, e in enumerate(events) if isinstance(e, TextDelta | ToolCallStart)), len(events))
    assert next(i for i, e in enumerate(events) if isinstance(e, ThinkingComplete)) < first_after


@settings(max_examples=80, deadline=None)
@given(
    reasoning=st.lists(st.tuples(st.sampled_from(["reasoning_content", "reasoning"]), _reasoning_text), max_size=6),
    answer=st.lists(_answer_text, max_size=4),
)
def test_every_streamed_reasoning_character_is_in_exactly_one_block(
    reasoning: list[tuple[str, str]], answer: list[str]
) -> None:
    # Interleave reasoning and answer in any order: the blocks hold all reasoning once, the answer none of it.
    frames = []
    for number, (field, text) in enumerate(reasoning):
        frames.append(frame({field: text}))
        if number < len(answer):
            frames.append(frame({"content": answer[number]}))
    events = mapped(*frames, frame({}, "stop"))
    assert "".join(b.thinking for b in blocks(events)) == "".join(text for _, text in reasoning)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "".join(answer[: len(reasoning)])


# -- the request body: where reasoning goes back ----------------------------------------------------


def _history(*assistant: Any) -> tuple[Message, ...]:
    return (
        Message.user("check"),
        Message(role="assistant", content=assistant),
        Message(role="user", content=(ToolResultBlock(call_id="c1", content="ok"),)),
        Message(
            role="assistant",
            content=(
                ThinkingBlock(thinking="plain answer thought", source="reasoning_content"),
                TextBlock(text="Done."),
            ),
        ),
    )


CALL = ToolCallBlock(id="c1", name="get_document_summary", input={})
THOUGHT = ThinkingBlock(thinking="Read first.", source="reasoning_content")


def _assistant(options: OpenAIRequestOptions, *content: Any) -> list[dict[str, Any]]:
    body = build_openai_body(ChatRequest(model="m", messages=_history(*content)), options)
    return [m for m in body["messages"] if m["role"] == "assistant"]


def test_a_named_field_goes_back_only_on_messages_with_tool_calls() -> None:
    with_calls, plain = _assistant(OpenAIRequestOptions(reasoning_field="reasoning_content"), THOUGHT, CALL)
    assert with_calls == {
        "role": "assistant",
        "content": None,  # OpenAI's rule: text or null beside tool calls
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_document_summary", "arguments": "{}"}}
        ],
        "reasoning_content": "Read first.",
    }
    assert plain == {"role": "assistant", "content": "Done."}
    # The name is a choice: reasoning from any compatible source goes back under it.
    renamed, _ = _assistant(OpenAIRequestOptions(reasoning_field="reasoning"), THOUGHT, TextBlock(text="Hm."), CALL)
    assert renamed["reasoning"] == "Read first." and renamed["content"] == "Hm." and "reasoning_content" not in renamed


def test_none_sends_no_reasoning_and_signed_or_sourceless_thinking_never_goes() -> None:
    [default, _] = _assistant(OpenAIRequestOptions(), THOUGHT, CALL)
    assert set(default) == {"role", "content", "tool_calls"}
    signed = ThinkingBlock(thinking="Anthropic's", signature="sig", source="")
    [named, _] = _assistant(OpenAIRequestOptions(reasoning_field="reasoning_content"), signed, CALL)
    assert "reasoning_content" not in named


def test_auto_answers_in_the_field_the_server_used_and_never_in_content() -> None:
    auto = OpenAIRequestOptions(reasoning_field="auto")
    [message, _] = _assistant(auto, ThinkingBlock(thinking="a", source="reasoning"), CALL)
    assert message["reasoning"] == "a" and "auto" not in message
    [parts, _] = _assistant(auto, ThinkingBlock(thinking="parts", source="content"), CALL)
    assert parts["content"] is None and set(parts) == {"role", "content", "tool_calls"}
    split = (ThinkingBlock(thinking="one ", source="reasoning"), ThinkingBlock(thinking="two", source="reasoning"))
    [joined, _] = _assistant(auto, *split, CALL)
    assert joined["reasoning"] == "one two"


def test_reasoning_details_go_back_only_when_asked_and_only_this_wires() -> None:
    details = [{"type": "reasoning.encrypted", "data": "opaque", "index": 0}]
    ours = ProviderBlock(wire="openai", kind="reasoning_details", data=json.dumps({"reasoning_details": details}))
    theirs = ProviderBlock(wire="anthropic", kind="server_tool_use", data='{"id": "x"}')
    [on, _] = _assistant(OpenAIRequestOptions(reasoning_details=True), ours, theirs, CALL)
    assert on["reasoning_details"] == details
    [off, _] = _assistant(OpenAIRequestOptions(), ours, CALL)
    assert "reasoning_details" not in off


@pytest.mark.parametrize("bad", ["content", "role", "tool_calls", "", "has space", "1x", 3, "x" * 65])
def test_a_reasoning_field_cannot_overwrite_the_message(bad: Any) -> None:
    with pytest.raises(ValueError, match="reasoning_field"):
        OpenAIRequestOptions(reasoning_field=bad)


@pytest.mark.parametrize(
    ("base_url", "field", "details"),
    [
        (None, None, False),
        ("https://api.openai.com/v1", None, False),
        ("https://res.openai.azure.com/openai/v1", None, False),
        ("https://api.deepseek.com", "reasoning_content", False),
        ("https://api.deepseek.com/v1", "reasoning_content", False),
        ("https://api.moonshot.ai/v1", "reasoning_content", False),
        ("https://api.moonshot.cn/v1", "reasoning_content", False),
        ("https://openrouter.ai/api/v1", "reasoning", True),
        ("https://api.groq.com/openai/v1", None, False),
        ("http://localhost:11434/v1", "reasoning", False),
        ("https://ollama.com/v1", "reasoning", False),
        ("http://localhost:8000/v1", None, False),  # vLLM, llama.cpp, LM Studio...: no guess from a URL
        ("http://localhost:8080/v1", None, False),
        ("not a url", None, False),
    ],
)
def test_defaults_per_server(base_url: str | None, field: str | None, details: bool) -> None:
    options = OpenAIRequestOptions.for_base_url(base_url)
    assert (options.reasoning_field, options.reasoning_details) == (field, details)


# -- the servers: a whole tool loop each, against an imitation that refuses what the real one does -----

Check: TypeAlias = Callable[[list[dict[str, Any]]], LoopbackResponse | None]


def refusal(status: int, error: dict[str, Any]) -> LoopbackResponse:
    return LoopbackResponse(
        status=status, headers=(("content-type", "application/json"),), body=json.dumps({"error": error}).encode()
    )


def tool_call_messages(messages: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, m) for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("tool_calls")]


def deepseek_rule(messages: list[dict[str, Any]]) -> LoopbackResponse | None:
    """api-docs.deepseek.com/guides/thinking_mode: every tool-call message keeps its reasoning_content."""
    for _, message in tool_call_messages(messages):
        if not isinstance(message.get("reasoning_content"), str) or not message["reasoning_content"]:
            return refusal(
                400,
                {
                    "message": "The `reasoning_content` in the thinking mode must be passed back to the API.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_request_error",
                },
            )
    return None


def kimi_rule(messages: list[dict[str, Any]]) -> LoopbackResponse | None:
    """MoonshotAI/kimi-agent-sdk#169: thinking on, a tool-call message without reasoning_content is refused."""
    for index, message in tool_call_messages(messages):
        if not message.get("reasoning_content"):
            text = (
                f"thinking is enabled but reasoning_content is missing in assistant tool call message at index {index}"
            )
            return refusal(400, {"message": text, "type": "invalid_request_error"})
    return None


_GROQ_FIELDS = {
    "system": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls"},
    "tool": {"role", "content", "tool_call_id", "name"},
}


def groq_rule(messages: list[dict[str, Any]]) -> LoopbackResponse | None:
    """Groq refuses a message property it does not know (janhq/jan#8136, NousResearch/hermes-agent#11089)."""
    for index, message in enumerate(messages):
        role = message.get("role", "")
        for key in sorted(set(message) - _GROQ_FIELDS.get(role, set())):
            text = (
                f"'messages.{index}' : for 'role:{role}' the following must be satisfied"
                f"[('messages.{index}' : property '{key}' is unsupported)]"
            )
            return refusal(400, {"message": text, "type": "invalid_request_error"})
    return None


def openrouter_gemini_rule(issued: list[dict[str, Any]]) -> Check:
    """OpenRouter for Gemini: the reasoning details it issued come back with the tool call, whole and in order."""

    def rule(messages: list[dict[str, Any]]) -> LoopbackResponse | None:
        for _, message in tool_call_messages(messages):
            if message.get("reasoning_details") != issued:
                raw = (
                    "Gemini models require OpenRouter reasoning details to be preserved in each request. "
                    "Upstream error: Function call is missing a thought_signature."
                )
                return refusal(400, {"message": "Provider returned error", "code": 400, "metadata": {"raw": raw}})
        return None

    return rule


def ollama_rule(messages: list[dict[str, Any]]) -> LoopbackResponse | None:
    """ollama/ollama openai.go FromChatRequest: content may be null only beside tool calls."""
    for message in messages:
        if message.get("content") is None and not message.get("tool_calls"):
            return refusal(400, {"message": "invalid message content type: <nil>", "type": "invalid_request_error"})
    return None


def lenient(messages: list[dict[str, Any]]) -> LoopbackResponse | None:
    return None


@attrs.define
class Imitation:
    """A loopback handler that answers as one server does: its rule may refuse a request, else the next body."""

    bodies: list[bytes]
    rule: Check
    requests: list[dict[str, Any]] = attrs.field(factory=list)

    def __call__(self, request: LoopbackRequest) -> LoopbackResponse:
        payload: dict[str, Any] = request.json()
        self.requests.append(payload)
        refused = self.rule(payload["messages"])
        if refused is not None:
            return refused
        return LoopbackResponse(body=self.bodies.pop(0), chunk_size=53)


async def tool_loop(
    imitation: Imitation, options: OpenAIRequestOptions | None, *turns: str, model: str = "m"
) -> list[TurnState]:
    """Each turn through a threat-model session on the payment document; pending calls are approved."""
    states: list[TurnState] = []
    async with open_loopback_server(imitation, keep_alive=True) as server:
        provider = OpenAIProvider(KEY, base_url=server.url + "/v1", options=options, retry=None)
        async with threat_model_session(document=payment(), provider=provider, model=model) as session:

            async def reviewer() -> None:
                async for state in session.states():
                    if state.phase is Phase.AWAITING_APPROVAL:
                        for pending in state.current_calls:
                            if pending.status is CallStatus.PENDING:
                                session.approve(pending.id)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reviewer)
                for text in turns:
                    states.append(await session.send(text))
                nursery.cancel_scope.cancel()
    return states


def sent_back(imitation: Imitation, request: int = 1) -> dict[str, Any]:
    """The assistant message with tool calls as request ``request`` carried it."""
    [(_, message)] = tool_call_messages(imitation.requests[request]["messages"])
    return message


def failure_detail(state: TurnState) -> str:
    assert state.outcome is Outcome.FAILED and state.error is not None
    assert state.error.message == Messages.REQUEST_REJECTED
    return state.error.provider_detail or ""


async def test_deepseek_gets_its_reasoning_back_on_every_later_request(autojump_clock: trio.testing.MockClock) -> None:
    imitation = Imitation(
        [compat("deepseek_thinking_tool_call"), compat("deepseek_thinking_answer"), compat("deepseek_thinking_answer")],
        deepseek_rule,
    )
    options = OpenAIRequestOptions.for_base_url("https://api.deepseek.com")
    first, second = await tool_loop(imitation, options, "Check the model.", "And now?", model="deepseek-v4-pro")
    assert first.outcome is Outcome.COMPLETED and second.outcome is Outcome.COMPLETED
    assert [c.status for c in first.calls] == [CallStatus.SUCCEEDED]
    thought = "The user wants the payment model checked. I should read the summary first, then decide."
    assert len(imitation.requests) == 3
    for request in (1, 2):  # the next iteration and the next turn both carry it
        message = sent_back(imitation, request)
        assert message["reasoning_content"] == thought and message["content"] is None
        assert [c["id"] for c in message["tool_calls"]] == ["call_00_Vq3ZKx8mT2bN4rLp6sJw1yHc"]
    assert imitation.requests[0]["max_tokens"] == 4096 and "max_completion_tokens" not in imitation.requests[0]
    # Usage as DeepSeek reports it: cache hits and reasoning tokens.
    assert first.usage.cache_read_input_tokens == 1536 + 1792 and first.usage.reasoning_tokens == 41 + 12


async def test_deepseek_refuses_the_loop_when_reasoning_stays_home(autojump_clock: trio.testing.MockClock) -> None:
    # An explicit option overrides the default; the imitation then refuses as DeepSeek does.
    imitation = Imitation([compat("deepseek_thinking_tool_call")], deepseek_rule)
    options = OpenAIRequestOptions(max_tokens_field="max_tokens", reasoning_field=None)
    [state] = await tool_loop(imitation, options, "Check the model.")
    assert "reasoning_content" not in sent_back(imitation)
    assert "must be passed back" in failure_detail(state)
    assert assert_tool_pairing(state.messages) == ()


async def test_kimi_tool_call_approved_then_continued_with_its_reasoning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    imitation = Imitation([compat("kimi_thinking_tool_call"), compat("kimi_thinking_answer")], kimi_rule)
    options = OpenAIRequestOptions.for_base_url("https://api.moonshot.ai/v1")
    [state] = await tool_loop(imitation, options, "Add a replay threat on the PSP.", model="kimi-k2.6")
    assert state.outcome is Outcome.COMPLETED
    [added] = state.calls
    assert (added.id, added.tool_name, added.status) == ("functions.add_threat:0", "add_threat", CallStatus.SUCCEEDED)
    message = sent_back(imitation)
    assert message["reasoning_content"] == "The user asks for a new threat on the PSP. I will add a spoofing threat."
    # Usage from the finishing chunk's choice, cache hits from Moonshot's top-level cached_tokens.
    assert state.usage.input_tokens == 2048 + 2300 and state.usage.cache_read_input_tokens == 1024 + 2048


async def test_kimi_without_reasoning_is_refused_naming_the_message(autojump_clock: trio.testing.MockClock) -> None:
    imitation = Imitation([compat("kimi_thinking_tool_call")], kimi_rule)
    [state] = await tool_loop(imitation, OpenAIRequestOptions(max_tokens_field="max_tokens"), "Add a threat.")
    assert "reasoning_content is missing in assistant tool call message at index 2" in failure_detail(state)


async def test_openrouter_gemini_gets_reasoning_and_details_back(autojump_clock: trio.testing.MockClock) -> None:
    issued = json.loads(
        next(
            e.block.data
            for e in map_chunks(OpenAIStreamMapper(), [compat("openrouter_gemini_reasoning_details_tool_call")])
            if isinstance(e, ProviderBlockComplete)
        )
    )["reasoning_details"]
    imitation = Imitation(
        [compat("openrouter_gemini_reasoning_details_tool_call"), compat("openrouter_gemini_answer")],
        openrouter_gemini_rule(issued),
    )
    options = OpenAIRequestOptions.for_base_url("https://openrouter.ai/api/v1")
    [state] = await tool_loop(imitation, options, "Summarize.", model="google/gemini-3-pro-preview")
    assert state.outcome is Outcome.COMPLETED
    message = sent_back(imitation)
    assert message["reasoning"] == "**Reading the model**\n\nI will start from the summary."
    assert message["reasoning_details"] == issued and "reasoning_content" not in message
    assert state.usage.reasoning_tokens == 88 + 9 and state.usage.cache_read_input_tokens == 1024 + 1800
    # The same loop without the details is refused as OpenRouter refuses it.
    again = Imitation([compat("openrouter_gemini_reasoning_details_tool_call")], openrouter_gemini_rule(issued))
    [refused] = await tool_loop(
        again, OpenAIRequestOptions(max_tokens_field="max_tokens", reasoning_field="reasoning"), "x"
    )
    assert "Provider returned error" in failure_detail(refused)


async def test_groq_never_gets_a_field_it_does_not_know(autojump_clock: trio.testing.MockClock) -> None:
    imitation = Imitation([compat("groq_gpt_oss_reasoning_tool_call"), compat("groq_answer")], groq_rule)
    options = OpenAIRequestOptions.for_base_url("https://api.groq.com/openai/v1")
    [state] = await tool_loop(imitation, options, "Summarize.", model="openai/gpt-oss-120b")
    assert state.outcome is Outcome.COMPLETED and [c.status for c in state.calls] == [CallStatus.SUCCEEDED]
    assert set(sent_back(imitation)) == {"role", "content", "tool_calls"}
    assert state.usage.input_tokens == 1500 + 1700  # from x_groq.usage
    # The reasoning is still in the session's history, for the person and for a wire that takes it.
    assistant = next(m for m in state.messages if m.role == "assistant")
    assert ThinkingBlock(thinking="Need the summary. Call the tool.", source="reasoning") in assistant.content
    # Asked to send it anyway, Groq refuses the request as reported.
    strict = Imitation([compat("groq_gpt_oss_reasoning_tool_call")], groq_rule)
    forced = OpenAIRequestOptions(max_tokens_field="max_tokens", reasoning_field="reasoning_content")
    [refused] = await tool_loop(strict, forced, "Summarize.")
    assert "property 'reasoning_content' is unsupported" in failure_detail(refused)


async def test_ollama_parallel_calls_at_index_zero_and_reasoning_back(autojump_clock: trio.testing.MockClock) -> None:
    imitation = Imitation([compat("ollama_reasoning_parallel_index_zero"), compat("ollama_answer")], ollama_rule)
    options = OpenAIRequestOptions.for_base_url("http://localhost:11434/v1")
    [state] = await tool_loop(imitation, options, "Summarize and list.", model="qwen3:14b")
    assert state.outcome is Outcome.COMPLETED
    assert [(c.id, c.status) for c in state.calls] == [
        ("call_k1v8yq2a", CallStatus.SUCCEEDED),
        ("call_p7d3mw9c", CallStatus.SUCCEEDED),
    ]
    message = sent_back(imitation)
    assert message["reasoning"] == "Two reads at once: the summary and the elements."
    assert "reasoning_content" not in message
    tools = [m["tool_call_id"] for m in imitation.requests[1]["messages"] if m["role"] == "tool"]
    assert tools == ["call_k1v8yq2a", "call_p7d3mw9c"]


@pytest.mark.parametrize(
    ("options", "field"), [(None, None), (OpenAIRequestOptions(reasoning_field="auto"), "reasoning")]
)
async def test_vllm_repeated_call_header_is_one_call_and_auto_echoes_its_field(
    options: OpenAIRequestOptions | None, field: str | None, autojump_clock: trio.testing.MockClock
) -> None:
    imitation = Imitation([compat("vllm_reasoning_tool_call_repeated_id"), compat("vllm_answer")], lenient)
    [state] = await tool_loop(imitation, options, "Summarize.", model="Qwen/Qwen3-32B")
    assert state.outcome is Outcome.COMPLETED and state.violations == ()
    assert [(c.id, c.status) for c in state.calls] == [("chatcmpl-tool-4f1c9a7e2b8d", CallStatus.SUCCEEDED)]
    message = sent_back(imitation)
    # A URL does not say "vLLM": by default nothing goes back; "auto" answers in the field it streamed.
    assert {k for k in message if k not in ("role", "content", "tool_calls")} == ({field} if field else set())
    if field:
        assert message[field] == "The summary first, then answer."


async def test_thinking_text_is_scrubbed_before_it_reaches_the_history(autojump_clock: trio.testing.MockClock) -> None:
    body = compat("deepseek_thinking_tool_call").replace(b"I should read the summary first, ", KEY.encode())
    imitation = Imitation([body, compat("deepseek_thinking_answer")], deepseek_rule)
    [state] = await tool_loop(imitation, OpenAIRequestOptions.for_base_url("https://api.deepseek.com"), "Check.")
    assert state.outcome is Outcome.COMPLETED
    assert KEY not in repr(state.messages) and KEY not in json.dumps(imitation.requests)
    assert "[redacted-key]" in sent_back(imitation)["reasoning_content"]


def test_frames_without_reasoning_make_no_block() -> None:
    events = OpenAIStreamMapper().feed(
        SseFrame(data=json.dumps({"choices": [{"index": 0, "delta": {"reasoning": ""}}]}))
    )
    assert events == []
