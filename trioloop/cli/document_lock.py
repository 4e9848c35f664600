"""One `trioloop chat` per document: an advisory lock that names its holder.

A document is one real file however it is reached: by its own path, through a symlink, or by a hard link in any
folder. So a chat takes two exclusive locks (``flock``), each on a small file into which it writes who holds it
(pid, host, since when, and the path it was given):

- ``.NAME.trioloop-lock`` beside the real file (symlinks resolved). It stands for the path: a save replaces the
  file (a new inode), and a chat of another user on the same folder sees it too.
- ``DEVICE-INODE-HOST.lock`` in the user's lock folder (`lock_folder`), named after the file the chat found. It
  stands for the file itself, whichever of its hard links a chat was given.

A second chat finds one of them taken, says who holds it, and stops before it reads or writes anything else (the
lock file it made itself meanwhile is removed again). A chat removes its lock files when it ends, normally, on
Ctrl-C or on an error: each is unlinked while still locked, and a chat that locked a file just unlinked sees that
its path no longer names it and starts again, so two chats never hold two files of one name. The kernel drops
the locks with their process, so a killed chat leaves its files behind, and the next chat takes them over.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DocumentLock", "lock_folder", "lock_path_for"]

_TRIES = 8  # a lock file removed under us each time this often is a livelock, not a lock: give up and say so


def lock_path_for(document: Path) -> Path:
    """The lock file of ``document``'s path: hidden, beside the real file (symlinks resolved)."""
    real = Path(os.path.realpath(document))
    return real.with_name(f".{real.name}.trioloop-lock")


def lock_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where the locks of files by device and inode are: ``$XDG_CONFIG_HOME/trioloop/locks`` (``~/.config/...``)."""
    env = os.environ if environ is None else environ
    config = env.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"
    return base / "trioloop" / "locks"


class DocumentLock:
    """The exclusive right to edit ``document`` from this process, until `release`."""

    def __init__(self, document: Path, *, folder: Path | None = None) -> None:
        self.document = Path(os.path.abspath(document))
        self.path = lock_path_for(document)
        self.folder = folder if folder is not None else lock_folder()
        self._held: list[tuple[Path, int]] = []

    @property
    def files(self) -> tuple[Path, ...]:
        """The lock files this chat holds now."""
        return tuple(path for path, _ in self._held)

    def acquire(self) -> str | None:
        """Take the locks: None once both are held, else who holds the file ("pid 123 on host since 2026-12-05
        10:02 UTC, editing /home/me/model.thf"), with nothing of this chat left behind. `OSError` when a lock file
        cannot be made (a folder that does not exist, or is not writable)."""
        try:
            holder = self._take(self.path)
            if holder is None:
                by_inode = self._inode_path()
                if by_inode is not None:
                    holder = self._take(by_inode)
        except BaseException:
            self.release()
            raise
        if holder is not None:
            self.release()
        return holder

    def release(self) -> None:
        """Give the locks back and remove their files (each while still locked, so no chat holds a removed one)."""
        held, self._held = self._held, []
        for path, fd in reversed(held):
            with contextlib.suppress(OSError):
                if _names(path, fd):
                    os.unlink(path)
            os.close(fd)  # closing the last descriptor drops the lock

    def _inode_path(self) -> Path | None:
        """The lock file of the real file by device and inode; None when there is no file yet (a new ``--out``)."""
        try:
            found = os.stat(self.document)
        except OSError:
            return None
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.folder / f"{found.st_dev}-{found.st_ino}-{_host_name()}.lock"

    def _take(self, path: Path) -> str | None:
        for _ in range(_TRIES):
            fd = _open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(os.pread(fd, 4096, 0))
                os.close(fd)
                return holder
            except BaseException:
                os.close(fd)
                raise
            if not _names(path, fd):  # the chat that held it removed it as it ended: lock the one there now
                os.close(fd)
                continue
            self._held.append((path, fd))
            since = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": since,
                "path": os.path.abspath(self.document),
            }
            with contextlib.suppress(OSError):  # who holds it is for people; the lock itself is what excludes
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
            return None
        return f"another process (its lock file {path} kept being replaced)"


def _open(path: Path) -> int:
    """The lock file, made if missing; read-only when another user made it (``flock`` needs no write access)."""
    flags = os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, os.O_RDWR | flags, 0o644)
    except PermissionError:
        return os.open(path, os.O_RDONLY | flags)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` is still the file open as ``fd`` (not removed, nor replaced by another)."""
    try:
        here, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def _host_name() -> str:
    """This machine's name, as a file name may hold it: a folder shared by machines (an NFS home) keeps apart the
    files of equal devices and inodes on different machines."""
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in socket.gethostname())[:64] or "host"


def _describe(record: bytes) -> str:
    try:
        value = json.loads(record.decode("utf-8"))
        who = f"pid {int(value['pid'])} on {_printable(value['host'], 64)} since {_printable(value['since'], 32)}"
    except (ValueError, KeyError, TypeError):
        return "another process (it did not say which)"
    path = value.get("path")
    return f"{who}, editing {_printable(path, 512)}" if isinstance(path, str) else who


def _printable(value: object, cap: int) -> str:
    """A value another process wrote, as one line of plain text: no control or bidi character (none is printable),
    capped."""
    return "".join(c for c in str(value) if c.isprintable())[:cap]
