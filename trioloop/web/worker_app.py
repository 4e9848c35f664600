"""The app a worker runs (`WorkerApp`): what it needs to open any session of the fleet's store and carry its turn on.

A worker holds no configuration of its own beyond its store: the document kind, the tools the turns offered, the
model (a provider made per session), the keys that sign and verify, the limits and the rules are the app's, as the
app's own processes pass them to `Session.open`. ``trioloop worker --app module:factory`` imports ``module`` and
calls ``factory()`` for one (`load_app`), so the worker and the app share one definition.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable
from typing import Any, Literal, final

import attrs

from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.durable.witness import HeadWitness
from trioloop.machine.document import TextDocumentKind
from trioloop.machine.limits import DEFAULT_TURN_LIMITS, TurnLimits
from trioloop.machine.rules import ApprovalRule
from trioloop.machine.tools import RegisteredTool
from trioloop.protocol.provider import ChatProvider

__all__ = ["AppLoadError", "ProviderFactory", "WorkerApp", "load_app"]

#: Makes the provider one session's turn talks to: called with the session id, entered for as long as the worker
#: carries that session (``ScriptedProvider(...)``, ``AnthropicProvider()`` are such context managers).
ProviderFactory = Callable[[str], contextlib.AbstractAsyncContextManager[ChatProvider]]


class AppLoadError(Exception):
    """``--app module:factory`` did not give a `WorkerApp`: the message says what was missing or wrong."""


def _tools(value: Iterable[RegisteredTool[Any]]) -> tuple[RegisteredTool[Any], ...]:
    return tuple(value)


def _rules(value: Iterable[ApprovalRule]) -> tuple[ApprovalRule, ...]:
    return tuple(value)


@final
@attrs.frozen(kw_only=True)
class WorkerApp:
    """What a worker opens every session with (the arguments of `Session.open` an app passes, but the session)."""

    #: The document kind the sessions edit (with a text form: journals keep documents as text).
    kind: TextDocumentKind[Any]
    #: The tools the journaled turns offered (`ToolsMissing` names any left out when a session is opened).
    tools: tuple[RegisteredTool[Any], ...] = attrs.field(converter=_tools)
    #: A provider for one session (see `ProviderFactory`).
    provider: ProviderFactory
    #: Public keys whose records and seals are accepted besides the signer's own: the inbox server's, and the
    #: app's earlier keys. A worker that accepts no server key refuses every decision from the inbox.
    keys: JournalKeys | None = None
    #: The key that signs what the worker appends (the fleet's: `JournalSigner.load`, or ``"default"``: the key
    #: ``TRIOLOOP_JOURNAL_KEY`` names, else the per-user one), or None for unsigned journals.
    signer: JournalSigner | Literal["default"] | None = "default"
    #: Where signed heads are witnessed (a fleet passes one shared by every worker), as `Session.open` takes it.
    witness: HeadWitness | Literal["default"] | None = "default"
    limits: TurnLimits = DEFAULT_TURN_LIMITS
    rules: tuple[ApprovalRule, ...] = attrs.field(default=(), converter=_rules)
    #: The model the turns ask (None: the one the journal names).
    model: str | None = None

    def with_keys(self, more: JournalKeys | None) -> WorkerApp:
        """This app also accepting ``more`` (``--key``, ``--keys`` on the command line)."""
        if not more:
            return self
        return attrs.evolve(self, keys=more if not self.keys else self.keys | more)


def load_app(spec: str) -> WorkerApp:
    """The `WorkerApp` ``module:factory`` names: ``module`` imported, ``factory()`` called. `AppLoadError` when the
    spec is malformed, the module or the attribute is missing, or the factory gives something else."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(f"--app takes module:factory (e.g. myapp.fleet:worker_app), not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise AppLoadError(f"no module named {module_name!r} (is it on PYTHONPATH?)") from None
        raise
    factory: Any = module
    for part in attribute.split("."):
        try:
            factory = getattr(factory, part)
        except AttributeError:
            raise AppLoadError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(factory):
        raise AppLoadError(f"{spec} is not callable: name a function that returns a WorkerApp")
    app = factory()
    if not isinstance(app, WorkerApp):
        raise AppLoadError(f"{spec}() returned {type(app).__name__}, not a WorkerApp")
    return app
