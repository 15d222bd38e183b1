"""The cli layer: ``--config FILE`` or ``--config KEY.PATH=VALUE`` pairs.

Rules (docs/config.md):

* ``--config`` takes either one file path (then it must be the only
  ``--config``) or any number of ``KEY.PATH=VALUE`` pairs. An argument without
  ``=`` is a file path; an argument with ``=`` is a pair when the text before
  the first ``=`` is a valid key path, otherwise a file path (``./a=b``).
* A pair splits at its first ``=`` only: the value may contain ``=``.
* The key splits on ``.`` (quote a key holding dots:
  ``kubernetes.node_selector."example.com/gpu"=a100``). A numeric segment
  indexes an element of a list that already exists (in an earlier pair, or in
  the user, project or task layer below); anything else is an error. It never
  creates a mapping key ``"0"``. When a pair indexes an inherited list, the cli
  layer carries that whole list with the element changed (inside a pod spec
  this works for keyed and atomic lists; a union list cannot be edited by
  index). The daemon's own config is not visible to the client, so its lists
  cannot be indexed.
* The value is parsed as YAML (``600`` is an integer, ``[a, b]`` a list,
  ``{k: v}`` a mapping), except where the schema's type is ``string``: there
  the text is kept exactly as given (``1e5``, ``0600`` and ``yes`` stay
  strings). ``null`` (or ``~``) clears the key for every type; an empty value
  is an empty string for string keys and an error for others.
* Pairs apply in order; repeating a key, the last one wins (a later pair
  below an earlier scalar replaces the scalar with a mapping).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from supervisord.shared.config.keypath import KeyPath, format_path, parse_key
from supervisord.shared.config.layer import Layer
from supervisord.shared.config.merge import POD_SPEC_ATOMIC_LISTS, POD_SPEC_MERGE_KEYS, is_pod_spec_path
from supervisord.shared.config.schema import schema_at
from supervisord.shared.config.yamlload import load_yaml
from supervisord.shared.exceptions import ConfigError

__all__ = ["NULL_WORDS", "parse_cli_config", "parse_pair"]

#: Values that mean ``null`` (clear the key), whatever the key's type.
NULL_WORDS = frozenset({"null", "Null", "NULL", "~"})


def parse_pair(arg: str) -> tuple[KeyPath, Any]:
    """Split one ``KEY.PATH=VALUE`` argument into its key path and typed value
    (see the module doc). Raises ConfigError naming the argument's key when
    the ``=`` is missing, the key is not a valid key path, or the value is not
    valid YAML (or is empty) for a non-string key. Never echoes a value."""
    key, sep, text = arg.partition("=")
    if not sep:
        raise ConfigError(f"--config {key!r}: expected KEY.PATH=VALUE")
    path = parse_key(key, what=f"--config {key}")
    return path, _typed_value(path, text)


def _typed_value(path: KeyPath, text: str) -> Any:
    if text in NULL_WORDS:
        return None
    node = schema_at(path)
    types = node.get("type") if node else None
    if types == "string" or (isinstance(types, list) and "string" in types):
        return text
    if text.strip() == "":
        raise ConfigError(f"--config {format_path(path)}=: empty value; write null to clear the key")

    try:
        return load_yaml(text, source=f"--config {format_path(path)}=VALUE")
    except ConfigError as exc:
        raise ConfigError(str(exc)) from None


def parse_cli_config(
    args: Sequence[str],
    *,
    cwd: Path,
    lower: Callable[[], dict[str, Any]] | None = None,
    read_file: Callable[[Path], dict[str, Any]],
) -> Layer:
    """Build the ``cli`` layer from the ``--config`` arguments (in order).

    ``lower`` returns the merged user/project/task layers (over the defaults);
    it is called only when a pair indexes a list that the cli layer does not
    hold yet. ``read_file`` reads a config file (``sources.read_config_file``);
    a relative path is taken from ``cwd``, ``~`` is expanded.

    Returns ``Layer("cli", file, data)`` (``file`` is the config file, or None
    for pairs). Raises ConfigError with every bad argument.
    """
    files: list[Path] = []
    pairs: list[str] = []
    errors: list[str] = []
    for arg in args:
        try:
            kind = _classify(arg)
        except ConfigError as exc:
            errors.extend(exc.errors)
            continue
        if kind == "pair":
            pairs.append(arg)
        else:
            files.append(cwd / Path(arg).expanduser())  # an absolute path stays as it is
    if files and len(args) > 1:
        raise ConfigError(
            f"--config {files[0]}: a config file must be the only --config "
            f"(got {len(args)} --config arguments); use KEY.PATH=VALUE pairs to combine settings"
        )
    if files and not errors:
        path = files[0].absolute()
        if not path.is_file():
            raise ConfigError(
                f"--config {args[0]}: {path} does not exist"
                + ("" if "=" in args[0] else " (a KEY.PATH=VALUE pair needs '=')")
            )
        return Layer("cli", str(path), read_file(path))
    data: dict[str, Any] = {}
    cache: dict[str, dict[str, Any]] = {}

    def lower_view() -> dict[str, Any]:
        if "view" not in cache:
            cache["view"] = lower() if lower is not None else {}
        return cache["view"]

    for arg in pairs:
        try:
            key_path, value = parse_pair(arg)
            _set(data, key_path, value, lower_view)
        except ConfigError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigError.of(errors, "--config errors")
    return Layer("cli", None, data)


def _classify(arg: str) -> str:
    if "=" not in arg:
        return "file"
    try:
        parse_key(arg.partition("=")[0])
    except ConfigError:
        if Path(arg).expanduser().exists():
            return "file"
        raise
    return "pair"


def _lookup(doc: Any, path: KeyPath) -> Any:
    node = doc
    for seg in path:
        if isinstance(seg, int):
            if not isinstance(node, list) or seg >= len(node):
                return None
            node = node[seg]
        else:
            if not isinstance(node, dict):
                return None
            node = node.get(seg)
    return node


def _set(data: dict[str, Any], path: KeyPath, value: Any, lower_view: Callable[[], dict[str, Any]]) -> None:
    key = format_path(path)
    container: Any = data
    for i, seg in enumerate(path):
        last = i == len(path) - 1
        here = path[: i + 1]
        if isinstance(seg, int):
            assert isinstance(container, list)  # ensured by the step before
            if seg >= len(container):
                raise ConfigError(
                    f"--config {key}: index {seg} is out of range: {format_path(path[:i])} has "
                    f"{len(container)} item{'s' if len(container) != 1 else ''}"
                )
            if last:
                if value is None:
                    del container[seg]
                else:
                    container[seg] = value
                return
        elif last:
            container[seg] = value
            return
        child = container[seg] if isinstance(seg, int) else container.get(seg)
        nxt = path[i + 1]
        if isinstance(nxt, int):
            if not isinstance(child, list):
                if isinstance(child, dict):
                    raise ConfigError(
                        f"--config {key}: {nxt} indexes a list element, but {format_path(here)} is a mapping "
                        "(a number never names a mapping key)"
                    )
                inherited = _lookup(lower_view(), here)
                if not isinstance(inherited, list):
                    raise ConfigError(
                        f"--config {key}: {nxt} indexes a list element, but {format_path(here)} "
                        + (
                            "is not a list"
                            if inherited is not None
                            else "holds no list in the user, project or task config"
                        )
                        + " (a number never creates a mapping key)"
                    )
                _check_editable(here, key)
                child = copy.deepcopy(inherited)
                container[seg] = child
        elif not isinstance(child, dict):
            if isinstance(child, list):
                raise ConfigError(f"--config {key}: {format_path(here)} is a list; index it with a number")
            child = {}  # absent, null or an earlier scalar: the later pair wins
            container[seg] = child
        container = child


def _check_editable(path: KeyPath, key: str) -> None:
    """An inherited pod-spec union list cannot be edited by index: the cli
    layer's copy would be added to the list, not replace the item."""
    name = path[-1]
    if (
        is_pod_spec_path(path[:-1])
        and isinstance(name, str)
        and name not in POD_SPEC_MERGE_KEYS
        and name not in POD_SPEC_ATOMIC_LISTS
    ):
        raise ConfigError(
            f"--config {key}: {format_path(path)} is merged as a union inside a pod spec, so an inherited "
            "item cannot be changed by index; add the whole item instead "
            f"(--config '{format_path(path)}=[{{...}}]')"
        )
