"""Fresh tool-call ids for the calls a server names with an id that is already taken.

Some servers number their calls ``call_1``, ``call_2``... anew in every response, or send no id at all;
a session's history must still hold each id once, or its pairing breaks and a grant could seem to
name another call. The reducer gives such a call a fresh id of the same shape, so the server accepts it
back: nine letters and digits stay nine letters and digits (Mistral checks that), ``NAME:INDEX`` keeps its
name and a number (ASCII digits) after its last colon (Kimi's ``functions.get_weather:0``), and anything else
gets a short suffix in the characters every API accepts, within OpenAI's 40 characters when the original fits
in them.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

__all__ = ["fresh_call_id"]

_ALNUM: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NINE_ALNUM: Final = re.compile(r"[A-Za-z0-9]{9}")
_INDEXED: Final = re.compile(r"(.*):([0-9]+)", re.DOTALL)
_OPENAI_MAX: Final = 40
_TAG: Final = 8


def _base62(digest: bytes, length: int) -> str:
    number = int.from_bytes(digest, "big")
    out = []
    for _ in range(length):
        number, digit = divmod(number, 62)
        out.append(_ALNUM[digit])
    return "".join(out)


def fresh_call_id(server_id: str, salt: str) -> str:
    """An id shaped like ``server_id``, derived from it and ``salt`` (pure: the same inputs, the same id).

    The caller checks that the result is free and tries another ``salt`` if it is not.
    """
    digest = hashlib.sha256(f"{salt}\0{server_id}".encode("utf-8", "surrogatepass")).digest()
    if _NINE_ALNUM.fullmatch(server_id):
        return _base62(digest, 9)
    indexed = _INDEXED.fullmatch(server_id)
    if indexed is not None:
        return f"{indexed.group(1)}:{int.from_bytes(digest[:8], 'big') % 10**9}"
    tag = _base62(digest, _TAG)
    if not server_id:
        return f"call_{tag}"
    head = server_id
    if len(server_id) <= _OPENAI_MAX:
        head = server_id[: _OPENAI_MAX - _TAG - 1]
    return f"{head}_{tag}"
