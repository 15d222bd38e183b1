"""The config schema (JSON Schema, draft 2020-12) and layer validation.

Every layer and the merged result are checked with the ``jsonschema`` library
against :data:`CONFIG_SCHEMA`, then with the semantic checks of
:mod:`supervisord.shared.config.sandbox`. ``integer`` means a YAML/JSON integer only:
``90.0`` and ``true`` are not integers here (plain JSON Schema would accept
``90.0``).

Keys::

    project: str                        grouping of runs
    backend: local | kubernetes | slurm   default backend
    env: {NAME: str}                    env for every run (secret values)
    local: {kill_grace_s: int > 0, shell: str,
            max_log_bytes: int > 0      stop recording a run's output past this many bytes (LogsTruncated)
            keep_log_files: bool        keep the run's output.log whole (default: its recorded
                                        ranges are freed, hole-punched, once committed)
            progress_interval_s: number 0.1..86400   at most one Progress event per run this often (default 10)
            env_from: submitter | daemon   whose environment a run starts from (default submitter:
                                        the shell that ran submit; supervisord.shared.shellenv)
            outputs_dir: str            where runs' output folders go (default
                                        $XDG_DATA_HOME/jobsup/outputs; supervisord.daemon.outputs)}
            usage_interval_s: number    daemon-only: sample running local runs' CPU, memory
                                        and GPU memory this often (default 5)}
    kubernetes:
      context: str                      unset = the kubeconfig's current context
      namespace: DNS-1123 label
      manifest: str                     repository-relative manifest path
      pod_config: {metadata: {...}, spec: {...}}   pod template patch
      custom_metadata: {labels: {k: v}, annotations: {k: v}}
      pod_ready_timeout_s: int > 0
      runtime_class: str
      tolerations: [{key, operator, value, effect, tolerationSeconds}]
      node_selector: {k: v}
      pvc_mounts: [{claim_name, mount_path, read_only}]
      secret_mounts: [{secret_name, mount_path}]
      allowed_contexts: [str]           daemon-only
      context_configs: {<context>: {<kubernetes key but context,
                                     allowed_contexts, context_configs>}}
    slurm:                              (supervisord.daemon.backends.slurm; README "Running on Slurm")
      host: str                         ssh destination of a login node (empty: this machine's commands)
      partition: str, account: str, qos: str
      sbatch_args: [str]                more sbatch options, after jobsup's own
      remote_dir: str                   the runs' folder on the cluster (default ~/.jobsup)
    allowed_backends: [local | kubernetes | slurm]   daemon-only
    ui: {port: 1..65535, host: str, tls_cert: str, tls_key: str}   daemon-only
    daemon: {synchronous: FULL | NORMAL,
             max_running: int > 0 (the default queue's cap when it sets none),
             log_level: debug | info | warning | error}   daemon-only
    retention:                          daemon-only (supervisord.daemon.retention)
      archive_logs_after: DURATION      move the log text of runs ended longer ago into <state dir>/archive/
      run_dirs_after: DURATION          remove the folders of runs ended longer ago (default off)
                                        DURATION: a whole number > 0 and s | m | h | d, e.g. 30d
    scheduler:                          daemon-only
      gpus: auto | [int >= 0 | str]     GPU indices or UUIDs (default auto)
      queues: {<name>: {max_parallel: int > 0}}
      cpu_runs_see_gpus: bool
      memory: SIZE (16G) | int bytes   what --memory claims come out of (default: the machine's)
      cpus: number > 0                  what --cpus claims come out of (default: the machine's)
    hooks: [HOOK]                       daemon and user config only (:data:`HOOK_SCHEMA`;
                                        supervisord.shared.hooksconfig checks them and says
                                        what is wrong in its own words)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from store.types import PHASES
from supervisord.shared.config.keypath import KeyPath, format_path
from supervisord.shared.config.sandbox import check_kubernetes_options
from supervisord.shared.secret import looks_secret

if TYPE_CHECKING:
    import jsonschema

__all__ = [
    "CONFIG_SCHEMA",
    "HOOK_SCHEMA",
    "is_secret_path",
    "schema_at",
    "schema_errors",
    "schema_violations",
    "validate_document",
]

_STR: dict[str, Any] = {"type": "string", "minLength": 1}
_POS_INT: dict[str, Any] = {"type": "integer", "minimum": 1}
_DURATION: dict[str, Any] = {"type": "string", "pattern": r"^[1-9][0-9]{0,8}[smhd]$"}
_STR_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
_FREE_MAP: dict[str, Any] = {"type": "object"}

_TOLERATION: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "key": {"type": "string"},
        "operator": {"enum": ["Equal", "Exists"]},
        "value": {"type": "string"},
        "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
        "tolerationSeconds": {"type": "integer", "minimum": 0},
    },
}

_KUBERNETES_PER_CONTEXT: dict[str, Any] = {
    "namespace": _STR,
    "manifest": _STR,
    "pod_config": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "metadata": {
                "type": "object",
                "properties": {"labels": _STR_MAP, "annotations": _STR_MAP},
            },
            "spec": _FREE_MAP,
        },
    },
    "custom_metadata": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"labels": _STR_MAP, "annotations": _STR_MAP},
    },
    # At most a week: a budget for a pod to be found and running.
    "pod_ready_timeout_s": {"type": "integer", "minimum": 1, "maximum": 604800},
    "runtime_class": _STR,
    "tolerations": {"type": "array", "items": _TOLERATION},
    "node_selector": _STR_MAP,
    "pvc_mounts": {
        "type": "array",
        "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["claim_name", "mount_path"],
            "properties": {"claim_name": _STR, "mount_path": _STR, "read_only": {"type": "boolean"}},
        },
    },
    "secret_mounts": {
        "type": "array",
        "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["secret_name", "mount_path"],
            "properties": {"secret_name": _STR, "mount_path": _STR},
        },
    },
}

#: The schema of a config layer and of the merged config.
#: The longest hook timeout or retry window: a week (seconds).
_HOOK_MAX_S = 7 * 86400
_HOOK_SECONDS: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": _HOOK_MAX_S}
# A hook's `when`: a phase, or `Retrying` (an attempt of a retried run failed: supervisord.shared.retry).
_PHASE: dict[str, Any] = {"type": "string", "pattern": "^(?i:" + "|".join((*PHASES, "Retrying")) + ")$"}
_GLOBS: dict[str, Any] = {"anyOf": [_STR, {"type": "array", "minItems": 1, "items": _STR}]}

#: One hook (README, "Hooks"; supervisord.shared.hooksconfig): exactly one of
#: ``command`` (argv, no shell) and ``webhook``.
HOOK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {
            "type": "string",
            "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
            "not": {"const": "on-done"},
            "description": "unique; `on-done` is submit --on-done's",
        },
        "when": {
            "anyOf": [_PHASE, {"type": "array", "minItems": 1, "items": _PHASE}],
            "description": "the phases it runs for (default: the terminal ones)",
        },
        "match": {
            "type": "object",
            "additionalProperties": False,
            "properties": dict.fromkeys(("project", "name", "backend", "reason"), _GLOBS),
        },
        "command": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "pattern": "^[^\\x00]+$"},
            "description": "argv; no shell (use [sh, -c, '...'] for one)",
        },
        "timeout_s": {**_HOOK_SECONDS, "description": "a command's time limit (default 30)"},
        "webhook": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url"],
            "properties": {
                "url": {**_STR, "description": "http:// or https://; a secret (never shown)"},
                "secret_env": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
                "timeout_s": _HOOK_SECONDS,
                "retry_for_s": _HOOK_SECONDS,
                "in_flight": {"type": "integer", "minimum": 1, "maximum": 64},
            },
        },
        "backfill": {"type": "boolean"},
    },
    "oneOf": [{"required": ["command"]}, {"required": ["webhook"]}],
    "dependentSchemas": {"webhook": {"not": {"required": ["timeout_s"]}}},
}

CONFIG_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "project": _STR,
        "backend": {"enum": ["local", "kubernetes", "slurm"]},
        "env": {
            "type": "object",
            "propertyNames": {"pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
            "additionalProperties": {"type": "string"},
        },
        "local": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "kill_grace_s": _POS_INT,
                "shell": _STR,
                "max_log_bytes": _POS_INT,
                "keep_log_files": {"type": "boolean"},
                # Seconds between two Progress events of a run (supervisord.shared.progress).
                "progress_interval_s": {"type": "number", "minimum": 0.1, "maximum": 86400},
                "env_from": {"enum": ["submitter", "daemon"]},
                "outputs_dir": _STR,
                # daemon-only: how often running local runs are sampled (CPU, memory, GPU memory)
                "usage_interval_s": {"type": "number", "minimum": 0.5, "maximum": 3600},
            },
        },
        "kubernetes": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "context": _STR,
                **_KUBERNETES_PER_CONTEXT,
                "allowed_contexts": {"type": "array", "items": _STR, "uniqueItems": True},
                "context_configs": {
                    "type": "object",
                    "propertyNames": {"minLength": 1},
                    "additionalProperties": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": _KUBERNETES_PER_CONTEXT,
                    },
                },
            },
        },
        "slurm": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "host": {"type": "string"},
                "partition": _STR,
                "account": _STR,
                "qos": _STR,
                "sbatch_args": {"type": "array", "items": _STR},
                "remote_dir": _STR,
            },
        },
        # A run's retry policy when neither --retry nor the task's `retry:` gives one (supervisord.shared.retry).
        "retry": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "attempts": {"type": "integer", "minimum": 1, "maximum": 100},
                "on": {"type": "array", "items": _STR, "minItems": 1},
                "backoff": {"anyOf": [{"type": "number", "minimum": 0}, _STR]},
            },
        },
        "allowed_backends": {
            "type": "array",
            "items": {"enum": ["local", "kubernetes", "slurm"]},
            "uniqueItems": True,
        },
        "ui": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "host": _STR,
                "tls_cert": _STR,
                "tls_key": _STR,
            },
        },
        "daemon": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "synchronous": {"enum": ["FULL", "NORMAL"]},
                "max_running": _POS_INT,
                "log_level": {"enum": ["debug", "info", "warning", "error"]},
            },
        },
        "retention": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "archive_logs_after": _DURATION,
                "run_dirs_after": _DURATION,
            },
        },
        "scheduler": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "gpus": {
                    "anyOf": [
                        {"const": "auto"},
                        {
                            "type": "array",
                            "uniqueItems": True,
                            "items": {"anyOf": [{"type": "integer", "minimum": 0}, _STR]},
                        },
                    ]
                },
                "queues": {
                    "type": "object",
                    "propertyNames": {"pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"},
                    "additionalProperties": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"max_parallel": _POS_INT},
                    },
                },
                "cpu_runs_see_gpus": {"type": "boolean"},
                # the capacity --memory / --cpus claims come out of (default: the machine's)
                "memory": {"anyOf": [{"type": "integer", "minimum": 1048576}, _STR]},
                "cpus": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        "hooks": {
            "type": "array",
            "items": HOOK_SCHEMA,
            "description": "daemon and user config only: commands or webhooks run when runs change phase",
        },
    },
}


def _is_strict_int(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _validator() -> Any:
    """The config schema's validator, made at its first use: importing
    jsonschema costs about 0.1 s of CPU, which every ``jobsup submit``
    paid at import (bench/sweep_submit.py) though the CLI rarely validates."""
    import jsonschema.validators

    extended = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
        jsonschema.Draft202012Validator,
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_int),
    )
    return extended(CONFIG_SCHEMA)


def is_secret_path(path: KeyPath) -> bool:
    """Whether the value at ``path`` may be a secret: anything under ``env``
    (a mapping, or a pod-spec ``env`` list's ``value``), or a key whose name
    looks like a token, password or secret (but not a reference to one, such as
    ``secretName`` or ``secret_mounts``)."""
    for i, seg in enumerate(path):
        if seg == "env":
            rest = path[i + 1 :]
            if not rest:
                return True
            if isinstance(rest[0], str):  # the env mapping of a layer
                return True
            return len(rest) >= 2 and rest[1] == "value"  # a pod-spec env list
        if isinstance(seg, str) and looks_secret(seg):
            return True
    return False


def schema_at(path: KeyPath) -> dict[str, Any] | None:
    """The schema of the value at ``path`` (``None`` when the schema does not
    describe that place, e.g. inside ``pod_config.spec``). Used to type
    ``--config`` values: a key whose schema type is ``string`` keeps its text."""
    node: Any = CONFIG_SCHEMA
    for seg in path:
        if not isinstance(node, Mapping):
            return None
        if isinstance(seg, int):
            node = node.get("items")
        else:
            props = node.get("properties", {})
            if seg in props:
                node = props[seg]
            else:
                extra = node.get("additionalProperties")
                node = extra if isinstance(extra, Mapping) else None
        if node is None:
            return None
    return dict(node)


def schema_errors(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """Every schema violation in ``document`` as ``(key path, reason)``,
    sorted by path. Reasons never show values under secret paths."""
    out: list[tuple[KeyPath, str]] = []
    for error in _validator().iter_errors(document):
        path: KeyPath = tuple(error.absolute_path)
        out.extend(_describe(error, path))
    out.sort(key=lambda item: format_path(item[0]))
    return out


def schema_violations(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """Every schema violation in ``document`` as ``(key path, the JSON
    Schema keyword it breaks)``, sorted: no value shown, for callers that
    word their own messages (hooks, whose webhook URLs are secrets)."""
    found = {(tuple(e.absolute_path), str(e.validator)) for e in _validator().iter_errors(document)}
    return sorted(found, key=lambda item: (format_path(item[0]), item[1]))


def validate_document(document: Mapping[str, Any]) -> list[str]:
    """Check ``document`` (a layer, or the merged config) with the schema and
    the semantic checks; return one ``"<key path>: <reason>"`` line per
    problem (empty when valid). Null values must already be removed (in a
    layer, a null clears a lower layer's value and is always allowed)."""
    errors = [f"{format_path(p)}: {reason}" for p, reason in schema_errors(document)]
    # The semantic checks skip values of the wrong type (reported above).
    kubernetes = document.get("kubernetes")
    errors.extend(check_kubernetes_options(kubernetes))
    if isinstance(kubernetes, Mapping):
        contexts = kubernetes.get("context_configs")
        if isinstance(contexts, Mapping):
            for name, sub in contexts.items():
                errors.extend(check_kubernetes_options(sub, ("kubernetes", "context_configs", name)))
    return errors


def _show(value: Any, path: KeyPath) -> str:
    if is_secret_path(path):
        return "a value (not shown: it may be a secret)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, float):
        return f"{value!r} (a float)"
    if isinstance(value, int):
        return f"{value!r}"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{value!r}"


def _bool_hint(value: Any) -> str:
    if isinstance(value, bool):
        return " (YAML reads yes/no/on/off/true/false as booleans: quote the word to make it a string)"
    return ""


_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "object": "a mapping",
    "array": "a list",
    "boolean": "true or false",
    "number": "a number",
    "null": "null",
}


def _describe(error: jsonschema.ValidationError, path: KeyPath) -> Iterable[tuple[KeyPath, str]]:
    kind = error.validator
    schema: Any = error.schema
    value = error.instance
    if "propertyNames" in error.schema_path:
        key = str(value)
        if path[-1:] == ("env",):
            yield (*path, key), "is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
        else:
            yield (*path, key), "must not be empty"
        return
    if kind == "additionalProperties" and isinstance(value, Mapping) and isinstance(schema, Mapping):
        allowed = sorted(schema.get("properties", {}))
        for key in value:
            if key not in schema.get("properties", {}):
                hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
                yield (*path, str(key)), f"unknown key{hint}"
        return
    if kind == "type":
        types = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        want = " or ".join(_TYPE_WORDS.get(str(t), str(t)) for t in types)
        if types == ["integer"] and isinstance(schema, Mapping) and schema.get("minimum") == 1:
            want = "a positive integer"
        yield path, f"must be {want}, got {_show(value, path)}{_bool_hint(value) if 'string' in types else ''}"
        return
    if kind == "enum":
        options: Any = error.validator_value
        choices = ", ".join(str(c) for c in options)
        yield path, f"must be one of {choices}, got {_show(value, path)}{_bool_hint(value)}"
        return
    if kind == "minimum":
        yield (
            path,
            (
                f"must be a positive integer, got {_show(value, path)}"
                if error.validator_value == 1
                else f"must be at least {error.validator_value}, got {_show(value, path)}"
            ),
        )
        return
    if kind == "pattern" and error.validator_value == _DURATION["pattern"] and not is_secret_path(path):
        # Every duration-valued key uses _DURATION: one message for them all.
        yield path, f"{value!r} is not a duration; use e.g. 90s, 30m, 4h or 30d"
        return
    if kind == "minLength":
        yield path, "must not be empty"
        return
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else str(error.validator_value)
        yield (*path, missing), "is required"
        return
    if kind == "uniqueItems":
        yield path, "has duplicate items"
        return
    yield path, error.message if not is_secret_path(path) else f"fails the schema check `{kind}`"
