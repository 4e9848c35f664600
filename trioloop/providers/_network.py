"""Name the cause of a failed connection in words a user can act on (DNS, refused, TLS, timeout, reset)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

import httpx

__all__ = ["describe_network_failure"]

_MAX_CAUSES = 32


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the members of any exception group among them (bounded)."""
    pending, seen = [exc], 0
    while pending and seen < _MAX_CAUSES:
        current = pending.pop(0)
        seen += 1
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        link = current.__cause__ or current.__context__
        if link is not None:
            pending.append(link)


def describe_network_failure(exc: BaseException) -> str:
    """A short cause, e.g. ``DNS lookup failed`` or ``connection refused``, then the exception's type."""
    causes = list(_causes(exc))
    kind = type(exc).__name__

    def has(*types: type[BaseException]) -> bool:
        return any(isinstance(c, types) for c in causes)

    if has(socket.gaierror):
        cause = "DNS lookup failed (unknown host or no network)"
    elif has(ssl.SSLCertVerificationError):
        cause = "TLS certificate verification failed"
    elif has(ssl.SSLError):
        cause = "TLS handshake failed (is the server speaking https?)"
    elif has(ConnectionRefusedError):
        cause = "connection refused (is the server running on that port?)"
    elif has(httpx.ConnectTimeout):
        cause = "timed out while connecting"
    elif has(httpx.TimeoutException, TimeoutError):
        cause = "timed out"
    elif has(httpx.ProxyError):
        cause = "the proxy failed"
    elif has(httpx.RemoteProtocolError):
        cause = "the server closed the connection before the response was complete"
    elif has(ConnectionResetError, BrokenPipeError):
        cause = "the connection was reset"
    else:
        return kind
    return f"{cause} ({kind})"
