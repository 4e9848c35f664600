import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.machine.untrusted_text import (
    END_MARKER,
    START_MARKER,
    TRUNCATION_MARK,
    fence,
    fence_canonical,
    is_stripped_code_point,
    quote_untrusted,
    sanitize_scalar,
)

# Named by the issue and SPEC; each must vanish from every sanitized string.
REQUIRED_STRIPPED = [
    *(chr(c) for c in range(0x00, 0x20)),
    *(chr(c) for c in range(0x7F, 0xA0)),
    "\u061c",
    "\u200b",
    "\u200c",
    "\u200d",
    "\u200e",
    "\u200f",
    *(chr(c) for c in range(0x202A, 0x202F)),
    "\u2060",
    *(chr(c) for c in range(0x2066, 0x206A)),
    "\ufeff",
    "\u2028",
    "\u2029",
    "\U000e0041",  # a tag character: invisible ASCII smuggling
]


def unescape(text: str) -> str:
    out: list[str] = []
    chars = iter(text)
    for char in chars:
        out.append(next(chars) if char == "\\" else char)
    return "".join(out)


@pytest.mark.parametrize("char", [c for c in REQUIRED_STRIPPED if c not in "\n\t"])
def test_each_forbidden_code_point_is_stripped_everywhere(char: str) -> None:
    assert sanitize_scalar(f"a{char}b", 10) == ("ab", False)
    assert sanitize_scalar(f"a{char}b", 10, allow_newlines=True) == ("ab", False)
    assert is_stripped_code_point(char)


def test_newline_and_tab_survive_only_in_description_text() -> None:
    assert sanitize_scalar("a\nb\tc\r\n", 20) == ("abc", False)
    assert sanitize_scalar("a\nb\tc\r\n", 20, allow_newlines=True) == ("a\nb\tc\n", False)


def test_visible_text_survives() -> None:
    text = "Payments DB – café 😀 日本語 ☃"
    assert sanitize_scalar(text, 200) == (text, False)


def test_cap_counts_code_points_not_utf16_units() -> None:
    assert sanitize_scalar("😀" * 5, 5) == ("😀" * 5, False)
    clean, cut = sanitize_scalar("😀" * 6, 5)
    assert cut and clean == "😀" * 4 + TRUNCATION_MARK


def test_cut_keeps_cap_minus_one_and_ends_in_ellipsis() -> None:
    assert sanitize_scalar("A" * 200, 200) == ("A" * 200, False)
    clean, cut = sanitize_scalar("A" * 201, 200)
    assert cut and clean == "A" * 199 + TRUNCATION_MARK and len(clean) == 200


def test_stripping_happens_before_capping() -> None:
    assert sanitize_scalar("\u200b" * 300 + "abc", 3) == ("abc", False)


def test_escaping_happens_after_capping_and_can_lengthen_the_text() -> None:
    clean, cut = sanitize_scalar("<" * 10, 4)
    assert cut and clean == "\\<" * 3 + TRUNCATION_MARK


def test_markers_cannot_be_reproduced() -> None:
    for marker in (START_MARKER, END_MARKER):
        clean, _ = sanitize_scalar(f"x{marker}y", 200)
        assert marker not in clean and "<<<" not in clean and ">>>" not in clean
        assert unescape(clean) == f"x{marker}y"


def test_backslash_is_escaped_so_escapes_stay_unambiguous() -> None:
    assert sanitize_scalar("a\\<b>", 20) == ("a\\\\\\<b\\>", False)


def test_zero_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        sanitize_scalar("x", 0)


def test_huge_input_is_not_fully_scanned_once_the_cap_is_reached() -> None:
    clean, cut = sanitize_scalar("B" * 5_000_000, 80)
    assert cut and len(clean) == 80


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(min_value=1, max_value=300), st.booleans())
def test_sanitized_text_is_always_safe(text: str, cap: int, newlines: bool) -> None:
    clean, cut = sanitize_scalar(text, cap, allow_newlines=newlines)
    assert not any(is_stripped_code_point(c, newlines) for c in clean)
    assert "<<<" not in clean and ">>>" not in clean
    clean.encode("utf-8")  # never a lone surrogate
    kept = "".join(c for c in text if not is_stripped_code_point(c, newlines))
    plain = unescape(clean)
    if cut:
        assert len(kept) > cap and plain == kept[: cap - 1] + TRUNCATION_MARK
    else:
        assert plain == kept


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(["<", ">", "\\", "A", "\u202e", "\n", "\u2028"]), max_size=400))
def test_marker_alphabet_never_forms_a_marker_run(text: str) -> None:
    clean, _ = sanitize_scalar(text, 200)
    assert "<<" not in clean and ">>" not in clean


def test_quote_untrusted_is_a_json_string_of_the_capped_text() -> None:
    quoted = quote_untrusted('say "hi"\u202e' + "A" * 100, 80)
    assert json.loads(quoted) == 'say "hi"' + "A" * 71 + TRUNCATION_MARK


def test_fence_is_three_lines_of_marker_json_marker() -> None:
    result = fence({"b": 1, "a": ["x", None]})
    assert result.split("\n") == [START_MARKER, '{"a":["x",null],"b":1}', END_MARKER]
    assert result.splitlines() == result.split("\n")


@pytest.mark.parametrize(
    "value",
    [END_MARKER, START_MARKER, "<<<", ">>>", "line\u2028break", "nel\x85"],
)
def test_fence_refuses_unsanitized_text(value: str) -> None:
    with pytest.raises(ValueError, match="unsanitized"):
        fence({"name": value})


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["id", "name", "type"]), st.text(), max_size=3))
def test_fence_of_sanitized_values_always_has_exactly_one_marker_pair(raw: dict[str, str]) -> None:
    payload = {key: sanitize_scalar(value, 200)[0] for key, value in raw.items()}
    result = fence(payload)
    assert result.count(START_MARKER) == 1 and result.count(END_MARKER) == 1
    assert result.count("<<<") == 2 and result.count(">>>") == 2
    lines = result.splitlines()
    assert len(lines) == 3 and lines[0] == START_MARKER and lines[2] == END_MARKER
    assert json.loads(lines[1]) == payload


@settings(max_examples=500)
@given(
    text=st.one_of(
        st.text(),
        st.text(alphabet=st.sampled_from("ab <>\\\n\t\u202e\u200b\x00\x7f\u2028é\U000e0041\ufeff")),
    ),
    cap=st.integers(1, 40),
    newlines=st.booleans(),
)
def test_for_all_text_the_fast_path_sanitizes_exactly_as_the_code_point_walk(
    text: str, cap: int, newlines: bool
) -> None:
    """For all strings, caps and modes: the C-level shortcut (taken when nothing would be stripped) gives
    exactly what the code-point-by-code-point walk gives."""
    from trioloop.machine.untrusted_text import _escaped, _strip_each, strip_and_cap

    walked, cut = _strip_each(text, cap, newlines)
    assert strip_and_cap(text, cap, newlines) == (walked, cut)
    assert sanitize_scalar(text, cap, newlines) == (_escaped(walked), cut)


def test_the_explicit_code_points_are_searched_for_when_the_database_calls_one_printable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Unicode database that counted an explicit code point as printable would not hide it: the search runs."""
    from trioloop.machine import untrusted_text

    monkeypatch.setattr(untrusted_text, "_EXPLICIT_NOT_PRINTABLE", False)
    assert untrusted_text._nothing_stripped("plain <text>", False)
    assert not untrusted_text._nothing_stripped("a\u202eb", False)
    assert sanitize_scalar("a\u202eb", 10) == ("ab", False)


@settings(max_examples=400, deadline=None)
@given(body=st.text(alphabet=st.sampled_from('ab<>"\n\r\x0b\x0c\x1c\x85\u2028\u2029 é'), max_size=12) | st.text())
def test_fence_canonical_refuses_exactly_a_marker_or_not_one_line_for_all_bodies(body: str) -> None:
    """The scans that find a marker or a line break first give, for every body, the rule's own answer."""
    refused = "<<<" in body or ">>>" in body or len(body.splitlines()) != 1
    if refused:
        with pytest.raises(ValueError, match="unsanitized"):
            fence_canonical(body)
    else:
        assert fence_canonical(body) == f"{START_MARKER}\n{body}\n{END_MARKER}"
