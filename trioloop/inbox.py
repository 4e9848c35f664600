"""Reviews answered away from the process that holds the session: the signed decision, the store's decision box,
what a journal says is waiting, and what became of a decision.

A review can also travel as text (a queue, a ticket, a chat message): `Session.pending_review` exports it as a
signed `ReviewDocument` (`open_review_document` proves one), and `Session.apply_decisions` takes the decisions back
as a document of signed records (`seal_decisions`), each proven as the box's are.

A face that holds no session (the web inbox, `trioloop serve`; a chat bot; a ticket system) reads the waiting
review from the journal (`waiting_review`), and posts each reviewer's decision to the store's box as a record
signed with a key of its own (`seal_decision`, `DecisionBox.post_decision`); the process that holds the session
proves each record against its live turn and applies it as the reviewer's click, or refuses it with the reason
(`Session.take_decisions`, `TakenDecision`). The journal keeps the record, and `trioloop audit` names the reviewer
and proves the signature. (The code is in `trioloop.durable.decisions`, `trioloop.durable.decision_box`,
`trioloop.durable.review_view`, `trioloop.durable.review_document`, `trioloop.runtime.remote_review` and
`trioloop.runtime.review_exchange`.)
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
from trioloop.durable.review_document import (
    DECISIONS_DOCUMENT_VERSION,
    MAX_DECISIONS_DOCUMENT_BYTES,
    MAX_DECISIONS_PER_DOCUMENT,
    MAX_REVIEW_DOCUMENT_BYTES,
    REVIEW_DOCUMENT_VERSION,
    ReviewCard,
    ReviewDocument,
    ReviewDocumentError,
    open_review_document,
    read_decisions,
    seal_decisions,
    seal_review_document,
)
from trioloop.durable.review_view import CardView, ReviewView, waiting_review
from trioloop.runtime.remote_review import TakenDecision

__all__ = [
    "DECISIONS_DOCUMENT_VERSION",
    "DECISION_VERSION",
    "MAX_DECISIONS_DOCUMENT_BYTES",
    "MAX_DECISIONS_PER_DOCUMENT",
    "MAX_DECISION_BYTES",
    "MAX_REVIEW_DOCUMENT_BYTES",
    "REVIEW_DOCUMENT_VERSION",
    "CardView",
    "DecisionBox",
    "DecisionError",
    "PostedDecision",
    "ReviewCard",
    "ReviewDecision",
    "ReviewDocument",
    "ReviewDocumentError",
    "ReviewView",
    "TakenDecision",
    "decision_slot",
    "has_decision_box",
    "open_decision",
    "open_review_document",
    "read_decisions",
    "seal_decision",
    "seal_decisions",
    "seal_review_document",
    "waiting_review",
]
