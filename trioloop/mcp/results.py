"""What an MCP call's result becomes for the model: one fenced, sanitized payload within the read-result cap.

Text (from content blocks, embedded text resources, or structured content when no text block came with it)
is stripped, escaped and cut to fit READ_RESULT_MAX_BYTES; images, audio and binary resources are summarized
as type, MIME type and size, never inlined, and structured content that repeats their base64 data (as the
filesystem server's ``read_media_file`` does) shows a short placeholder in its place. Anything left out is
counted, never dropped silently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import mcp_types

from trioloop.machine.canonical import canonical_json
from trioloop.machine.tools import ToolOutcome
from trioloop.machine.untrusted_text import fence, sanitize_scalar
from trioloop.tools.read_result import READ_RESULT_MAX_BYTES, SCALAR_MAX_CODE_POINTS, payload_bytes

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


def _fit_text(item: dict[str, Any], text: str, room: int) -> tuple[dict[str, Any], bool] | None:
    """``item`` with as much of ``text`` as fits in ``room`` bytes (with its separator), or None."""
    cap = max(1, room)
    for _ in range(_SHRINK_ROUNDS):
        clean, cut = sanitize_scalar(text, cap, allow_newlines=True)
        candidate = {**item, "text": clean}
        size = len(canonical_json(candidate).encode("utf-8")) + 1
        if size <= room:
            return candidate, cut
        if cap == 1:
            return None
        cap = max(1, min(cap - 1, cap * room // size - 1))
    return None


def mcp_result_outcome(tool: str, server: str, result: mcp_types.CallToolResult) -> ToolOutcome[Any]:
    """The call's result as an outcome: success, or failure when the server flagged ``isError``."""
    blocks: list[tuple[dict[str, Any], str | None]] = [_item(block) for block in result.content[:256]]
    omitted = max(0, len(result.content) - 256)
    if result.structured_content is not None and not any(text is not None for _, text in blocks):
        placeholders = dict(filter(None, (_binary_data(block) for block in result.content)))
        structured = _without_binary(_json_safe(result.structured_content), placeholders)
        blocks.append(({"type": "structured"}, canonical_json(structured)))
    payload: dict[str, Any] = {"tool": tool, "server": server, "content": [], "truncated": False, "omitted": 0}
    # The frame is measured with the largest count that could be written, so the final payload only shrinks.
    frame = payload_bytes({**payload, "truncated": True, "omitted": len(result.content) + 1})
    used = frame
    content: list[dict[str, Any]] = []
    truncated = False
    for index, (item, text) in enumerate(blocks):
        room = READ_RESULT_MAX_BYTES - used
        if text is None:
            size = len(canonical_json(item).encode("utf-8")) + 1
            fitted: tuple[dict[str, Any], bool] | None = (item, False) if size <= room else None
        else:
            fitted = _fit_text(item, text, room)
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
