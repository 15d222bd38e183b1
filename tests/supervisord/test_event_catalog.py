"""The typed event catalog (supervisord.shared.events): each type's data TypedDict
equals its published JSON Schema (``supervisord/shared/schemas/events/<Name>.json``),
and no product module spells an event type as a string.

A failure says exactly what to add: the schema file for a TypedDict that has
none (generated from it, to refine), the TypedDict and ``define`` for a schema
with no catalog entry, the constant to use for a string literal."""

from __future__ import annotations

import ast
import json
import re
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest

import store.types
from supervisord.shared import events, schemas
from supervisord.shared.events import CATALOG, HELD, PHASE_CHANGED, Event, EventType, define

ROOT = Path(__file__).resolve().parents[2]
EVENTS_DIR = ROOT / "supervisord" / "shared" / "schemas" / "events"

#: Phase reasons spelled like an event type (README "Phases and reasons"):
#: as a reason they are fine; only where an event type is meant they are not.
REASONS_NAMED_LIKE_EVENTS = frozenset({"Held", "Paused", "CancelFailed"})

#: The modules allowed to spell event types: the catalog, and the store's
#: own pins of the types it projects (the store cannot import supervisord).
SPELLERS = {ROOT / "supervisord" / "shared" / "events.py", ROOT / "store" / "types.py"}


def _const(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


# -- TypedDict <-> JSON Schema -----------------------------------------------------------

_PY_TO_JSON: dict[Any, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
    list: "array",
    tuple: "array",
    Sequence: "array",
    dict: "object",
    Mapping: "object",
}


def _members(annotation: Any) -> list[Any]:
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in _members(a)]
    return [annotation]


def _py_types(annotation: Any) -> tuple[set[str] | None, set[Any] | None]:
    """The JSON types an annotation allows (None: any) and, for Literal
    members, the values."""
    found: set[str] = set()
    values: set[Any] | None = None
    for member in _members(annotation):
        if member is Any:
            return None, None
        if get_origin(member) is Literal:
            values = (values or set()) | set(get_args(member))
            found |= {_PY_TO_JSON[type(v)] for v in get_args(member)}
            continue
        if is_typeddict(member):
            found.add("object")
            continue
        base = get_origin(member) or member
        if base not in _PY_TO_JSON:
            raise AssertionError(f"no JSON type for {member!r}")
        found.add(_PY_TO_JSON[base])
    return found, values


def _resolve(node: Mapping[str, Any], doc: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = doc
        for part in ref[2:].split("/"):
            target = target[part]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _schema_types(node: Mapping[str, Any]) -> tuple[set[str] | None, set[Any] | None]:
    if "type" in node:
        t = node["type"]
        return ({t} if isinstance(t, str) else set(t)), (set(node["enum"]) if "enum" in node else None)
    if "enum" in node:
        vals = set(node["enum"])
        return {_PY_TO_JSON[type(v)] for v in vals}, vals
    if "const" in node:
        return {_PY_TO_JSON[type(node["const"])]}, {node["const"]}
    return None, None


def differences(td: type, node: Mapping[str, Any], doc: Mapping[str, Any], where: str) -> Iterator[str]:
    """How TypedDict ``td`` and the object schema ``node`` disagree: keys,
    required keys, each key's JSON types (a Literal's values against an
    enum), nested TypedDicts against nested object schemas."""
    node = _resolve(node, doc)
    hints = get_type_hints(td)
    props = node.get("properties", {})
    if set(hints) != set(props):
        yield (
            f"{where}: keys differ: only in the TypedDict {sorted(set(hints) - set(props))}, "
            f"only in the schema {sorted(set(props) - set(hints))}"
        )
    required = set(getattr(td, "__required_keys__", set()))
    if required != set(node.get("required", [])):
        yield f"{where}: required keys differ: TypedDict {sorted(required)}, schema {sorted(node.get('required', []))}"
    for key in sorted(set(hints) & set(props)):
        sub = _resolve(props[key], doc)
        py, py_values = _py_types(hints[key])
        js, js_values = _schema_types(sub)
        if py is not None and js is not None and py != js:
            yield f"{where}.{key}: TypedDict says {sorted(py)}, schema says {sorted(js)}"
        elif (py is None) != (js is None):
            yield f"{where}.{key}: one side is typed, the other not (TypedDict {py}, schema {js})"
        if py_values is not None and py_values != js_values:
            yield f"{where}.{key}: Literal values {sorted(map(str, py_values))} != schema enum {js_values}"
        nested = [m for m in _members(hints[key]) if is_typeddict(m)]
        if nested and "properties" in sub:
            yield from differences(nested[0], sub, doc, f"{where}.{key}")


def schema_of(td: type) -> dict[str, Any]:
    """A draft schema file for ``td`` (to write and refine: descriptions,
    patterns, bounds)."""
    hints = get_type_hints(td)
    props: dict[str, Any] = {}
    for key, annotation in hints.items():
        py, values = _py_types(annotation)
        prop: dict[str, Any] = {}
        if values is not None:
            prop["enum"] = sorted(values, key=str)
        elif py is not None:
            prop["type"] = sorted(py)[0] if len(py) == 1 else sorted(py)
        props[key] = prop
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": (td.__doc__ or "").strip(),
        "type": "object",
        "required": sorted(getattr(td, "__required_keys__", set())),
        "properties": props,
        "additionalProperties": False,
    }


def typeddict_of(name: str, doc: Mapping[str, Any]) -> str:
    """The catalog entry to add to supervisord/shared/events.py for a schema with none."""
    names = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
    names |= {"array": "list[Any]", "object": "dict[str, Any]"}
    lines = [f"class {name}Data(TypedDict, total=False):", f'    """{doc.get("description", "")}"""', ""]
    required = set(doc.get("required", []))
    for key, prop in doc.get("properties", {}).items():
        js, _ = _schema_types(_resolve(prop, doc))
        ann = "Any" if js is None else " | ".join(names[t] for t in sorted(js))
        lines.append(f"    {key}: {'Required[' + ann + ']' if key in required else ann}")
    lines += ["", "", f'{_const(name)}: Final = define("{name}", {name}Data, writer="who appends it, when")']
    return "\n".join(lines)


def test_every_cataloged_type_has_a_schema_equal_to_its_typeddict() -> None:
    problems: list[str] = []
    for name, entry in CATALOG.items():
        path = EVENTS_DIR / f"{name}.json"
        if not path.exists():
            problems.append(
                f"{name} has no schema: add supervisord/shared/schemas/events/{name}.json, e.g.\n"
                + json.dumps(schema_of(entry.data_type), indent=2)
            )
            continue
        doc = json.loads(path.read_text())
        shapes = [entry.data_type, *entry.variants]
        branches = doc.get("oneOf", [doc])
        if len(branches) != len(shapes):
            problems.append(f"{name}: {len(shapes)} data shapes in the catalog, {len(branches)} in {path.name}")
            continue
        for td, branch in zip(shapes, branches, strict=True):
            problems.extend(differences(td, branch, doc, f"{name} ({td.__name__} vs {path.name})"))
    assert not problems, "\n\n".join(problems)


def test_every_schema_has_a_catalog_entry() -> None:
    missing = [p.stem for p in sorted(EVENTS_DIR.glob("*.json")) if p.stem not in CATALOG]
    assert not missing, "\n\n".join(
        f"{name} has a schema but no catalog entry: add to supervisord/shared/events.py\n\n"
        + typeddict_of(name, json.loads((EVENTS_DIR / f"{name}.json").read_text()))
        for name in missing
    )
    assert schemas.event_types() == sorted(CATALOG)


def test_the_store_pins_agree_with_the_catalog() -> None:
    pinned = {v for k, v in vars(store.types).items() if k.isupper() and isinstance(v, str) and v in CATALOG}
    assert set(store.types.PROJECTED_TYPES) <= pinned
    for name in pinned:
        assert CATALOG[name].projected == (name in store.types.PROJECTED_TYPES), name


def test_an_event_type_is_its_name_and_makes_typed_events() -> None:
    assert PHASE_CHANGED == "PhaseChanged" and hash(PHASE_CHANGED) == hash("PhaseChanged")
    data: events.PhaseChangedData = {"phase": "RUNNING", "reason": None}
    made = PHASE_CHANGED(data)
    assert isinstance(made, Event) and made.data == data and made.data is not data
    assert type(made.type) is str  # the stored column is a plain str
    assert json.dumps(made.data) == '{"phase": "RUNNING", "reason": null}'
    assert isinstance(HELD, EventType) and HELD.name == "Held" and HELD.writer
    with pytest.raises(ValueError, match="defined twice"):
        define("Held", events.HeldData, writer="again")


# -- no event type spelled as a string outside the catalog --------------------------------


def _is_type_expr(node: ast.AST) -> bool:
    """``x.type``, ``x["type"]`` or a name ``type``/``etype``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "type"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "type"
    return isinstance(node, ast.Name) and node.id in ("type", "etype")


def _literals(node: ast.AST) -> list[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _literals(e)]
    return []


def _event_type_literals(tree: ast.AST) -> set[int]:
    """ids of the string constants in ``tree`` used where an event type is
    meant: compared with an event's type, or the type argument of an
    append (``record``, ``NewEvent``, ``append_event``, ``define``)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_type_expr(s) for s in sides):
                found.update(id(c) for s in sides for c in _literals(s))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("record", "NewEvent", "append_event", "define", "record_daemon_event"):
                found.update(id(c) for c in _literals(node.args[0]))
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def spelled_event_types(source: str, rel: str) -> list[str]:
    """The places in ``source`` (the file ``rel``) that spell an event type
    as a string, or append an event not made through the catalog, each with
    the fix."""
    tree = ast.parse(source, rel)
    meant = _event_type_literals(tree)
    docs = _docstrings(tree)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "NewEvent":
            problems.append(
                f"{rel}:{node.lineno}: NewEvent(...) outside the catalog: make the event with its type's "
                "constant, e.g. PHASE_CHANGED({...}) (supervisord.shared.events)"
            )
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docs:
            continue
        name = node.value
        if name in CATALOG and (name not in REASONS_NAMED_LIKE_EVENTS or id(node) in meant):
            problems.append(
                f"{rel}:{node.lineno}: {name!r} spelled as a string: use supervisord.shared.events.{_const(name)}"
            )
        elif name not in CATALOG and id(node) in meant and re.fullmatch(r"[A-Z][a-z]+(?:[A-Z][a-z]+)+", name):
            problems.append(
                f"{rel}:{node.lineno}: event type {name!r} is not in the catalog: add to supervisord/shared/events.py a "
                f'`class {name}Data(TypedDict, total=False)` and `{_const(name)}: Final = define("{name}", '
                f'{name}Data, writer="...")`, and supervisord/shared/schemas/events/{name}.json, then use {_const(name)}(data)'
            )
    return problems


def test_no_event_type_is_spelled_outside_the_catalog() -> None:
    problems = []
    for folder in ("supervisord", "store"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path not in SPELLERS:
                problems.extend(spelled_event_types(path.read_text(), str(path.relative_to(ROOT))))
    assert not problems, "\n".join(problems)


def test_the_scan_finds_what_it_forbids() -> None:
    """The scanner itself: each forbidden form is found, the allowed ones are not."""
    source = (
        "await reporter.record(NewEvent('StagingStep', {}))\n"
        "if ev.type == 'Held':\n    pass\n"
        "ok = e['type'] in ('HoldReleased', 'Whatever')\n"
        "await reporter.record('WidgetPolished', {})\n"
        "HELD = 'Held'  # a phase reason\n"
        "reporter.phase('RUNNING', reason='Paused')\n"
        "x = PHASE_CHANGED({'phase': 'RUNNING'})\n"
    )
    found = spelled_event_types(source, "_scan_sample.py")
    text = "\n".join(found)
    assert "_scan_sample.py:1: NewEvent(...) outside the catalog" in text
    assert "_scan_sample.py:1: 'StagingStep' spelled as a string: use supervisord.shared.events.STAGING_STEP" in text
    assert "_scan_sample.py:2: 'Held' spelled as a string: use supervisord.shared.events.HELD" in text
    assert "_scan_sample.py:4: 'HoldReleased' spelled" in text
    assert "_scan_sample.py:5: event type 'WidgetPolished' is not in the catalog" in text
    assert "class WidgetPolishedData(TypedDict, total=False)" in text
    assert len(found) == 5, text
