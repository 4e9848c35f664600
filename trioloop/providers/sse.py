"""Incremental Server-Sent Events framing, sans-IO: bytes in, ``(event, data)`` frames out.

The decoder follows the WHATWG event-stream rules (CRLF, CR or LF line ends, ``:`` comments, multi-line
``data``, the default event name ``message``, dispatch on a blank line) over chunks split anywhere, even
inside a UTF-8 sequence. Only whole lines are decoded, so a split multibyte character is simply part
of an incomplete line. It fails closed with ``malformed_stream`` on invalid UTF-8 or on a partial
line longer than a fixed cap, and stays failed afterwards.
"""

from __future__ import annotations

import contextlib
import re
from typing import NoReturn, final

import attrs

from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode

__all__ = ["MAX_LINE_BYTES", "SseDecoder", "SseFrame"]

MAX_LINE_BYTES = 1024 * 1024
"""The longest line the decoder accepts, terminated or not (1 MiB); no real provider event comes close."""

LINE_TOO_LONG_MESSAGE = "The AI provider stream sent an unterminated line too long to be a real event."
INVALID_UTF8_MESSAGE = "The AI provider stream was not valid UTF-8."
DECODER_CLOSED_MESSAGE = "The AI provider stream was read after it ended."

_BOM = "\ufeff"
_LINE_BREAK = re.compile("\r\n|\r|\n")


@final
@attrs.frozen(kw_only=True)
class SseFrame:
    """One dispatched event: its name (``message`` when the stream gave none) and its data lines joined by LF."""

    event: str = "message"
    data: str = ""
    at_eof: bool = False
    """True for an event the body ended inside (no closing blank line): a mapper drops it if it is not whole."""


@final
class SseDecoder:
    """Turns a byte stream into ``SseFrame``s; feed chunks as they arrive, then ``close()``."""

    __slots__ = ("_closed", "_data", "_event", "_failure", "_line_cap", "_partial", "_saw_first_line", "_skip_lf")

    def __init__(self, *, line_cap: int = MAX_LINE_BYTES) -> None:
        self._line_cap = line_cap
        self._partial = bytearray()
        self._skip_lf = False  # the previous chunk ended in CR: a leading LF belongs to that line end
        self._saw_first_line = False
        self._event = ""
        self._data: list[str] = []
        self._failure: str | None = None
        self._closed = False

    def feed(self, chunk: bytes) -> list[SseFrame]:
        """Frames completed by ``chunk``; raises ``ProtocolError(malformed_stream)`` once the stream is bad.

        Frames that precede the bad line are always returned first (the error then comes from the next
        ``feed`` or ``close``), so what a consumer sees does not depend on how the bytes were split.
        """
        if (
            not self._partial
            and not self._skip_lf
            and chunk.endswith(b"\n")
            and self._failure is None
            and not self._closed
            and len(chunk) <= self._line_cap
            and b"\r" not in chunk
        ):
            # The common chunk: whole LF-terminated lines and nothing carried over, read in one pass.
            try:
                text = chunk.decode("utf-8")
            except UnicodeDecodeError:
                pass  # the general path below finds the bad line and keeps what precedes it
            else:
                lines = text.split("\n")
                lines.pop()  # the empty remainder after the final LF
                if (
                    len(lines) == 3
                    and not lines[2]
                    and self._saw_first_line
                    and not self._data
                    and not self._event
                    and lines[0].startswith("event: ")
                    and lines[1].startswith("data: ")
                ):
                    # The chunk a live stream sends per event: one named event of one data line, dispatched whole.
                    return [SseFrame(event=lines[0][7:] or "message", data=lines[1][6:])]
                frames: list[SseFrame] = []
                self._dispatch_lines(lines, frames)
                return frames
        if self._failure is not None:
            raise ProtocolError(ProtocolErrorCode.MALFORMED_STREAM, self._failure)
        if self._closed:
            raise ProtocolError(ProtocolErrorCode.MALFORMED_STREAM, DECODER_CLOSED_MESSAGE)
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return []
        if b"\n" not in chunk and b"\r" not in chunk:
            self._partial += chunk
            self._check_cap()
            return []
        if self._partial:
            buffer = bytes(self._partial) + chunk
            self._partial.clear()
        else:
            buffer = chunk
        end = max(buffer.rfind(b"\n"), buffer.rfind(b"\r")) + 1
        complete, tail = buffer[:end], buffer[end:]
        # Only a CR that is the chunk's very last byte can be half of a CRLF split across chunks.
        self._skip_lf = not tail and complete.endswith(b"\r")
        frames = []
        try:
            self._process_lines(complete, frames)
            self._partial += tail
            self._check_cap()
        except ProtocolError:
            if frames:
                return frames  # the failure is stored and raised by the next call
            raise
        return frames

    def close(self) -> list[SseFrame]:
        """End of stream: the event still being read, if any, as one frame marked ``at_eof``.

        The SSE standard discards an event without its closing blank line, but servers that close the
        connection right after their last event (without the blank line, or without the line end) are
        common, and both official SDKs read that event. The frame is marked so a mapper can drop it
        when it is cut short. A last line cut inside a UTF-8 sequence is incomplete and dropped.
        Raises the stored ``ProtocolError`` if the stream had already failed.
        """
        if self._failure is not None:
            raise ProtocolError(ProtocolErrorCode.MALFORMED_STREAM, self._failure)
        self._closed = True
        tail = bytes(self._partial)
        self._partial.clear()
        frames: list[SseFrame] = []
        if tail:
            with contextlib.suppress(UnicodeDecodeError):
                self._dispatch_lines([tail.decode("utf-8")], frames)
        data, event = self._data, self._event
        self._data = []
        self._event = ""
        if data:
            frames.append(SseFrame(event=event or "message", data="\n".join(data), at_eof=True))
        return frames

    def _check_cap(self) -> None:
        if len(self._partial) > self._line_cap:
            self._partial.clear()
            self._fail(LINE_TOO_LONG_MESSAGE)

    def _fail(self, message: str) -> NoReturn:
        self._data = []
        self._failure = message
        raise ProtocolError(ProtocolErrorCode.MALFORMED_STREAM, message)

    def _process_lines(self, complete: bytes, frames: list[SseFrame]) -> None:
        """Dispatch every line of ``complete`` (whole lines, each with its terminator)."""
        try:
            text = complete.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or len(complete) > self._line_cap:
            # Slow path, only for input that is about to fail: find the first bad line and keep what precedes it.
            lines: list[str] = []
            for raw in complete.splitlines():
                if len(raw) > self._line_cap:  # the same line fails however the stream was split
                    self._dispatch_lines(lines, frames)
                    self._fail(LINE_TOO_LONG_MESSAGE)
                try:
                    lines.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    self._dispatch_lines(lines, frames)
                    self._fail(INVALID_UTF8_MESSAGE)
            self._dispatch_lines(lines, frames)
            return
        lines = _LINE_BREAK.split(text) if "\r" in text else text.split("\n")  # LF alone: no regex needed
        lines.pop()  # the empty remainder after the final terminator
        self._dispatch_lines(lines, frames)

    def _dispatch_lines(self, lines: list[str], frames: list[SseFrame]) -> None:
        if not lines:
            return
        if not self._saw_first_line:
            self._saw_first_line = True
            if lines[0].startswith(_BOM):
                lines[0] = lines[0][1:]
        data = self._data
        for line in lines:
            if not line:
                if data:
                    frames.append(SseFrame(event=self._event or "message", data="\n".join(data)))
                    data = self._data = []
                self._event = ""
                continue
            if line[0] == ":":
                continue
            colon = line.find(":")
            if colon < 0:
                field, value = line, ""
            else:
                field, value = line[:colon], line[colon + 1 :]
                if value[:1] == " ":
                    value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                self._event = value
            # "id" and "retry" steer browser reconnection, which no provider client here performs.
