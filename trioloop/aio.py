"""Trio as a guest of a running asyncio event loop, so an asyncio app (Starlette, FastAPI, aiohttp, Textual) can
drive a `Session`.

`TrioHost` starts one Trio run in guest mode (``trio.lowlevel.start_guest_run``) on the asyncio loop that enters it:
every Trio scheduler tick, and so every Trio task, runs on the loop's thread, between asyncio's own callbacks; Trio
asks for ticks from its I/O thread through ``loop.call_soon_threadsafe``. The run's main task holds one nursery,
and every Trio task the host starts for asyncio code (a call, an iterator's producer, a held context manager) is a
child of it, so leaving ``async with TrioHost()`` cancels and awaits them all before the run ends.

asyncio code never touches a Trio object from outside a tick: each call crosses with ``TrioToken.run_sync_soon``
and comes back through an asyncio future that the Trio side resolves, on the same thread. Cancelling the asyncio
task that awaits a call cancels the Trio task's cancel scope, and the await returns only once that task has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Generic, TypeVar, TypeVarTuple, final

import trio
from outcome import Error, Outcome

__all__ = ["NoAsyncioLoop", "TrioHost", "TrioHostClosed", "TrioHostError", "TrioIterator"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class TrioHostError(RuntimeError):
    """A `TrioHost` used where or when it cannot work: entered twice, or from another event loop."""


@final
class NoAsyncioLoop(TrioHostError):
    """A `TrioHost` entered with no asyncio loop running in this thread (from Trio, say, or from sync code)."""


@final
class TrioHostClosed(TrioHostError):
    """The host is not open (never entered, or left), or it closed while a call was waiting on it."""


class _Stage(enum.Enum):
    NEW = "new"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _settled(future: asyncio.Future[Any]) -> None:
    """Mark a call's exception as seen: what awaits the call raises it; a call nobody awaits any more (an iterator's
    producer left to the host's exit) must not warn that it was never retrieved."""
    if not future.cancelled():
        future.exception()


async def _wait_out(future: asyncio.Future[Any]) -> bool:
    """Wait until ``future`` is done, whatever cancels the waiting task meanwhile; whether something did."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait((future,))
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


@final
class _Job(Generic[T]):
    """One Trio task started for asyncio code: its cancel scope and the future its outcome goes to."""

    def __init__(self, done: asyncio.Future[T]) -> None:
        self.done = done
        self.scope: trio.CancelScope | None = None
        self.cancel_requested = False

    def cancel(self) -> None:
        """Cancel the task (in Trio context); before it started, it starts cancelled."""
        self.cancel_requested = True
        if self.scope is not None:
            self.scope.cancel()

    async def drive(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> None:
        try:
            with trio.CancelScope() as scope:
                self.scope = scope
                if self.cancel_requested:
                    scope.cancel()
                _resolve(self.done, await fn(*args))
                return
            # Only our scope's cancellation ends up here: asyncio's side asked, and raises CancelledError.
            self.done.cancel()
        except Exception as exc:
            _fail(self.done, exc)
        finally:
            _fail(self.done, TrioHostClosed("the TrioHost closed while this call was running"))


@final
class TrioHost:
    """One Trio run in guest mode on the running asyncio loop: ``async with TrioHost() as host:``.

    Inside the block, asyncio code awaits Trio functions with `run`, calls Trio-side synchronous functions
    (``session.approve``, ``session.stop``) with `run_sync`, iterates Trio async iterables with `iterate` and holds
    Trio async context managers (a provider, a `Session`) open with `enter`. Use it only from the loop that entered
    it. Leaving the block cancels every Trio task it started, waits until they have ended, then ends the run; an
    exception the run itself ended with is raised there.
    """

    def __init__(self) -> None:
        self._stage = _Stage.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._waiting: set[asyncio.Future[Any]] = set()
        self._started: asyncio.Future[None] | None = None
        self._finished: asyncio.Future[Outcome[None]] | None = None

    def __repr__(self) -> str:
        return f"<TrioHost {self._stage.value}, {len(self._waiting)} calls waiting>"

    @property
    def is_open(self) -> bool:
        """Whether calls can be made: the run has started, has not ended, and the block has not been left."""
        return self._stage is _Stage.OPEN and self._finished is not None and not self._finished.done()

    # -- the run's lifetime ----------------------------------------------------------------------

    async def __aenter__(self) -> TrioHost:
        if self._stage is not _Stage.NEW:
            raise TrioHostError("a TrioHost runs once: enter a new one")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise NoAsyncioLoop("TrioHost needs a running asyncio event loop (enter it from asyncio code)") from None
        self._stage = _Stage.OPENING
        self._loop = loop
        self._started = started = loop.create_future()
        self._finished = loop.create_future()
        try:
            trio.lowlevel.start_guest_run(
                self._main,
                run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                run_sync_soon_not_threadsafe=loop.call_soon,
                done_callback=self._on_done,
                host_uses_signal_set_wakeup_fd=True,  # asyncio owns the wakeup fd (for its signal handlers)
            )
        except RuntimeError as exc:  # Trio allows one run per thread: another TrioHost's, say
            self._stage = _Stage.CLOSED
            raise TrioHostError(
                "a Trio run is already active in this thread (another TrioHost?): one TrioHost per loop"
            ) from exc
        try:
            await asyncio.shield(started)
        except BaseException:
            await self._close()
            raise
        self._stage = _Stage.OPEN
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        """Cancel the host's nursery, wait (through any cancellation) until the run has ended, raise its error."""
        finished = self._finished
        if finished is None or self._stage in (_Stage.CLOSING, _Stage.CLOSED):
            return
        self._stage = _Stage.CLOSING
        token, nursery = self._token, self._nursery
        if token is not None and nursery is not None and not finished.done():
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(nursery.cancel_scope.cancel)
        cancelled = await _wait_out(finished)
        self._stage = _Stage.CLOSED
        if cancelled:
            raise asyncio.CancelledError
        finished.result().unwrap()

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self._token = trio.lowlevel.current_trio_token()
            self._nursery = nursery
            if self._stage is _Stage.CLOSING:  # the entering asyncio task was cancelled before the run started
                nursery.cancel_scope.cancel()
            if self._started is not None:
                _resolve(self._started, None)
            await trio.sleep_forever()

    def _on_done(self, result: Outcome[None]) -> None:
        self._nursery = None
        error = result.error if isinstance(result, Error) else None
        for waiting in tuple(self._waiting):
            closed = TrioHostClosed("the Trio run ended while this call was waiting")
            closed.__cause__ = error
            _fail(waiting, closed)
        self._waiting.clear()
        if self._started is not None:
            _fail(self._started, TrioHostError(f"the Trio run ended before it started: {error!r}"))
        if self._finished is not None:
            _resolve(self._finished, result)

    # -- crossing into Trio ----------------------------------------------------------------------

    def _future(self) -> asyncio.Future[Any]:
        """A future for one call's outcome, on the host's loop; raises unless called there with the host open."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise NoAsyncioLoop("call a TrioHost from asyncio code, on the loop that entered it") from None
        if self._loop is not None and loop is not self._loop:
            raise TrioHostError("this TrioHost belongs to another asyncio event loop")
        if not self.is_open:
            raise TrioHostClosed(f"the TrioHost is not open ({self._stage.value})")
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.add(future)
        future.add_done_callback(_settled)
        future.add_done_callback(self._waiting.discard)
        return future

    def _soon(self, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        """Call ``fn(*args)`` in Trio context soon (nothing if the run has ended: it fails what waits)."""
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(fn, *args)

    def _start_job(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> _Job[T]:
        job: _Job[T] = _Job(self._future())
        self._soon(self._spawn, job, fn, args)
        return job

    def _spawn(self, job: _Job[Any], fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        if self._nursery is None:
            return
        self._nursery.start_soon(job.drive, fn, args, name=getattr(fn, "__qualname__", None))

    def _cancel_job(self, job: _Job[Any]) -> None:
        if not job.done.done():
            self._soon(job.cancel)

    async def _await_job(self, job: _Job[T]) -> T:
        try:
            return await asyncio.shield(job.done)
        except asyncio.CancelledError:
            if job.done.done():
                raise  # the Trio task had ended already: only this task was cancelled
            self._cancel_job(job)
            await _wait_out(job.done)
            error = None if job.done.cancelled() else job.done.exception()
            if error is not None:
                raise error from None
            raise

    async def run(self, fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
        """Run ``await fn(*args)`` as a new Trio task (a child of the host's nursery) and return its value or
        raise its exception.

        Cancelling the awaiting asyncio task cancels the Trio task's cancel scope, waits until it has ended, then
        raises ``CancelledError`` (or the exception the Trio task ended with instead). For ``session.send`` this is
        Stop: the turn settles ``cancelled`` and what was committed stays. Raises `TrioHostClosed` if the host is
        not open, or closes while the task runs.
        """
        return await self._await_job(self._start_job(fn, args))

    async def run_sync(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Call ``fn(*args)`` in Trio context (between two Trio ticks) and return its value or raise its exception:
        for the synchronous methods that touch Trio objects, such as ``session.approve``, ``deny`` or ``stop``.

        If the awaiting task is cancelled before the call ran, it never runs."""
        done: asyncio.Future[T] = self._future()
        self._soon(_call_sync, fn, args, done)
        return await done

    def iterate(self, fn: Callable[[*Ts], AsyncIterable[T]], *args: *Ts, buffer: int = 0) -> TrioIterator[T]:
        """Iterate ``fn(*args)`` (a Trio async iterable, made and driven by one Trio task) from asyncio:
        ``async with host.iterate(session.states) as states: async for state in states: ...``.

        At most ``buffer`` items wait between the Trio task and the asyncio reader (0: the Trio side hands each
        item over when asked); the iterable's own policy still applies (``session.states`` always gives the newest
        state). Leaving the block, ``aclose()``, or the host closing cancels the Trio task."""
        if buffer < 0:
            raise ValueError(f"buffer must be 0 or more, not {buffer}")
        return TrioIterator(lambda: fn(*args), buffer, start=self._start_job, cancel=self._cancel_job, run=self.run)

    def enter(self, fn: Callable[[*Ts], AbstractAsyncContextManager[T]], *args: *Ts) -> AbstractAsyncContextManager[T]:
        """Hold the Trio async context manager ``fn(*args)`` open from asyncio:
        ``async with host.enter(ScriptedProvider, steps) as provider:``.

        One Trio task (a child of the host's nursery) enters it, keeps it open while the asyncio block runs and
        exits it when the block ends, as Trio requires of a context manager that holds a nursery (a `Session`
        does). The Trio side always exits normally; an error it raises on exit is raised from the block's end."""
        return self._held(fn, args)

    @contextlib.asynccontextmanager
    async def _held(
        self, fn: Callable[..., AbstractAsyncContextManager[T]], args: tuple[Any, ...]
    ) -> AsyncGenerator[T, None]:
        holder: _Holder[T] = _Holder(self._future())
        job = self._start_job(holder.hold, (fn, args))
        try:
            await asyncio.wait((holder.entered, job.done), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._cancel_job(job)
            await _wait_out(job.done)
            raise
        if not holder.entered.done():
            await self._await_job(job)  # it ended without entering: raises its exception (or TrioHostClosed)
            raise TrioHostClosed("the context manager ended before it was entered")
        try:
            yield holder.entered.result()
        finally:
            self._soon(holder.release)
            await self._await_job(job)


def _call_sync(fn: Callable[..., T], args: tuple[Any, ...], done: asyncio.Future[T]) -> None:
    if done.done():  # cancelled before it could run
        return
    try:
        value = fn(*args)
    except Exception as exc:
        done.set_exception(exc)
    else:
        done.set_result(value)


@final
class _Holder(Generic[T]):
    """The Trio side of `TrioHost.enter`: enters, hands the value over, waits for the release, exits."""

    def __init__(self, entered: asyncio.Future[T]) -> None:
        self.entered = entered
        self._released = trio.Event()

    async def hold(self, fn: Callable[..., AbstractAsyncContextManager[T]], args: tuple[Any, ...]) -> None:
        async with fn(*args) as value:
            _resolve(self.entered, value)
            await self._released.wait()

    def release(self) -> None:
        self._released.set()


@final
class TrioIterator(Generic[T]):
    """A Trio async iterable read from asyncio (see `TrioHost.iterate`): an async iterator and an async context
    manager whose exit (or ``aclose()``) ends the Trio task that drives the iterable."""

    def __init__(
        self,
        make: Callable[[], AsyncIterable[T]],
        buffer: int,
        *,
        start: Callable[[Callable[..., Awaitable[None]], tuple[Any, ...]], _Job[None]],
        cancel: Callable[[_Job[None]], None],
        run: Callable[[Callable[[], Awaitable[T]]], Awaitable[T]],
    ) -> None:
        self._make = make
        self._buffer = buffer
        self._start = start
        self._cancel = cancel
        self._run = run
        self._receive: trio.MemoryReceiveChannel[T] | None = None
        self._producer: _Job[None] | None = None
        self._error: BaseException | None = None
        self._closed = False

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __aenter__(self) -> TrioIterator[T]:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def __anext__(self) -> T:
        if self._closed:
            raise StopAsyncIteration
        if self._receive is None:
            send, self._receive = trio.open_memory_channel[T](self._buffer)
            self._producer = self._start(self._produce, (send,))
        try:
            return await self._run(self._receive.receive)
        except trio.EndOfChannel:
            self._closed = True
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None

    async def _produce(self, send: trio.MemorySendChannel[T]) -> None:
        async with send:
            iterable = self._make()
            try:
                if isinstance(iterable, AsyncGenerator):
                    async with contextlib.aclosing(iterable) as items:
                        async for item in items:
                            await send.send(item)
                else:
                    async for item in iterable:
                        await send.send(item)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the reader closed
            except Exception as exc:
                self._error = exc

    async def aclose(self) -> None:
        """Stop iterating: cancel the Trio task that drives the iterable and wait until it has ended."""
        self._closed = True
        producer = self._producer
        if producer is None:
            return
        self._cancel(producer)
        if await _wait_out(producer.done):
            raise asyncio.CancelledError
