"""Fuzzing the SSE framer and both stream mappers with hypothesis.

Three generators feed `torture_support.check_stream` (exactly one terminal event, last; only
``malformed_stream`` notices before it; well-formed events; the same events however the bytes are
split): raw bytes, SSE-shaped lines around plausible provider JSON, and mutations of the recorded
fixtures. The frame-level mappers and the decoder get their own never-raise properties. The example
budget scales with ``TRIOLOOP_TORTURE_SCALE``; ``tests/fuzz/fuzz_streams.py`` is the atheris twin.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torture_support import FIXTURES, check_stream, record, scaled

from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode
from trioloop.protocol.events import MessageStop, StreamError, is_terminal
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireFormat
from trioloop.providers.openai import OPENAI_WIRE
from trioloop.providers.openai_responses import RESPONSES_WIRE
from trioloop.providers.sse import SseDecoder, SseFrame

WIRES: dict[str, WireFormat] = {"anthropic": ANTHROPIC_WIRE, "openai": OPENAI_WIRE, "openai-responses": RESPONSES_WIRE}
_FIXTURE_DIRS = {"anthropic": "anthropic", "openai": "openai", "openai-responses": "responses"}
CORPUS = {wire: [p.read_bytes() for p in sorted((FIXTURES / _FIXTURE_DIRS[wire]).glob("*.sse"))] for wire in WIRES}
FUZZ = settings(
    max_examples=scaled(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    database=None,
)

# --- generators ---------------------------------------------------------------------------------

junk = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
json_like = st.recursive(
    junk,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A plausible value most of the time, anything JSON at other times."""
    return st.one_of(value, value, value, json_like)


indexes = maybe(st.integers(0, 3))
ids = maybe(st.sampled_from(["toolu_1", "toolu_2", "call_1", ""]))
names = maybe(st.sampled_from(["get_entity", "add_threat", "delete_element", ""]))
arguments = maybe(st.sampled_from(['{"kind": ', '"elements"}', "{}", "", "{", "NaN", '{"a": 1, "a": 2}', "[1]"]))


def anthropic_payloads() -> st.SearchStrategy[dict[str, Any]]:
    kinds = st.sampled_from(
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
            "ping",
            "error",
            "bogus",
        ]
    )
    block_types = [
        "text",
        "tool_use",
        "thinking",
        "redacted_thinking",
        # server-side blocks: kept and sent back verbatim, never run
        "server_tool_use",
        "web_search_tool_result",
        "code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "a_future_block",
    ]
    block = st.fixed_dictionaries(
        {"type": maybe(st.sampled_from(block_types))},
        optional={
            "id": ids,
            "name": names,
            "text": maybe(st.text(max_size=8)),
            "input": json_like,
            "thinking": maybe(st.text(max_size=8)),
            "signature": maybe(st.text(max_size=8)),
            "data": maybe(st.text(max_size=8)),
            "tool_use_id": ids,
            "content": json_like,
            "caller": maybe(st.fixed_dictionaries({"type": st.just("code_execution_20250825")})),
        },
    )
    delta = st.fixed_dictionaries(
        {
            "type": maybe(
                st.sampled_from(
                    ["text_delta", "input_json_delta", "thinking_delta", "signature_delta", "citations_delta"]
                )
            )
        },
        optional={
            "text": maybe(st.text(max_size=8)),
            "thinking": maybe(st.text(max_size=8)),
            "signature": maybe(st.text(max_size=8)),
            "citation": json_like,
            "partial_json": arguments,
            "stop_reason": maybe(
                st.sampled_from(["end_turn", "tool_use", "max_tokens", "refusal", "pause_turn", None])
            ),
        },
    )
    usage = st.fixed_dictionaries(
        {}, optional={"input_tokens": maybe(st.integers(0, 99)), "output_tokens": maybe(st.integers(-5, 99))}
    )
    return st.fixed_dictionaries(
        {"type": kinds},
        optional={
            "index": indexes,
            "content_block": maybe(block),
            "delta": maybe(delta),
            "usage": maybe(usage),
            "message": maybe(
                st.fixed_dictionaries(
                    {"model": maybe(st.text(max_size=6))},
                    optional={"usage": usage, "content": maybe(st.lists(maybe(block), max_size=3))},
                )
            ),
            "error": maybe(
                st.fixed_dictionaries(
                    {
                        "type": maybe(st.sampled_from(["rate_limit_error", "overloaded_error"])),
                        "message": maybe(st.text(max_size=20)),
                    }
                )
            ),
        },
    )


def openai_payloads() -> st.SearchStrategy[dict[str, Any]]:
    fragment = st.fixed_dictionaries(
        {},
        optional={
            "index": indexes,  # Ollama before 0.4.7 sent none
            "id": ids,
            "type": st.just("function"),
            "function": maybe(st.fixed_dictionaries({}, optional={"name": names, "arguments": arguments})),
        },
    )
    part = st.fixed_dictionaries(
        {"type": maybe(st.sampled_from(["text", "thinking", "image_url"]))},
        optional={"text": maybe(st.text(max_size=8)), "thinking": maybe(st.lists(json_like, max_size=2))},
    )
    delta = st.fixed_dictionaries(
        {},
        optional={
            "role": st.just("assistant"),
            "content": maybe(st.text(max_size=8) | st.lists(part, max_size=3)),
            "reasoning_content": maybe(st.text(max_size=8)),
            "reasoning": maybe(st.text(max_size=8)),
            "tool_calls": maybe(st.lists(fragment, max_size=3)),
        },
    )
    choice = st.fixed_dictionaries(
        {"index": maybe(st.just(0))},
        optional={
            "delta": maybe(delta),
            "finish_reason": maybe(
                st.sampled_from(["stop", "tool_calls", "length", "content_filter", "function_call", None])
            ),
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "model": maybe(st.text(max_size=6)),
            "choices": maybe(st.lists(choice, max_size=2)),
            "usage": maybe(
                st.fixed_dictionaries(
                    {},
                    optional={"prompt_tokens": maybe(st.integers(0, 9)), "completion_tokens": maybe(st.integers(0, 9))},
                )
            ),
            "error": maybe(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "message": st.text(max_size=10),
                        "type": st.text(max_size=10),
                        "code": maybe(st.sampled_from(["rate_limit_exceeded", "insufficient_quota"])),
                    },
                )
            ),
        },
    )


def responses_payloads() -> st.SearchStrategy[dict[str, Any]]:
    item = st.fixed_dictionaries(
        {"type": maybe(st.sampled_from(["function_call", "reasoning", "message", "web_search_call"]))},
        optional={
            "id": maybe(st.sampled_from(["fc_1", "rs_1", "msg_1", ""])),
            "call_id": ids,
            "name": names,
            "arguments": arguments,
            "status": maybe(st.sampled_from(["completed", "in_progress", "incomplete"])),
            "encrypted_content": maybe(st.text(max_size=8)),
            "summary": maybe(
                st.lists(
                    st.fixed_dictionaries({"type": st.just("summary_text"), "text": st.text(max_size=6)}), max_size=2
                )
            ),
            "content": maybe(
                st.lists(
                    st.fixed_dictionaries({"type": st.just("output_text"), "text": st.text(max_size=6)}), max_size=2
                )
            ),
        },
    )
    usage = st.fixed_dictionaries(
        {},
        optional={
            "input_tokens": maybe(st.integers(0, 99)),
            "output_tokens": maybe(st.integers(-5, 99)),
            "input_tokens_details": maybe(st.fixed_dictionaries({"cached_tokens": maybe(st.integers(0, 9))})),
            "output_tokens_details": maybe(st.fixed_dictionaries({"reasoning_tokens": maybe(st.integers(0, 9))})),
        },
    )
    response = st.fixed_dictionaries(
        {},
        optional={
            "id": maybe(st.just("resp_1")),
            "model": maybe(st.text(max_size=6)),
            "output": maybe(st.lists(maybe(item), max_size=3)),
            "usage": maybe(usage),
            "incomplete_details": maybe(
                st.fixed_dictionaries({"reason": maybe(st.sampled_from(["max_output_tokens", "content_filter"]))})
            ),
            "error": maybe(
                st.fixed_dictionaries(
                    {
                        "code": maybe(st.sampled_from(["server_error", "rate_limit_exceeded"])),
                        "message": st.text(max_size=8),
                    }
                )
            ),
        },
    )
    kinds = st.sampled_from(
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_text.delta",
            "response.output_text.done",
            "response.refusal.delta",
            "response.reasoning_summary_text.delta",
            "response.reasoning_text.delta",
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
            "response.bogus",
        ]
    )
    return st.fixed_dictionaries(
        {"type": kinds},
        optional={
            "output_index": indexes,
            "item_id": maybe(st.sampled_from(["fc_1", "rs_1", "msg_1"])),
            "item": maybe(item),
            "delta": maybe(st.text(max_size=8)) | arguments,
            "arguments": arguments,
            "text": maybe(st.text(max_size=8)),
            "response": maybe(response),
            "code": maybe(st.sampled_from(["server_error", "rate_limit_exceeded"])),
            "message": maybe(st.text(max_size=8)),
        },
    )


_PAYLOADS = {"anthropic": anthropic_payloads, "openai": openai_payloads, "openai-responses": responses_payloads}


def sse_lines(wire: str) -> st.SearchStrategy[bytes]:
    payloads = _PAYLOADS[wire]()
    data_line = payloads.map(lambda p: b"data: " + json.dumps(p, allow_nan=True).encode())
    line = st.one_of(
        data_line,
        data_line,
        data_line,
        st.sampled_from(
            [b"data: [DONE]", b"data: {", b"data:", b": ping", b"id: 3", b"retry: 10", b"", b"", b"\xef\xbb\xbf"]
        ),
        st.sampled_from(
            [b"event: " + n for n in (b"message_start", b"content_block_delta", b"message_stop", b"error", b"x")]
        ),
        st.binary(max_size=12),
    )
    ending = st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n"])
    return st.lists(st.tuples(line, ending), max_size=24).map(lambda parts: b"".join(a + b for a, b in parts))


@st.composite
def mutated_fixtures(draw: st.DrawFn, wire: str) -> bytes:
    raw = bytearray(draw(st.sampled_from(CORPUS[wire])))
    for _ in range(draw(st.integers(1, 6))):
        if not raw:
            break
        at = draw(st.integers(0, len(raw) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete", "duplicate", "truncate", "swap"]))
        if op == "flip":
            raw[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            raw[at:at] = draw(
                st.sampled_from([b"\n", b"\r", b"\n\n", b"\xff", b"\xc3", b'"', b"}", b"data: ", b"NaN", b"[DONE]"])
            )
        elif op == "delete":
            del raw[at : at + draw(st.integers(1, 40))]
        elif op == "duplicate":
            end = min(len(raw), at + draw(st.integers(1, 200)))
            raw[end:end] = raw[at:end]
        elif op == "truncate":
            del raw[at:]
        else:
            other = draw(st.integers(0, len(raw) - 1))
            raw[at], raw[other] = raw[other], raw[at]
    return bytes(raw)


@st.composite
def split(draw: st.DrawFn, body: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=8)))
    bounds = [0, *cuts, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


def bodies(wire: str) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=300), sse_lines(wire), mutated_fixtures(wire))


# --- properties ----------------------------------------------------------------------------------


def _fuzz(wire: str) -> Counter[str]:
    seen: Counter[str] = Counter()

    @FUZZ
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        body = data.draw(bodies(wire))
        events = check_stream(WIRES[wire], data.draw(split(body)))
        last = events[-1]
        if isinstance(last, MessageStop):
            seen["ended with MessageStop"] += 1
        elif isinstance(last, StreamError) and last.code is ProtocolErrorCode.MALFORMED_STREAM:
            seen["ended malformed_stream"] += 1
        else:
            seen[f"ended {type(last).__name__}"] += 1
        seen["notices"] += sum(isinstance(e, StreamError) and not e.terminal for e in events)

    check()
    return seen


def test_fuzz_anthropic_stream() -> None:
    seen = _fuzz("anthropic")
    assert seen["ended with MessageStop"] and seen["ended malformed_stream"]
    total = sum(n for k, n in seen.items() if k != "notices")
    record("fuzz: SSE + Anthropic mapper", tried=total, held=total, note=_summary(seen))


def test_fuzz_openai_stream() -> None:
    seen = _fuzz("openai")
    assert seen["ended with MessageStop"] and seen["ended malformed_stream"]
    total = sum(n for k, n in seen.items() if k != "notices")
    record("fuzz: SSE + OpenAI mapper", tried=total, held=total, note=_summary(seen))


def test_fuzz_responses_stream() -> None:
    seen = _fuzz("openai-responses")
    assert seen["ended with MessageStop"] and seen["ended malformed_stream"]
    total = sum(n for k, n in seen.items() if k != "notices")
    record("fuzz: SSE + OpenAI Responses mapper", tried=total, held=total, note=_summary(seen))


def _summary(seen: Counter[str]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(seen.items()))


frames = st.builds(
    SseFrame,
    event=st.one_of(
        st.sampled_from(
            [
                "message",
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
                "ping",
                "error",
            ]
        ),
        st.text(max_size=6),
    ),
    data=st.one_of(
        st.text(max_size=40),
        anthropic_payloads().map(json.dumps),
        openai_payloads().map(json.dumps),
        st.just("[DONE]"),
        st.integers(1, 5000).map(lambda n: "[" * n + "]" * n),
        st.just("9" * 5000),
    ),
)


def test_mappers_never_raise_on_any_frame_sequence() -> None:
    count = 0

    @FUZZ
    @given(wire=st.sampled_from(sorted(WIRES)), sequence=st.lists(frames, max_size=20))
    def check(wire: str, sequence: list[SseFrame]) -> None:
        nonlocal count
        mapper = WIRES[wire].new_mapper(scrub=lambda t: t.replace("sk-", "[k]"))
        terminal = 0
        for frame in sequence:
            out = mapper.feed(frame)
            if terminal:
                assert out == []  # nothing after the terminal event
            terminal += sum(is_terminal(e) for e in out)
            assert terminal <= 1
        assert mapper.done == bool(terminal)
        tail = mapper.finish()
        # The tail may carry the notice-fold summary, always before its one terminal event.
        assert (tail == []) if terminal else (is_terminal(tail[-1]) and not any(map(is_terminal, tail[:-1])))
        assert mapper.finish() == []
        count += 1

    check()
    record("fuzz: mapper frame sequences", tried=count, held=count)


def test_decoder_fails_closed_and_only_with_malformed_stream() -> None:
    count = 0

    @FUZZ
    @given(
        chunks=st.lists(st.binary(max_size=64) | st.sampled_from([b"\r", b"\n", b"\xff", b"data: x\n\n"]), max_size=12)
    )
    def check(chunks: list[bytes]) -> None:
        nonlocal count
        decoder = SseDecoder(line_cap=32)
        failed = False
        for chunk in [*chunks, None]:
            try:
                result = decoder.close() if chunk is None else decoder.feed(chunk)
            except ProtocolError as error:
                assert error.code is ProtocolErrorCode.MALFORMED_STREAM
                failed = True
                continue
            assert not failed  # once failed, every later call fails too
            assert all(isinstance(f.event, str) and isinstance(f.data, str) for f in result)
        count += 1

    check()
    record("fuzz: SSE decoder (32-byte line cap)", tried=count, held=count)


def _frames(chunks: list[bytes]) -> list[SseFrame] | str:
    decoder = SseDecoder()
    out: list[SseFrame] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
        out += decoder.close()
    except ProtocolError as error:
        return error.message
    return out


sse_alphabet = st.lists(
    st.sampled_from([b"data: ", b"data:", b"event: e", b"a", b"b", b":", b" ", b"\r", b"\n", b"\r\n"]), max_size=16
)


def test_decoder_frames_do_not_depend_on_where_a_chunk_ends() -> None:
    count = 0

    @FUZZ
    @given(parts=sse_alphabet)
    @example(
        parts=[b"data: ", b"a", b"\r", b"b", b"\n", b"\r\n", b"data: ", b"b", b"\n", b"\n"]
    )  # CR, then bytes, then a chunk opening with LF
    def check(parts: list[bytes]) -> None:
        nonlocal count
        body = b"".join(parts)
        whole = _frames([body])
        for cut in range(len(body) + 1):
            assert _frames([body[:cut], body[cut:]]) == whole, (body, cut)
        count += 1

    held = False
    try:
        check()
        held = True
    finally:
        note = "" if held else "a falsifying split was found"
        record("fuzz: SSE decoder, every two-chunk split", tried=count + (not held), held=count, note=note)
