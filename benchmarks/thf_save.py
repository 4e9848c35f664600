"""Saving a large `.thf` document: full render (``dump_thf``) vs round-trip patch after a one-entity edit.

Run ``python -m benchmarks.thf_save``. Builds a document of 9,000 entities (~800 KB: elements, data
flows, threats, with a comment line every 100 entities), then times, best of ``--repeat``:

* ``load_thf``: the model only (today's loader);
* ``load_thf_file``: the model plus the layout a round-trip save needs (same bounded parser);
* ``dump_thf``: rendering the whole document (what every save cost before);
* ``render_one_edit``: ``ThfFile.render`` after renaming one element (patch: one line rewritten);
* ``save_one_edit``: ``save_thf`` for the same edit (patch, then an atomic write with fsync);
* ``render_unchanged``: ``ThfFile.render`` of the model as loaded (the original text, as is).

Times are process CPU seconds (the best of ``--repeat``; ``save_one_edit`` excludes the fsync wait).
The figures that matter: ``render_one_edit`` against ``dump_thf`` in the same run (target: far below
1.0), and ``load_thf_file`` against ``load_thf`` (the layout's cost at load).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from benchmarks._common import case_record, emit, print_table
from trioloop.threatmodel import DataFlow, Element, Metadata, Threat, ThreatModel, dump_thf, load_thf
from trioloop.threatmodel.thf_file import load_thf_file, save_thf


def build_text(entities: int = 9_000) -> str:
    n_elements = entities * 4 // 9
    n_flows = entities * 3 // 9
    n_threats = entities - n_elements - n_flows
    elements = tuple(
        Element(
            id=f"el-{i}",
            type="process" if i % 3 else "data_store",
            name=f"Service {i}",
            technologies=("Go",),
        )
        for i in range(n_elements)
    )
    flows = tuple(
        DataFlow(
            id=f"fl-{i}",
            source=f"el-{i % n_elements}",
            target=f"el-{(i * 7 + 1) % n_elements}",
            data=("order",),
            authenticated=bool(i % 2),
        )
        for i in range(n_flows)
    )
    threats = tuple(
        Threat(
            id=f"th-{i}",
            title=f"Tampered rows {i}",
            category="Tampering",
            severity="high",
            element=f"el-{i % n_elements}",
        )
        for i in range(n_threats)
    )
    model = ThreatModel(metadata=Metadata(title="Large"), elements=elements, data_flows=flows, threats=threats)
    lines = dump_thf(model).splitlines(keepends=True)
    out: list[str] = []
    count = 0
    for line in lines:
        if line.startswith("  - "):
            count += 1
            if count % 100 == 0:
                out.append(f"  # entities {count} and on\n")
        out.append(line)
    return "".join(out)


def best(run: Callable[[], Any], repeat: int) -> float:
    """Best process CPU time of ``repeat`` runs (the machine is shared: wall time would time the others)."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        run()
        times.append(time.process_time() - started)
    return min(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best is reported")
    parser.add_argument("--entities", type=int, default=9_000)
    args = parser.parse_args(argv)
    text = build_text(args.entities)
    size = len(text.encode("utf-8"))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "large.thf"
        path.write_text(text, encoding="utf-8")
        file = load_thf_file(path)
        model = file.model
        target = model.elements[len(model.elements) // 2]
        edited = attrs.evolve(
            model,
            elements=tuple(attrs.evolve(e, name="Renamed") if e is target else e for e in model.elements),
        )
        patched = file.render(edited)
        assert load_thf(patched) == edited
        changed = sum(1 for a, b in zip(text.splitlines(), patched.splitlines(), strict=True) if a != b)
        cases = {
            "load_thf": best(lambda: load_thf(path), args.repeat),
            "load_thf_file": best(lambda: load_thf_file(path), args.repeat),
            "dump_thf": best(lambda: dump_thf(edited), args.repeat),
            "render_one_edit": best(lambda: file.render(edited), args.repeat),
            "save_one_edit": best(lambda: save_thf(path, edited, file), args.repeat),
            "render_unchanged": best(lambda: file.render(model), args.repeat),
        }
    entities = sum(len(model.section(name)) for name in ("elements", "data_flows", "threats"))
    for name, seconds in cases.items():
        emit(case_record("thf_save", name, seconds=round(seconds, 4), entities=entities, bytes=size))
    ratio = cases["render_one_edit"] / cases["dump_thf"]
    load_ratio = cases["load_thf_file"] / cases["load_thf"]
    emit(case_record("thf_save", "ratios", edit_vs_full_render=round(ratio, 4), load_file_vs_load=round(load_ratio, 3)))
    print()
    print(f"document: {entities} entities, {size} bytes; the one-entity edit changed {changed} line(s)")
    print_table(["case", "cpu seconds"], [(name, f"{seconds:.4f}") for name, seconds in cases.items()])
    print(f"render after a one-entity edit vs full render: {ratio:.4f}x; load with layout vs load: {load_ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
