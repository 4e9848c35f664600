"""What an MCP call's result becomes for the model: one fenced, sanitized payload within the read-result cap.

Text (from content blocks, embedded text resources, or structured content when no text block came with it)
is stripped, escaped and cut to fit READ_RESULT_MAX_BYTES; images, audio and binary resources are summarized
as type, MIME type and size, never inlined, and structured content that repeats their base64 data (as the
filesystem server's ``read_media_file`` does) shows a short placeholder in its place. Anything left out is
counted, never dropped silently.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Final

import mcp_types

from trioloop.machine.canonical import canonical_json
from trioloop.machine.tools import ToolOutcome
from trioloop.machine.untrusted_text import TRUNCATION_MARK, fence_canonical, sanitize_scalar
from trioloop.tools.read_result import READ_RESULT_MAX_BYTES, SCALAR_MAX_CODE_POINTS

__all__ = ["mcp_result_outcome"]

_SHRINK_ROUNDS: Final = 12


def _scalar(value: str | None) -> str | None:
    return None if value is None else sanitize_scalar(value, SCALAR_MAX_CODE_POINTS)[0]


def _base64_bytes(data: str) -> int:
    """Decoded size of base64 text, without decoding it."""
    length = len(data.rstrip("="))
    return length * 3 // 4


def _binary(kind: str, mime_type: str | None, data: str, uri: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": kind, "bytes": _base64_bytes(data), "inlined": False}
    if mime_type is not None:
        item["mime_type"] = _scalar(mime_type)
    if uri is not None:
        item["uri"] = _scalar(uri)
    return item


def _binary_data(block: Any) -> tuple[str, str] | None:
    """(base64 data, placeholder) for a block that carries binary data, else None."""
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        data, mime_type = block.data, block.mime_type
    elif isinstance(block, mcp_types.EmbeddedResource) and isinstance(block.resource, mcp_types.BlobResourceContents):
        data, mime_type = block.resource.blob, block.resource.mime_type or "binary data"
    else:
        return None
    size = _base64_bytes(data)
    shown = f"{size} bytes" if size < 1000 else f"{round(size / 1000)} kB"
    return data, f"[{_scalar(mime_type)}, {shown}, not shown]"


def _without_binary(value: Any, placeholders: Mapping[str, str]) -> Any:
    """``value`` with every string that repeats a content block's base64 data (bare, or as the payload of a
    ``data:`` URL) replaced by that block's placeholder."""
    if isinstance(value, Mapping):
        return {key: _without_binary(item, placeholders) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_binary(item, placeholders) for item in value]
    if isinstance(value, str) and placeholders:
        found = placeholders.get(value)
        if found is None and value.startswith("data:") and "," in value:
            found = placeholders.get(value.partition(",")[2])
        return value if found is None else found
    return value


_TEXT_BLOCK: Final = {"type": "text"}


def _item(block: Any) -> tuple[dict[str, Any], str | None]:
    """One content block as (fields without its text, its untrusted text or None)."""
    if isinstance(block, mcp_types.TextContent):
        return {"type": "text"}, block.text
    if isinstance(block, mcp_types.ImageContent):
        return _binary("image", block.mime_type, block.data), None
    if isinstance(block, mcp_types.AudioContent):
        return _binary("audio", block.mime_type, block.data), None
    if isinstance(block, mcp_types.ResourceLink):
        link = {"type": "resource_link", "uri": _scalar(str(block.uri)), "name": _scalar(block.name)}
        if block.mime_type is not None:
            link["mime_type"] = _scalar(block.mime_type)
        return link, None
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return {"type": "resource", "uri": _scalar(str(resource.uri))}, resource.text
        return _binary("resource", resource.mime_type, resource.blob, str(resource.uri)), None
    return {"type": "unsupported", "block": _scalar(type(block).__name__)}, None


#: The ASCII code points ``sanitize_scalar`` strips from text: the controls but newline and tab, and DEL.
_ASCII_CONTROLS: Final = bytes([*range(0x20), 0x7F]).translate(None, b"\n\t")
#: How each ASCII character that changes is written once sanitized (a backslash doubled, "<" and ">" escaped) and
#: then encoded as a JSON string; the backslash first, so the backslashes the others add are not doubled again.
_ASCII_ESCAPES: Final = (("\\", "\\\\\\\\"), ("<", "\\\\<"), (">", "\\\\>"), ('"', '\\"'), ("\n", "\\n"), ("\t", "\\t"))


def _plain_ascii(text: str) -> bool:
    """Whether ``text`` is printable ASCII (newlines and tabs allowed): sanitizing it strips nothing."""
    if not text.isascii():
        return False
    raw = text.encode("ascii")
    return len(raw.translate(None, _ASCII_CONTROLS)) == len(raw)


def _ascii_literal(text: str) -> str:
    """``canonical_json(sanitize_scalar(text, ...)[0])`` for printable ASCII ``text`` that is not cut."""
    for char, escaped in _ASCII_ESCAPES:
        if char in text:
            text = text.replace(char, escaped)
    return f'"{text}"'


def _around_text(item: dict[str, Any]) -> tuple[str, str]:
    """The canonical JSON of ``item`` with a ``"text"`` member, as the parts before and after that member's value."""
    before, found, after = canonical_json({**item, "text": ""}).partition('"text":""')
    assert found and not before[1:], item  # "text" sorts before every other key of an item that carries text
    return before + '"text":', after


_AROUND_TEXT_BLOCK: Final = _around_text({"type": "text"})


def _fit_text(item: dict[str, Any], text: str, room: int) -> tuple[str, int, bool] | None:
    """``item`` with as much of ``text`` as fits in ``room`` bytes (with its separator): its canonical JSON, that
    size, and whether the text was cut; or None.

    Text whose longest head read here is printable ASCII (as most tool output is) loses nothing to stripping: it is
    escaped and measured as ASCII, and the "…" of a cut (three bytes) joins it only in the piece returned."""
    before, after = _AROUND_TEXT_BLOCK if item == _TEXT_BLOCK else _around_text(item)
    frame = len(before.encode("utf-8")) + len(after.encode("utf-8")) + 1
    cap = max(1, room)
    plain = _plain_ascii(text[: cap + 1])  # each later round reads a shorter head of the same text
    for _ in range(_SHRINK_ROUNDS):
        if plain:
            cut = len(text) > cap
            literal = _ascii_literal(text[: cap - 1] if cut else text)
            size = frame + len(literal) + (3 if cut else 0)
            if size <= room:
                literal = f'{literal[:-1]}{TRUNCATION_MARK}"' if cut else literal
                return before + literal + after, size, cut
        else:
            clean, cut = sanitize_scalar(text, cap, allow_newlines=True)
            literal = canonical_json(clean)
            size = frame + len(literal.encode("utf-8"))
            if size <= room:
                return before + literal + after, size, cut
        if cap == 1:
            return None
        cap = max(1, min(cap - 1, cap * room // size - 1))
    return None


@functools.lru_cache(maxsize=1024)
def _names(tool: str, server: str) -> str:
    """The payload's ``"server"`` and ``"tool"`` members as canonical JSON, made once per tool."""
    return canonical_json({"server": server, "tool": tool})[1:-1]


def _payload_line(content: list[str], omitted: int, names: str, truncated: bool) -> str:
    """``canonical_json`` of the payload ``{"content", "omitted", "server", "tool", "truncated"}`` (its keys in that
    order), from its content items' own canonical JSON and `_names`: nothing already encoded is encoded again."""
    flag = "true" if truncated else "false"
    return f'{{"content":[{",".join(content)}],"omitted":{omitted},{names},"truncated":{flag}}}'


def mcp_result_outcome(tool: str, server: str, result: mcp_types.CallToolResult) -> ToolOutcome[Any]:
    """The call's result as an outcome: success, or failure when the server flagged ``isError``.

    Each item is encoded once, as it is fitted, and the payload's line is made of those encodings (`_payload_line`)."""
    blocks: list[tuple[dict[str, Any], str | None]] = [_item(block) for block in result.content[:256]]
    omitted = max(0, len(result.content) - 256)
    if result.structured_content is not None and not any(text is not None for _, text in blocks):
        placeholders = dict(filter(None, (_binary_data(block) for block in result.content)))
        structured = _without_binary(_json_safe(result.structured_content), placeholders)
        blocks.append(({"type": "structured"}, canonical_json(structured)))
    names = _names(tool, server)
    # The frame is measured with the largest count that could be written, so the final payload only shrinks.
    used = len(_payload_line([], len(result.content) + 1, names, True).encode("utf-8"))
    content: list[str] = []
    truncated = False
    for index, (item, text) in enumerate(blocks):
        room = READ_RESULT_MAX_BYTES - used
        if text is None:
            encoded = canonical_json(item)
            size = len(encoded.encode("utf-8")) + 1
            fitted: tuple[str, int, bool] | None = (encoded, size, False) if size <= room else None
        else:
            fitted = _fit_text(item, text, room)
        if fitted is None:
            omitted += len(blocks) - index
            truncated = True
            break
        piece, size, cut = fitted
        content.append(piece)
        truncated = truncated or cut
        used += size
    fenced = fence_canonical(_payload_line(content, omitted, names, truncated or omitted > 0))
    if result.is_error:
        return ToolOutcome.failure(
            f'The MCP tool "{tool}" reported an error. Its message follows as untrusted data from the server:\n{fenced}'
        )
    return ToolOutcome.success(fenced)


def _json_safe(value: Any) -> Any:
    """Structured content as plain JSON values (a non-finite float becomes null; keys become strings)."""
    if isinstance(value, Mapping):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
