"""The threat model as a document kind: how the generic core validates, copies, compares and diffs it."""

from __future__ import annotations

from typing import Any, final

from trioloop.machine.document import text_diff
from trioloop.threatmodel._safe_yaml import plain_data
from trioloop.threatmodel.errors import InvalidShape
from trioloop.threatmodel.model import ThreatModel, detached_copy
from trioloop.threatmodel.thf import dump_thf, load_thf, model_from_data, model_to_data
from trioloop.threatmodel.validation import check_semantics, validate_threat_model

__all__ = ["THREAT_MODEL", "ThreatModelKind"]


@final
class ThreatModelKind:
    """`DataDocumentKind[ThreatModel]`: `validate_threat_model`, value equality, a `.thf` diff, `.thf` text, and
    the `.thf` file's plain data (what journals keep: 60 times cheaper to write than the YAML text).

    A `ThreatModel` is immutable all the way down (sealed attrs classes, tuples, frozen ``extra``), so the
    kind declares it immutable: every tool shares the snapshot its call started from, and no copy is made.
    """

    name = "threat model"
    #: What its documents are: a session given anything else (a `ThfFile`: pass its ``.model``) is refused at once.
    document_type = ThreatModel

    @property
    def immutable(self) -> bool:
        """True: a ThreatModel is frozen, so tools share it without copies."""
        return True

    def validate(self, document: ThreatModel) -> str | None:
        """None for a valid model, else the first rule it breaks."""
        problem = validate_threat_model(document)
        return None if problem is None else problem.message

    def private_copy(self, document: ThreatModel) -> ThreatModel:
        """The model itself: it is immutable, nothing can change it in place."""
        return detached_copy(document)

    def same(self, a: ThreatModel, b: ThreatModel) -> bool:
        """Whether two models are equal."""
        return a is b or a == b

    def diff(self, before: ThreatModel, after: ThreatModel) -> str:
        """A unified diff of two models' .thf text (empty when equal)."""
        if self.same(before, after):
            return ""
        return text_diff(dump_thf(before), dump_thf(after), before_name="before.thf", after_name="after.thf")

    def dump(self, document: ThreatModel) -> str:
        """The model as .thf text."""
        return dump_thf(document)

    def load(self, text: str) -> ThreatModel:
        """A model from .thf text (bounded, validated; raises `ThfError`)."""
        return load_thf(text)  # the hostile-input bounds of every .thf load apply

    def to_data(self, document: ThreatModel) -> Any:
        """The model as the plain data of its .thf text (the same mapping, before YAML), or None for a model
        whose ``extra`` would not read back the same (the journal then keeps its .thf text)."""
        try:
            return model_to_data(document, strict=True)
        except InvalidShape:
            return None

    def from_data(self, data: Any) -> ThreatModel:
        """A model from the plain data `to_data` gives, through the gates of `load_thf` after its YAML parse (the
        data's types, the shape, the semantic checks); raises a `ThfError` subclass."""
        model = model_from_data(plain_data(data))
        check_semantics(model)
        return model

    def __repr__(self) -> str:
        return "THREAT_MODEL"


#: The one instance apps pass as ``Session(kind=...)`` for `.thf` documents.
THREAT_MODEL = ThreatModelKind()
