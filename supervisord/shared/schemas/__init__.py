"""JSON Schemas (draft 2020-12) of every object jobsup prints with ``-o json``
and the MCP tools return: the contract scripts and agents read.

The schemas are JSON files shipped in this package (``<name>.json``; event
data schemas in ``events/<Type>.json``), except ``config``, which is the
config layer schema :data:`supervisord.shared.config.schema.CONFIG_SCHEMA` itself (one
source of truth for the keys). :func:`load` returns a schema as one
self-contained document: references to other files (``"run.json"``,
``"events/Submitted.json#/$defs/source"``) are bundled under ``$defs``, so the
result validates with no registry (the MCP client validates tool output
that way).

A file whose object has ``"extends": "<other>.json"`` (a jobsup keyword,
removed when loaded) gets that file's ``properties`` and ``required`` merged
in (``run-detail`` extends ``run``).

The ``event`` schema is assembled from ``event.json`` (the envelope) and one
file per event type: adding an event type means adding
``events/<Type>.json`` (the schema of its ``data``); an event of a type with
no file fails validation.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

import jsonschema
import jsonschema.validators

from supervisord.shared.exceptions import UsageError

__all__ = ["event_types", "load", "names", "schema_errors", "validate", "validator"]

_DRAFT = "https://json-schema.org/draft/2020-12/schema"
_ROOT = resources.files(__name__)


def _read(path: str) -> dict[str, Any]:
    """The JSON document at ``path`` (relative to this package)."""
    if path == "config.json":
        from supervisord.shared.config.schema import CONFIG_SCHEMA

        return {
            **copy.deepcopy(CONFIG_SCHEMA),
            "title": "jobsup config",
            "description": "`jobsup config show -o json`: the effective config (secret values redacted); "
            "also the schema of every config layer file.",
        }
    if path == "event.json":
        return _event_schema()
    node = _ROOT
    for part in path.split("/"):
        node = node.joinpath(part)
    doc: dict[str, Any] = json.loads(node.read_text(encoding="utf-8"))
    base = doc.pop("extends", None)
    if base:
        # A closed object extending another closed object: its properties
        # and required keys first (flat `additionalProperties: false`
        # validates several times faster than `$ref` + `unevaluatedProperties`).
        parent = _read(str(base))
        doc["properties"] = {**parent["properties"], **doc.get("properties", {})}
        doc["required"] = [*parent.get("required", []), *doc.get("required", [])]
    return doc


def event_types() -> list[str]:
    """The event types that have a data schema (``events/<Type>.json``), sorted."""
    folder = _ROOT.joinpath("events")
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def _event_schema() -> dict[str, Any]:
    """``event.json`` with ``type`` restricted to the known types and, for
    each, ``data`` checked against its ``events/<Type>.json``."""
    node = _ROOT.joinpath("event.json")
    doc: dict[str, Any] = json.loads(node.read_text(encoding="utf-8"))
    types = event_types()
    doc["properties"]["type"] = {**doc["properties"]["type"], "enum": types}
    doc["allOf"] = [
        {
            "if": {"properties": {"type": {"const": t}}, "required": ["type"]},
            "then": {"properties": {"data": {"$ref": f"events/{t}.json"}}},
        }
        for t in types
    ]
    return doc


def names() -> list[str]:
    """Every schema name :func:`load` accepts, sorted."""
    found = {p.name[: -len(".json")] for p in _ROOT.iterdir() if p.name.endswith(".json")}
    return sorted(found | {"config"})


def _def_key(path: str) -> str:
    return path.replace("/", ".").removesuffix(".json")


def _split_ref(ref: str) -> tuple[str, str]:
    file, _, pointer = ref.partition("#")
    return file, pointer


def _rewrite(node: Any, here: str | None, found: list[str]) -> Any:
    """A copy of ``node`` whose ``$ref`` values point into the bundle.

    ``here`` is the file ``node`` came from (None for the root document,
    whose own ``#...`` references stay as they are); every other file it
    references is appended to ``found``."""
    if isinstance(node, list):
        return [_rewrite(v, here, found) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            file, pointer = _split_ref(value)
            if file:
                # File references are relative to this package's folder.
                found.append(file)
                out[key] = f"#/$defs/{_def_key(file)}{pointer}"
            elif here is not None:
                out[key] = f"#/$defs/{_def_key(here)}{pointer}"
            else:
                out[key] = value
        else:
            out[key] = _rewrite(value, here, found)
    return out


@functools.cache
def _bundled(name: str) -> str:
    path = f"{name}.json"
    found: list[str] = []
    root = _rewrite(_read(path), None, found)
    root.setdefault("$schema", _DRAFT)
    defs: dict[str, Any] = dict(root.get("$defs") or {})
    done: set[str] = set()
    while found:
        target = found.pop()
        if target in done:
            continue
        done.add(target)
        sub = _rewrite(_read(target), target, found)
        sub.pop("$schema", None)
        sub.pop("$id", None)
        defs[_def_key(target)] = sub
    if defs:
        root["$defs"] = defs
    return json.dumps(root)


def load(name: str) -> dict[str, Any]:
    """The schema called ``name`` (see :func:`names`), self-contained.

    Raises UsageError naming ``name`` and the known names when there is no
    such schema."""
    if name not in names():
        raise UsageError(f"schema {name!r}: no such schema; use one of {', '.join(names())}")
    doc: dict[str, Any] = json.loads(_bundled(name))
    return doc


def _is_strict_int(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_int),
)


@functools.cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """A compiled draft 2020-12 validator of schema ``name`` (``true`` is
    not an integer). Raises UsageError for an unknown name."""
    schema = load(name)
    _Validator.check_schema(schema)
    v: jsonschema.protocols.Validator = _Validator(schema)
    return v


def schema_errors(name: str, instance: Any) -> list[str]:
    """Every way ``instance`` breaks schema ``name``, one line each
    (``<json path>: <message>``); empty when it conforms."""
    errors: Iterable[jsonschema.ValidationError] = validator(name).iter_errors(instance)
    return [f"{e.json_path}: {e.message}" for e in sorted(errors, key=lambda e: list(map(str, e.path)))]


def validate(name: str, instance: Any) -> None:
    """Raise ValueError listing every way ``instance`` breaks schema ``name``."""
    problems = schema_errors(name, instance)
    if problems:
        raise ValueError(f"not a valid {name}: " + "; ".join(problems[:10]))
