"""The exit codes of the `trioloop` command, one meaning each, shared by the parser and every subcommand.

0 success, 1 the document is invalid (for ``audit``: a journal that does not verify), 2 usage or configuration
error (a file that cannot be read, no API key, a refused base URL), 3 a chat turn failed (the AI provider could
not be reached or answered with an error), 130 interrupted, 141 the output was closed (``trioloop audit J | head
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
    "EXIT_USAGE",
]

EXIT_OK: Final = 0
EXIT_INVALID: Final = 1
EXIT_USAGE: Final = 2
EXIT_TURN_FAILED: Final = 3
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141  # 128 + SIGPIPE
