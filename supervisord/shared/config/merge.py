"""Merge rules for config layers and Kubernetes pod-spec patches.

One function does both jobs: :func:`merge` overlays a higher-priority document
(``patch``) onto a lower one (``base``) and returns a new document; inputs are
never modified. The rules (docs/config.md, "Merge rules"):

* Mappings merge key by key; a scalar in the patch replaces the base's.
* An explicit ``null`` clears the inherited value or subtree: the key is
  removed (Kubernetes reads a null field as absent, too). A ``null`` with
  nothing beneath it to clear is simply dropped.
* Lists are replaced by the patch's list, except inside a Kubernetes pod spec
  (``kubernetes.pod_config``, ``kubernetes.context_configs.<ctx>.pod_config``,
  and everything :func:`merge_pod_spec` merges), where the rules of Kubernetes'
  strategic merge patch apply by field name:

  - lists with a patch-merge key (:data:`POD_SPEC_MERGE_KEYS`) merge item by
    item: an item whose key matches an existing item is merged into it, others
    are appended, order kept;
  - ``args``, ``command`` and ``imagePullSecrets`` are replaced whole, so an
    empty list clears them (:data:`POD_SPEC_ATOMIC_LISTS`);
  - any other list is a union: items not already present (deep equality)
    are appended.

  The merge keys follow the ``patchMergeKey`` markers of the Kubernetes API
  types (k8s.io/api/core/v1/types.go, e.g. ``Container.VolumeMounts``:
  ``patchMergeKey=mountPath``); see
  https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/
  ("Notes on the strategic merge patch"). ``imagePullSecrets`` is atomic here
  (Kubernetes merges it on ``name``) so that a higher layer can clear it.

* Merging is idempotent: ``merge(merge(b, p), p) == merge(b, p)``. (Union
  lists never gain duplicates; keyed lists merge into the matching item.)
* A mapping or list overridden by a scalar, or a scalar by a mapping or list,
  or a mapping by a list (and the reverse), is an error naming the key path
  and both layers. Every such conflict is collected and raised at once as a
  :class:`~supervisord.shared.exceptions.ConfigError`.

:func:`merge_layers` merges a stack of :class:`~supervisord.shared.config.layer.Layer`
objects and records, for each leaf value of the result, the layer (and file) it
came from.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from supervisord.shared.config.keypath import KeyPath, format_path
from supervisord.shared.config.layer import Layer, Origin, describe_origin
from supervisord.shared.exceptions import ConfigError

__all__ = [
    "POD_SPEC_ATOMIC_LISTS",
    "POD_SPEC_MERGE_KEYS",
    "POD_SPEC_PATHS",
    "MergeResult",
    "is_pod_spec_path",
    "leaf_paths",
    "merge",
    "merge_layers",
    "merge_pod_spec",
]

#: List fields of a pod spec that merge item by item, and the key they merge on
#: (Kubernetes' ``patchMergeKey``; k8s.io/api/core/v1/types.go).
POD_SPEC_MERGE_KEYS: Mapping[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "hostAliases": "ip",
    "ports": "containerPort",
    "volumeDevices": "devicePath",
}

#: List fields of a pod spec that a patch replaces whole (an empty list clears).
POD_SPEC_ATOMIC_LISTS: frozenset[str] = frozenset({"args", "command", "imagePullSecrets"})

#: Config key paths that hold a pod spec patch; ``"*"`` matches any one key.
POD_SPEC_PATHS: tuple[tuple[str, ...], ...] = (
    ("kubernetes", "pod_config"),
    ("kubernetes", "context_configs", "*", "pod_config"),
)

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """The merged document and, for every leaf (a scalar, or an empty mapping
    or list), the origin of its value: ``origins[("kubernetes", "namespace")]
    == ("project", "/repo/.jobsup.yaml")``."""

    data: dict[str, Any]
    origins: dict[KeyPath, Origin]


def merge(
    base: Mapping[str, Any],
    patch: Mapping[str, Any],
    *,
    path: KeyPath = (),
    base_layer: str = "base",
    patch_layer: str = "patch",
    pod_spec: bool = False,
) -> dict[str, Any]:
    """Overlay ``patch`` onto ``base`` with the rules of this module; return a
    new mapping (neither input is modified, and the result shares no mutable
    object with them).

    ``path`` is where both documents sit in a larger one: it decides whether
    pod-spec list rules apply (below :data:`POD_SPEC_PATHS`) and prefixes key
    paths in errors. ``pod_spec=True`` treats the whole of ``base`` and
    ``patch`` as pod-spec documents. ``base_layer``/``patch_layer`` name the
    two sides in errors ("the user layer (/home/me/...)").

    Raises ConfigError (``errors``: one line per conflict) when a value's kind
    (mapping, list, scalar) conflicts between the two, or a patch item of a
    keyed pod-spec list lacks its merge key.
    """
    state = _State(
        origins=None,
        patch_origin=(patch_layer, None),
        base_desc=base_layer,
        patch_desc=patch_layer,
    )
    result = copy.deepcopy(dict(base))
    _merge_mapping(result, patch, tuple(path), state, pod_spec or is_pod_spec_path(path))
    state.raise_errors()
    return result


def merge_pod_spec(base_pod_spec: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Apply a pod-spec patch (``kubernetes.pod_config``) to a pod template or
    pod spec: ``base_pod_spec`` is what the manifest says (the lowest layer),
    ``patch`` the effective ``pod_config``. Returns a new mapping; neither input
    is modified.

    Both sides have the same shape, e.g. a Job's ``spec.template``
    (``{"metadata": {...}, "spec": {"containers": [...], ...}}``). Lists merge
    with the pod-spec rules of this module (keyed on :data:`POD_SPEC_MERGE_KEYS`,
    atomic :data:`POD_SPEC_ATOMIC_LISTS`, union otherwise); ``null`` removes a
    field.

    Raises ConfigError listing every kind conflict (e.g. the patch gives a
    mapping where the manifest has a list) and every keyed-list item without
    its merge key (e.g. a container without ``name``), each with its key path.
    """
    state = _State(
        origins=None,
        patch_origin=("pod_config", None),
        base_desc="the manifest's pod template",
        patch_desc="kubernetes.pod_config",
    )
    result = copy.deepcopy(dict(base_pod_spec))
    _merge_mapping(result, patch, (), state, True)
    state.raise_errors()
    return result


def merge_layers(layers: Sequence[Layer], *, base: MergeResult | None = None) -> MergeResult:
    """Merge ``layers`` (lowest priority first) over ``base`` (default: empty)
    and track where each leaf value came from.

    Returns a :class:`MergeResult`. Raises ConfigError with every conflict of
    every layer; each names the key path, the layer that set the value below
    (with its file) and the layer that tried to override it.
    """
    data: dict[str, Any] = copy.deepcopy(base.data) if base else {}
    origins: dict[KeyPath, Origin] = dict(base.origins) if base else {}
    errors: list[str] = []
    for layer in layers:
        state = _State(
            origins=origins,
            patch_origin=(layer.name, layer.file),
            base_desc="a lower layer",
            patch_desc=layer.describe(),
        )
        _merge_mapping(data, layer.data, (), state, False)
        errors.extend(state.errors)
    if errors:
        raise ConfigError.of(errors, "config conflicts")
    return MergeResult(data=data, origins=origins)


# --------------------------------------------------------------------------
# internals


@dataclasses.dataclass
class _State:
    """What one merge pass needs besides the two documents."""

    origins: dict[KeyPath, Origin] | None
    patch_origin: Origin
    base_desc: str
    patch_desc: str
    errors: list[str] = dataclasses.field(default_factory=list)

    def set(self, path: KeyPath, value: Any) -> None:
        """Record ``patch_origin`` for every leaf of ``value`` placed at ``path``."""
        if self.origins is None:
            return
        self.clear(path)
        for i in range(len(path)):  # an ancestor that was an empty leaf no longer is
            self.origins.pop(path[:i], None)
        for leaf in leaf_paths(value, path):
            self.origins[leaf] = self.patch_origin

    def clear(self, path: KeyPath) -> None:
        """Forget the origins at and below ``path``."""
        if self.origins is None:
            return
        n = len(path)
        for key in [k for k in self.origins if k[:n] == path]:
            del self.origins[key]

    def conflict(self, path: KeyPath, base_value: Any, patch_value: Any) -> None:
        """Record a kind conflict at ``path``."""
        below = self.base_desc
        if self.origins is not None:
            n = len(path)
            found = [o for k, o in self.origins.items() if k[:n] == path]
            if found:
                below = describe_origin(found[-1])
        self.errors.append(
            f"{format_path(path)}: {self.patch_desc} sets {_kind(patch_value)}, but "
            f"{below} set {_kind(base_value)} there; a {_kind(patch_value, article=False)} "
            f"cannot override a {_kind(base_value, article=False)}"
        )

    def raise_errors(self) -> None:
        if self.errors:
            raise ConfigError.of(self.errors, "config conflicts")


def _kind(value: Any, *, article: bool = True) -> str:
    if isinstance(value, Mapping):
        word = "mapping"
    elif isinstance(value, list):
        word = "list"
    else:
        word = "scalar"
    return f"a {word}" if article else word


def is_pod_spec_path(path: KeyPath) -> bool:
    """Whether ``path`` lies at or below a key holding a pod spec
    (:data:`POD_SPEC_PATHS`), where the pod-spec list rules apply."""
    for pattern in POD_SPEC_PATHS:
        if len(path) >= len(pattern) and all(p in ("*", s) for p, s in zip(pattern, path, strict=False)):
            return True
    return False


def leaf_paths(value: Any, path: KeyPath) -> list[KeyPath]:
    """The key paths of every leaf of ``value`` placed at ``path``: scalars,
    and empty mappings or lists."""
    if isinstance(value, dict) and value:
        out: list[KeyPath] = []
        for k, v in value.items():
            out.extend(leaf_paths(v, (*path, k)))
        return out
    if isinstance(value, list) and value:
        out = []
        for i, v in enumerate(value):
            out.extend(leaf_paths(v, (*path, i)))
        return out
    return [path]


def _clean(value: Any) -> Any:
    """A deep copy of ``value`` without null-valued mapping keys (a null over
    nothing clears nothing)."""
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _merge_mapping(target: dict[str, Any], patch: Mapping[str, Any], path: KeyPath, state: _State, pod: bool) -> None:
    for key, pval in patch.items():
        kpath = (*path, key)
        kpod = pod or is_pod_spec_path(kpath)
        tval = target.get(key, _MISSING)
        if pval is None:
            if tval is not _MISSING:
                del target[key]
                state.clear(kpath)
                if not target:
                    state.set(path, target)
            continue
        if tval is _MISSING or tval is None:
            target[key] = _clean(pval)
            state.set(kpath, target[key])
            _check_copied({key: target[key]}, path, state, pod)
            continue
        if isinstance(pval, Mapping):
            if isinstance(tval, dict):
                _merge_mapping(tval, pval, kpath, state, kpod)
            else:
                state.conflict(kpath, tval, pval)
        elif isinstance(pval, list):
            if isinstance(tval, list):
                target[key] = _merge_list(tval, pval, key, kpath, state, kpod)
            else:
                state.conflict(kpath, tval, pval)
        elif isinstance(tval, (Mapping, list)):
            state.conflict(kpath, tval, pval)
        else:
            target[key] = pval
            state.set(kpath, pval)


def _merge_list(target: list[Any], patch: list[Any], key: str, path: KeyPath, state: _State, pod: bool) -> list[Any]:
    if not pod or key in POD_SPEC_ATOMIC_LISTS:
        new = _clean(patch)
        state.set(path, new)
        _check_copied(new, path, state, pod)
        return list(new)
    merge_key = POD_SPEC_MERGE_KEYS.get(key)
    if merge_key is not None:
        for i, item in enumerate(patch):
            if not _has_merge_key(item, merge_key):
                state.errors.append(_missing_key_error((*path, i), key, merge_key, item))
                continue
            match = next(
                (j for j, old in enumerate(target) if isinstance(old, dict) and old.get(merge_key) == item[merge_key]),
                None,
            )
            if match is None:
                target.append(_clean(item))
                state.set((*path, len(target) - 1), target[-1])
                _check_copied(target[-1], (*path, len(target) - 1), state, True)
            else:
                _merge_mapping(target[match], item, (*path, match), state, True)
        return target
    for item in patch:
        new = _clean(item)
        if new not in target:
            target.append(new)
            state.set((*path, len(target) - 1), new)
            _check_copied(new, (*path, len(target) - 1), state, True)
    return target


def _has_merge_key(item: Any, merge_key: str) -> bool:
    return isinstance(item, Mapping) and item.get(merge_key) is not None


def _missing_key_error(path: KeyPath, key: str, merge_key: str, item: Any) -> str:
    if not isinstance(item, Mapping):
        return f"{format_path(path)}: an item of `{key}` must be a mapping, got {_kind(item)}"
    return f"{format_path(path)}: an item of `{key}` needs `{merge_key}`: items of `{key}` merge on it"


def _check_copied(value: Any, path: KeyPath, state: _State, pod: bool) -> None:
    """A value copied in whole (nothing below it to merge with): within a pod
    spec, every item of a keyed list must still carry its merge key, or later
    layers (and the manifest) could not merge into it."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            kpath = (*path, k)
            kpod = pod or is_pod_spec_path(kpath)
            if kpod and isinstance(v, list) and k in POD_SPEC_MERGE_KEYS:
                for i, item in enumerate(v):
                    if not _has_merge_key(item, POD_SPEC_MERGE_KEYS[k]):
                        state.errors.append(_missing_key_error((*kpath, i), k, POD_SPEC_MERGE_KEYS[k], item))
            _check_copied(v, kpath, state, kpod)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_copied(v, (*path, i), state, pod)
