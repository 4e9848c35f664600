"""A question card: a running call's question for the person (an MCP server's elicitation) as a form.

The card says who asks and during which call, shows the asker's message as that asker's words, and one input
per field (a line for text and numbers, a check box for yes/no, a list for one choice, check boxes for several),
each filled in with its default. A sampling question shows every message and the system prompt it would send
to the model, the model it prefers and the token budget. A URL question shows the URL as plain text, its host
on a line of its own, and a button that copies it; nothing opens it. The card decides nothing: Accept, Decline
and Cancel report the click (Accept with the form's values, checked by the fields first) and the panel answers
the session.
"""

from __future__ import annotations

from typing import Any, Final, final

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from trioloop.machine.questions import AnswerError, Question, QuestionField
from trioloop.ui._qt_plain_text import plain_label

__all__ = ["QUESTION_STYLE", "QuestionCard"]

QUESTION_STYLE: Final = """
QFrame#questionCard { background: #fbf7ff; border: 1px solid #8250df; border-radius: 6px; }
QLabel#questionSource { font-weight: bold; color: #6639ba; }
QLabel#questionMessage { background: #ffffff; border: 1px dashed #c297ff; padding: 4px; }
QLabel#questionHost { font-weight: bold; }
QLabel#questionError { color: #cf222e; }
"""


class _ChoiceList(QWidget):
    """Several choices: one check box each."""

    def __init__(self, field: QuestionField) -> None:
        super().__init__()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        picked = set(field.default or ())
        self.boxes: list[tuple[str, QCheckBox]] = []
        for value, label in field.options:
            box = QCheckBox(label)  # a check box's text is plain text
            box.setChecked(value in picked)
            layout.addWidget(box)
            self.boxes.append((value, box))

    def value(self) -> list[str]:
        return [value for value, box in self.boxes if box.isChecked()]


def _input(field: QuestionField) -> QWidget:
    if field.kind == "boolean":
        box = QCheckBox()
        box.setChecked(bool(field.default))
        return box
    if field.kind == "choice":
        combo = QComboBox()
        if not field.required or field.default is None:
            combo.addItem("", None)  # no choice made
        for value, label in field.options:
            combo.addItem(label, value)
        if field.default is not None:
            combo.setCurrentIndex(combo.findData(field.default))
        return combo
    if field.kind == "choices":
        return _ChoiceList(field)
    line = QLineEdit()
    if field.default is not None:
        line.setText(str(field.default))
    line.setPlaceholderText({"email": "name@example.com", "date": "YYYY-MM-DD"}.get(field.format, ""))
    return line


def _value(field: QuestionField, widget: QWidget) -> Any:
    """What the person entered in ``widget`` for ``field`` (None: left empty); `AnswerError` if it is not a
    number where a number is asked for."""
    if isinstance(widget, QCheckBox):
        return widget.isChecked()
    if isinstance(widget, QComboBox):
        return widget.currentData()
    if isinstance(widget, _ChoiceList):
        return widget.value() or None
    assert isinstance(widget, QLineEdit)
    text = widget.text().strip()
    if not text:
        return None
    return field.number(text) if field.kind in ("number", "integer") else text


@final
class QuestionCard(QFrame):
    """One open question. ``answered`` is emitted with (question id, action, values or None)."""

    answered = Signal(str, str, object)

    def __init__(self, question: Question) -> None:
        super().__init__()
        self.setObjectName("questionCard")
        self.question = question
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        self.source_label = plain_label(
            f"{question.source} asks, during {question.tool_name}", object_name="questionSource", wrap=True
        )
        layout.addWidget(self.source_label)
        self.message_label = plain_label(question.message or "(no message)", object_name="questionMessage", wrap=True)
        if question.message or question.kind != "sampling":  # a sampling request's words are its messages
            layout.addWidget(plain_label("Its own words:", object_name="questionLabel"))
            layout.addWidget(self.message_label)
        self.inputs: dict[str, QWidget] = {}
        self.url_label = None
        if question.kind == "url":
            layout.addWidget(plain_label("It asks you to open this page yourself (it is not opened for you):"))
            self.url_label = plain_label(question.url, object_name="questionUrl", wrap=True)
            layout.addWidget(self.url_label)
            layout.addWidget(plain_label(f"which leads to: {question.host}", object_name="questionHost"))
            copy = QPushButton("Copy the address")
            copy.setObjectName("copyUrlButton")
            copy.clicked.connect(lambda: QApplication.clipboard().setText(question.url))
            layout.addWidget(copy)
        elif question.sampling is not None:
            request = question.sampling
            layout.addWidget(plain_label("It asks the model to answer this (no tools; the answer goes to the server):"))
            self.sampling_view = QPlainTextEdit()
            self.sampling_view.setObjectName("samplingRequest")
            self.sampling_view.setReadOnly(True)
            self.sampling_view.setMaximumHeight(170)  # it scrolls; the card keeps its buttons in view
            parts = [f"system prompt:\n{request.system_prompt}"] if request.system_prompt else []
            parts.extend(f"{role}:\n{text}" for role, text in request.messages)
            self.sampling_view.setPlainText("\n\n".join(parts))  # plain text: markup shown, never rendered
            layout.addWidget(self.sampling_view)
            hint = f"; it prefers {request.model_hint}" if request.model_hint else ""
            layout.addWidget(plain_label(f"At most {request.max_tokens} tokens, from this session's model{hint}."))
        else:
            form = QFormLayout()
            for field in question.fields:
                widget = _input(field)
                widget.setObjectName(f"field_{field.name}")
                self.inputs[field.name] = widget
                label = field.label + (" *" if field.required else "")
                form.addRow(plain_label(label), widget)
                if field.description:
                    form.addRow("", plain_label(field.description, object_name="fieldDescription", wrap=True))
            layout.addLayout(form)
        self.error_label = plain_label("", object_name="questionError", wrap=True)
        self.error_label.setVisible(False)
        layout.addWidget(self.error_label)
        buttons = QHBoxLayout()
        self.accept_button = QPushButton(
            {"url": "Accept", "form": "Send", "sampling": "Send to the model"}[question.kind]
        )
        self.accept_button.setObjectName("acceptButton")
        self.decline_button = QPushButton("Decline")
        self.decline_button.setObjectName("declineButton")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelButton")
        buttons.addStretch(1)
        for button in (self.accept_button, self.decline_button, self.cancel_button):
            buttons.addWidget(button)
        layout.addLayout(buttons)
        self.accept_button.clicked.connect(self._accept)
        self.decline_button.clicked.connect(lambda: self._send("decline", None))
        self.cancel_button.clicked.connect(lambda: self._send("cancel", None))

    def values(self) -> dict[str, Any]:
        """The form as filled in, each value checked by its field; `AnswerError` names the first that does not
        fit (a required field left empty included)."""
        values: dict[str, Any] = {}
        for field in self.question.fields:
            value = _value(field, self.inputs[field.name])
            if value is not None:
                values[field.name] = value
        self.question.checked(values)  # raises AnswerError for what does not fit
        return values

    def show_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    def _accept(self) -> None:
        if self.question.kind != "form":
            self._send("accept", None)
            return
        try:
            values = self.values()
        except AnswerError as exc:
            self.show_error(f"{exc}.")
            return
        self._send("accept", values)

    def _send(self, action: str, values: dict[str, Any] | None) -> None:
        self.show_error("")
        for button in (self.accept_button, self.decline_button, self.cancel_button):
            button.setEnabled(False)
        self.answered.emit(self.question.id, action, values)
