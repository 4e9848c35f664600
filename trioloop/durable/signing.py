"""Signed journal heads: the key that signs what a session appends, and the public keys that verify it.

Every append batch ends with a ``seal`` entry: an Ed25519 signature over the new chain head, binding the session
id, the number of the last entry before the seal and that entry's hash (which covers everything before it). The
private key is the app's, never the store's, so whoever holds the store can read the journal and verify it with
the public key alone, but cannot forge, edit, reorder, insert or transplant an entry without the seal failing.

Keys have ids (``ed25519:`` and the first 16 hex digits of the SHA-256 of the raw public key), so a journal
signed before a key rotation still verifies with the old public key among the `JournalKeys`. Where a key comes
from, unless the app passes one: `TRIOLOOP_JOURNAL_KEY` (a path to a key file), else a per-user key created on
first use at ``$XDG_CONFIG_HOME/trioloop/journal-key`` (``~/.config`` by default), readable by its owner alone.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

from trioloop.durable.files import config_folder

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "KEY_ENV",
    "SEAL_VERSION",
    "JournalKeyError",
    "JournalKeys",
    "JournalSigner",
    "default_key_path",
    "given_public_keys",
    "head_message",
    "key_id_of",
    "public_key_from_text",
    "read_public_keys",
]

#: The environment variable naming the signing key's file (else the per-user default).
KEY_ENV: Final = "TRIOLOOP_JOURNAL_KEY"
_KEY_FILE_PREFIX: Final = b"trioloop-journal-key-v1 "
_HEAD_DOMAIN: Final = b"trioloop journal head v1\x00"
_HEAD_DOMAIN_V2: Final = b"trioloop journal head v2\x00"
#: The version of the seals written now: 2 signs the seal's own time too (a seal without ``v`` is version 1).
SEAL_VERSION: Final = 2
_SIGNATURE_BYTES: Final = 64
#: Signatures already verified, by public key, message and signature (a pure function of the three): a journal's
#: last seal is checked once by position before it is read and once with the chain. Bounded; cleared when full.
#: Signatures verified already, by (public key, message, signature), the most recently used last: a journal read
#: again (opening checks its last seal twice; the inbox reads a journal again each time it grows) verifies only the
#: seals it has not seen. Verification is deterministic, so a hit is as good as the check; ~300 bytes an entry.
_VERIFIED: Final[collections.OrderedDict[tuple[bytes, bytes, bytes], None]] = collections.OrderedDict()
_VERIFIED_MAX: Final = 4096
_VERIFIED_LOCK: Final = threading.Lock()  # journals are verified in worker threads too
_WITNESS_MAC_DOMAIN: Final = b"trioloop witness mac v1\x00"
#: The key file read last (`JournalSigner.default`, `existing`), with what its file's status said then: read again
#: only when the file changed (another inode, size, times or mode), so a session's open does not parse it each time.
_LOADED: dict[tuple[str, int, int, int, int, int, int], JournalSigner] = {}
_LOADED_LOCK: Final = threading.Lock()


def _remember_verified(seen: tuple[bytes, bytes, bytes]) -> None:
    """Keep (public key, message, signature) as verified, the oldest dropped past `_VERIFIED_MAX`."""
    with _VERIFIED_LOCK:
        _VERIFIED[seen] = None
        _VERIFIED.move_to_end(seen)
        if len(_VERIFIED) > _VERIFIED_MAX:
            _VERIFIED.popitem(last=False)


class JournalKeyError(ValueError):
    """A signing key that cannot be read or made (the message says which file and why)."""


def head_message(session_id: str, seq: int, head: str, at_ms: int | None = None) -> bytes:
    """What a seal signs: the session, the number of the entry it seals and that entry's hash, and (a seal of
    version 2, ``at_ms`` given) the seal's own time, unambiguously: every byte of a seal but its signature."""
    if at_ms is None:  # a seal of version 1: its own time was outside the signature
        return b"%s%s\x00%d\x00%s" % (_HEAD_DOMAIN, session_id.encode("utf-8"), seq, head.encode("ascii"))
    return b"%s%s\x00%d\x00%s\x00%d" % (_HEAD_DOMAIN_V2, session_id.encode("utf-8"), seq, head.encode("ascii"), at_ms)


def key_id_of(public_key: bytes) -> str:
    """A public key's id: ``ed25519:`` and the first 16 hex digits of the SHA-256 of its 32 raw bytes."""
    return "ed25519:" + hashlib.sha256(public_key).hexdigest()[:16]


def _raw_public(key: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@final
class JournalSigner:
    """A private Ed25519 key that signs journal heads (see the module docstring). Its repr shows the id only."""

    __slots__ = ("_key", "_mac_key", "key_id", "public_key")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self._mac_key: bytes | None = None  # derived on first use (`witness_mac`)
        #: The 32 raw bytes of the public key: what a verifier needs (`JournalKeys`).
        self.public_key: bytes = _raw_public(private_key.public_key())
        self.key_id: str = key_id_of(self.public_key)

    @classmethod
    def generate(cls) -> JournalSigner:
        """A new random key (kept in memory only: `save` writes it)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> JournalSigner:
        """The key whose 32-byte private seed is ``raw``."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        if len(raw) != 32:
            raise JournalKeyError("an Ed25519 private key is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> JournalSigner:
        """The key in the file ``save`` wrote; `JournalKeyError` for a file that is not one, or that others
        may read (a key readable by the group or the world is refused, as ssh refuses one)."""
        path = Path(path)
        try:
            mode = path.stat().st_mode
            text = path.read_bytes()
        except OSError as exc:
            raise JournalKeyError(f"the journal key {path} could not be read ({exc.strerror})") from None
        if mode & 0o077:
            raise JournalKeyError(f"the journal key {path} is readable by others: chmod 600 it")
        if not text.startswith(_KEY_FILE_PREFIX):
            raise JournalKeyError(f"{path} is not a trioloop journal key")
        try:
            raw = base64.b64decode(text[len(_KEY_FILE_PREFIX) :].strip(), validate=True)
        except (binascii.Error, ValueError):
            raise JournalKeyError(f"{path} is not a trioloop journal key") from None
        return cls.from_private_bytes(raw)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the private key to a new file at ``path``, readable by its owner alone (never over a file)."""
        from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

        raw = self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Written whole under a name of its own, then linked into place: another process that finds the key file
        # (making its own key at the same moment, say) never reads it half written, and a link never replaces one.
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(_KEY_FILE_PREFIX + base64.b64encode(raw) + b"\n")
                file.flush()
                os.fsync(file.fileno())
            os.link(temporary, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    @classmethod
    def default(cls, environ: Mapping[str, str] | None = None) -> JournalSigner:
        """The key named by `KEY_ENV`, else the per-user key at `default_key_path` (made on first use)."""
        environ = os.environ if environ is None else environ
        named = environ.get(KEY_ENV)
        if named:
            return cls._load_once(named)
        path = default_key_path(environ)
        if not path.exists():
            with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
                cls.generate().save(path)
        return cls._load_once(path)

    @classmethod
    def existing(cls, environ: Mapping[str, str] | None = None) -> JournalSigner | None:
        """`default`'s key when there is one, never made here (what an auditor or a read-only look checks with):
        the key `KEY_ENV` names (`JournalKeyError` when it names no key file: a missing file, a folder), else the
        per-user key if its file exists, else None."""
        environ = os.environ if environ is None else environ
        named = environ.get(KEY_ENV)
        if named:
            return cls._load_once(named)
        path = default_key_path(environ)
        return cls._load_once(path) if path.exists() else None

    @classmethod
    def _load_once(cls, path: str | os.PathLike[str]) -> JournalSigner:
        """`load`, unless the same file, unchanged since (by its status), was read last: then that key."""
        try:
            status = os.stat(path)
        except OSError:
            return cls.load(path)  # says what is wrong with it
        stamp = (
            os.fspath(path), status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns,
            status.st_mode,
        )  # fmt: skip
        with _LOADED_LOCK:
            known = _LOADED.get(stamp)
        if known is not None:
            return known
        signer = cls.load(path)
        with _LOADED_LOCK:
            _LOADED.clear()  # the one key file in use: nothing else is kept
            _LOADED[stamp] = signer
        return signer

    def sign(self, message: bytes) -> str:
        """The signature of ``message``, base64. It is known valid from now on (an Ed25519 signature made with a
        key always verifies with its public key), so this process never verifies it again (a journal reopened)."""
        signature = self._key.sign(message)
        _remember_verified((self.public_key, message, signature))
        return base64.b64encode(signature).decode("ascii")

    def witness_mac(self, message: bytes) -> str:
        """A MAC of ``message`` (HMAC-SHA256, hex) with a key derived from this private key: what a `FileWitness`
        puts on each head it keeps, so an edited head is told from a written one. Only this key's holder can make
        or check it, which suits a witness kept beside the journal's writer (about a microsecond, where a
        signature costs tens)."""
        key = self._mac_key
        if key is None:
            from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

            raw = self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
            key = self._mac_key = hashlib.sha256(_WITNESS_MAC_DOMAIN + raw).digest()
        return hmac.new(key, message, hashlib.sha256).hexdigest()

    @property
    def public_key_text(self) -> str:
        """The public key as ``trioloop key`` prints it and ``trioloop audit --public-key`` reads it: base64."""
        return base64.b64encode(self.public_key).decode("ascii")

    @property
    def keys(self) -> JournalKeys:
        """The public half, as the keys that verify what this key signs."""
        return JournalKeys([self.public_key])

    def __repr__(self) -> str:
        return f"JournalSigner(key_id={self.key_id!r})"


def public_key_from_text(text: str) -> bytes:
    """A public key as ``trioloop key`` prints it (``ed25519:ID BASE64``, or the base64 alone): its 32 raw bytes.
    `JournalKeyError` for anything else."""
    words = text.split()
    try:
        raw = base64.b64decode(words[-1], validate=True)
    except (binascii.Error, ValueError, IndexError):
        raw = b""
    if len(raw) != 32:
        raise JournalKeyError(f"not a public key (base64 of 32 bytes, as `trioloop key` prints it): {text!r}")
    if len(words) == 2 and words[0] != key_id_of(raw):
        raise JournalKeyError(f"the key id {words[0]} is not the id of the key after it: {text!r}")
    return raw


#: The largest keys file read (a key is a line of about 70 bytes).
MAX_KEYS_FILE_BYTES: Final = 256 * 1024


def read_public_keys(path: str | os.PathLike[str]) -> list[bytes]:
    """The public keys in a keys file: one per line as ``trioloop key`` prints it, ``#`` comments and blank lines
    aside (old keys kept after a rotation, say). `JournalKeyError` naming the file and line of anything else."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size > MAX_KEYS_FILE_BYTES:
                raise JournalKeyError(f"the keys file {path} is over {MAX_KEYS_FILE_BYTES} bytes (not read)")
            text = file.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise JournalKeyError(f"the keys file {path} could not be read ({why})") from None
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                keys.append(public_key_from_text(line))
            except JournalKeyError as exc:
                raise JournalKeyError(f"{path}, line {number}: {exc}") from None
    return keys


def given_public_keys(texts: Iterable[str], files: Iterable[str | os.PathLike[str]] = ()) -> JournalKeys | None:
    """The public keys a person gave (``--public-key KEY``, ``--public-keys FILE``), or None when none was given."""
    given = [public_key_from_text(text) for text in texts]
    for path in files:
        given += read_public_keys(path)
    return JournalKeys(given) if given else None


def default_key_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/trioloop/journal-key`` (``~/.config/trioloop/journal-key`` when it is not set)."""
    return config_folder(environ) / "journal-key"


@final
class JournalKeys:
    """Public keys by id: what verifies a journal's seals (and cannot make one)."""

    __slots__ = ("_keys",)

    def __init__(self, public_keys: Iterable[bytes | JournalSigner]) -> None:
        keys: dict[str, Any] = {}
        for key in public_keys:
            raw = key.public_key if isinstance(key, JournalSigner) else bytes(key)
            if len(raw) != 32:
                raise JournalKeyError("an Ed25519 public key is 32 bytes")
            keys[key_id_of(raw)] = raw
        self._keys = keys

    @property
    def ids(self) -> frozenset[str]:
        """The ids of the keys held."""
        return frozenset(self._keys)

    @property
    def public_keys(self) -> tuple[bytes, ...]:
        """The 32 raw bytes of each public key held (``JournalKeys(keys.public_keys)`` holds the same keys)."""
        return tuple(self._keys.values())

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __or__(self, other: JournalKeys) -> JournalKeys:
        return JournalKeys([*self._keys.values(), *other.public_keys])

    def verify(self, key_id: str, message: bytes, signature: str) -> bool:
        """Whether ``signature`` (base64) is the key ``key_id``'s over ``message``; False for an unknown key, and for
        a signature not written the one way base64 writes its bytes (the unused bits of its last character set): no
        byte of a signed entry, record or document can change while it still passes."""
        raw = self._keys.get(key_id)
        if raw is None:
            return False
        try:
            decoded = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            return False
        if len(decoded) != _SIGNATURE_BYTES or base64.b64encode(decoded).decode("ascii") != signature:
            return False
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        seen = (raw, message, decoded)
        with _VERIFIED_LOCK:
            if seen in _VERIFIED:
                _VERIFIED.move_to_end(seen)
                return True
        try:
            Ed25519PublicKey.from_public_bytes(raw).verify(decoded, message)
        except InvalidSignature:
            return False
        _remember_verified(seen)
        return True

    def __repr__(self) -> str:
        return f"JournalKeys({sorted(self._keys)!r})"
