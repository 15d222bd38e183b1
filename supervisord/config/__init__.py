"""Layered configuration: sources and layers, merge rules, dotlist, schema,
origins (jobsup issue 4) and the Kubernetes sandbox option checks (issue 8).
"""

from __future__ import annotations

from supervisord.config.keypath import KeyPath, format_path, parse_key
from supervisord.config.layer import CLIENT_LAYER_NAMES, LAYER_NAMES, Layer, LayerName, Origin
from supervisord.config.merge import (
    POD_SPEC_ATOMIC_LISTS,
    POD_SPEC_MERGE_KEYS,
    MergeResult,
    merge,
    merge_layers,
    merge_pod_spec,
)

__all__ = [
    "CLIENT_LAYER_NAMES",
    "KeyPath",
    "LAYER_NAMES",
    "Layer",
    "LayerName",
    "MergeResult",
    "Origin",
    "POD_SPEC_ATOMIC_LISTS",
    "POD_SPEC_MERGE_KEYS",
    "format_path",
    "merge",
    "merge_layers",
    "merge_pod_spec",
    "parse_key",
]
