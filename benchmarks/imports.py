"""What importing trioloop costs, and what its command line costs before it does anything.

Run ``python -m benchmarks.imports``. Each case is a fresh interpreter; its CPU time (user + system, read from
``getrusage(RUSAGE_CHILDREN)`` around the one child) is the figure. The cases run interleaved, in a shuffled
order each round, so a slow stretch of the machine hits them all alike; the table gives the median of
``--rounds`` (default 15). Compiled bytecode is allowed (``PYTHONDONTWRITEBYTECODE`` is removed from the
children's environment) and one warm-up round writes it first, as any installed package has it.

* ``python -c pass``: the interpreter's own start, the floor under every case;
* ``baseline``: ``import trio, httpx, attrs, cattrs``, the libraries trioloop is built on;
* ``import trioloop``: the package itself (every public name loads on first use);
* ``from trioloop import Session``: the core an app uses (machine, durable layer, Trio runtime);
* ``from trioloop import threat_model_session``: the core plus the threat-model domain (YAML included);
* ``trioloop --version`` and ``trioloop --help``: the console script.

Targets (issue 38): ``import trioloop`` at most 1.3x the baseline; ``--version`` and ``--help`` under 150 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence

from benchmarks._common import case_record, emit, print_table

_PYTHON = sys.executable
_SCRIPT = shutil.which("trioloop", path=os.path.dirname(_PYTHON)) or shutil.which("trioloop")


def _cases() -> dict[str, list[str]]:
    cases = {
        "python -c pass": [_PYTHON, "-c", "pass"],
        "baseline (trio, httpx, attrs, cattrs)": [_PYTHON, "-c", "import trio, httpx, attrs, cattrs"],
        "import trioloop": [_PYTHON, "-c", "import trioloop"],
        "from trioloop import Session": [_PYTHON, "-c", "from trioloop import Session"],
        "from trioloop import threat_model_session": [_PYTHON, "-c", "from trioloop import threat_model_session"],
    }
    script = [_SCRIPT] if _SCRIPT else [_PYTHON, "-m", "trioloop"]
    cases["trioloop --version"] = [*script, "--version"]
    cases["trioloop --help"] = [*script, "--help"]
    return cases


def _cpu_of(command: Sequence[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) the child running ``command`` used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(rounds: int, seed: int) -> dict[str, list[float]]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    cases = _cases()
    for command in cases.values():  # warm-up: bytecode written, file caches filled
        _cpu_of(command, env)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    shuffle = random.Random(seed).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            samples[name].append(_cpu_of(cases[name], env))
    return samples


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=38)
    args = parser.parse_args(argv)
    samples = measure(args.rounds, args.seed)
    medians = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    baseline = medians["baseline (trio, httpx, attrs, cattrs)"]
    for name, values in samples.items():
        emit(
            case_record(
                "imports",
                name,
                cpu_ms_median=round(medians[name], 1),
                cpu_ms_min=round(min(values) * 1000, 1),
                cpu_ms_max=round(max(values) * 1000, 1),
                vs_baseline=round(medians[name] / baseline, 2),
                rounds=args.rounds,
            )
        )
    print()
    print_table(
        ["case", "CPU ms (median)", "min", "max", "x baseline"],
        [
            [
                name,
                f"{medians[name]:.1f}",
                f"{min(v) * 1000:.1f}",
                f"{max(v) * 1000:.1f}",
                f"{medians[name] / baseline:.2f}",
            ]
            for name, v in samples.items()
        ],
    )
    print()
    ratio = medians["import trioloop"] / baseline
    checks = [
        ("import trioloop <= 1.3x baseline", f"{ratio:.2f}x", ratio <= 1.3),
        ("trioloop --version < 150 ms", f"{medians['trioloop --version']:.1f} ms", medians["trioloop --version"] < 150),
        ("trioloop --help < 150 ms", f"{medians['trioloop --help']:.1f} ms", medians["trioloop --help"] < 150),
    ]
    print_table(["target", "measured", "met"], [[name, value, "yes" if ok else "NO"] for name, value, ok in checks])


if __name__ == "__main__":
    main()
