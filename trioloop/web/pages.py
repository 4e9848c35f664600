"""What each page shows, as plain values for its template: the list of waiting reviews and one session's review,
every untrusted field passed through the page's `Budget` (made visible, capped, the page bounded).

Nothing here decides anything: the forms a card offers follow the card's status and the decision that holds it, and
the server checks every decision again against the journal when it arrives.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

from trioloop.web.display import Budget
from trioloop.web.inbox import Inbox, SessionReview

__all__ = ["list_context", "session_context", "session_url", "when"]

#: The most input fields and preview lines one card shows, and the most sessions one list shows.
_DETAIL_LINES: Final = 300
_LIST_ROWS: Final = 500
_RULE_LABELS: Final = {
    "approve:tool": ("tool", "Approve, and always approve this tool"),
    "approve:input": ("input", "Approve, and always approve this exact input"),
    "deny:tool": ("tool", "Deny, and always deny this tool"),
}


def session_url(session_id: str) -> str:
    """The session page's address (the id in the query: any text is a session id)."""
    return "/session?" + urllib.parse.urlencode({"id": session_id})


def when(ms: int) -> str:
    """A journal time (unix ms) for people, in UTC."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ms / 1000)) if ms else ""


async def list_context(inbox: Inbox, query: Mapping[str, str]) -> dict[str, Any]:
    """The list page's values: the reviews waiting (filtered by ``q``, ``tool``, ``kind``), newest first."""
    filters = {name: query.get(name, "")[:200] for name in ("q", "tool", "kind")}
    reviews = await inbox.reviews(session=filters["q"], tool=filters["tool"], kind=filters["kind"])
    budget = Budget()
    rows = []
    for review in reviews[:_LIST_ROWS]:
        view = review.view
        waiting = view.waiting if view else ()
        rows.append(
            {
                "session_id": review.session_id,
                "session": budget.show(review.session_id, cap=200, keep_lines=False),
                "refused": budget.show(review.refused, cap=600),
                "kind": budget.show(view.document_kind if view else "", cap=100, keep_lines=False),
                "source": budget.show(view.source if view else "", cap=200, keep_lines=False),
                "request": budget.show(view.request if view else "", cap=300, keep_lines=False),
                "waiting": len(waiting),
                "tools": budget.show(", ".join(sorted({c.tool for c in waiting})), cap=300, keep_lines=False),
                "destructive": any(c.destructive for c in waiting),
                "since": view.since_ms if view else 0,
                "suspended": bool(view and view.suspended),
                "decisions": inbox.waiting_decisions(review.session_id),
            }
        )
    return {
        "rows": rows,
        "more": max(0, len(reviews) - len(rows)),
        "filters": filters,
        "tools": inbox.tools(),
        "kinds": inbox.kinds(),
        "region": "/fragment/list?" + urllib.parse.urlencode(filters),
    }


def _card(inbox: Inbox, review: SessionReview, index: int, budget: Budget) -> dict[str, Any]:
    assert review.view is not None
    card = review.view.cards[index]
    decision = inbox.decision_on(review.session_id, review.view.turn_id, card.call_id)
    details = [
        (budget.show(path, cap=300, keep_lines=False), budget.show(value))
        for path, value in card.details[:_DETAIL_LINES]
    ]
    return {
        "index": index,
        "call_id": card.call_id,
        "tool": budget.show(card.tool, cap=200, keep_lines=False),
        "summary": budget.show(card.summary, cap=600, keep_lines=False),
        "effect": budget.show(card.effect, cap=50, keep_lines=False),
        "destructive": card.destructive,
        "details": details,
        "details_left_out": len(card.details) - len(details),
        "preview": [budget.show(line, cap=1000) for line in card.preview[:_DETAIL_LINES]],
        "asked_by": budget.show(card.asked_by, cap=300, keep_lines=False),
        "digest": card.digest,
        "status": card.status,
        "decided_by": budget.show(card.decided_by, cap=200, keep_lines=False),
        "decision": decision,
        # A card takes a decision while it waits and no posted decision holds it (a refused one frees it).
        "open": card.status == "waiting" and (decision is None or not decision.holds),
        "approve_rules": [_RULE_LABELS[o] for o in card.rule_options if o.startswith("approve:")],
        "deny_rules": [_RULE_LABELS[o] for o in card.rule_options if o.startswith("deny:")],
        "edit_text": review.inputs.get(card.call_id, ""),
    }


def _last_turn(review: SessionReview, budget: Budget) -> dict[str, Any] | None:
    """How the session's last turn stands (when no review waits), every journal text through the page's budget."""
    turn = review.last_turn
    if turn is None:
        return None
    calls = [
        {
            "tool": budget.show(call.tool, cap=200, keep_lines=False),
            "status": call.status,
            "detail": budget.show(call.detail, cap=1000),
        }
        for call in turn.calls[:_DETAIL_LINES]
    ]
    return {
        "state": turn.state,
        "outcome": budget.show(turn.outcome, cap=1000),
        "request": budget.show(turn.request),
        "model_text": budget.show(turn.model_text),
        "calls": calls,
        "calls_left_out": len(turn.calls) - len(calls),
        "at": turn.at_ms,
    }


async def session_context(inbox: Inbox, session_id: str) -> dict[str, Any]:
    """The session page's values: the review as the journal says now, each card with its posted decision."""
    review = await inbox.current(session_id)
    budget = Budget()
    context: dict[str, Any] = {
        "session_id": session_id,
        "session": budget.show(session_id, cap=300, keep_lines=False),
        "review": review,
        "refused": budget.show(review.refused, cap=1000),
        "region": "/fragment/session?" + urllib.parse.urlencode({"id": session_id}),
        "cards": [],
        "last_turn": None,
    }
    if review.view is not None:
        view = review.view
        context["kind"] = budget.show(view.document_kind, cap=100, keep_lines=False)
        context["source"] = budget.show(view.source, cap=300, keep_lines=False)
        context["request_text"] = budget.show(view.request)
        context["model_text"] = budget.show(view.model_text)
        context["cards"] = [_card(inbox, review, i, budget) for i in range(len(view.cards))]
    elif not review.refused:
        context["last_turn"] = _last_turn(review, budget)
    context["batchable"] = [c for c in context["cards"] if c["open"] and not c["destructive"]]
    context["skipped"] = budget.skipped
    return context
