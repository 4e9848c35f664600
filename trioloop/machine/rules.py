"""Approval rules as data, and the one function that decides what a call's review is (`decide_call`).

A rule names a tool (its exact name, or a glob: ``*`` and ``?`` within a name, ``**`` across anything; MCP tools
by their ``server__tool`` name), optional conditions on the canonical input the grant binds to (a field found by
its RFC 6901 JSON pointer: equals, one of, string glob, prefix, numeric range; all must hold), and a verdict:
allow, ask or deny (a denial's reason reaches the model, fenced as a person's is). Deny beats ask beats allow,
whatever the order the rules were written in or their sources.

What no rule overrides: an allow never covers a destructive call (it always gets its own card) nor a call
whose input failed validation (such a call never reaches a rule: it is answered with its problems); for a tool
the app declared read-only, a rule can only make the review stricter (ask or deny). `needs_approval` functions
(`CodeVerdict`) are held to the same table. Everything here is pure, total and deterministic over the canonical
input: a condition on a field the input lacks does not hold, and comparing values never raises.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, final

import attrs

from trioloop.machine.conditions import Condition, Match, RuleError, glob_regex, resolve_pointer
from trioloop.machine.globs import Glob
from trioloop.machine.rule_index import RulePlan, plan_rules

__all__ = [
    "APP_SOURCE",
    "EMPTY_RULES",
    "SESSION_SOURCE",
    "Always",
    "ApprovalRule",
    "CodeVerdict",
    "Condition",
    "Decider",
    "DeciderKind",
    "Decision",
    "Match",
    "RuleError",
    "RuleSet",
    "Verdict",
    "app_rules",
    "decide_call",
    "glob_regex",
    "literal_pattern",
    "numbered",
    "resolve_pointer",
    "rule_decider",
    "rule_label",
]

#: The source of rules given in the app's code (``Session(rules=...)``) and of rules added from a card.
APP_SOURCE: Final = "app"
SESSION_SOURCE: Final = "session"


@final
class Verdict(enum.StrEnum):
    """What a rule (or a `needs_approval` function) says of a call: run it unasked, show its card, or refuse it."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


def rule_label(source: str, number: int) -> str:
    """How a rule is named: ``rule 3 of .trioloop/rules.toml``, ``session rule 2``, ``app rule 1``."""
    if source == SESSION_SOURCE:
        return f"session rule {number}"
    if source == APP_SOURCE:
        return f"app rule {number}"
    return f"rule {number} of {source}"


def _verdict(value: Any) -> Verdict:
    try:
        return Verdict(value)
    except ValueError:
        raise RuleError(f'unknown verdict "{value}" (one of: allow, ask, deny)') from None


def _conditions(value: Any) -> tuple[Condition, ...]:
    if type(value) is Condition:
        return (value,)
    items = tuple(value)
    if not all(type(c) is Condition for c in items):
        raise RuleError("when must hold Condition values")
    return items


def _tool_pattern(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if type(value) is not str or not value:
        raise RuleError("a rule's tool must be a non-empty name or glob")


@final
@attrs.frozen(kw_only=True)
class ApprovalRule:
    """One rule: which tool (name or glob), when (conditions that must all hold), and what (the verdict).

    ``reason`` is what the model reads when the rule denies a call (and what the person reads beside any
    decision it makes); ``source`` where the rule came from (`APP_SOURCE`, `SESSION_SOURCE` or a file's path),
    ``number`` its position there (1-based) and ``line`` its line in a file.
    """

    tool: str = attrs.field(validator=_tool_pattern)
    verdict: Verdict = attrs.field(converter=_verdict)
    when: tuple[Condition, ...] = attrs.field(default=(), converter=_conditions)
    reason: str = ""
    source: str = APP_SOURCE
    number: int = 0
    line: int | None = None
    _tool_glob: Glob | None = attrs.field(init=False, repr=False, eq=False)
    _decider: Any = attrs.field(init=False, repr=False, eq=False, default=None)

    def __attrs_post_init__(self) -> None:
        if type(self.reason) is not str or type(self.source) is not str or type(self.number) is not int:
            raise RuleError("a rule's reason and source must be strings, its number an int")
        literal = not any(ch in self.tool for ch in "*?\\")
        object.__setattr__(self, "_tool_glob", None if literal else Glob(self.tool))

    @property
    def decider(self) -> Decider:
        """The `Decider` naming this rule, made on first use and kept (a rule decides many calls)."""
        made: Decider | None = self._decider
        if made is None:
            made = Decider(
                kind=DeciderKind.RULE,
                verdict=self.verdict,
                source=self.source,
                number=self.number,
                detail=self.describe(),
            )
            object.__setattr__(self, "_decider", made)
        return made

    def names_tool(self, name: str) -> bool:
        """Whether this rule's tool pattern names the tool ``name``."""
        glob = self._tool_glob
        return name == self.tool if glob is None else glob.matches(name)

    def holds(self, canonical: Any) -> bool:
        """Whether every condition holds on ``canonical`` (a rule without conditions always does)."""
        return all(condition.holds(canonical) for condition in self.when)

    @property
    def label(self) -> str:
        """Where the rule is: ``rule 3 of .trioloop/rules.toml``, ``session rule 2``, ``app rule 1``."""
        return rule_label(self.source, self.number)

    def describe(self) -> str:
        """What the rule says: ``write_file path docs/**`` (its tool, then each condition)."""
        return " ".join((self.tool, *(c.describe() for c in self.when)))

    def to_json(self) -> dict[str, Any]:
        """The rule as the journal and session files record it."""
        data: dict[str, Any] = {"tool": self.tool, "verdict": self.verdict.value, "source": self.source}
        data["number"] = self.number
        if self.when:
            data["when"] = [c.to_json() for c in self.when]
        if self.reason:
            data["reason"] = self.reason
        if self.line is not None:
            data["line"] = self.line
        return data

    @classmethod
    def from_json(cls, data: Any) -> ApprovalRule:
        """The rule `to_json` wrote; `RuleError` for anything else."""
        if type(data) is not dict:
            raise RuleError("a rule must be an object")
        when = data.get("when", [])
        if type(when) is not list or not all(type(c) is dict for c in when):
            raise RuleError("a rule's when must be a list of objects")
        line = data.get("line")
        if line is not None and type(line) is not int:
            raise RuleError("a rule's line must be an int")
        try:
            conditions = tuple(
                Condition(pointer=c.get("pointer"), match=c.get("match"), value=c.get("value")) for c in when
            )
        except (TypeError, AttributeError) as exc:
            raise RuleError(f"a condition is malformed: {exc}") from None
        return cls(
            tool=data.get("tool"),  # type: ignore[arg-type]
            verdict=data.get("verdict"),
            when=conditions,
            reason=data.get("reason", ""),
            source=data.get("source", APP_SOURCE),
            number=data.get("number", 0),
            line=line,
        )


_RANK: Final = {Verdict.DENY: 3, Verdict.ASK: 2, Verdict.ALLOW: 1}


@final
@attrs.frozen
class RuleSet:
    """An ordered set of rules, frozen for a turn, with each tool's candidate rules found once.

    `deciding` gives the rule whose verdict stands for a call: the first deny that holds, else the first ask,
    else the first allow. The per-tool cache holds the tools a turn offers (an unknown tool never reaches it).
    """

    rules: tuple[ApprovalRule, ...] = ()
    _by_tool: dict[str, tuple[ApprovalRule, ...]] = attrs.field(init=False, factory=dict, repr=False, eq=False)
    _plans: dict[str, RulePlan] = attrs.field(init=False, factory=dict, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if type(self.rules) is not tuple:
            object.__setattr__(self, "rules", tuple(self.rules))
        if not all(type(r) is ApprovalRule for r in self.rules):
            raise RuleError("a RuleSet holds ApprovalRule values")

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Any:
        return iter(self.rules)

    def for_tool(self, name: str) -> tuple[ApprovalRule, ...]:
        """The rules whose tool pattern names ``name``, in order (found once per tool name)."""
        found = self._by_tool.get(name)
        if found is None:
            found = tuple(rule for rule in self.rules if rule.names_tool(name))
            self._by_tool[name] = found
        return found

    def deciding(self, name: str, canonical: Any) -> ApprovalRule | None:
        """The rule that decides a call of ``name`` with ``canonical`` input, or None when none holds: the first
        (in this set's order) of the strongest verdict (deny, then ask, then allow) whose conditions all hold."""
        plan = self._plans.get(name)
        if plan is None:
            plan = plan_rules(self.for_tool(name))
            self._plans[name] = plan
        found: ApprovalRule | None = plan.deciding(canonical)
        return found

    def deciding_plainly(self, name: str, canonical: Any) -> ApprovalRule | None:
        """`deciding` by trying each rule in order (what the plan must agree with; tests compare the two)."""
        best: ApprovalRule | None = None
        for rule in self.for_tool(name):
            if best is not None and _RANK[rule.verdict] <= _RANK[best.verdict]:
                continue
            if rule.holds(canonical):
                if rule.verdict is Verdict.DENY:
                    return rule
                best = rule
        return best

    def of_source(self, source: str) -> tuple[ApprovalRule, ...]:
        return tuple(rule for rule in self.rules if rule.source == source)

    def with_rule(self, rule: ApprovalRule) -> RuleSet:
        return RuleSet((*self.rules, rule))

    def without(self, source: str, number: int) -> RuleSet:
        return RuleSet(tuple(r for r in self.rules if not (r.source == source and r.number == number)))

    def next_number(self, source: str) -> int:
        return max((r.number for r in self.rules if r.source == source), default=0) + 1

    def to_json(self) -> list[dict[str, Any]]:
        return [rule.to_json() for rule in self.rules]

    @classmethod
    def from_json(cls, data: Any) -> RuleSet:
        if type(data) is not list:
            raise RuleError("rules must be a list")
        return cls(tuple(ApprovalRule.from_json(item) for item in data))


EMPTY_RULES: Final = RuleSet()


def literal_pattern(name: str) -> str:
    """A tool pattern that names exactly the tool ``name`` (its glob characters escaped)."""
    return re.sub(r"([*?\\])", r"\\\1", name)


@final
class Always(enum.StrEnum):
    """What a person's "always" from a card remembers for the session: this tool with this very input, or
    this tool whatever its input."""

    INPUT = "input"
    TOOL = "tool"


def app_rules(rules: Iterable[ApprovalRule]) -> tuple[ApprovalRule, ...]:
    """The rules an app gives a session: those it wrote in code (source "app", unnumbered) numbered "app rule N"
    in order; those loaded from files kept as loaded (they name their file and line). `RuleError` for a value that
    is not a rule, or for a rule claiming to be a session rule (only a person's "always" makes those)."""
    made = []
    count = 0
    for rule in rules:
        if type(rule) is not ApprovalRule:
            raise RuleError(f"rules= takes ApprovalRule values, got {type(rule).__name__}")
        if rule.source == SESSION_SOURCE:
            raise RuleError("a session rule comes from a person's decision on a card, not from rules=")
        if rule.source == APP_SOURCE:
            count += 1
            rule = attrs.evolve(rule, number=count)
        made.append(rule)
    return tuple(made)


def numbered(rules: Iterable[ApprovalRule], source: str = APP_SOURCE) -> tuple[ApprovalRule, ...]:
    """``rules`` with ``source`` and their 1-based position as number (what ``Session(rules=...)`` does)."""
    return tuple(attrs.evolve(rule, source=source, number=i) for i, rule in enumerate(rules, 1))


@final
class DeciderKind(enum.StrEnum):
    """Who decided a call: the person, the read-only policy, a rule, or a ``needs_approval`` function."""

    PERSON = "person"
    READ_ONLY_POLICY = "read_only_policy"
    RULE = "rule"
    CODE = "code"


@final
@attrs.frozen(kw_only=True)
class Decider:
    """Who decided (or, for a pending call, who asked for the card): ``kind``, the ``verdict`` they gave, and
    for a rule its ``source`` and ``number`` (``label``/``detail`` spell it out), for code the function's name,
    for the person the ``reviewer`` when known."""

    kind: DeciderKind
    verdict: Verdict
    source: str = ""
    number: int = 0
    detail: str = ""
    reviewer: str = ""

    def describe(self) -> str:
        """``approved by rule 3 of .trioloop/rules.toml: write_file path docs/**``, ``denied by the person``..."""
        done = {Verdict.ALLOW: "approved", Verdict.ASK: "asked", Verdict.DENY: "denied"}[self.verdict]
        if self.kind is DeciderKind.PERSON:
            return f"{done} by {self.reviewer or 'the person'}"
        if self.kind is DeciderKind.READ_ONLY_POLICY:
            return f"{done} by the read-only policy"
        if self.kind is DeciderKind.CODE:
            return f"{done} by {self.source}" + (f": {self.detail}" if self.detail else "")
        where = rule_label(self.source, self.number)
        return f"{done} by {where}" + (f": {self.detail}" if self.detail else "")

    def to_json(self) -> dict[str, Any]:
        """The decider as a record (empty fields left out)."""
        return {k: v for k, v in attrs.asdict(self).items() if v not in ("", 0) or k in ("kind", "verdict")}


def rule_decider(rule: ApprovalRule) -> Decider:
    """The `Decider` naming ``rule`` (made once per rule: a rule is decided by many calls)."""
    return rule.decider


@final
@attrs.frozen(kw_only=True)
class CodeVerdict:
    """What a tool's ``needs_approval`` function said of the next call of ``tool_name`` with the server's
    ``call_id``: the runtime feeds it just before that call's `ToolCallComplete`, and the journal keeps it with
    the response, so replay never calls the function again. ``function`` names the function; ``note`` (when
    set) is a notice for the person: the function raised, or returned something that is not a verdict."""

    call_id: str
    tool_name: str
    verdict: Verdict = attrs.field(converter=_verdict)
    function: str
    reason: str = ""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "code_verdict",
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "verdict": self.verdict.value,
            "function": self.function,
            "reason": self.reason,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CodeVerdict:
        fields = ("call_id", "tool_name", "verdict", "function", "reason", "note")
        if not all(type(data.get(name)) is str for name in fields):
            raise RuleError("a code verdict is malformed")
        return cls(**{name: data[name] for name in fields})


@final
class Decision(enum.Enum):
    """The review a call gets: run it (``APPROVE``), show its card (``CARD``) or refuse it (``DENY``)."""

    APPROVE = "approve"
    CARD = "card"
    DENY = "deny"


def decide_call(
    *, effect: str, destructive: bool, rule: ApprovalRule | None, code: CodeVerdict | None
) -> tuple[Decision, Decider | None, str]:
    """The review of one valid, prepared call (SPEC §11), with who decided and the reason for a denial.

    Order: any deny (rule or code) refuses; else any ask shows the card; else a destructive call shows its
    card; else an allow approves; else a read-only tool is approved by the read-only policy; else the card.
    The decider of a card is the rule or code that asked for it (None for the default card).
    """
    deciders: list[tuple[Decider, str]] = []
    if rule is not None:
        deciders.append((rule_decider(rule), rule.reason))
    if code is not None:
        deciders.append((Decider(kind=DeciderKind.CODE, verdict=code.verdict, source=code.function), code.reason))
    for verdict in (Verdict.DENY, Verdict.ASK):
        for decider, reason in deciders:
            if decider.verdict is verdict:
                return (Decision.DENY if verdict is Verdict.DENY else Decision.CARD), decider, reason
    if destructive:
        return Decision.CARD, None, ""
    for decider, _ in deciders:
        if decider.verdict is Verdict.ALLOW:
            return Decision.APPROVE, decider, ""
    if effect == "read":
        return Decision.APPROVE, Decider(kind=DeciderKind.READ_ONLY_POLICY, verdict=Verdict.ALLOW), ""
    return Decision.CARD, None, ""
