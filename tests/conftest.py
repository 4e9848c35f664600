"""What every test shares: a configuration folder of the test run's own.

trioloop keeps per-user files under ``$XDG_CONFIG_HOME/trioloop`` (the journal signing key made on first use,
MCP OAuth tokens). Every test, and every process a test starts, finds them in a fresh folder of this run, never
in the home of whoever runs the tests.
"""

from __future__ import annotations

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
