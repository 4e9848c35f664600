"""The per-user key file is written whole before anyone can read it: processes (here threads) making it at the
same moment all end with the one key, none reads a half-written file, and an existing key file is never replaced."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from trioloop.durable.signing import JournalSigner, default_key_path


def _make_at_once(environ: dict[str, str], count: int) -> tuple[list[str], list[BaseException]]:
    found: list[str] = []
    failed: list[BaseException] = []
    start = threading.Barrier(count)

    def take() -> None:
        start.wait()
        try:
            found.append(JournalSigner.default(environ).key_id)
        except BaseException as exc:  # a half-read key file is what this looks for
            failed.append(exc)

    threads = [threading.Thread(target=take) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found, failed


def test_keys_made_at_once_are_one_key_and_never_half_read(tmp_path: Path) -> None:
    for attempt in range(5):
        environ = {"XDG_CONFIG_HOME": str(tmp_path / str(attempt)), "HOME": str(tmp_path / str(attempt))}
        found, failed = _make_at_once(environ, 12)
        assert failed == [] and len(set(found)) == 1
        path = default_key_path(environ)
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
        assert path.stat().st_mode & 0o777 == 0o600


def test_a_key_file_is_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "key"
    first = JournalSigner.generate()
    first.save(path)
    with pytest.raises(FileExistsError):
        JournalSigner.generate().save(path)
    assert JournalSigner.load(path).key_id == first.key_id
