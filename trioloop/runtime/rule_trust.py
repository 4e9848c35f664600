"""Which project rule files the person trusts: the SHA-256 of each file's exact bytes, kept under its real path.

A project's ``.trioloop/rules.toml`` travels with a repository someone else wrote, so its allow rules take effect
only once the person trusts that file's content (as direnv's ``allow`` does). Trusting records the digest of the
bytes in ``trusted-rules.json`` in the user's config folder (``$XDG_CONFIG_HOME/trioloop``), written atomically
with mode 0600; any edit of the file (one byte) makes it untrusted again until it is trusted anew.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any, Final, final

from trioloop.durable.files import config_folder, write_atomic
from trioloop.machine.conditions import RuleError

__all__ = [
    "TRUST_FILE_NAME",
    "RuleFileError",
    "RuleTrust",
    "file_digest",
    "record_trust",
    "remove_trust",
    "trust_of",
    "trusted_rules_path",
]

TRUST_FILE_NAME: Final = "trusted-rules.json"
_FORMAT: Final = "trioloop-trusted-rules"
_MAX_TRUST_BYTES: Final = 4 * 1024 * 1024


class RuleFileError(RuleError):
    """A rule file that cannot be used: its ``path``, the ``line`` at fault (None when no one line is) and the
    ``reason``; the message reads ``path:line: reason``."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, reason: str) -> None:
        self.path = os.fspath(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.path}:{line}: {reason}" if line is not None else f"{self.path}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.line, self.reason))


@final
class RuleTrust(enum.StrEnum):
    """A project rule file's standing: ``trusted`` (its content is the one the person trusted), ``untrusted``
    (never trusted) or ``changed`` (trusted once, edited since)."""

    TRUSTED = "trusted"
    UNTRUSTED = "untrusted"
    CHANGED = "changed"


def trusted_rules_path() -> Path:
    """Where the digests of trusted rule files are kept: ``$XDG_CONFIG_HOME/trioloop/trusted-rules.json``."""
    return config_folder() / TRUST_FILE_NAME


def file_digest(content: bytes) -> str:
    """The digest trust records for a file's bytes: ``sha256:`` and 64 hex digits."""
    return "sha256:" + hashlib.sha256(content).hexdigest()


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(path)


def _read_store() -> dict[str, str]:
    """The trusted files, real path -> digest; {} without a store. `RuleFileError` for a store that cannot be read
    or is not one this module wrote."""
    where = trusted_rules_path()
    try:
        with open(where, "rb") as file:
            data = file.read(_MAX_TRUST_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise RuleFileError(where, None, f"cannot read the trusted rule files: {exc.strerror or exc}") from None
    if not data.strip():
        return {}  # made, never filled (see `_write_store`)
    if len(data) > _MAX_TRUST_BYTES:
        raise RuleFileError(where, None, f"the trusted rule files exceed {_MAX_TRUST_BYTES} bytes")
    try:
        store = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RuleFileError(where, None, f"not valid JSON: {exc}") from None
    files = store.get("files") if type(store) is dict and store.get("format") == _FORMAT else None
    if type(files) is not dict or not all(type(k) is str and type(v) is str for k, v in files.items()):
        raise RuleFileError(where, None, "not a file of trusted rule files (remove it to start over)")
    return files


def _write_store(files: dict[str, str]) -> None:
    where = trusted_rules_path()
    where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Made first with mode 0600, so the atomic write keeps that mode (it keeps the mode of the file it replaces).
    os.close(os.open(where, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600))
    data = {"format": _FORMAT, "files": dict(sorted(files.items()))}
    write_atomic(where, (json.dumps(data, indent=2, ensure_ascii=True) + "\n").encode("ascii"))
    with contextlib.suppress(OSError):  # a store made by hand with a looser mode
        os.chmod(where, 0o600)


def record_trust(path: str | os.PathLike[str], content: bytes) -> str:
    """Trust the file at ``path`` with exactly ``content`` (the bytes the caller read and showed); returns the
    digest recorded. `RuleFileError` when the store cannot be read or written."""
    files = _read_store()
    digest = file_digest(content)
    files[_key(path)] = digest
    try:
        _write_store(files)
    except OSError as exc:
        raise RuleFileError(trusted_rules_path(), None, f"cannot record the trust: {exc.strerror or exc}") from None
    return digest


def remove_trust(path: str | os.PathLike[str]) -> bool:
    """Stop trusting the file at ``path`` (whatever its content); whether it was trusted."""
    files = _read_store()
    if files.pop(_key(path), None) is None:
        return False
    try:
        _write_store(files)
    except OSError as exc:
        raise RuleFileError(trusted_rules_path(), None, f"cannot remove the trust: {exc.strerror or exc}") from None
    return True


def trust_of(path: str | os.PathLike[str], content: bytes) -> RuleTrust:
    """Whether the file at ``path`` holding ``content`` is trusted, never was, or changed since it was.
    `RuleFileError` when the store cannot be read."""
    recorded = _read_store().get(_key(path))
    if recorded is None:
        return RuleTrust.UNTRUSTED
    same = hmac.compare_digest(recorded.encode("ascii", "replace"), file_digest(content).encode("ascii"))
    return RuleTrust.TRUSTED if same else RuleTrust.CHANGED
