"""Stop and the turn deadline landing at every Trio checkpoint of a multi-iteration turn.

A reference run of a scripted three-iteration turn (streamed text, concurrent reads, a batch
approval, a denied destructive call, serialized commits) counts the turn's task steps K with a
``trio.abc.Instrument``. The turn is then re-run once per cut point k = 1..K: the instrument calls
``controls.stop()`` (or jumps the ``MockClock`` onto the turn deadline) just before the k-th task
step. After every run the turn must be settled within a few task steps, with nothing escaping, no
task it started still alive, the document at a committed prefix of the approved edits (exactly the
calls the state reports as succeeded), at most one undo entry that restores the pre-turn document
exactly, a pairable history, and no tool run without a consumed grant for that call, tool, input
and iteration. The in-process wire replay gives a repeatable schedule (Trio's shuffle is seeded), so
every cut point is covered; the same sweep over the scripted provider's real socket is sampled.
"""

from __future__ import annotations

import gc
import random
import socket
import warnings
from collections.abc import Callable
from typing import Any, Literal

import attrs
import pytest
import trio
import trio.testing
from torture_support import RunLog, WireReplayProvider, approver, evenly, payment, probe_tools, record, response, scaled

from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.machine.tools import create_tool_registry
from trioloop.machine.transaction import undo_turn
from trioloop.protocol import assert_tool_pairing
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireFormat
from trioloop.providers.openai import OPENAI_WIRE
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.threatmodel import THREAT_MODEL, ThreatModel

WIRES: dict[str, WireFormat] = {"anthropic": ANTHROPIC_WIRE, "openai": OPENAI_WIRE}
DEADLINE_S = 60.0
TURN_ID = "turn-torture"
MUTATIONS = ("m1", "m2", "m3")  # the approved edits, in the order they commit
DENIED = frozenset({"d1"})
#: Most cut points per schedule (K is about 230, so every one is covered).
CUT_BUDGET = 1000
#: Task steps a turn may take to settle after Stop or the deadline lands (about 13 measured).
UNWIND_STEPS = 30


def _calls(*ids: str) -> list[tuple[str, str, Any]]:
    tools = {"r": "probe_read", "m": "probe_add", "d": "probe_delete"}
    return [(cid, tools[cid[0]], {"note": cid}) for cid in ids]


#: The model's three answers: reads beside an edit, a batch with a destructive call, a final text.
SCRIPT: list[tuple[str, list[tuple[str, str, Any]]]] = [
    ("Reading the model first, then adding one threat.", _calls("r1", "r2", "m1")),
    ("Two more threats; the stale one goes.", _calls("m2", "d1", "m3", "r3")),
    ("Done: three threats added.", []),
]


def script() -> list[Any]:
    return [response(text, calls) for text, calls in SCRIPT]


def scripted_steps() -> list[ScriptStep]:
    return [
        ScriptStep(text=text, tool_calls=[ScriptedCall(id=c, name=n, input=i) for c, n, i in calls])
        for text, calls in SCRIPT
    ]


class Cutter(trio.abc.Instrument):
    """Counts task steps while armed, fires ``action`` just before step ``cut_at``, tracks live tasks."""

    def __init__(self, cut_at: int | None) -> None:
        self.cut_at = cut_at
        self.action: Callable[[], bool] = lambda: False
        self.armed = False
        self.steps = 0
        self.fired: bool | None = None  # whether the turn was still live when the cut landed
        self.live: set[trio.lowlevel.Task] = set()
        self.spawned: list[trio.lowlevel.Task] = []  # tasks started while the turn ran

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.live.add(task)
        if self.armed:
            self.spawned.append(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.live.discard(task)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if not self.armed:
            return
        self.steps += 1
        if self.steps == self.cut_at:
            self.fired = self.action()


@attrs.frozen
class Run:
    final: TurnState
    pre: ThreatModel
    workspace: Workspace
    log: RunLog
    steps: int
    fired: bool | None
    leftover_tasks: tuple[str, ...]
    abandoned_generators: tuple[str, ...] = ()


def run_once(
    wire: str,
    mode: Literal["stop", "deadline"],
    cut_at: int | None,
    *,
    seed: int = 0,
    loopback: bool = False,
) -> Run:
    """One whole turn in a fresh ``trio.run`` with a frozen ``MockClock``; cut at step ``cut_at``.

    The provider is the in-process wire replay (a repeatable schedule), or with ``loopback`` the
    scripted provider over a real socket (the real transport, but a schedule that varies a little).
    """
    _seed_scheduler(seed)
    clock = trio.testing.MockClock()
    cutter = Cutter(cut_at)
    log = RunLog()
    pre = payment()
    workspace = Workspace(document=pre, kind=THREAT_MODEL)

    async def main() -> tuple[TurnState, tuple[str, ...]]:
        controls = TurnControls()
        latest: list[TurnState] = []
        review = approver(deny=DENIED, batch=True)

        def observe(state: TurnState) -> None:
            latest.append(state)
            review(state, controls)

        def cut() -> bool:
            live = bool(latest) and not latest[-1].is_settled
            if mode == "stop":
                return controls.stop() and live
            clock.jump(DEADLINE_S)
            # The turn deadline stands still while the turn waits for the reviewer: a jump then is
            # review time, and the turn goes on (its deadline moves forward by the time waited).
            return live and latest[-1].phase is not Phase.AWAITING_APPROVAL

        cutter.action = cut
        request = TurnRequest(
            text="Add threats for the payment flow.",
            turn_id=TURN_ID,
            model="scripted-1",
            registry=create_tool_registry(probe_tools(log)),
            limits=TurnLimits(turn_deadline_ms=int(DEADLINE_S * 1000)),
        )

        async def go(provider: Any) -> TurnState:
            cutter.armed = True
            try:
                return await run_turn(request, workspace, provider, controls=controls, on_state=observe)
            finally:
                cutter.armed = False

        if loopback:
            async with ScriptedProvider(scripted_steps(), wire=wire) as scripted:  # type: ignore[arg-type]
                final = await go(scripted)
        else:
            final = await go(WireReplayProvider(script(), wire=WIRES[wire], chunk=96))
        # Every task the turn started has exited (the fake server's own connection tasks aside).
        leftover = tuple(t.name for t in cutter.spawned if t in cutter.live and "_loopback" not in t.name)
        return final, leftover

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        final, leftover = trio.run(main, clock=clock, instruments=[cutter])
        if loopback:
            gc.collect()  # an abandoned async generator warns when collected: collect it here, attributed
    leaks = tuple(str(w.message).split("'")[1] for w in caught if "garbage collected" in str(w.message))
    unexpected = [w for w in caught if "garbage collected" not in str(w.message)]
    assert not unexpected, [str(w.message) for w in unexpected]
    return Run(final, pre, workspace, log, cutter.steps, cutter.fired, leftover, leaks)


def _seed_scheduler(seed: int) -> None:
    """Make Trio's batch shuffling repeatable so a cut point names the same step in every run.

    Trio keeps the generator it shuffles with in a private module global; when it is not there the
    harness still holds (every invariant is checked at whatever step the cut lands), only less exactly.
    """
    generator = getattr(getattr(trio, "_core", None), "_run", None)
    shuffler = getattr(generator, "_r", None)
    if isinstance(shuffler, random.Random):
        shuffler.seed(seed)


def check(run: Run, mode: str) -> str:
    """Assert every invariant of a cut run; return the outcome label it settled with."""
    final, pre, workspace = run.final, run.pre, run.workspace
    assert final.is_settled
    assert not run.leftover_tasks, run.leftover_tasks
    assert assert_tool_pairing(final.messages) == ()

    # The document is the pre-turn one with a prefix of the approved edits committed, and exactly the
    # edits the state reports as succeeded: state and document never disagree about a commit.
    succeeded = [c.id for c in final.calls if c.tool_name == "probe_add" and c.status is CallStatus.SUCCEEDED]
    assert tuple(succeeded) == MUTATIONS[: len(succeeded)]
    added = tuple(t.id for t in workspace.document.threats[len(pre.threats) :])
    assert added == tuple(succeeded)
    assert attrs.evolve(workspace.document, threats=pre.threats) == pre
    assert workspace.document.threats[: len(pre.threats)] == pre.threats

    # One undo entry at most, and undo gives back exactly the pre-turn document.
    assert len(workspace.undo.entries) <= 1
    if succeeded:
        undone = undo_turn(workspace.undo, workspace.document, TURN_ID)
        assert undone is not None and undone[0] == pre and undone[1].entries == ()
    else:
        assert workspace.document is pre and workspace.undo.entries == ()

    # Every run had a consumed grant for exactly that call, tool, input and iteration; none ran twice.
    notes = [note for note, _, _ in run.log.started]
    assert len(notes) == len(set(notes))
    for note, tool, digest in run.log.started:
        call = final.call(note)
        assert call is not None and call.tool_name == tool and call.input_digest == digest
        assert any(
            g.call_id == note
            and g.consumed
            and g.tool_name == tool
            and g.input_digest == digest
            and g.iteration == call.iteration
            for g in final.grants
        ), note
    assert "d1" not in notes
    for call in final.calls:
        if call.status is CallStatus.SUCCEEDED:
            assert call.id in run.log.finished
        if call.id in DENIED:
            assert call.status is CallStatus.DENIED

    if run.fired:
        # The cut landed while the turn was live: it ends cancelled (Stop) or bounded (deadline),
        # unless the very step it landed in settled the turn without reaching another checkpoint.
        expected = Outcome.CANCELLED if mode == "stop" else Outcome.BOUNDED
        assert final.outcome in (expected, Outcome.COMPLETED)
        if final.outcome is Outcome.COMPLETED:
            assert succeeded == list(MUTATIONS)
    else:
        assert final.outcome is Outcome.COMPLETED
    assert final.outcome is not None
    return final.outcome.value


def test_reference_turn_completes_with_every_edit() -> None:
    run = run_once("anthropic", "stop", None)
    assert check(run, "stop") == "completed"
    assert [c.status for c in run.final.calls] == [
        CallStatus.SUCCEEDED,
        CallStatus.SUCCEEDED,
        CallStatus.SUCCEEDED,
        CallStatus.SUCCEEDED,
        CallStatus.DENIED,
        CallStatus.SUCCEEDED,
        CallStatus.SUCCEEDED,
    ]
    assert len(run.workspace.undo.entries) == 1
    # The same seed gives the same schedule: a cut point names the same step in every run.
    assert run_once("anthropic", "stop", None).steps == run.steps


@pytest.mark.parametrize("mode", ["stop", "deadline"])
@pytest.mark.parametrize("wire", sorted(WIRES))
def test_cut_at_every_checkpoint(wire: str, mode: Literal["stop", "deadline"]) -> None:
    # Every cut point of one schedule; a larger scale repeats the sweep over more scheduler seeds,
    # i.e. over other interleavings of the same turn.
    outcomes: dict[str, int] = {}
    steps: set[int] = set()
    tried = unwind = 0
    for seed in range(scaled(1)):
        total = run_once(wire, mode, None, seed=seed).steps
        steps.add(total)
        cuts = evenly(total, CUT_BUDGET)
        for index in cuts:
            run = run_once(wire, mode, index + 1, seed=seed)
            label = check(run, mode) + (" (cut while live)" if run.fired else "")
            outcomes[label] = outcomes.get(label, 0) + 1
            if run.fired:
                # Wherever it lands, the cut ends the turn within a few task steps (no tool here
                # swallows the cancellation): the unwinding of what was running, nothing more.
                unwind = max(unwind, run.steps - (index + 1))
                assert run.steps - (index + 1) <= UNWIND_STEPS, (index, run.steps)
        tried += len(cuts)
        assert len(cuts) == total  # every cut point of this schedule was covered
    live = sum(n for label, n in outcomes.items() if "live" in label)
    assert live > 0.8 * tried  # nearly every step is inside the live turn
    assert outcomes.get(f"{'cancelled' if mode == 'stop' else 'bounded'} (cut while live)", 0) > 0
    summary = ", ".join(f"{n} {label}" for label, n in sorted(outcomes.items()))
    shown = "/".join(str(k) for k in sorted(steps))
    record(
        f"{mode} at checkpoint k ({wire} wire)",
        tried=tried,
        held=tried,
        note=f"K={shown} task steps; all {tried} cut points covered ({scaled(1)} schedule(s)); "
        f"settled ≤ {unwind} task steps after the cut; {summary}",
    )


#: Cut points per mode over the real socket at scale 1 (all of them, about 175, from scale 10 on).
LOOPBACK_BUDGET = 40


# A collection after every run (see `run_once`): `young_heap` keeps each one to what the runs made.
@pytest.mark.usefixtures("young_heap")
@pytest.mark.parametrize("mode", ["stop", "deadline"])
def test_cut_at_sampled_checkpoints_over_the_socket(mode: Literal["stop", "deadline"]) -> None:
    reference = run_once("anthropic", mode, None, loopback=True)
    assert check(reference, mode) == "completed"
    total = reference.steps
    cuts = evenly(total, scaled(LOOPBACK_BUDGET))
    outcomes: dict[str, int] = {}
    for index in cuts:
        run = run_once("anthropic", mode, index + 1, loopback=True)
        label = check(run, mode) + (" (cut while live)" if run.fired else "")
        outcomes[label] = outcomes.get(label, 0) + 1
        assert not run.abandoned_generators, run.abandoned_generators  # no request body left half-sent
    summary = ", ".join(f"{n} {label}" for label, n in sorted(outcomes.items()))
    record(
        f"{mode} at sampled checkpoints (scripted provider over loopback HTTP)",
        tried=len(cuts),
        held=len(cuts),
        note=f"K≈{total} task steps (varies a little run to run); {len(cuts)} cut points; {summary}",
    )


def test_stop_while_the_request_body_is_written_leaves_no_generator_behind() -> None:
    from trioloop.protocol import ChatRequest, Message, StreamEvent
    from trioloop.providers import AnthropicProvider

    async def main() -> None:
        # A server that accepts and never reads: the 16 MB body fills both socket buffers and the write
        # blocks, which is where Stop lands.
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        listeners[0].socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # accepted sockets inherit it
        port = listeners[0].socket.getsockname()[1]
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            accepted.append(await listeners[0].accept())
            await trio.sleep_forever()

        request = ChatRequest(model="unlisted-model", messages=(Message.user("x" * 16_000_000),))
        send, _receive = trio.open_memory_channel[StreamEvent](10)
        provider = AnthropicProvider("k", base_url=f"http://127.0.0.1:{port}", retry=None)
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            nursery.start_soon(lambda: provider.stream(request, send, cancel_scope=scope))
            await trio.testing.wait_all_tasks_blocked(0.05)
            scope.cancel()  # what Stop does to the provider's scope
            await trio.testing.wait_all_tasks_blocked(0.05)
            nursery.cancel_scope.cancel()
        for stream in accepted:
            await stream.aclose()
        for listener in listeners:
            await listener.aclose()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trio.run(main)
        gc.collect()
    abandoned = [str(w.message) for w in caught if "garbage collected" in str(w.message)]
    record("Stop while the request body is written", tried=1, held=int(not abandoned))
    assert not abandoned, abandoned
