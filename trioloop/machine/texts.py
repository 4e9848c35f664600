"""What the turn reducer tells the model and the user about each call it refuses or ends.

Every text a call record carries goes back to the model as that call's tool result, so each one
says what happened and what to do next; text the model chose is escaped and capped before it is
echoed, so it cannot hide characters or grow without bound.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Final

from trioloop.machine.calls import Violation
from trioloop.machine.tools import PrepareFailure
from trioloop.machine.untrusted_text import quote_untrusted
from trioloop.protocol.events import StreamError, retry_label

__all__ = [
    "ANSWER_TAKEN_TEXT",
    "DECLINED_TEXT",
    "DUPLICATE_NOTICE",
    "HOP_SUFFIX",
    "INTERRUPTED_TEXT",
    "LIMIT_NOTICE",
    "LIMIT_TEXT",
    "NOT_RUN_TEXT",
    "NOT_TEXT_RESULT",
    "REPLAY_TEXT",
    "answer_bound_notice",
    "answer_not_alone_text",
    "answer_nudge_text",
    "declined_text",
    "duplicate_call_text",
    "echo",
    "edited_text",
    "extra_answer_text",
    "invalid_answer_text",
    "invalid_edit_text",
    "invalid_input_text",
    "not_authorized_text",
    "retry_notice",
    "revoked_text",
    "unchecked_answer_text",
    "unknown_tool_text",
    "unreadable_input_notice",
    "unreadable_input_text",
]

_ECHO_MAX = 80


def echo(name: str) -> str:
    """A model-chosen name, quoted with every invisible or non-ASCII code point escaped and capped,
    so look-alike names are visibly different in the result and in any UI."""
    cut = name if len(name) <= _ECHO_MAX else name[: _ECHO_MAX - 1] + "…"
    return json.dumps(cut, ensure_ascii=True)


def unknown_tool_text(name: str) -> str:
    return f"unknown tool {echo(name)}: no tool has exactly this name, so nothing was run."


_ISSUE_MAX = 200
_ISSUES_MAX = 12
# Control, format (bidi, zero-width), surrogate, private-use, unassigned and line/paragraph separators.
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _visible(text: str, cap: int) -> str:
    """``text`` with every invisible code point spelled as an escape, capped at ``cap`` characters.

    Issue paths can embed keys the model chose; they go back to the model and into the history,
    so they must be bounded and must not carry terminal escapes or bidi overrides.
    """
    out = []
    for char in text[: cap + 1]:
        if unicodedata.category(char) in _INVISIBLE:
            code = ord(char)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(char)
    shown = "".join(out)
    return shown if len(shown) <= cap else shown[: cap - 1] + "…"


def invalid_input_text(name: str, failure: PrepareFailure) -> str:
    shown = [_visible(issue, _ISSUE_MAX) for issue in failure.issues[:_ISSUES_MAX]]
    if len(failure.issues) > _ISSUES_MAX:
        shown.append(f"and {len(failure.issues) - _ISSUES_MAX} more")
    issues = "; ".join(shown)
    return f"The input for {echo(name)} was not valid, so nothing was run. Fix these and call it again: {issues}"


LIMIT_TEXT: Final = "Not run: this turn reached its tool-call limit, so this call was refused."
LIMIT_NOTICE: Final = "The model asked for more tool calls than this turn allows; the extra calls were not run."
DECLINED_TEXT: Final = "The user declined this action. Do not retry it in this turn."
#: The most of a user's reason for a denial the model receives, in code points.
DENY_REASON_MAX: Final = 500


def declined_text(reason: str) -> str:
    """The result of a call the user declined, quoting their reason (if any) as their own words.

    The reason is stripped of control and bidi code points, capped, escaped (so it cannot spell an
    untrusted-data marker) and JSON-quoted (so it cannot end the quotation and speak for the system).
    """
    if not reason.strip():
        return DECLINED_TEXT
    return f"{DECLINED_TEXT} The user gave this reason, in their own words: {quote_untrusted(reason, DENY_REASON_MAX)}"


_EDIT_VALUE_MAX: Final = 200


def invalid_edit_text(name: str, failure: PrepareFailure) -> str:
    """The notice for an edit that ``prepare`` refused: nothing was approved, the call still waits."""
    shown = "; ".join(_visible(issue, _ISSUE_MAX) for issue in failure.issues[:_ISSUES_MAX])
    return f"Your edit of the {echo(name)} call was not valid, so nothing was approved and it still waits: {shown}"


def edited_text(edits: tuple[tuple[str, str | None, str | None], ...]) -> str:
    """What the model is told about a call the user edited before approving: every changed field, old -> new.

    The history still holds the input the model sent; this line keeps the conversation truthful.
    """

    def shown(value: str | None) -> str:
        return "(absent)" if value is None else quote_untrusted(value, _EDIT_VALUE_MAX)

    changes = "; ".join(
        f"{quote_untrusted(path, _EDIT_VALUE_MAX)}: {shown(old)} -> {shown(new)}" for path, old, new in edits
    )
    return f"The user edited this call's input before approving it, so it ran with these changes: {changes}."


REPLAY_TEXT: Final = "Not run: the user already declined an identical action in this turn. Do not retry it."
NOT_RUN_TEXT: Final = "Not run: the turn ended before this call could run."
INTERRUPTED_TEXT: Final = "Not run to completion: the turn ended while this call was running; its result was discarded."


NOT_TEXT_RESULT: Final = "The tool returned a result that is not text, so the call failed and its result was discarded."


def revoked_text(name: str) -> str:
    """The result of a call whose tool changed between the review card and the run (a resumed session)."""
    return (
        f"Not run: the {echo(name)} tool changed after this call was shown for review, so the review no longer "
        "matches what would run. Call it again if it is still needed."
    )


def not_authorized_text(violation: Violation) -> str:
    return f"not authorized: {violation.value}"


DUPLICATE_NOTICE: Final = (
    "The model sent two tool calls with the same id in one message; the second was answered with an error and not run."
)


def duplicate_call_text(server_id: str) -> str:
    return (
        f"Not run: this call reused the id {echo(server_id)} of another call in the same message, so it was "
        "refused. Call it again if it is still needed."
    )


def unreadable_input_text(name: str, error: str) -> str:
    """The result of a call whose arguments could not be read (not JSON, or cut off mid-stream)."""
    return (
        f"The arguments of this {echo(name)} call could not be read ({_visible(error, _ISSUE_MAX)}), so nothing "
        "was run. Call it again with its arguments as one JSON object."
    )


def unreadable_input_notice(name: str) -> str:
    return f"A {echo(name)} call arrived with arguments that could not be read; the model was told and nothing ran."


#: How a retry notice ends when the retry goes to the next provider of a fallback list, at once.
HOP_SUFFIX: Final = " on the next provider"


def retry_notice(failure: StreamError | None, used: int, allowed: int, wait_ms: int) -> str:
    """E.g. ``HTTP 529, retry 1 of 3 in 0.5 s``: the one retry counter a turn has, as the person sees it. A failure
    of a fallback list's provider is named (``primary: HTTP 529, retry 1 of 3 in 0 s on the next provider``)."""
    label = "The AI request failed" if failure is None else _visible(retry_label(failure), _ISSUE_MAX)
    if failure is None or not failure.provider:
        return f"{label}, retry {used} of {allowed} in {wait_ms / 1000:g} s"
    # A provider of a fallback list failed: named, and a hop to the next one is at once (no wait).
    name = _visible(failure.provider, _ISSUE_MAX)
    hop = HOP_SUFFIX if wait_ms == 0 else ""
    return f"{name}: {label}, retry {used} of {allowed} in {wait_ms / 1000:g} s{hop}"


RULE_DENIED_TEXT: Final = "Not run: the user's approval rules do not allow this call. Do not retry it in this turn."


def rule_denied_text(label: str, reason: str) -> str:
    """The result of a call a rule (or a ``needs_approval`` function) denied: which one, and its reason quoted
    as the person's own words are (fenced, capped, so it cannot speak for the system)."""
    text = f"{RULE_DENIED_TEXT} ({_visible(label, _ISSUE_MAX)})"
    if not reason.strip():
        return text
    return f"{text} The rule gives this reason, in the user's words: {quote_untrusted(reason, DENY_REASON_MAX)}"


def code_verdict_notice(function: str, problem: str) -> str:
    """What the person reads when a ``needs_approval`` function failed: the call is shown on a card instead."""
    return f"{_visible(function, _ISSUE_MAX)} {_visible(problem, _ISSUE_MAX)}; the call is shown for review instead."


# -- typed answers (`trioloop.machine.on_answer`) ---------------------------------------------------------------

#: The result of the final call that gave the turn its answer.
ANSWER_TAKEN_TEXT: Final = "Answer received."


def invalid_answer_text(name: str, failure: PrepareFailure) -> str:
    """The result of a final call whose answer failed its checks: every problem, named by its path."""
    shown = [_visible(issue, _ISSUE_MAX) for issue in failure.issues[:_ISSUES_MAX]]
    if len(failure.issues) > _ISSUES_MAX:
        shown.append(f"and {len(failure.issues) - _ISSUES_MAX} more")
    return (
        f"The answer given to {echo(name)} does not have the required shape, so it was not taken. Fix these and "
        f"call {echo(name)} again: {'; '.join(shown)}"
    )


def unchecked_answer_text(name: str) -> str:
    """The result of a final call nothing checked (so it cannot be taken)."""
    return f"The answer given to {echo(name)} could not be checked, so it was not taken. Call {echo(name)} again."


def answer_nudge_text(name: str) -> str:
    """What the model is told after a reply that gave no answer."""
    return f"Give your final answer by calling the {echo(name)} tool, with arguments that match its schema."


def answer_not_alone_text(name: str) -> str:
    """The result of a valid final call sent beside calls of other tools: they run (reviewed as always) and the
    model answers once it has their results."""
    return (
        f"Not taken: this {echo(name)} call came with calls of other tools, which run first. Call {echo(name)} "
        "alone, once you have their results."
    )


def extra_answer_text(name: str) -> str:
    """The result of a further valid final call in the response whose first one gave the answer."""
    return f"Not taken: an earlier {echo(name)} call in this response gave the answer."


def answer_bound_notice(notice: str, last_problem: str) -> str:
    """A turn's output-retry bound notice, with the last problem its answer had."""
    return f"{notice} The last problem: {_visible(last_problem, 600)}" if last_problem else notice
