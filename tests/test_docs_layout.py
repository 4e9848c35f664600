"""The docs site as a reader sees it: no code example scrolls sideways on a 1280 px wide window, and no page or
docstring points at files a user does not have.

Widths are counted, not rendered, so the suite needs no browser. The arithmetic, for a 1280 px window with the
site's own sheet (docs/stylesheets/extra.css) over mkdocs-material:

- Material's root font size is 20 px at this width (125 %), so 1 rem = 20 px;
- the window leaves 1265 px beside its scrollbar (15 px); the page grid may use all of it (``.md-grid``'s
  ``max-width: 80rem`` is 1600 px, where Material's own stops at 61 rem = 1220 px);
- the table of contents sits in the left navigation (``toc.integrate``), so one sidebar is left: 12.1 rem = 242 px;
- the content's margins are 1.2 rem left and 0.8 rem right (24 + 16 px): a code block is 1265 - 242 - 40 = 983 px;
- code is set at 0.8 em of the 16 px body text, 12.8 px, with 1.1765 em (15 px) of padding each side, so a line
  has 983 - 30 = 953 px, and a monospace column is 0.6 em = 7.68 px: 953 / 7.68 = 124 columns.

So a code line of up to 120 columns (ruff's line length for this project) fits with room to spare; measured in
headless Chromium at 1280 px, the widest block's box is 983 px. Program output (```` ```text ````) wraps
instead of scrolling (the sheet's ``white-space: pre-wrap``), so its lines may be longer.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_snippets import PAGES, ROOT, Block, blocks

#: The widest code line, in columns, that fits a 1280 px window (see the module docstring: 124, less a margin).
COLUMNS = 120
CSS = ROOT / "docs" / "stylesheets" / "extra.css"
_INCLUDE = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$', re.M)


def _docs_pages() -> list[Path]:
    return [page for page in PAGES if page.is_relative_to(ROOT / "docs")]


def _site_blocks() -> list[Block]:
    """Every fenced block of docs/, and of the files its pages include with ``--8<--`` (snippets)."""
    found: list[Block] = []
    for page in _docs_pages():
        found.extend(blocks(page))
        for included in _INCLUDE.finditer(page.read_text(encoding="utf-8")):
            found.extend(blocks(ROOT / included["path"]))
    return found


def _declarations(css: str) -> dict[str, dict[str, str]]:
    rules: dict[str, dict[str, str]] = {}
    for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", re.sub(r"/\*.*?\*/", "", css, flags=re.S)):
        pairs = (item.split(":", 1) for item in body.split(";") if ":" in item)
        rules[" ".join(selector.split())] = {key.strip(): value.strip() for key, value in pairs}
    return rules


def test_the_site_uses_the_sheet_the_arithmetic_assumes() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^extra_css:\n\s+- stylesheets/extra\.css$", config, re.M)
    assert re.search(r"^\s+- toc\.integrate$", config, re.M), "one sidebar, not two, beside the content"
    assert re.search(r"^\s+pygments_lang_class: true", config, re.M), "output blocks need their language class"
    rules = _declarations(CSS.read_text(encoding="utf-8"))
    assert rules[".md-grid"]["max-width"] == "80rem"
    assert rules[".md-typeset pre > code"]["font-size"] == "0.8em"
    assert rules[".md-typeset .language-text pre > code"]["white-space"] == "pre-wrap"


def test_no_code_block_is_wider_than_a_1280px_window_shows() -> None:
    checked = _site_blocks()
    assert any(block.page.name == "getting-started.md" for block in checked)
    too_wide = [
        f"{block.where}: {len(line)} columns: {line[:60]}..."
        for block in checked
        if block.lang != "text"  # output wraps
        for line in block.text.splitlines()
        if len(line) > COLUMNS
    ]
    assert too_wide == [], f"lines over {COLUMNS} columns scroll sideways at 1280 px:\n" + "\n".join(too_wide)


def test_no_page_or_docstring_names_a_file_users_do_not_have() -> None:
    private = re.compile(r"\b(DESIGN|SPEC|REFERENCE)\.md\b")
    files = [
        *(ROOT / "trioloop").rglob("*.py"),
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "docs").rglob("*.css"),
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",  # the docs' changelog page includes it
    ]
    mentions = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if private.search(line)
    ]
    assert len(files) > 50 and mentions == []
