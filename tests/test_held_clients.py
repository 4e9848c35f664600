"""The clients a held provider streams through: a stream's next request finds an idle connection if one exists.

Each test streams through one held `AnthropicProvider` to a real loopback server that counts the TCP connections it
accepts; more streams than `HELD_STREAMS_PER_CLIENT` at once, so the provider holds several clients.
"""

from __future__ import annotations

import math
import ssl
from pathlib import Path

import certifi
import httpx
import pytest
import trio

from trioloop.protocol import ChatRequest, Message, MessageStop, StreamEvent, is_terminal
from trioloop.providers import AnthropicProvider, _http_clients
from trioloop.providers._http_clients import HELD_STREAMS_PER_CLIENT, _HeldClients
from trioloop.providers._loopback import LoopbackRequest, LoopbackResponse, open_loopback_server

BODY = (Path(__file__).parent / "fixtures" / "providers" / "anthropic" / "text_answer.sse").read_bytes()
REQUEST = ChatRequest(model="fixture-model-1", messages=(Message.user("hi"),), caller_retries=True)
#: Streams at once: more than a client of httpx's carried before (32), so the provider holds several clients.
STREAMS = 40


class _Waves:
    """A handler holding every answer of a wave until ``size`` requests are in, so the wave's streams are open
    together and each needs a connection of its own."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.asked = 0
        self.wave = trio.Event()

    async def __call__(self, request: LoopbackRequest) -> LoopbackResponse:
        self.asked += 1
        wave = self.wave
        if self.asked % self.size == 0:
            wave.set()
            self.wave = trio.Event()
        await wave.wait()
        return LoopbackResponse(body=BODY)


async def _stream_once(provider: AnthropicProvider) -> None:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    await provider.stream(REQUEST, send)
    send.close()
    events = [event async for event in receive]
    assert isinstance(events[-1], MessageStop), events


async def test_a_second_wave_of_streams_reuses_the_first_waves_connections() -> None:
    """All streams of a wave at once, then another wave as large: not one new connection for the second (a
    provider of clients carrying 32 streams each sent half the second wave to the client that had 8 connections
    idle: 52 connections)."""
    handler = _Waves(STREAMS)
    async with open_loopback_server(handler, keep_alive=True) as server:
        provider = AnthropicProvider("k", base_url=server.url, retry=None)
        with trio.fail_after(20):
            async with provider:
                for _ in range(2):
                    async with trio.open_nursery() as nursery:
                        for _ in range(STREAMS):
                            nursery.start_soon(_stream_once, provider)
                    assert server.connections == STREAMS
                held = provider._http.held
                assert held is not None and held.busy == [0] * len(held.clients)
                assert len(held.clients) == -(-STREAMS // HELD_STREAMS_PER_CLIENT)
        assert (len(server.requests), server.connections) == (2 * STREAMS, STREAMS)


class _NextAtTheEnd(trio.abc.SendChannel[StreamEvent]):
    """A consumer that sends its next request the moment its answer's terminal event reaches it, before the
    provider's own task has finished with the answer (as a session's next turn may)."""

    def __init__(self, provider: AnthropicProvider) -> None:
        self.provider = provider
        self.follow_up = True

    async def send(self, value: StreamEvent) -> None:
        if is_terminal(value) and self.follow_up:
            assert isinstance(value, MessageStop), value
            self.follow_up = False
            await _stream_once(self.provider)
        else:
            await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_request_sent_as_the_last_answer_ends_takes_that_answers_connection() -> None:
    """Every stream's consumer asks again as soon as its terminal event arrives: the answer's connection is back
    in its client's pool by then, and the client counted free, so every second request reuses a connection
    (counted free only after the provider's task ended, 32 of 40 second requests connected anew)."""
    handler = _Waves(STREAMS)
    async with open_loopback_server(handler, keep_alive=True) as server:
        provider = AnthropicProvider("k", base_url=server.url, retry=None)

        async def one() -> None:
            await provider.stream(REQUEST, _NextAtTheEnd(provider))

        with trio.fail_after(20):
            async with provider, trio.open_nursery() as nursery:
                for _ in range(STREAMS):
                    nursery.start_soon(one)
        assert (len(server.requests), server.connections) == (2 * STREAMS, STREAMS)


def test_the_place_freed_last_with_its_connection_takes_the_next_request() -> None:
    """The clients' books alone: a place freed with its connection kept is taken first, the newest first; then one
    freed without (its connection was dropped); a new client only when every place is busy."""
    held = _HeldClients()
    places = HELD_STREAMS_PER_CLIENT
    first = [held.take() for _ in range(2 * places + 1)]
    assert first == sorted(first) and first[-1] == 2 and len(held.clients) == 3
    held.give(0, reusable=False)
    held.give(1, reusable=True)
    held.give(2, reusable=True)
    assert [held.take(), held.take(), held.take()] == [2, 1, 0]
    assert len(held.clients) == 3
    assert held.take() == 3  # every place busy: a new client
    assert held.busy == [places] * 3 + [1]


def test_every_place_is_busy_kept_or_free_exactly_once() -> None:
    """Whatever the order of takes and gives, each client's busy count and free places add up to its places."""
    held = _HeldClients()
    taken: list[int] = []
    for step in range(200):
        if step % 7 in (0, 1, 3, 4) or not taken:
            taken.append(held.take())
        else:
            held.give(taken.pop(step % len(taken)), reusable=step % 3 != 0)
    for index in range(len(held.clients)):
        free = held._idle.count(index) + held._room.count(index)
        assert held.busy[index] == taken.count(index)
        assert held.busy[index] + free == HELD_STREAMS_PER_CLIENT


async def test_requests_and_holds_share_one_tls_context_per_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Making a TLS context loads the CA roots (about 20 ms of CPU): requests outside a hold, and every hold of
    every provider, share one; SSL_CERT_FILE naming other roots gets a context of its own."""
    made: list[object] = []
    create = httpx.create_ssl_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        context = create(*args, **kwargs)  # type: ignore[arg-type]
        made.append(context)
        return context

    monkeypatch.setattr(_http_clients, "_TLS", {})
    monkeypatch.setattr(httpx, "create_ssl_context", counting)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    async with open_loopback_server(lambda request: LoopbackResponse(body=BODY)) as server:
        with trio.fail_after(20):
            for _ in range(3):
                await _stream_once(AnthropicProvider("k", base_url=server.url, retry=None))  # outside any hold
            for _ in range(2):
                provider = AnthropicProvider("k", base_url=server.url, retry=None)
                async with provider:
                    await _stream_once(provider)
            assert len(made) == 1
            monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
            await _stream_once(AnthropicProvider("k", base_url=server.url, retry=None))
    assert len(made) == 2
