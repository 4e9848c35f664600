"""Coverage-guided fuzzing of the SSE framer and both stream mappers with atheris.

Run ``python tests/fuzz/fuzz_streams.py [atheris/libFuzzer options]`` with atheris installed
(``pip install atheris``); each input picks a wire, a body and the points where the body is split,
and `torture_support.check_stream` asserts the stream contract (it raises on any violation, which
atheris reports as a crash). Without a corpus directory argument it starts from the fixtures in a
scratch directory. ``--smoke N`` runs N mutated fixtures without atheris, as a self-test.
This file is not a pytest module (its name does not start with ``test_``).
"""

from __future__ import annotations

import itertools
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for torture_support

from torture_support import FIXTURES, check_stream

from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireFormat
from trioloop.providers.openai import OPENAI_WIRE
from trioloop.providers.openai_responses import RESPONSES_WIRE

WIRES: tuple[WireFormat, ...] = (ANTHROPIC_WIRE, OPENAI_WIRE, RESPONSES_WIRE)


def one_input(data: bytes) -> None:
    """The fuzz target: byte 0 picks the wire, bytes 1-4 the split points, the rest is the body."""
    if len(data) < 5:
        return
    wire = WIRES[data[0] % len(WIRES)]
    body = data[5:]
    cuts = sorted({(b * len(body)) // 255 for b in data[1:5]})
    bounds = [0, *cuts, len(body)]
    check_stream(wire, [body[a:b] for a, b in itertools.pairwise(bounds)])


def seeds() -> list[bytes]:
    """The recorded fixtures, framed as inputs: a starting corpus for the fuzzer."""
    found = []
    for index, wire in enumerate(("anthropic", "openai")):
        for path in sorted((FIXTURES / wire).glob("*.sse")):
            found.append(bytes([index, 60, 120, 180, 240]) + path.read_bytes())
    return found


def smoke(runs: int) -> None:
    generator = random.Random(0)
    corpus = seeds()
    for _ in range(runs):
        data = bytearray(generator.choice(corpus))
        for _ in range(generator.randint(0, 8)):
            at = generator.randrange(len(data))
            data[at] = generator.randrange(256)
        one_input(bytes(data))
    print(f"smoke: {runs} inputs held")


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--smoke":
        smoke(int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
        return
    try:
        import atheris  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        print("atheris is not installed: pip install atheris (or run with --smoke N)", file=sys.stderr)
        raise SystemExit(2) from None
    argv = list(sys.argv)
    if not any(not a.startswith("-") for a in argv[1:]):
        # No corpus directory given: start from the fixtures in a scratch directory, not in the repo.
        corpus = Path(tempfile.mkdtemp(prefix="trioloop-fuzz-"))
        for number, seed in enumerate(seeds()):
            (corpus / f"seed-{number:03d}").write_bytes(seed)
        argv.append(str(corpus))
    if hasattr(atheris, "instrument_all"):
        atheris.instrument_all()  # coverage feedback from the already imported decoder and mappers
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
