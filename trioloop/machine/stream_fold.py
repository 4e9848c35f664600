"""Folding the events of one network read before they reach the reducer.

Consecutive ``TextDelta``s become one delta with their texts joined, so a read carrying many small
deltas costs one reducer step (one state rebuild, one observer call) instead of one each. Appending
text is all a delta does, so the fold never changes what the turn decides: the property tests reduce
both sequences and compare.
"""

from __future__ import annotations

from collections.abc import Sequence

from trioloop.protocol.events import StreamEvent, TextDelta

__all__ = ["fold_text_deltas"]


def fold_text_deltas(events: Sequence[StreamEvent]) -> Sequence[StreamEvent]:
    """``events`` with every run of consecutive text deltas joined into one (``events`` itself if none is)."""
    count = len(events)
    if count < 2:
        return events
    folded: list[StreamEvent] = []
    run: list[TextDelta] = []
    for event in events:
        if type(event) is TextDelta:
            run.append(event)
            continue
        if run:
            folded.append(_joined(run))
            run = []
        folded.append(event)
    if run:
        folded.append(_joined(run))
    return folded if len(folded) < count else events


def _joined(run: list[TextDelta]) -> TextDelta:
    return run[0] if len(run) == 1 else TextDelta(text="".join(delta.text for delta in run))
