"""Tool definitions: one attrs input class gives both the JSON schema the model sees and the strict
validation of what the model sends. ``prepare`` is the only way from raw model JSON to a runnable call.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import math
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Generic, Literal, TypeAlias, TypeVar

import attrs
import cattrs
import trio
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from trioloop.loop.canonical import input_digest
from trioloop.loop.card import CardDetails, input_details
from trioloop.loop.preview import Preview, PreviewFn
from trioloop.loop.questions import Answer, Question, QuestionField, QuestionRefused, Sampled, SamplingRequest
from trioloop.protocol.tools import ToolDefinition

__all__ = [
    "Effect",
    "PrepareFailure",
    "PreparedCall",
    "RegisteredTool",
    "ToolExecutionContext",
    "ToolOutcome",
    "ToolRegistry",
    "create_tool_registry",
    "define_executable_tool",
    "json_schema_for",
    "tool_field",
]

Effect: TypeAlias = Literal["read", "mutate"]
T = TypeVar("T")
#: The document type a tool works on (any type: see `trioloop.loop.document.DocumentKind`).
D = TypeVar("D")


@attrs.frozen(kw_only=True)
class ToolOutcome(Generic[D]):
    """What a tool run produced: ok with a result text and maybe a whole next document, or an error."""

    ok: bool
    result: str
    document: D | None = None

    @classmethod
    def success(cls, result: str, document: D | None = None) -> ToolOutcome[D]:
        """A successful run: ``result`` for the model and, for a mutation, the whole next ``document``."""
        return cls(ok=True, result=result, document=document)

    @classmethod
    def failure(cls, result: str) -> ToolOutcome[D]:
        """A failed run: ``result`` is the error text the model receives; nothing is committed."""
        return cls(ok=False, result=result, document=None)

    @property
    def is_text(self) -> bool:
        """Whether ``ok`` and ``result`` really are a bool and a str (the class does not check its fields)."""
        return type(self.ok) is bool and type(self.result) is str


#: Where a running call's progress goes: (progress, total or None, message).
ProgressSink: TypeAlias = Callable[[float, "float | None", str], None]
#: Where a running call's questions go: the runner numbers the question, shows it and returns the answer.
AskSink: TypeAlias = Callable[[Question], Awaitable[Answer]]
#: Where a running call's sampling requests go: a question card, then (approved) the session's model.
SampleSink: TypeAlias = Callable[[Question], Awaitable[Sampled]]


@typing.final
class ToolExecutionContext(Generic[D]):
    """What a running tool may see: the document snapshot it starts from and its own cancel scope.

    ``ToolExecutionContext(document=..., cancel_scope=...)`` hands over a document as is. The runner
    uses ``ToolExecutionContext.deferred``: the tool's private copy of the document is made the first
    time it reads ``document``, so a tool that never looks at the document costs no copy, and Stop
    does not have to free one while that tool unwinds. Either way ``document`` is the same object on
    every read.
    """

    __slots__ = ("_cancel_scope", "_document", "_make_document", "_on_ask", "_on_progress", "_on_sample")

    _document: D

    def __init__(
        self,
        *,
        document: D,
        cancel_scope: trio.CancelScope | None = None,
        on_progress: ProgressSink | None = None,
        on_ask: AskSink | None = None,
        on_sample: SampleSink | None = None,
    ) -> None:
        self._document = document
        self._make_document: Callable[[], D] | None = None
        self._cancel_scope = trio.CancelScope() if cancel_scope is None else cancel_scope
        self._on_progress = on_progress
        self._on_ask = on_ask
        self._on_sample = on_sample

    @classmethod
    def deferred(
        cls,
        make_document: Callable[[], D],
        *,
        cancel_scope: trio.CancelScope,
        on_progress: ProgressSink | None = None,
        on_ask: AskSink | None = None,
        on_sample: SampleSink | None = None,
    ) -> ToolExecutionContext[D]:
        """A context whose ``document`` is ``make_document()``, called once, on the first read."""
        context = cls.__new__(cls)
        context._make_document = make_document
        context._cancel_scope = cancel_scope
        context._on_progress = on_progress
        context._on_ask = on_ask
        context._on_sample = on_sample
        return context

    async def sample(self, *, source: str, request: SamplingRequest) -> Sampled:
        """Ask the person to let the session's model answer ``request`` on ``source``'s behalf: a card shows the
        messages, the system prompt, the preferred model and the token budget; only if the person accepts is
        it sent, through the session's provider, the asker's text fenced as untrusted and no tools offered.

        Returns `Sampled` (the person's action; the model's text once accepted). Raises `QuestionRefused` as
        `ask` does; the request counts against ``max_questions_per_turn``."""
        question = Question(id="", call_id="", source=source, kind="sampling", sampling=request)
        sink = self._on_sample
        if sink is None:
            await trio.lowlevel.checkpoint()
            raise QuestionRefused("No one can be asked: the call is not running in a turn.")
        return await sink(question)

    async def ask(
        self,
        *,
        source: str,
        message: str,
        fields: Sequence[QuestionField] = (),
        url: str = "",
    ) -> Answer:
        """Put a question to the person and wait for the answer: a form (``fields``) or a page at ``url``
        they may open themselves. The card shows ``source`` (who asks) and ``message`` as that asker's text.

        The turn deadline stands still while the person answers (``review_timeout_ms`` bounds the wait).
        Returns the person's `Answer`; Stop, the call's end and the turn's end make it ``cancel``. Raises
        `QuestionRefused` when there is no one to ask (outside a turn, the turn ending, or the turn's
        ``max_questions_per_turn`` spent), ``ValueError`` for a question that cannot be shown."""
        question = Question(
            id="", call_id="", source=source, kind="url" if url else "form", message=message, fields=fields, url=url
        )
        sink = self._on_ask
        if sink is None:
            await trio.lowlevel.checkpoint()
            raise QuestionRefused("No one can be asked: the call is not running in a turn.")
        return await sink(question)

    def report_progress(self, progress: float, total: float | None = None, message: str = "") -> None:
        """Say how far a long run has got (``progress`` of ``total``, and a short ``message``), for the person
        watching; the face shows it beside the running call. Never raises; does nothing outside a turn."""
        sink = self._on_progress
        if sink is None:
            return
        with contextlib.suppress(TypeError, ValueError):  # a value that is not a number: nothing is shown
            sink(float(progress), None if total is None else float(total), str(message))

    @property
    def document(self) -> D:
        """The tool's private copy of the document, made on first read (changing it changes nothing live)."""
        make = self._make_document
        if make is not None:
            self._document = make()
            self._make_document = None
        return self._document

    @property
    def cancel_scope(self) -> trio.CancelScope:
        """The call's own cancel scope: cancelled on Stop, at the deadline and when the call is no longer wanted.

        The runner has already entered it around an `async def` tool's run: read it (``cancel_called``,
        ``deadline``) or call ``cancel()``, but never enter it again (``with ctx.cancel_scope:`` raises
        RuntimeError, as entering any Trio cancel scope twice does). For a bound of your own inside the tool,
        open a new scope (``with trio.move_on_after(...)``)."""
        return self._cancel_scope

    @property
    def cancelled(self) -> bool:
        """Whether the call has been cancelled (a long tool checks it between steps)."""
        return self._cancel_scope.cancel_called

    def __repr__(self) -> str:
        # Nothing here asks Trio (``cancel_called`` needs a running loop): a repr must never raise.
        document = "not yet made" if self._make_document is not None else "ready"
        return f"ToolExecutionContext(document={document})"


RunFn: TypeAlias = Callable[[ToolExecutionContext[D]], Awaitable[ToolOutcome[D]]]
#: The tool's own function, called directly: its outcome when it returned without awaiting (a plain
#: ``def`` tool), or the awaitable an ``async def`` tool returns, still to be awaited.
InvokeFn: TypeAlias = Callable[[ToolExecutionContext[D]], "ToolOutcome[D] | Awaitable[ToolOutcome[D]]"]


@attrs.frozen(kw_only=True, repr=False, eq=False)
class PreparedCall(Generic[D]):
    """A validated call: plain-text summary for the reviewer, the digest a grant binds to, and ``run``.

    ``details`` is the whole input the digest covers, as ordered (field path, value) lines for the
    card (`trioloop.loop.card`); ``preview`` (when the tool declares one) is its dry run, bound to this
    input: ``preview(document) -> Preview`` (`trioloop.loop.preview`). ``details`` may be given as a
    function of no arguments instead of the lines themselves: it is then called on the first read and
    its lines kept (a call auto-approved by the read-only policy is never shown on a card, so it need
    not pay for them). The function must be pure, over a value no one else holds: what it returns is
    what the card shows, whenever it is first read.

    ``invoke``, when set, is the same run without the ``async`` wrapper: it returns the outcome
    itself when the tool finished without awaiting, and the runner then settles the call in place,
    with no task and no scheduler pass (a plain ``def`` tool cannot see a checkpoint anyway); what it
    returns otherwise is awaited in the call's task, as ``run`` would be.
    """

    summary: str
    input_digest: str
    run: RunFn[D] = attrs.field(eq=False, repr=False)
    _details: CardDetails | Callable[[], CardDetails] = attrs.field(default=(), alias="details")
    preview: Callable[[Any], Preview] | None = attrs.field(default=None, eq=False, repr=False)
    invoke: InvokeFn[D] | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def details(self) -> CardDetails:
        """The input's (path, value) lines, made on the first read when they were given as a function."""
        details = self._details
        if callable(details):
            details = details()
            object.__setattr__(self, "_details", details)  # made once; every later read sees the same lines
        return details

    # Equal when summary, digest and details are (the functions are not compared), as attrs would make it.
    def _key(self) -> tuple[str, str, CardDetails]:
        return (self.summary, self.input_digest, self.details)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, PreparedCall)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"PreparedCall(summary={self.summary!r}, input_digest={self.input_digest!r}, details={self.details!r})"


@attrs.frozen(kw_only=True)
class PrepareFailure:
    """Raw input the tool refused; each issue is ``path: problem`` text the model can act on."""

    issues: tuple[str, ...]

    @property
    def message(self) -> str:
        """Every problem with the input, in one text the model and the card can read."""
        return "; ".join(self.issues)


PrepareFn: TypeAlias = Callable[[Any], "PreparedCall[D] | PrepareFailure"]


@attrs.frozen(kw_only=True)
class RegisteredTool(Generic[D]):
    """A tool the loop may offer: its name, description, effect, whether it is destructive, and how to prepare a call
    (validate the input, make the card and the digest)."""

    name: str
    description: str
    effect: Effect
    destructive: bool
    json_schema: Mapping[str, Any] = attrs.field(eq=False, repr=False)
    _prepare: PrepareFn[D] = attrs.field(eq=False, repr=False, alias="prepare_fn")

    def __attrs_post_init__(self) -> None:
        if self.effect not in ("read", "mutate"):
            raise ValueError(f'Tool "{self.name}": effect must be "read" or "mutate".')
        if self.effect == "read" and self.destructive:
            raise ValueError(f'Tool "{self.name}" cannot be both read-only and destructive.')

    def prepare(self, raw: Any) -> PreparedCall[D] | PrepareFailure:
        """Validate raw model input; never raises for any input."""
        try:
            return self._prepare(raw)
        except Exception as exc:  # a tool's summarize must not crash the reducer
            return PrepareFailure(issues=(f"the input could not be prepared ({type(exc).__name__})",))

    @property
    def definition(self) -> ToolDefinition:
        """The tool as a provider sends it to the model: name, description, JSON schema."""
        return ToolDefinition(name=self.name, description=self.description, json_schema=self.json_schema)


# ---------------------------------------------------------------------------------------------
# Constraints and schema


def tool_field(
    *,
    default: Any = attrs.NOTHING,
    description: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    max_items: int | None = None,
) -> Any:
    """An attrs field whose constraints appear in the JSON schema and are enforced by ``prepare``."""
    metadata = {
        key: value
        for key, value in {
            "description": description,
            "minLength": min_length,
            "maxLength": max_length,
            "minimum": minimum,
            "maximum": maximum,
            "maxItems": max_items,
        }.items()
        if value is not None
    }
    return attrs.field(default=default, metadata={"trioloop": metadata})


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) != len(typing.get_args(tp))
        if len(args) == 1:
            return args[0], nullable
        raise TypeError(f"unions other than Optional are not supported in tool inputs: {tp!r}")
    return tp, False


def _type_schema(tp: Any) -> dict[str, Any]:
    tp, nullable = _unwrap_optional(tp)
    schema: dict[str, Any]
    origin = typing.get_origin(tp)
    if tp is str:
        schema = {"type": "string"}
    elif tp is bool:
        schema = {"type": "boolean"}
    elif tp is int:
        schema = {"type": "integer"}
    elif tp is float:
        schema = {"type": "number"}
    elif tp is Any:
        schema = {}
    elif origin is Literal:
        values = list(typing.get_args(tp))
        schema = {"type": "string", "enum": values} if all(isinstance(v, str) for v in values) else {"enum": values}
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        schema = {"type": "string", "enum": [m.value for m in tp]}
    elif origin in (tuple, list):
        args = typing.get_args(tp)
        schema = {"type": "array", "items": _type_schema(args[0]) if args else {}}
    elif attrs.has(tp):
        schema = json_schema_for(tp)
    else:
        raise TypeError(f"unsupported tool input type: {tp!r}")
    if nullable and "type" in schema:
        schema = {**schema, "type": [schema["type"], "null"]}
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
    return schema


def json_schema_for(cls: type[Any]) -> dict[str, Any]:
    """The JSON schema of an attrs input class: strict object, required fields in declaration order."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        name = field.alias or field.name
        schema = _type_schema(hints[field.name])
        constraints = dict(field.metadata.get("trioloop", {}))
        properties[name] = {**schema, **constraints}
        if field.default is attrs.NOTHING:
            required.append(name)
    result: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        result["required"] = required
    return result


# ---------------------------------------------------------------------------------------------
# Strict structuring


class _InputIssue(Exception):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _enum_member(value: Any, tp: type[enum.Enum]) -> Any:
    for member in tp:
        if type(value) is type(member.value) and value == member.value:
            return member
    choices = ", ".join(repr(m.value) for m in tp)
    raise ValueError(f"must be one of {choices}")


def _strict_str(value: Any, tp: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):  # a StrEnum dispatches here as a str subclass
        return _enum_member(value, tp)
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {_type_name(value)}")
    return value


def _strict_int(value: Any, _: Any) -> int:
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {_type_name(value)}")
    return value


def _strict_float(value: Any, _: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise TypeError(f"expected a number, got {_type_name(value)}")
    return float(value)


def _strict_bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {_type_name(value)}")
    return value


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook(Any, lambda v, _: v)

    def is_literal(tp: Any) -> bool:
        return typing.get_origin(tp) is Literal

    def structure_literal(value: Any, tp: Any) -> Any:
        allowed = typing.get_args(tp)
        if isinstance(value, bool) or value not in allowed or type(value) not in {type(a) for a in allowed}:
            choices = ", ".join(repr(a) for a in allowed)
            raise ValueError(f"must be one of {choices}")
        return value

    conv.register_structure_hook_func(is_literal, structure_literal)

    def is_enum(tp: Any) -> bool:
        return isinstance(tp, type) and issubclass(tp, enum.Enum)

    conv.register_structure_hook_func(is_enum, _enum_member)

    def is_sequence(tp: Any) -> bool:
        return typing.get_origin(tp) in (tuple, list)

    def structure_sequence(value: Any, tp: Any) -> Any:
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {_type_name(value)}")
        (item_type, *_rest) = typing.get_args(tp) or (Any,)
        items = []
        for index, item in enumerate(value):
            try:
                items.append(conv.structure(item, item_type))
            except Exception as exc:
                raise _NestedIssue(f"[{index}]", exc) from None
        return tuple(items) if typing.get_origin(tp) is tuple else items

    conv.register_structure_hook_func(is_sequence, structure_sequence)

    def is_attrs_class(tp: Any) -> bool:
        return isinstance(tp, type) and attrs.has(tp)

    def structure_object(value: Any, tp: Any) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {_type_name(value)}")
        return _object_hook(conv, tp)(value, tp)

    conv.register_structure_hook_func(is_attrs_class, structure_object)
    return conv


class _NestedIssue(Exception):
    def __init__(self, step: str, inner: BaseException) -> None:
        super().__init__(step)
        self.step = step
        self.inner = inner


_object_hooks: dict[type[Any], Callable[[Any, Any], Any]] = {}


def _object_hook(conv: cattrs.Converter, tp: type[Any]) -> Callable[[Any, Any], Any]:
    hook = _object_hooks.get(tp)
    if hook is None:
        hook = cattrs.gen.make_dict_structure_fn(tp, conv, _cattrs_forbid_extra_keys=True)
        _object_hooks[tp] = hook
    return hook


_converter = _make_converter()


def _issues(exc: BaseException, path: str) -> Iterator[str]:
    """Flatten a cattrs error tree into ``path: problem`` lines."""
    if isinstance(exc, _NestedIssue):
        yield from _issues(exc.inner, path + exc.step)
        return
    if isinstance(exc, ForbiddenExtraKeysError):
        for key in sorted(exc.extra_fields):
            yield f"{_join(path, key)}: {key!r} is not an accepted key"
        return
    if isinstance(exc, ClassValidationError | IterableValidationError):
        for sub in exc.exceptions:
            step = ""
            for note in getattr(sub, "__notes__", []):
                name = getattr(note, "name", None)
                index = getattr(note, "index", None)
                if isinstance(name, str):
                    step = "." + name
                elif isinstance(index, int):
                    step = f"[{index}]"
            if isinstance(sub, KeyError) and step:
                yield f"{(path + step).lstrip('.')}: required field is missing"
            else:
                yield from _issues(sub, path + step)
        return
    message = str(exc) if not isinstance(exc, KeyError) else "required field is missing"
    where = path.lstrip(".")
    yield f"{where}: {message}" if where else message


def _join(path: str, key: str) -> str:
    return f"{path}.{key}".lstrip(".")


_FieldRules: TypeAlias = tuple[tuple[str, str, Mapping[str, Any]], ...]
_field_rules_by_class: dict[type[Any], _FieldRules] = {}


def _field_rules(cls: type[Any]) -> _FieldRules:
    """(attribute, name in the input, constraint rules) for each field of an attrs input class, read once."""
    rules = _field_rules_by_class.get(cls)
    if rules is None:
        fields = attrs.fields(cls)
        rules = tuple(
            (field.name, field.alias or field.name, _checked_rules(field.metadata.get("trioloop", {})))
            for field in fields
        )
        _field_rules_by_class[cls] = rules
    return rules


_CHECKED_RULES = ("minLength", "maxLength", "minimum", "maximum", "maxItems")


def _checked_rules(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """The rules ``prepare`` enforces (a field's description is for the schema only)."""
    return {key: metadata[key] for key in _CHECKED_RULES if key in metadata}


#: Values that can hold no nested input (so need no ``attrs.has`` check) and carry no rules when none are set.
_PLAIN_VALUES: frozenset[type[Any]] = frozenset({str, int, float, bool})


def _check_constraints(instance: Any, path: str) -> Iterator[str]:
    for name, alias, rules in _field_rules(type(instance)):
        value = getattr(instance, name)
        if value is None or (not rules and type(value) in _PLAIN_VALUES):
            continue  # nothing to check (the common case: no per-field work, not even the path)
        if isinstance(value, str):
            length = len(value)
            if "minLength" in rules and length < rules["minLength"]:
                yield f"{_join(path, alias)}: must be at least {rules['minLength']} character(s)"
            if "maxLength" in rules and length > rules["maxLength"]:
                yield f"{_join(path, alias)}: must be at most {rules['maxLength']} characters"
            if type(value) is str:
                continue  # a plain string holds no nested input
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if "minimum" in rules and value < rules["minimum"]:
                yield f"{_join(path, alias)}: must be >= {_fmt(rules['minimum'])}"
            if "maximum" in rules and value > rules["maximum"]:
                yield f"{_join(path, alias)}: must be <= {_fmt(rules['maximum'])}"
        elif isinstance(value, tuple | list):
            where = _join(path, alias)
            if "maxItems" in rules and len(value) > rules["maxItems"]:
                yield f"{where}: must have at most {rules['maxItems']} items"
            for index, item in enumerate(value):
                if attrs.has(type(item)):
                    yield from _check_constraints(item, f"{where}[{index}]")
        if attrs.has(type(value)):
            yield from _check_constraints(value, _join(path, alias))


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def structure_input(raw: Any, input_type: type[T]) -> T | PrepareFailure:
    """Strictly structure raw model JSON into ``input_type`` or explain every problem found."""
    if not isinstance(raw, dict):
        return PrepareFailure(issues=(f"the input must be a JSON object, got {_type_name(raw)}",))
    try:
        # Structure a private copy: an ``Any`` field would otherwise hand the tool the very JSON object
        # the history's ToolCallBlock holds, and a tool mutating it would rewrite what the model sent.
        instance = _converter.structure(_json_copy(raw), input_type)
    except Exception as exc:
        issues = tuple(dict.fromkeys(_issues(exc, ""))) or ("the input is not valid",)
        return PrepareFailure(issues=issues)
    problems = tuple(_check_constraints(instance, ""))
    if problems:
        return PrepareFailure(issues=problems)
    return instance


def _json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (containers rebuilt with their own types; scalars are immutable)."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_json_copy(item) for item in value)
    return value


def unstructure_input(instance: Any) -> Any:
    return _converter.unstructure(instance)


# ---------------------------------------------------------------------------------------------
# Definition and registry


def define_executable_tool(
    *,
    name: str,
    description: str,
    effect: Effect,
    destructive: bool,
    input_type: type[T],
    run: Callable[[T, ToolExecutionContext[D]], ToolOutcome[D] | Awaitable[ToolOutcome[D]]],
    summarize: Callable[[T], str],
    preview: PreviewFn | None = None,
) -> RegisteredTool[D]:
    """Build a tool whose schema and validation both come from ``input_type`` (an attrs class).

    ``preview``, if given, is a pure ``(document, input) -> Preview`` dry run shown on the review card.
    """
    if not attrs.has(input_type):
        raise TypeError("input_type must be an attrs class")
    schema = json_schema_for(input_type)

    def prepare(raw: Any) -> PreparedCall[D] | PrepareFailure:
        structured: Any = structure_input(raw, input_type)
        if isinstance(structured, PrepareFailure):
            return structured
        validated: T = structured
        canonical = unstructure_input(validated)
        digest = input_digest(canonical)

        invoke = partial(run, validated)
        bound = None if preview is None else partial(_bound_preview, preview, validated)
        return PreparedCall(
            summary=summarize(validated),
            input_digest=digest,
            run=partial(_run_invoked, invoke),
            # Lines for a card, made only if one is shown: ``canonical`` is this call's own (unstructure
            # builds it anew), so the lines are the same whenever they are made.
            details=partial(input_details, canonical),
            preview=bound,
            invoke=invoke,
        )

    return RegisteredTool(
        name=name,
        description=description,
        effect=effect,
        destructive=destructive,
        json_schema=schema,
        prepare_fn=prepare,
    )


async def _run_invoked(invoke: InvokeFn[D], ctx: ToolExecutionContext[D]) -> ToolOutcome[D]:
    """A prepared call's ``run``: its ``invoke``, awaited when the tool is a coroutine function, and
    followed by a checkpoint when it is a plain one."""
    produced = invoke(ctx)
    if inspect.isawaitable(produced):
        return await produced
    await trio.lowlevel.checkpoint()
    return produced


def _bound_preview(preview: PreviewFn, validated: Any, document: Any) -> Preview:
    return preview(document, validated)


@attrs.frozen
class ToolRegistry(Generic[D]):
    """A frozen, ordered set of tools resolved by exact name (no trimming, folding or normalizing)."""

    tools: tuple[RegisteredTool[D], ...]
    _by_name: Mapping[str, RegisteredTool[D]] = attrs.field(init=False, repr=False, eq=False)
    _definitions: tuple[ToolDefinition, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_name: dict[str, RegisteredTool[D]] = {}
        for tool in self.tools:
            if tool.name in by_name:
                raise ValueError(f'Duplicate tool name "{tool.name}" in registry.')
            by_name[tool.name] = tool
        object.__setattr__(self, "_by_name", types.MappingProxyType(by_name))
        # Built once: every model request carries them.
        object.__setattr__(self, "_definitions", tuple(t.definition for t in self.tools))

    def get(self, name: str) -> RegisteredTool[D] | None:
        """The tool named ``name``, or None."""
        if type(name) is not str:
            return None
        return self._by_name.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and type(name) is str and name in self._by_name

    def __iter__(self) -> Iterator[RegisteredTool[D]]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    @property
    def names(self) -> tuple[str, ...]:
        """The tools' names, in registration order."""
        return tuple(t.name for t in self.tools)

    def definitions(self) -> tuple[ToolDefinition, ...]:
        """Every tool's definition, in registration order (what a request offers the model)."""
        return self._definitions


def create_tool_registry(tools: Iterable[RegisteredTool[D]] = ()) -> ToolRegistry[D]:
    """A frozen registry of ``tools`` in the order given (what the model sees); duplicate names are refused."""
    return ToolRegistry(tuple(tools))
