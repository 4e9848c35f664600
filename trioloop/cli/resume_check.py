"""A resumed chat belongs to its file: `trioloop chat FILE --resume J` goes on only when FILE holds J's document.

J (a journal or a session file) records its document: the kind, the file it was started on (``source``), and
every committed document. The file the chat will write (FILE, or ``--out``) must hold the document J last
committed, or the one before J's latest change: the chat stopped between committing a change and saving it
(killed, say), and the change is saved now. Anything else is another document, or this one changed outside
the chat: the chat stops before it writes anything and says what differs and how to go on. A ``--out`` file
that does not exist yet is a new home for J's document, and always fine.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.text import Text

from trioloop.cli.common import Saver, error, load_document
from trioloop.machine.transaction import DocumentMatch
from trioloop.runtime.session import Session
from trioloop.threatmodel import ThfFile, ThreatModel

__all__ = ["check_resumed"]


def check_resumed(
    session: Session[ThreatModel],
    path: Path,
    loaded: ThfFile,
    out: Path | None,
    resumed: Path,
    saver: Saver,
    console: Console,
) -> bool:
    """Whether the chat on ``path`` (read as ``loaded``; written to ``out`` when given) may go on with ``session``,
    resumed from ``resumed``; says why not (on stderr) when it may not. When it may, the session's source becomes
    the file written, and a file one change behind is brought up to date at once."""
    target = out or path
    here = str(target.resolve())
    recorded = session.source
    if out is not None and out.resolve() != path.resolve() and not out.exists():
        session.source = here
        return True
    on_disk = loaded if target == path else load_document(target)
    if isinstance(on_disk, int):
        return False
    match = session.match_document(on_disk.model)
    if match is DocumentMatch.OTHER:
        if recorded is not None and recorded != here:
            what = f"{resumed} is the chat of {recorded}, not of {target}"
        else:
            what = f"{target} is not the document {resumed} last committed: it changed outside the chat"
        error(
            f"error: {what}; nothing was written.\n"
            f"  To continue that chat into a new file: trioloop chat {path} --resume {resumed} --out NEW.thf\n"
            f"  To start a new chat on {target} as it is: trioloop chat {target}"
        )
        return False
    if recorded is not None and recorded != here:
        console.print(Text(f"This chat was started on {recorded}; it goes on in {target}.", style="dim"))
    session.source = here
    if match is DocumentMatch.BEHIND:
        console.print(
            Text(
                f"{target} is one change behind {resumed} (the chat stopped before saving it); "
                "saving the chat's document now.",
                style="bold",
            )
        )
        saver.save(session.document)
    return True
