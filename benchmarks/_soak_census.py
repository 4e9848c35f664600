"""Where the garbage collector's work comes from: the objects it tracks, counted by type and per live session.

A collection walks every tracked object of the generations it collects, so a full (generation-2) collection costs
in proportion to everything the process holds that ``gc.freeze()`` did not move out of its generations. `census`
(the soak's ``--census``) counts them, once the load is warm: by type overall (divided by the sessions alive in
the process, the figure an app multiplies by its own count of sessions), and, for the live `Session` objects
themselves, what each holds on its own, by the attribute it holds it through, and by type. An object two sessions
reach is shared (the provider, a store, the tools) and counted apart; the walk does not go into modules, classes,
functions or Trio's tasks and nurseries (a session's tasks are counted in the overall figure, not under it).
"""

from __future__ import annotations

import collections
import gc
import json
import sys
import types
from collections import Counter
from typing import Any, Final

import trio

#: Per-session breakdowns printed: the sessions looked at (the walk is slow), the types and holders kept.
SESSIONS_WALKED: Final = 12
TOP: Final = 25
#: The packages whose objects the garbage census shows a reference cycle of.
CYCLE_PACKAGES: Final = ("trioloop.", "httpx.", "httpcore.", "h11.", "benchmarks.")


def type_name(obj: object) -> str:
    kind = type(obj)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _package(name: str) -> str:
    return name.split(".", 1)[0] if "." in name else "builtins"


_OPAQUE: Final = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType)


def _stop(obj: object) -> bool:
    if isinstance(obj, _OPAQUE):
        return True
    module = type(obj).__module__ or ""
    return module.startswith(("trio.", "trio_", "_trio")) or module == "trio"


def _holdings(root: object, shared: set[int]) -> dict[int, tuple[str, object]]:
    """Every tracked object reachable from ``root`` (not through ``shared`` or an opaque object): id -> (the
    attribute of ``root`` it is nearest to, the object). Breadth first, so each is put under its shortest path."""
    attributes = dict(getattr(root, "__dict__", {}))
    for kind in type(root).__mro__:
        for name in getattr(kind, "__slots__", ()):
            if hasattr(root, name):
                attributes[name] = getattr(root, name)
    seen: dict[int, tuple[str, object]] = {id(root): ("(itself)", root)}
    queue = collections.deque(attributes.items())
    while queue:
        via, obj = queue.popleft()
        key = id(obj)
        if key in seen or key in shared or not gc.is_tracked(obj) or _stop(obj):
            continue
        seen[key] = (via, obj)
        queue.extend((via, child) for child in gc.get_referents(obj))
    return seen


def census(sessions: int, shared_roots: list[object]) -> dict[str, Any]:
    """The tracked objects now (after a full collection), overall and per session (see the module docstring)."""
    from trioloop import Session

    gc.collect()
    objects = gc.get_objects()
    by_type = Counter(type_name(obj) for obj in objects)
    live = [obj for obj in objects if isinstance(obj, Session)]
    del objects
    shared: set[int] = {id(obj) for obj in shared_roots}
    walked = live[:SESSIONS_WALKED]
    reach = [_holdings(session, shared) for session in walked]
    reached_by = Counter(key for held in reach for key in held)
    holders: Counter[str] = Counter()
    held_types: Counter[str] = Counter()
    sizes = []
    for held in reach:
        own = {key: value for key, value in held.items() if reached_by[key] == 1}
        sizes.append(len(own))
        for via, obj in own.values():
            holders[via] += 1
            held_types[type_name(obj)] += 1
    per = max(len(walked), 1)
    divisor = max(sessions, 1)
    by_package = Counter[str]()
    for name, count in by_type.items():
        by_package[_package(name)] += count
    return {
        "tracked": sum(by_type.values()),
        "frozen": gc.get_freeze_count(),
        "sessions_alive": len(live),
        "sessions_divided_by": divisor,
        "tracked_per_session": round(sum(by_type.values()) / divisor, 1),
        "by_package_per_session": {k: round(v / divisor, 1) for k, v in by_package.most_common(12)},
        "by_type_per_session": {k: round(v / divisor, 1) for k, v in by_type.most_common(TOP)},
        "session_walk": {
            "sessions": len(walked),
            "own_objects_per_session": round(sum(sizes) / per, 1),
            "min_max": [min(sizes, default=0), max(sizes, default=0)],
            "by_attribute": {k: round(v / per, 1) for k, v in holders.most_common(TOP)},
            "by_type": {k: round(v / per, 1) for k, v in held_types.most_common(TOP)},
        },
    }


async def garbage_census(seconds: float, turns: Any) -> dict[str, Any]:
    """What dies in reference cycles (only the collector frees it): every collection's garbage for ``seconds``
    kept (``gc.DEBUG_SAVEALL``), counted by type and by the generation that found it, per turn started meanwhile
    (``turns()``: the count so far). What generation 2 finds is what makes its pauses long."""
    found: list[Counter[str]] = [Counter(), Counter(), Counter(), Counter()]  # by generation; the last: left over
    collections = [0, 0, 0, 0]
    final = False

    cycles: dict[str, str] = {}

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            generation = 3 if final else info.get("generation", 2)
            collections[generation] += 1
            found[generation].update(type_name(obj) for obj in gc.garbage)
            if final:  # one cycle per type of the library and its HTTP client, as an example of each
                within = {id(obj): obj for obj in gc.garbage}
                for obj in gc.garbage:
                    name = type_name(obj)
                    if name.startswith(CYCLE_PACKAGES) and name not in cycles and len(cycles) < 60:
                        cycle = cycle_of(obj, within)
                        if cycle is not None:
                            cycles[name] = cycle
            gc.garbage.clear()

    gc.collect()
    gc.garbage.clear()
    first = turns()
    gc.callbacks.append(count)
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await trio.sleep(seconds)
        final = True
        gc.collect()  # what the window left in cycles, in every generation: generation 2's share of it above all
    finally:
        gc.set_debug(0)
        gc.callbacks.remove(count)
        gc.garbage.clear()
    ran = max(turns() - first, 1)
    every = sum(found, Counter())
    return {
        "seconds": seconds,
        "turns": ran,
        "objects_per_turn": round(sum(every.values()) / ran, 1),
        "collections_by_generation_then_left_over": collections,
        "per_turn_by_generation_then_left_over": [round(sum(c.values()) / ran, 1) for c in found],
        "by_type_per_turn": {k: round(v / ran, 1) for k, v in every.most_common(40)},
        "generation_2_by_type_per_turn": {k: round(v / ran, 1) for k, v in found[2].most_common(TOP)},
        "left_over_by_type_per_turn": {k: round(v / ran, 1) for k, v in found[3].most_common(TOP)},
        "a_cycle_of_each": cycles,
    }


def left_behind() -> dict[str, Any]:
    """The tracked objects not frozen once the load is over and every session retired (after a full
    collection): what the first turns made and everything keeps (caches, pools, lazily imported modules), which
    a ``gc.freeze()`` after a warm-up would have taken out of every collection's walk, and any leak."""
    gc.collect()
    kept = Counter(type_name(obj) for obj in gc.get_objects())
    return {"objects": sum(kept.values()), "by_type": dict(kept.most_common(TOP))}


async def census_later(
    after_s: float, sessions: int, shared_roots: list[object], turns: Any, out: dict[str, Any]
) -> None:
    """A task: at half ``after_s``, note every tracked object; at ``after_s``, `census` and how many of those are
    still there (made by the warm-up and long-lived: what a second ``gc.freeze()`` would take out of the
    collector's walk), then `garbage_census` for 3/4 of ``after_s``; into ``out`` and stderr."""
    await trio.sleep(after_s / 2)
    noted = {id(obj): type(obj) for obj in gc.get_objects()}
    await trio.sleep(after_s / 2)
    out.update(census(sessions, shared_roots))
    kept = Counter(type_name(obj) for obj in gc.get_objects() if noted.get(id(obj)) is type(obj))
    del noted
    out["kept_since_half_way"] = {
        "objects": sum(kept.values()),
        "by_type": dict(kept.most_common(TOP)),
    }
    out["cyclic_garbage"] = await garbage_census(after_s * 0.75, turns)
    print(json.dumps({"census": out}, indent=1), file=sys.stderr, flush=True)


def _edge(parent: object, child: object) -> str:
    """How ``parent`` refers to ``child``: an attribute's name, a key, an index, or the child's type."""
    if isinstance(parent, dict):
        for key, value in parent.items():
            if value is child:
                return f"[{key!r}]"[:40]
            if key is child:
                return "(key)"
    if isinstance(parent, (list, tuple)):
        for index, value in enumerate(parent):
            if value is child:
                return f"[{index}]"
    if isinstance(parent, types.FrameType):
        for name, value in parent.f_locals.items():
            if value is child:
                return f".f_locals[{name!r}]"
        return f".{type(child).__name__}"
    for kind in type(parent).__mro__:
        for name in getattr(kind, "__slots__", ()):
            if getattr(parent, name, None) is child:
                return f".{name}"
    if getattr(parent, "__dict__", None) is child:
        return ".__dict__"
    for name in ("__self__", "__func__", "cr_frame", "gi_frame", "ag_frame", "f_back", "__traceback__", "tb_frame"):
        if getattr(parent, name, None) is child:
            return f".{name}"
    for name in dir(type(parent)):
        if isinstance(getattr(type(parent), name, None), types.MemberDescriptorType):
            try:
                if getattr(parent, name) is child:
                    return f".{name}"
            except AttributeError:
                continue
    return f"->{type(child).__name__}"


def cycle_of(start: object, within: dict[int, object], longest: int = 14) -> str | None:
    """A shortest reference cycle from ``start`` back to itself through objects of ``within`` (id -> object):
    the path of types and references, or None."""
    parents: dict[int, tuple[int, object]] = {}
    queue = collections.deque([start])
    depth = {id(start): 0}
    while queue:
        obj = queue.popleft()
        if depth[id(obj)] >= longest:
            continue
        for child in gc.get_referents(obj):
            if child is start:
                path = [(obj, child)]
                while id(path[0][0]) != id(start):
                    parent = parents[id(path[0][0])][1]
                    path.insert(0, (parent, path[0][0]))
                return type_name(start) + "".join(f"{_edge(a, b)} {type_name(b)} " for a, b in path).rstrip()
            key = id(child)
            if key in within and key not in depth:
                depth[key] = depth[id(obj)] + 1
                parents[key] = (id(obj), obj)
                queue.append(child)
    return None
