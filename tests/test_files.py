"""write_atomic: the original file is byte-identical after a failure at any step, and no temp file is left."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trioloop.durable.files import write_atomic

ORIGINAL = b"version: 1\n# the user's comment\n" * 50
NEW = b"version: 2\n" * 400


def _fail_with(code: int) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise OSError(code, os.strerror(code))

    return fail


def _fail_after(real: Callable[..., Any], calls: int, error: BaseException) -> Callable[..., Any]:
    """``real`` for the first ``calls`` calls, then ``error``."""
    seen = 0

    def step(*args: Any, **kwargs: Any) -> Any:
        nonlocal seen
        seen += 1
        if seen > calls:
            raise error
        return real(*args, **kwargs)

    return step


def _folder_holds_only(path: Path) -> None:
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.fixture
def original(tmp_path: Path) -> Path:
    path = tmp_path / "model.thf"
    path.write_bytes(ORIGINAL)
    return path


def test_writes_the_bytes_and_leaves_nothing_else(original: Path) -> None:
    assert write_atomic(original, NEW) == original.resolve()
    assert original.read_bytes() == NEW
    _folder_holds_only(original)


def test_a_new_file_gets_the_umask_mode_and_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.json"
    write_atomic(fresh, b"{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    fresh.chmod(0o640)
    write_atomic(fresh, b"[]")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640 and fresh.read_bytes() == b"[]"


STEPS = [
    ("open", errno.EACCES),
    ("write", errno.ENOSPC),
    ("fsync", errno.EIO),
    ("close", errno.EIO),
    ("chmod", errno.EPERM),
    ("replace", errno.EXDEV),
]


@pytest.mark.parametrize(("step", "code"), STEPS)
def test_a_failure_at_any_step_leaves_the_original_untouched(
    original: Path, monkeypatch: pytest.MonkeyPatch, step: str, code: int
) -> None:
    real = getattr(os, step)
    if step == "close":
        # Close the descriptor for real, then report the failure (as a deferred write error would).
        def close(fd: int) -> None:
            real(fd)
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "close", close)
    else:
        monkeypatch.setattr(os, step, _fail_with(code))
    with pytest.raises(OSError) as caught:
        write_atomic(original, NEW)
    monkeypatch.undo()
    assert caught.value.errno == code
    assert original.read_bytes() == ORIGINAL
    _folder_holds_only(original)


def test_a_disk_that_fills_part_way_through_leaves_the_original_untouched(
    original: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Short writes of 64 bytes, then ENOSPC: some of the new bytes reached the temp file, none the original.
    real = os.write
    monkeypatch.setattr(
        os, "write", _fail_after(lambda fd, data: real(fd, bytes(data[:64])), 5, OSError(errno.ENOSPC, "full"))
    )
    with pytest.raises(OSError, match="full"):
        write_atomic(original, NEW)
    monkeypatch.undo()
    assert original.read_bytes() == ORIGINAL
    _folder_holds_only(original)


def test_short_writes_still_write_every_byte(original: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:7])))
    write_atomic(original, NEW)
    monkeypatch.undo()
    assert original.read_bytes() == NEW
    _folder_holds_only(original)


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_an_interrupt_mid_write_leaves_the_original_untouched(
    original: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    monkeypatch.setattr(os, step, _fail_after(getattr(os, step), 0, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_atomic(original, NEW)
    monkeypatch.undo()
    assert original.read_bytes() == ORIGINAL
    _folder_holds_only(original)


def test_a_failed_first_write_of_a_new_file_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", _fail_with(errno.EIO))
    with pytest.raises(OSError):
        write_atomic(tmp_path / "new.thf", NEW)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_an_unsupported_folder_fsync_is_skipped_and_the_file_is_written(
    original: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync
    # The first fsync is the file's; the second, the folder's, is "not supported here".
    monkeypatch.setattr(os, "fsync", _fail_after(real, 1, OSError(errno.EINVAL, "not supported")))
    write_atomic(original, NEW)
    monkeypatch.undo()
    assert original.read_bytes() == NEW


def test_a_symlink_is_followed_and_kept(tmp_path: Path, original: Path) -> None:
    link = tmp_path / "link.thf"
    link.symlink_to(original.name)
    write_atomic(link, NEW)
    assert link.is_symlink() and original.read_bytes() == NEW


def test_only_bytes_are_written(original: Path) -> None:
    with pytest.raises(TypeError):
        write_atomic(original, "text")  # type: ignore[arg-type]
    assert original.read_bytes() == ORIGINAL
