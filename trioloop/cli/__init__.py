"""The terminal face: ``trioloop demo | chat | validate | audit``, one module per job.

`parser` builds the command line and dispatches; `chat` and `demo` drive a `Session` from the terminal;
`audit` prints a journal's trail; `view` shows a turn (streamed text, cards, status lines, the outcome);
`review` reads the person's answers; `common` holds what chat and demo share; `exit_codes` what every command
may exit with.
"""

from trioloop.cli.exit_codes import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_TURN_FAILED,
    EXIT_UNANSWERED,
    EXIT_UNVERIFIED,
    EXIT_USAGE,
)
from trioloop.cli.parser import main

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_TURN_FAILED",
    "EXIT_UNANSWERED",
    "EXIT_UNVERIFIED",
    "EXIT_USAGE",
    "main",
]
