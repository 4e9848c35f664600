"""SseDecoder: WHATWG framing over arbitrary splits, and failing closed on bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode
from trioloop.providers.sse import MAX_LINE_BYTES, SseDecoder, SseFrame


def decode(*chunks: bytes) -> list[SseFrame]:
    decoder = SseDecoder()
    frames = [frame for chunk in chunks for frame in decoder.feed(chunk)]
    frames += decoder.close()
    return frames


def test_named_and_default_events() -> None:
    assert decode(b"event: ping\ndata: {}\n\ndata: plain\n\n") == [
        SseFrame(event="ping", data="{}"),
        SseFrame(event="message", data="plain"),
    ]


def test_event_name_does_not_leak_into_the_next_event() -> None:
    assert decode(b"event: a\ndata: 1\n\ndata: 2\n\n")[1] == SseFrame(event="message", data="2")


def test_multi_line_data_joined_with_lf() -> None:
    assert decode(b"data: one\ndata: two\ndata:\ndata: four\n\n") == [SseFrame(data="one\ntwo\n\nfour")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    stream = b": keep-alive\nid: 7\nretry: 1000\nfoo: bar\ndata: x\n\n:\n\n"
    assert decode(stream) == [SseFrame(data="x")]


def test_one_leading_space_is_stripped_and_only_one() -> None:
    assert decode(b"data:no-space\n\ndata:  two\n\n") == [SseFrame(data="no-space"), SseFrame(data=" two")]


def test_field_without_colon_has_empty_value() -> None:
    assert decode(b"data\n\n") == [SseFrame(data="")]


def test_blank_line_without_data_dispatches_nothing_and_resets_name() -> None:
    assert decode(b"event: lonely\n\ndata: x\n\n") == [SseFrame(data="x")]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending(ending: bytes) -> None:
    stream = ending.join([b"event: e", b"data: a", b"data: b", b"", b"data: c", b"", b""])
    assert decode(stream) == [SseFrame(event="e", data="a\nb"), SseFrame(data="c")]


def test_cr_at_chunk_end_then_lf_is_one_line_end() -> None:
    # "\r" ends a line; the "\n" in the next chunk must not be taken for a blank line.
    assert decode(b"data: a\r", b"\ndata: b\r\n\r\n") == [SseFrame(data="a\nb")]


def test_lone_cr_then_lf_in_next_chunk_after_blank_line() -> None:
    assert decode(b"data: a\r\r", b"\n", b"data: b\n\n") == [SseFrame(data="a"), SseFrame(data="b")]


def test_unterminated_final_event_is_read_at_eof_and_marked() -> None:
    # TGI before 2.1.1 and llama.cpp forks close right after the last event, without the blank line.
    last = SseFrame(data="partial", at_eof=True)
    assert decode(b"data: whole\n\ndata: partial\n") == [SseFrame(data="whole"), last]
    assert decode(b"data: whole\n\ndata: partial") == [SseFrame(data="whole"), last]
    assert decode(b"event: e\r\ndata: a\r\ndata: b") == [SseFrame(event="e", data="a\nb", at_eof=True)]
    assert decode(b"data: whole\n\n: comment") == [SseFrame(data="whole")]


def test_multibyte_split_inside_a_character() -> None:
    raw = "data: Grüße 👋 你好\n\n".encode()
    index = raw.index("👋".encode()) + 2
    assert decode(raw[:index], raw[index:]) == [SseFrame(data="Grüße 👋 你好")]


def test_leading_bom_is_dropped_once() -> None:
    assert decode(b"\xef\xbb", b"\xbfdata: x\n\n") == [SseFrame(data="x")]
    assert decode("data: \ufeffkept\n\n".encode()) == [SseFrame(data="\ufeffkept")]


def test_split_at_every_offset_gives_the_same_frames() -> None:
    raw = "event: a\r\ndata: ü👋\r\n: c\r\n\r\ndata: x\rdata: y\r\r\nevent: z\ndata:\n\n".encode()
    expected = decode(raw)
    assert expected == [SseFrame(event="a", data="ü👋"), SseFrame(data="x\ny"), SseFrame(event="z", data="")]
    for i in range(len(raw) + 1):
        for j in range(i, len(raw) + 1):
            assert decode(raw[:i], raw[i:j], raw[j:]) == expected, (i, j)


def test_invalid_utf8_fails_closed_and_stays_failed() -> None:
    decoder = SseDecoder()
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(b"data: \xff\xfe\n\n")
    assert caught.value.code is ProtocolErrorCode.MALFORMED_STREAM
    with pytest.raises(ProtocolError):
        decoder.feed(b"data: fine\n\n")
    with pytest.raises(ProtocolError):
        decoder.close()


def test_truncated_multibyte_at_end_of_stream_is_discarded_not_decoded() -> None:
    assert decode(b"data: ok\n\ndata: \xf0\x9f") == [SseFrame(data="ok")]


def test_unterminated_line_over_the_cap_fails_closed() -> None:
    decoder = SseDecoder()
    decoder.feed(b"data: " + b"a" * (MAX_LINE_BYTES - 6))  # exactly at the cap: still fine
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(b"a")
    assert caught.value.code is ProtocolErrorCode.MALFORMED_STREAM
    with pytest.raises(ProtocolError):
        decoder.feed(b"\n\n")


def test_cap_applies_to_a_terminated_line_too_whatever_the_split() -> None:
    line = b"data: " + b"b" * 100 + b"\n\n"
    for split in (1, 50, len(line)):
        decoder = SseDecoder(line_cap=64)
        with pytest.raises(ProtocolError):
            decoder.feed(line[:split])
            decoder.feed(line[split:])


def test_a_long_line_in_small_chunks_hits_the_cap() -> None:
    decoder = SseDecoder()
    for _ in range(MAX_LINE_BYTES // 50):
        assert decoder.feed(b"x" * 50) == []
    with pytest.raises(ProtocolError):
        decoder.feed(b"x" * 50)


def test_feed_after_close_is_an_error() -> None:
    decoder = SseDecoder()
    decoder.close()
    with pytest.raises(ProtocolError):
        decoder.feed(b"data: x\n\n")


_names = st.text(st.characters(codec="utf-8", exclude_characters="\r\n:"), max_size=8)
_values = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=20)
_frames = st.lists(st.tuples(_names, st.lists(_values, min_size=1, max_size=3)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(frames=_frames, ending=st.sampled_from(["\n", "\r", "\r\n"]), data=st.data())
def test_any_frames_any_split_round_trip(frames: list[tuple[str, list[str]]], ending: str, data: st.DataObject) -> None:
    text = ""
    expected = []
    for name, lines in frames:
        if name:
            text += f"event: {name}{ending}"
        text += "".join(f"data: {line}{ending}" for line in lines)
        text += ending
        expected.append(SseFrame(event=name or "message", data="\n".join(lines)))
    raw = text.encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert decode(*chunks) == expected


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8))
def test_arbitrary_bytes_never_crash(chunks: list[bytes]) -> None:
    decoder = SseDecoder(line_cap=128)
    try:
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                assert isinstance(frame.data, str)
        decoder.close()
    except ProtocolError as exc:
        assert exc.code is ProtocolErrorCode.MALFORMED_STREAM
