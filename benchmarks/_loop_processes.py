"""`benchmarks.loop` across processes, and the reducer's share of an iteration.

`across_processes` runs the benchmark in N processes one after another (``--processes``, default 5), each with its
own ``PYTHONHASHSEED`` (the layout of every set and dict of str keys differs between them, and one process's figure
can be another's outlier), and prints each process's ratios, then min / median / max across the processes for each
ratio, on CPU and on wall time. A target is met when the minimum over the processes meets it, on the clock the
run judges by (``--judge-on``, CPU by default: on a shared machine the wall ratio of one process can be several
times another's while the CPU ratios agree). It also prints the reducer's share of an iteration per process.

`reducer_contender` is the contender each process measures beside the turns: the pure reducer replaying one
recorded turn's inputs (`benchmarks.reducer_turn`: ``record_inputs``, ``replay``), CPU per iteration; its share of
an iteration is that over ``trioloop_in_process``'s CPU per iteration, in the same process and rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from benchmarks import _load
from benchmarks._common import case_record, emit, load_line, print_table

__all__ = ["CLOCKS", "RATIO_CASES", "REDUCER", "across_processes", "reducer_contender"]

#: The ratios every process must meet, by contender.
RATIO_CASES: Final = ("trioloop_in_process", "trioloop_in_process_async_tool", "trioloop_loopback_http")
#: The reducer's contender name, and how many replays of the recorded turn one of its samples averages.
REDUCER: Final = "reducer_replay"
_REPLAYS_PER_SAMPLE: Final = 10
#: The two clocks every ratio is given on.
CLOCKS: Final = ("cpu", "wall")


def reducer_contender(k: int, batched: bool) -> Callable[[int], list[tuple[float, float]]]:
    """Replays of one recorded in-process turn of ``k`` iterations through the pure reducer: each sample (wall, CPU)
    per iteration."""
    from benchmarks import loop, reducer_turn  # imported when the benchmark runs (reducer_turn imports loop)

    loop._set_k(k)  # under ``python -m benchmarks.loop`` this module is not __main__: it records a turn of k too
    loop.BATCHED = batched
    inputs = reducer_turn.record_inputs()
    if not reducer_turn.replay(inputs).is_settled:
        raise RuntimeError("the recorded turn did not settle on replay")

    def run(samples: int) -> list[tuple[float, float]]:
        found = []
        for _ in range(samples):
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(_REPLAYS_PER_SAMPLE):
                reducer_turn.replay(inputs)
            per = _REPLAYS_PER_SAMPLE * k
            found.append(((time.perf_counter() - wall) / per, (time.process_time() - cpu) / per))
        return found

    return run


def _spread(values: list[float]) -> str:
    return f"{min(values)}x / {round(statistics.median(values), 2)}x / {max(values)}x"


def _child(args: argparse.Namespace, seed: int) -> dict[str, dict[str, Any]]:
    command = [sys.executable, "-m", "benchmarks.loop", "--processes", "1", "--rounds", str(args.rounds)]
    command += ["--turns", str(args.turns), "--k", str(args.k), "--judge-on", args.judge_on]
    command += ["--per-event"] if args.per_event else []
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise RuntimeError(f"the process with PYTHONHASHSEED={seed} failed (exit {done.returncode}); its errors above")
    records = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records[record["case"]] = record
    return records


def across_processes(args: argparse.Namespace) -> int:
    """See the module docstring; the children inherit this process's nice and share its autogroup."""
    seeds = [args.first_seed + index for index in range(args.processes)]
    _load.configure(processes=args.processes, helpers=["one loopback HTTP server per process"])
    sampler = _load.start_sampling()
    per_process: list[tuple[int, dict[str, dict[str, Any]]]] = []
    for seed in seeds:
        records = _child(args, seed)
        sampler.sample()
        load = records.get("trioloop_in_process", {}).get("machine", {}).get("load_during_run")
        if load:
            _load.add_children_load(load)
        per_process.append((seed, records))
        emit(case_record("loop", "process", hash_seed=seed, records=records))
    missing = [f"seed {seed}" for seed, records in per_process if f"ratio_{RATIO_CASES[0]}" not in records]
    if missing:  # a child had no peer to compare with (pydantic-ai not installed, say): its own output says why
        print(f"no ratios from {', '.join(missing)}: is pydantic-ai installed? (pip install -e '.[bench]')")
        return 2
    rows = []
    for name in RATIO_CASES:
        ratios = {clock: [records[f"ratio_{name}"][f"ratio_{clock}"] for _, records in per_process] for clock in CLOCKS}
        target = per_process[0][1][f"ratio_{name}"]["target"]
        met = min(ratios[args.judge_on]) >= target
        rows.append((f"pydantic-ai / {name}", _spread(ratios["cpu"]), _spread(ratios["wall"]), f">= {target:g}x"))
        rows[-1] += ("yes" if met else "NO",)
        emit(
            case_record(
                "loop",
                f"spread_{name}",
                ratios=ratios[args.judge_on],
                ratios_cpu=ratios["cpu"],
                ratios_wall=ratios["wall"],
                judged_on=args.judge_on,
                hash_seeds=seeds,
                target=target,
                met=met,
            )
        )
    shares = [records[REDUCER]["share"] for _, records in per_process if REDUCER in records]
    if shares:
        emit(case_record("loop", "spread_reducer_share", shares=shares, hash_seeds=seeds))
    print()
    process_rows = []
    for seed, records in per_process:
        cells = [f"PYTHONHASHSEED={seed}", records["trioloop_in_process"]["per_iteration_cpu_us"]["median"]]
        cells += [f"{records[f'ratio_{name}'][f'ratio_{args.judge_on}']}x" for name in RATIO_CASES]
        cells.append(f"{records[REDUCER]['share']:.1%}" if REDUCER in records else "-")
        process_rows.append(tuple(cells))
    headers = ("process", "in process cpu us", "ratio in process", "async tool", "loopback HTTP", "reducer share")
    print_table(headers, process_rows)
    print(f"(ratios on {args.judge_on} time; reducer share: the pure reducer's CPU / trioloop_in_process's)")
    print()
    headers = (f"K={args.k}, {len(seeds)} processes", "cpu min / median / max", "wall min / median / max", "target")
    print_table((*headers, f"min over processes ({args.judge_on})"), rows)
    if shares:
        spread = f"{min(shares):.1%} / {statistics.median(shares):.1%} / {max(shares):.1%}"
        print(f"reducer's share of an in-process iteration, min / median / max: {spread}")
    print(load_line())
    return 0
