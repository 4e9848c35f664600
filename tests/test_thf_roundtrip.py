"""Round-trip saving of .thf files: an unchanged save is byte-identical; an edit rewrites only its entities."""

from __future__ import annotations

import codecs
import difflib
import errno
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies_document import graph_actions, threat_models

from trioloop.threatmodel import ActionFailure, ThfError, ThreatModel, apply_action, dump_thf, load_thf
from trioloop.threatmodel.model import SECTION_NAMES
from trioloop.threatmodel.thf_file import ThfFile, load_thf_file, save_thf

ROOT = Path(__file__).resolve().parent.parent
VALID_FIXTURES = [ROOT / "examples" / "payment.thf", ROOT / "tests" / "fixtures" / "thf_valid_base.thf"]
INVALID_FIXTURES = sorted((ROOT / "tests" / "fixtures" / "thf_invalid").glob("*.thf"))

HAND_WRITTEN = """\
# Threat model of the shop (kept by hand).
version: '1.0'
metadata:
  title: "Shop"   # quoted on purpose
  author: sec team

elements:
  # The public entry point.
  - id: web
    type: process
    name: Web
    technologies: [nginx, TLS]
  - {id: db, type: data_store, name: DB}   # flow style kept
  # Jobs run nightly.
  - id: jobs
    name: Jobs
    type: process
    description: |
      Runs at night.
      Writes to the DB.
data_flows:
- {id: f1, from: web, to: db, authenticated: true}
trust_boundaries: []
threats:
  - id: t1
    title: 'Tampered rows'
    category: Tampering
    severity: high
    element: db
# end of file
"""


def _variants(text: str) -> list[str]:
    """The text as written, with CRLF line ends, and with comments before every entity."""
    commented = "".join(
        ("  # note\n" + line) if line.startswith("  - ") else line for line in text.splitlines(keepends=True)
    )
    return [text, text.replace("\n", "\r\n"), commented + "# trailing comment\n"]


def _sources() -> list[str]:
    texts = [path.read_text(encoding="utf-8") for path in VALID_FIXTURES] + [HAND_WRITTEN]
    return [variant for text in texts for variant in _variants(text)]


SOURCES = _sources()


@pytest.mark.parametrize("text", SOURCES)
def test_an_unchanged_save_is_byte_identical(text: str, tmp_path: Path) -> None:
    file = load_thf_file(text)
    assert file.model == load_thf(text)
    assert file.render(file.model) == text and dump_thf(file.model, original=file) == text
    # Equal but rebuilt (not the same object): still nothing to rewrite.
    rebuilt = attrs.evolve(file.model, elements=tuple(attrs.evolve(e) for e in file.model.elements))
    assert file.render(rebuilt) == text
    path = tmp_path / "model.thf"
    path.write_bytes(codecs.BOM_UTF8 + text.encode())
    loaded = load_thf_file(path)
    save_thf(path, loaded.model, loaded)
    assert path.read_bytes() == codecs.BOM_UTF8 + text.encode()


def _entity_lines(file: ThfFile, model: ThreatModel) -> dict[tuple[str, str], tuple[range, range]]:
    """(section, id) -> the lines of that entity in ``file``, and those lines with the comment and
    blank lines around it (a removed entity takes the comments just above it along)."""
    layout = file._layout
    assert layout is not None
    spans: dict[tuple[str, str], tuple[range, range]] = {}
    for top in layout.tops:
        if top.key in SECTION_NAMES and top.items is not None:
            items = [top.item_lines(item) for item in top.items]
            for index, (entity, (first, last)) in enumerate(zip(model.section(top.key), items, strict=True)):
                low = items[index - 1][1] + 1 if index else first
                high = items[index + 1][0] if index + 1 < len(items) else last + 1
                spans[(top.key, entity.id)] = (range(first, last + 1), range(low, high))
    return spans


def _changed(before: ThreatModel, after: ThreatModel) -> set[tuple[str, str]]:
    changed = set()
    for name in SECTION_NAMES:
        new = {e.id: e for e in after.section(name)}
        for entity in before.section(name):
            if new.get(entity.id) != entity:
                changed.add((name, entity.id))
    return changed


def _assert_only_entities_changed(file: ThfFile, after: ThreatModel, text: str) -> None:
    before = file.model
    old_lines, new_lines = file.text.splitlines(keepends=True), text.splitlines(keepends=True)
    allowed: set[int] = set()
    spans = _entity_lines(file, before)
    for key in _changed(before, after):
        own, around = spans[key]
        removed = all(e.id != key[1] for e in after.section(key[0]))
        allowed.update(around if removed else own)
    for top in file._layout.tops:  # type: ignore[union-attr]
        if top.key not in SECTION_NAMES or before.section(top.key) == after.section(top.key):
            continue
        if top.items is None or not after.section(top.key):
            # Written as a whole: a section in flow style ("threats: []") or one just emptied.
            allowed.update(range(top.first, top.last + 1))
    assert before.metadata == after.metadata and before.extra == after.extra  # graph edits touch entities only
    # Every other line is still there, in the same order (a subsequence check, free of diff alignment).
    kept = iter(new_lines)
    for number, line in enumerate(old_lines):
        if number not in allowed:
            assert any(line == candidate for candidate in kept), (number, line)


@st.composite
def _file_and_edits(draw: st.DrawFn) -> tuple[ThfFile, list[ThreatModel]]:
    if draw(st.booleans()):
        text = draw(st.sampled_from(SOURCES))
    else:
        text = draw(st.sampled_from(_variants(dump_thf(draw(threat_models())))))
    file = load_thf_file(text)
    models = []
    model = file.model
    for _ in range(draw(st.integers(1, 3))):
        result = apply_action(model, draw(graph_actions(model)))
        if not isinstance(result, ActionFailure):
            model = result
            models.append(model)
    return file, models


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_file_and_edits())
def test_an_edit_rewrites_only_the_changed_entities_and_reads_back(case: tuple[ThfFile, list[ThreatModel]]) -> None:
    file, models = case
    for model in models:
        text = file.render(model)
        assert load_thf(text) == model
        if file._layout is not None:  # None: a layout not patched safely (e.g. `? ''` keys), written whole
            _assert_only_entities_changed(file, model, text)
        file = file.updated(model)  # the next save patches against what was written
        assert file.text == text and file.render(model) == text


def test_comments_quoting_and_styles_of_other_entities_survive_an_edit() -> None:
    file = load_thf_file(HAND_WRITTEN)
    model = file.model
    web = model.elements[0]
    edited = attrs.evolve(model, elements=(attrs.evolve(web, name="Storefront"), *model.elements[1:]))
    text = file.render(edited)
    diff = [
        line
        for line in difflib.unified_diff(HAND_WRITTEN.splitlines(), text.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    assert diff == ["-    name: Web", "+    name: Storefront"]


def test_an_emptied_and_a_new_section_and_a_new_entity_read_back() -> None:
    file = load_thf_file(HAND_WRITTEN)
    model = file.model
    extra_threat = attrs.evolve(model.threats[0], id="t2", title="Spoofed web")
    edited = attrs.evolve(model, threats=(*model.threats, extra_threat), data_flows=())
    text = file.render(edited)
    assert load_thf(text) == edited
    assert "# The public entry point." in text and "# end of file" in text
    assert text.count("title: 'Tampered rows'") == 1


def test_anchors_make_the_save_whole_and_still_correct() -> None:
    text = HAND_WRITTEN.replace("    technologies: [nginx, TLS]", "    technologies: &tech [nginx, TLS]").replace(
        "    name: Jobs\n", "    name: Jobs\n    technologies: *tech\n"
    )
    file = load_thf_file(text)
    assert file.render(file.model) == text
    renamed = attrs.evolve(file.model, metadata=attrs.evolve(file.model.metadata, title="Shop 2"))
    assert load_thf(file.render(renamed)) == renamed


@pytest.mark.parametrize("path", INVALID_FIXTURES, ids=lambda p: p.name)
def test_hostile_and_invalid_files_are_refused_exactly_as_load_thf_refuses_them(path: Path) -> None:
    with pytest.raises(ThfError) as expected:
        load_thf(path)
    with pytest.raises(type(expected.value)) as caught:
        load_thf_file(path)
    assert caught.value.message == expected.value.message


def test_save_is_atomic_and_returns_the_file_for_the_next_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "shop.thf"
    path.write_text(HAND_WRITTEN, encoding="utf-8")
    file = load_thf_file(path)
    edited = attrs.evolve(file.model, metadata=attrs.evolve(file.model.metadata, author="blue team"))

    def full_disk(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        save_thf(path, edited, file)
    monkeypatch.undo()
    assert path.read_text(encoding="utf-8") == HAND_WRITTEN and os.listdir(tmp_path) == ["shop.thf"]
    written = save_thf(path, edited, file)
    assert path.read_text(encoding="utf-8") == written.text and load_thf(path) == edited
    assert "# Threat model of the shop (kept by hand)." in written.text


def test_a_section_emptied_then_refilled_over_successive_saves() -> None:
    file = load_thf_file((ROOT / "tests" / "fixtures" / "thf_valid_base.thf").read_text(encoding="utf-8"))
    threat = file.model.threats[0]
    emptied = file.updated(attrs.evolve(file.model, threats=()))
    assert "threats: []\n" in emptied.text
    one = emptied.updated(attrs.evolve(emptied.model, threats=(threat,)))
    two = one.updated(attrs.evolve(one.model, threats=(threat, attrs.evolve(threat, id="t9"))))
    assert load_thf(one.text) == one.model and load_thf(two.text) == two.model
    assert two.text.startswith(file.text.split("threats:")[0])  # everything before the section is as it was


@pytest.mark.parametrize("load", [load_thf, load_thf_file], ids=["load_thf", "load_thf_file"])
def test_text_that_names_a_file_says_to_pass_a_path(
    load: Callable[[str | Path], object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "payment.thf").write_bytes((ROOT / "examples" / "payment.thf").read_bytes())
    with pytest.raises(ThfError, match=r'"payment\.thf", names an existing file: pass a Path to read a file'):
        load("payment.thf")
    with pytest.raises(ThfError, match=r'"gone\.thf", looks like a file name: pass a Path'):
        load("gone.thf")
    with pytest.raises(ThfError) as plain:
        load("hello")
    assert "Path" not in str(plain.value)
    assert load(Path("payment.thf")) is not None  # the fix the message names works
    text = (tmp_path / "payment.thf").read_text(encoding="utf-8")
    assert load(text) is not None
