"""What a late leg waited for: the garbage collector, its journal, a free core, or none of these (trioloop itself).

Every soak process (the soak's own and each worker) installs `Causes` for its load. It keeps three records, each
for the last `KEEP_S` seconds, on the perf_counter clock (Trio's clock is the same one plus an offset):

- `GcLog`: every collection (``gc.callbacks`` give its start and stop, in whichever thread ran it): its generation,
  its wall time, and the CPU time of the thread that ran it (wall far above CPU: the collector was waiting for a
  core too);
- `RunLog`, a Trio instrument: the loop thread's cumulative time on a CPU and in the run queue (runnable, waiting
  for a core) from ``/proc/self/task/<tid>/schedstat`` (ns), and its time in Trio's I/O wait (nothing to run),
  sampled on each side of every I/O wait and after any task step 1 ms or more after the last sample, so a window's
  figures are interpolated between samples at most ~1 ms apart (or around a step that long); with them, every
  `OTHERS_EVERY_S`, the same two figures summed over the process's other threads (the stores' threads, Trio's
  worker threads);
- the session's journal writes (`benchmarks._soak_wiring.AppendTimes`, timed from outside the store: each append
  of the session's lease, the compaction after it, and each witness write, queueing for the store's thread
  included).

When a leg settles after its deadline, `Causes.explain` reads them over the window from the deadline (the runner's
own account of it) to the settle, which is what the overshoot is made of, and adds to the leg's event:

- ``journal_ms``: the part of the window one of the session's journal writes was in flight;
- ``starved_ms``: outside those writes, the loop thread waiting for a core, and the time it was blocked (neither
  on a CPU, nor waiting for one, nor in its I/O wait: the GIL, above all) while the other threads waited for a
  core, up to that wait: the process was runnable and the machine did not run it;
- ``gc_cpu_ms`` / ``gc_wall_ms``: the collections in the window, outside those writes (the CPU is the collector's
  own work, the process's share; the rest of its wall time is the machine's, and counted in ``starved_ms``);
- to check these by hand: the loop thread's ``ran_ms``, ``core_wait_ms``, ``idle_ms`` and ``blocked_ms`` over the
  whole window (they add up to it, give or take the time a woken thread waits for a core, which counts as both
  idle and waiting), and the other threads' ``others_ran_ms`` and ``others_core_wait_ms``.

`classify` then names one cause: the machine's (``starvation``, ``journal``: the two explain the excess over the
bound by themselves, and the larger names it) or the process's own (``gc``: a collection's CPU is needed to
explain it; ``ours``: not even then: trioloop's own work, a timer of its own, or the soak's). The soak fails only on
the process's own. A leg still unsettled at its deadline plus the bound also gets ``late_at``: where its tasks
waited then (`where_tasks`). Without schedstat (not Linux, or a kernel without it) the wait for a core is estimated
as wall - run - idle of the loop thread, and ``starved_source`` says so.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import math
import os
import threading
import time
from array import array
from typing import Any, Final

import attrs
import trio

#: How far past its deadline a leg may settle (its budget's end, the runner's account), in ms.
OVERSHOOT_BOUND_MS: Final = 50.0
#: Seconds of history kept: far more than a leg's overshoot window (a deadline and the settle after it).
KEEP_S: Final = 60.0
#: A task step this long after the last sample takes a sample of its own.
SAMPLE_EVERY_S: Final = 0.001
#: The other threads' figures are read at most this often (each sample of the loop thread's between takes the last).
OTHERS_EVERY_S: Final = 0.005
#: The causes a late leg is given, and the ones that are the process's own (they fail the soak).
MACHINE_CAUSES: Final = ("starvation", "journal")
OWN_CAUSES: Final = ("gc", "ours")
#: What `Causes.explain` adds to a leg's event.
CAUSE_FIELDS: Final = (
    "journal_ms",
    "starved_ms",
    "core_wait_ms",
    "ran_ms",
    "idle_ms",
    "blocked_ms",
    "others_core_wait_ms",
    "others_ran_ms",
    "gc_cpu_ms",
    "gc_wall_ms",
    "gc_pauses",
    "starved_source",
)


class _Series:
    """Columns of floats (no object the collector tracks), trimmed to the last `KEEP_S` seconds."""

    def __init__(self, columns: int) -> None:
        self.columns = [array("d") for _ in range(columns)]

    def add(self, *values: float) -> None:
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)
        times = self.columns[0]
        # Trimmed once a quarter more than kept has piled up: the samples (one around every wait of the loop) are
        # what this soak itself holds most of, and a late leg is judged when it settles, over seconds at most.
        if len(times) % 4096 == 0 and times[-1] - times[0] > 1.25 * KEEP_S:
            cut = bisect.bisect_left(times, times[-1] - KEEP_S)
            for column in self.columns:
                del column[:cut]


class GcLog:
    """Every collection while installed (``gc.callbacks``): when, generation, wall, CPU of the thread that ran it."""

    def __init__(self) -> None:
        self.recent = _Series(4)  # start, wall, cpu, generation
        self.count: list[int] = []
        self.max_wall: list[float] = []
        self.max_cpu: list[float] = []
        self.total_wall = self.total_cpu = 0.0
        self.over_5ms_wall = self.over_5ms_cpu = 0
        self.worst: list[tuple[float, float, int, int]] = []  # (cpu, wall, generation, collected), by CPU
        self._started = self._started_cpu = 0.0
        self.clear()

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started, self._started_cpu = time.perf_counter(), time.thread_time()
            return
        wall = time.perf_counter() - self._started
        cpu = time.thread_time() - self._started_cpu
        generation = info.get("generation", 2)
        self.recent.add(self._started, wall, cpu, generation)
        self.count[generation] += 1
        self.max_wall[generation] = max(self.max_wall[generation], wall)
        self.max_cpu[generation] = max(self.max_cpu[generation], cpu)
        self.total_wall += wall
        self.total_cpu += cpu
        self.over_5ms_wall += wall > 0.005
        self.over_5ms_cpu += cpu > 0.005
        if len(self.worst) < 5 or cpu > self.worst[-1][0]:
            self.worst.append((cpu, wall, generation, info.get("collected", 0)))
            self.worst.sort(reverse=True)
            del self.worst[5:]

    def clear(self) -> None:
        """Forget the collections so far (a window's query still finds the recent ones)."""
        self.count = [0, 0, 0]
        self.max_wall = [0.0, 0.0, 0.0]
        self.max_cpu = [0.0, 0.0, 0.0]
        self.total_wall = self.total_cpu = 0.0
        self.over_5ms_wall = self.over_5ms_cpu = 0
        self.worst = []

    def install(self) -> None:
        gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def overlapping(self, start: float, end: float) -> list[tuple[float, float, float]]:
        """The collections that overlap ``start`` .. ``end``: (their start, wall, CPU)."""
        starts, walls, cpus, _ = self.recent.columns
        first = bisect.bisect_left(starts, start - 10.0)  # no pause is 10 s long
        found = []
        for index in range(first, len(starts)):
            begin = starts[index]
            if begin >= end:
                break
            if begin + walls[index] > start:
                found.append((begin, walls[index], cpus[index]))
        return found

    def summary(self) -> dict[str, Any]:
        def ms(value: float) -> float:
            return round(value * 1e3, 3)

        return {
            "collections": sum(self.count),
            "by_generation": self.count,
            "gen2_collections": self.count[2],
            "max_pause_ms": ms(max(self.max_wall)),
            "max_pause_cpu_ms": ms(max(self.max_cpu)),
            "max_pause_ms_by_generation": [ms(v) for v in self.max_wall],
            "max_pause_cpu_ms_by_generation": [ms(v) for v in self.max_cpu],
            "total_pause_ms": round(self.total_wall * 1e3, 2),
            "total_pause_cpu_ms": round(self.total_cpu * 1e3, 2),
            "pauses_over_5ms": self.over_5ms_wall,
            "pauses_over_5ms_cpu": self.over_5ms_cpu,
            "worst_by_cpu": [
                {"cpu_ms": ms(cpu), "wall_ms": ms(wall), "generation": generation, "collected": collected}
                for cpu, wall, generation, collected in self.worst
            ],
            "frozen_objects": gc.get_freeze_count(),
            "thresholds": list(gc.get_threshold()),
        }


class _OtherThreads:
    """The process's other threads (the stores' threads, Trio's worker threads): their run time and run-queue
    wait, summed (a thread that ended keeps its last figures in the sum), re-listed every second."""

    def __init__(self, own: int) -> None:
        self.own = own
        self.fds: dict[int, int] = {}
        self.last: dict[int, tuple[float, float]] = {}
        self.ended = [0.0, 0.0]
        self.listed = -math.inf
        self.read_at = -math.inf
        self.totals = (0.0, 0.0)

    def read(self, now: float) -> tuple[float, float]:
        """(ran, waited for a core), cumulative, at most every `OTHERS_EVERY_S` (else the last figures)."""
        if now - self.read_at < OTHERS_EVERY_S:
            return self.totals
        self.read_at = now
        if now - self.listed >= 1.0:
            self.listed = now
            with contextlib.suppress(OSError):
                for name in os.listdir("/proc/self/task"):
                    tid = int(name)
                    if tid != self.own and tid not in self.fds:
                        with contextlib.suppress(OSError):
                            self.fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        for tid, fd in list(self.fds.items()):
            try:
                ran, waited, _ = os.pread(fd, 128, 0).split(maxsplit=2)
                self.last[tid] = (int(ran) / 1e9, int(waited) / 1e9)
            except (OSError, ValueError):  # ended
                os.close(fd)
                del self.fds[tid]
                ended = self.last.pop(tid, (0.0, 0.0))
                self.ended = [self.ended[0] + ended[0], self.ended[1] + ended[1]]
        self.totals = (
            self.ended[0] + sum(ran for ran, _ in self.last.values()),
            self.ended[1] + sum(waited for _, waited in self.last.values()),
        )
        return self.totals

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


@attrs.frozen
class Window:
    """The loop thread over a window (seconds): on a CPU, waiting for one, in its I/O wait, and none of these
    (``blocked``: waiting for the GIL, a lock, a disk or a page); and the process's other threads, summed."""

    ran: float = 0.0
    waited: float = 0.0
    idle: float = 0.0
    blocked: float = 0.0
    others_ran: float = 0.0
    others_waited: float = 0.0


class RunLog(trio.abc.Instrument):
    """The loop thread's run time, its wait for a core and its I/O wait, and the other threads' run time and wait,
    cumulative, sampled (see the module docstring)."""

    def __init__(self) -> None:
        #: t, then cumulative seconds: ran, waited for a core, idle; the other threads: ran, waited for a core.
        self.samples = _Series(6)
        self.source = "schedstat"
        self._fd = -1
        self._others: _OtherThreads | None = None
        self._idle = 0.0
        self._idle_since = 0.0
        self._last = 0.0
        self._first: tuple[float, ...] | None = None

    def open(self) -> None:
        """Call in the loop's thread (before installing)."""
        own = threading.get_native_id()
        try:
            self._fd = os.open(f"/proc/self/task/{own}/schedstat", os.O_RDONLY)
            os.pread(self._fd, 128, 0).split()[1]
            self._others = _OtherThreads(own)
        except (OSError, IndexError):
            self.close()
            self.source = "wall - run - idle"
        self.sample(time.perf_counter())
        self._first = tuple(column[-1] for column in self.samples.columns)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._others is not None:
            self._others.close()
            self._others = None

    def sample(self, now: float) -> None:
        self._last = now
        if self._fd >= 0 and self._others is not None:
            ran, waited, _ = os.pread(self._fd, 128, 0).split(maxsplit=2)
            others = self._others.read(now)
            self.samples.add(now, int(ran) / 1e9, int(waited) / 1e9, self._idle, *others)
        else:
            self.samples.add(now, time.thread_time(), math.nan, self._idle, 0.0, 0.0)

    def before_io_wait(self, timeout: float) -> None:
        now = time.perf_counter()
        self.sample(now)
        self._idle_since = now

    def after_io_wait(self, timeout: float) -> None:
        now = time.perf_counter()
        self._idle += now - self._idle_since
        self.sample(now)

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        now = time.perf_counter()
        if now - self._last >= SAMPLE_EVERY_S:
            self.sample(now)

    def totals(self) -> dict[str, Any]:
        """The loop thread (and the others) since the load began: seconds on a CPU, waiting for one, idle."""
        columns = self.samples.columns
        if self._first is None or not columns[0]:
            return {}
        ran, waited, idle, others_ran, others_waited = (
            column[-1] - first for column, first in zip(columns[1:], self._first[1:], strict=True)
        )
        return {
            "wall_s": round(columns[0][-1] - self._first[0], 2),
            "ran_s": round(ran, 2),
            "waited_for_a_core_s": None if math.isnan(waited) else round(waited, 2),
            "idle_s": round(idle, 2),
            "other_threads_ran_s": round(others_ran, 2),
            "other_threads_waited_for_a_core_s": round(others_waited, 2),
            "source": self.source,
        }

    def at(self, when: float) -> tuple[float, ...]:
        """The cumulative figures at ``when`` (interpolated between samples; held past the last one)."""
        times = self.samples.columns[0]
        values = self.samples.columns[1:]
        index = bisect.bisect_right(times, when)
        if index == 0:
            return tuple(column[0] for column in values)
        if index == len(times):
            return tuple(column[-1] for column in values)
        t0, t1 = times[index - 1], times[index]
        share = (when - t0) / (t1 - t0) if t1 > t0 else 1.0
        return tuple(column[index - 1] + share * (column[index] - column[index - 1]) for column in values)

    def window(self, start: float, end: float) -> Window:
        """The loop thread and the others between ``start`` and ``end``."""
        if end <= start or not self.samples.columns[0]:
            return Window()
        ran, waited, idle, others_ran, others_waited = (
            b - a for a, b in zip(self.at(start), self.at(end), strict=True)
        )
        if self.source != "schedstat":
            waited = max(end - start - ran - idle, 0.0)
        blocked = max(end - start - ran - waited - idle, 0.0)
        return Window(ran, waited, idle, blocked, others_ran, others_waited)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _gaps(start: float, end: float, covered: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``start`` .. ``end`` less the (disjoint, sorted) ``covered`` intervals."""
    gaps, at = [], start
    for begin, finish in covered:
        if begin > at:
            gaps.append((at, begin))
        at = max(at, finish)
    if at < end:
        gaps.append((at, end))
    return gaps


class Causes:
    """A process's `GcLog` and `RunLog`, and its journal writes: `explain` a late leg (module docstring)."""

    def __init__(self, append_times: Any) -> None:
        self.gc = GcLog()
        self.run = RunLog()
        self.append_times = append_times
        self.offset = 0.0  # Trio's clock - perf_counter
        self.installed = False

    def install(self) -> None:
        """In the Trio run, in its thread, once the load begins (the collections of start-up are not its)."""
        self.offset = trio.current_time() - time.perf_counter()
        self.installed = True
        self.run.open()
        trio.lowlevel.add_instrument(self.run)
        self.gc.install()

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        self.gc.remove()
        trio.lowlevel.remove_instrument(self.run)
        self.run.close()

    def explain(self, session: str, due: float, settled: float) -> dict[str, Any]:
        """What ``due`` .. ``settled`` (Trio's clock: a leg's deadline and its settle after it) was made of."""
        if not self.installed:
            return {}
        start, end = due - self.offset, settled - self.offset
        writes = self.append_times.writes(session) if self.append_times is not None else []
        clipped = [(max(a, due), min(b, settled)) for a, b in writes if a < settled and b > due]
        journal = [(a - self.offset, b - self.offset) for a, b in _union(clipped)]
        gaps = _gaps(start, end, journal)
        whole = self.run.window(start, end)
        starved = 0.0
        for a, b in gaps:
            part = self.run.window(a, b)
            # The loop thread waiting for a core, and blocked (the GIL, most likely) while the other threads waited
            # for one: the process was runnable and not running.
            starved += part.waited + min(part.blocked, part.others_waited)
        gc_cpu = gc_wall = 0.0
        pauses = self.gc.overlapping(start, end)
        for begin, wall, cpu in pauses:
            inside = sum(max(0.0, min(b, begin + wall) - max(a, begin)) for a, b in gaps)
            if wall > 0:
                gc_wall += inside
                gc_cpu += cpu * inside / wall

        def ms(value: float) -> float:
            return round(value * 1e3, 3)

        return {
            "journal_ms": ms(sum(b - a for a, b in journal)),
            "starved_ms": ms(starved),
            "starved_source": self.run.source,
            "core_wait_ms": ms(whole.waited),
            "ran_ms": ms(whole.ran),
            "idle_ms": ms(whole.idle),
            "blocked_ms": ms(whole.blocked),
            "others_core_wait_ms": ms(whole.others_waited),
            "others_ran_ms": ms(whole.others_ran),
            "gc_cpu_ms": ms(gc_cpu),
            "gc_wall_ms": ms(gc_wall),
            "gc_pauses": len(pauses),
        }


def classify(leg: dict[str, Any], bound_ms: float) -> str:
    """The cause of a leg over the bound (see the module docstring): ``starvation``, ``journal``, ``gc``, ``ours``."""
    excess = leg["overshoot_ms"] - bound_ms
    starved = leg.get("starved_ms") or 0.0
    journal = leg.get("journal_ms") or 0.0
    if starved >= excess:
        return "starvation"
    if journal >= excess:
        return "journal"
    if starved + journal >= excess:
        return "starvation" if starved >= journal else "journal"
    if starved + journal + (leg.get("gc_cpu_ms") or 0.0) >= excess:
        return "gc"
    return "ours"


_LIBRARIES: Final = ("/trioloop/", "/httpx/", "/httpcore/", "/psycopg/", "/benchmarks/", "/mcp/")


def where_tasks(root: trio.lowlevel.Task, skip: trio.lowlevel.Task | None = None, most: int = 12) -> list[str]:
    """Where ``root`` and the tasks under it wait now: each task's name and its innermost frames of the library, an
    HTTP or database client, or the soak (then the very last), for a late leg still unsettled past its bound."""
    lines: list[str] = []
    stack = [root]
    while stack and len(lines) < most:
        task = stack.pop()
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
        if task is skip:
            continue
        frames = [(f.f_code.co_filename, f.f_code.co_name, line) for f, line in task.iter_await_frames()]
        ours = [f"{name}:{line}" for file, name, line in frames if any(lib in file for lib in _LIBRARIES)]
        last = f"{frames[-1][0].rsplit('/', 1)[-1]}:{frames[-1][2]}" if frames else "?"
        lines.append(f"{task.name} @ {' > '.join([*ours[-3:], last])}")
    return lines
