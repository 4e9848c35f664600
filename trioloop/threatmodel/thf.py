"""Reading and writing `.thf` files: YAML text <-> plain data <-> ThreatModel.

`load_thf` goes through four gates in SPEC §8 order: bounded safe YAML, exact version and shape (every
known field has its declared type; unknown keys are kept in `extra`: `thf_shape`), then the semantic checks
of `validation`. `dump_thf` writes a fixed, diff-friendly key order so that load(dump(m)) == m for every
valid model. The shape gate both ways (`model_from_data`, `model_to_data`) is `thf_shape`'s, named here too.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from trioloop.threatmodel._safe_yaml import MAX_DOCUMENT_BYTES, dump_yaml, parse_yaml
from trioloop.threatmodel.errors import UnsafeYaml, path_hint
from trioloop.threatmodel.model import ThreatModel
from trioloop.threatmodel.thf_shape import REQUIRED_SECTIONS, model_from_data, model_to_data
from trioloop.threatmodel.validation import check_semantics

if TYPE_CHECKING:
    from trioloop.threatmodel.thf_file import ThfFile

__all__ = ["REQUIRED_SECTIONS", "dump_thf", "load_thf", "model_from_data", "model_to_data"]


def load_thf(source: str | bytes | os.PathLike[str]) -> ThreatModel:
    """Read a `.thf` document and return a valid ThreatModel, or raise a ThfError subclass.

    A `str` or `bytes` argument is the YAML text itself (bytes must be UTF-8); a path must be given
    as an `os.PathLike` (e.g. `pathlib.Path`), so text is never mistaken for a file name (text that names
    an existing file and is not a document raises with "pass a Path to read a file"). Reading a path can
    raise OSError, which is not a document error and is left to the caller.
    """
    if isinstance(source, str | bytes):
        with path_hint(source):
            model = model_from_data(parse_yaml(source))
    else:
        with open(source, "rb") as file:
            if os.fstat(file.fileno()).st_size > MAX_DOCUMENT_BYTES:
                raise UnsafeYaml(f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
            raw = file.read(MAX_DOCUMENT_BYTES + 1)  # a pipe or device reports no size
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise UnsafeYaml(f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
        model = model_from_data(parse_yaml(raw))
    check_semantics(model)
    return model


def dump_thf(model: ThreatModel, original: ThfFile | None = None) -> str:
    """The model as `.thf` YAML text in a fixed order: version, metadata, the sections, then unknown keys.

    With ``original`` (from `load_thf_file`), the text is ``original``'s with only what changed
    rewritten: see `trioloop.threatmodel.thf_file`.
    """
    if original is not None:
        return original.render(model)
    return dump_yaml(model_to_data(model))
