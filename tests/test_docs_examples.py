"""The docs' examples do what the pages say, printing what the pages show.

``tests/test_snippets.py`` runs every Python block of a page (or type-checks it); this file holds two examples a
new user starts from to what their pages claim: the model's answer (getting-started.md) prints the output shown
beside it, the streamed text arriving in pieces, and the durable review (howto/durable.md) runs as the two
processes the page describes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from test_snippets import ROOT, Block, _run, blocks


def section(page: Path, heading: str) -> list[Block]:
    """The fenced blocks under the ``## heading`` of ``page``, in order."""
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    first, last = text[:start].count("\n") + 1, text[: end if end >= 0 else len(text)].count("\n") + 1
    return [block for block in blocks(page) if first < block.line < last]


# Runs a block with ``print`` recorded call by call, so a test sees the pieces a streaming observer printed.
_RECORDING = """
import json, sys
calls = []
def print(*args, sep=" ", end="\\n", **_):
    calls.append(sep.join(map(str, args)) + end)
exec(compile(open(sys.argv[1], encoding="utf-8").read(), "the page's block", "exec"), {"__name__": "__main__",
     "print": print})
sys.stdout.write(json.dumps(calls))
"""


def test_the_models_answer_prints_the_streamed_text_then_the_final_reply(tmp_path: Path) -> None:
    code, shown = section(ROOT / "docs" / "getting-started.md", "The model's answer")
    assert (code.lang, code.directive, shown.lang) == ("python", "", "text")
    (tmp_path / "answer.py").write_text(code.text, encoding="utf-8")
    done = _run([sys.executable, "-c", _RECORDING, "answer.py"], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    calls: list[str] = json.loads(done.stdout)
    assert "".join(calls) == shown.text
    streamed = calls[: calls.index("\n")]  # what the observer printed, state by state, before the final line
    reply = shown.text.splitlines()[0]
    assert "".join(streamed) == reply and len([piece for piece in streamed if piece]) > 1


def test_the_getting_started_guide_and_the_turn_page_link_to_the_answer() -> None:
    guide = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    turn = (ROOT / "docs" / "concepts" / "turn.md").read_text(encoding="utf-8")
    assert "(#the-models-answer)" in guide and "(../getting-started.md#the-models-answer)" in turn


def _durable_example() -> tuple[Block, Block, Block]:
    page = ROOT / "docs" / "howto" / "durable.md"
    headings = re.findall(r"^## (.+)$", page.read_text(encoding="utf-8"), re.M)
    program, commands, shown = section(page, headings[0])  # the page leads with the example
    assert (program.lang, commands.lang, shown.lang) == ("python", "sh", "text")
    assert 'title="notes_review.py"' in page.read_text(encoding="utf-8").splitlines()[program.line - 1]
    return program, commands, shown


def test_the_durable_guide_leads_with_a_review_that_spans_two_processes(tmp_path: Path) -> None:
    program, commands, shown = _durable_example()
    (tmp_path / "notes_review.py").write_text(program.text, encoding="utf-8")
    assert [line.split()[:3] for line in commands.text.splitlines()] == [
        ["python", "notes_review.py", "start"],
        ["python", "notes_review.py", "approve"],
    ], "two commands, so two processes: the second knows the first only through the journal"
    run = _run(["bash", "-c", "set -euo pipefail\n" + commands.text], tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout == shown.text
    audit = _run([sys.executable, "-m", "trioloop", "audit", "notes.db"], tmp_path)
    assert audit.returncode == 0 and "hash chain verified" in audit.stdout, audit.stdout[-2000:] + audit.stderr


def test_a_kind_without_dump_and_load_is_refused_as_the_durable_guide_says(tmp_path: Path) -> None:
    program, _, _ = _durable_example()
    own_kind = 'define_document_kind("notes", dump=str, load=str)'
    assert own_kind in program.text
    (tmp_path / "notes_review.py").write_text(
        program.text.replace(own_kind, 'define_document_kind("notes")'), encoding="utf-8"
    )
    run = _run([sys.executable, "notes_review.py", "start", "notes.db"], tmp_path)
    assert run.returncode != 0
    assert "TypeError: the notes kind has no text form: give define_document_kind dump= and load=" in run.stderr
    page = (ROOT / "docs" / "howto" / "durable.md").read_text(encoding="utf-8")
    assert '("the notes kind has no text form")' in page
