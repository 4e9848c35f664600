"""The commands a runner or a user feeds the turn reducer, and how any input is classified.

Commands are small frozen values validated when built. `classify` re-checks every field at the
reducer's door as well, because a value can be forged past its constructor; whatever it does not
recognise as a well-formed turn input is not an input at all.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias, final

import attrs

from trioloop.machine.answers import AnswerChecked, AnswerSpec
from trioloop.machine.limits import DEFAULT_TURN_LIMITS, NO_SPENDING, Spending, TurnLimits
from trioloop.machine.rules import EMPTY_RULES, Always, CodeVerdict, RuleSet
from trioloop.machine.tools import ToolOutcome, ToolRegistry
from trioloop.protocol.events import (
    Aborted,
    MessageStart,
    MessageStop,
    ProviderBlockComplete,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    Usage,
)
from trioloop.protocol.messages import Message, ProviderBlock, RedactedThinkingBlock, ThinkingBlock

__all__ = [
    "Advance",
    "AnswerChecked",
    "ApproveBatch",
    "ApproveCall",
    "BeforeRequest",
    "CallSettled",
    "Cancel",
    "CodeVerdict",
    "DenyCall",
    "ForgetRule",
    "InputKind",
    "Retry",
    "Revoke",
    "StartCall",
    "Submit",
    "TurnCommand",
    "TurnInput",
    "UndoTurn",
    "classify",
]


def _text(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if type(value) is not str:
        raise TypeError(f"{attribute.name} must be str, got {type(value).__name__}")


def _now(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int:
        raise TypeError(f"{attribute.name} must be an int of milliseconds, got {value!r}")


def _wait(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative int of milliseconds, got {value!r}")


def _messages(value: object) -> tuple[Message, ...]:
    if not isinstance(value, tuple | list) or not all(type(m) is Message for m in value):
        raise TypeError("base_messages must be a sequence of Message")
    return tuple(value)


def _edited(value: Any) -> Any:
    # A private copy, taken at the click: a face that changes its dict later cannot change the edit.
    return copy.deepcopy(value) if type(value) is dict else value


def _edited_ok(instance: object, attribute: attrs.Attribute[dict[str, Any] | None], value: object) -> None:
    if value is not None and type(value) is not dict:
        raise TypeError(f"{attribute.name} must be a JSON object (dict) or None, got {type(value).__name__}")


def _always(value: object) -> Always | None:
    # "input", "tool" or an `Always`; anything else is refused when the decision is made.
    return None if value is None else Always(value)  # type: ignore[arg-type]


def _call_ids(instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: object) -> None:
    # An explicit tuple captured at the click: never a predicate or a live collection.
    if type(value) is not tuple or not all(type(i) is str for i in value):
        raise TypeError(f"{attribute.name} must be a tuple of str call ids, got {type(value).__name__}")


@final
@attrs.frozen(kw_only=True)
class Submit:
    """Start a turn: the user's text over ``base_messages``, with a tool set and limits frozen for the turn."""

    turn_id: str = attrs.field(validator=_text)
    text: str = attrs.field(validator=_text)
    base_messages: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    tool_set: ToolRegistry[Any] = attrs.field(validator=attrs.validators.instance_of(ToolRegistry))
    limits: TurnLimits = attrs.field(default=DEFAULT_TURN_LIMITS, validator=attrs.validators.instance_of(TurnLimits))
    now_ms: int = attrs.field(validator=_now)
    #: The model's price and the session's token and cost bounds, fixed for the turn (journaled with it).
    spending: Spending = attrs.field(default=NO_SPENDING, validator=attrs.validators.instance_of(Spending))
    #: The approval rules the turn decides by (`trioloop.machine.rules`), frozen for it.
    rules: RuleSet = attrs.field(default=EMPTY_RULES, validator=attrs.validators.instance_of(RuleSet))
    #: A typed answer's final tool (`trioloop.machine.answers`): the turn ends when the model calls it validly.
    answer: AnswerSpec | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(AnswerSpec))
    )


@final
@attrs.frozen(kw_only=True)
class ApproveCall:
    """The user approved one call (a destructive one included).

    ``edited_input`` (a JSON object) approves the call with the user's edit of its input instead: the
    reducer prepares it with the call's own tool, so validation and limits apply and the grant binds
    the edited input; None approves the input as the model sent it. ``always`` also adds a session rule
    that allows this tool (`Always.TOOL`) or this tool with this very input (`Always.INPUT`) from now on.
    ``seen_digest``, when given, is the input digest of the card the person decided on: a call whose input is
    no longer that one is not approved (a decision made elsewhere, on a page that may be stale). ``reviewer``
    names who decided, when the face knows (the web inbox's reviewer id).
    """

    call_id: str = attrs.field(validator=_text)
    edited_input: dict[str, Any] | None = attrs.field(default=None, converter=_edited, validator=_edited_ok)
    always: Always | None = attrs.field(default=None, converter=_always)
    seen_digest: str = attrs.field(default="", validator=_text)
    reviewer: str = attrs.field(default="", validator=_text)


@final
@attrs.frozen(kw_only=True)
class ApproveBatch:
    """The user approved the calls listed when they clicked; destructive ones are never included."""

    call_ids: tuple[str, ...] = attrs.field(validator=_call_ids)


@final
@attrs.frozen(kw_only=True)
class DenyCall:
    """The user declined one call; ``reason`` (optional, their own words) reaches the model with the refusal.
    ``always`` (`Always.TOOL`) also adds a session rule that denies this tool from now on, with that reason.
    ``seen_digest`` and ``reviewer`` as for `ApproveCall`."""

    call_id: str = attrs.field(validator=_text)
    reason: str = attrs.field(default="", validator=_text)
    always: Always | None = attrs.field(default=None, converter=_always)
    seen_digest: str = attrs.field(default="", validator=_text)
    reviewer: str = attrs.field(default="", validator=_text)


@final
@attrs.frozen(kw_only=True)
class ForgetRule:
    """The person removed session rule ``number``: later calls are decided without it."""

    number: int = attrs.field(validator=_now)


@final
@attrs.frozen(kw_only=True)
class StartCall:
    """The runner asks to start one call; only `authorize_start` decides."""

    call_id: str = attrs.field(validator=_text)
    now_ms: int = attrs.field(validator=_now)


@final
@attrs.frozen(kw_only=True)
class CallSettled:
    """A started call finished (after its outcome went through `commit_tool_outcome`)."""

    call_id: str = attrs.field(validator=_text)
    outcome: ToolOutcome[Any] = attrs.field(validator=attrs.validators.instance_of(ToolOutcome))
    now_ms: int = attrs.field(validator=_now)
    #: The commit swapped the live document (so undoing the turn undoes this call).
    changed_document: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


@final
@attrs.frozen(kw_only=True)
class Advance:
    """Every call of the iteration is terminal: answer them and decide whether to ask the model again."""

    now_ms: int = attrs.field(validator=_now)


def _optional_failure(instance: object, attribute: attrs.Attribute[StreamError | None], value: object) -> None:
    if value is not None and type(value) is not StreamError:
        raise TypeError(f"{attribute.name} must be a StreamError or None")


@final
@attrs.frozen(kw_only=True)
class Retry:
    """The runner re-sends the request after a transient failure before any event arrived.

    ``failure`` is what failed and ``wait_ms`` how long the runner waits before the next attempt; the
    reducer counts the retry and tells the person (``HTTP 529, retry 1 of 3 in 0.5 s``).
    """

    now_ms: int = attrs.field(validator=_now)
    failure: StreamError | None = attrs.field(default=None, validator=_optional_failure)
    wait_ms: int = attrs.field(default=0, validator=_wait)


def _count(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative int of tokens, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class BeforeRequest:
    """The runner is about to send the turn's next request: its input estimated at ``input_tokens`` (the
    preflight estimate), asking for up to ``output_tokens``. If the turn's or the session's token or cost
    bounds would be passed, the reducer settles the turn bounded and the request is not sent; otherwise
    nothing changes (and nothing is journaled)."""

    input_tokens: int = attrs.field(validator=_count)
    output_tokens: int = attrs.field(validator=_count)


_CANCEL_REASONS: Final = ("stop", "deadline", "review_timeout")


@final
@attrs.frozen(kw_only=True)
class Cancel:
    """End the turn now: ``"stop"`` (the user) settles cancelled; ``"deadline"`` and ``"review_timeout"``
    (no decision on the review cards in time) settle bounded."""

    reason: Literal["stop", "deadline", "review_timeout"] = attrs.field(
        default="stop", validator=attrs.validators.in_(_CANCEL_REASONS)
    )


@final
@attrs.frozen(kw_only=True)
class Revoke:
    """A call that has not run may no longer run: its tool changed after the card was shown (a resumed
    session re-prepared it and got another digest). A pending or approved call fails with a text naming
    why, and a ``digest_mismatch`` violation is recorded; ``detail`` says what differed, for the person."""

    call_id: str = attrs.field(validator=_text)
    detail: str = attrs.field(default="", validator=_text)


@final
@attrs.frozen(kw_only=True)
class UndoTurn:
    """The turn's document changes were undone; its succeeded calls become undone."""


TurnCommand: TypeAlias = (
    Submit
    | ApproveCall
    | ApproveBatch
    | DenyCall
    | StartCall
    | CallSettled
    | Advance
    | Retry
    | BeforeRequest
    | Cancel
    | Revoke
    | UndoTurn
    | CodeVerdict
    | ForgetRule
    | AnswerChecked
)
TurnInput: TypeAlias = StreamEvent | TurnCommand


@final
class InputKind(enum.StrEnum):
    """Every kind of turn input; the transition table is keyed by these."""

    SUBMIT = "submit"
    MESSAGE_START = "message_start"
    TEXT_DELTA = "text_delta"
    THINKING_DELTA = "thinking_delta"
    THINKING_COMPLETE = "thinking_complete"
    PROVIDER_BLOCK_COMPLETE = "provider_block_complete"
    TOOL_CALL_START = "tool_call_start"
    TOOL_CALL_INPUT_DELTA = "tool_call_input_delta"
    TOOL_CALL_COMPLETE = "tool_call_complete"
    USAGE = "usage"
    MESSAGE_STOP = "message_stop"
    STREAM_ERROR = "stream_error"
    STREAM_NOTICE = "stream_notice"
    ABORTED = "aborted"
    APPROVE_CALL = "approve_call"
    APPROVE_BATCH = "approve_batch"
    DENY_CALL = "deny_call"
    START_CALL = "start_call"
    CALL_SETTLED = "call_settled"
    ADVANCE = "advance"
    RETRY = "retry"
    BEFORE_REQUEST = "before_request"
    CANCEL = "cancel"
    REVOKE = "revoke"
    UNDO_TURN = "undo_turn"
    CODE_VERDICT = "code_verdict"
    FORGET_RULE = "forget_rule"
    ANSWER_CHECK = "answer_check"


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_ms(value: object) -> bool:
    return type(value) is int


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _submit_ok(c: Any) -> bool:
    return (
        _is_str(c.turn_id)
        and _is_str(c.text)
        and type(c.base_messages) is tuple
        and all(type(m) is Message for m in c.base_messages)
        and type(c.tool_set) is ToolRegistry
        and type(c.limits) is TurnLimits
        and _is_ms(c.now_ms)
        and type(c.spending) is Spending
        and type(c.rules) is RuleSet
        and (
            c.answer is None
            or (type(c.answer) is AnswerSpec and _is_str(c.answer.tool_name) and type(c.answer.wrapped) is bool)
        )
    )


def _outcome_ok(outcome: object) -> bool:
    # Only the type is checked here: a ToolOutcome with a non-text result is a tool fault the
    # reducer turns into a failed call, so the call cannot stay running for ever.
    return type(outcome) is ToolOutcome


def _stream_error_ok(e: Any) -> bool:
    return type(e.terminal) is bool and _is_str(e.message)


_Check: TypeAlias = Callable[[Any], bool]

# Exact types only: a subclass could override what the reducer relies on.
_DOOR: Final[Mapping[type, tuple[InputKind, _Check]]] = MappingProxyType(
    {
        Submit: (InputKind.SUBMIT, _submit_ok),
        MessageStart: (InputKind.MESSAGE_START, lambda e: _is_str(e.model) and _is_str(e.provider)),
        TextDelta: (InputKind.TEXT_DELTA, lambda e: _is_str(e.text)),
        ThinkingDelta: (InputKind.THINKING_DELTA, lambda e: True),
        ThinkingComplete: (
            InputKind.THINKING_COMPLETE,
            lambda e: type(e.block) in (ThinkingBlock, RedactedThinkingBlock),
        ),
        ProviderBlockComplete: (
            InputKind.PROVIDER_BLOCK_COMPLETE,
            lambda e: type(e.block) is ProviderBlock and _is_str(e.block.wire) and _is_str(e.block.data),
        ),
        ToolCallStart: (InputKind.TOOL_CALL_START, lambda e: True),
        ToolCallInputDelta: (InputKind.TOOL_CALL_INPUT_DELTA, lambda e: True),
        ToolCallComplete: (
            InputKind.TOOL_CALL_COMPLETE,
            lambda e: _is_str(e.id) and _is_str(e.name) and (e.input_error is None or _is_str(e.input_error)),
        ),
        Usage: (
            InputKind.USAGE,
            lambda e: (
                _is_count(e.input_tokens)
                and _is_count(e.output_tokens)
                and _is_count(e.cache_read_input_tokens)
                and _is_count(e.cache_creation_input_tokens)
                and _is_count(e.reasoning_tokens)
            ),
        ),
        MessageStop: (InputKind.MESSAGE_STOP, lambda e: type(e.stop_reason) is StopReason),
        StreamError: (InputKind.STREAM_ERROR, _stream_error_ok),
        Aborted: (InputKind.ABORTED, lambda e: True),
        ApproveCall: (
            InputKind.APPROVE_CALL,
            lambda c: (
                _is_str(c.call_id)
                and (c.edited_input is None or type(c.edited_input) is dict)
                and (c.always is None or type(c.always) is Always)
                and _is_str(c.seen_digest)
                and _is_str(c.reviewer)
            ),
        ),
        ApproveBatch: (
            InputKind.APPROVE_BATCH,
            lambda c: type(c.call_ids) is tuple and all(_is_str(i) for i in c.call_ids),
        ),
        DenyCall: (
            InputKind.DENY_CALL,
            lambda c: (
                _is_str(c.call_id)
                and _is_str(c.reason)
                and (c.always is None or type(c.always) is Always)
                and _is_str(c.seen_digest)
                and _is_str(c.reviewer)
            ),
        ),
        StartCall: (InputKind.START_CALL, lambda c: _is_str(c.call_id) and _is_ms(c.now_ms)),
        CallSettled: (
            InputKind.CALL_SETTLED,
            lambda c: (
                _is_str(c.call_id) and _outcome_ok(c.outcome) and _is_ms(c.now_ms) and type(c.changed_document) is bool
            ),
        ),
        Advance: (InputKind.ADVANCE, lambda c: _is_ms(c.now_ms)),
        Retry: (
            InputKind.RETRY,
            lambda c: (
                _is_ms(c.now_ms)
                and _is_count(c.wait_ms)
                and (c.failure is None or (type(c.failure) is StreamError and _stream_error_ok(c.failure)))
            ),
        ),
        BeforeRequest: (InputKind.BEFORE_REQUEST, lambda c: _is_count(c.input_tokens) and _is_count(c.output_tokens)),
        Cancel: (InputKind.CANCEL, lambda c: _is_str(c.reason) and c.reason in _CANCEL_REASONS),
        Revoke: (InputKind.REVOKE, lambda c: _is_str(c.call_id) and _is_str(c.detail)),
        UndoTurn: (InputKind.UNDO_TURN, lambda c: True),
        CodeVerdict: (
            InputKind.CODE_VERDICT,
            lambda c: (
                all(_is_str(v) for v in (c.call_id, c.tool_name, c.function, c.reason, c.note))
                and c.verdict in ("allow", "ask", "deny")
            ),
        ),
        ForgetRule: (InputKind.FORGET_RULE, lambda c: _is_ms(c.number)),
        AnswerChecked: (
            InputKind.ANSWER_CHECK,
            lambda c: (
                _is_str(c.call_id)
                and _is_str(c.tool_name)
                and type(c.issues) is tuple
                and all(_is_str(i) for i in c.issues)
            ),
        ),
    }
)


#: The kind each input type is classified as (when its fields are well formed).
INPUT_TYPE_KINDS: Final[Mapping[type, InputKind]] = MappingProxyType({t: kind for t, (kind, _) in _DOOR.items()})


def classify(value: object) -> InputKind | None:
    """The kind of a well-formed turn input, or None for anything else (never raises)."""
    entry = _DOOR.get(type(value))
    if entry is None:
        return None
    kind, check = entry
    try:
        if not check(value):
            return None
    except Exception:  # a forged field whose comparison misbehaves is simply not an input
        return None
    if kind is InputKind.STREAM_ERROR and not value.terminal:  # type: ignore[attr-defined]
        return InputKind.STREAM_NOTICE
    return kind
