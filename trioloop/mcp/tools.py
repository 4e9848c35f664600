"""One MCP tool as a trioloop tool: a namespaced name, a sanitized description, the server's input schema
enforced by a JSON-schema validator before any grant, and a review card that says what the server claims
without letting the claim decide anything.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import jsonschema
import mcp_types
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator

from trioloop.machine.canonical import canonical_digest, canonical_json
from trioloop.machine.card import input_details, visible_char
from trioloop.machine.tools import PreparedCall, PrepareFailure, RegisteredTool, ToolOutcome
from trioloop.machine.untrusted_text import TRUNCATION_MARK, is_stripped_code_point, sanitize_scalar
from trioloop.mcp._patterns import PatternTimeout, bounded_validator_class, pattern_budget, uses_unbounded_regex
from trioloop.mcp._plain_schemas import Check, plain_check
from trioloop.mcp.servers import ToolClass
from trioloop.runtime.tools import ToolExecutionContext

__all__ = [
    "MAX_SCHEMA_BYTES",
    "TOOL_NAME_PATTERN",
    "McpCall",
    "UnusableTool",
    "build_mcp_tool",
    "namespaced_name",
]

TOOL_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What Anthropic and OpenAI both accept as a tool name; every namespaced name matches it."""
MAX_SCHEMA_BYTES: Final = 16_384
_DESCRIPTION_MAX: Final = 1024
_SCHEMA_TEXT_MAX: Final = 400
_CARD_INPUT_MAX: Final = 600
_MAX_ISSUES: Final = 10
_ISSUE_MAX: Final = 200
_SEPARATOR: Final = "__"

McpCall = Callable[[str, dict[str, Any], ToolExecutionContext[Any]], Awaitable[ToolOutcome[Any]]]
"""How a built tool reaches its server: (the server's own tool name, arguments, context) -> outcome."""


class UnusableTool(ValueError):
    """A listed tool that cannot be offered to the model (bad schema, too large); the toolset skips it."""


@functools.lru_cache(maxsize=1024)
def namespaced_name(server: str, tool: str) -> str:
    """``server__tool``, valid for every provider; a tool name that is not already plain ASCII of a safe
    length keeps a readable cleaned prefix and gains a hash of the exact original, so distinct names never
    merge and no name can pose as another."""
    room = 64 - len(server) - len(_SEPARATOR)
    if re.fullmatch(rf"[A-Za-z0-9_-]{{1,{room}}}", tool):
        return f"{server}{_SEPARATOR}{tool}"
    digest = hashlib.sha256(tool.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "_", tool).strip("_")[: room - len(digest) - 1]
    return f"{server}{_SEPARATOR}{cleaned + '_' if cleaned else ''}{digest}"


def _clean_schema(value: Any, key: str | None = None, path: str = "$") -> Any:
    """The schema with its free-text annotations (description, title) sanitized; validation keywords kept.

    Every other string in it (a property name, an ``enum`` or ``const`` value, a ``default``) reaches the
    model as is, and the validator matches the exact text, so it cannot be cleaned without changing what
    the tool accepts: one that holds a control, bidi or zero-width code point makes the tool unusable.
    """
    if isinstance(value, dict):
        cleaned: dict[str, Any] = {}
        for k, v in value.items():
            where = f"{path}.{k}" if isinstance(k, str) and k.isascii() and k.isprintable() else path
            _refuse_invisible(k, where)
            cleaned[k] = _clean_schema(v, k, where)
        return cleaned
    if isinstance(value, list):
        return [_clean_schema(item, None, f"{path}[{index}]") for index, item in enumerate(value)]
    if key in ("description", "title") and isinstance(value, str):
        return sanitize_scalar(value, _SCHEMA_TEXT_MAX, allow_newlines=True)[0]
    _refuse_invisible(value, path)
    return value


def _refuse_invisible(text: object, path: str) -> None:
    if isinstance(text, str) and any(is_stripped_code_point(char, allow_newlines=True) for char in text):
        raise UnusableTool(f"its input schema holds an invisible or control character at {path}")


def _validator(schema: dict[str, Any]) -> Validator:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise UnusableTool('its input schema is not a JSON schema of "type": "object"')
    try:
        size = len(canonical_json(schema).encode("utf-8"))
    except (TypeError, ValueError):
        raise UnusableTool("its input schema is not plain JSON") from None
    if size > MAX_SCHEMA_BYTES:
        raise UnusableTool(f"its input schema is {size} bytes, over the {MAX_SCHEMA_BYTES}-byte limit")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise UnusableTool(f"its input schema is invalid ({sanitize_scalar(exc.message, _ISSUE_MAX)[0]})") from None
    if uses_unbounded_regex(schema):
        raise UnusableTool("its input schema combines patternProperties with unevaluatedProperties")
    validator: Validator = bounded_validator_class(cls)(schema)
    return validator


def _passes(check: Check | None, raw: dict[str, Any]) -> bool:
    """Whether the schema's plain check (`plain_check`) finds ``raw`` valid; anything else is jsonschema's to decide."""
    if check is None:
        return False
    try:
        return check(raw)
    except Exception:  # e.g. a comparison the input's types do not allow: jsonschema decides
        return False


def _issues(validator: Validator, raw: dict[str, Any]) -> tuple[str, ...]:
    """The input's schema violations (at most ``_MAX_ISSUES``), its patterns matched within one budget:
    an input whose patterns cannot be checked in time is refused, never passed unchecked."""
    try:
        with pattern_budget():
            found = sorted(itertools.islice(validator.iter_errors(raw), _MAX_ISSUES), key=lambda e: e.json_path)
    except PatternTimeout as exc:
        return (f"$: the input could not be checked against the server's schema: {exc}",)
    return tuple(f"{error.json_path}: {sanitize_scalar(error.message, _ISSUE_MAX)[0]}" for error in found)


def _hints(annotations: mcp_types.ToolAnnotations | None) -> str:
    if annotations is None:
        return "The server makes no claims about this tool."
    said: list[str] = []
    if annotations.title is not None:
        said.append(f"title {json.dumps(sanitize_scalar(annotations.title, 80)[0], ensure_ascii=False)}")
    for flag, yes, no in (
        (annotations.read_only_hint, "read-only", "not read-only"),
        (annotations.destructive_hint, "destructive", "not destructive"),
        (annotations.idempotent_hint, "idempotent", "not idempotent"),
        (annotations.open_world_hint, "reaches the outside world", "closed-world"),
    ):
        if flag is not None:
            said.append(yes if flag else no)
    if not said:
        return "The server makes no claims about this tool."
    return f"The server says: {'; '.join(said)} (unverified; never used to approve anything)."


_CLASS_LINES: Final[Mapping[ToolClass, str]] = {
    "read": "Classified read-only by this app's configuration: it is approved without asking.",
    "mutate": "Classified as a change by this app's configuration (not destructive).",
    "destructive": "Treated as destructive: no tool from an MCP server is trusted unless the app classifies it.",
}


_FENCE_ESCAPES: Final = {"<": "\\<", ">": "\\>"}


def _visible(text: str, cap: int) -> str:
    """``text`` for the card with nothing hidden, so what the reviewer reads is what is sent: the core card's
    rule (``visible_char``: a backslash doubled, every invisible or control code point, line breaks included,
    shown as ``\\u{XXXX}``), and ``<`` and ``>`` escaped (no fence marker). Cut at ``cap`` code points with "…"."""
    cut = len(text) > cap
    head = text[: cap - 1] if cut else text
    if head.isascii() and head.isprintable() and not any(char in head for char in "\\<>"):
        return head + TRUNCATION_MARK if cut else head  # printable ASCII is shown as it is, but for those three
    shown: list[str] = []
    for index, char in enumerate(text):
        if index == cap:
            shown[-1] = TRUNCATION_MARK
            break
        shown.append(_FENCE_ESCAPES.get(char) or visible_char(char, allow_newlines=False))
    return "".join(shown)


def _card_frame(server: str, tool: str, tool_class: ToolClass, hints: str) -> tuple[str, str]:
    """The card's summary around its input (made once per tool): what comes before it and after it."""
    effect = (
        "It reads from outside the document."
        if tool_class == "read"
        else "It acts outside the document: undo cannot revert what it does."
    )
    shown_tool = json.dumps(_visible(tool, 80), ensure_ascii=False)
    return (
        f'MCP tool {shown_tool} on server "{server}" with input ',
        f"\n{effect}\n{_CLASS_LINES[tool_class]}\n{hints}",
    )


def _card_input(text: str, digest: str) -> str:
    """The input as the card's summary shows it: inline up to ``_CARD_INPUT_MAX`` characters; a longer one says how
    much is not shown inline and carries its digest, so two inputs the grant tells apart never share a summary
    (the card's field lines show every leaf of the input whole)."""
    shown_input = _visible(text, _CARD_INPUT_MAX)
    if len(text) > _CARD_INPUT_MAX:
        shown_input += (
            f" [{len(text) - _CARD_INPUT_MAX + 1} more characters not shown here; every field is listed whole"
            f" below; input digest {digest}]"
        )
    return shown_input


_PLAIN_SCALARS: Final = frozenset({str, int, bool, type(None)})


class _NotPlain(Exception):
    """A value `_canonical_copy` leaves to the JSON parser."""


def _canonical_copy(value: Any) -> Any:
    """``json.loads(canonical_json(value))`` without the parse, for a value of plain JSON types and no float (whose
    canonical form may differ from the value): containers copied, keys in canonical order, strings shared (they
    are immutable). Raises `_NotPlain` for anything else."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return value
    if kind is dict:
        # Below U+D800, code point order is the UTF-16 order canonical JSON sorts keys by.
        if not all(type(key) is str and (key.isascii() or max(key, default="") < "\ud800") for key in value):
            raise _NotPlain
        return {key: _canonical_copy(value[key]) for key in sorted(value)}
    if kind is list or kind is tuple:
        return [_canonical_copy(item) for item in value]
    raise _NotPlain


def _private_copy(value: Any, text: str) -> Any:
    """A copy of ``value`` no one else holds, equal to parsing ``text``, its canonical JSON (what was digested)."""
    try:
        return _canonical_copy(value)
    except (_NotPlain, RecursionError):
        return json.loads(text)


def build_mcp_tool(server: str, tool: mcp_types.Tool, tool_class: ToolClass, call: McpCall) -> RegisteredTool[Any]:
    """A registered tool for one listed MCP tool. Raises ``UnusableTool`` for a schema it cannot enforce."""
    try:
        validator = _validator(tool.input_schema)
        plain = plain_check(validator)
        schema = _clean_schema(tool.input_schema)
    except RecursionError:
        raise UnusableTool("its input schema is nested too deeply") from None
    name = namespaced_name(server, tool.name)
    described = sanitize_scalar(tool.description or "", _DESCRIPTION_MAX, allow_newlines=True)[0]
    description = f"[Tool from the MCP server \"{server}\"; its text is the server's, not the user's.] {described}"
    before_input, after_input = _card_frame(server, tool.name, tool_class, _hints(tool.annotations))
    original = tool.name

    def prepare(raw: Any) -> PreparedCall[Any] | PrepareFailure:
        if not isinstance(raw, dict):
            return PrepareFailure(issues=("$: the input must be a JSON object",))
        if not _passes(plain, raw):
            issues = _issues(validator, raw)
            if issues:
                return PrepareFailure(issues=issues)
        text = canonical_json(raw)
        arguments: dict[str, Any] = _private_copy(raw, text)  # exactly what was digested
        digest = canonical_digest(text)

        return PreparedCall(
            summary=before_input + _card_input(text, digest) + after_input,
            input_digest=digest,
            run=functools.partial(call, original, arguments),  # the call's own coroutine: no wrapper to await through
            # Every leaf, as a native tool's card lists them, from a copy of its own (the call's copy is sent),
            # made when a face asks for them.
            details=lambda: input_details(json.loads(text)),
            canonical=arguments,  # what rules' conditions read (never changed by them)
        )

    return RegisteredTool(
        name=name,
        description=description,
        effect="read" if tool_class == "read" else "mutate",
        destructive=tool_class == "destructive",
        json_schema=schema,
        prepare_fn=prepare,
    )
