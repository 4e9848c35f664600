"""The soak's chaos beyond the edges' proxies: worker processes killed and started again, MCP servers frozen and
killed (see `benchmarks.soak`)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from benchmarks.soak import Plan

ROOT = Path(__file__).resolve().parent.parent


class Workers:
    """The worker processes: started, killed at random (SIGKILL), started again until they end by themselves."""

    def __init__(self, plan: Plan, config_path: Path, folder: Path, problems: list[str]) -> None:
        self.plan = plan
        self.config_path = config_path
        self.folder = folder
        self.problems = problems
        self.processes: dict[int, trio.Process] = {}
        self.kills = 0
        self.starts = 0
        self.done = trio.Event()

    async def run(self, end_at: float) -> None:
        async with trio.open_nursery() as nursery:
            for worker in range(self.plan.workers):
                nursery.start_soon(self._keep, worker)
            nursery.start_soon(self._killer, end_at)
        self.done.set()

    async def _keep(self, worker: int) -> None:
        while True:
            with (self.folder / f"worker-{worker}.err").open("ab") as errors:
                process = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "benchmarks._soak_worker", str(self.config_path), str(worker)],
                    cwd=ROOT,
                    stderr=errors,
                )
            self.starts += 1
            self.processes[worker] = process
            try:
                code = await process.wait()
            finally:
                self.processes.pop(worker, None)
                if process.returncode is None:
                    process.kill()
                    with trio.CancelScope(shield=True):
                        await process.wait()
            if code == -signal.SIGKILL:
                continue  # the killer's: start it again, it takes up its sessions
            if code != 0:
                self.problems.append(f"worker {worker} exited with status {code} (see worker-{worker}.err)")
            return

    async def _killer(self, end_at: float) -> None:
        rng = random.Random(f"{self.plan.seed}/killer")
        while True:
            await trio.sleep(rng.uniform(*self.plan.kill_every_s))
            if time.time() >= end_at:
                return
            running = sorted(self.processes)
            if running:
                process = self.processes[rng.choice(running)]
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL)
                    self.kills += 1


class McpChaos:
    """Freezes (SIGSTOP for a while, then SIGCONT) or kills (SIGKILL) the MCP servers' processes at random."""

    def __init__(self, plan: Plan, pids: Path) -> None:
        self.plan = plan
        self.pids = pids
        self.counts: Counter[str] = Counter()

    def _ours(self) -> list[int]:
        found = []
        for entry in self.pids.iterdir():
            with contextlib.suppress(OSError, ValueError):
                pid = int(entry.name)
                if b"_soak_mcp_server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
        return found

    async def run(self, end_at: float) -> None:
        rng = random.Random(f"{self.plan.seed}/mcp")
        while time.time() < end_at:
            await trio.sleep(rng.uniform(*self.plan.mcp_chaos_every_s))
            pids = self._ours()
            if not pids:
                continue
            pid = rng.choice(pids)
            if rng.random() < 0.3:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    self.counts["mcp_sigkill"] += 1
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            self.counts["mcp_sigstop"] += 1
            try:
                await trio.sleep(rng.uniform(0.3, 3.0))
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
