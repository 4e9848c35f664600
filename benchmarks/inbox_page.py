"""The inbox page with many waiting reviews, served by ``trioloop serve`` in a process of its own.

    python -m benchmarks.inbox_page [--sessions 1000] [--rounds 30]

K sessions suspended in review (one journaled turn, copied and signed again under K ids) in a SQLite file; then
``trioloop serve`` on it (a separate process, over loopback HTTP); a reviewer logs in with a one-time link; this
process asks for the list page (every waiting card, newest first) ROUNDS times and a session's page as often,
interleaved. Reported: the first list (it reads and verifies every journal once), then p50 / p99 / max of the list
and of a session page, their sizes, and the machine's load. Target (issue 53): the list of 1,000 waiting cards in
under 300 ms.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from benchmarks import _load
from benchmarks._common import case_record, emit, load_line, percentile, print_table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tests.web_support import copy_session, reviewers_file, serve_process, waiting_session  # noqa: E402
from trioloop.durable.signing import JournalSigner  # noqa: E402
from trioloop.stores import SQLiteJournalStore  # noqa: E402


async def _setup(path: Path, k: int, signer: JournalSigner) -> None:
    async with SQLiteJournalStore(path, durable=False) as store:
        await waiting_session(store, "s00000", signer)
        for n in range(1, k):
            await copy_session(store, "s00000", f"s{n:05}", signer)


def _timed(client: httpx.Client, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    answer = client.get(url)
    took = (time.perf_counter() - started) * 1000
    answer.raise_for_status()
    return took, len(answer.content)


def one_case(k: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trioloop-inbox-page-") as scratch:
        folder = Path(scratch)
        signer, inbox_key = JournalSigner.generate(), folder / "inbox-key"
        JournalSigner.generate().save(inbox_key)
        (folder / "keys").write_text(f"{signer.key_id} {signer.public_key_text}\n")
        setup_began = time.monotonic()
        trio.run(_setup, folder / "j.db", k, signer)
        setup_s = time.monotonic() - setup_began
        people = reviewers_file(folder, (("ada", "Ada"),))
        served: Any
        with (
            serve_process(
                str(folder / "j.db"), people.path, folder / "keys", inbox_key, "--login-link", "ada"
            ) as served,
            httpx.Client(base_url=served.base, timeout=60) as client,
        ):
            sampler = _load.start_sampling()
            sampler.add_root(served.process.pid)
            _load.configure(processes=1, helpers=["trioloop serve"])
            link = served.links["ada"][-1]
            token = re.sub(r".*/login/link/", "", link)
            login = client.post("/login/link", data={"token": token}, headers={"origin": served.base})
            assert login.status_code == 303, login.text
            first_ms, list_bytes = _timed(client, "/")
            lists, pages = [], []
            page_bytes = 0
            for n in range(rounds):
                lists.append(_timed(client, "/")[0])
                took, page_bytes = _timed(client, f"/session?id=s{n % k:05}")
                pages.append(took)
                sampler.sample()
        lists.sort()
        pages.sort()
        return {
            "sessions": k,
            "setup_s": round(setup_s, 1),
            "first_list_ms": round(first_ms, 1),
            "list_p50_ms": round(percentile(lists, 50), 1),
            "list_p99_ms": round(percentile(lists, 99), 1),
            "list_max_ms": round(lists[-1], 1),
            "list_kb": round(list_bytes / 1024, 1),
            "page_p50_ms": round(percentile(pages, 50), 1),
            "page_p99_ms": round(percentile(pages, 99), 1),
            "page_kb": round(page_bytes / 1024, 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    rows = []
    for k in args.sessions:
        result = one_case(k, args.rounds)
        emit(case_record("inbox_page", f"K={k}", **result))
        rows.append([f"K={k}", *(result[f] for f in ("first_list_ms", "list_p50_ms", "list_p99_ms", "list_max_ms"))])
        rows[-1] += [result["list_kb"], result["page_p50_ms"], result["page_p99_ms"]]
    print("\nthe inbox's pages, trioloop serve in its own process, over loopback HTTP")
    print_table(["case", "first list ms", "list p50", "list p99", "list max", "list KiB", "page p50", "page p99"], rows)
    print(load_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
