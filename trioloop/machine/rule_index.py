"""How a rule set decides a call without trying each rule: the rules naming one tool, split by verdict (deny, ask,
allow) into tiers; in each tier, the single-condition rules that hold for strings only (glob, prefix, equals a
string, one of strings) on the same field joined into one regular expression whose named alternatives say which
rule matched first, and the rest tried one by one. The rule found is the same the plain reading finds: the first
rule (in the set's order) of the strongest verdict whose conditions all hold (``tests/test_rules.py`` checks the
two agree for arbitrary rules and inputs)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final, final

import attrs

from trioloop.machine.conditions import resolve_pointer

__all__ = ["RulePlan", "plan_rules"]

_MISSING: Final = object()
_VERDICT_ORDER: Final = ("deny", "ask", "allow")


@final
@attrs.frozen
class _Group:
    """Rules on one field whose conditions are string patterns: one expression, an alternative per rule."""

    tokens: tuple[str, ...]
    regex: re.Pattern[str]
    positions: dict[str, int]  # group name -> the rule's position in the tool's candidates


@final
@attrs.frozen
class _Tier:
    groups: tuple[_Group, ...]
    others: tuple[tuple[int, Any], ...]  # (position, rule), in order


@final
@attrs.frozen
class RulePlan:
    """The candidates of one tool, planned: `deciding` finds the rule that decides a call."""

    candidates: tuple[Any, ...]
    tiers: tuple[_Tier, ...]

    def deciding(self, canonical: Any) -> Any:
        """The first rule of the strongest verdict whose conditions all hold on ``canonical``, or None."""
        if canonical is None:  # no canonical input: only rules without conditions can hold
            for tier in self.tiers:
                for _, rule in tier.others:
                    if not rule.when:
                        return rule
            return None
        for tier in self.tiers:
            found = -1
            for group in tier.groups:
                field = resolve_pointer(canonical, group.tokens) if group.tokens else canonical
                if type(field) is str:
                    hit = group.regex.fullmatch(field)
                    if hit is not None and hit.lastgroup is not None:
                        position = group.positions[hit.lastgroup]
                        if found < 0 or position < found:
                            found = position
            for position, rule in tier.others:
                if 0 <= found < position:
                    break  # a rule earlier in the order already holds
                if rule.holds(canonical):
                    found = position
                    break
            if found >= 0:
                return self.candidates[found]
        return None


def plan_rules(candidates: Sequence[Any]) -> RulePlan:
    """The plan for one tool's candidate rules (in the set's order)."""
    tiers = []
    for verdict in _VERDICT_ORDER:
        by_field: dict[tuple[str, ...], list[tuple[int, str]]] = {}
        others: list[tuple[int, Any]] = []
        for position, rule in enumerate(candidates):
            if rule.verdict.value != verdict:
                continue
            pattern = rule.when[0].string_pattern() if len(rule.when) == 1 else None
            if pattern is None:
                others.append((position, rule))
            else:
                by_field.setdefault(rule.when[0].tokens, []).append((position, pattern))
        groups = []
        for tokens, patterns in by_field.items():
            names = {f"r{position}": position for position, _ in patterns}
            source = "|".join(f"(?P<r{position}>{pattern})" for position, pattern in patterns)
            groups.append(_Group(tokens=tokens, regex=re.compile(source, re.DOTALL), positions=names))
        if groups or others:
            tiers.append(_Tier(groups=tuple(groups), others=tuple(others)))
    return RulePlan(candidates=tuple(candidates), tiers=tuple(tiers))
