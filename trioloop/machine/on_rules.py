"""The reducer's rule decisions: the review a newly prepared call gets (`admit_call`: rules and a
``needs_approval`` verdict, judged by `trioloop.machine.rules.decide_call`), a person's "always" from a card
(`remember`, which adds a session rule and applies it to the iteration's other undecided calls), a
``needs_approval`` verdict waiting for its call, and a session rule forgotten."""

from __future__ import annotations

from typing import Any, Final

from trioloop.machine.authorization import grant_by_policy
from trioloop.machine.conditions import RuleError
from trioloop.machine.inputs import ForgetRule
from trioloop.machine.rules import (
    SESSION_SOURCE,
    Always,
    ApprovalRule,
    CodeVerdict,
    Condition,
    Decider,
    DeciderKind,
    Decision,
    Verdict,
    decide_call,
    literal_pattern,
    rule_decider,
)
from trioloop.machine.state import CallRecord, CallStatus, DenialReason, Phase, TurnState
from trioloop.machine.steps import add_call, has_pending, moved_along, with_notice
from trioloop.machine.texts import code_verdict_notice, rule_denied_text
from trioloop.machine.tools import PreparedCall, RegisteredTool

__all__ = ["PERSON", "PERSON_DENIED", "READ_ONLY_POLICY", "admit_call", "on_code_verdict", "on_forget_rule", "remember"]

#: The person's decision (the reviewer is named once the inbox knows one).
PERSON: Final = Decider(kind=DeciderKind.PERSON, verdict=Verdict.ALLOW)
PERSON_DENIED: Final = Decider(kind=DeciderKind.PERSON, verdict=Verdict.DENY)
READ_ONLY_POLICY: Final = Decider(kind=DeciderKind.READ_ONLY_POLICY, verdict=Verdict.ALLOW)


def _canonical(prepared: PreparedCall[Any] | None) -> Any:
    return None if prepared is None else prepared.canonical


def admit_call(
    state: TurnState,
    tool: RegisteredTool[Any],
    common: dict[str, Any],
    prepared: PreparedCall[Any],
    server_id: str,
    **changes: Any,
) -> TurnState:
    """``state`` with the new call ``common`` describes (prepared, valid, not declined before) added as the
    rules, the tool's ``needs_approval`` verdict and the safety table decide: approved (with its grant),
    denied (with the rule's reason, fenced), or pending its card."""
    code = state.code_verdict
    if code is not None:
        changes["code_verdict"] = None
        if code.call_id != server_id or code.tool_name != tool.name:
            code = None  # given for another call: never applied to this one
        elif code.note:
            state = with_notice(state, code_verdict_notice(code.function, code.note))
    rules = state.rules
    rule = rules.deciding(tool.name, prepared.canonical) if rules.rules else None
    decision, decider, reason = decide_call(effect=tool.effect, destructive=tool.destructive, rule=rule, code=code)
    if decision is Decision.CARD:
        record = CallRecord(**common, status=CallStatus.PENDING, decided_by=decider)
        return add_call(state, record, **changes)
    if decision is Decision.DENY:
        assert decider is not None
        label = decider.describe()
        record = CallRecord(
            **common,
            status=CallStatus.DENIED,
            denial_reason=DenialReason.RULE_DENIED,
            result=rule_denied_text(label, reason),
            is_error=True,
            decided_by=decider,
        )
        return add_call(state, record, **changes)
    record = CallRecord(**common, status=CallStatus.APPROVED, decided_by=decider)
    grant = grant_by_policy(tool, record, state.iteration)
    return add_call(state, record, grants=(*state.grants, grant), **changes)


def on_code_verdict(state: TurnState, verdict: CodeVerdict) -> TurnState:
    return state.evolved(code_verdict=verdict)


def on_forget_rule(state: TurnState, cmd: ForgetRule) -> TurnState:
    if not any(r.source == SESSION_SOURCE and r.number == cmd.number for r in state.rules.rules):
        return state
    return state.evolved(rules=state.rules.without(SESSION_SOURCE, cmd.number))


def _rule_for(call: CallRecord, verdict: Verdict, always: Always, reason: str) -> ApprovalRule | str:
    """The session rule a person's "always" on ``call`` makes, or why none can be made."""
    when: tuple[Condition, ...] = ()
    if always is Always.INPUT:
        canonical = _canonical(call.prepared)
        if canonical is None:
            return f"the {call.tool_name} tool does not give its input in a form a rule can match"
        when = (Condition.equals("", canonical),)
    if verdict is Verdict.ALLOW and call.destructive:
        return f"{call.tool_name} is destructive: every call of it gets its own card, whatever the rules say"
    return ApprovalRule(tool=literal_pattern(call.tool_name), verdict=verdict, when=when, reason=reason)


def remember(state: TurnState, call_id: str, verdict: Verdict, always: Always, reason: str = "") -> TurnState:
    """``state`` with the session rule a person's "always" on call ``call_id`` makes (numbered after the
    session's others), applied at once to the iteration's other calls still awaiting a decision that it now
    decides (an allow never approves a destructive call, nor a call a rule or function asked a card for)."""
    call = state.call(call_id)
    if call is None:
        return state
    try:
        made = _rule_for(call, verdict, always, reason)
    except RuleError as exc:  # an input nested too deeply to bind: the decision stands, no rule is added
        made = str(exc)
    if isinstance(made, str):
        return with_notice(state, f"No rule was added: {made}.")
    rule = ApprovalRule(
        tool=made.tool,
        verdict=made.verdict,
        when=made.when,
        reason=made.reason,
        source=SESSION_SOURCE,
        number=state.rules.next_number(SESSION_SOURCE),
    )
    rules = state.rules.with_rule(rule)
    state = state.evolved(rules=rules)
    changes = []
    grants = []
    for position in range(state.iteration_first_call, len(state.calls)):
        other = state.calls[position]
        if other.status is not CallStatus.PENDING or not rule.names_tool(other.tool_name):
            continue
        if not rule.holds(_canonical(other.prepared)):
            continue
        if verdict is Verdict.DENY:
            text = rule_denied_text(rule_decider(rule).describe(), reason)
            moved = moved_along(
                other,
                CallStatus.DENIED,
                denial_reason=DenialReason.RULE_DENIED,
                result=text,
                is_error=True,
                decided_by=rule_decider(rule),
            )
        elif other.destructive or other.decided_by is not None or other.effect != "mutate":
            continue
        else:
            tool = state.tool_set.get(other.tool_name)
            if tool is None:
                continue
            moved = moved_along(other, CallStatus.APPROVED, decided_by=rule_decider(rule))
            grants.append(grant_by_policy(tool, moved, state.iteration))
        changes.append((position, moved))
    if not changes:
        return state
    state = state.evolved(calls=state.calls.replaced(changes), grants=(*state.grants, *grants))
    return (
        state
        if has_pending(state) or state.phase is not Phase.AWAITING_APPROVAL
        else state.evolved(phase=Phase.EXECUTING)
    )
