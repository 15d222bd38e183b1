"""Layered configuration and the Kubernetes sandbox option checks
(docs/config.md).

Sources, lowest priority first: built-in defaults, the daemon config, the user
config, the project config (``.jobsup.yaml``), the task YAML's ``config:`` and
``--config``. The client reads user, project, task and cli layers
(:func:`load_client_layers`) and sends them with a submit
(:func:`layers_to_wire`); the daemon rebuilds them (:func:`layers_from_wire`),
overlays them onto its own config (:func:`load_daemon_layer`) with
:func:`effective_config`, refuses what the daemon config does not allow
(:func:`check_allowed`) and records :func:`supervisord.shared.secret.redact` of
the result.

Typical daemon-side use::

    daemon = load_daemon_layer()
    validate_daemon_config(daemon)                  # at start: fail fast
    eff = effective_config(daemon, layers_from_wire(body["config_layers"]),
                           context=current_kube_context())
    check_allowed(eff, backend)
    record(supervisord.shared.secret.redact(eff.data, digest_key))

The Kubernetes backend applies ``eff.data["kubernetes"]["pod_config"]`` to the
primary Job's pod template with :func:`merge_pod_spec` and reuses
:func:`check_mount_paths` against the manifest's own volumeMounts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisord.shared.config.dotlist import parse_cli_config
    from supervisord.shared.config.effective import (
        DAEMON_ONLY_KEYS,
        TASK_KEYS,
        EffectiveConfig,
        check_allowed,
        defaults,
        effective_config,
        layer_errors,
        validate_daemon_config,
    )
    from supervisord.shared.config.keypath import KeyPath, format_path, parse_key
    from supervisord.shared.config.layer import CLIENT_LAYER_NAMES, LAYER_NAMES, Layer, Origin, describe_origin
    from supervisord.shared.config.merge import (
        POD_SPEC_ATOMIC_LISTS,
        POD_SPEC_MERGE_KEYS,
        MergeResult,
        merge,
        merge_layers,
        merge_pod_spec,
    )
    from supervisord.shared.config.sandbox import (
        ENV_POD_READY_TIMEOUT,
        RESERVED_MOUNT_PATHS,
        check_dns1123_label,
        check_dns1123_subdomain,
        check_label_key,
        check_label_value,
        check_mount_paths,
        pod_ready_timeout_from_env,
    )
    from supervisord.shared.config.schema import CONFIG_SCHEMA
    from supervisord.shared.config.sources import (
        ENV_DAEMON_CONFIG,
        ENV_PROJECT_CONFIG,
        ENV_USER_CONFIG,
        config_file_path,
        current_kube_context,
        kubeconfig_files,
        layers_from_wire,
        layers_to_wire,
        load_client_layers,
        load_daemon_layer,
        load_user_layer,
        read_client_layers,
        read_config_file,
    )

__all__ = [
    "CLIENT_LAYER_NAMES",
    "CONFIG_SCHEMA",
    "DAEMON_ONLY_KEYS",
    "ENV_DAEMON_CONFIG",
    "ENV_POD_READY_TIMEOUT",
    "ENV_PROJECT_CONFIG",
    "ENV_USER_CONFIG",
    "LAYER_NAMES",
    "POD_SPEC_ATOMIC_LISTS",
    "POD_SPEC_MERGE_KEYS",
    "RESERVED_MOUNT_PATHS",
    "TASK_KEYS",
    "EffectiveConfig",
    "KeyPath",
    "Layer",
    "MergeResult",
    "Origin",
    "check_allowed",
    "check_dns1123_label",
    "check_dns1123_subdomain",
    "check_label_key",
    "check_label_value",
    "check_mount_paths",
    "config_file_path",
    "current_kube_context",
    "defaults",
    "describe_origin",
    "effective_config",
    "format_path",
    "kubeconfig_files",
    "layer_errors",
    "layers_from_wire",
    "layers_to_wire",
    "load_client_layers",
    "load_daemon_layer",
    "load_user_layer",
    "merge",
    "merge_layers",
    "merge_pod_spec",
    "parse_cli_config",
    "parse_key",
    "pod_ready_timeout_from_env",
    "read_client_layers",
    "read_config_file",
    "validate_daemon_config",
]

#: Each public name's module: imported on first use (PEP 562), so that a
#: caller needing one piece (the CLI reading a YAML file) does not load the
#: schema validator and the merge machinery.
_LAZY: dict[str, str] = {
    "CLIENT_LAYER_NAMES": "supervisord.shared.config.layer",
    "CONFIG_SCHEMA": "supervisord.shared.config.schema",
    "DAEMON_ONLY_KEYS": "supervisord.shared.config.effective",
    "ENV_DAEMON_CONFIG": "supervisord.shared.config.sources",
    "ENV_POD_READY_TIMEOUT": "supervisord.shared.config.sandbox",
    "ENV_PROJECT_CONFIG": "supervisord.shared.config.sources",
    "ENV_USER_CONFIG": "supervisord.shared.config.sources",
    "EffectiveConfig": "supervisord.shared.config.effective",
    "KeyPath": "supervisord.shared.config.keypath",
    "LAYER_NAMES": "supervisord.shared.config.layer",
    "Layer": "supervisord.shared.config.layer",
    "MergeResult": "supervisord.shared.config.merge",
    "Origin": "supervisord.shared.config.layer",
    "POD_SPEC_ATOMIC_LISTS": "supervisord.shared.config.merge",
    "POD_SPEC_MERGE_KEYS": "supervisord.shared.config.merge",
    "RESERVED_MOUNT_PATHS": "supervisord.shared.config.sandbox",
    "TASK_KEYS": "supervisord.shared.config.effective",
    "check_allowed": "supervisord.shared.config.effective",
    "check_dns1123_label": "supervisord.shared.config.sandbox",
    "check_dns1123_subdomain": "supervisord.shared.config.sandbox",
    "check_label_key": "supervisord.shared.config.sandbox",
    "check_label_value": "supervisord.shared.config.sandbox",
    "check_mount_paths": "supervisord.shared.config.sandbox",
    "config_file_path": "supervisord.shared.config.sources",
    "current_kube_context": "supervisord.shared.config.sources",
    "kubeconfig_files": "supervisord.shared.config.sources",
    "defaults": "supervisord.shared.config.effective",
    "describe_origin": "supervisord.shared.config.layer",
    "effective_config": "supervisord.shared.config.effective",
    "format_path": "supervisord.shared.config.keypath",
    "layer_errors": "supervisord.shared.config.effective",
    "layers_from_wire": "supervisord.shared.config.sources",
    "layers_to_wire": "supervisord.shared.config.sources",
    "load_client_layers": "supervisord.shared.config.sources",
    "load_daemon_layer": "supervisord.shared.config.sources",
    "load_user_layer": "supervisord.shared.config.sources",
    "merge": "supervisord.shared.config.merge",
    "merge_layers": "supervisord.shared.config.merge",
    "merge_pod_spec": "supervisord.shared.config.merge",
    "parse_cli_config": "supervisord.shared.config.dotlist",
    "parse_key": "supervisord.shared.config.keypath",
    "pod_ready_timeout_from_env": "supervisord.shared.config.sandbox",
    "read_client_layers": "supervisord.shared.config.sources",
    "read_config_file": "supervisord.shared.config.sources",
    "validate_daemon_config": "supervisord.shared.config.effective",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
