"""Approval rules in the review panel: who decided a call (or asked for its card), a card's "always" choices, and
the list of the rules in effect with a Remove button on each of the session's own.

A card's **Always…** button opens a menu of the decisions that also add a session rule: approve and always allow
this tool with this input, approve and always allow this tool (neither is offered on a destructive card: no rule
may approve a destructive call), deny and always deny this tool. The menu only reports the choice; the card and the
panel turn it into one ``Session.approve(..., always=...)`` or ``Session.deny(..., always="tool")``. `RulesList`
shows ``Session.rules``; its Remove buttons report a session rule's number for ``Session.remove_rule``. A rule's
description can quote a model-written input, so everything here is shown as plain text, stripped of what could
hide or reorder it.
"""

from __future__ import annotations

from typing import Final, final

import attrs
from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QAction, QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from trioloop.machine.reducer import CallRecord
from trioloop.machine.rules import SESSION_SOURCE, ApprovalRule, Decider, DeciderKind
from trioloop.machine.untrusted_text import strip_and_cap
from trioloop.ui._qt_plain_text import plain_label

__all__ = [
    "ALWAYS_CHOICES",
    "RULES_STYLE",
    "AlwaysChoices",
    "RulesList",
    "decider_text",
    "decision_status",
    "rule_text",
]

#: The longest text shown for a decider or a rule (a rule quoting a long input is cut, ending in "…").
_TEXT_MAX: Final = 300
#: The tallest the opened rules list grows, in pixels, before it scrolls.
_BODY_MAX_HEIGHT: Final = 160
#: The menu's entries: (choice reported, text with its mnemonic, whether it approves).
ALWAYS_CHOICES: Final = (
    ("input", "Approve, and always allow this tool with this &input", True),
    ("tool", "Approve, and always allow this &tool", True),
    ("never", "Deny, and always &deny this tool", False),
)
RULES_STYLE: Final = """
QLabel#callDecider { color: #57606a; font-size: 11px; }
QToolButton#rulesToggle { border: none; font-weight: bold; }
QLabel#ruleText { font-family: monospace; }
QLabel#ruleText[source="session"] { color: #0969da; }
"""


def _plain(text: str) -> str:
    return strip_and_cap(text, _TEXT_MAX)[0]


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def decider_text(call: CallRecord) -> str:
    """The line a card shows on who decided the call without the person ("Approved by app rule 1: rename_model",
    "Denied by session rule 3: …") or, while it waits, which rule or function asked for its card ("Asked by rule 2
    of .trioloop/rules.toml: …"); "" when the person decided, the read-only policy allowed it, or nothing did."""
    decider = call.decided_by
    if decider is None or decider.kind in (DeciderKind.PERSON, DeciderKind.READ_ONLY_POLICY):
        return ""
    return _plain(_capitalized(decider.describe()))


def decision_status(call: CallRecord) -> str:
    """The short form for a card's status line: "Approved by app rule 1", "Denied by session rule 3" ("" when the
    person or the read-only policy decided, or nothing did)."""
    decider: Decider | None = call.decided_by
    if decider is None or decider.kind in (DeciderKind.PERSON, DeciderKind.READ_ONLY_POLICY):
        return ""
    return _plain(_capitalized(attrs.evolve(decider, detail="").describe()))


def rule_text(rule: ApprovalRule) -> str:
    """One rule as the list shows it: ``session rule 1: allow rename_model``, its file's line and its reason."""
    where = f" (line {rule.line})" if rule.line is not None else ""
    reason = f" — {rule.reason}" if rule.reason else ""
    return _plain(f"{rule.label}{where}: {rule.verdict.value} {rule.describe()}{reason}")


@final
class AlwaysChoices(QWidget):
    """A card's **Always…** button and its menu; ``chosen`` carries "input", "tool" or "never".

    The approving entries are left out of a destructive card's menu. ``open_menu`` shows the menu under the
    button without blocking (the keyboard's way in: arrows and Enter, or the underlined letter)."""

    chosen = Signal(str)

    def __init__(self, destructive: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.button = QPushButton("Always…")
        self.button.setObjectName("alwaysButton")
        self.menu = QMenu(self.button)
        self.menu.setObjectName("alwaysMenu")
        self.actions_by_choice: dict[str, QAction] = {}
        for choice, text, approves in ALWAYS_CHOICES:
            action = QAction(text, self.menu)
            action.setObjectName(f"always_{choice}")
            action.triggered.connect(lambda _=False, choice=choice: self.chosen.emit(choice))
            self.actions_by_choice[choice] = action
            if approves and destructive:
                action.setEnabled(False)  # never offered: every destructive call gets its own card
                continue
            self.menu.addAction(action)
        offered = "deny this tool from now on" if destructive else "allow or deny this tool from now on"
        self.button.setToolTip(f"Decide this call and {offered}, for this session (Alt+R)")
        self.button.clicked.connect(self.open_menu)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.button)

    @property
    def offered(self) -> tuple[str, ...]:
        """The menu's entries, as their choices ("input", "tool", "never")."""
        return tuple(c for c, action in self.actions_by_choice.items() if action in self.menu.actions())

    def open_menu(self) -> None:
        """Show the menu under the button (its right edge at the button's, as the button ends the card's row), its
        first entry active, without blocking the event loop."""
        entries = self.menu.actions()
        if entries:
            self.menu.setActiveAction(entries[0])
        corner = self.button.mapToGlobal(QPoint(self.button.width(), self.button.height()))
        self.menu.popup(QPoint(max(0, corner.x() - self.menu.sizeHint().width()), corner.y()))


@final
class RulesList(QWidget):
    """The approval rules in effect, folded into one "Approval rules (N)" line until opened: each rule's label
    and description, and a Remove button on each session rule (``remove_clicked`` carries its number).

    It opens by itself when a session rule is added, so a person sees what their "always" made."""

    remove_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("rulesList")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)  # the cards take the room
        self.toggle = QToolButton()
        self.toggle.setObjectName("rulesToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setToolTip("The approval rules in effect: the app's, the files' and this session's (Alt+L)")
        self.toggle.toggled.connect(self._show_open)
        self._box = rows = QWidget()
        self._rows = QVBoxLayout(rows)
        self._rows.setContentsMargins(16, 0, 0, 4)
        self._rows.setSpacing(2)
        self.body = QScrollArea()  # a long rule file scrolls here instead of squeezing the cards
        self.body.setObjectName("rulesBody")
        self.body.setWidgetResizable(True)
        self.body.setMaximumHeight(_BODY_MAX_HEIGHT)
        self.body.setFrameShape(QFrame.Shape.NoFrame)
        self.body.setWidget(rows)
        self.remove_buttons: dict[int, QPushButton] = {}
        self.rule_labels: list[QLabel] = []
        self._rules: tuple[ApprovalRule, ...] | None = None
        self._removable = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.body)
        self.show_rules(())

    @property
    def rules(self) -> tuple[ApprovalRule, ...]:
        """The rules the list shows now."""
        return self._rules or ()

    @property
    def texts(self) -> list[str]:
        """Each rule's line as shown, in order."""
        return [label.text() for label in self.rule_labels]

    def show_rules(self, rules: tuple[ApprovalRule, ...], *, removable: bool = True) -> None:
        """Show ``rules`` (rebuilt only when they changed); Remove buttons are enabled when ``removable``."""
        if rules == self._rules:
            if removable is not self._removable:
                self._removable = removable
                for button in self.remove_buttons.values():
                    button.setEnabled(removable)
            return
        before = {(r.source, r.number) for r in self._rules or () if r.source == SESSION_SOURCE}
        self._rules, self._removable = rules, removable
        while (item := self._rows.takeAt(0)) is not None:
            widget = item.widget()
            if widget is not None:
                widget.hide()
                widget.deleteLater()
        self.remove_buttons, self.rule_labels = {}, []
        for rule in rules:
            self._rows.addWidget(self._row(rule, removable))
        if not rules:
            self._rows.addWidget(plain_label("No approval rules: every change is shown on a card.", wrap=True))
        self._rows.addStretch(1)
        self.toggle.setText(f"Approval rules ({len(rules)})")
        if any(r.source == SESSION_SOURCE and (r.source, r.number) not in before for r in rules):
            self.toggle.setChecked(True)
        self._show_open()

    def _row(self, rule: ApprovalRule, removable: bool) -> QWidget:
        row = QWidget()
        line = QHBoxLayout(row)
        line.setContentsMargins(0, 0, 0, 0)
        label = plain_label(rule_text(rule), object_name="ruleText", wrap=True)
        label.setProperty("source", "session" if rule.source == SESSION_SOURCE else "other")
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        line.addWidget(label, 1)
        self.rule_labels.append(label)
        if rule.source == SESSION_SOURCE:
            button = QPushButton("Remove")
            button.setObjectName("removeRuleButton")
            button.setToolTip(f"Remove {rule.label}: later calls are decided without it")
            button.setEnabled(removable)
            button.clicked.connect(lambda _=False, number=rule.number: self._remove(number))
            line.addWidget(button, 0, Qt.AlignmentFlag.AlignTop)
            self.remove_buttons[rule.number] = button
        return row

    def _remove(self, number: int) -> None:
        button = self.remove_buttons.get(number)
        if button is not None:
            button.setEnabled(False)  # one click, one removal
        self.remove_clicked.emit(number)

    def _show_open(self) -> None:
        opened = self.toggle.isChecked()
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if opened else Qt.ArrowType.RightArrow)
        self.body.setVisible(opened)
        self._fit()

    def _fit(self) -> None:
        """The opened list as tall as its rows are at its width, up to the cap (past it, the rows scroll)."""
        rows = self._rows
        width = self.body.viewport().width() if self.body.isVisible() else self.width()
        height = rows.totalHeightForWidth(width) if rows.hasHeightForWidth() else rows.totalSizeHint().height()
        self.body.setFixedHeight(min(height + 2, _BODY_MAX_HEIGHT))

    def resizeEvent(self, event: QResizeEvent) -> None:
        """Qt's resize event: rows wrap differently at another width, so the list's height is fitted again."""
        super().resizeEvent(event)
        self._fit()
