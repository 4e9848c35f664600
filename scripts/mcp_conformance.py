#!/usr/bin/env python3
"""Install and run the official MCP conformance client suite against trioloop's MCP host.

    python scripts/mcp_conformance.py --install        # install the pinned suite (and Node if too old), then stop
    python scripts/mcp_conformance.py [--suite all]    # install if needed, run, print the checks per scenario

The suite (``@modelcontextprotocol/conformance``, pinned to ``CONFORMANCE_VERSION``: it is unstable and its
checks change between releases) is installed with npm into ``.conformance/`` at the project root (git-ignored;
``TRIOLOOP_CONFORMANCE_DIR`` overrides). It needs Node >= 22; when the machine's ``node`` is older, Node 22
itself is installed from the npm registry into the same folder (the ``node-<os>-<arch>`` package, a plain
binary: no install script runs). The suite starts one test server per scenario and launches
``tests/mcp_conformance_client.py`` (trioloop's host) with the server's URL.

``tests/test_mcp_conformance.py`` imports this module: it runs the suite and holds the list of checks that
must keep passing. Exit status here: 0 when the run completed (whatever the checks say), 1 on a setup failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
CLIENT: Final = ROOT / "tests" / "mcp_conformance_client.py"
CONFORMANCE_PACKAGE: Final = "@modelcontextprotocol/conformance"
CONFORMANCE_VERSION: Final = "0.1.16"
NODE_MAJOR: Final = 22  # the suite uses fs.globSync (Node 22+); on Node 20 it dies at import
NPM_TIMEOUT: Final = 300.0


class ConformanceUnavailable(RuntimeError):
    """The suite cannot run here (no npm, no usable Node, install failed); the message says why."""


def install_dir() -> Path:
    return Path(os.environ.get("TRIOLOOP_CONFORMANCE_DIR") or ROOT / ".conformance")


def suite_entry(folder: Path) -> Path:
    return folder / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"


def node_package() -> str:
    """The npm package holding a Node binary for this machine (as the ``node`` package's installer names it)."""
    system = {"linux": "linux", "darwin": "darwin", "win32": "win"}.get(sys.platform)
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if system is None or arch is None:
        raise ConformanceUnavailable(f"no Node package from the npm registry for {sys.platform}/{machine}")
    prefix = "node-bin" if (system, arch) == ("darwin", "arm64") else "node"
    return f"{prefix}-{system}-{arch}"


def node_major(node: str) -> int | None:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"v(\d+)\.", out.strip())
    return int(match.group(1)) if match else None


def installed_node(folder: Path) -> str | None:
    """A Node >= NODE_MAJOR: the one installed into ``folder`` if any, else the machine's."""
    try:
        package = node_package()
    except ConformanceUnavailable:
        package = None
    if package is not None:
        name = "node.exe" if sys.platform == "win32" else "node"
        local = folder / "node_modules" / package / "bin" / name
        if local.exists() and (node_major(str(local)) or 0) >= NODE_MAJOR:
            return str(local)
    system = shutil.which("node")
    if system is not None and (node_major(system) or 0) >= NODE_MAJOR:
        return system
    return None


def find_suite() -> tuple[str, Path]:
    """(node, the suite's entry script) if installed and runnable, else ``ConformanceUnavailable``."""
    folder = install_dir()
    entry = suite_entry(folder)
    if not entry.exists():
        raise ConformanceUnavailable(
            f"{CONFORMANCE_PACKAGE} is not installed in {folder} (run: python scripts/mcp_conformance.py --install)"
        )
    installed = json.loads((entry.parent.parent / "package.json").read_text()).get("version")
    if installed != CONFORMANCE_VERSION:
        raise ConformanceUnavailable(
            f"{folder} holds {CONFORMANCE_PACKAGE} {installed}, not the pinned {CONFORMANCE_VERSION} "
            "(run: python scripts/mcp_conformance.py --install)"
        )
    node = installed_node(folder)
    if node is None:
        raise ConformanceUnavailable(
            f"the suite needs Node >= {NODE_MAJOR} (run: python scripts/mcp_conformance.py --install)"
        )
    return node, entry


def install() -> tuple[str, Path]:
    """Install the pinned suite (and Node from the npm registry if the machine's is too old) into ``install_dir``."""
    npm = shutil.which("npm")
    if npm is None:
        raise ConformanceUnavailable("npm is not on PATH")
    folder = install_dir()
    folder.mkdir(parents=True, exist_ok=True)
    dependencies = {CONFORMANCE_PACKAGE: CONFORMANCE_VERSION}
    system = shutil.which("node")
    if system is None or (node_major(system) or 0) < NODE_MAJOR:
        dependencies[node_package()] = f"^{NODE_MAJOR}.0.0"
    manifest = {"name": "trioloop-mcp-conformance", "private": True, "dependencies": dependencies}
    (folder / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    # --ignore-scripts: nothing runs at install time (the Node package is a plain binary); --engine-strict off
    # because the suite declares node>=22 and the npm doing the installing may run on an older Node.
    command = [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--no-package-lock", "--loglevel=error"]
    try:
        subprocess.run(command, cwd=folder, check=True, timeout=NPM_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConformanceUnavailable(f"npm install failed in {folder}: {exc}") from None
    return find_suite()


def run_suite(
    node: str, entry: Path, *, suite: str = "all", python: str = sys.executable, timeout_ms: int = 30000
) -> dict[str, list[dict[str, Any]]]:
    """Run one suite of client scenarios; return each scenario's checks (the suite's ``checks.json``)."""
    with tempfile.TemporaryDirectory(prefix="trioloop-conformance-") as out:
        command = [
            node,
            str(entry),
            "client",
            "--command",
            f'"{python}" "{CLIENT}"',
            "--suite",
            suite,
            "--timeout",
            str(timeout_ms),
            "-o",
            out,
        ]
        # The suite's exit status says whether everything passed; the checks themselves are what we judge.
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
        results: dict[str, list[dict[str, Any]]] = {}
        for checks in sorted(Path(out).rglob("checks.json")):
            # results/<scenario>-<timestamp>/checks.json; auth scenarios sit one folder deeper (auth/<name>-...)
            relative = checks.parent.relative_to(out).as_posix()
            scenario = re.sub(r"-\d{4}-\d\d-\d\dT[\d-]+Z$", "", relative)
            results[scenario] = json.loads(checks.read_text())
        if not results:
            raise ConformanceUnavailable(
                f"the suite produced no results (exit {done.returncode}): {(done.stderr or done.stdout)[-2000:]}"
            )
        return results


def verdicts(checks: list[dict[str, Any]]) -> dict[str, str]:
    """check id -> status, for the checks that judge (INFO entries are the suite's traffic log)."""
    return {check["id"]: check["status"] for check in checks if check.get("status") != "INFO"}


def failure_reasons(checks: list[dict[str, Any]]) -> dict[str, str]:
    reasons: dict[str, str] = {}
    for check in checks:
        if check.get("status") == "FAILURE":
            details = check.get("details") or {}
            reasons[check["id"]] = str(check.get("errorMessage") or details.get("message") or "not attempted")
    return reasons


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    lines: list[str] = []
    passed = failed = 0
    for scenario, checks in sorted(results.items()):
        judged = verdicts(checks)
        bad = failure_reasons(checks)
        good = sum(1 for status in judged.values() if status != "FAILURE")
        passed += good
        failed += len(bad)
        mark = "PASS" if judged and not bad else ("FAIL" if bad else "EMPTY")
        lines.append(f"{mark:5} {scenario}: {good}/{len(judged)} checks")
        lines.extend(f"        FAILURE {check}: {reason}" for check, reason in bad.items())
    scenarios_passed = sum(1 for checks in results.values() if verdicts(checks) and not failure_reasons(checks))
    lines.append(
        f"checks: {passed} passed, {failed} failed of {passed + failed}; "
        f"scenarios: {scenarios_passed} passed of {len(results)}"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", action="store_true", help="install the suite (and Node if needed), then stop")
    parser.add_argument("--suite", default="all", help="the suite's client suite: all, core, auth, draft, ...")
    parser.add_argument("--json", type=Path, help="also write every scenario's checks to this file")
    args = parser.parse_args()
    try:
        try:
            node, entry = find_suite()
        except ConformanceUnavailable:
            node, entry = install()
        if args.install:
            print(f"{CONFORMANCE_PACKAGE}@{CONFORMANCE_VERSION} ready in {install_dir()} (node: {node})")
            return 0
        started = time.monotonic()
        results = run_suite(node, entry, suite=args.suite)
    except ConformanceUnavailable as exc:
        print(f"mcp_conformance: {exc}", file=sys.stderr)
        return 1
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))
    print(f"suite {args.suite!r} ran in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
