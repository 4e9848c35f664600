"""One chat per real file: a second `trioloop chat` on the same file, through a symlink or a hard link, is refused
naming the holder, and every lock file goes when the chat that made it ends (normally, on Ctrl-C, on an error, or
refused); a killed chat's lock files stay behind and the next chat takes them over. In process, and with real
processes in a pseudo terminal."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pexpect
import pytest
import trio

from tests.http_support import ProviderHandler, serving
from tests.test_cli_autosave import COMMENT, PAYMENT, _read, add_threat, answers, interrupted
from tests.test_cli_pty import spawn
from trioloop.cli import document_lock
from trioloop.cli.chat import chat_session
from trioloop.cli.document_lock import DocumentLock, lock_folder, lock_path_for
from trioloop.providers.scripted import ScriptedProvider, ScriptStep


def files_of(*folders: Path) -> dict[str, bytes]:
    """Every file in ``folders`` (hidden ones included) with its bytes: what a refused chat must leave as it was."""
    found: dict[str, bytes] = {}
    for folder in folders:
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if path.is_file() and not path.is_symlink():
                    found[str(path)] = _read(path)
                elif path.is_symlink():
                    found[str(path)] = os.readlink(path).encode()
    return found


def lock_files(*folders: Path) -> list[str]:
    """The lock files in ``folders``: the hidden ones beside documents, and every file of the lock folder."""
    found = [p for folder in folders if folder.is_dir() for p in folder.iterdir()]
    return sorted(p.name for p in found if p.name.endswith(".trioloop-lock") or p.parent == lock_folder())


def raised(error: BaseException, kind: type[BaseException]) -> bool:
    """``error`` is a ``kind``, alone or inside the exception groups Trio's nurseries wrap it in."""
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(kind) is not None
    return isinstance(error, kind)


@pytest.fixture
def thf(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "model.thf"
    path.write_text(COMMENT + PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    return path


def symlink_to(thf: Path) -> Path:
    other = thf.parent.parent / "elsewhere"
    other.mkdir(exist_ok=True)
    link = other / "linked.thf"
    link.symlink_to(thf)
    return link


def hard_link_elsewhere(thf: Path) -> Path:
    other = thf.parent.parent / "elsewhere"
    other.mkdir(exist_ok=True)
    link = other / "same.thf"
    os.link(thf, link)
    return link


def hard_link_beside(thf: Path) -> Path:
    link = thf.with_name("also.thf")
    os.link(thf, link)
    return link


@pytest.mark.parametrize("second_name", [symlink_to, hard_link_elsewhere, hard_link_beside])
async def test_a_second_chat_through_another_name_of_the_file_is_refused_naming_the_holder(
    thf: Path, second_name: Callable[[Path], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    other = second_name(thf)
    entered, release = trio.Event(), trio.Event()

    def first_prompt(_: str) -> str:
        trio.from_thread.run_sync(entered.set)
        trio.from_thread.run(release.wait)
        raise EOFError

    async with ScriptedProvider([]) as first, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: chat_session(thf, first, "scripted-1", "ask", first_prompt, journal=None))
        await entered.wait()
        before = files_of(thf.parent, other.parent, lock_folder())
        steps = [add_threat("c1", "Through a link"), ScriptStep(text="Added.")]
        async with ScriptedProvider(steps) as provider:
            code = await chat_session(other, provider, "scripted-1", "safe", answers("add one"))
        assert files_of(thf.parent, other.parent, lock_folder()) == before  # nothing written, no lock file left
        assert not provider.requests
        release.set()
    err = capsys.readouterr().err
    assert code == 2 and f"{other} is being edited by another trioloop chat" in err
    assert f"pid {os.getpid()}" in err and f"editing {thf}" in err  # who holds it, and through which name
    assert "nothing was read or written" in err
    # Once the first chat has ended, every lock file is gone and the file is free again, by either name.
    assert lock_files(thf.parent, other.parent, lock_folder()) == []
    async with ScriptedProvider([]) as provider:
        assert await chat_session(other, provider, "scripted-1", "ask", answers(), journal=None) == 0


async def test_the_lock_is_taken_beside_the_real_file(thf: Path) -> None:
    link = symlink_to(thf)
    lock = DocumentLock(link)
    assert lock_path_for(link) == thf.with_name(".model.thf.trioloop-lock")
    assert lock.acquire() is None
    try:
        held = lock.files
        assert held[0] == thf.with_name(".model.thf.trioloop-lock") and held[1].parent == lock_folder()
        stat = os.stat(thf)
        assert held[1].name.startswith(f"{stat.st_dev}-{stat.st_ino}-")
        assert b'"pid"' in _read(held[0]) and str(link).encode() in _read(held[1])  # who holds it, and as what
        assert DocumentLock(thf).acquire() is not None
    finally:
        lock.release()
    assert not any(path.exists() for path in held)
    assert lock.files == ()


async def test_a_lock_file_removed_between_open_and_lock_is_not_held(
    thf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The holder ends (removing its files) just after a second chat opened its lock file: the second locks the file
    # it opened, sees that the path no longer names it, and locks the new file there instead: never two holders.
    first = DocumentLock(thf)
    assert first.acquire() is None
    opened: list[Path] = []

    def racing_open(path: Path) -> int:
        fd = real_open(path)
        if not opened:
            first.release()
        opened.append(path)
        return fd

    real_open = document_lock._open
    monkeypatch.setattr(document_lock, "_open", racing_open)
    second = DocumentLock(thf)
    assert second.acquire() is None
    assert opened[0] == opened[1] == lock_path_for(thf)  # opened again, after the first one was removed
    assert all(path.exists() for path in second.files)
    assert DocumentLock(thf).acquire() is not None  # the files there now are the ones held
    second.release()


async def test_a_lock_file_a_killed_chat_left_is_taken_over_and_removed(thf: Path) -> None:
    stale = lock_path_for(thf)
    stale.write_text('{"pid": 999999, "host": "gone", "since": "yesterday"}', encoding="utf-8")
    async with ScriptedProvider([ScriptStep(text="Hello.")]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "ask", answers("hi"), journal=None) == 0
    assert not stale.exists()


class Boom(Exception):
    pass


@pytest.mark.parametrize(
    ("ending", "reply"),
    [("normally", EOFError()), ("on Ctrl-C", KeyboardInterrupt()), ("on an error", Boom("the terminal broke"))],
)
async def test_every_lock_file_goes_when_the_chat_ends(thf: Path, ending: str, reply: BaseException) -> None:
    before = lock_files(lock_folder())
    seen: list[list[str]] = []
    replies: Iterator[str | BaseException] = iter(["add one", "a", reply])

    def prompt(_: str) -> str:
        seen.append(lock_files(thf.parent, lock_folder()))
        answer = next(replies)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    steps = [add_threat("c1", "Kept"), ScriptStep(text="Added.")]
    async with ScriptedProvider(steps) as provider:
        if ending == "normally":
            assert await chat_session(thf, provider, "scripted-1", "ask", prompt) == 0
        else:
            with pytest.raises(BaseException) as caught:
                await chat_session(thf, provider, "scripted-1", "ask", prompt)
            assert interrupted(caught.value) if ending == "on Ctrl-C" else raised(caught.value, Boom)
    assert ".model.thf.trioloop-lock" in seen[0]  # held while the chat ran
    assert lock_files(thf.parent) == [] and lock_files(lock_folder()) == before


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A provider that lists its models and never answers a request for a turn."""
    release = threading.Event()

    class Handler(ProviderHandler):
        def do_POST(self) -> None:
            release.wait(60)

    with serving(Handler, on_close=release.set) as port:
        yield port


def test_real_processes_ctrl_c_removes_the_lock_files_and_a_kill_leaves_them_to_the_next_chat(
    thf: Path, silent_server: int
) -> None:
    url = f"http://127.0.0.1:{silent_server}"
    chat = ("chat", str(thf), "--provider", "anthropic", "--base-url", url, "--no-session")
    before = lock_files(lock_folder())

    child = spawn(*chat, cwd=thf.parent)
    try:
        child.expect_exact("you> ")
        assert lock_files(thf.parent) == [".model.thf.trioloop-lock"]
        link = symlink_to(thf)  # a second process, through a symlink from another folder
        second = spawn("chat", str(link), "--provider", "anthropic", "--base-url", url, "--no-session", cwd=thf.parent)
        second.expect(pexpect.EOF)
        second.close()
        assert second.exitstatus == 2 and f"{link} is being edited by another trioloop chat" in second.before
        child.sendintr()  # Ctrl-C at the prompt quits
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 130, child.before
    assert lock_files(thf.parent, link.parent) == [] and lock_files(lock_folder()) == before

    child = spawn(*chat, cwd=thf.parent)
    try:
        child.expect_exact("you> ")
        child.kill(signal.SIGKILL)  # a crash: the kernel drops the locks, the files stay
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert lock_files(thf.parent) == [".model.thf.trioloop-lock"]
    assert len(lock_files(lock_folder())) == len(before) + 1

    child = spawn(*chat, cwd=thf.parent)  # the next chat takes them over, and removes them as it ends
    try:
        child.expect_exact("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert lock_files(thf.parent) == [] and lock_files(lock_folder()) == before
