"""The per-user key file is written whole before anyone can read it: processes (here threads) making it at the
same moment all end with the one key, none reads a half-written file, and an existing key file is never replaced."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from trioloop.durable.signing import JournalKeyError, JournalSigner, default_key_path


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


def test_the_key_file_is_read_again_whenever_it_changed(tmp_path: Path) -> None:
    """The key file read last is kept with its file's status: an open does not parse it each time, and a key file
    replaced, rewritten or opened to others is read again (and refused when it must be)."""
    import os

    environ = {"XDG_CONFIG_HOME": str(tmp_path)}
    first = JournalSigner.default(environ)
    assert JournalSigner.default(environ) is first  # unchanged: the same key, not read again
    path = default_key_path(environ)
    replacement = tmp_path / "other-key"
    JournalSigner.generate().save(replacement)
    os.replace(replacement, path)  # another file under the name
    second = JournalSigner.default(environ)
    assert second.key_id != first.key_id
    os.chmod(path, 0o644)  # readable by others: refused, not served from what was read before
    with pytest.raises(JournalKeyError, match="readable by others"):
        JournalSigner.default(environ)
    os.chmod(path, 0o600)
    assert JournalSigner.default(environ).key_id == second.key_id
    named = {"TRIOLOOP_JOURNAL_KEY": str(path)}
    assert JournalSigner.existing(named) is not None and JournalSigner.existing(named).key_id == second.key_id  # type: ignore[union-attr]
    path.unlink()
    with pytest.raises(JournalKeyError, match="could not be read"):
        JournalSigner.existing(named)
