"""A real, throwaway PostgreSQL server for the store tests: ``postgres_url``, a session-scoped fixture.

It finds ``initdb``/``pg_ctl`` (PATH, then /usr/lib/postgresql/*/bin), makes a cluster in a temporary
directory, starts it on 127.0.0.1 at a free port (fsync off: nothing here must survive the machine), creates a
database and yields its URL; at the end it stops the server (``-m immediate``) and removes the directory.
initdb refuses root, so as root the server commands run as the unprivileged ``postgres`` user.

Without the binaries the tests that need the server are skipped, unless ``TRIOLOOP_REQUIRE_POSTGRES=1``
(CI sets it), which makes that a failure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["find_postgres_bin", "postgres_url", "running_postgres"]

DATABASE = "trioloop_test"


def find_postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None."""
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _as_server_user() -> tuple[list[str], str | None]:
    """The command prefix that runs a server command unprivileged, and the user it runs as (None: us)."""
    if os.geteuid() != 0:
        return [], None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail("running as root, and there is no 'postgres' user to run the PostgreSQL server as")
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--"], "postgres"
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"], "postgres"


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    bindir = find_postgres_bin()
    if bindir is None:
        reason = "no PostgreSQL server binaries (initdb, pg_ctl on PATH or in /usr/lib/postgresql/*/bin)"
        if os.environ.get("TRIOLOOP_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"TRIOLOOP_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(f"{reason}; install PostgreSQL or set TRIOLOOP_REQUIRE_POSTGRES=1 to make this a failure")
    with running_postgres(bindir) as url:
        yield url


@contextlib.contextmanager
def running_postgres(bindir: Path, options: str = "") -> Iterator[str]:
    """A throwaway server from the binaries in ``bindir``, for as long as the block runs: its database's URL.
    ``options``: more ``-c name=value`` settings for the server (a benchmark's ``-c fsync=on``, say)."""
    prefix, user = _as_server_user()
    root = Path(tempfile.mkdtemp(prefix="trioloop-pg-"))
    data = root / "data"
    if user is not None:
        shutil.chown(root, user=user, group=user)
    pg_ctl = [*prefix, str(bindir / "pg_ctl"), "-D", str(data)]
    started = False
    try:
        initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        _run([*prefix, *initdb, "--no-locale", "--no-sync"], "initdb")
        port = _free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c full_page_writes=off {options}"
        _run([*pg_ctl, "-l", str(root / "server.log"), "-o", options, "-w", "-t", "60", "start"], "pg_ctl start")
        started = True
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DATABASE}")
        yield f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}"
    finally:
        if started:
            subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True, check=False, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
