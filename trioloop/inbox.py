"""Reviews answered away from the process that holds the session: the signed decision, the store's decision box,
what a journal says is waiting, and what became of a decision.

A face that holds no session (the web inbox, `trioloop serve`; a chat bot; a ticket system) reads the waiting
review from the journal (`waiting_review`), and posts each reviewer's decision to the store's box as a record
signed with a key of its own (`seal_decision`, `DecisionBox.post_decision`); the process that holds the session
proves each record against its live turn and applies it as the reviewer's click, or refuses it with the reason
(`Session.take_decisions`, `TakenDecision`). The journal keeps the record, and `trioloop audit` names the reviewer
and proves the signature. (The code is in `trioloop.durable.decisions`, `trioloop.durable.decision_box`,
`trioloop.durable.review_view` and `trioloop.runtime.remote_review`.)
"""

from trioloop.durable.decision_box import DecisionBox, has_decision_box
from trioloop.durable.decisions import (
    DECISION_VERSION,
    MAX_DECISION_BYTES,
    DecisionError,
    PostedDecision,
    ReviewDecision,
    decision_slot,
    open_decision,
    seal_decision,
)
from trioloop.durable.review_view import CardView, ReviewView, waiting_review
from trioloop.runtime.remote_review import TakenDecision

__all__ = [
    "DECISION_VERSION",
    "MAX_DECISION_BYTES",
    "CardView",
    "DecisionBox",
    "DecisionError",
    "PostedDecision",
    "ReviewDecision",
    "ReviewView",
    "TakenDecision",
    "decision_slot",
    "has_decision_box",
    "open_decision",
    "seal_decision",
    "waiting_review",
]
