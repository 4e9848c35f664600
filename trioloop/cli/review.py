"""The review prompt: the answers a card accepts, matched whole, and the line reader that never loses a typed line."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Final, TypeAlias

import trio

__all__ = ["ANSWERS", "HELP", "LinePrompt", "parse_answer"]

Prompt: TypeAlias = Callable[[str], str]

#: Every answer the card prompt accepts, matched whole (case-insensitive); anything else asks again.
ANSWERS: Final[Mapping[str, str]] = {
    "a": "approve",
    "approve": "approve",
    "d": "deny",
    "deny": "deny",
    "s": "safe",
    "safe": "safe",
    "t": "stop",
    "stop": "stop",
    "e": "edit",
    "edit": "edit",
    "?": "help",
    "help": "help",
}


HELP: Final = (
    "  a / approve  run this call as shown\n"
    "  d / deny     do not run it (you may give the model a reason)\n"
    "  s / safe     approve every non-destructive card of this step, then decide each destructive one\n"
    "  t / stop     stop the turn now (nothing more runs; applied changes stay and can be undone)\n"
    "  e / edit     approve it with an edited input (a JSON object), checked by the tool first\n"
    "  ? / help     this help, the call's whole input and its preview"
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

    async def ask(self, text: str) -> str:
        if self._reading is not None:
            print(text, end="", flush=True)
            await self._reading.wait()
        else:
            done = trio.Event()
            self._reading = done
            token = trio.lowlevel.current_trio_token()

            def read() -> None:
                try:
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
