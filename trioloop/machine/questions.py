"""Questions a running tool puts to the person: a card of its own, answered only by the person.

A tool (an MCP server's ``elicitation/create`` is the first user) calls ``await ctx.ask(...)`` while it runs.
The runner gives the question an id, shows it to the faces (`Session.questions`), holds the turn deadline
still while it waits (as for the review cards; ``review_timeout_ms`` bounds the wait), and returns the
person's `Answer`: accept (with the form's values, checked against its fields), decline, or cancel. Stop,
the call's end and the turn's end cancel an open question. Nothing but a face's `Session.answer` answers
one: no model output, tool result or server text can.

Everything the asker supplies (its message, the fields' titles, descriptions and choices, a URL) is the
asker's text, untrusted: it is cleaned of control and bidi code points and capped here, once, for every face.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias, final
from urllib.parse import urlsplit

import attrs

from trioloop.machine.untrusted_text import strip_and_cap

__all__ = [
    "MAX_SAMPLING_MESSAGES",
    "Answer",
    "AnswerAction",
    "AnswerError",
    "FieldKind",
    "Question",
    "QuestionField",
    "QuestionKind",
    "QuestionRefused",
    "Sampled",
    "SamplingRequest",
]

#: What a field holds: free text, a number, a whole number, yes/no, one of ``options``, or several of them.
FieldKind: TypeAlias = Literal["text", "number", "integer", "boolean", "choice", "choices"]
#: A form to fill in, a page at a URL the person may open themselves (never opened for them), or a request
#: to send to the session's model on the asker's behalf (sampling).
QuestionKind: TypeAlias = Literal["form", "url", "sampling"]
#: What the person did: accepted (a form's values go back), declined, or dismissed it (cancel).
AnswerAction: TypeAlias = Literal["accept", "decline", "cancel"]

MAX_MESSAGE: Final = 2000
"""The longest message a card shows, in code points (the rest is cut, with a mark)."""
MAX_FIELDS: Final = 32
MAX_OPTIONS: Final = 64
MAX_URL: Final = 2048
MAX_TEXT_VALUE: Final = 10_000
"""The longest text a person's answer may give one field (a form is not a document)."""
_LABEL: Final = 200
_DESCRIPTION: Final = 500
_NAME: Final = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_FORMATS: Final = frozenset({"", "email", "uri", "date", "date-time"})
_EMAIL: Final = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_DATE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATE_TIME: Final = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?")


class QuestionRefused(RuntimeError):
    """The question cannot be put to anyone: no turn is running, the turn is ending, or the turn's
    ``max_questions_per_turn`` is spent. The asker tells its own caller (an MCP server gets an error)."""


class AnswerError(ValueError):
    """A face's answer does not fit the question (a missing required field, a value of the wrong kind or
    out of range, a field the form does not have). The message names the field; nothing was answered."""


def _cleaned(value: object, limit: int, newlines: bool = False) -> str:
    """For display: control, format and bidi code points stripped, capped (ending in "…" when cut). Nothing
    is escaped (a face shows plain text), so cleaning twice changes nothing."""
    if not isinstance(value, str):
        value = "" if value is None else str(value)
    return strip_and_cap(value, limit, newlines)[0]


def _label(value: object) -> str:
    return _cleaned(value, _LABEL)


def _description(value: object) -> str:
    return _cleaned(value, _DESCRIPTION, newlines=True)


def _message(value: object) -> str:
    return _cleaned(value, MAX_MESSAGE, newlines=True)


def _options(value: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The choices, values cleaned like labels (a value is shown, and answered, as the person sees it)."""
    options = tuple((_cleaned(v, MAX_TEXT_VALUE), _cleaned(label, _LABEL)) for v, label in value)
    if len(options) > MAX_OPTIONS:
        raise ValueError(f"a field offers at most {MAX_OPTIONS} choices")
    if len({v for v, _ in options}) != len(options):
        raise ValueError("two choices have the same value (once invisible code points are removed)")
    return options


def _default(value: Any) -> Any:
    """A default cleaned as the faces show it filled in: text of any kind, and each picked choice."""
    if isinstance(value, str):
        return _cleaned(value, MAX_TEXT_VALUE, newlines=True)
    if isinstance(value, list | tuple):
        return [_cleaned(v, MAX_TEXT_VALUE) if isinstance(v, str) else v for v in value]
    return value


def _bound(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"a field's bound must be a finite number, got {value!r}")
    return float(value)


@final
@attrs.frozen(kw_only=True)
class QuestionField:
    """One field of a form: its key in the answer, what kind of value it takes, and how the card labels it.

    ``minimum``/``maximum`` bound a number's value, a text's length, or how many ``choices`` may be picked.
    ``default`` (already checked against the field) is what an accepted answer gives when the person
    leaves the field out; the faces show it filled in.
    """

    name: str = attrs.field()
    kind: FieldKind
    title: str = attrs.field(default="", converter=_label)
    description: str = attrs.field(default="", converter=_description)
    required: bool = False
    default: Any = attrs.field(default=None, converter=_default)
    options: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_options)
    minimum: float | None = attrs.field(default=None, converter=_bound)
    maximum: float | None = attrs.field(default=None, converter=_bound)
    format: str = ""

    @name.validator
    def _name_ok(self, attribute: attrs.Attribute[str], value: str) -> None:
        if type(value) is not str or _NAME.fullmatch(value) is None:
            raise ValueError(f"a field's name is 1-64 letters, digits, '_', '-' or '.', got {value!r:.80}")

    def __attrs_post_init__(self) -> None:
        if self.kind not in ("text", "number", "integer", "boolean", "choice", "choices"):
            raise ValueError(f"unknown field kind {self.kind!r}")
        if (self.kind in ("choice", "choices")) != bool(self.options):
            raise ValueError(f'field "{self.name}": choices, and only choices, have options')
        if self.format not in _FORMATS or (self.format and self.kind != "text"):
            raise ValueError(f'field "{self.name}": unknown format {self.format!r}')
        if self.default is not None:
            try:
                object.__setattr__(self, "default", self.check(self.default))
            except AnswerError as exc:
                raise ValueError(f"the default does not fit: {exc}") from None

    @property
    def label(self) -> str:
        """What a face calls the field: its title, else its name."""
        return self.title or self.name

    def check(self, value: Any) -> Any:
        """``value`` as this field takes it (a JSON value), or `AnswerError` naming the field."""
        where = f'"{self.label}"'
        kind = self.kind
        if kind == "boolean":
            if type(value) is not bool:
                raise AnswerError(f"{where} takes yes or no (true or false)")
            return value
        if kind in ("number", "integer"):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise AnswerError(f"{where} takes a number")
            if kind == "integer":
                if value != int(value):
                    raise AnswerError(f"{where} takes a whole number")
                value = int(value)
            self._in_range(where, value, "")
            return value
        values = {option for option, _ in self.options}
        if kind == "choice":
            if type(value) is not str or value not in values:
                raise AnswerError(f"{where} takes one of: {', '.join(sorted(values))}")
            return value
        if kind == "choices":
            if not isinstance(value, list | tuple) or not all(type(v) is str and v in values for v in value):
                raise AnswerError(f"{where} takes a list of: {', '.join(sorted(values))}")
            picked = list(dict.fromkeys(value))
            self._in_range(where, len(picked), " choices")
            return picked
        if type(value) is not str:
            raise AnswerError(f"{where} takes text")
        if len(value) > MAX_TEXT_VALUE:
            raise AnswerError(f"{where} takes at most {MAX_TEXT_VALUE} characters")
        self._in_range(where, len(value), " characters")
        if not _format_ok(self.format, value):
            raise AnswerError(f"{where} takes {_FORMAT_NAMES[self.format]}")
        return value

    def number(self, typed: str) -> float | int:
        """The number a person typed for this (number or integer) field, as a face reads a text input; the
        value is checked by `check` afterwards. `AnswerError` if it is not a number."""
        text = typed.strip()
        try:
            return float(text) if self.kind == "number" or "." in text else int(text)
        except ValueError:
            raise AnswerError(f'"{self.label}" takes a number') from None

    def _in_range(self, where: str, amount: float, unit: str) -> None:
        if self.minimum is not None and amount < self.minimum:
            raise AnswerError(f"{where} takes at least {self.minimum:g}{unit}")
        if self.maximum is not None and amount > self.maximum:
            raise AnswerError(f"{where} takes at most {self.maximum:g}{unit}")


_FORMAT_NAMES: Final = {
    "email": "an email address",
    "uri": "an absolute URI",
    "date": "a date (YYYY-MM-DD)",
    "date-time": "a date and time (YYYY-MM-DDTHH:MM:SSZ)",
}


def _format_ok(form: str, value: str) -> bool:
    if form == "email":
        return _EMAIL.fullmatch(value) is not None
    if form == "uri":
        parts = urlsplit(value)
        return bool(parts.scheme) and bool(parts.netloc or parts.path)
    if form == "date":
        return _DATE.fullmatch(value) is not None
    if form == "date-time":
        return _DATE_TIME.fullmatch(value) is not None
    return True


def _fields(value: Sequence[QuestionField]) -> tuple[QuestionField, ...]:
    fields = tuple(value)
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"a form has at most {MAX_FIELDS} fields")
    if not all(type(f) is QuestionField for f in fields):
        raise TypeError("fields must be QuestionField values")
    if len({f.name for f in fields}) != len(fields):
        raise ValueError("two fields of a form have the same name")
    return fields


def _url(value: object) -> str:
    if value == "":
        return ""
    if type(value) is not str or len(value) > MAX_URL:
        raise ValueError(f"a URL is text of at most {MAX_URL} characters")
    cleaned = _cleaned(value, MAX_URL)
    parts = urlsplit(cleaned)
    if cleaned != value or " " in value or parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("a question's URL must be a plain http or https URL")
    return cleaned


MAX_SAMPLING_MESSAGES: Final = 32
MAX_SAMPLING_TEXT: Final = 16_000
"""The longest message of a sampling request, in code points: the card shows, and the model gets, the same
text (cut with a mark beyond this)."""


def _sampling_messages(value: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    messages = tuple((role, _cleaned(text, MAX_SAMPLING_TEXT, newlines=True)) for role, text in value)
    if not 0 < len(messages) <= MAX_SAMPLING_MESSAGES:
        raise ValueError(f"a sampling request has 1 to {MAX_SAMPLING_MESSAGES} messages")
    if any(role not in ("user", "assistant") for role, _ in messages):
        raise ValueError("a sampling message's role is user or assistant")
    return messages


def _tokens(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{attribute.name} must be a positive int, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class SamplingRequest:
    """What an asker wants the session's model to see, as the card shows it and the model gets it: the
    messages (role, text; anything that is not text is described in the text), the system prompt it asks
    for, its preferred model (a hint only: the session's model answers) and its token budget."""

    messages: tuple[tuple[str, str], ...] = attrs.field(converter=_sampling_messages)
    system_prompt: str = attrs.field(default="", converter=_message)
    model_hint: str = attrs.field(default="", converter=_label)
    max_tokens: int = attrs.field(validator=_tokens)


@final
@attrs.frozen(kw_only=True)
class Sampled:
    """What became of a sampling request: the person's ``action``; when they accepted, the model's ``text``,
    the ``model`` that answered and why it stopped, or the ``error`` that kept it from answering."""

    action: AnswerAction
    text: str = ""
    model: str = ""
    stop_reason: str = ""
    error: str = ""


@final
@attrs.frozen(kw_only=True)
class Question:
    """A running call's question for the person, as every face shows it.

    ``source`` says who asks (``MCP server "memory"``), ``message`` is that asker's own text (the faces
    label it as such). A ``form`` question has ``fields``; a ``url`` question has the ``url`` the person may
    open themselves (a face shows it as text, its host plainly, and never opens it)."""

    id: str
    call_id: str
    tool_name: str = ""
    source: str = attrs.field(converter=_label)
    kind: QuestionKind = "form"
    message: str = attrs.field(default="", converter=_message)
    fields: tuple[QuestionField, ...] = attrs.field(default=(), converter=_fields)
    url: str = attrs.field(default="", converter=_url)
    sampling: SamplingRequest | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind not in ("form", "url", "sampling"):
            raise ValueError(f"unknown question kind {self.kind!r}")
        if (self.kind == "url") != bool(self.url) or (self.kind != "form" and self.fields):
            raise ValueError("a url question has a URL and no fields; a form has fields and no URL")
        if (self.kind == "sampling") != (self.sampling is not None):
            raise ValueError("a sampling question, and only one, carries its sampling request")

    @property
    def host(self) -> str:
        """The host a ``url`` question's URL leads to (shown on its own: a person checks where it goes)."""
        return urlsplit(self.url).hostname or "" if self.url else ""

    def checked(self, content: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """An accepted form's values: each field's value checked, a left-out field's default filled in.

        Raises `AnswerError` for a field the form does not have, a missing required field, or a value that
        does not fit. A ``url`` question takes no values."""
        given = dict(content or {})
        unknown = sorted(set(given) - {f.name for f in self.fields})
        if unknown:
            raise AnswerError(f"the form has no field {unknown[0]!r}")
        values: dict[str, Any] = {}
        for field in self.fields:
            value = given.get(field.name)
            if value is None:
                if field.default is not None:
                    values[field.name] = field.default
                elif field.required:
                    raise AnswerError(f'"{field.label}" is required')
                continue
            values[field.name] = field.check(value)
        return MappingProxyType(values)


@final
@attrs.frozen
class Answer:
    """The person's answer: ``accept`` (with the form's checked values), ``decline`` or ``cancel``."""

    action: AnswerAction
    content: Mapping[str, Any] = attrs.field(factory=lambda: MappingProxyType({}))

    @classmethod
    def cancelled(cls) -> Answer:
        """The answer nobody gave: the question was closed (Stop, the call's end, the turn's end)."""
        return cls("cancel")
