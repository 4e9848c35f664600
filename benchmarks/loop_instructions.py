"""Instructions per loop iteration, counted by callgrind: a figure that load on a shared machine cannot move.

Run ``python -m benchmarks.loop_instructions`` (``--against DIR`` counts another checkout too, e.g. one made with
``git worktree add /tmp/old HEAD~5`` or ``git archive``, and prints the ratio). Each count runs the in-process
contenders of `benchmarks.loop` (K = 8 iterations a turn; a plain ``def`` read tool, and an ``async def`` one)
under ``valgrind --tool=callgrind``, once for ``--few`` turns and once for ``--many``; the difference divided by the
iterations between them is what one iteration costs, with start-up and imports subtracted. The same tree, inputs
and ``PYTHONHASHSEED`` give the same count whatever else the machine runs, so two trees can be compared on a busy
machine where `benchmarks.loop`'s CPU times move by a third between rounds. An instruction count is not a time
(a cache miss costs more than an add): it answers "does this change make the loop do more work", not "how fast".
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks._common import case_record, emit, print_table

#: The in-process contenders counted: their names in `benchmarks.loop`'s table.
CONTENDERS = {"plain": "trioloop_in_process", "async": "trioloop_in_process_async_tool"}

_RUN = """
import sys, trio
from benchmarks import loop
from benchmarks._common import PAYMENT_THF
from trioloop.threatmodel import load_thf
document = load_thf(PAYMENT_THF)
run = {"plain": loop.trioloop_in_process, "async": loop.trioloop_in_process_async_tool}[sys.argv[1]]
trio.run(run, document, 2)  # warm-up: first-call caches
trio.run(run, document, int(sys.argv[2]))
"""


def count(tree: Path, contender: str, turns: int) -> int:
    """Instructions callgrind counts for ``turns`` turns of ``contender`` run from ``tree``."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", _RUN]
        subprocess.run([*command, contender, str(turns)], cwd=tree, env=env, capture_output=True, check=True)
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no total")


def per_iteration(tree: Path, contender: str, few: int, many: int) -> float:
    from benchmarks.loop import K

    return (count(tree, contender, many) - count(tree, contender, few)) / ((many - few) * K)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--against", type=Path, help="another checkout to count beside this one")
    parser.add_argument("--few", type=int, default=5, help="turns of the short run (default 5)")
    parser.add_argument("--many", type=int, default=45, help="turns of the long run (default 45)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    here = Path(__file__).resolve().parent.parent
    trees = {"this tree": here} | ({"against": args.against.resolve()} if args.against else {})
    rows = []
    for name, contender in CONTENDERS.items():
        counted = {label: per_iteration(tree, name, args.few, args.many) for label, tree in trees.items()}
        ratio = counted["this tree"] / counted["against"] if "against" in counted else None
        emit(
            case_record(
                "loop_instructions",
                contender,
                instructions_per_iteration=round(counted["this tree"]),
                **({"against": str(args.against), "against_per_iteration": round(counted["against"])} if ratio else {}),
                **({"ratio": round(ratio, 4)} if ratio else {}),
            )
        )
        rows.append((contender, *(f"{round(v):,}" for v in counted.values()), "" if ratio is None else f"{ratio:.4f}"))
    print()
    print_table(("instructions per iteration, K=8", *trees, "this / against"), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
