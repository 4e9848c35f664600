"""A fault-injecting TCP proxy on 127.0.0.1 (Trio), for the soak: one fault per connection, drawn and counted.

``open_fault_proxy(upstream, mix, seed=...)`` listens on an ephemeral port and forwards each connection to
``upstream``; ``python -m benchmarks._fault_proxy --upstream 127.0.0.1:PORT`` does the same in a process of its
own, prints its port on the first line of stdout, serves until stdin closes and then prints its counters as one
JSON line. When a connection is accepted the proxy draws one `Fault` for it from ``mix`` (a seeded
``random.Random``, so a seed gives the same sequence of draws) and a byte offset into the server's answer where
the fault begins. The faults act on what the server sends back (the direction a client waits on):

- ``latency``: once the offset is reached, a pause of ``latency_s`` (a spike), then the rest as it comes;
- ``stall``: once the offset is reached, nothing for ``stall_s`` (longer than the turn deadline), then the rest;
- ``reset``: once the offset is reached, both sockets closed abruptly (``SO_LINGER`` 0: an RST each way);
- ``truncate``: the answer cut inside the first SSE event (``data:``) at or after the offset (at the offset when
  the bytes hold none: a PostgreSQL message cut in two), then both sides closed cleanly;
- ``dribble``: from the offset on, ``dribble_bytes`` bytes one per write (``TCP_NODELAY``), with a pause of
  ``dribble_s`` every ``DRIBBLE_RUN`` bytes, then the rest as it comes (Trio's timers are whole milliseconds: a
  pause per byte, or a dribble to the end of a 300 kB journal read, would be a stall of minutes, not a dribble).

``chosen`` counts the draws, ``fired`` the faults that took effect (an answer shorter than its offset never
meets its fault). Every connection is two pumps in a nursery of its own inside the proxy's nursery; the first
to see an end of stream or an error cancels the other and both sockets close. A pump holds at most one read
(``READ_SIZE`` bytes) and the proxy at most ``max_connections`` connections (further clients wait in the
listen backlog), so memory is bounded whatever the traffic. The proxy knows nothing of HTTP or PostgreSQL:
the same faults apply to a provider's HTTP stream and to a journal store's database connection.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import random
import socket
import struct
import sys
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Final, final

import attrs
import trio

__all__ = ["HTTP_MIX", "POSTGRES_MIX", "Fault", "FaultMix", "FaultProxy", "open_fault_proxy"]

READ_SIZE: Final = 16384
DRIBBLE_RUN: Final = 64
SSE_DATA: Final = b"data:"


@final
class Fault(enum.StrEnum):
    """What the proxy does to one connection."""

    NONE = "none"
    LATENCY = "latency"
    STALL = "stall"
    RESET = "reset"
    TRUNCATE = "truncate"
    DRIBBLE = "dribble"


@final
@attrs.frozen(kw_only=True)
class FaultMix:
    """The chance of each fault (weights, normalised) and how long each lasts, in seconds."""

    weights: Mapping[Fault, float]
    latency_s: tuple[float, float] = (0.05, 0.4)
    stall_s: float = 3.0
    dribble_s: float = 0.001
    dribble_bytes: int = 4096
    #: The fault begins after a number of the server's bytes drawn uniformly from this range.
    offset: tuple[int, int] = (0, 3000)

    def draw(self, rng: random.Random) -> tuple[Fault, int, float]:
        """A fault, its byte offset and its length (the latency spike's; the stall's; 0 otherwise)."""
        kinds = list(self.weights)
        fault = rng.choices(kinds, weights=[self.weights[k] for k in kinds])[0]
        offset = rng.randint(*self.offset)
        length = rng.uniform(*self.latency_s) if fault is Fault.LATENCY else self.stall_s
        return fault, offset, length


#: The provider's edge: most connections clean, every fault often enough to be met many times a minute.
HTTP_MIX: Final = FaultMix(
    weights={
        Fault.NONE: 0.60,
        Fault.LATENCY: 0.12,
        Fault.STALL: 0.05,
        Fault.RESET: 0.08,
        Fault.TRUNCATE: 0.08,
        Fault.DRIBBLE: 0.07,
    }
)
#: The database's edge: a lease holds its connection for the session's life, so a fault there ends (reset,
#: truncate) or freezes (stall) a whole session's journal; those are rarer, and a stall there is short.
POSTGRES_MIX: Final = FaultMix(
    weights={
        Fault.NONE: 0.55,
        Fault.LATENCY: 0.25,
        Fault.STALL: 0.03,
        Fault.RESET: 0.05,
        Fault.TRUNCATE: 0.02,
        Fault.DRIBBLE: 0.10,
    },
    latency_s=(0.02, 0.2),
    stall_s=1.0,
    offset=(0, 200_000),
)


def _abort(stream: trio.SocketStream) -> None:
    """Make the coming close an RST instead of a FIN (the peer's next read fails: "connection reset")."""
    with contextlib.suppress(OSError):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Cut(Exception):
    """The fault ends the connection: both sides close now."""

    def __init__(self, abrupt: bool) -> None:
        self.abrupt = abrupt


@final
class FaultProxy:
    """Forwards every accepted connection to ``upstream`` with one fault drawn from ``mix`` (module docstring)."""

    def __init__(self, upstream: tuple[str, int], mix: FaultMix, *, seed: int = 0, max_connections: int = 1024) -> None:
        self.upstream = upstream
        self.mix = mix
        self._rng = random.Random(seed)
        self._slots = trio.Semaphore(max_connections)
        self.port = 0
        self.connections = 0
        self.open = 0
        self.chosen: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()
        self.upstream_refused = 0

    def counters(self) -> dict[str, object]:
        """What the proxy did so far, JSON-ready."""
        return {
            "connections": self.connections,
            "open": self.open,
            "chosen": dict(self.chosen),
            "fired": dict(self.fired),
            "upstream_refused": self.upstream_refused,
        }

    async def serve(self, listener: trio.SocketListener) -> None:
        """Accept and forward until cancelled (every connection's task is a child of this one's nursery)."""
        async with trio.open_nursery() as nursery:
            while True:
                await self._slots.acquire()  # a free slot before the next accept (the backlog holds the rest)
                try:
                    stream = await listener.accept()
                except BaseException:
                    self._slots.release()
                    raise
                self.connections += 1
                fault, offset, length = self.mix.draw(self._rng)
                self.chosen[fault.value] += 1
                nursery.start_soon(self._connection, stream, fault, offset, length)

    async def _connection(self, client: trio.SocketStream, fault: Fault, offset: int, length: float) -> None:
        self.open += 1
        abrupt = False
        upstream: trio.SocketStream | None = None
        try:
            try:
                upstream = await trio.open_tcp_stream(*self.upstream)
            except OSError:
                self.upstream_refused += 1
                abrupt = True
                return
            try:
                async with trio.open_nursery() as pumps:
                    pumps.start_soon(self._forward, client, upstream, pumps.cancel_scope)
                    pumps.start_soon(self._answer, upstream, client, fault, offset, length, pumps.cancel_scope)
            except _Cut as cut:
                abrupt = cut.abrupt
            except BaseExceptionGroup as group:
                cuts, rest = group.split(_Cut)
                if rest is not None:
                    raise rest from None
                assert cuts is not None
                abrupt = any(isinstance(c, _Cut) and c.abrupt for c in cuts.exceptions)
        finally:
            self.open -= 1
            self._slots.release()
            for stream in (client, upstream):
                if stream is None:
                    continue
                if abrupt:
                    _abort(stream)
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    async def _forward(self, source: trio.SocketStream, sink: trio.SocketStream, scope: trio.CancelScope) -> None:
        """The client's bytes, as they come (requests are never faulted)."""
        try:
            while data := await source.receive_some(READ_SIZE):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    async def _answer(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        fault: Fault,
        offset: int,
        length: float,
        scope: trio.CancelScope,
    ) -> None:
        """The server's bytes, with the connection's fault once ``offset`` of them went through."""
        passed = 0
        armed = fault is not Fault.NONE
        try:
            while data := await source.receive_some(READ_SIZE):
                if not armed or passed + len(data) <= offset:
                    passed += len(data)
                    await sink.send_all(data)
                    continue
                head, tail = data[: max(offset - passed, 0)], data[max(offset - passed, 0) :]
                if fault is Fault.TRUNCATE:
                    at = tail.find(SSE_DATA)
                    if at < 0 and SSE_DATA in data:  # an event began before the offset: cut inside the next one
                        passed += len(data)
                        await sink.send_all(data)
                        continue
                    cut = len(head) + (0 if at < 0 else at + len(SSE_DATA) + 1 + self._rng.randrange(8))
                    self.fired[fault.value] += 1
                    await sink.send_all(data[:cut])
                    raise _Cut(abrupt=False)
                if head:
                    await sink.send_all(head)
                armed = False
                self.fired[fault.value] += 1
                if fault is Fault.RESET:
                    raise _Cut(abrupt=True)
                if fault in (Fault.LATENCY, Fault.STALL):
                    await trio.sleep(length)
                    await sink.send_all(tail)
                elif fault is Fault.DRIBBLE:
                    await self._dribble(source, sink, tail)
                    return
                passed += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    async def _dribble(self, source: trio.SocketStream, sink: trio.SocketStream, first: bytes) -> None:
        sink.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data, left = first, self.mix.dribble_bytes
        while data:
            for index in range(len(data)):
                if not left:
                    await sink.send_all(data[index:])
                    break
                await sink.send_all(data[index : index + 1])
                left -= 1
                if index % DRIBBLE_RUN == DRIBBLE_RUN - 1:
                    await trio.sleep(self.mix.dribble_s)
            data = await source.receive_some(READ_SIZE)
        raise _Cut(abrupt=False)  # the server closed: so does the client's side


@asynccontextmanager
async def open_fault_proxy(
    upstream: tuple[str, int], mix: FaultMix, *, seed: int = 0, max_connections: int = 1024
) -> AsyncIterator[FaultProxy]:
    """Run a `FaultProxy` on an ephemeral 127.0.0.1 port for the block (``proxy.port``); its nursery is the
    block's, so leaving the block closes every connection it holds."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    proxy = FaultProxy(upstream, mix, seed=seed, max_connections=max_connections)
    proxy.port = listeners[0].socket.getsockname()[1]
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(proxy.serve, listeners[0])
            yield proxy
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await listeners[0].aclose()


MIXES: Final = {"http": HTTP_MIX, "postgres": POSTGRES_MIX}


async def _main(upstream: tuple[str, int], mix: FaultMix, seed: int) -> None:
    async with open_fault_proxy(upstream, mix, seed=seed) as proxy:
        print(proxy.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        print(json.dumps(proxy.counters()), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--mix", choices=sorted(MIXES), default="http")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stall-s", type=float, help="how long a stall lasts (default: the mix's)")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    mix = MIXES[args.mix]
    if args.stall_s is not None:
        mix = attrs.evolve(mix, stall_s=args.stall_s)
    trio.run(_main, (host, int(port)), mix, args.seed)


if __name__ == "__main__":
    main()
