"""Config sources: where each layer's file is, how it is read, and how the
client sends its layers to the daemon.

=========  ==========================================  ==========================
layer      default file                                override variable
=========  ==========================================  ==========================
daemon     ``$XDG_CONFIG_HOME/jobsup/daemon.yaml``     ``JOBSUP_DAEMON_CONFIG``
user       ``$XDG_CONFIG_HOME/jobsup/config.yaml``     ``JOBSUP_CONFIG``
project    ``./.jobsup.yaml`` (current directory)      ``JOBSUP_PROJECT_CONFIG``
task       the task YAML's ``config:`` field           —
cli        ``--config FILE`` or ``--config K.P=V``     —
=========  ==========================================  ==========================

``$XDG_CONFIG_HOME`` defaults to ``~/.config`` (XDG Base Directory spec; a
relative value is ignored, as the spec says). A missing default file is an
empty layer; an override variable that is set (even to an empty string) must
name an existing file, or the error names the variable. A file that is not
valid YAML, has duplicate or non-string keys, or whose top level is not a
mapping is an error naming the file and line (it is never read as empty); an
empty file is an empty layer. YAML dates are kept as strings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisord.shared.config.keypath import KeyPath, format_path
from supervisord.shared.config.layer import LAYER_NAMES, Layer
from supervisord.shared.exceptions import ConfigError

__all__ = [
    "ENV_DAEMON_CONFIG",
    "ENV_PROJECT_CONFIG",
    "ENV_USER_CONFIG",
    "config_file_path",
    "current_kube_context",
    "json_compatible_errors",
    "kubeconfig_files",
    "layers_from_wire",
    "layers_to_wire",
    "load_client_layers",
    "load_daemon_layer",
    "load_user_layer",
    "read_client_layers",
    "read_config_file",
]

ENV_DAEMON_CONFIG = "JOBSUP_DAEMON_CONFIG"
ENV_USER_CONFIG = "JOBSUP_CONFIG"
ENV_PROJECT_CONFIG = "JOBSUP_PROJECT_CONFIG"
PROJECT_CONFIG_NAME = ".jobsup.yaml"


def __getattr__(name: str) -> Any:
    """``ConfigLoader`` and ``load_yaml`` (:mod:`supervisord.shared.config.yamlload`),
    imported on first use: PyYAML, and the config schema (jsonschema) that
    ``--config`` parsing needs, load only when a file or ``--config`` is
    read, not for every ``jobsup submit``."""
    if name in ("ConfigLoader", "load_yaml"):
        from supervisord.shared.config import yamlload

        return getattr(yamlload, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def read_config_file(path: Path) -> dict[str, Any]:
    """Read one config file into a mapping (an empty file gives ``{}``).

    Raises ConfigError naming the file (and the line for YAML errors) when it
    cannot be read, is not valid YAML, or its top level is not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    from supervisord.shared.config.yamlload import load_yaml

    doc = load_yaml(text, source=str(path))
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: line 1: the top level must be a mapping of config keys, got a {_yaml_kind(doc)}")
    problems = json_compatible_errors(doc, ())
    if problems:
        raise ConfigError(f"{path}: {problems[0]}", [f"{path}: {p}" for p in problems])
    return doc


def _yaml_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _xdg_config_home(env: Mapping[str, str]) -> Path:
    configured = env.get("XDG_CONFIG_HOME", "")
    if configured and os.path.isabs(configured):
        return Path(configured)
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".config"


def config_file_path(
    layer: str, *, cwd: Path | None = None, env: Mapping[str, str] = os.environ
) -> tuple[Path, str | None]:
    """Where the ``daemon``, ``user`` or ``project`` layer's file is: returns
    ``(path, variable)`` where ``variable`` is the override variable when it is
    set (so the file must exist) and None for a default location."""
    variable = {"daemon": ENV_DAEMON_CONFIG, "user": ENV_USER_CONFIG, "project": ENV_PROJECT_CONFIG}[layer]
    if variable in env:
        raw = env[variable]
        if not raw.strip():
            raise ConfigError(f"{variable} is set but empty; point it at a config file or unset it")
        return Path(raw).expanduser().absolute(), variable
    if layer == "project":
        return (cwd or Path.cwd()).absolute() / PROJECT_CONFIG_NAME, None
    name = "daemon.yaml" if layer == "daemon" else "config.yaml"
    return _xdg_config_home(env) / "jobsup" / name, None


def _load_file_layer(name: str, *, cwd: Path | None, env: Mapping[str, str]) -> Layer:
    path, variable = config_file_path(name, cwd=cwd, env=env)
    if not path.is_file():
        if variable is not None:
            what = "does not exist" if not path.exists() else "is not a file"
            raise ConfigError(f"{variable}={env[variable]!r}: {path} {what}; fix the path or unset {variable}")
        if path.exists():
            raise ConfigError(f"{path}: the {name} config is not a file")
        return Layer(name, None, {})  # type: ignore[arg-type]
    return Layer(name, str(path), read_config_file(path))  # type: ignore[arg-type]


def load_user_layer(env: Mapping[str, str] = os.environ) -> Layer:
    """Read the user config (``JOBSUP_CONFIG`` or
    ``$XDG_CONFIG_HOME/jobsup/config.yaml``) as the daemon does for its
    ``hooks``. A missing default file gives an empty layer with
    ``file=None``. Raises ConfigError (see module doc)."""
    return _load_file_layer("user", cwd=None, env=env)


def load_daemon_layer(env: Mapping[str, str] = os.environ) -> Layer:
    """Read the daemon config (``JOBSUP_DAEMON_CONFIG`` or
    ``$XDG_CONFIG_HOME/jobsup/daemon.yaml``). A missing default file gives an
    empty layer with ``file=None``. Raises ConfigError (see module doc)."""
    return _load_file_layer("daemon", cwd=None, env=env)


def load_client_layers(
    *,
    task: Any | None,
    cli_config: Sequence[str],
    cwd: Path,
    env: Mapping[str, str] = os.environ,
) -> list[Layer]:
    """Read the layers a client sends with a submit, lowest priority first:
    user, project, task (``task.config``, file ``task.path``; skipped when
    ``task`` is None) and cli (``--config`` arguments; see
    :func:`supervisord.shared.config.dotlist.parse_cli_config`).

    ``task`` is a :class:`supervisord.shared.task.Task` (or any object with
    ``.config`` and ``.path``). Raises ConfigError with the errors of every
    layer (a broken user file does not hide a broken project file).
    """
    layers, errors = read_client_layers(task=task, cli_config=cli_config, cwd=cwd, env=env)
    if errors:
        raise ConfigError.of(errors)
    return layers


def read_client_layers(
    *,
    task: Any | None,
    cli_config: Sequence[str],
    cwd: Path,
    env: Mapping[str, str] = os.environ,
) -> tuple[list[Layer], list[str]]:
    """Like :func:`load_client_layers`, but return the layers that could be
    read together with the errors of the others (for ``jobsup config
    validate``, which reports everything it can find)."""
    errors: list[str] = []
    layers: list[Layer] = []
    for name in ("user", "project"):
        try:
            layers.append(_load_file_layer(name, cwd=cwd, env=env))
        except ConfigError as exc:
            errors.extend(exc.errors)
    if task is not None:
        data = dict(task.config or {})
        file = str(task.path) if getattr(task, "path", None) else None
        problems = json_compatible_errors(data, ())
        if problems:
            errors.extend(f"{file or 'task'} (task `config:`): {p}" for p in problems)
        else:
            layers.append(Layer("task", file, data))
    if cli_config:
        from supervisord.shared.config.dotlist import parse_cli_config

        lower: Callable[[], dict[str, Any]] = _lower_view(list(layers))
        try:
            layers.append(parse_cli_config(cli_config, cwd=cwd, lower=lower, read_file=read_config_file))
        except ConfigError as exc:
            errors.extend(exc.errors)
    return layers, errors


def _lower_view(layers: list[Layer]) -> Callable[[], dict[str, Any]]:
    def view() -> dict[str, Any]:
        # Imported here: effective imports sources (defaults live there).
        from supervisord.shared.config.effective import defaults
        from supervisord.shared.config.merge import merge_layers

        return merge_layers([Layer("default", None, defaults()), *layers]).data

    return view


def json_compatible_errors(value: Any, path: KeyPath) -> list[str]:
    """Problems that keep ``value`` from being a config document: mapping keys
    that are not strings, and values that are not JSON data (e.g. a YAML date
    read by another loader). One ``"<key path>: <reason>"`` line each."""
    errors: list[str] = []
    if isinstance(value, Mapping):
        for key, sub in value.items():
            if not isinstance(key, str):
                errors.append(f"{format_path(path)}: the key {key!r} is not a string; quote it")
                continue
            errors.extend(json_compatible_errors(sub, (*path, key)))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            errors.extend(json_compatible_errors(sub, (*path, i)))
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        errors.append(f"{format_path(path)}: a {type(value).__name__} is not config data; quote it to make a string")
    return errors


def layers_to_wire(layers: Sequence[Layer]) -> list[dict[str, Any]]:
    """The client's layers as JSON data for the submit request:
    ``[{"name": "user", "file": "/home/me/.config/jobsup/config.yaml", "data": {...}}, ...]``."""
    return [{"name": layer.name, "file": layer.file, "data": layer.data} for layer in layers]


def layers_from_wire(items: Any) -> list[Layer]:
    """Rebuild client layers from :func:`layers_to_wire` data (daemon side).

    Only the client layers (user, project, task, cli) are accepted, each at
    most once and in priority order. Raises ConfigError naming the item at
    fault otherwise.
    """
    if not isinstance(items, list):
        raise ConfigError("config layers: expected a list of {name, file, data} objects")
    layers: list[Layer] = []
    last = -1
    for i, item in enumerate(items):
        where = f"config layers[{i}]"
        if not isinstance(item, Mapping) or set(item) != {"name", "file", "data"}:
            raise ConfigError(f"{where}: expected an object with exactly name, file and data")
        name, file, data = item["name"], item["file"], item["data"]
        if name not in ("user", "project", "task", "cli"):
            raise ConfigError(f"{where}: {name!r} is not a client layer (user, project, task, cli)")
        rank = LAYER_NAMES.index(name)
        if rank <= last:
            raise ConfigError(f"{where}: the {name} layer is out of order or repeated")
        last = rank
        if file is not None and not isinstance(file, str):
            raise ConfigError(f"{where}: file must be a string or null")
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: data must be an object")
        problems = json_compatible_errors(data, ())
        if problems:
            raise ConfigError(f"{where}: {problems[0]}", problems)
        layers.append(Layer(name, file, data))
    return layers


def kubeconfig_files(env: Mapping[str, str] = os.environ) -> list[Path]:
    """The kubeconfig files kubectl would read: ``KUBECONFIG`` (an
    ``os.pathsep``-separated list, ``~`` expanded), else ``~/.kube/config``
    (``HOME`` of ``env``). Missing files included: the caller decides."""
    raw = env.get("KUBECONFIG", "")
    if raw.strip():
        return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]
    home = env.get("HOME")
    return [(Path(home) if home else Path.home()) / ".kube" / "config"]


def current_kube_context(env: Mapping[str, str] = os.environ) -> str | None:
    """The kubeconfig's ``current-context`` (files from
    :func:`kubeconfig_files`; the first file that sets it wins, as kubectl
    merges them; missing files are skipped). None when no kubeconfig sets
    one. Raises ConfigError naming a kubeconfig file that is not valid YAML
    (:func:`supervisord.shared.kubeconfig.current_context`)."""
    from supervisord.shared.kubeconfig import current_context  # PyYAML: only when asked

    return current_context(kubeconfig_files(env))
