import enum
from typing import Literal

import attrs
import pytest
import trio
import trio.lowlevel
from hypothesis import given
from hypothesis import strategies as st

from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import PreparedCall, PrepareFailure, ToolOutcome, create_tool_registry
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import ThreatModel


@attrs.frozen(kw_only=True)
class Point:
    x: float
    y: float


@attrs.frozen(kw_only=True)
class RenameInput:
    kind: Literal["elements", "threats"]
    name: str = tool_field(min_length=1, max_length=10)
    tags: tuple[str, ...] = tool_field(default=(), max_items=2)
    at: Point | None = None
    limit: int = tool_field(default=20, minimum=1, maximum=50)
    force: bool = False


def make_tool(name: str = "rename", effect: Literal["read", "mutate"] = "mutate", destructive: bool = False):  # type: ignore[no-untyped-def]
    return define_executable_tool(
        name=name,
        description="Rename something.",
        effect=effect,
        destructive=destructive,
        input_type=RenameInput,
        run=lambda inp, ctx: ToolOutcome.success(f"renamed to {inp.name}"),
        summarize=lambda inp: f"Rename {inp.kind} to {inp.name}",
    )


def issues(raw: object) -> tuple[str, ...]:
    result = make_tool().prepare(raw)
    assert isinstance(result, PrepareFailure), result
    return result.issues


def test_schema_derives_from_input_class() -> None:
    schema = make_tool().json_schema
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["kind", "name"]
    assert schema["properties"]["kind"] == {"type": "string", "enum": ["elements", "threats"]}
    assert schema["properties"]["name"] == {"type": "string", "minLength": 1, "maxLength": 10}
    assert schema["properties"]["limit"] == {"type": "integer", "minimum": 1, "maximum": 50}
    assert schema["properties"]["at"]["type"] == ["object", "null"]
    assert schema["properties"]["at"]["required"] == ["x", "y"]


def test_valid_input_prepares_with_plain_summary() -> None:
    result = make_tool().prepare({"kind": "elements", "name": "db"})
    assert isinstance(result, PreparedCall)
    assert result.summary == "Rename elements to db"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"name": "x"}, "kind: required field is missing"),
        ({"kind": "Elements", "name": "x"}, "kind: must be one of 'elements', 'threats'"),
        ({"kind": "elements", "name": 5}, "name: expected a string, got integer"),
        ({"kind": "elements", "name": ""}, "name: must be at least 1 character(s)"),
        ({"kind": "elements", "name": "x", "extra": 1}, "extra: 'extra' is not an accepted key"),
        (
            {"kind": "elements", "name": "x", "__proto__": {"polluted": True}},
            "__proto__: '__proto__' is not an accepted key",
        ),
        ({"kind": "elements", "name": "x", "limit": 51}, "limit: must be <= 50"),
        ({"kind": "elements", "name": "x", "limit": True}, "limit: expected an integer, got boolean"),
        ({"kind": "elements", "name": "x", "force": "yes"}, "force: expected a boolean, got string"),
        ({"kind": "elements", "name": "x", "tags": ["a", 1]}, "tags[1]: expected a string, got integer"),
        ({"kind": "elements", "name": "x", "tags": ["a", "b", "c"]}, "tags: must have at most 2 items"),
        ({"kind": "elements", "name": "x", "at": {"x": "1", "y": 2}}, "at.x: expected a number, got string"),
        ({"kind": "elements", "name": "x", "at": {"x": 1, "y": 2, "z": 3}}, "at.z: 'z' is not an accepted key"),
        ([], "the input must be a JSON object, got array"),
        ("rename", "the input must be a JSON object, got string"),
        (None, "the input must be a JSON object, got null"),
    ],
)
def test_invalid_input_reports_field_level_issues(raw: object, expected: str) -> None:
    assert expected in issues(raw)


def test_digest_ignores_key_order_and_equals_defaults() -> None:
    tool = make_tool()
    a = tool.prepare({"kind": "elements", "name": "db", "limit": 20})
    b = tool.prepare({"name": "db", "kind": "elements"})
    c = tool.prepare({"name": "db2", "kind": "elements"})
    assert isinstance(a, PreparedCall) and isinstance(b, PreparedCall) and isinstance(c, PreparedCall)
    assert a.input_digest == b.input_digest != c.input_digest


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda s: st.lists(s) | st.dictionaries(st.text(), s),
        max_leaves=8,
    )
)
def test_prepare_never_raises(raw: object) -> None:
    assert isinstance(make_tool().prepare(raw), PreparedCall | PrepareFailure)


async def test_run_executes_with_context() -> None:
    prepared = make_tool().prepare({"kind": "elements", "name": "db"})
    assert isinstance(prepared, PreparedCall)
    outcome = await prepared.run(ToolExecutionContext(document=None))  # type: ignore[arg-type]
    assert outcome == ToolOutcome.success("renamed to db")


async def test_async_run_sees_its_cancel_scope() -> None:
    seen: list[bool] = []

    async def run(inp: RenameInput, ctx: ToolExecutionContext) -> ToolOutcome:
        ctx.cancel_scope.cancel()
        seen.append(ctx.cancelled)
        await trio.lowlevel.checkpoint()
        return ToolOutcome.success("never")

    tool = define_executable_tool(
        name="t", description="", effect="mutate", destructive=False, input_type=RenameInput, run=run, summarize=str
    )
    prepared = tool.prepare({"kind": "elements", "name": "x"})
    assert isinstance(prepared, PreparedCall)
    scope = trio.CancelScope()
    with scope:
        await prepared.run(ToolExecutionContext(document=None, cancel_scope=scope))  # type: ignore[arg-type]
    assert seen == [True] and scope.cancelled_caught


async def test_a_deferred_context_makes_its_document_once_on_the_first_read() -> None:
    made: list[ThreatModel] = []

    def make() -> ThreatModel:
        made.append(ThreatModel())
        return made[-1]

    scope = trio.CancelScope()
    ctx = ToolExecutionContext.deferred(make, cancel_scope=scope)
    assert made == [] and "not yet made" in repr(ctx) and not ctx.cancelled
    first = ctx.document
    assert made == [first] and ctx.document is first and ctx.document is first and len(made) == 1
    assert ctx.cancel_scope is scope and "ready" in repr(ctx)
    scope.cancel()
    assert ctx.cancelled


def test_a_deferred_document_that_fails_to_build_is_tried_again_on_the_next_read() -> None:
    calls: list[int] = []

    def make() -> ThreatModel:
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("first try")
        return ThreatModel()

    ctx = ToolExecutionContext.deferred(make, cancel_scope=trio.CancelScope())
    with pytest.raises(MemoryError):
        _ = ctx.document
    assert ctx.document == ThreatModel() and len(calls) == 2


async def test_a_given_document_is_handed_over_as_is_with_a_fresh_scope() -> None:
    model = ThreatModel()
    ctx = ToolExecutionContext(document=model)
    assert ctx.document is model and not ctx.cancelled
    assert ToolExecutionContext(document=model).cancel_scope is not ctx.cancel_scope
    with pytest.raises(AttributeError):
        ctx.document = ThreatModel()  # type: ignore[misc]


def test_a_context_repr_works_outside_trio_and_never_makes_the_document() -> None:
    made: list[int] = []
    ctx = ToolExecutionContext.deferred(lambda: made.append(1) or ThreatModel(), cancel_scope=trio.CancelScope())
    assert repr(ctx) == "ToolExecutionContext(document=not yet made)" and made == []
    assert repr(ToolExecutionContext(document=ThreatModel())) == "ToolExecutionContext(document=ready)"


def test_read_and_destructive_is_refused() -> None:
    with pytest.raises(ValueError, match="both read-only and destructive"):
        make_tool(effect="read", destructive=True)


def test_registry_refuses_duplicates_and_matches_exactly() -> None:
    with pytest.raises(ValueError, match="Duplicate tool name"):
        create_tool_registry([make_tool("a"), make_tool("a")])
    registry = create_tool_registry([make_tool("delete_element"), make_tool("b")])
    assert registry.names == ("delete_element", "b")
    assert registry.get("delete_element") is not None
    for confusable in [
        "delete_element ",
        "Delete_Element",
        "delete_element\u200b",
        "delete_elementİ",
        "delete_еlement",
    ]:
        assert registry.get(confusable) is None
        assert confusable not in registry
    assert [d.name for d in registry.definitions()] == ["delete_element", "b"]


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen(kw_only=True)
class Paint:
    color: Color
    accent: Color | None = None


def test_str_enum_fields_are_validated_and_advertised() -> None:
    tool = define_executable_tool(
        name="paint",
        description="",
        effect="mutate",
        destructive=False,
        input_type=Paint,
        run=lambda i, c: ToolOutcome.success("ok"),
        summarize=lambda i: i.color.value,
    )
    ok = tool.prepare({"color": "red", "accent": None})
    assert isinstance(ok, PreparedCall) and ok.summary == "red"
    bad = tool.prepare({"color": "green"})
    assert isinstance(bad, PrepareFailure) and bad.issues == ("color: must be one of 'red', 'blue'",)
    assert tool.json_schema["properties"]["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert tool.json_schema["properties"]["accent"] == {"type": ["string", "null"], "enum": ["red", "blue", None]}


@attrs.frozen(kw_only=True)
class _Label:
    text: str = tool_field(description="Shown as is.", min_length=2, max_length=4)
    weight: int = tool_field(default=1, minimum=0, maximum=9)


@attrs.frozen(kw_only=True)
class _Board:
    title: str = tool_field(description="No rules but a description.")
    main: _Label | None = None
    labels: tuple[_Label, ...] = tool_field(default=(), max_items=3)


def test_constraints_inside_nested_objects_and_lists_of_objects_name_their_path() -> None:
    tool = define_executable_tool(
        name="board",
        description="Label a board.",
        effect="read",
        destructive=False,
        input_type=_Board,
        run=lambda inp, ctx: ToolOutcome.success("ok"),
        summarize=lambda inp: inp.title,
    )
    result = tool.prepare(
        {
            "title": "",  # a description is not a rule: an empty title passes
            "main": {"text": "x", "weight": 10},
            "labels": [{"text": "ok"}, {"text": "toolong", "weight": -1}, {"text": "ab"}, {"text": "cd"}],
        }
    )
    assert isinstance(result, PrepareFailure)
    assert result.issues == (
        "main.text: must be at least 2 character(s)",
        "main.weight: must be <= 9",
        "labels: must have at most 3 items",
        "labels[1].text: must be at most 4 characters",
        "labels[1].weight: must be >= 0",
    )
    assert isinstance(tool.prepare({"title": "t", "labels": [{"text": "ok", "weight": 9}]}), PreparedCall)
