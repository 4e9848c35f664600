"""An MCP call at the SDK's cost: each fast path against the slow path it stands for (a plain schema's check against
jsonschema, a result fitted item by item against the whole payload encoded, the arguments' private copy against
parsing the digested text); a call that starts no task, its cancellation notice that never holds the cancelled
caller, and a closing connection that waits for that notice, but not for ever."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from mcp.shared.message import SessionMessage

from trioloop.machine.canonical import canonical_json
from trioloop.machine.tools import PreparedCall, ToolOutcome
from trioloop.machine.untrusted_text import fence, sanitize_scalar
from trioloop.mcp import McpToolset, StdioServer
from trioloop.mcp._connection import SETTLE_TIMEOUT, Connection, _NoticeWriteStream
from trioloop.mcp._plain_schemas import plain_check
from trioloop.mcp.results import _item, mcp_result_outcome
from trioloop.mcp.tools import UnusableTool, _passes, _private_copy, _validator
from trioloop.runtime.tools import ToolExecutionContext
from trioloop.tools.read_result import READ_RESULT_MAX_BYTES, payload_bytes

SERVER_SCRIPT = str(Path(__file__).resolve().parent / "fixtures" / "mcp_server.py")

# -- a plain schema's check ------------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c"])
NUMBERS = st.integers(-4, 4) | st.floats(-4, 4, allow_nan=False)
SCALARS = st.none() | st.booleans() | NUMBERS | st.sampled_from(["", "x", "ab"])
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=8
)
#: Values that jsonschema's equality tells apart where Python's does not (True and 1, [True] and [1]).
TRICKY = st.sampled_from([0, 1, 1.0, True, False, "", None, [1], [True], {"a": 1}, {"a": True}])
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object"])
DRAFTS = st.sampled_from(
    [None, "https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/draft-07/schema#"]
)


def _plain_keywords(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A few of the plain keywords at a time, so that many inputs satisfy all but one."""
    bound = st.integers(-3, 3) | st.floats(-3, 3, allow_nan=False)
    choices: dict[str, st.SearchStrategy[Any]] = {
        "type": TYPES | st.lists(TYPES, min_size=1, max_size=3, unique=True),
        "properties": st.dictionaries(KEYS, inner, max_size=3),
        "required": st.lists(KEYS, max_size=3, unique=True),
        "additionalProperties": st.booleans() | inner,
        "enum": st.lists(TRICKY | VALUES, min_size=1, max_size=3),
        "const": TRICKY | VALUES,
        "minLength": st.integers(0, 3),
        "maxLength": st.integers(0, 3),
        "minItems": st.integers(0, 3),
        "maxItems": st.integers(0, 3),
        "minimum": bound,
        "maximum": bound,
        "exclusiveMinimum": bound,
        "exclusiveMaximum": bound,
        "items": st.booleans() | inner,
        "format": st.sampled_from(["email", "date"]),
        "description": st.text(max_size=5),
        "x-vendor": VALUES,
    }
    names = st.lists(st.sampled_from(sorted(choices)), max_size=3, unique=True)
    return names.flatmap(lambda chosen: st.fixed_dictionaries({name: choices[name] for name in chosen}))


SUBSCHEMAS = st.recursive(st.booleans() | _plain_keywords(st.just(True)), _plain_keywords, max_leaves=6)
ROOTS = st.builds(
    lambda keywords, first, others, draft: (
        {**keywords, "type": "object", "properties": {"a": first, **others}} | ({"$schema": draft} if draft else {})
    ),
    _plain_keywords(SUBSCHEMAS),
    SUBSCHEMAS,
    st.dictionaries(st.sampled_from(["b", "c"]), SUBSCHEMAS, max_size=2),
    DRAFTS,
)
# Mostly inputs that differ only in "a", the property the first subschema decides.
INPUTS = st.lists(TRICKY | VALUES, min_size=1, max_size=8).map(lambda values: [{"a": value} for value in values])


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(root=ROOTS, instances=INPUTS | st.lists(st.dictionaries(KEYS, TRICKY | VALUES, max_size=3), max_size=6))
def test_a_plain_schema_check_agrees_with_jsonschema(root: dict[str, Any], instances: list[dict[str, Any]]) -> None:
    try:
        validator = _validator(root)
    except UnusableTool:
        reject()
    check = plain_check(validator)
    if check is None:  # only where an older draft gives a keyword another meaning ("items")
        assert "draft-07" in root.get("$schema", "")
        return
    for instance in instances:
        assert _passes(check, instance) == (next(validator.iter_errors(instance), None) is None), instance


EDGES: list[tuple[Any, Any]] = [
    ({"items": False}, [1]),
    ({"items": False}, []),
    ({"items": {"type": "integer"}}, [1, 1.0, True]),
    ({"enum": [True]}, 1),
    ({"enum": [1]}, True),
    ({"const": [True]}, [1]),
    ({"const": {"a": 0}}, {"a": False}),
    ({"type": "integer"}, 1.0),
    ({"type": "integer"}, 1.5),
    ({"type": "number"}, True),
    ({"type": ["null", "boolean"]}, 0),
    ({"exclusiveMinimum": 1}, 1),
    ({"exclusiveMaximum": 1.5}, 1.5),
    ({"minimum": 1}, "0"),
    ({"maxLength": 1}, ["a", "b"]),
    ({"minItems": 1}, "a"),
    ({"additionalProperties": False, "properties": {"a": True}}, {"a": 1, "b": 2}),
    ({"additionalProperties": {"type": "string"}, "properties": {"a": True}}, {"a": 1, "b": 2}),
    ({"required": ["b"]}, [1]),
    ({"properties": {"b": False}}, {"b": None}),
]


@pytest.mark.parametrize(("subschema", "value"), EDGES)
def test_a_plain_check_agrees_with_jsonschema_where_types_are_subtle(subschema: dict[str, Any], value: Any) -> None:
    validator = _validator({"type": "object", "properties": {"a": subschema}})
    check = plain_check(validator)
    assert check is not None
    instance = {"a": value}
    assert _passes(check, instance) == (next(validator.iter_errors(instance), None) is None)


@pytest.mark.parametrize(
    "keyword", [{"pattern": "^a"}, {"anyOf": [{"type": "string"}]}, {"uniqueItems": True}, {"$ref": "#/$defs/p"}]
)
def test_a_keyword_only_jsonschema_checks_leaves_the_schema_to_it(keyword: dict[str, Any]) -> None:
    nested = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", **keyword}}}}
    assert plain_check(_validator({**nested, "$defs": {"p": {"type": "string"}}})) is None


def test_a_typical_tool_schema_has_a_plain_check_that_only_says_valid() -> None:
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string", "title": "Path"}, "limit": {"type": "integer", "minimum": 1}},
        "required": ["path"],
        "additionalProperties": False,
    }
    check = plain_check(_validator(schema))
    assert check is not None
    assert check({"path": "a", "limit": 2}) and check({"path": "a"})
    assert not check({"limit": 2}) and not check({"path": "a", "limit": 0}) and not check({"path": "a", "x": 1})
    assert plain_check(_validator({**schema, "properties": {"path": {"$ref": "#/$defs/p"}}})) is None


# -- a result fitted item by item ------------------------------------------------------------------


def _reference_fit(item: dict[str, Any], text: str, room: int) -> tuple[dict[str, Any], bool] | None:
    """How a text was fitted by encoding the whole item at every try (the slow path)."""
    cap = max(1, room)
    for _ in range(12):
        clean, cut = sanitize_scalar(text, cap, allow_newlines=True)
        candidate = {**item, "text": clean}
        size = len(canonical_json(candidate).encode("utf-8")) + 1
        if size <= room:
            return candidate, cut
        if cap == 1:
            return None
        cap = max(1, min(cap - 1, cap * room // size - 1))
    return None


def _reference_outcome(tool: str, server: str, result: mcp_types.CallToolResult) -> ToolOutcome[Any]:
    """The outcome with every item and the whole payload encoded again as they are measured and fenced."""
    blocks = [_item(block) for block in result.content[:256]]
    omitted = max(0, len(result.content) - 256)
    payload: dict[str, Any] = {"tool": tool, "server": server, "content": [], "truncated": False, "omitted": 0}
    used = payload_bytes({**payload, "truncated": True, "omitted": len(result.content) + 1})
    content: list[dict[str, Any]] = []
    truncated = False
    for index, (item, text) in enumerate(blocks):
        room = READ_RESULT_MAX_BYTES - used
        if text is None:
            size = len(canonical_json(item).encode("utf-8")) + 1
            fitted = (item, False) if size <= room else None
        else:
            fitted = _reference_fit(item, text, room)
        if fitted is None:
            omitted += len(blocks) - index
            truncated = True
            break
        piece, cut = fitted
        content.append(piece)
        truncated = truncated or cut
        used += len(canonical_json(piece).encode("utf-8")) + 1
    payload.update(content=content, truncated=truncated or omitted > 0, omitted=omitted)
    fenced = fence(payload)
    if result.is_error:
        return ToolOutcome.failure(
            f'The MCP tool "{tool}" reported an error. Its message follows as untrusted data from the server:\n{fenced}'
        )
    return ToolOutcome.success(fenced)


# Printable ASCII with everything escaped on the way, controls, bidi and zero-width code points, wide ones.
ALPHABET = 'ab <>\\"\n\t\r\x00\x7fé…\u202e\u200b\U0001f600\ud800'
TEXTS = st.builds(lambda piece, times: piece * times, st.text(ALPHABET, max_size=24), st.sampled_from([1, 40, 700]))
ASCII_TEXTS = st.builds(
    lambda piece, times: piece * times, st.text('ab <>\\"\n\t', max_size=24), st.sampled_from([1, 40, 700, 2000])
)
BLOCKS = st.one_of(
    st.builds(lambda text: mcp_types.TextContent(type="text", text=text), TEXTS | ASCII_TEXTS),
    st.builds(
        lambda text, name: mcp_types.EmbeddedResource(
            type="resource", resource=mcp_types.TextResourceContents(uri=f"file:///{name}", text=text)
        ),
        TEXTS | ASCII_TEXTS,
        st.from_regex(r"[a-z]{1,8}", fullmatch=True),
    ),
    st.just(mcp_types.ImageContent(type="image", data="QUJD" * 40, mime_type="image/png")),
)


SMALL_BLOCKS = st.builds(lambda text: mcp_types.TextContent(type="text", text=text), st.text(ALPHABET, max_size=40))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    blocks=st.lists(BLOCKS, max_size=4) | st.lists(SMALL_BLOCKS, min_size=250, max_size=260),
    tool=st.sampled_from(["fx__echo", "fx__é<x>"]),
    is_error=st.booleans(),
)
def test_a_result_fitted_item_by_item_is_the_whole_payload_encoded(
    blocks: list[Any], tool: str, is_error: bool
) -> None:
    result = mcp_types.CallToolResult(content=blocks, is_error=is_error)
    assert mcp_result_outcome(tool, "fx", result) == _reference_outcome(tool, "fx", result)


# -- the arguments' private copy -------------------------------------------------------------------

JSON_KEYS = st.text("ab\U0001f600\uffff\ud7ff", max_size=3)
COPYABLE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(ALPHABET),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(JSON_KEYS, inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(value=st.dictionaries(JSON_KEYS, COPYABLE, max_size=4))
def test_the_arguments_copy_is_the_digested_text_parsed(value: dict[str, Any]) -> None:
    text = canonical_json(value)
    copy = _private_copy(value, text)
    parsed = json.loads(text)
    # The same values of the same types, keys in the same order (what the SDK then sends).
    assert json.dumps(copy) == json.dumps(parsed)
    before = json.dumps(copy)
    for item in value.values():  # the caller's value changing afterwards leaves the copy as digested
        if isinstance(item, list | dict):
            item.clear()
    assert json.dumps(copy) == before


# -- a cancellation notice, and a call's tasks ------------------------------------------------------


def _notice(request_id: int) -> SessionMessage:
    params = {"requestId": request_id, "reason": "caller cancelled"}
    message = mcp_types.JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params=params)
    return SessionMessage(message=message)


async def test_a_cancellation_notice_never_holds_its_cancelled_sender(autojump_clock: trio.testing.MockClock) -> None:
    sender, receiver = anyio.create_memory_object_stream[SessionMessage](0)  # a transport that stopped reading
    async with sender, receiver, trio.open_nursery() as nursery:
        connection = Connection(nursery)
        stream = _NoticeWriteStream(sender, connection)
        with trio.CancelScope() as caller:
            caller.cancel()  # the call was cut (its timeout, Stop) ...
            with trio.CancelScope(shield=True):  # ... and the SDK writes its notice under a shield
                with trio.fail_after(1):  # (inside the shield, where only this scope can end the wait)
                    await stream.send(_notice(7))
        assert (await receiver.receive()).message.model_dump()["params"]["requestId"] == 7  # written once read
        await connection.settle()
        request = SessionMessage(message=mcp_types.JSONRPCRequest(jsonrpc="2.0", id=8, method="tools/list"))
        nursery.start_soon(stream.send, request)  # anything else is written by its sender, as the SDK does
        assert (await receiver.receive()).message.model_dump()["id"] == 8


async def test_a_closing_connection_waits_for_the_notices_of_its_cut_calls_but_not_for_ever(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sender, receiver = anyio.create_memory_object_stream[SessionMessage](0)
    async with sender, receiver, trio.open_nursery() as nursery:
        connection = Connection(nursery)
        stream = _NoticeWriteStream(sender, connection)
        call = trio.CancelScope()
        connection.running[call] = ToolExecutionContext.deferred(_no_document, cancel_scope=call)
        written: list[SessionMessage] = []

        async def cut_call_then_read() -> None:
            await trio.sleep(0.2)
            await stream.send(_notice(1))  # the call cut by the close hands its notice off, then ends
            connection.call_ended(call)
            await trio.sleep(0.3)
            written.append(await receiver.receive())  # the server reads it

        nursery.start_soon(cut_call_then_read)
        start = trio.current_time()
        await connection.settle()
        assert written and trio.current_time() - start == pytest.approx(0.5)
        await stream.send(_notice(2))  # a notice no one reads: the close goes on without it
        start = trio.current_time()
        await connection.settle()
        assert trio.current_time() - start == pytest.approx(SETTLE_TIMEOUT)
        nursery.cancel_scope.cancel()


async def test_a_call_on_a_live_connection_starts_no_task() -> None:
    class Spawned(trio.abc.Instrument):
        def __init__(self) -> None:
            self.names: list[str] = []

        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            self.names.append(task.name)

    toolset = McpToolset(StdioServer(name="fx", command=sys.executable, args=(SERVER_SCRIPT, "stdio")))
    async with trio.open_nursery() as nursery:
        echo = {tool.name: tool for tool in await nursery.start(toolset.run)}["fx__echo"]
        prepared = echo.prepare({"text": "x"})
        assert isinstance(prepared, PreparedCall)
        spawned = Spawned()
        trio.lowlevel.add_instrument(spawned)
        try:
            outcome = await prepared.run(ToolExecutionContext.deferred(_no_document, cancel_scope=trio.CancelScope()))
        finally:
            trio.lowlevel.remove_instrument(spawned)
        assert outcome.ok and spawned.names == []
        nursery.cancel_scope.cancel()


def _no_document() -> Any:
    raise AssertionError("an MCP tool never reads the document")
