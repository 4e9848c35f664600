"""Typed provider errors and the redaction every provider text passes through."""

from __future__ import annotations

import enum
import re

__all__ = ["REDACTION_CAP", "ProtocolError", "ProtocolErrorCode", "redact_provider_detail"]

REDACTION_CAP = 200
_KEY_PATTERN = re.compile(r"sk-[A-Za-z0-9_-]+", re.IGNORECASE | re.ASCII)  # no \b: "xsk-…" must not leak


class ProtocolErrorCode(enum.StrEnum):
    """The closed set of failure classes a provider can report."""

    UNSUPPORTED_CAPABILITY = "unsupported_capability"
    NO_API_KEY = "no_api_key"
    HTTP_STATUS = "http_status"
    RATE_LIMITED = "rate_limited"
    TRANSPORT = "transport"
    MALFORMED_STREAM = "malformed_stream"
    CONTEXT_OVERFLOW = "context_overflow"
    CANCELLED = "cancelled"


def redact_provider_detail(text: str) -> str:
    """Mask every ``sk-…`` key-like token (any case), then cap at 200 characters.

    Masking comes first so a key cut by the cap can never leak its prefix.
    """
    masked = _KEY_PATTERN.sub("[redacted-key]", text)
    if len(masked) > REDACTION_CAP:
        return masked[: REDACTION_CAP - 1] + "…"
    return masked


class ProtocolError(Exception):
    """A provider failure: ``message`` is an authored, user-safe sentence; ``provider_detail`` is redacted."""

    code: ProtocolErrorCode
    message: str
    provider_detail: str | None

    def __init__(self, code: ProtocolErrorCode | str, message: str, provider_detail: str | None = None) -> None:
        self.code = ProtocolErrorCode(code)
        self.message = message
        self.provider_detail = None if provider_detail is None else redact_provider_detail(provider_detail)
        super().__init__(f"{self.code.value}: {message}")

    def __repr__(self) -> str:
        return (
            f"ProtocolError(code={self.code.value!r}, message={self.message!r}, "
            f"provider_detail={self.provider_detail!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProtocolError):
            return NotImplemented
        return (self.code, self.message, self.provider_detail) == (
            other.code,
            other.message,
            other.provider_detail,
        )

    def __hash__(self) -> int:
        return hash((self.code, self.message, self.provider_detail))
