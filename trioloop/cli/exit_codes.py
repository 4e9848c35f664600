"""The exit codes of the `trioloop` command, one meaning each, shared by the parser and every subcommand.

0 success, 1 the document is invalid (for ``audit``: a journal that does not verify), 2 usage or configuration
error (a file that cannot be read, no API key, a refused base URL, a document another chat holds, a refused
``--resume``), 3 a chat turn failed (the AI provider could not be reached or answered with an error), 4 the input
ended at a review card (``trioloop chat F --prompt ... </dev/null``: the turn stopped there, nothing of the cards
ran, so a script can tell it from success), 5 ``audit`` verified nothing (the chain holds, but no public key was
there to check who wrote it), 130 interrupted, 141 the output was closed (``trioloop audit J | head
-1``: the command stops quietly, as a shell reports a process SIGPIPE ended).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_TURN_FAILED",
    "EXIT_UNANSWERED",
    "EXIT_UNVERIFIED",
    "EXIT_USAGE",
]

EXIT_OK: Final = 0
EXIT_INVALID: Final = 1
EXIT_USAGE: Final = 2
EXIT_TURN_FAILED: Final = 3
EXIT_UNANSWERED: Final = 4  # the input ended at a card: the turn stopped with cards nobody answered
EXIT_UNVERIFIED: Final = 5  # audit: the chain holds, but no public key was there to verify who wrote it
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141  # 128 + SIGPIPE
