"""Review scripted turns over a `.thf` threat model in a Qt window, with Open, Save, Undo and Redo.

Trio runs as a guest of the Qt event loop; the scripted model is served over a real loopback HTTP
connection, so the panel exercises the same code a real provider goes through. Needs the extra,
``pip install 'trioloop[qt]'``, and on Linux the system libraries Qt links to (docs/howto/qt.md lists
the Debian packages; a missing one is named at start). Run
``python examples/qt_review.py [FILE.thf]``: press Send, review the cards (click, or Alt+A to approve the
marked card, Alt+D to type a reason and deny it, Alt+N to skip), then try Stop, Undo and Redo.
Open starts a new session on another file; Save writes the document back into the file it came from,
keeping its comments and layout. The bundled payment.thf is never overwritten: its first Save asks where.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, final

from trioloop.ui.qt_libraries import qt_import_failure

try:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QCloseEvent
    from PySide6.QtWidgets import (
        QFileDialog,
        QHBoxLayout,
        QLabel,
        QMessageBox,
        QPushButton,
        QVBoxLayout,
        QWidget,
    )
except ImportError as exc:  # a system library Qt links to is missing: name its Debian package
    raise SystemExit(qt_import_failure(exc)) from exc

from trioloop.providers.scripted import ScriptedProvider
from trioloop.threatmodel import ThfError, ThfFile, load_thf_file, save_thf, threat_model_session
from trioloop.threatmodel.demo import DEMO_LIMITS, DEMO_PROMPT, DEMO_SCRIPT
from trioloop.ui.qt import QtUnavailable, ReviewPanel, qt_application, run_trio_guest

DOCUMENT = Path(__file__).with_name("payment.thf")
FILE_FILTER = "Threat models (*.thf);;All files (*)"


def _label(object_name: str) -> QLabel:
    label = QLabel()
    label.setTextFormat(Qt.TextFormat.PlainText)  # file names and errors are shown literally
    label.setObjectName(object_name)
    return label


@final
class ReviewWindow(QWidget):
    """A file bar (Open, Save, the file's name, what the last action did) above the review panel.

    ``file`` is the document as opened or last saved (its text, for round-trip saving); ``path`` is where
    Save writes, None for the bundled example (Save then asks for a path). Open and Save wait while a turn
    runs; Open asks before dropping unsaved changes.
    """

    def __init__(self, file: ThfFile, path: Path | None) -> None:
        super().__init__()
        self.file = file
        self.path = path
        self.panel: ReviewPanel | None = None
        self.closing = False
        self.open_button = QPushButton("Open…")
        self.open_button.setObjectName("openButton")
        self.open_button.setToolTip("Open another .thf file; the session starts again on it")
        self.save_button = QPushButton("Save")
        self.save_button.setObjectName("saveButton")
        self.save_button.setToolTip("Write the document into its file, keeping the file's comments and layout")
        self.file_label = _label("fileName")
        self.message_label = _label("fileMessage")
        self.message_label.setStyleSheet("color: #57606a;")
        bar = QHBoxLayout()
        bar.addWidget(self.open_button)
        bar.addWidget(self.save_button)
        bar.addWidget(self.file_label)
        bar.addStretch(1)
        bar.addWidget(self.message_label)
        self._layout = QVBoxLayout(self)
        self._layout.addLayout(bar)
        self.open_button.clicked.connect(self._on_open)
        self.save_button.clicked.connect(self._on_save)
        self._refresh()

    @property
    def unsaved(self) -> bool:
        panel = self.panel
        if panel is None:
            return False
        document = panel.session.document
        return document is not self.file.model and document != self.file.model

    def attach(self, panel: ReviewPanel) -> None:
        """Show ``panel`` (a new session's) under the file bar, in place of the previous one."""
        if self.panel is not None:
            self._layout.removeWidget(self.panel)
            self.panel.deleteLater()
        self.panel = panel
        self._layout.addWidget(panel, 1)
        panel.busy_changed.connect(self._refresh)
        panel.document_changed.connect(self._refresh)
        panel.show()
        self._refresh()

    def _refresh(self, *_: Any) -> None:
        busy = self.panel is None or self.panel.turn_running
        self.open_button.setEnabled(not busy)
        self.save_button.setEnabled(not busy and (self.unsaved or self.path is None))
        unsaved = self.unsaved
        name = str(self.path) if self.path is not None else f"{DOCUMENT.name} (bundled example)"
        self.file_label.setText(name + (" (unsaved changes)" if unsaved else ""))
        short = self.path.name if self.path is not None else DOCUMENT.name
        self.setWindowTitle(f"{short}{' *' if unsaved else ''} - trioloop review")

    def _on_open(self) -> None:
        if self.panel is None or self.panel.turn_running:
            return
        if self.unsaved:
            answer = QMessageBox.question(self, "Open another file", "Drop the unsaved changes to this document?")
            if answer != QMessageBox.StandardButton.Yes:
                return
        start = str(self.path.parent if self.path is not None else DOCUMENT.parent)
        name, _ = QFileDialog.getOpenFileName(self, "Open a threat model", start, FILE_FILTER)
        if not name:
            return
        try:
            file = load_thf_file(Path(name))
        except (ThfError, OSError) as exc:
            self.message_label.setText(f"Not opened: {exc}")
            return
        self.file, self.path = file, Path(name)
        self.message_label.setText(f"Opened {Path(name).name}")
        self.panel.close()  # serve() returns and the session closes; review() starts one on the new file

    def _on_save(self) -> None:
        panel = self.panel
        if panel is None or panel.turn_running:
            return
        path = self.path
        if path is None:
            name, _ = QFileDialog.getSaveFileName(self, "Save the threat model", DOCUMENT.name, FILE_FILTER)
            if not name:
                return
            path = Path(name)
        try:
            self.file = save_thf(path, panel.session.document, self.file)
        except OSError as exc:
            self.message_label.setText(f"Not saved: {exc.strerror or exc}")
            return
        self.path = path
        self.message_label.setText(f"Saved {path.name}")
        self._refresh()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.closing = True
        if self.panel is not None:
            self.panel.close()  # stops a turn still running; review() then returns
        super().closeEvent(event)


async def review(window: ReviewWindow) -> None:
    """One session after another on the window's file, until the window is closed."""
    while not window.closing:
        async with (
            ScriptedProvider(DEMO_SCRIPT) as provider,
            threat_model_session(
                document=window.file.model, provider=provider, model="scripted-1", limits=DEMO_LIMITS
            ) as session,
        ):
            panel = ReviewPanel(session)
            panel.prompt_input.setText(DEMO_PROMPT)
            window.attach(panel)
            await panel.serve()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else None
    try:
        app = qt_application()
    except QtUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        file = load_thf_file(path if path is not None else DOCUMENT)
    except (ThfError, OSError) as exc:
        print(f"Cannot open {path}: {exc}", file=sys.stderr)
        return 2
    window = ReviewWindow(file, path)
    window.resize(780, 900)
    window.show()
    run_trio_guest(review, window, app=app)
    return 0


if __name__ == "__main__":
    sys.exit(main())
