"""`trioloop demo`: the scripted review session on the embedded provider (no network, no key)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio
from rich.console import Console
from rich.text import Text

from trioloop.cli.common import exit_status, interruptible, load_document, make_console, one_turn, report
from trioloop.cli.review import LinePrompt
from trioloop.cli.usage import show_turn_usage
from trioloop.cli.view import ApproveMode, TurnView
from trioloop.machine.prices import ModelPrice, lookup_price
from trioloop.providers.scripted import ScriptedProvider
from trioloop.runtime.session import Session
from trioloop.threatmodel import ThreatModel, save_thf
from trioloop.threatmodel.demo import DEMO_COMPLETE_LIMITS, DEMO_EDITS, DEMO_LIMITS, DEMO_PROMPT, DEMO_SCRIPT
from trioloop.threatmodel.session import threat_model_session

__all__ = ["DEFAULT_DEMO_FILE", "run_demo"]

_SOURCE_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "payment.thf"


_PACKAGED_EXAMPLE = Path(__file__).resolve().parents[1] / "_data" / "payment.thf"  # in a wheel install


DEFAULT_DEMO_FILE = _SOURCE_EXAMPLE if _SOURCE_EXAMPLE.exists() else _PACKAGED_EXAMPLE

# The scripted model costs nothing; the demo prices its tokens as a real model's, so its summary shows a cost.
_SONNET = lookup_price("claude-sonnet-4-5")
assert _SONNET is not None
_DEMO_PRICE = ModelPrice(
    input_per_mtok=_SONNET.input_per_mtok,
    output_per_mtok=_SONNET.output_per_mtok,
    cache_read_per_mtok=_SONNET.cache_read_per_mtok,
    cache_write_per_mtok=_SONNET.cache_write_per_mtok,
    source="the demo, at claude-sonnet-4-5's rates",
)


async def _demo(
    path: Path, mode: ApproveMode, out: Path | None, undo: bool, prompt: Callable[[str], str], show_limit: bool
) -> int:
    console = make_console()
    loaded = load_document(path)
    if isinstance(loaded, int):
        return loaded
    document = loaded.model
    limits = DEMO_LIMITS if show_limit else DEMO_COMPLETE_LIMITS
    async with (
        ScriptedProvider(DEMO_SCRIPT, wire="anthropic") as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1", limits=limits) as session,
    ):
        session.prices = {"scripted-1": _DEMO_PRICE}
        console.print(Text(f"you> {DEMO_PROMPT}", style="bold"))
        view = TurnView(console, session, mode, LinePrompt(prompt), scripted_edits=DEMO_EDITS)
        try:
            state = await one_turn(session, view, DEMO_PROMPT)
            report(console, session, state, document)
            show_turn_usage(console, session, state)
            if session.undo_availability().undoable:
                await _offer_undo(console, session, view, mode, undo, document)
        finally:
            # --out is written whatever ends the demo (Ctrl-C at the undo prompt included): the document
            # only ever holds whole, committed tool results.
            if out is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(save_thf, out, session.document, loaded)
                console.print(Text(f"Wrote {out}"))
    return exit_status(unanswered=view.input_ended)


async def _offer_undo(
    console: Console, session: Session[ThreatModel], view: TurnView, mode: ApproveMode, undo: bool, before: ThreatModel
) -> None:
    wants_undo = undo
    if mode == "ask" and not undo:
        try:
            answer = await view.lines.ask("Undo this turn? [y/N] ")
        except EOFError:  # the input ended: the turn is kept, as the default answer keeps it
            answer = ""
        wants_undo = answer.strip().lower().startswith("y")
    if wants_undo:
        session.undo_last_turn()
        same = session.document == before
        console.print(Text(f"Undone: the document is {'back to' if same else 'NOT'} its state before the turn."))
    else:
        console.print(Text("Undo is available for this turn (trioloop demo --undo shows it)."))


def run_demo(
    file: str | None,
    mode: ApproveMode,
    out: str | None,
    undo: bool,
    prompt: Callable[[str], str] = input,
    *,
    show_limit: bool = False,
) -> int:
    """Play the demo; ``show_limit`` gives the turn one model request fewer than the script needs, so it ends
    at the step limit (what a bounded turn looks like) instead of completing."""
    path = Path(file) if file else DEFAULT_DEMO_FILE
    return interruptible(_demo, path, mode, Path(out) if out else None, undo, prompt, show_limit)
