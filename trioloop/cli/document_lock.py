"""One `trioloop chat` per document: an advisory lock that names its holder.

A chat takes an exclusive lock (``flock``) on a small hidden file beside the document it writes,
``.NAME.trioloop-lock``, and writes into it who holds it (pid, host, since when). A second chat on the same
document finds the lock taken, reads who holds it, and stops before it reads or writes anything else. The
kernel drops the lock with its process, killed or not. The lock file is left in place (empty) when the chat
ends: removing it would let two later chats lock two different files of the same name.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

__all__ = ["DocumentLock", "lock_path_for"]


def lock_path_for(document: Path) -> Path:
    """The lock file of ``document``: hidden, beside it."""
    return document.with_name(f".{document.name}.trioloop-lock")


class DocumentLock:
    """The exclusive right to edit ``document`` from this process, until `release`."""

    def __init__(self, document: Path) -> None:
        self.path = lock_path_for(document)
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock: None once held, else who holds it ("pid 123 on host since 2026-12-05 10:02 UTC")."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            return holder
        except BaseException:
            os.close(fd)
            raise
        since = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}).encode("utf-8")
        with contextlib.suppress(OSError):  # who holds it is for people; the lock itself is what excludes
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        self._fd = fd
        return None

    def release(self) -> None:
        """Give the lock back (emptying the holder's name first)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor drops the lock


def _describe(record: bytes) -> str:
    try:
        value = json.loads(record.decode("utf-8"))
        return f"pid {int(value['pid'])} on {str(value['host'])[:64]} since {str(value['since'])[:32]}"
    except (ValueError, KeyError, TypeError):
        return "another process (it did not say which)"
