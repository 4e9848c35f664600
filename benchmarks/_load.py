"""The load a benchmark ran under, and the priority it ran at: what every record's ``machine`` carries.

**Others' CPU during the run.** A `LoadSampler` reads the machine's busy time (``/proc/stat``: user, nice, system,
irq, softirq, over every core) and this run's own CPU (this process and its reaped children by ``os.times()``, plus
every live descendant, and any other process tree the benchmark started, such as a PostgreSQL server that
``pg_ctl`` detached: ``add_root``), each time the benchmark calls `LoadSampler.sample` between measured windows (no
thread of its own, so no CPU of its own inside a window). For each interval of at least `MIN_INTERVAL_S` it keeps
others' share, ``(machine busy - own) / (seconds x cores)``, and reports the mean over the run (weighted by time)
and the largest interval's. The hypervisor's steal is reported apart (a VM's CPU taken by its neighbours). Linux
only: elsewhere the figures are None.

**Priority.** `set_nice` sets this process's nice and, where the kernel groups tasks by session
(``/proc/sys/kernel/sched_autogroup_enabled`` = 1, when ``nice`` only ranks tasks inside one autogroup), its
autogroup's nice through ``/proc/self/autogroup``, the one that competes with other users' sessions. Raising a
priority (a lower nice) needs privileges; what could not be done is said, never assumed. The autogroup is shared
with the shell that started the benchmark, so its nice is put back at exit. `priority` reads what is in effect.

`configure` and `start_sampling` set what `run_info` (and so `benchmarks._common.machine`) reports: the load so
far, the number of processes the benchmark measured in, the helper processes it started, the priority.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from pathlib import Path
from typing import Any, Final

__all__ = [
    "LoadSampler",
    "combine",
    "configure",
    "load_line",
    "priority",
    "run_info",
    "set_nice",
    "start_sampling",
]

#: Intervals shorter than this are merged into the next (the kernel counts CPU in ticks of 1/CLK_TCK s).
MIN_INTERVAL_S: Final = 0.25
_TICK: Final = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
_AUTOGROUP: Final = Path("/proc/self/autogroup")
_AUTOGROUP_ENABLED: Final = Path("/proc/sys/kernel/sched_autogroup_enabled")


def _machine_ticks() -> tuple[float, float, int] | None:
    """Busy and steal seconds over every core since boot, and the core count (``/proc/stat``); None off Linux."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    fields = [int(value) for value in lines[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    cores = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return (user + nice + system + irq + softirq) * _TICK, steal * _TICK, cores or (os.cpu_count() or 1)


def _tree_seconds(pid: int) -> float:
    """CPU seconds of process ``pid`` and of the children it reaped (``/proc/PID/stat``); 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    after = text[text.rindex(")") + 2 :].split()  # fields from the state on: utime is the 12th of them
    return sum(int(value) for value in after[11:15]) * _TICK


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            found += [int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def _descendants(pid: int) -> list[int]:
    pending, found = _children(pid), []
    while pending:
        child = pending.pop()
        found.append(child)
        pending += _children(child)
    return found


class LoadSampler:
    """Others' CPU over the intervals between calls to `sample` (see the module docstring)."""

    def __init__(self) -> None:
        self._roots: list[int] = []
        #: Per interval: (seconds, others' share of the machine, this run's share, steal's share).
        self.intervals: list[tuple[float, float, float, float]] = []
        self._last = self._snapshot()

    def add_root(self, pid: int) -> None:
        """Count the process ``pid`` and its descendants as this run's own from now on (a server it started)."""
        self._roots.append(pid)
        self._last = self._snapshot()  # an interval must count the same processes at both ends

    def _own_seconds(self) -> float:
        times = os.times()
        own = times.user + times.system + times.children_user + times.children_system
        for pid in _descendants(os.getpid()):
            own += _tree_seconds(pid)
        for root in self._roots:
            own += sum(_tree_seconds(pid) for pid in (root, *_descendants(root)))
        return own

    def _snapshot(self) -> tuple[float, float, float, int, float] | None:
        ticks = _machine_ticks()
        if ticks is None:
            return None
        busy, steal, cores = ticks
        return time.monotonic(), busy, steal, cores, self._own_seconds()

    def sample(self) -> None:
        """Close the interval since the last sample, when it is long enough to count (else it goes on)."""
        last, now = self._last, self._snapshot()
        if last is None or now is None:
            return
        seconds = now[0] - last[0]
        if seconds < MIN_INTERVAL_S:
            return
        capacity = seconds * now[3]
        own = max(now[4] - last[4], 0.0)
        others = min(max(now[1] - last[1] - own, 0.0) / capacity, 1.0)
        self.intervals.append((seconds, others, own / capacity, (now[2] - last[2]) / capacity))
        self._last = now

    def summary(self) -> dict[str, Any]:
        """Others' CPU mean (weighted by time) and max over the intervals, as fractions of all cores."""
        if not self.intervals:
            return {"others_cpu_mean": None, "others_cpu_max": None, "seconds": 0.0, "intervals": 0}
        seconds = sum(interval[0] for interval in self.intervals)

        def mean(index: int) -> float:
            return round(sum(interval[0] * interval[index] for interval in self.intervals) / seconds, 3)

        return {
            "others_cpu_mean": mean(1),
            "others_cpu_max": round(max(interval[1] for interval in self.intervals), 3),
            "own_cpu_mean": mean(2),
            "steal_mean": mean(3),
            "seconds": round(seconds, 1),
            "intervals": len(self.intervals),
            "cores": self._last[3] if self._last else os.cpu_count(),
        }


def combine(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' summaries (processes one after another) as one: means weighted by time, the largest max."""
    kept = [s for s in summaries if s.get("intervals")]
    if not kept:
        return {"others_cpu_mean": None, "others_cpu_max": None, "seconds": 0.0, "intervals": 0}
    seconds = sum(s["seconds"] for s in kept) or 1.0

    def mean(key: str) -> float:
        return round(sum(s["seconds"] * s[key] for s in kept) / seconds, 3)

    return {
        "others_cpu_mean": mean("others_cpu_mean"),
        "others_cpu_max": max(s["others_cpu_max"] for s in kept),
        "own_cpu_mean": mean("own_cpu_mean"),
        "steal_mean": mean("steal_mean"),
        "seconds": round(seconds, 1),
        "intervals": sum(s["intervals"] for s in kept),
        "cores": kept[0]["cores"],
    }


# -- priority --------------------------------------------------------------------------------------


def _autogroup() -> tuple[str, int] | None:
    """This process's autogroup and its nice (``/autogroup-NN nice K``), or None where there is none."""
    try:
        name, word, value = _AUTOGROUP.read_text().split()
    except (OSError, ValueError):
        return None
    return (name, int(value)) if word == "nice" else None


def _autogroup_enabled() -> bool | None:
    try:
        return _AUTOGROUP_ENABLED.read_text().strip() == "1"
    except OSError:
        return None


def priority() -> dict[str, Any]:
    """The priority in effect: the process's nice, and its autogroup's when the kernel groups by session."""
    group = _autogroup()
    return {
        "nice": os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else None,
        "autogroup_enabled": _autogroup_enabled(),
        "autogroup": None if group is None else group[0],
        "autogroup_nice": None if group is None else group[1],
    }


def _write_autogroup(nice: int) -> str | None:
    """Set the autogroup's nice; None when it took, else why not."""
    try:
        _AUTOGROUP.write_text(f"{nice}\n")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    group = _autogroup()
    return None if group is not None and group[1] == nice else f"read back {group}"


def set_nice(nice: int) -> dict[str, Any]:
    """Run at ``nice`` (the process, and its autogroup where there is one); what was done and what failed.

    ``effect`` says whether the priority that competes with other sessions went up (``raised``: a lower nice),
    down (``lowered``) or stayed. The autogroup's old nice is put back at exit (the group is the shell's too).
    """
    before = priority()
    done: dict[str, Any] = {"asked": nice, "before": before}
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        done["process_error"] = None
    except OSError as exc:
        done["process_error"] = f"{type(exc).__name__}: {exc.strerror or exc}"
    if before["autogroup_enabled"] and before["autogroup_nice"] is not None:
        old = before["autogroup_nice"]
        done["autogroup_error"] = error = _write_autogroup(nice)
        if error is None and old != nice:
            atexit.register(_write_autogroup, old)
    else:
        done["autogroup_error"] = "no autogroup scheduling here: the process nice is what competes"
    after = done["after"] = priority()
    key = "autogroup_nice" if before["autogroup_enabled"] and after["autogroup_nice"] is not None else "nice"
    old, new = before[key], after[key]
    done["effect"] = "unchanged" if old == new or new is None else ("raised" if new < old else "lowered")
    _RUN["nice"] = done
    return done


# -- what a run reports ----------------------------------------------------------------------------

_RUN: dict[str, Any] = {"processes": 1, "helpers": [], "sampler": None, "nice": None, "children_load": []}


def configure(*, processes: int | None = None, helpers: list[str] | None = None) -> None:
    """How many processes the benchmark measured in (one after another or at once) and which helpers it started."""
    if processes is not None:
        _RUN["processes"] = processes
    if helpers is not None:
        _RUN["helpers"] = list(helpers)


def start_sampling() -> LoadSampler:
    """A new sampler for this run: `run_info` reports its figures from now on."""
    sampler = _RUN["sampler"] = LoadSampler()
    return sampler


def add_children_load(summary: dict[str, Any]) -> None:
    """A measured child process's own load summary: the run's figure combines them with this process's."""
    _RUN["children_load"].append(summary)


def _load() -> dict[str, Any] | None:
    sampler = _RUN["sampler"]
    own = [] if sampler is None else [sampler.summary()]
    children = _RUN["children_load"]
    if not own and not children:
        return None
    if not children:
        return own[0]
    merged = combine(children)  # the children sampled each window; this process only between children
    if own and own[0].get("intervals") and merged.get("others_cpu_max") is not None:
        whole = own[0]  # the whole run, the gaps between children included: its means; the children's finer max
        merged.update({key: whole[key] for key in ("others_cpu_mean", "own_cpu_mean", "steal_mean", "seconds")})
        merged["others_cpu_max"] = max(merged["others_cpu_max"], whole["others_cpu_max"])
    return merged


def run_info() -> dict[str, Any]:
    """What `benchmarks._common.machine` adds: the load during the run so far, processes, helpers, priority."""
    return {
        "load_during_run": _load(),
        "processes": _RUN["processes"],
        "helper_processes": _RUN["helpers"],
        "priority": {**priority(), "set_by_benchmark": _RUN["nice"]},
    }


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def load_line(loadavg: str) -> str:
    """One line for a summary table: others' CPU during the run, the load average, cores, priority."""
    info = run_info()
    load = info["load_during_run"] or {}
    prio = info["priority"]
    asked = prio["set_by_benchmark"]
    nice = f"nice {prio['nice']}"
    if prio["autogroup"] is not None:
        nice += f", autogroup {prio['autogroup']} nice {prio['autogroup_nice']}"
    if asked is not None:
        failed = [f"{k.split('_')[0]}: {asked[k]}" for k in ("process_error", "autogroup_error") if asked.get(k)]
        nice += f" (--nice {asked['asked']}: {asked['effect']}" + (f"; {'; '.join(failed)})" if failed else ")")
    return (
        f"load during the run: others' CPU mean {_percent(load.get('others_cpu_mean'))}"
        f" / max {_percent(load.get('others_cpu_max'))} of {load.get('cores') or os.cpu_count()} cores"
        f" (steal {_percent(load.get('steal_mean'))}, this run {_percent(load.get('own_cpu_mean'))},"
        f" {load.get('seconds', 0)} s in {load.get('intervals', 0)} intervals); loadavg {loadavg};"
        f" nproc {os.cpu_count()}; processes {info['processes']}; {nice}"
    )
