"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never a mix or a stub.

Every file trioloop writes (documents, transcripts, session files) goes through `write_atomic`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

__all__ = ["config_folder", "write_atomic"]

# fsync on a folder is not supported everywhere (some filesystems, Windows): these mean "not here".
_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES, errno.EISDIR})
_TEMP_ATTEMPTS = 16


def config_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where trioloop keeps a user's own files (the journal key, witnessed heads, MCP sign-ins):
    ``$XDG_CONFIG_HOME/trioloop``, ``~/.config/trioloop`` when it is not set."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "trioloop"


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace the file at ``path`` with ``data`` atomically; returns the path written.

    Steps: create a new temporary file in the same folder (so the rename cannot cross filesystems;
    created with mode 0o666 minus the umask, or the mode of the file it replaces), write every byte
    (``os.write`` is unbuffered: nothing is left to flush), ``fsync`` it, rename it over the target
    (``os.replace``: atomic on POSIX and Windows), then ``fsync`` the folder where the platform
    supports it so the rename itself is durable. A symbolic link is followed: the file it points to
    is replaced and the link kept.

    What a failure leaves behind:

    * Before the rename (a full disk, an I/O error, an interrupt at any step up to and including
      ``os.replace``): the original file untouched, byte for byte (or still no file), the temporary
      file removed, and the error propagated (an `OSError` keeps its type and errno, e.g. ``ENOSPC``).
    * After the rename, when opening, ``fsync``-ing or closing the folder fails: the new content is
      in place, whole, and no temporary file is left, but a crash may still undo the rename (the
      folder's entry is not confirmed on disk). The `OSError` propagates with the same type and
      errno, its ``filename`` the target and its ``strerror`` saying just that ("... the new content
      is in place, but ..."), so nobody reads it as "nothing was written". An interrupt there
      (KeyboardInterrupt) propagates as it is, with the new content in place. A folder ``fsync``
      the platform does not support (``EINVAL``, ``ENOTSUP``, ...) is skipped silently.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"write_atomic writes bytes, got {type(data).__name__}")
    target = Path(os.path.realpath(path))
    folder = target.parent
    mode = _mode_of(target)
    fd, temp = _create_temp(folder, target.name, mode)
    try:
        try:
            view = memoryview(data).cast("B")
            while view:
                written = os.write(fd, view)
                if written <= 0:  # not expected from a regular file; never spin
                    raise OSError(errno.EIO, "write made no progress", str(temp))
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    try:
        _fsync_folder(folder)
    except OSError as error:
        raise _not_durable(error, target) from error
    return target


def _not_durable(error: OSError, target: Path) -> OSError:
    """``error`` (same type, same errno) with a message that says the new content is in place."""
    reason = error.strerror or str(error) or type(error).__name__
    message = (
        f"{reason}: the new content is in place, but syncing its folder failed, so the rename may not survive a crash"
    )
    try:
        return type(error)(error.errno, message, str(target))
    except Exception:  # an OSError subclass with another constructor
        return OSError(error.errno, message, str(target))


def _mode_of(target: Path) -> int | None:
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        return None


def _create_temp(folder: Path, name: str, mode: int | None) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMP_ATTEMPTS):
        temp = folder / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(temp, flags, 0o666 if mode is None else 0o600), temp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(folder))


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as error:
        if error.errno in _UNSUPPORTED:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in _UNSUPPORTED:
            raise
    finally:
        os.close(fd)
