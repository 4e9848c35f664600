"""The value the turn reducer reads and writes: `TurnState` (and the `Draft` of the response streaming now).

Everything is frozen. Growing parts of a turn (the streamed text, violations, notices, the calls) live in
persistent values (`trioloop.machine.persistent`, `CallTable`) that share their prefix, so one more delta costs
O(1) instead of a copy of everything before it; the tuples callers read are built once, on first access, per
state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, final

import attrs

from trioloop.machine.answers import AnswerChecked, AnswerSpec
from trioloop.machine.calls import (
    NO_CALLS,
    CallRecord,
    CallStatus,
    CallTable,
    DenialReason,
    Outcome,
    Phase,
    ViolationRecord,
    call_table,
)
from trioloop.machine.grants import Denial, Grant
from trioloop.machine.limits import DEFAULT_TURN_LIMITS, NO_SPENDING, Bound, Spending, TurnBudget, TurnLimits
from trioloop.machine.persistent import Log, TextRun, cached
from trioloop.machine.rules import EMPTY_RULES, CodeVerdict, RuleSet
from trioloop.machine.tools import ToolRegistry, create_tool_registry
from trioloop.protocol.events import StopReason, StreamError, Usage
from trioloop.protocol.messages import ContentBlock, Message, TextBlock, ToolCallBlock

__all__ = [
    "CallRecord",
    "CallStatus",
    "CallTable",
    "DenialReason",
    "Draft",
    "Outcome",
    "Phase",
    "TurnState",
    "ViolationRecord",
]


_EMPTY_TEXT = TextRun()
_EMPTY_BLOCKS: Log[ContentBlock] = Log()


def _block_log(value: Log[ContentBlock] | Iterable[ContentBlock] | None) -> Log[ContentBlock]:
    if value is None:
        return _EMPTY_BLOCKS
    if isinstance(value, Log):
        return value
    log = _EMPTY_BLOCKS
    for block in value:
        log = log.append(block)
    return log


@final
@attrs.frozen(kw_only=True, slots=False)
class Draft:
    """The current iteration's assistant message: finished blocks plus the text segment still growing.

    ``open`` is true until `MessageStop` (or a settle) closes it; the closed message is then part
    of the turn's messages and the draft is kept only so the UI can read this iteration's text.
    (An instance ``__dict__``, not slots: the cached properties are read in every iteration, and on a
    slotted attrs class their first read goes through a generated ``__getattr__``.)
    """

    blocks: Log[ContentBlock] = attrs.field(default=_EMPTY_BLOCKS, converter=_block_log)
    text: TextRun = _EMPTY_TEXT
    open: bool = True

    def with_text(self, text: str) -> Draft:
        return Draft(blocks=self.blocks, text=self.text.append(text), open=self.open)

    def with_call(self, block: ToolCallBlock) -> Draft:
        # An append to a persistent log: O(1), whatever the number of calls already in the message.
        return Draft(blocks=self._finished_blocks.append(block), open=self.open)

    def with_block(self, block: ContentBlock) -> Draft:
        """A finished non-text block (a thinking block) after what streamed so far."""
        return Draft(blocks=self._finished_blocks.append(block), open=self.open)

    def closed(self) -> Draft:
        return Draft(blocks=self._finished_blocks, open=False)

    @property
    def _finished_blocks(self) -> Log[ContentBlock]:
        if not len(self.text):
            return self.blocks
        return self.blocks.append(TextBlock(text=self.text.joined()))

    @cached
    def message(self) -> Message | None:
        """The assistant message so far, or None while it holds nothing (an empty message is never sent)."""
        blocks = self._finished_blocks.items
        return Message(role="assistant", content=blocks) if blocks else None

    @cached
    def plain_text(self) -> str:
        segments = [b.text for b in self.blocks if isinstance(b, TextBlock)]
        segments.extend(self.text.items)
        return "".join(segments)


_NO_USAGE = Usage()
_EMPTY_VIOLATIONS: Log[ViolationRecord] = Log()
_EMPTY_NOTICES: Log[str] = Log()


@final
@attrs.frozen(kw_only=True, slots=False)
class TurnState:
    """Everything one turn has decided, as one immutable value; `reduce_turn` makes the next one.

    ``messages`` is the base history plus this turn's messages (the open assistant message
    included while it streams); at every settle it is pairable. ``undo_snapshot_key`` is the key
    under which `commit_tool_outcome` records this turn's pre-turn document (the turn id).
    """

    turn_id: str = ""
    phase: Phase = Phase.IDLE
    outcome: Outcome | None = None
    iteration: int = 0
    tool_set: ToolRegistry[Any] = attrs.field(factory=create_tool_registry)
    limits: TurnLimits = DEFAULT_TURN_LIMITS
    budget: TurnBudget = attrs.field(factory=TurnBudget)
    base_messages: tuple[Message, ...] = ()
    calls: CallTable = attrs.field(default=NO_CALLS, converter=call_table)
    grants: tuple[Grant, ...] = ()
    denials: tuple[Denial, ...] = ()
    error: StreamError | None = None
    usage: Usage = _NO_USAGE
    #: Why the model's last response ended (None before the first one ends), and the model the server named
    #: in its last response ("" when it named none): what observers report (``gen_ai.response.*``).
    stop_reason: StopReason | None = None
    response_model: str = ""
    #: Which provider of a `FallbackProvider` answered the last response (its name there; "" for a single
    #: provider, or before any answer): later requests of the turn start with it.
    answered_by: str = ""
    #: The approval rules this turn decides by: frozen at submit (the app's, the files', the session's), grown
    #: by a person's "always" from a card and shrunk by a forget.
    rules: RuleSet = EMPTY_RULES
    #: A typed answer's final tool (None: the turn answers in text). ``output`` is the answer, as the JSON the
    #: model sent (its ``value`` for a wrapped type), set only when a valid call of the final tool completed
    #: the turn (``output_call`` is that call's id); ``output_error`` is the last problem an answer had.
    answer: AnswerSpec | None = None
    output: Any = None
    output_call: str = ""
    output_error: str = ""
    # Internal bookkeeping; only the reducer builds these.
    closed_messages: tuple[Message, ...] = ()
    draft: Draft | None = None
    answered: int = 0
    violation_log: Log[ViolationRecord] = _EMPTY_VIOLATIONS
    notice_log: Log[str] = _EMPTY_NOTICES
    usage_before_iteration: Usage = _NO_USAGE
    base_call_ids: frozenset[str] = frozenset()
    # Where the current iteration's calls begin in ``calls`` (calls are appended in iteration order).
    iteration_first_call: int = 0
    #: The model's price and the session's bounds the turn was submitted with; the bound that settled it.
    spending: Spending = NO_SPENDING
    bound: Bound | None = None
    # A ``needs_approval`` verdict waiting for the call it was given for (the next tool call complete).
    code_verdict: CodeVerdict | None = None
    # The check of the final tool's next call (fed just before it), and whether the next request asks for the
    # answer again after a reply that gave none.
    answer_check: AnswerChecked | None = None
    answer_nudge: bool = False

    @classmethod
    def idle(cls) -> TurnState:
        """The state before a turn: one shared value (states are immutable), not a new one per turn."""
        return _IDLE

    @property
    def is_settled(self) -> bool:
        """Whether the turn has ended (it then takes no input but undo)."""
        return self.phase is Phase.SETTLED

    @property
    def has_output(self) -> bool:
        """Whether the turn gave a typed answer (``output``): its final tool was called validly."""
        return bool(self.output_call)

    @property
    def is_live(self) -> bool:
        """Whether the turn has started and not settled."""
        return self.phase is not Phase.IDLE and self.phase is not Phase.SETTLED

    @property
    def undo_snapshot_key(self) -> str:
        """The key of this turn's pre-turn document in the undo history (its turn id)."""
        return self.turn_id

    def call(self, call_id: str) -> CallRecord | None:
        """The call with id ``call_id``, or None."""
        return self.calls.get(call_id)

    @property
    def current_calls(self) -> tuple[CallRecord, ...]:
        """The calls the model opened in the current iteration, in emission order."""
        recent = self.calls[self.iteration_first_call :]
        return tuple(c for c in recent if c.iteration == self.iteration)

    @property
    def current_call_count(self) -> int:
        """How many calls the model opened in the current iteration (O(1); the reducer's cap reads it)."""
        return len(self.calls) - self.iteration_first_call

    @property
    def violations(self) -> tuple[ViolationRecord, ...]:
        """Every refused input of the turn, in order (which rule, which call, and why)."""
        return self.violation_log.items

    @property
    def notices(self) -> tuple[str, ...]:
        """Every notice of the turn, in order: retries, skipped frames, limits reached."""
        return self.notice_log.items

    @property
    def streaming_text(self) -> str:
        """The assistant text of the current iteration so far."""
        return "" if self.draft is None else self.draft.plain_text

    @cached
    def turn_messages(self) -> tuple[Message, ...]:
        """This turn's messages only: the user's text, then assistant messages and tool results."""
        if self.draft is not None and self.draft.open and self.draft.message is not None:
            return (*self.closed_messages, self.draft.message)
        return self.closed_messages

    @cached
    def messages(self) -> tuple[Message, ...]:
        return self.base_messages + self.turn_messages

    def evolved(self, **changes: Any) -> TurnState:
        """``attrs.evolve(self, **changes)`` made cheaper: the reducer makes several states per iteration.

        ``TurnState`` keeps its fields in an instance ``__dict__`` (not slots) so that this is one dict
        copy and update (about 1.5 us) where ``attrs.evolve`` walks the fields and calls ``__init__``
        (about 10 us): setting 21 slots one by one costs more than the copy. The cached properties'
        entries are dropped so they start empty, as in a constructed state. ``calls`` still goes
        through its converter, and an unknown name is a ``TypeError`` as in ``evolve``.
        ``tests/test_machine.py`` checks it against ``attrs.evolve`` for every field.
        """
        if not changes.keys() <= _STATE_FIELD_SET:
            raise TypeError(f"TurnState has no field(s) {sorted(changes.keys() - _STATE_FIELD_SET)}")
        if "calls" in changes:
            changes["calls"] = CallTable.of(changes["calls"])
        values = self.__dict__.copy()
        if len(values) != _STATE_FIELD_COUNT:  # a cached property was computed: its value is not a field
            for name in _STATE_CACHED:
                values.pop(name, None)
        values.update(changes)
        new: TurnState = _new_object(TurnState)
        _set_field(new, "__dict__", values)
        return new


_IDLE = TurnState()
_STATE_FIELDS: tuple[str, ...] = tuple(field.name for field in attrs.fields(TurnState))
_STATE_FIELD_SET: frozenset[str] = frozenset(_STATE_FIELDS)
_STATE_FIELD_COUNT = len(_STATE_FIELDS)
_STATE_CACHED: tuple[str, ...] = tuple(name for name, value in vars(TurnState).items() if isinstance(value, cached))
_new_object = object.__new__
_set_field = object.__setattr__
