"""What every test shares: a configuration folder of the test run's own, and a garbage collector that does not
walk what the run had before its first test.

trioloop keeps per-user files under ``$XDG_CONFIG_HOME/trioloop`` (the journal signing key made on first use,
MCP OAuth tokens). Every test, and every process a test starts, finds them in a fresh folder of this run, never
in the home of whoever runs the tests.

Once the tests are collected, what the test process holds (every module imported, every test item: some 300,000
objects) is frozen out of the collector's generations (``gc.freeze``): every full collection, automatic or a
test's own ``gc.collect()``, then walks what the tests made since, not that too. It changes what a collection costs,
never what it finds: what a test makes is collected as before. ``young_heap`` does the same again just before a
test whose code collects many times (a benchmark's rounds, a collection after every run).

``--dist loadfile`` gives each file whole to one worker, in the order the files come; left to itself, pytest-xdist
orders them by their number of tests, which puts the files of one or two long tests (the crash torture, the soak,
the benchmarks' smoke runs) last, where one of them can run alone on a worker while the other has finished.
`LONG_FILES` (most of a minute down to about ten seconds each) therefore come first, the longest first, and every
other file after them, most tests first (pyproject's addopts turn xdist's own reordering off).

Where bytecode is not to be written (``PYTHONDONTWRITEBYTECODE``, as on some CI machines), every process a test
starts (the CLI, the workers, the docs' programs: some 250 in a run) would compile every module it imports from
source again, about 0.65 s of CPU each for the CLI's imports. `pytest_configure` gives the run a bytecode cache
of its own instead (``PYTHONPYCACHEPREFIX``, a temporary folder removed when the run ends): nothing is written
beside the sources, and each module is compiled once per run.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

#: The files that take longest (roughly: a minute down to ten seconds on two cores), the longest first.
LONG_FILES = (
    "test_torture_crash.py",
    "test_snippets.py",
    "test_cli_exit_status.py",
    "test_mcp_call_cost.py",
    "test_leases.py",
    "test_mcp_toolset.py",
    "test_cli_pty.py",
    "test_fuzz_streams.py",
    "test_soak.py",
    "test_web_e2e.py",
    "test_journal_identity.py",
    "test_audit_verdicts.py",
    "test_worker.py",
    "test_journal_bench.py",
    "test_bounded_json.py",
    "test_provider_responses.py",
    "test_journal.py",
    "test_card.py",
    "test_torture_faults.py",
    "test_stores.py",
    "test_web_inbox.py",
    "test_web_browser.py",
    "test_mcp_elicitation.py",
    "test_mcp_bounds.py",
    "test_fleet_bench.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not (sys.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return  # a pytest-xdist worker (it has the run's cache from its environment), or bytecode may be written
    prefix = tempfile.mkdtemp(prefix="trioloop-test-bytecode-")
    config.add_cleanup(lambda: shutil.rmtree(prefix, ignore_errors=True))
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix  # read by every process started from now on
    sys.pycache_prefix, sys.dont_write_bytecode = prefix, False  # and by this one's imports


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`LONG_FILES` first, in their order; then every other file, most tests first; each file's tests as they
    were."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.path.name, []).append(item)
    rank = {name: n for n, name in enumerate(LONG_FILES)}
    order = sorted(files, key=lambda name: (rank.get(name, len(rank)), -len(files[name])))
    items[:] = [item for name in order for item in files[name]]


@pytest.fixture(scope="session", autouse=True)
def _own_config_home() -> Iterator[None]:
    before = os.environ.get("XDG_CONFIG_HOME")
    with tempfile.TemporaryDirectory(prefix="trioloop-config-") as folder:
        os.environ["XDG_CONFIG_HOME"] = folder
        os.environ.pop("TRIOLOOP_JOURNAL_KEY", None)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("XDG_CONFIG_HOME", None)
            else:
                os.environ["XDG_CONFIG_HOME"] = before


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()


@pytest.fixture
def young_heap() -> None:
    """What the test process holds before this test frozen out of the collector's walk, for the rest of the run
    (what the earlier tests left alive; their garbage is collected first)."""
    gc.collect()
    gc.freeze()
