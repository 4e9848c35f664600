import contextlib
import copy
import json
import pickle
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import attrs
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies_document import threat_models

import trioloop.threatmodel as document
from trioloop.threatmodel import (
    CircularGroupNesting,
    DataFlow,
    DuplicateId,
    Element,
    Group,
    InvalidReference,
    InvalidShape,
    Metadata,
    Mitigation,
    Position,
    ThfError,
    Threat,
    ThreatModel,
    UnsafeYaml,
    UnsupportedVersion,
    dump_thf,
    load_thf,
    validate_threat_model,
)
from trioloop.threatmodel._safe_yaml import MAX_DEPTH, MAX_DOCUMENT_BYTES
from trioloop.threatmodel.action_inputs import MitigationStatusName, SeverityName, StrideCategory
from trioloop.threatmodel.model import (
    MITIGATION_STATUSES,
    SECTION_NAMES,
    SEVERITIES,
    STRIDE_CATEGORIES,
    FrozenDict,
    FrozenList,
    detached_copy,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "payment.thf"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
INVALID = FIXTURES / "thf_invalid"
BASE_TEXT = (FIXTURES / "thf_valid_base.thf").read_text()

# Each invalid fixture, the error class it must raise and a fragment the message must contain
# (the fragment names the section/id and the rule).
INVALID_FILES: dict[str, tuple[type[ThfError], str]] = {
    "unsupported_version": (UnsupportedVersion, 'version "2.0" is not supported'),
    "version_not_text": (UnsupportedVersion, "got a number (quote it)"),
    "missing_version": (UnsupportedVersion, "version is missing"),
    "invalid_yaml": (InvalidShape, "not valid YAML near line 8"),
    "root_not_mapping": (InvalidShape, "must be a mapping at the top level"),
    "metadata_not_mapping": (InvalidShape, "metadata must be a mapping"),
    "missing_metadata": (InvalidShape, "metadata is missing"),
    "missing_section": (InvalidShape, "threats is missing"),
    "section_not_list": (InvalidShape, "layers must be a list"),
    "entry_not_mapping": (InvalidShape, "diagrams[0] must be a mapping"),
    "missing_id": (InvalidShape, "diagrams[0].id is missing"),
    "id_not_text": (InvalidShape, "diagrams[0].id must be text"),
    "missing_required_field": (InvalidShape, 'elements["db"].name is missing'),
    "field_wrong_type": (InvalidShape, 'elements["db"].name must be text, got a number'),
    "list_field_wrong_type": (InvalidShape, 'trust_boundaries["b1"].contains must be a list of text'),
    "bool_field_wrong_type": (InvalidShape, 'data_flows["f1"].authenticated must be true or false'),
    "position_not_numbers": (InvalidShape, 'elements["db"].position.x must be a finite number'),
    "duplicate_mapping_key": (InvalidShape, 'metadata: the key "title" appears twice'),
    "non_text_key": (InvalidShape, "metadata: mapping keys must be text"),
    "unsupported_tag": (InvalidShape, "unsupported YAML tag"),
    "duplicate_element_id": (DuplicateId, 'elements: the id "web" is used more than once'),
    "duplicate_data_flow_id": (DuplicateId, 'data_flows: the id "f1"'),
    "duplicate_trust_boundary_id": (DuplicateId, 'trust_boundaries: the id "b1"'),
    "duplicate_threat_id": (DuplicateId, 'threats: the id "t1"'),
    "duplicate_layer_id": (DuplicateId, 'layers: the id "l1"'),
    "duplicate_group_id": (DuplicateId, 'groups: the id "g1"'),
    "duplicate_relationship_id": (DuplicateId, 'relationships: the id "r1"'),
    "duplicate_diagram_id": (DuplicateId, 'diagrams: the id "d1"'),
    "group_id_collides_with_element": (DuplicateId, 'groups["db"]: the id is already used by an element'),
    "group_id_collides_with_boundary": (DuplicateId, 'groups["b1"]: the id is already used by a trust boundary'),
    "relationship_id_collides_with_flow": (DuplicateId, 'relationships["f1"]: the id is already used by a data flow'),
    "dangling_flow_source": (InvalidReference, 'data_flows["f1"].from: no element with id "cache"'),
    "dangling_flow_target": (InvalidReference, 'data_flows["f1"].to: no element with id "cache"'),
    "dangling_element_layer": (InvalidReference, 'elements["web"].layer: no layer with id "l9"'),
    "dangling_element_group": (InvalidReference, 'elements["web"].group: no group with id "g9"'),
    "dangling_group_parent": (InvalidReference, 'groups["g1"].parent: no group with id "g9"'),
    "dangling_relationship_source": (InvalidReference, 'relationships["r1"].from: no element with id "cache"'),
    "dangling_relationship_target": (InvalidReference, 'relationships["r1"].to: no element with id "cache"'),
    "dangling_boundary_member": (InvalidReference, 'trust_boundaries["b1"].contains: no element with id "cache"'),
    "dangling_threat_element": (InvalidReference, 'threats["t1"].element: no element with id "cache"'),
    "dangling_threat_flow": (InvalidReference, 'threats["t1"].flow: no data flow with id "f9"'),
    "threat_without_target": (InvalidReference, 'threats["t1"]: a threat must target an element or a data flow'),
    "group_self_parent": (CircularGroupNesting, 'groups["g1"]: a group cannot be its own parent'),
    "group_cycle": (CircularGroupNesting, "parent chain leads back to itself"),
    "order_version_before_shape": (UnsupportedVersion, 'version "0.9"'),
    "order_shape_before_duplicate": (InvalidShape, 'elements["web"].name must be text'),
    "order_duplicate_before_reference": (DuplicateId, 'elements: the id "web"'),
    "order_reference_before_cycle": (InvalidReference, 'trust_boundaries["b1"].contains'),
    "billion_laughs": (UnsafeYaml, "expands to more than"),
    "deep_nesting": (UnsafeYaml, f"nests deeper than {MAX_DEPTH} levels"),
    "recursive_alias": (UnsafeYaml, "recursive alias"),
    "python_object_tag": (UnsafeYaml, "Python object tag"),
}


def load_text(text: str) -> ThreatModel:
    return load_thf(text)


def base_with(old: str, new: str) -> str:
    assert old in BASE_TEXT
    return BASE_TEXT.replace(old, new, 1)


# ---------------------------------------------------------------------------------------------
# Model


def test_public_surface_is_complete_and_sorted() -> None:
    assert document.__all__ == sorted(document.__all__, key=lambda n: (not n.isupper(), n))
    for name in document.__all__:
        assert hasattr(document, name), name
    for name in ("ThreatModel", "load_thf", "dump_thf", "validate_threat_model", "ThfError", "apply_action"):
        assert name in document.__all__


def test_constants_match_the_tool_enums() -> None:
    assert SECTION_NAMES == (
        "elements",
        "data_flows",
        "trust_boundaries",
        "threats",
        "layers",
        "groups",
        "relationships",
        "diagrams",
    )
    assert get_args(StrideCategory) == STRIDE_CATEGORIES
    assert get_args(SeverityName) == SEVERITIES == ("critical", "high", "medium", "low", "info")
    assert get_args(MitigationStatusName) == MITIGATION_STATUSES


def test_optional_fields_default_to_none_and_lists_to_empty_tuples() -> None:
    element = Element(id="a", type="process", name="A")
    assert element.trust_zone is None and element.layer is None and element.position is None
    assert element.technologies == () and element.tags == () and element.extra == {}
    flow = DataFlow(id="f", source="a", target="a")
    assert flow.authenticated is False and flow.encrypted is None and flow.data == ()
    assert Metadata().threat_analysis_enabled is None
    assert ThreatModel().version == "1.0"


def test_model_is_frozen_and_hashable() -> None:
    model = ThreatModel(elements=(Element(id="a", type="process", name="A", extra={"k": [1]}),))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        model.version = "2.0"  # type: ignore[misc]
    assert hash(model) == hash(copy.deepcopy(model))


def test_extra_is_copied_and_normalized() -> None:
    source: dict[str, Any] = {"k": (1, {"n": (2,)})}
    element = Element(id="a", type="t", name="A", extra=source)
    source["k"] = "changed"
    assert element.extra == {"k": [1, {"n": [2]}]}
    assert type(element.extra) is FrozenDict and type(element.extra["k"]) is FrozenList
    listed = Element(id="a", type="t", name="A", tags=["x"])  # type: ignore[arg-type]
    assert listed.tags == ("x",) and type(listed.tags) is tuple


def test_section_find_and_ids() -> None:
    model = load_thf(EXAMPLE)
    for name in SECTION_NAMES:
        assert model.section(name) is getattr(model, name)
    assert model.find("elements", "card-vault") == model.elements[6]
    assert model.find("elements", "nope") is None
    assert "flow-12" in model.ids("data_flows")
    with pytest.raises(KeyError):
        model.section("metadata")


# ---------------------------------------------------------------------------------------------
# Loading


def test_example_loads_with_every_section() -> None:
    model = load_thf(EXAMPLE)
    assert validate_threat_model(model) is None
    assert len(model.elements) == 12 and len(model.data_flows) == 12 and len(model.trust_boundaries) == 2
    assert {t.category for t in model.threats} == set(STRIDE_CATEGORIES)
    assert all(t.mitigation is not None for t in model.threats)
    flow = model.find("data_flows", "flow-5")
    assert isinstance(flow, DataFlow) and (flow.source, flow.target) == ("payment-service", "card-vault")


def test_str_and_bytes_are_yaml_text_and_pathlike_is_a_path(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    from_path = load_thf(EXAMPLE)
    assert load_thf(text) == from_path
    assert load_thf(text.encode()) == from_path
    assert load_thf(b"\xef\xbb\xbf" + text.encode()) == from_path
    # A str is never taken for a file name, even when it names one.
    with pytest.raises(InvalidShape, match="must be a mapping at the top level"):
        load_thf(str(EXAMPLE))
    with pytest.raises(OSError):
        load_thf(tmp_path / "missing.thf")


def test_non_utf8_bytes_are_invalid_shape() -> None:
    with pytest.raises(InvalidShape, match="not UTF-8"):
        load_thf(b"version: '1.0'\nmetadata: {title: \xff}\n")


def test_dates_stay_text() -> None:
    model = load_text(base_with("title: Fixture", "title: Fixture\n  created: 2024-01-15\n  when: 2024-01-15 10:00:00"))
    assert model.metadata.created == "2024-01-15"
    assert model.metadata.extra["when"] == "2024-01-15 10:00:00"
    model = load_text(base_with("name: DB}", "name: 2024-01-15}"))
    assert model.elements[1].name == "2024-01-15"
    assert load_thf(dump_thf(model)) == model


@pytest.mark.parametrize(
    ("yaml_value", "shown"),
    [("123", "a number"), ("true", "a boolean"), ("[a]", "a list"), ("{a: 1}", "a mapping"), ("1.5", "a number")],
)
def test_non_text_scalar_in_text_field_is_invalid_shape(yaml_value: str, shown: str) -> None:
    with pytest.raises(InvalidShape, match=rf'elements\["db"\]\.name must be text, got {shown}'):
        load_text(base_with("name: DB}", f"name: {yaml_value}}}"))


def test_null_optional_fields_read_as_absent() -> None:
    model = load_text(base_with("name: DB}", "name: DB, layer: null, tags: null, position: null}"))
    assert model.elements[1].layer is None and model.elements[1].tags == () and model.elements[1].position is None


def test_optional_sections_may_be_absent() -> None:
    text = "version: '1.0'\nmetadata: {}\nelements: []\ndata_flows: []\ntrust_boundaries: []\nthreats: []\n"
    model = load_thf(text)
    assert model == ThreatModel()
    assert dump_thf(model) == text


def test_unknown_keys_survive_load_dump_load() -> None:
    text = base_with("title: Fixture", "title: Fixture\n  reviewed_by: [alice, bob]")
    text = text.replace("name: DB}", "name: DB, fill_color: '#ffffff', font_size: 12}")
    text = text.replace("element: db}", "element: db, mitigation: {status: mitigated, description: d, ticket: SEC-1}}")
    text += "settings:\n  theme: dark\nannotations:\n  - {id: n1, text: note}\n"
    model = load_thf(text)
    assert model.metadata.extra == {"reviewed_by": ["alice", "bob"]}
    assert model.elements[1].extra == {"fill_color": "#ffffff", "font_size": 12}
    mitigation = model.threats[0].mitigation
    assert mitigation is not None and mitigation.extra == {"ticket": "SEC-1"}
    assert model.extra == {"settings": {"theme": "dark"}, "annotations": [{"id": "n1", "text": "note"}]}
    dumped = dump_thf(model)
    assert "fill_color" in dumped and "annotations:" in dumped and "ticket: SEC-1" in dumped
    assert load_thf(dumped) == model


def test_dump_order_is_fixed_and_diff_friendly() -> None:
    model = load_thf(EXAMPLE)
    text = dump_thf(model)
    top = [line.split(":")[0] for line in text.splitlines() if line and not line.startswith((" ", "-"))]
    assert top == ["version", "metadata", *SECTION_NAMES]
    data = yaml.safe_load(text)
    assert list(data["elements"][0]) == ["id", "type", "name", "trust_zone", "description", "technologies", "layer"]
    assert list(data["data_flows"][0])[:3] == ["id", "from", "to"]
    # Unknown keys come after the known ones, in their original order.
    with_extra = load_text(base_with("name: DB}", "name: DB, zeta: 1, alpha: 2, layer: l1}"))
    assert list(yaml.safe_load(dump_thf(with_extra))["elements"][1]) == [
        "id",
        "type",
        "name",
        "technologies",
        "layer",
        "zeta",
        "alpha",
    ]


def test_dump_writes_shared_values_without_anchors() -> None:
    shared = {"a": 1}
    model = ThreatModel(extra={"x": shared, "y": shared})
    text = dump_thf(model)
    assert "&" not in text and "*" not in text


@settings(max_examples=80, deadline=None)
@given(threat_models())
def test_every_valid_model_round_trips(model: ThreatModel) -> None:
    assert validate_threat_model(model) is None
    text = dump_thf(model)
    assert text.startswith("version: '1.0'\nmetadata:")
    loaded = load_thf(text)
    assert loaded == model
    assert dump_thf(loaded) == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_load_raises_only_thf_errors(source: str | bytes) -> None:
    try:
        load_thf(source)
    except ThfError as error:
        assert "\n" not in error.message
        assert error.message


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_mangled_documents_fail_with_thf_errors_only(data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(BASE_TEXT)))
    junk = data.draw(st.sampled_from(["", "[", "}", ": x", "\n  - *a", " &a", "!!str", "\t", "'", "\x00"]))
    with contextlib.suppress(ThfError):
        load_thf(BASE_TEXT[:cut] + junk + BASE_TEXT[cut:])


# ---------------------------------------------------------------------------------------------
# Invalid fixtures


def test_fixture_table_covers_every_file() -> None:
    assert {path.stem for path in INVALID.glob("*.thf")} == set(INVALID_FILES)
    assert load_thf(FIXTURES / "thf_valid_base.thf") is not None


@pytest.mark.parametrize("name", sorted(INVALID_FILES))
def test_invalid_fixture_raises_its_error(name: str) -> None:
    expected, fragment = INVALID_FILES[name]
    path = INVALID / f"{name}.thf"
    with pytest.raises(ThfError) as caught:
        load_thf(path)
    assert type(caught.value) is expected
    assert fragment in caught.value.message
    message = caught.value.message
    assert "\n" not in message
    assert str(path.parent) not in message and ".thf" not in message.replace("a .thf file", "")
    for internal in ("while parsing", "expected <", "Traceback", "yaml.", "ConstructorError", "<unicode string>"):
        assert internal not in message
    assert str(caught.value) == message


def test_semantic_fixtures_give_the_same_error_in_memory() -> None:
    """validate_threat_model reports what load_thf reports, for every rule after shape."""
    for name, (expected, _) in INVALID_FILES.items():
        if expected not in (DuplicateId, InvalidReference, CircularGroupNesting):
            continue
        data = yaml.safe_load((INVALID / f"{name}.thf").read_text())
        from trioloop.threatmodel.thf import model_from_data

        model = model_from_data(data)
        error = validate_threat_model(model)
        with pytest.raises(ThfError) as caught:
            load_thf(INVALID / f"{name}.thf")
        assert error == caught.value


# ---------------------------------------------------------------------------------------------
# Hostile YAML: bounded memory (tracemalloc peak), never a timing assertion


def peak_bytes(source: Any) -> tuple[type[BaseException] | None, int]:
    tracemalloc.start()
    try:
        load_thf(source)
    except ThfError as error:
        outcome: type[BaseException] | None = type(error)
    else:
        outcome = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return outcome, peak


def test_billion_laughs_fails_in_bounded_memory() -> None:
    text = (INVALID / "billion_laughs.thf").read_text()
    outcome, peak = peak_bytes(text)
    assert outcome is UnsafeYaml
    assert peak < 2 * 1024 * 1024


def test_wide_alias_fan_out_fails_in_bounded_memory() -> None:
    lines = ["version: '1.0'", "metadata:", "  a: &a [" + ", ".join(["x"] * 1000) + "]", "  b:"]
    lines += ["    - *a"] * 1000
    outcome, peak = peak_bytes("\n".join(lines) + "\nelements: []\ndata_flows: []\ntrust_boundaries: []\nthreats: []\n")
    assert outcome is UnsafeYaml
    assert peak < 4 * 1024 * 1024


def test_alias_depth_cannot_exceed_the_nesting_bound() -> None:
    # Each alias nests the previous chain one level deeper than the text shows.
    lines = ["version: '1.0'", "metadata:", "  l0: &l0 [x]"]
    lines += [f"  l{i}: &l{i} [*l{i - 1}]" for i in range(1, MAX_DEPTH + 2)]
    outcome, _ = peak_bytes("\n".join(lines) + "\nelements: []\ndata_flows: []\ntrust_boundaries: []\nthreats: []\n")
    assert outcome is UnsafeYaml


@pytest.mark.parametrize(
    "deep",
    [
        "version: '1.0'\nmetadata:\n  x: " + "[" * 100_000,
        "version: '1.0'\nmetadata:\n  x: " + "{a: " * 100_000,
        "".join("  " * i + "- \n" for i in range(2000)),
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences"],
)
def test_deep_nesting_fails_in_bounded_memory(deep: str) -> None:
    outcome, peak = peak_bytes(deep)
    assert outcome is UnsafeYaml
    assert peak < 4 * 1024 * 1024


def test_oversize_input_fails_before_parsing(tmp_path: Path) -> None:
    big = b"version: '1.0'\n#" + b"x" * MAX_DOCUMENT_BYTES
    path = tmp_path / "big.thf"
    path.write_bytes(big)
    for source in (big, big.decode(), path):
        outcome, peak = peak_bytes(source)
        assert outcome is UnsafeYaml
        assert peak < 8 * 1024 * 1024  # the copy of the input a str check makes, never a parse


def test_modest_legitimate_aliases_are_accepted() -> None:
    text = base_with("title: Fixture", "title: Fixture\n  shared: &s {a: 1}\n  again: *s\n  merged: {<<: *s, b: 2}")
    model = load_thf(text)
    assert model.metadata.extra == {"shared": {"a": 1}, "again": {"a": 1}, "merged": {"a": 1, "b": 2}}


def test_python_tags_never_construct_objects() -> None:
    with pytest.raises(UnsafeYaml):
        load_thf("version: '1.0'\nmetadata: !!python/object:os.system {}\n")
    with pytest.raises(InvalidShape, match="unsupported YAML tag"):
        load_thf("version: '1.0'\nmetadata: !custom {}\n")


# ---------------------------------------------------------------------------------------------
# validate_threat_model on in-memory models


def valid_model() -> ThreatModel:
    return load_thf(EXAMPLE)


def test_validate_returns_errors_instead_of_raising() -> None:
    model = valid_model()
    assert validate_threat_model(model) is None
    error = validate_threat_model(attrs.evolve(model, version="1.1"))
    assert isinstance(error, UnsupportedVersion)
    twice = attrs.evolve(model, elements=(*model.elements, model.elements[0]))
    assert isinstance(validate_threat_model(twice), DuplicateId)
    dangling = attrs.evolve(model, data_flows=(*model.data_flows, DataFlow(id="f-new", source="browser", target="x")))
    error = validate_threat_model(dangling)
    assert isinstance(error, InvalidReference) and 'data_flows["f-new"].to: no element with id "x"' in error.message
    loop = (Group(id="g1", name="a", parent="g2"), Group(id="g2", name="b", parent="g1"))
    cyclic = attrs.evolve(model, groups=(*model.groups, *loop))
    assert isinstance(validate_threat_model(cyclic), CircularGroupNesting)
    untargeted = attrs.evolve(model, threats=(Threat(id="t", title="t", category="Spoofing", severity="low"),))
    assert isinstance(validate_threat_model(untargeted), InvalidReference)


@pytest.mark.parametrize(
    "bad",
    [
        {"elements": (Element(id="a", type="t", name=123),)},  # type: ignore[arg-type]
        {"elements": (Element(id="a", type="t", name="A", technologies=("x", 1)),)},  # type: ignore[arg-type]
        {"elements": (Element(id="a", type="t", name="A", position=Position(x=float("nan"), y=0)),)},
        {"elements": (Element(id="a", type="t", name="A", extra={"name": "shadow"}),)},
        {"elements": (Element(id="a", type="t", name="A", extra={"when": {1, 2}}),)},
        {"elements": (Element(id="", type="t", name="A"),)},
        {"elements": ("not an element",)},
        {"metadata": Metadata(extra={"k": float("inf")})},
        {"extra": {"elements": []}},
        {"threats": (Threat(id="t", title="t", category="c", severity="s", element="a", mitigation="m"),)},  # type: ignore[arg-type]
    ],
)
def test_validate_refuses_in_memory_shapes_that_would_not_round_trip(bad: dict[str, Any]) -> None:
    model = ThreatModel(elements=(Element(id="a", type="t", name="A"),))
    error = validate_threat_model(attrs.evolve(model, **bad))
    assert isinstance(error, InvalidShape), error


def test_validate_survives_hostile_values() -> None:
    loop: list[Any] = []
    loop.append(loop)
    model = ThreatModel()
    vars(model)["extra"] = {"loop": loop}  # past the sealed fields on purpose: validation must still cope
    assert isinstance(validate_threat_model(model), InvalidShape)
    assert isinstance(validate_threat_model("not a model"), InvalidShape)  # type: ignore[arg-type]


def test_errors_compare_by_class_and_message() -> None:
    assert InvalidShape("a\n b") == InvalidShape("a b")
    assert InvalidShape("x") != DuplicateId("x")
    assert Mitigation(status="mitigated", description="d") == Mitigation(status="mitigated", description="d")


def _objects(value: Any) -> list[Any]:
    """Every container and attrs instance reachable from ``value`` (strings and numbers are immutable)."""
    found: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if attrs.has(type(item)):
            found.append(item)
            stack.extend(getattr(item, field.name) for field in attrs.fields(type(item)))
        elif isinstance(item, dict):
            found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set):
            found.append(item)
            stack.extend(item)
    return found


_DICT_WRITES: tuple[Callable[[Any], object], ...] = (
    lambda d: d.__setitem__("k", 1),
    lambda d: d.__delitem__(next(iter(d), "k")),
    lambda d: d.update({"k": 1}),
    lambda d: d.setdefault("k", 1),
    lambda d: d.pop(next(iter(d), "k")),
    lambda d: d.popitem(),
    lambda d: d.clear(),
    lambda d: d.__ior__({"k": 1}),
)
_LIST_WRITES: tuple[Callable[[Any], object], ...] = (
    lambda items: items.__setitem__(0, 1),
    lambda items: items.__delitem__(0),
    lambda items: items.append(1),
    lambda items: items.extend([1]),
    lambda items: items.insert(0, 1),
    lambda items: items.pop(),
    lambda items: items.remove(1),
    lambda items: items.reverse(),
    lambda items: items.sort(),
    lambda items: items.clear(),
    lambda items: items.__iadd__([1]),
    lambda items: items.__imul__(2),
)


def _assert_refuses_every_write(item: Any) -> None:
    if attrs.has(type(item)):
        for field in attrs.fields(type(item)):
            with pytest.raises(attrs.exceptions.FrozenInstanceError):
                object.__setattr__(item, field.name, None)
            with pytest.raises(attrs.exceptions.FrozenInstanceError):
                object.__delattr__(item, field.name)
        return
    if type(item) is tuple:
        return
    assert type(item) in (FrozenDict, FrozenList), type(item)
    for write in _DICT_WRITES if type(item) is FrozenDict else _LIST_WRITES:
        with pytest.raises(TypeError, match="read-only"):
            write(item)


@given(model=threat_models())
@settings(max_examples=40, deadline=None)
def test_a_model_is_immutable_all_the_way_down(model: ThreatModel) -> None:
    before = dump_thf(model)
    for item in _objects(model):
        _assert_refuses_every_write(item)
    assert dump_thf(model) == before
    assert detached_copy(model) is model  # nothing to detach: a tool shares the snapshot


def test_a_frozen_extra_still_loads_dumps_and_compares_equal() -> None:
    model = load_thf(EXAMPLE)
    element = Element(id="a", type="t", name="A", extra={"k": [1, {"n": [2, "x"]}], "m": {}})
    assert element.extra == {"k": [1, {"n": [2, "x"]}], "m": {}}
    with_extra = attrs.evolve(model, elements=(*model.elements, element), extra={"top": [{"a": 1}]})
    again = load_thf(dump_thf(with_extra))
    assert again == with_extra and dump_thf(again) == dump_thf(with_extra)
    assert hash(again) == hash(with_extra)
    assert copy.deepcopy(with_extra) == with_extra and pickle.loads(pickle.dumps(with_extra)) == with_extra
    assert json.loads(json.dumps(element.extra)) == {"k": [1, {"n": [2, "x"]}], "m": {}}


def test_writing_into_the_document_is_refused_and_changes_nothing() -> None:
    model = load_thf(EXAMPLE)
    before = dump_thf(model)
    with pytest.raises(TypeError):
        model.extra["injected"] = True  # type: ignore[index]
    with pytest.raises(TypeError):
        model.metadata.extra["injected"] = True  # type: ignore[index]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        object.__setattr__(model.metadata, "title", "changed")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        object.__setattr__(model.elements[0], "name", "changed")
    assert dump_thf(model) == before
