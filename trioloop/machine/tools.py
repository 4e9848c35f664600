"""What the machine knows of a tool: its name, effect and how it prepares a call, the prepared call a grant
binds to (summary, input digest, card details, preview), the outcome a run produced, and the frozen registry.

Pure values: nothing here runs a tool. Running one is the runtime's job (`trioloop.runtime.tools`), which hands
each run its `ToolExecutionContext`; the machine never sees that context, so it types a run's argument loosely.
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, Literal, TypeAlias, TypeVar, final

import attrs

from trioloop.machine.card import CardDetails
from trioloop.machine.preview import Preview
from trioloop.machine.reservations import IdClaim, Reservation
from trioloop.protocol.tools import ToolDefinition

__all__ = [
    "ClaimingCall",
    "Effect",
    "InvokeFn",
    "PrepareFailure",
    "PrepareFn",
    "PreparedCall",
    "RegisteredTool",
    "RunFn",
    "ToolOutcome",
    "ToolRegistry",
    "create_tool_registry",
]

Effect: TypeAlias = Literal["read", "mutate"]
#: The document type a tool works on (any type: see `trioloop.machine.document.DocumentKind`).
D = TypeVar("D")


@attrs.frozen(kw_only=True)
class ToolOutcome(Generic[D]):
    """What a tool run produced: ok with a result text and maybe a whole next document, or an error."""

    ok: bool
    result: str
    document: D | None = None

    @classmethod
    def success(cls, result: str, document: D | None = None) -> ToolOutcome[D]:
        """A successful run: ``result`` for the model and, for a mutation, the whole next ``document``."""
        return cls(ok=True, result=result, document=document)

    @classmethod
    def failure(cls, result: str) -> ToolOutcome[D]:
        """A failed run: ``result`` is the error text the model receives; nothing is committed."""
        return cls(ok=False, result=result, document=None)

    @property
    def is_text(self) -> bool:
        """Whether ``ok`` and ``result`` really are a bool and a str (the class does not check its fields)."""
        return type(self.ok) is bool and type(self.result) is str


#: How an approved call runs: called by the runtime with the call's `ToolExecutionContext`
#: (`trioloop.runtime.tools`, which types it); awaited in the call's task.
RunFn: TypeAlias = Callable[[Any], Awaitable[ToolOutcome[D]]]
#: The tool's own function, called directly with that context: its outcome when it returned without awaiting (a
#: plain ``def`` tool), or the awaitable an ``async def`` tool returns, still to be awaited.
InvokeFn: TypeAlias = Callable[[Any], "ToolOutcome[D] | Awaitable[ToolOutcome[D]]"]


@attrs.frozen(kw_only=True, repr=False, eq=False)
class PreparedCall(Generic[D]):
    """A validated call: plain-text summary for the reviewer, the digest a grant binds to, and ``run``.

    ``details`` is the whole input the digest covers, as ordered (field path, value) lines for the
    card (`trioloop.machine.card`); ``preview`` (when the tool declares one) is its dry run, bound to this
    input: ``preview(document) -> Preview`` (`trioloop.machine.preview`). ``details`` may be given as a
    function of no arguments instead of the lines themselves: it is then called on the first read and
    its lines kept (a call auto-approved by the read-only policy is never shown on a card, so it need
    not pay for them). The function must be pure, over a value no one else holds: what it returns is
    what the card shows, whenever it is first read.

    ``invoke``, when set, is the same run without the ``async`` wrapper: it returns the outcome
    itself when the tool finished without awaiting, and the runner then settles the call in place,
    with no task and no scheduler pass (a plain ``def`` tool cannot see a checkpoint anyway); what it
    returns otherwise is awaited in the call's task, as ``run`` would be.

    A call whose run adds something under new ids is a `ClaimingCall`; any other claims none.
    """

    summary: str
    input_digest: str
    run: RunFn[D] = attrs.field(eq=False, repr=False)
    _details: CardDetails | Callable[[], CardDetails] = attrs.field(default=(), alias="details")
    preview: Callable[[Any], Preview] | None = attrs.field(default=None, eq=False, repr=False)
    invoke: InvokeFn[D] | None = attrs.field(default=None, eq=False, repr=False)
    #: The input as the digest covers it (plain JSON values: what approval rules' conditions read), or None
    #: when the tool does not give it (a rule with conditions then never holds for the call).
    canonical: Any = attrs.field(default=None, eq=False, repr=False)

    # Read-only here, fields of a `ClaimingCall`: a call that claims no id pays nothing for them.
    @property
    def claims(self) -> tuple[IdClaim, ...]:
        """The new ids the run takes: none (see `ClaimingCall`)."""
        return ()

    @property
    def reservations(self) -> tuple[Reservation, ...]:
        """The reservation of each claim: none."""
        return ()

    @property
    def with_ids(self) -> Callable[[tuple[Reservation, ...]], PreparedCall[D]] | None:
        """How this call is bound to its reservations: it has none to bind."""
        return None

    @property
    def details(self) -> CardDetails:
        """The input's (path, value) lines, made on the first read when they were given as a function."""
        details = self._details
        if callable(details):
            details = details()
            object.__setattr__(self, "_details", details)  # made once; every later read sees the same lines
        return details

    # Equal when summary, digest, details and reservations are (the functions are not compared), as attrs would
    # make it.
    def _key(self) -> tuple[str, str, CardDetails, tuple[Reservation, ...]]:
        return (self.summary, self.input_digest, self.details, self.reservations)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, PreparedCall)
        return self._key() == (other.summary, other.input_digest, other.details, other.reservations)

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"PreparedCall(summary={self.summary!r}, input_digest={self.input_digest!r}, details={self.details!r})"


@final
@attrs.frozen(kw_only=True, repr=False, eq=False)
class ClaimingCall(PreparedCall[D]):
    """A prepared call whose run adds something under new ids (`trioloop.machine.reservations`).

    ``claims`` holds one `IdClaim` per id (the id the input names, or one to reserve); ``with_ids`` makes this
    same call bound to one `Reservation` per claim, its ``reservations``. The reducer binds it where it prepares
    the step's calls; ``preview`` and ``run`` then use exactly the ids the reservations resolve to. Prepared
    outside a turn it has none, and counts from the document it is given.
    """

    claims: tuple[IdClaim, ...]
    with_ids: Callable[[tuple[Reservation, ...]], PreparedCall[D]] = attrs.field(eq=False, repr=False)
    reservations: tuple[Reservation, ...] = ()


@attrs.frozen(kw_only=True)
class PrepareFailure:
    """Raw input the tool refused; each issue is ``path: problem`` text the model can act on."""

    issues: tuple[str, ...]

    @property
    def message(self) -> str:
        """Every problem with the input, in one text the model and the card can read."""
        return "; ".join(self.issues)


PrepareFn: TypeAlias = Callable[[Any], "PreparedCall[D] | PrepareFailure"]


@attrs.frozen(kw_only=True)
class RegisteredTool(Generic[D]):
    """A tool the loop may offer: its name, description, effect, whether it is destructive, and how to prepare a call
    (validate the input, make the card and the digest)."""

    name: str
    description: str
    effect: Effect
    destructive: bool
    json_schema: Mapping[str, Any] = attrs.field(eq=False, repr=False)
    _prepare: PrepareFn[D] = attrs.field(eq=False, repr=False, alias="prepare_fn")
    #: A function of each valid call (`trioloop.runtime.approvals.ApprovalQuery`) returning allow, ask or deny
    #: (`trioloop.machine.rules.Verdict` or its text), run by the runtime before the reducer decides the call;
    #: the rules' safety table still holds (an allow never covers a destructive call).
    needs_approval: Callable[[Any], Any] | None = attrs.field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.effect not in ("read", "mutate"):
            raise ValueError(f'Tool "{self.name}": effect must be "read" or "mutate".')
        if self.effect == "read" and self.destructive:
            raise ValueError(f'Tool "{self.name}" cannot be both read-only and destructive.')

    def prepare(self, raw: Any) -> PreparedCall[D] | PrepareFailure:
        """Validate raw model input; never raises for any input."""
        try:
            return self._prepare(raw)
        except Exception as exc:  # a tool's summarize must not crash the reducer
            return PrepareFailure(issues=(f"the input could not be prepared ({type(exc).__name__})",))

    @property
    def definition(self) -> ToolDefinition:
        """The tool as a provider sends it to the model: name, description, JSON schema."""
        return ToolDefinition(name=self.name, description=self.description, json_schema=self.json_schema)


@attrs.frozen
class ToolRegistry(Generic[D]):
    """A frozen, ordered set of tools resolved by exact name (no trimming, folding or normalizing)."""

    tools: tuple[RegisteredTool[D], ...]
    _by_name: Mapping[str, RegisteredTool[D]] = attrs.field(init=False, repr=False, eq=False)
    _definitions: tuple[ToolDefinition, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_name: dict[str, RegisteredTool[D]] = {}
        for tool in self.tools:
            if tool.name in by_name:
                raise ValueError(f'Duplicate tool name "{tool.name}" in registry.')
            by_name[tool.name] = tool
        object.__setattr__(self, "_by_name", types.MappingProxyType(by_name))
        # Built once: every model request carries them.
        object.__setattr__(self, "_definitions", tuple(t.definition for t in self.tools))

    def get(self, name: str) -> RegisteredTool[D] | None:
        """The tool named ``name``, or None."""
        if type(name) is not str:
            return None
        return self._by_name.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and type(name) is str and name in self._by_name

    def __iter__(self) -> Iterator[RegisteredTool[D]]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    @property
    def names(self) -> tuple[str, ...]:
        """The tools' names, in registration order."""
        return tuple(t.name for t in self.tools)

    def definitions(self) -> tuple[ToolDefinition, ...]:
        """Every tool's definition, in registration order (what a request offers the model)."""
        return self._definitions


def create_tool_registry(tools: Iterable[RegisteredTool[D]] = ()) -> ToolRegistry[D]:
    """A frozen registry of ``tools`` in the order given (what the model sees); duplicate names are refused."""
    return ToolRegistry(tuple(tools))
