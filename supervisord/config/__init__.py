"""Layered configuration (jobsup issue 4) and the Kubernetes sandbox option
checks (issue 8).

Sources, lowest priority first: built-in defaults, the daemon config, the user
config, the project config (``.jobsup.yaml``), the task YAML's ``config:`` and
``--config``. The client reads user, project, task and cli layers
(:func:`load_client_layers`) and sends them with a submit
(:func:`layers_to_wire`); the daemon rebuilds them (:func:`layers_from_wire`),
overlays them onto its own config (:func:`load_daemon_layer`) with
:func:`effective_config`, refuses what the daemon config does not allow
(:func:`check_allowed`) and records :func:`redact` of the result.

Typical daemon-side use::

    daemon = load_daemon_layer()
    validate_daemon_config(daemon)                  # at start: fail fast
    eff = effective_config(daemon, layers_from_wire(body["config_layers"]),
                           context=current_kube_context())
    check_allowed(eff, backend)
    record(redact(eff.data))

The Kubernetes backend applies ``eff.data["kubernetes"]["pod_config"]`` to the
primary Job's pod template with :func:`merge_pod_spec` and reuses
:func:`check_mount_paths` against the manifest's own volumeMounts.
"""

from __future__ import annotations

from supervisord.config.dotlist import parse_cli_config
from supervisord.config.effective import (
    DAEMON_ONLY_KEYS,
    TASK_KEYS,
    EffectiveConfig,
    check_allowed,
    defaults,
    effective_config,
    layer_errors,
    validate_daemon_config,
)
from supervisord.config.keypath import KeyPath, format_path, parse_key
from supervisord.config.layer import CLIENT_LAYER_NAMES, LAYER_NAMES, Layer, Origin, describe_origin
from supervisord.config.merge import (
    POD_SPEC_ATOMIC_LISTS,
    POD_SPEC_MERGE_KEYS,
    MergeResult,
    merge,
    merge_layers,
    merge_pod_spec,
)
from supervisord.config.redact import redact
from supervisord.config.sandbox import (
    ENV_POD_READY_TIMEOUT,
    RESERVED_MOUNT_PATHS,
    check_dns1123_label,
    check_dns1123_subdomain,
    check_label_key,
    check_label_value,
    check_mount_paths,
    pod_ready_timeout_from_env,
)
from supervisord.config.schema import CONFIG_SCHEMA
from supervisord.config.sources import (
    ENV_DAEMON_CONFIG,
    ENV_PROJECT_CONFIG,
    ENV_USER_CONFIG,
    config_file_path,
    current_kube_context,
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
    "EffectiveConfig",
    "KeyPath",
    "LAYER_NAMES",
    "Layer",
    "MergeResult",
    "Origin",
    "POD_SPEC_ATOMIC_LISTS",
    "POD_SPEC_MERGE_KEYS",
    "RESERVED_MOUNT_PATHS",
    "TASK_KEYS",
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
    "redact",
    "validate_daemon_config",
]
