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
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Iterator

import pytest


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
