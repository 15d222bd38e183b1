"""The effective config of a run: defaults, the daemon layer and the client
layers merged, validated, and resolved for one Kubernetes context.

Order of work in :func:`effective_config` (each stage reports every error it
finds before the next is tried):

1. Client layers lose their daemon-only keys (``daemon``, ``allowed_backends``,
   ``kubernetes.allowed_contexts``), each with a warning; the task layer may
   only set :data:`TASK_KEYS` (anything else is an error).
2. Every layer is validated on its own (schema + sandbox checks); errors name
   the layer's file and the key path.
3. Per-context settings are folded in, layer by layer:
   ``kubernetes.context_configs.<context>.<key>`` overrides ``kubernetes.<key>``
   of the *same* layer. Precedence stays layer-first: a task's plain
   ``kubernetes.<key>`` beats a daemon's context-specific value.
4. The layers are merged (:mod:`supervisord.shared.config.merge`), lowest first:
   default, daemon, user, project, task, cli. Keys cleared with ``null`` fall
   back to their defaults.
5. ``kubernetes.pod_ready_timeout_s``: when no layer sets it,
   ``JOBSUP_K8S_POD_READY_TIMEOUT_S`` is read (else 90).
6. The merged result is validated again (e.g. a PVC mount from one layer and a
   Secret mount from another at the same path).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from supervisord.shared.config.keypath import KeyPath, format_path
from supervisord.shared.config.layer import Layer, Origin, describe_origin
from supervisord.shared.config.merge import MergeResult, leaf_paths, merge, merge_layers
from supervisord.shared.config.sandbox import ENV_POD_READY_TIMEOUT, pod_ready_timeout_from_env
from supervisord.shared.config.schema import CONFIG_SCHEMA, validate_document
from supervisord.shared.exceptions import ConfigError

__all__ = [
    "DAEMON_ONLY_KEYS",
    "TASK_KEYS",
    "EffectiveConfig",
    "check_allowed",
    "defaults",
    "effective_config",
    "layer_errors",
    "validate_daemon_config",
]

#: Keys taken from the daemon config only; a client layer's value is ignored
#: (with a warning).
DAEMON_ONLY_KEYS: tuple[KeyPath, ...] = (
    ("daemon",),
    ("allowed_backends",),
    ("kubernetes", "allowed_contexts"),
    ("scheduler",),
    ("ui",),
    ("retention",),
    ("local", "usage_interval_s"),
)

#: The keys (and everything below them) a task YAML's ``config:`` may set.
TASK_KEYS: tuple[KeyPath, ...] = (
    ("kubernetes", "pod_config"),
    ("kubernetes", "custom_metadata"),
    ("kubernetes", "pod_ready_timeout_s"),
    ("kubernetes", "node_selector"),
    ("kubernetes", "tolerations"),
    ("slurm", "partition"),
    ("slurm", "account"),
    ("slurm", "qos"),
    ("slurm", "sbatch_args"),
    ("env",),
    ("local",),
)


def defaults() -> dict[str, Any]:
    """The built-in defaults, the lowest layer (a new dict on every call).

    ``project`` has no default here (the submitter fills in the git top-level
    folder name); ``kubernetes.context`` unset means the kubeconfig's current
    context; ``kubernetes.runtime_class``, ``kubernetes.allowed_contexts`` and
    ``daemon.max_running`` unset mean none, any context, no cap.
    """
    return {
        "backend": "local",
        "env": {},
        "local": {"kill_grace_s": 10, "shell": "bash"},
        "kubernetes": {
            "namespace": "default",
            "manifest": ".jobsup/k8s.yaml",
            "pod_config": {},
            "custom_metadata": {"labels": {}, "annotations": {}},
            "pod_ready_timeout_s": 90,
            "tolerations": [],
            "node_selector": {},
            "pvc_mounts": [],
            "secret_mounts": [],
        },
        "slurm": {"remote_dir": "~/.jobsup", "sbatch_args": []},
        "allowed_backends": ["local", "kubernetes", "slurm"],
        "daemon": {"synchronous": "FULL", "log_level": "info"},
    }


@dataclasses.dataclass(frozen=True)
class EffectiveConfig:
    """The merged config a run uses.

    ``data``: the merged document (secrets included: pass it through
    :func:`~supervisord.shared.secret.redact` before recording or printing).
    ``origins``: for every leaf, keyed by its written key path
    (``"kubernetes.tolerations[0].key"``), the ``(layer, file)`` it came from;
    ``("env", "JOBSUP_K8S_POD_READY_TIMEOUT_S")`` for the variable and
    ``("kubeconfig", None)`` for a context taken from the kubeconfig.
    ``warnings``: one line per ignored daemon-only key. ``context``: the
    Kubernetes context whose ``context_configs`` were applied (None: none known).
    """

    data: dict[str, Any]
    origins: dict[str, Origin]
    warnings: list[str]
    context: str | None = None


#: The layers whose ``hooks`` key holds hooks (read by supervisord.daemon.hooks,
#: never merged into a run's config); in any other layer it is an error.
HOOK_LAYERS: tuple[str, ...] = ("daemon", "user")


def _hooks_error(layer: Layer) -> list[str]:
    """The error for ``hooks`` in a layer that may not add hooks, naming
    its file (a cloned repository must not run commands on this machine)."""
    if "hooks" not in layer.data or layer.name in HOOK_LAYERS:
        return []
    kind = "option" if layer.name == "cli" else "file"
    return [
        (
            f"{_where(layer)}: hooks: hooks come only from the daemon config and the user config; a {layer.name} "
            f"{kind} may not add them (a cloned repository must not run commands on this machine)"
        )
    ]


def _without_hooks(layer: Layer) -> Layer:
    """``layer`` without its ``hooks`` key (validated by supervisord.daemon.hooks)."""
    if "hooks" not in layer.data:
        return layer
    return Layer(layer.name, layer.file, {k: v for k, v in layer.data.items() if k != "hooks"})


def layer_errors(layer: Layer) -> list[str]:
    """Validate one layer on its own (schema and sandbox checks; a ``null``
    is always allowed, it clears a lower layer's value). Returns lines
    ``"<file> (<layer> config): <key path>: <reason>"``. ``hooks`` is left
    to :mod:`supervisord.shared.hooksconfig` in the daemon and user layers and is
    an error in any other."""
    document = _without_nulls(_without_hooks(layer).data)
    where = _where(layer)
    return _hooks_error(layer) + [f"{where}: {e}" for e in validate_document(document)]


def validate_daemon_config(layer: Layer, env: Mapping[str, str] = os.environ) -> None:
    """Check the daemon config at daemon start (fail fast). Raises ConfigError
    with every error (key path, bad value, reason), also those that show only
    once merged over the defaults, and a bad ``JOBSUP_K8S_POD_READY_TIMEOUT_S``
    in ``env`` when the daemon config does not set the key."""
    errors = layer_errors(layer)
    if not errors:
        try:
            effective_config(layer, (), env=env)
        except ConfigError as exc:
            errors = exc.errors
    if errors:
        raise ConfigError.of(errors, "daemon config errors")


def effective_config(
    daemon: Layer,
    client: Sequence[Layer],
    *,
    context: str | None = None,
    env: Mapping[str, str] = os.environ,
) -> EffectiveConfig:
    """Merge defaults, ``daemon`` and ``client`` layers (user, project, task,
    cli; lowest first) into the config a submit uses; see the module doc.

    ``context`` is the Kubernetes context to use when the config leaves
    ``kubernetes.context`` unset (normally the kubeconfig's current context);
    ``context_configs`` of the resulting context are applied. ``env`` supplies
    ``JOBSUP_K8S_POD_READY_TIMEOUT_S``.

    Raises ConfigError whose ``errors`` list every problem of the failing
    stage: unknown keys, wrong types, bad values (key path and layer file),
    task keys outside :data:`TASK_KEYS`, kind conflicts between layers, a bad
    environment variable.
    """
    warnings: list[str] = []
    errors: list[str] = []
    layers: list[Layer] = [_without_hooks(daemon)]
    for layer in client:
        if layer.name in ("default", "daemon"):
            raise ConfigError(f"the {layer.name} layer cannot be a client layer")
        errors.extend(_hooks_error(layer))
        data, ignored = _drop_daemon_only(_without_hooks(layer).data)
        warnings.extend(
            f"{format_path(path)} is a daemon-only key: the value from {layer.describe()} is ignored "
            "(set it in the daemon config)"
            for path in ignored
        )
        if layer.name == "task":
            errors.extend(_task_key_errors(layer))
        layers.append(Layer(layer.name, layer.file, data))
    for layer in layers:
        errors.extend(layer_errors(layer))
    if errors:
        raise ConfigError.of(errors)

    resolved = _configured_context(layers) or context
    folded: list[Layer] = []
    for layer in layers:
        try:
            folded.append(_fold_context(layer, resolved))
        except ConfigError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigError.of(errors)

    base = merge_layers([Layer("default", None, defaults())])
    try:
        daemon_view = merge_layers(folded[:1], base=base)
        merged = merge_layers(folded, base=base)
    except ConfigError as exc:
        raise ConfigError.of(exc.errors) from None
    data, origins = merged.data, merged.origins
    _fill_defaults(data, defaults(), (), origins)
    _impose_daemon_only(data, origins, daemon_view)

    timeout_path: KeyPath = ("kubernetes", "pod_ready_timeout_s")
    if origins.get(timeout_path, ("default", None))[0] == "default":
        seconds = pod_ready_timeout_from_env(env)  # raises ConfigError naming the variable
        if seconds is not None:
            data["kubernetes"]["pod_ready_timeout_s"] = seconds
            origins[timeout_path] = ("env", ENV_POD_READY_TIMEOUT)

    if resolved is not None and isinstance(data.get("kubernetes"), dict):
        data["kubernetes"].pop("context_configs", None)
        for key in [k for k in origins if k[:2] == ("kubernetes", "context_configs")]:
            del origins[key]
        if data["kubernetes"].get("context") is None:
            data["kubernetes"]["context"] = resolved
            origins[("kubernetes", "context")] = ("kubeconfig", None)

    final_errors = [f"merged config: {e}" + _blame(e, origins) for e in validate_document(data)]
    if final_errors:
        raise ConfigError.of(final_errors)
    return EffectiveConfig(
        data=_ordered(data, CONFIG_SCHEMA),
        origins={
            format_path(path): origin for path, origin in sorted(origins.items(), key=lambda kv: format_path(kv[0]))
        },
        warnings=warnings,
        context=resolved,
    )


def check_allowed(eff: EffectiveConfig, backend: str, context: str | None = None) -> None:
    """Refuse a submit the daemon config does not allow: ``backend`` not in
    ``allowed_backends``, or (for ``kubernetes``) a context not in
    ``kubernetes.allowed_contexts`` when that list is set. ``context`` is the
    run's context (default: ``eff.context``); an unknown context is refused
    while ``allowed_contexts`` is set. Raises ConfigError."""
    allowed = eff.data.get("allowed_backends", [])
    if backend not in allowed:
        raise ConfigError(
            f"backend {backend!r} is not allowed: allowed_backends is [{', '.join(map(str, allowed))}]"
            f"{_from(eff, 'allowed_backends')}"
        )
    if backend != "kubernetes":
        return
    kubernetes = eff.data.get("kubernetes") or {}
    contexts = kubernetes.get("allowed_contexts")
    if contexts is None:
        return
    ctx = context if context is not None else eff.context
    if ctx is None:
        raise ConfigError(
            "the Kubernetes context is unknown (no kubernetes.context and no kubeconfig current-context), "
            f"and kubernetes.allowed_contexts restricts contexts to [{', '.join(contexts)}]"
        )
    if ctx not in contexts:
        raise ConfigError(
            f"Kubernetes context {ctx!r} is not allowed: kubernetes.allowed_contexts is "
            f"[{', '.join(contexts)}]{_from(eff, 'kubernetes.allowed_contexts')}"
        )


# --------------------------------------------------------------------------
# internals


def _from(eff: EffectiveConfig, prefix: str) -> str:
    for key, origin in eff.origins.items():
        if key == prefix or key.startswith((prefix + "[", prefix + ".")):
            return f" (from {describe_origin(origin)})"
    return ""


def _where(layer: Layer) -> str:
    if layer.name == "task":
        return f"{layer.file} (task `config:`)" if layer.file else "task `config:`"
    if layer.name == "cli":
        return f"{layer.file} (--config)" if layer.file else "--config"
    if layer.file:
        return f"{layer.file} ({layer.name} config)"
    return f"{layer.name} config"


def _blame(error: str, origins: Mapping[KeyPath, Origin]) -> str:
    """For a merged-config error, name the layers that set the keys it is
    about: the key at fault and any other key path the message mentions."""
    key = error.split(": ", 1)[0]
    found: list[str] = []
    for path, origin in origins.items():
        written = format_path(path)
        mentioned = written.startswith(key) or re.search(rf"(?<![\w.]){re.escape(written)}(?![\w.\[])", error)
        if mentioned and describe_origin(origin) not in found:
            found.append(describe_origin(origin))
    return f" (set by {', '.join(sorted(found))})" if found else ""


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _get(data: Mapping[str, Any], path: KeyPath) -> tuple[bool, Any]:
    node: Any = data
    for seg in path:
        if not isinstance(node, Mapping) or seg not in node:
            return False, None
        node = node[seg]
    return True, node


def _drop_daemon_only(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[KeyPath]]:
    out = copy.deepcopy(dict(data))
    ignored: list[KeyPath] = []
    for path in DAEMON_ONLY_KEYS:
        present, value = _get(out, path)
        if not present:
            continue
        parent = out
        for seg in path[:-1]:
            parent = parent[str(seg)]
        del parent[str(path[-1])]
        if value is not None:
            ignored.extend(_key_leaves(value, path))
    return out, ignored


def _key_leaves(value: Any, path: KeyPath) -> list[KeyPath]:
    """The keys set below ``path`` (mappings are descended, lists are not)."""
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() if v is not None for leaf in _key_leaves(v, (*path, k))]
    return [path]


def _task_key_errors(layer: Layer) -> list[str]:
    errors: list[str] = []
    allowed = ", ".join(format_path(p) for p in TASK_KEYS)
    where = _where(layer)
    for key, value in layer.data.items():
        if (key,) in TASK_KEYS or key == "hooks":  # hooks: see _hooks_error
            continue
        if key in ("kubernetes", "slurm") and isinstance(value, Mapping):
            errors.extend(
                f"{where}: {key}.{sub}: a task may not set this key (allowed in a task: {allowed})"
                for sub in value
                if (key, sub) not in TASK_KEYS
            )
            continue
        if key in ("kubernetes", "slurm"):
            errors.append(
                f"{where}: {key}: a task may set only some keys below it, not the whole mapping (allowed in a task: {allowed})"
            )
            continue
        errors.append(f"{where}: {format_path((key,))}: a task may not set this key (allowed in a task: {allowed})")
    return errors


def _configured_context(layers: Sequence[Layer]) -> str | None:
    ctx: str | None = None
    for layer in layers:
        kubernetes = layer.data.get("kubernetes")
        if isinstance(kubernetes, Mapping) and "context" in kubernetes:
            value = kubernetes["context"]
            ctx = value if isinstance(value, str) else None
    return ctx


def _fold_context(layer: Layer, context: str | None) -> Layer:
    kubernetes = layer.data.get("kubernetes")
    if context is None or not isinstance(kubernetes, Mapping) or "context_configs" not in kubernetes:
        return layer
    plain = {k: v for k, v in kubernetes.items() if k != "context_configs"}
    per_context = (kubernetes.get("context_configs") or {}).get(context)
    if per_context:
        desc = layer.describe()
        folded = merge(
            plain,
            per_context,
            path=("kubernetes",),
            base_layer=desc,
            patch_layer=f"{desc} (kubernetes.context_configs.{format_path((context,))})",
        )
        _restore_nulls(folded, per_context)
    else:
        folded = copy.deepcopy(plain)
    return Layer(layer.name, layer.file, {**copy.deepcopy(layer.data), "kubernetes": folded})


def _restore_nulls(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Keep a per-context ``null`` in the folded layer, so that it still
    clears the value of a lower layer."""
    for key, value in patch.items():
        if value is None:
            target[key] = None
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _restore_nulls(target[key], value)


def _ordered(value: Any, schema: Any) -> Any:
    """``value`` with mapping keys in the schema's order (unknown keys after,
    as they were), so that printed configs read the same every time."""
    if not isinstance(value, dict) or not isinstance(schema, Mapping):
        return value
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keys = [k for k in props if k in value] + [k for k in value if k not in props]
    return {k: _ordered(value[k], props.get(k, extra)) for k in keys}


def _fill_defaults(
    data: dict[str, Any], default: Mapping[str, Any], path: KeyPath, origins: dict[KeyPath, Origin]
) -> None:
    """Give keys cleared with ``null`` their default back."""
    for key, value in default.items():
        if key not in data:
            if isinstance(value, Mapping) and value:
                data[key] = {}
                _fill_defaults(data[key], value, (*path, key), origins)
            else:
                data[key] = copy.deepcopy(value)
                for leaf in leaf_paths(value, (*path, key)):
                    origins[leaf] = ("default", None)
        elif isinstance(value, Mapping) and isinstance(data[key], dict):
            _fill_defaults(data[key], value, (*path, key), origins)


def _impose_daemon_only(data: dict[str, Any], origins: dict[KeyPath, Origin], daemon_view: MergeResult) -> None:
    """Daemon-only keys come from the defaults and the daemon layer alone,
    even when a client layer cleared a parent mapping (``kubernetes: null``)."""
    for path in DAEMON_ONLY_KEYS:
        n = len(path)
        for key in [k for k in origins if k[:n] == path]:
            del origins[key]
        parent: Any = data
        for seg in path[:-1]:
            parent = parent.setdefault(seg, {})
        parent.pop(path[-1], None)
        present, value = _get(daemon_view.data, path)
        if present:
            parent[path[-1]] = copy.deepcopy(value)
            origins.update({k: o for k, o in daemon_view.origins.items() if k[:n] == path})
