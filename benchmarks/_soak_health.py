"""The soak's own process, watched while it runs: memory, descriptors, Trio tasks, the loop's lag, its longest steps.

`Sampler` samples RSS, open descriptors, Trio tasks and the turns so far every few seconds (the growth check's
input, `benchmarks._soak_report.growth`) and times the loop's lag (a task asking for 50 ms of sleep); `SlowSteps`
keeps the longest task steps with their CPU time and where each ended (a step long in wall time and short in CPU
is the process waiting for a core).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import trio


def rss_mib() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def trio_tasks() -> int:
    """Every task in this Trio run (walked from the root task through each nursery)."""
    stack = [trio.lowlevel.current_root_task()]
    count = 0
    while stack:
        task = stack.pop()
        if task is None:
            continue
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


class SlowSteps(trio.abc.Instrument):
    """The longest task steps (the loop held by one task without a checkpoint), by task name: what makes a
    deadline late when the loop itself is."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.started = 0.0
        self.started_cpu = 0.0
        self.longest: list[tuple[float, str]] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.started = time.perf_counter()
        self.started_cpu = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if not self.started:
            return  # installed in the middle of this step
        took = time.perf_counter() - self.started
        if len(self.longest) < self.keep or took > self.longest[-1][0]:
            cpu = time.thread_time() - self.started_cpu
            frames = [(f.f_code.co_filename, f.f_code.co_name, line) for f, line in task.iter_await_frames()]
            # Where the step ended: the innermost frames of ours (trioloop's or the soak's), then the last one.
            ours = [f"{name}:{line}" for file, name, line in frames if "/trioloop/" in file or "/benchmarks/" in file]
            last = frames[-1][0].rsplit("/", 1)[-1] + f":{frames[-1][2]}" if frames else "?"
            where = " > ".join([*ours[-4:], last])
            self.longest.append((took, f"{task.name} ({cpu * 1e3:.1f} ms CPU) @ {where}"))
            self.longest.sort(reverse=True)
            del self.longest[self.keep :]

    def figures(self) -> list[dict[str, Any]]:
        return [{"ms": round(took * 1e3, 2), "task": name} for took, name in self.longest]


class Sampler:
    """Samples RSS, descriptors, tasks and the turns so far every ``every`` seconds; times the loop's lag."""

    def __init__(self, turns: Any, every: float) -> None:
        self.turns = turns
        self.every = every
        self.samples: list[dict[str, Any]] = []
        self.lag: list[float] = []
        self.started = 0.0

    async def run(self) -> None:
        self.started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._lag)
            while True:
                self.samples.append(
                    {
                        "t": round(trio.current_time() - self.started, 2),
                        "turns": self.turns(),
                        "rss_mib": round(rss_mib(), 2),
                        "fds": open_fds(),
                        "tasks": trio_tasks(),
                        "cpu_s": round(time.process_time(), 2),
                    }
                )
                await trio.sleep(self.every)

    async def _lag(self) -> None:
        while True:
            asked = trio.current_time()
            await trio.sleep(0.05)
            self.lag.append((trio.current_time() - asked - 0.05) * 1e3)
