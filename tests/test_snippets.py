"""Every code block in README.md and docs/ runs, or is type-checked where it cannot run here.

How a block is treated follows its fence and an optional directive on the nearest non-blank line before it:

- ```` ```python ````: executed. The Python blocks of one page run in order in one fresh interpreter and share
  one namespace (a later block may use what an earlier one defined), with the working directory a scratch copy
  of ``examples/`` (so ``examples/payment.thf`` resolves and nothing is written into the checkout);
- ``<!-- snippet: typecheck -->`` before a Python block: it needs what the tests cannot have (a provider's
  key, a display), so it is checked by ``mypy --strict`` instead, alone (it must import what it uses);
- ```` ```sh ```` / ```` ```bash ````: run by bash (``set -e``) in the same scratch directory, with this
  interpreter's ``bin`` first on ``PATH`` (so ``trioloop`` is the checkout's command);
- ``<!-- snippet: no-run REASON -->`` before a shell block: not run, for the REASON given (an API key, an
  install that CI performs itself); a block without a reason fails;
- ``<!-- snippet: thf -->`` before a ```` ```yaml ```` block: it must load as a valid ``.thf`` document;
- ``<!-- snippet: output -->`` before a ```` ```python ```` block: it is shown output or a signature, not code;
- any other fence (``text``, ``toml``, ``yaml``, ...) is prose and is not checked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)[^\n]*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*snippet:\s*(?P<kind>[\w-]+)\s*(?P<reason>.*?)\s*-->\s*$")


@attrs.frozen
class Block:
    """One fenced block: where it is, its language, its directive (``""`` if none) and its text."""

    page: Path
    line: int
    lang: str
    directive: str
    reason: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> Iterator[Block]:
    """The fenced blocks of one Markdown page, indented ones (inside admonitions and lists) included."""
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        directive = reason = ""
        back = i - 1
        while back >= 0 and not lines[back].strip():
            back -= 1
        if back >= 0 and (found := _DIRECTIVE.match(lines[back])) is not None:
            directive, reason = found["kind"], found["reason"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        assert j < len(lines), f"{page.relative_to(ROOT)}:{i + 1}: a code block that never closes"
        yield Block(page, i + 1, opening["lang"].lower(), directive, reason, textwrap.dedent("\n".join(body)) + "\n")
        i = j + 1


ALL = [block for page in PAGES for block in blocks(page)]
KNOWN_DIRECTIVES = {"", "typecheck", "no-run", "thf", "output"}


def _ids(pages: list[Path]) -> list[str]:
    return [str(page.relative_to(ROOT)) for page in pages]


def _scratch(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        env.pop(key, None)
    return env


def _run(command: list[str], cwd: Path, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False)


def test_the_pages_are_found_and_every_directive_is_known() -> None:
    assert ROOT / "README.md" in PAGES and len(PAGES) > 1
    for block in ALL:
        assert block.directive in KNOWN_DIRECTIVES, f"{block.where}: unknown snippet directive {block.directive!r}"
        if block.directive == "no-run":
            assert block.reason, f"{block.where}: a no-run block says why it is not run"
        if block.directive in {"typecheck", "output"}:
            assert block.lang == "python", f"{block.where}: {block.directive} applies to Python blocks"
        if block.directive == "thf":
            assert block.lang == "yaml", f"{block.where}: thf applies to YAML blocks"


_RUNNER = """
import json, sys, traceback
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "__main__"}
for where, text in blocks:
    try:
        exec(compile(text, where, "exec"), namespace)
    except SystemExit as exit:
        if exit.code not in (None, 0):
            print(f"SNIPPET FAILED {where}: exit {exit.code}", file=sys.stderr)
            sys.exit(1)
    except BaseException:
        traceback.print_exc()
        print(f"SNIPPET FAILED {where}", file=sys.stderr)
        sys.exit(1)
"""


def _python_pages() -> list[Path]:
    return sorted({b.page for b in ALL if b.lang == "python" and b.directive == ""})


@pytest.mark.parametrize("page", _python_pages(), ids=_ids(_python_pages()))
def test_the_python_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    chosen = [(b.where, b.text) for b in ALL if b.page == page and b.lang == "python" and b.directive == ""]
    work = _scratch(tmp_path)
    (tmp_path / "blocks.json").write_text(json.dumps(chosen), encoding="utf-8")
    done = _run([sys.executable, "-c", _RUNNER, str(tmp_path / "blocks.json")], work)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def _shell_blocks() -> list[Block]:
    return [b for b in ALL if b.lang in {"sh", "bash", "shell"} and b.directive != "no-run"]


@pytest.mark.parametrize("block", _shell_blocks(), ids=[b.where for b in _shell_blocks()])
def test_a_shell_block_runs(block: Block, tmp_path: Path) -> None:
    work = _scratch(tmp_path)
    done = _run(["bash", "-c", "set -euo pipefail\n" + block.text], work)
    assert done.returncode == 0, f"{block.where}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_blocks_that_cannot_run_here_type_check(tmp_path: Path) -> None:
    chosen = [b for b in ALL if b.directive == "typecheck"]
    if not chosen:
        pytest.skip("no type-check-only block")
    files: dict[str, Block] = {}
    for n, block in enumerate(chosen):
        name = f"snippet_{n:03d}.py"
        (tmp_path / name).write_text(block.text, encoding="utf-8")
        files[name] = block
    mypy = [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.11", "--no-error-summary"]
    done = _run([*mypy, "--cache-dir", str(ROOT / ".mypy_cache"), *files], tmp_path, timeout=600)
    report = done.stdout
    for name, block in files.items():
        report = report.replace(name, block.where + " (block)")
    assert done.returncode == 0, report[-6000:]


def test_the_thf_examples_load(tmp_path: Path) -> None:
    from trioloop.threatmodel import load_thf

    for block in ALL:
        if block.directive == "thf":
            model = load_thf(block.text)
            assert model is not None, block.where
