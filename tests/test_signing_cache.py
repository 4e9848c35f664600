"""The verified-signature cache: a hit only for the very (key, message, signature) verified before, bounded, and safe
from several threads (journals are verified in worker threads)."""

from __future__ import annotations

import base64
import threading

import pytest

from trioloop.durable import signing
from trioloop.durable.signing import JournalSigner


def test_a_cached_verification_proves_only_that_triple() -> None:
    signer = JournalSigner.generate()
    keys = signer.keys
    signature = signer.sign(b"head 1")
    assert keys.verify(signer.key_id, b"head 1", signature)
    assert keys.verify(signer.key_id, b"head 1", signature)  # from the cache
    assert not keys.verify(signer.key_id, b"head 2", signature)  # another message: checked, refused
    other = JournalSigner.generate()
    assert not (keys | other.keys).verify(other.key_id, b"head 1", signature)  # another key: refused


def test_the_cache_stays_bounded_and_keeps_the_recently_used() -> None:
    signer = JournalSigner.generate()
    keys = signer.keys
    first = signer.sign(b"first")
    assert keys.verify(signer.key_id, b"first", first)
    for n in range(signing._VERIFIED_MAX + 10):
        message = b"m%d" % n
        assert keys.verify(signer.key_id, message, signer.sign(message))
        if n % 1000 == 0:
            assert keys.verify(signer.key_id, b"first", first)  # used again: kept
    assert len(signing._VERIFIED) <= signing._VERIFIED_MAX
    assert (signer.public_key, b"first", base64.b64decode(first)) in signing._VERIFIED


def test_threads_verifying_at_once_all_get_the_right_answer() -> None:
    signer = JournalSigner.generate()
    keys = signer.keys
    signed = [(b"t%d" % n, signer.sign(b"t%d" % n)) for n in range(200)]
    wrong: list[bytes] = []

    def run() -> None:
        for _ in range(5):
            for message, signature in signed:
                if not keys.verify(signer.key_id, message, signature) or keys.verify(
                    signer.key_id, message + b"x", signature
                ):
                    wrong.append(message)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_a_signature_spelled_another_way_is_refused() -> None:
    # 64 bytes of signature leave 4 unused bits in the last base64 character: setting them decodes to the same bytes,
    # and must not verify (a journal, record or document changed in one byte would pass).
    signer = JournalSigner.generate()
    signature = signer.sign(b"head")
    assert signature.endswith("==") and signer.keys.verify(signer.key_id, b"head", signature)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(signature[-3])
    for bits in range(1, 16):
        respelled = signature[:-3] + alphabet[last ^ bits] + "=="
        assert base64.b64decode(respelled) == base64.b64decode(signature)
        assert not signer.keys.verify(signer.key_id, b"head", respelled)


def test_what_this_process_signed_verifies_without_a_check_and_only_as_signed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seal signed here is known valid (reopening a session verifies its own seals from the cache); the same
    signature on another message, or under a key the verifier does not accept, is still checked and refused."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    signer = JournalSigner.generate()
    signature = signer.sign(b"head 7")
    checked: list[bytes] = []
    real = ed25519.Ed25519PublicKey.from_public_bytes

    def counting(raw: bytes) -> ed25519.Ed25519PublicKey:
        checked.append(raw)
        return real(raw)

    monkeypatch.setattr(ed25519.Ed25519PublicKey, "from_public_bytes", counting)
    assert signer.keys.verify(signer.key_id, b"head 7", signature)
    assert checked == []  # from the cache: this process made it
    assert not signer.keys.verify(signer.key_id, b"head 8", signature)
    assert checked == [signer.public_key]  # another message: checked, refused
    assert not JournalSigner.generate().keys.verify(signer.key_id, b"head 7", signature)  # a key not accepted
