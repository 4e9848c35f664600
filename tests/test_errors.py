from hypothesis import given
from hypothesis import strategies as st

from trioloop.protocol import ProtocolError, ProtocolErrorCode, StreamError, redact_provider_detail


def test_closed_code_set() -> None:
    assert {c.value for c in ProtocolErrorCode} == {
        "unsupported_capability",
        "no_api_key",
        "http_status",
        "rate_limited",
        "transport",
        "malformed_stream",
        "context_overflow",
        "cancelled",
    }


def test_masks_keys_case_insensitively() -> None:
    assert redact_provider_detail("bad key SK-abcDEF_123-x here") == "bad key [redacted-key] here"
    assert "sk-" not in redact_provider_detail("sk-proj-AAAA and sk-ant-api03-BBBB").lower()


def test_masks_before_cutting() -> None:
    text = "x" * 190 + "sk-" + "A" * 40
    out = redact_provider_detail(text)
    assert len(out) == 200
    assert "sk-" not in out and "AAAA" not in out


def test_caps_at_200() -> None:
    out = redact_provider_detail("y" * 1000)
    assert len(out) == 200 and out.endswith("…")


def test_protocol_error_redacts_detail_and_repr() -> None:
    err = ProtocolError("http_status", "The provider refused the key.", "invalid key sk-canary123")
    assert err.code is ProtocolErrorCode.HTTP_STATUS
    assert "canary" not in repr(err) and "canary" not in str(err) and "canary" not in (err.provider_detail or "")


def test_stream_error_redacts_detail_on_construction() -> None:
    ev = StreamError(code="rate_limited", message="slow down", provider_detail="key sk-live-9999")
    assert ev.provider_detail == "key [redacted-key]"


@given(st.text(max_size=500), st.text(alphabet="abcdefABCDEF0123456789_-", min_size=1, max_size=60))
def test_no_key_survives_redaction(prefix: str, key_body: str) -> None:
    out = redact_provider_detail(prefix + " sk-" + key_body)
    assert len(out) <= 200
    assert ("sk-" + key_body) not in out
