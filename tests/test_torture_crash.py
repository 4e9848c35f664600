"""Crash torture: a journaled turn killed with SIGKILL at every journal append, inside tools and at random instants.

The turn (``tests/crash_worker.py``): two reads, then mutations reviewed by the plan (a batch approval of two, an
edit on approval, a denial, a destructive call approved alone), one more mutation, a final answer; a real SQLite
journal file, the scripted provider over real loopback HTTP. A few zygotes per test fork a fresh process per kill
point; the process is killed right before or right after its k-th append, inside a tool once its run is counted,
at a random instant (a seeded RNG, ``TRIOLOOP_TORTURE_SEED`` to repeat one; the seed is in every failure message),
while suspending, or while a resumed process appends. After each kill a fresh process reopens the journal, shows
the pending cards, and drives the turn to its end with the same review plan. What must hold every time:

- the journal opens and its hash chain verifies, after every kill (the crashed SQLite files are opened as left);
- what the killed process let out is journaled: a request that reached the model belongs to a journaled turn,
  and every card the reviewer was shown is in the journal;
- the reopened pending cards are the ones the journal durably recorded before the kill;
- no call ran twice (each tool run is counted in a file, fsynced, before the tool does anything else);
- every call that was running at a kill settles failed with ``INTERRUPTED_CALL_TEXT``, and only those;
- the document equals the fold of exactly the calls whose commit was journaled, in journal order;
- the turn completes, its history is pairable, and undo restores the document from before the turn.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from crash_worker import CALLS, DENIALS, INITIAL, NOTE, READS, SESSION_ID, TOOLS, apply_call
from torture_support import SCALE, record

from trioloop.durable.journal import JournalEntry, decode_entries, verify_chain
from trioloop.durable.replay import INTERRUPTED_CALL_TEXT, replay_journal
from trioloop.durable.signing import JournalSigner
from trioloop.durable.store import StoredEntry
from trioloop.machine.tools import create_tool_registry

WORKER = Path(__file__).resolve().parent / "crash_worker.py"
#: Kill points in the default run: the deterministic ones, then random instants up to this (at least 400 of them).
KILL_POINTS = 500
RANDOM_KILLS = 400
SEED = int(os.environ.get("TRIOLOOP_TORTURE_SEED", random.SystemRandom().randrange(2**32)))
REGISTRY = create_tool_registry(TOOLS)
MUTATIONS = frozenset(CALLS) - READS - frozenset(DENIALS)
ZYGOTES = min(8, 2 * (os.cpu_count() or 1))


APPEND_KILLS = ("before_append", "after_append")
CATEGORIES = {
    "append": "kill right before / right after journal append k",
    "tool": "kill inside a tool, its run counted",
    "suspend": "kill while suspending in review (before / after each append)",
    "resumed": "kill while a resumed process appends or runs a tool",
    "random": "kill at a random instant",
}


class Zygote:
    """The worker process: one JSON command in, one forked scenario process run, one JSON line out."""

    def __init__(self, log: Path) -> None:
        self._log = log.open("wb")
        self._process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=WORKER.parent,
            text=True,
        )

    def run(self, command: dict[str, Any]) -> dict[str, Any]:
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(command) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        assert line, f"the crash zygote died (see {self._log.name})"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.close()
        try:
            process.wait(timeout=30)
        finally:
            process.stdout.close()
            self._log.close()


@pytest.fixture
def zygotes(tmp_path: Path) -> Iterator[list[Zygote]]:
    """A few zygotes (the kill points are spread over them; each waits on its children's disk writes at times)."""
    JournalSigner.default()  # the per-user key, made once here rather than raced for by the zygotes' warm-ups
    started = [Zygote(tmp_path / f"zygote-{i}.log") for i in range(ZYGOTES)]
    try:
        yield started
    finally:
        for zygote in started:
            zygote.close()


# ---------------------------------------------------------------------------------------------
# Reading what a killed process left.


def stored_rows(db: Path) -> list[JournalEntry]:
    """The journal as a crash left it, read from a copy (the next process must open the crashed files itself)."""
    if not db.exists():
        return []
    with tempfile.TemporaryDirectory(prefix="crash-copy-") as scratch:
        copy = Path(scratch) / "copy.db"
        shutil.copyfile(db, copy)
        wal = Path(f"{db}-wal")
        if wal.exists():
            shutil.copyfile(wal, f"{copy}-wal")
        connection = sqlite3.connect(copy)
        try:
            rows = connection.execute(
                "SELECT seq, data FROM trioloop_journal WHERE session_id = ? ORDER BY seq", (SESSION_ID,)
            ).fetchall()
        except sqlite3.OperationalError:  # killed before the table was made
            rows = []
        finally:
            connection.close()
    return decode_entries(StoredEntry(seq, bytes(data)) for seq, data in rows)


def live_turn(entries: Sequence[JournalEntry]) -> list[JournalEntry]:
    """The entries of the last turn, from its ``submit`` on (none before any turn)."""
    starts = [i for i, e in enumerate(entries) if e.kind == "submit"]
    return list(entries[starts[-1] :]) if starts else []


def durable_pending_cards(entries: Sequence[JournalEntry]) -> list[dict[str, Any]]:
    """The cards still awaiting a decision, as the journal recorded them: the last answer's cards of mutations,
    less every call a durable decision (or revocation) took."""
    turn = live_turn(entries)
    streams = [i for i, e in enumerate(turn) if e.kind == "stream"]
    if not streams:
        return []
    last = streams[-1]
    decided: set[str] = set()
    for entry in turn[last + 1 :]:
        if entry.kind in ("approve", "deny", "revoke"):
            decided.add(entry.data["call_id"])
        elif entry.kind == "approve_batch":
            decided.update(entry.data["call_ids"])
    cards = turn[last].data.get("cards") or []
    # A call the read-only policy approved is never shown: the journal keeps only its digest.
    return [c for c in cards if c.get("effect", "read") != "read" and c["call_id"] not in decided]


def running_calls(entries: Sequence[JournalEntry]) -> set[str]:
    """Calls whose start is journaled and whose settlement is not: running when the process died."""
    started = {e.data["call_id"] for e in entries if e.kind == "start"}
    return started - {e.data["call_id"] for e in entries if e.kind == "settled"}


def read_seen(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="ascii").splitlines()]


def read_runs(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in path.read_text(encoding="ascii").splitlines()]  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# One kill point.


@attrs.frozen(kw_only=True)
class KillPoint:
    """Where the first process dies (``kill``, or a random instant) and, optionally, where the first resumed one
    does (``resume_kill``)."""

    category: str
    name: str
    mode: str = "original"
    kill: dict[str, Any] | None = None
    fraction: float | None = None  # a random instant: where in an uncut run (see `Timing`)
    resume_kill: dict[str, Any] | None = None
    #: False where the resumed kill is inside a call that must never run again (so it must not land).
    resume_kill_lands: bool = True


@attrs.define
class Outcome:
    landed: int = 0  # SIGKILLs that landed before the process ended (the first one and a resumed one)
    entries_at_kill: int = 0  # journal entries durable when the first process died
    interrupted: int = 0
    failure: str | None = None


class CrashCase:
    def __init__(self, point: KillPoint, directory: Path) -> None:
        self.point = point
        self.directory = directory
        self.db = directory / "journal.db"
        self.runs = directory / "runs.txt"
        self.seen = directory / "seen.jsonl"
        self.killed_while_running: dict[str, str] = {}  # call id -> label of the process killed while it ran
        self.delay_s: float | None = None

    def where(self) -> str:
        delay = "" if self.delay_s is None else f", killed {self.delay_s:.4f} s after the fork"
        return f"kill point {self.point.name!r} (seed {SEED}{delay}, dir {self.directory})"

    def command(
        self, label: str, mode: str, kill: dict[str, Any] | None, delay_s: float | None = None
    ) -> dict[str, Any]:
        command: dict[str, Any] = {
            "mode": mode,
            "db": str(self.db),
            "runs": str(self.runs),
            "seen": str(self.seen),
            "result": str(self.directory / f"{label}.json"),
            "label": label,
            "kill": kill,
        }
        if delay_s is not None:
            command["delay_s"] = delay_s
        return command

    def result(self, label: str) -> dict[str, Any] | None:
        path = self.directory / f"{label}.json"
        error = self.directory / f"{label}.json.error"
        assert not error.exists(), f"{self.where()}: process {label} failed:\n{error.read_text()}"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def after_kill(self, label: str) -> list[JournalEntry]:
        """What a killed process left: a journal that verifies and holds everything the process let out."""
        where = f"{self.where()}, after {label} died"
        entries = stored_rows(self.db)
        if entries:
            verify_chain(entries)
            replay_journal(entries, load_document=NOTE.load, registry=REGISTRY)
        for call_id in running_calls(entries):
            self.killed_while_running.setdefault(call_id, label)
        seen = [s for s in read_seen(self.seen) if s["label"] == label]
        if any(s["kind"] == "request" for s in seen):
            assert live_turn(entries), f"{where}: a request reached the model, but the journal holds no turn"
        journaled = [card for e in live_turn(entries) if e.kind == "stream" for card in e.data.get("cards") or ()]
        for shown in (card for s in seen if s["kind"] == "cards" for card in s["cards"]):
            assert shown in journaled, f"{where}: the card of {shown['call_id']} was shown but is not journaled"
        return entries

    def run(self, zygote: Zygote, timing: Timing) -> Outcome:
        point, outcome = self.point, Outcome()
        self.delay_s = None if point.fraction is None else timing.delay(point.fraction)
        reply = zygote.run(self.command("p0", point.mode, point.kill, self.delay_s))
        outcome.landed = int(self.landed("p0", reply, point.kill, must=True))
        before = self.after_kill("p0")
        outcome.entries_at_kill = len(before)
        for label, kill in (("p1", point.resume_kill), ("p2", None)):
            reply = zygote.run(self.command(label, "resume", kill))
            report = self.result(label)
            assert report is not None and "opened" in report, f"{self.where()}: {label} did not open: {reply}"
            self.check_opened(report["opened"], before)
            if self.landed(label, reply, kill, must=point.resume_kill_lands):
                outcome.landed += 1
                before = self.after_kill(label)
                continue
            assert "final" in report, f"{self.where()}: {label} ended {reply}: {report}"
            outcome.interrupted = self.check_end(report, before)
            return outcome
        raise AssertionError(f"{self.where()}: the turn never ended")

    def landed(self, label: str, reply: dict[str, Any], kill: dict[str, Any] | None, *, must: bool) -> bool:
        """Whether the process died by SIGKILL; else it must have ended cleanly, and a kill planned in it must be
        one that could not land (an append index past this run's appends, or a call that must never run)."""
        if reply["signal"] == signal.SIGKILL:
            assert kill is None or must, f"{self.where()}: {label} was killed in {kill}, which must never run"
            return True
        report = self.result(label)
        assert reply["exit"] == 0 and report is not None, f"{self.where()}: {label} ended {reply}: {report}"
        if kill is not None and must:
            short = kill.get("at") in APPEND_KILLS and report["appends"] < kill["index"]
            assert short, f"{self.where()}: the kill in {label} did not land: {reply}"
        return False

    def check_opened(self, opened: dict[str, Any], before: Sequence[JournalEntry]) -> None:
        expected = durable_pending_cards(before)
        assert opened["pending_cards"] == expected, f"{self.where()}: the reopened cards differ from the journal's"
        if expected:
            assert opened["suspended"] and opened["phase"] == "awaiting_approval", f"{self.where()}: {opened}"

    def check_end(self, report: dict[str, Any], before: Sequence[JournalEntry]) -> int:
        """The turn's end, with every process's runs: nothing twice, the interrupted calls exactly, the fold."""
        where = self.where()
        final = report["final"]
        assert final["outcome"] == "completed", f"{where}: the turn ended {final}"
        entries = stored_rows(self.db)
        verify_chain(entries)
        assert replay_journal(entries, load_document=NOTE.load, registry=REGISTRY).document == INITIAL, where

        runs = read_runs(self.runs)
        counts = collections.Counter(call_id for call_id, _ in runs)
        twice = sorted(c for c, n in counts.items() if n > 1)
        assert not twice, f"{where}: ran more than once: {twice} ({runs})"

        calls = {c["id"]: c for c in final["calls"]}
        assert set(calls) == set(CALLS), f"{where}: the turn's calls are {sorted(calls)}"
        settlements = [e for e in entries if e.kind == "settled"]
        interrupted = {e.data["call_id"] for e in settlements if e.data["result"] == INTERRUPTED_CALL_TEXT}
        assert interrupted == set(self.killed_while_running), (
            f"{where}: interrupted {sorted(interrupted)}, running at a kill {sorted(self.killed_while_running)}"
        )
        for call_id, killed_in in self.killed_while_running.items():
            assert calls[call_id]["status"] == "failed" and calls[call_id]["result"] == INTERRUPTED_CALL_TEXT, where
            ran_in = {label for c, label in runs if c == call_id}
            assert ran_in <= {killed_in}, f"{where}: {call_id} was run again after the kill, by {ran_in}"
        assert not [e for e in entries if e.kind == "revoke"], f"{where}: a call was revoked"

        # The fold of exactly the journaled commits, in journal order, is the document the turn ended with.
        committed = [e.data["call_id"] for e in settlements if e.data["ok"] and e.data["changed_document"]]
        document = INITIAL
        for call_id in committed:
            document = apply_call(document, call_id)
        undos = [i for i, e in enumerate(entries) if e.kind == "undo"]
        assert len(undos) == int(bool(committed)), f"{where}: {len(undos)} undo entries for commits {committed}"
        at_end = entries[: undos[0]] if undos else entries
        ended = replay_journal(at_end, load_document=NOTE.load, registry=REGISTRY).document
        assert ended == document, f"{where}: the journal's document {ended!r} is not the fold of {committed}"
        # The undo may already have been made durable by a process killed right after it.
        undone_before = any(e.kind == "undo" for e in before)
        for call_id, call in calls.items():
            if call_id in DENIALS:
                assert call["status"] == "denied" and call_id not in counts, f"{where}: {call}"
            elif call_id in committed:
                status = "undone" if undone_before else "succeeded"
                assert call["status"] == status and counts[call_id] == 1, f"{where}: {call}, runs {runs}"
            elif call_id not in self.killed_while_running:
                assert call["status"] == "succeeded" and counts[call_id] == 1, f"{where}: {call}, runs {runs}"
                assert call_id in READS, f"{where}: {call_id} succeeded without a journaled commit"
        assert final["document"] == (INITIAL if undone_before else document), f"{where}: the live document differs"
        assert final["pairing"] == [], f"{where}: history not pairable: {final['pairing']}"
        assert report["undo"] is (bool(committed) and not undone_before), f"{where}: undo returned {report['undo']}"
        assert report["after_undo"] == INITIAL, f"{where}: undo left {report['after_undo']!r}"
        return len(interrupted)


# ---------------------------------------------------------------------------------------------
# The harness.


@attrs.frozen(kw_only=True)
class Reference:
    """Uncut runs: how many appends a turn makes (the fewest of three), its entries, and the appends of a turn
    suspended in review and of the process that takes it up."""

    appends: int
    entries: int
    suspend_appends: int
    resume_appends: int


def reference(zygote: Zygote, directory: Path) -> Reference:
    appends = []
    for i in range(3):
        case = CrashCase(KillPoint(category="reference", name=f"reference {i}"), directory / f"reference-{i}")
        case.directory.mkdir(parents=True)
        reply = zygote.run(case.command("p0", "original", None))
        report = case.result("p0")
        assert reply["exit"] == 0 and report is not None and report["final"]["outcome"] == "completed", reply
        appends.append(report["appends"])
    entries = len(stored_rows(case.db))
    case = CrashCase(KillPoint(category="reference", name="reference suspend"), directory / "reference-suspend")
    case.directory.mkdir()
    zygote.run(case.command("p0", "suspend", None))
    suspended = case.result("p0")
    assert suspended is not None and suspended["suspended"], suspended
    zygote.run(case.command("p1", "resume", None))
    resumed = case.result("p1")
    assert resumed is not None and resumed["final"]["outcome"] == "completed", resumed
    return Reference(
        appends=min(appends),
        entries=entries,
        suspend_appends=suspended["appends"],
        resume_appends=resumed["appends"],
    )


def kill_points(ref: Reference) -> list[KillPoint]:
    rng = random.Random(SEED)
    points: list[KillPoint] = []
    for k in range(1, ref.appends + 1):
        for at in APPEND_KILLS:
            points.append(KillPoint(category="append", name=f"{at} {k}", kill={"at": at, "index": k}))
    for call_id in sorted(set(CALLS) - set(DENIALS)):
        points.append(KillPoint(category="tool", name=f"in {call_id}", kill={"call": call_id}))
    for k in range(1, ref.suspend_appends + 1):
        for at in APPEND_KILLS:
            kill = {"at": at, "index": k}
            points.append(KillPoint(category="suspend", name=f"suspending, {at} {k}", mode="suspend", kill=kill))
    resumed: list[tuple[str, dict[str, Any] | None, dict[str, Any]]] = [
        (f"suspended, then resumed and killed {at} {k}", None, {"at": at, "index": k})
        for k in range(1, ref.resume_appends + 1)
        for at in APPEND_KILLS
    ]
    resumed += [(f"suspended, then resumed and killed in {c}", None, {"call": c}) for c in sorted(MUTATIONS)]
    resumed += [
        (f"killed in m1, then resumed and killed {at} {k}", {"call": "m1"}, {"at": at, "index": k})
        for k in range(1, 4)
        for at in APPEND_KILLS
    ]
    for name, first_kill, resume_kill in resumed:
        mode = "suspend" if first_kill is None else "original"
        points.append(KillPoint(category="resumed", name=name, mode=mode, kill=first_kill, resume_kill=resume_kill))
    # A call interrupted by a kill is never run again: a kill waiting inside it in the resumed process never lands.
    points.append(
        KillPoint(
            category="resumed",
            name="killed in x1, then resumed with a kill in x1",
            kill={"call": "x1"},
            resume_kill={"call": "x1"},
            resume_kill_lands=False,
        )
    )
    # Random instants, as a fraction of an uncut run timed under the same load (`Timing`): about a tenth from
    # the fork to the first append (start-up, opening the journal), the rest from there to just past the end.
    for i in range(max(RANDOM_KILLS, KILL_POINTS - len(points)) * SCALE):
        fraction = rng.uniform(-0.1, 1.05)
        points.append(KillPoint(category="random", name=f"random {i} (fraction {fraction:.4f})", fraction=fraction))
    return points


class Timing:
    """When an uncut run appends first and ends, measured again every few kills on the zygote that runs them, so
    random instants keep landing across the turn however loaded the machine is."""

    EVERY = 25

    def __init__(self, zygote: Zygote, directory: Path) -> None:
        self._zygote = zygote
        self._directory = directory
        self._used = self.EVERY
        self._runs = 0
        self.first_s = self.end_s = 0.0

    def delay(self, fraction: float) -> float:
        if self._used >= self.EVERY:
            self._measure()
        self._used += 1
        if fraction < 0:
            return self.first_s * (1 + fraction * 10)
        return self.first_s + fraction * (self.end_s - self.first_s)

    def _measure(self) -> None:
        self._runs += 1
        case = CrashCase(KillPoint(category="timing", name="timing"), self._directory / f"timing-{self._runs}")
        case.directory.mkdir(parents=True)
        reply = self._zygote.run(case.command("p0", "original", None))
        report = case.result("p0")
        assert reply["exit"] == 0 and report is not None, reply
        self.first_s = report["append_times"][0] - reply["forked_at"]
        self.end_s = reply["seconds"]
        self._used = 0
        shutil.rmtree(case.directory)


def run_all(zygotes: list[Zygote], points: list[KillPoint], tmp_path: Path) -> list[tuple[KillPoint, Outcome]]:
    """Every kill point, spread over the zygotes (one harness thread each); a failure is kept, not raised."""
    outcomes: list[tuple[KillPoint, Outcome]] = []
    queue = collections.deque(enumerate(points))
    lock = threading.Lock()

    def worker(zygote: Zygote, number: int) -> None:
        timing = Timing(zygote, tmp_path / f"zygote-{number}")
        while True:
            with lock:
                if not queue:
                    return
                index, point = queue.popleft()
            directory = tmp_path / f"case-{index}"
            directory.mkdir()
            try:
                outcome = CrashCase(point, directory).run(zygote, timing)
            except Exception as exc:
                outcome = Outcome(failure=f"{type(exc).__name__}: {exc}")
            with lock:
                outcomes.append((point, outcome))
            if outcome.failure is None:
                shutil.rmtree(directory)

    threads = [threading.Thread(target=worker, args=(zygote, i)) for i, zygote in enumerate(zygotes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_sigkill_at_every_journal_append_inside_tools_and_at_random_instants(
    zygotes: list[Zygote], tmp_path: Path
) -> None:
    began = time.monotonic()
    ref = reference(zygotes[0], tmp_path)
    points = kill_points(ref)
    assert len(points) >= KILL_POINTS, len(points)
    outcomes = run_all(zygotes, points, tmp_path)
    wall = time.monotonic() - began
    assert len(outcomes) == len(points)

    by_category: dict[str, list[Outcome]] = {key: [] for key in CATEGORIES}
    for point, outcome in outcomes:
        by_category[point.category].append(outcome)
    lines = []
    for key, results in by_category.items():
        held = sum(o.failure is None for o in results)
        landed = sum(o.landed for o in results)
        interrupted = sum(o.interrupted for o in results)
        note = f"{landed} SIGKILLs landed, {interrupted} calls interrupted while running"
        if key == "append":
            note += f"; {ref.appends} appends per uncut turn, each killed before and after"
        elif key == "random":
            at = collections.Counter(
                "none" if o.entries_at_kill <= 1 else "all" if o.entries_at_kill >= ref.entries else "some"
                for o in results
            )
            note += (
                f"; journal at the kill: {at['none']} empty or opened only, {at['some']} mid-turn, {at['all']} whole"
                f" turn; seed {SEED}"
            )
        record(CATEGORIES[key], tried=len(results), held=held, note=note)
        lines.append(f"{CATEGORIES[key]}: {len(results)} tried, {held} held; {note}")
    print(f"\ncrash torture: {len(outcomes)} kill points in {wall:.1f} s (seed {SEED})", *lines, sep="\n")
    failures = [f"{p.name}: {o.failure}" for p, o in outcomes if o.failure is not None]
    assert not failures, f"{len(failures)} of {len(points)} kill points failed (seed {SEED}):\n" + "\n".join(
        failures[:5]
    )


def test_the_checks_catch_a_second_run_a_wrong_document_and_a_card_never_journaled(tmp_path: Path) -> None:
    """The harness's own checks fail on what they look for (so a kill point that holds means something)."""
    zygote = Zygote(tmp_path / "zygote.log")
    try:
        case = CrashCase(KillPoint(category="check", name="uncut"), tmp_path / "case")
        case.directory.mkdir()
        assert case.run(zygote, Timing(zygote, tmp_path)).landed == 0
    finally:
        zygote.close()
    report = case.result("p1")
    entries = stored_rows(case.db)
    before = entries[: next(i for i, e in enumerate(entries) if e.kind == "undo")]  # as the resumed process found it
    assert report is not None and case.check_end(report, before) == 0

    wrong = json.loads(json.dumps(report))
    wrong["final"]["document"] += "extra\n"
    with pytest.raises(AssertionError, match="live document differs"):
        case.check_end(wrong, before)
    with case.runs.open("a", encoding="ascii") as runs:
        runs.write("m1 p9\n")
    with pytest.raises(AssertionError, match="ran more than once"):
        case.check_end(report, before)

    card = {"call_id": "m1", "tool": "append_line", "digest": "0" * 64, "summary": "forged"}
    with case.seen.open("a", encoding="ascii") as seen:
        seen.write(json.dumps({"label": "p1", "kind": "cards", "cards": [card]}) + "\n")
    with pytest.raises(AssertionError, match="was shown but is not journaled"):
        case.after_kill("p1")
