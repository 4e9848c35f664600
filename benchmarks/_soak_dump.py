"""Where every Trio task of a soak process is waiting: printed to stderr on SIGUSR1, to find a hang."""

from __future__ import annotations

import signal
import sys
import traceback

import trio


def dump_tasks() -> str:
    """Each task's name and the frames it awaits in, walked from the root task."""
    lines: list[str] = []
    stack = [(trio.lowlevel.current_root_task(), 0)]
    while stack:
        task, depth = stack.pop()
        if task is None:
            continue
        lines.append("  " * depth + f"task {task.name}")
        for frame, lineno in task.iter_await_frames():
            summary = traceback.FrameSummary(frame.f_code.co_filename, lineno, frame.f_code.co_name)
            lines.append("  " * depth + f"    {summary.filename}:{summary.lineno} {summary.name}")
        for nursery in task.child_nurseries:
            stack.extend((child, depth + 1) for child in nursery.child_tasks)
    return "\n".join(lines)


async def dump_on_signal() -> None:
    """A task: print `dump_tasks` to stderr each time the process gets SIGUSR1."""
    with trio.open_signal_receiver(signal.SIGUSR1) as signals:
        async for _ in signals:
            print(dump_tasks(), file=sys.stderr, flush=True)
