"""The names and values the spans and metrics carry: ``gen_ai.provider.name`` for a provider, the
``gen_ai.usage.*`` attributes, and the low-cardinality words for how a request, a review or a call ended.
Pure functions of a provider or a published `TurnState`: nothing here opens, ends or records anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, TypeAlias

from trioloop.machine.limits import Bound
from trioloop.machine.reducer import CallRecord, Outcome, TurnState
from trioloop.machine.rules import Decider
from trioloop.machine.untrusted_text import sanitize_scalar
from trioloop.protocol.events import Usage
from trioloop.providers.anthropic import AnthropicProvider
from trioloop.providers.fallback import FallbackProvider
from trioloop.providers.openai import OpenAIProvider
from trioloop.providers.openai_responses import OpenAIResponsesProvider

TurnEnd: TypeAlias = Literal["settled", "suspended", "abandoned"]
_Attrs: TypeAlias = dict[str, Any]

_SCOPE: Final = "trioloop"
#: The longest ``trioloop.call.decider`` text, in code points (a longer one is cut, ending in "…").
DECIDER_TEXT_MAX: Final = 256


def gen_ai_provider_name(provider: object) -> str:
    """The ``gen_ai.provider.name`` for a provider: ``anthropic`` or ``openai`` for the shipped ones (the
    scripted provider by the wire it serves), else the provider's class name. For a `FallbackProvider`, its first
    provider's (each ``chat`` span names the provider that answered: `answering_names`)."""
    if isinstance(provider, FallbackProvider):
        return gen_ai_provider_name(provider.providers[0])
    if isinstance(provider, AnthropicProvider):
        return "anthropic"
    if isinstance(provider, OpenAIProvider | OpenAIResponsesProvider):
        return "openai"
    # HttpChatProvider and ScriptedProvider keep their WireFormat here; its ``name`` is public protocol.
    name = getattr(getattr(provider, "_wire", None), "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


def answering_names(provider: object) -> dict[str, str]:
    """For a `FallbackProvider`, each of its names mapped to that provider's ``gen_ai.provider.name``; else empty."""
    if not isinstance(provider, FallbackProvider):
        return {}
    return {name: gen_ai_provider_name(p) for name, p in zip(provider.names, provider.providers, strict=True)}


def _usage_minus(a: Usage, b: Usage) -> tuple[int, int, int, int, int]:
    return (
        a.input_tokens - b.input_tokens,
        a.output_tokens - b.output_tokens,
        a.cache_read_input_tokens - b.cache_read_input_tokens,
        a.cache_creation_input_tokens - b.cache_creation_input_tokens,
        a.reasoning_tokens - b.reasoning_tokens,
    )


def _usage_attributes(usage: Usage | Sequence[int]) -> _Attrs:
    """The ``gen_ai.usage.*`` attributes; the cache and reasoning ones only when not zero."""
    if isinstance(usage, Usage):
        usage = _usage_minus(usage, Usage())
    attributes: _Attrs = {"gen_ai.usage.input_tokens": usage[0], "gen_ai.usage.output_tokens": usage[1]}
    for name, value in zip(_EXTRA_USAGE, usage[2:], strict=True):
        if value:
            attributes[name] = value
    return attributes


_EXTRA_USAGE: Final = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.reasoning.output_tokens",
)


def _bound(state: TurnState) -> Bound | None:
    return state.bound if state.outcome is Outcome.BOUNDED else None


def _review_outcome(state: TurnState) -> str:
    if not state.is_settled:
        return "decided"
    bound = _bound(state)
    return bound.value if bound is not None else (state.outcome.value if state.outcome is not None else "settled")


def _request_outcome(state: TurnState, same_iteration: bool) -> str:
    """``responded``, or how the turn settled while the request was open (``cancelled``, ``bounded``, ``failed``)."""
    outcome = state.outcome
    if not same_iteration or outcome is None or outcome is Outcome.COMPLETED:
        return "responded"
    return outcome.value


def _call_error(call: CallRecord, state: TurnState, ran: bool) -> str:
    """A low-cardinality name for why ``call`` failed: the rule it broke, its input, or the tool's run."""
    for record in reversed(state.violations):
        if record.call_id == call.id:
            return record.violation.value
    if not call.input_digest:
        return "invalid_input"
    return "tool_error" if ran else "not_run"


def _decider_attributes(decider: Decider | None, *, capture: bool) -> _Attrs:
    """Who decided a call (for a call whose card was still open when the turn ended: the rule or function that
    asked for it): ``trioloop.call.decided_by``, the kind (person, read_only_policy, rule, code), and
    ``trioloop.call.decider``, its `Decider.describe` text, sanitized and capped. What a rule says of the input
    (``write_file path docs/**``; a person's "always with this input" quotes the whole input) and a reviewer's name
    are content: without ``capture`` the text names the rule only (``approved by rule 3 of .trioloop/rules.toml``)
    and the person as "the person"."""
    if decider is None:
        return {}
    if not capture:
        decider = Decider(kind=decider.kind, verdict=decider.verdict, source=decider.source, number=decider.number)
    text, _ = sanitize_scalar(decider.describe(), DECIDER_TEXT_MAX)
    return {"trioloop.call.decided_by": decider.kind.value, "trioloop.call.decider": text}
