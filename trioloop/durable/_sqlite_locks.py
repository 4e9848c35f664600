"""The process locks of SQLite leases: a one-byte POSIX lock (``fcntl.lockf``) per lease on the sidecar file
``<database>.lock``, at an offset taken from the sha256 of the session id and the epoch, and a registry in this
process, because POSIX locks never exclude two holders in one process.

The kernel drops a lock when its process dies, so a killed driver leaves its session free at once. Closing *any*
descriptor of a file drops all of the process's POSIX locks on it, so the registry keeps one descriptor per lock
file, shared by every store in the process, and closes it only when no lease on that file is left. Every function
here blocks (a worker thread calls it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import sqlite3
import threading
from collections.abc import Iterator

import attrs

__all__ = ["lease_row", "lock_offset", "try_lock", "unlock"]


def lock_offset(session_id: str, epoch: int) -> int:
    """The byte epoch ``epoch`` of a lease on ``session_id`` locks: 62 bits of a sha256, so offset + 1 still fits
    an off_t."""
    named = f"{session_id}\x00{epoch}".encode()
    return int.from_bytes(hashlib.sha256(named).digest()[:8], "big") >> 2


@attrs.define
class _LockFile:
    fds: list[int]  # the first locks; any other was opened on the same file by a race and must stay open too
    held: dict[int, str]  # offset -> session id, for the leases this process holds on the file


_registry_guard = threading.Lock()
_lock_files: dict[tuple[int, int], _LockFile] = {}


def try_lock(lock_path: str, session_id: str, offset: int) -> tuple[int, int] | None:
    """Take the lease's byte if no lease here or elsewhere holds it (a worker thread): the lock file's key."""
    with _registry_guard:
        key: tuple[int, int] | None = None
        with contextlib.suppress(FileNotFoundError):
            found = os.stat(lock_path)
            key = (found.st_dev, found.st_ino)
        entry = _lock_files.get(key) if key is not None else None
        if entry is None:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            opened = os.fstat(fd)
            key = (opened.st_dev, opened.st_ino)
            entry = _lock_files.get(key)
            if entry is None:
                entry = _lock_files[key] = _LockFile(fds=[fd], held={})
            else:
                entry.fds.append(fd)
        assert key is not None
        if offset in entry.held:
            return None
        try:
            fcntl.lockf(entry.fds[0], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset, os.SEEK_SET)
        except OSError as exc:
            if not entry.held:
                _close_lock_file(key, entry)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return None
            raise
        entry.held[offset] = session_id
        return key


def unlock(key: tuple[int, int], offset: int) -> None:
    """Give the lease's byte back (a worker thread); the descriptor closes with the last lease on the file."""
    with _registry_guard:
        entry = _lock_files.get(key)
        if entry is None or entry.held.pop(offset, None) is None:
            return
        with contextlib.suppress(OSError):
            fcntl.lockf(entry.fds[0], fcntl.LOCK_UN, 1, offset, os.SEEK_SET)
        if not entry.held:
            _close_lock_file(key, entry)


def _close_lock_file(key: tuple[int, int], entry: _LockFile) -> None:
    del _lock_files[key]
    for fd in entry.fds:
        with contextlib.suppress(OSError):
            os.close(fd)


@contextlib.contextmanager
def lease_row(connection: sqlite3.Connection, durable: bool) -> Iterator[None]:
    """A lease's row written without its own fsync (``synchronous=NORMAL`` for its statements): in WAL mode the next
    synced commit (the session's first append, which needs the lease anyway) puts it on disk with it, and a machine
    that loses power before that has no holder left to fence. A claim and a release each cost a synced transaction
    before, about as much CPU as an append."""
    if not durable:
        yield
        return
    connection.execute("PRAGMA synchronous=NORMAL")
    try:
        yield
    finally:
        connection.execute("PRAGMA synchronous=FULL")
