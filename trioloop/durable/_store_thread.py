"""A store's one thread: every call on its connection, in order, and appends queued together in one transaction.

`trio.to_thread.run_sync` hands each call to a thread from Trio's cache and back (a limiter, a context copy, a
report back): about 75 us of CPU a call, more than a SQLite append's own work. A `StoreThread` lives as long as its
store instead. A caller queues its work and parks (`trio.lowlevel.wait_task_rescheduled`); the thread runs the queue
in order and hands each outcome back with `trio.lowlevel.TrioToken.run_sync_soon`.

**Group commit.** Appends queued one behind the other when the thread comes to them are written in one transaction
(``begin``), each inside a savepoint of its own: one that fails (a conflict, a lost lease) is rolled back alone and
the others commit, with one sync to disk for all of them. A store that can do better gives ``together``: it writes
and commits a whole group at once (PostgreSQL: one pipeline), answering what each append found, or None to have
them written one by one as above. An append's ``after`` (the session's witness write) runs in
the thread right after the commit that made the append durable, never before it.

**Cancellation.** Work the thread has not begun is dropped at once. Work it has begun is waited for, unless it was
queued with ``abandon=True``: its caller then goes on at once and the thread finishes the work alone (the outcome,
an append's included, is then unknown to the caller). Either way the thread runs one thing at a time, in order.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import attrs
import outcome
import trio

__all__ = ["AppendsThen", "StoreThread"]

_T = TypeVar("_T")

#: ``begin(connection)`` opens the batch's transaction, ``commit(connection, ok)`` ends it (``ok``: something in it
#: is to be kept), and ``translate(error, what)`` turns a database error into the store's own.
Begin = Callable[[Any], None]
Commit = Callable[[Any, bool], None]
Translate = Callable[[BaseException, str], BaseException]
#: ``together(connection, writes)`` writes and commits a group of appends at once: each one's error (None: written),
#: or None when the group is to be written one by one after all (nothing of it kept).
Together = Callable[[Any, Sequence[Callable[[Any], None]]], "list[BaseException | None] | None"]


@attrs.define(eq=False)
class _Work:
    what: str
    run: Callable[[Any], Any] | None  # a call on the connection (None: an append, see ``write``)
    write: Callable[[Any], None] | None  # an append's writes, inside the batch's transaction
    after: Callable[[], None] | None  # run once the batch that holds this append has committed
    abandon: bool
    connected: bool  # ``run`` takes the connection (opened first if need be); else None
    token: trio.lowlevel.TrioToken
    task: trio.lowlevel.Task
    started: bool = False
    dropped: bool = False  # its caller went on (cancelled before it began, or abandoned): no one to hand it back to
    result: outcome.Outcome[Any] | None = None


_STOP: Final = object()


class AppendsThen:
    """A lease whose store runs ``after()`` in its own thread once an append is durable (`append_then`): the session
    then hands over its witness write with the append. Nominal on purpose: a wrapper around such a lease (one that
    times or pauses ``append``) is not one, so every append of a wrapped lease goes through the wrapper."""

    async def append_then(self, entries: Any, after: Callable[[], None] | None) -> None:
        raise NotImplementedError


class StoreThread:
    """The one thread that uses a store's connection (see the module docstring). ``connect()`` returns the
    connection (opening it on first use); the three callables shape the transaction of a group of appends."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], Any],
        begin: Begin,
        commit: Commit,
        translate: Translate,
        *,
        together: Together | None = None,
    ) -> None:
        self._name = name
        self._together = together
        self._connect = connect
        self._begin = begin
        self._commit = commit
        self._translate = translate
        self._queue: collections.deque[_Work | object] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        #: How many transactions of appends committed, and how many appends they held (group commit, measured).
        self.batches = 0
        self.appends = 0

    async def call(self, what: str, run: Callable[[Any], _T], *, abandon: bool = False, connected: bool = True) -> _T:
        """``run(connection)`` on the thread (``run(None)`` when not ``connected``: closing, say); its result or its
        error (translated)."""
        return await self._wait(what, run, None, None, abandon, connected)  # type: ignore[no-any-return]

    async def append(
        self, what: str, write: Callable[[Any], None], *, after: Callable[[], None] | None = None, abandon: bool = True
    ) -> None:
        """``write(connection)`` inside a transaction it may share with other appends queued beside it, then (once
        that transaction committed) ``after()``."""
        await self._wait(what, None, write, after, abandon, True)

    async def stop(self) -> None:
        """Let the queue run out, then end the thread (a later call starts a new one)."""
        thread = self._thread
        if thread is None:
            await trio.lowlevel.checkpoint()
            return
        with self._ready:
            self._queue.append(_STOP)
            self._ready.notify()
        self._thread = None
        await trio.to_thread.run_sync(thread.join)

    async def _wait(
        self,
        what: str,
        run: Callable[[Any], Any] | None,
        write: Callable[[Any], None] | None,
        after: Callable[[], None] | None,
        abandon: bool,
        connected: bool,
    ) -> Any:
        await trio.lowlevel.checkpoint_if_cancelled()
        token, task = trio.lowlevel.current_trio_token(), trio.lowlevel.current_task()
        work = _Work(what, run, write, after, abandon, connected, token, task)
        with self._ready:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._queue.append(work)
            self._ready.notify()

        def abort(_: Any) -> trio.lowlevel.Abort:
            with self._ready:
                if not work.started or work.abandon:
                    work.dropped = True
                    return trio.lowlevel.Abort.SUCCEEDED
            return trio.lowlevel.Abort.FAILED  # begun, and not to be left: its outcome comes back, then the cancel

        return await trio.lowlevel.wait_task_rescheduled(abort)

    # -- the thread ------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                first = self._queue.popleft()
                if first is _STOP:
                    return
                batch = [first]
                if isinstance(first, _Work) and first.write is not None:
                    while self._queue and isinstance(self._queue[0], _Work) and self._queue[0].write is not None:
                        batch.append(self._queue.popleft())
                work_items = [work for work in batch if isinstance(work, _Work) and not work.dropped]
                for work in work_items:
                    work.started = True
            if not work_items:
                continue
            try:
                if work_items[0].write is None:
                    self._run_one(work_items[0])
                else:
                    self._append_all(work_items)
            except BaseException as exc:  # a fault of this thread's own: every caller hears of it, none waits for ever
                for work in work_items:
                    if work.result is None:
                        work.result = outcome.Error(exc)
            for work in work_items:
                self._hand_back(work)

    def _run_one(self, work: _Work) -> None:
        assert work.run is not None
        try:
            work.result = outcome.Value(work.run(self._connect() if work.connected else None))
        except BaseException as exc:
            work.result = outcome.Error(self._translate(exc, work.what))

    def _append_all(self, batch: Sequence[_Work]) -> None:
        try:
            connection = self._connect()
            found = None
            if self._together is not None:
                found = self._together(connection, [work.write for work in batch])  # type: ignore[misc]
            if found is None:
                self._begin(connection)
        except BaseException as exc:
            for work in batch:
                work.result = outcome.Error(self._translate(exc, work.what))
            return
        if found is not None:
            written = []
            for work, error in zip(batch, found, strict=True):
                if error is None:
                    written.append(work)
                else:
                    work.result = outcome.Error(self._translate(error, work.what))
            self._written(written)
            return
        written = []
        alone = len(batch) == 1  # its failure rolls back the whole transaction, which is its own: no savepoint
        for number, work in enumerate(batch):
            assert work.write is not None
            savepoint = f"append_{number}"
            try:
                if alone:
                    work.write(connection)
                else:
                    connection.execute(f"SAVEPOINT {savepoint}")
                    try:
                        work.write(connection)
                    except BaseException:
                        connection.execute(f"ROLLBACK TO {savepoint}")
                        raise
                    finally:
                        connection.execute(f"RELEASE {savepoint}")
            except BaseException as exc:
                work.result = outcome.Error(self._translate(exc, work.what))
            else:
                written.append(work)
        try:
            self._commit(connection, bool(written))
        except BaseException as exc:
            for work in written:
                work.result = outcome.Error(self._translate(exc, work.what))
            return
        self._written(written)

    def _written(self, written: Sequence[_Work]) -> None:
        """Count a committed group, then run each append's ``after``."""
        self.batches += bool(written)
        self.appends += len(written)
        for work in written:
            try:
                if work.after is not None:
                    work.after()
            except BaseException as exc:  # durable, but not witnessed: the caller's journal fails on it
                work.result = outcome.Error(exc)
            else:
                work.result = outcome.Value(None)

    def _hand_back(self, work: _Work) -> None:
        def back() -> None:
            if not work.dropped:
                assert work.result is not None
                trio.lowlevel.reschedule(work.task, work.result)

        with contextlib.suppress(trio.RunFinishedError):  # the caller's Trio run is over: nothing waits for this
            work.token.run_sync_soon(back)
