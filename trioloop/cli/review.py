"""The review prompt: the answers a card accepts (matched whole), the line reader that never loses a typed
line, and editing a call's input in the person's own editor."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeAlias

import trio

__all__ = [
    "ANSWERS",
    "DESTRUCTIVE_RULE_KEYS",
    "EDIT_KEYS",
    "HELP",
    "KEYS",
    "RULE_KEYS",
    "LinePrompt",
    "edit_in_editor",
    "editable_json",
    "parse_answer",
]

Prompt: TypeAlias = Callable[[str], str]

#: Every answer the card prompt accepts, matched whole (case-insensitive); anything else asks again. The
#: single letters cannot be taken for one another or for a word: "s" is no answer at all (it used to approve
#: every safe card; a person typing it for "stop" must not approve anything), "all" has no letter.
ANSWERS: Final[Mapping[str, str]] = {
    "a": "approve",
    "approve": "approve",
    "d": "deny",
    "deny": "deny",
    "e": "edit",
    "edit": "edit",
    "all": "safe",
    "always": "always_input",
    "always tool": "always_tool",
    "never": "never",
    "q": "stop",
    "stop": "stop",
    "?": "help",
    "help": "help",
}

#: The keys as a card shows them.
KEYS: Final = "keys: a approve · d deny · e edit · all (every safe card) · q stop · ? help"
#: The rule answers, on the line below the keys (a destructive card offers only ``never``).
RULE_KEYS: Final = "from now on: always (this input) · always tool · never (deny this tool)"
DESTRUCTIVE_RULE_KEYS: Final = "from now on: never (deny this tool)"

#: The keys of a card showing an edited input: nothing runs on it until ``a``.
EDIT_KEYS: Final = "keys: a approve the edit · e edit again · d deny · q stop · ? help"

HELP: Final = (
    "  a / approve  run this call as shown\n"
    "  d / deny     do not run it (you may give the model a reason)\n"
    "  e / edit     edit its input ($EDITOR, or a line of JSON), checked by the tool; the edited card is shown,\n"
    "               its changed fields marked, and waits for a (approve the edit), e (again) or d\n"
    "  all          approve every non-destructive card of this step, then decide each destructive one\n"
    "  always       approve, and from now on (this session) approve this tool with this very input unasked\n"
    "  always tool  approve, and from now on approve every call of this tool unasked (never a destructive one)\n"
    "  never        deny, and from now on deny every call of this tool (your reason goes to the model)\n"
    "               /rules lists the rules in effect, /forget N removes session rule N\n"
    "  q / stop     stop the turn now (nothing more runs; applied changes stay and can be undone)\n"
    "  ? / help     this help, the call's whole input (every value whole) and its preview"
)


def parse_answer(answer: str) -> str | None:
    """The action a typed answer names, or None (ask again): answers match whole, never by first letter."""
    return ANSWERS.get(answer.strip().lower())


class LinePrompt:
    """Reads answers on a worker thread, at most one at a time.

    A read that a Stop (Ctrl-C) abandons keeps its thread blocked in ``input()``; the next question
    then waits for that same read instead of starting a second one, so no typed line is lost.
    """

    def __init__(self, prompt: Prompt) -> None:
        self._prompt = prompt
        self._reading: trio.Event | None = None
        self._result: str | BaseException = ""

    async def ask(self, text: str, *, prefill: str = "") -> str:
        """The next line typed after ``text``; ``prefill`` is put on the line to edit, where the terminal's line
        editor (readline) allows it."""
        if self._reading is not None:
            print(text, end="", flush=True)
            await self._reading.wait()
        else:
            done = trio.Event()
            self._reading = done
            token = trio.lowlevel.current_trio_token()

            def read() -> None:
                try:
                    with _prefilled(prefill):
                        self._result = self._prompt(text)
                except BaseException as exc:  # EOFError and friends are re-raised in the Trio task
                    self._result = exc
                with contextlib.suppress(trio.RunFinishedError):  # the program ended while this read waited
                    trio.from_thread.run_sync(done.set, trio_token=token)

            await trio.to_thread.run_sync(read, abandon_on_cancel=True)
        self._reading = None
        result, self._result = self._result, ""
        if isinstance(result, BaseException):
            raise result
        return result


@contextlib.contextmanager
def _prefilled(text: str) -> Iterator[None]:
    """While reading one line, start it with ``text`` (readline's startup hook; nothing without readline)."""
    try:
        import readline
    except ImportError:  # no line editor (Windows, some builds): the line starts empty
        readline = None  # type: ignore[assignment]
    if not text or readline is None:
        yield
        return
    readline.set_startup_hook(lambda: readline.insert_text(text))
    try:
        yield
    finally:
        readline.set_startup_hook()


def editable_json(value: Any) -> str:
    """``value`` as indented JSON for a person to edit: every character past ASCII escaped, so no invisible
    code point (a bidi control, a zero-width space) can hide in what they read and approve."""
    return json.dumps(value, indent=2, ensure_ascii=True, sort_keys=False) + "\n"


def edit_in_editor(text: str, editor: str) -> str:
    """Open ``editor`` (a command line, as $VISUAL or $EDITOR holds it) on ``text`` and return what was saved.

    Blocking (the editor has the terminal): call it from a worker thread. Raises `OSError` when the editor
    cannot be started or exits with an error."""
    handle, name = tempfile.mkstemp(prefix="trioloop-edit-", suffix=".json")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        done = subprocess.run([*shlex.split(editor), name], check=False)
        if done.returncode != 0:
            raise OSError(f"the editor exited with status {done.returncode}")
        with open(name, encoding="utf-8") as file:
            return file.read()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
