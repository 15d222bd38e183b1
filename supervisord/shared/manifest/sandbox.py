"""Apply the ``kubernetes:`` sandbox options of the effective config to the
primary Job's pod template (docs/kubernetes.md, "Sandbox options").

The values were validated by :mod:`supervisord.shared.config` (mount path rules
and so on); this module only places them:

==================  =====================================================
option              pod template spec
==================  =====================================================
``runtime_class``   ``runtimeClassName`` (replaces the manifest's)
``tolerations``     appended to ``tolerations`` (an identical entry is
                    not repeated)
``node_selector``   merged into ``nodeSelector`` (the config wins per key)
``pvc_mounts``      per entry ``{claim_name, mount_path, read_only=true}``:
                    a ``persistentVolumeClaim`` volume and a volumeMount on
                    the script container only
``secret_mounts``   per entry ``{secret_name, mount_path}``: a read-only,
                    non-optional ``secret`` volume and a volumeMount on the
                    script container only
==================  =====================================================

Volume names are ``jobsup-pvc-<i>`` / ``jobsup-secret-<i>``, with a ``-<n>``
suffix when the manifest already has a volume of that name. With none of
these options set nothing changes at all.

A mounted Secret is a projected volume: the kubelet refreshes its files in
place when the Secret changes, unlike ``envFrom`` values, which are fixed
at container start (https://kubernetes.io/docs/concepts/configuration/secret/#using-secrets-as-files-from-a-pod).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisord.shared.config.sandbox import check_mount_paths
from supervisord.shared.exceptions import ConfigError, ManifestError

__all__ = ["SANDBOX_KEYS", "apply_sandbox_options"]

#: The ``kubernetes:`` config keys this module applies.
SANDBOX_KEYS = ("runtime_class", "tolerations", "node_selector", "pvc_mounts", "secret_mounts")


def _option(kube_config: Mapping[str, Any], key: str, kind: type) -> Any:
    value = kube_config.get(key)
    if value is None:
        return None
    if not isinstance(value, kind):
        raise ConfigError(f"kubernetes.{key} must be a {kind.__name__}, got {type(value).__name__}")
    return value or None  # an empty list or mapping is the same as unset


def _entry_str(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key} must be a non-empty string")
    return value


def apply_sandbox_options(
    job: dict[str, Any],
    *,
    script_container: str,
    kube_config: Mapping[str, Any],
    who: str = "the primary Job",
) -> list[str]:
    """Apply the sandbox options in ``kube_config`` (the effective
    ``kubernetes:`` section) to ``job``'s pod template, in place.

    ``script_container`` names the container that gets the volumeMounts;
    ``who`` names the Job in errors. Returns notes for manifest values the
    config replaced. Raises ManifestError when a config mount path collides
    with (equals or nests with) a volumeMount the script container already
    has, or breaks the mount path rules (both checked by
    :func:`supervisord.shared.config.sandbox.check_mount_paths`), and ConfigError when
    an option has the wrong shape.
    """
    notes: list[str] = []
    runtime_class = _option(kube_config, "runtime_class", str)
    tolerations = _option(kube_config, "tolerations", list)
    node_selector = _option(kube_config, "node_selector", dict)
    pvc_mounts = _option(kube_config, "pvc_mounts", list)
    secret_mounts = _option(kube_config, "secret_mounts", list)
    if not any((runtime_class, tolerations, node_selector, pvc_mounts, secret_mounts)):
        return notes

    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    if runtime_class:
        old = pod.get("runtimeClassName")
        if old is not None and old != runtime_class:
            notes.append(f"{who}: runtimeClassName {old!r} replaced by kubernetes.runtime_class {runtime_class!r}")
        pod["runtimeClassName"] = runtime_class
    if tolerations:
        current = pod.get("tolerations")
        merged = list(current) if isinstance(current, list) else []
        for toleration in tolerations:
            if toleration not in merged:
                merged.append(dict(toleration))
        pod["tolerations"] = merged
    if node_selector:
        current = pod.get("nodeSelector")
        selector = dict(current) if isinstance(current, dict) else {}
        for key, value in node_selector.items():
            if key in selector and selector[key] != value:
                notes.append(
                    f"{who}: nodeSelector {key}={selector[key]!r} replaced by kubernetes.node_selector {value!r}"
                )
            selector[key] = value
        pod["nodeSelector"] = selector
    if pvc_mounts or secret_mounts:
        _mount(pod, script_container, pvc_mounts or [], secret_mounts or [], who)
    return notes


def _mount(
    pod: dict[str, Any],
    script_container: str,
    pvc_mounts: list[Any],
    secret_mounts: list[Any],
    who: str,
) -> None:
    container = next(c for c in pod["containers"] if isinstance(c, dict) and c.get("name") == script_container)
    mounts_now = container.get("volumeMounts")
    mounts: list[Any] = list(mounts_now) if isinstance(mounts_now, list) else []
    existing = [m["mountPath"] for m in mounts if isinstance(m, dict) and isinstance(m.get("mountPath"), str)]

    planned: list[tuple[str, dict[str, Any], dict[str, Any]]] = []  # (mount path, volume source, mount extras)
    for i, entry in enumerate(pvc_mounts):
        where = f"kubernetes.pvc_mounts[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a mapping with claim_name, mount_path and read_only")
        claim = _entry_str(entry, "claim_name", where)
        path = _entry_str(entry, "mount_path", where)
        read_only = entry.get("read_only", True)
        if not isinstance(read_only, bool):
            raise ConfigError(f"{where}.read_only must be true or false")
        planned.append(
            (path, {"persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}, {"readOnly": read_only})
        )
    n_pvc = len(planned)
    for i, entry in enumerate(secret_mounts):
        where = f"kubernetes.secret_mounts[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a mapping with secret_name and mount_path")
        secret = _entry_str(entry, "secret_name", where)
        path = _entry_str(entry, "mount_path", where)
        planned.append((path, {"secret": {"secretName": secret, "optional": False}}, {"readOnly": True}))

    problems = check_mount_paths([p for p, _, _ in planned], existing)
    if problems:
        errors = [f"{who} container {script_container!r}: {p}" for p in problems]
        summary = "kubernetes.pvc_mounts / secret_mounts cannot be mounted on the script container:"
        raise ManifestError(summary + "".join(f"\n  - {e}" for e in errors), errors=errors)

    volumes_now = pod.get("volumes")
    volumes: list[Any] = list(volumes_now) if isinstance(volumes_now, list) else []
    taken = {v.get("name") for v in volumes if isinstance(v, dict)}
    for index, (path, source, extras) in enumerate(planned):
        base = f"jobsup-pvc-{index}" if index < n_pvc else f"jobsup-secret-{index - n_pvc}"
        name, suffix = base, 0
        while name in taken:
            suffix += 1
            name = f"{base}-{suffix}"
        taken.add(name)
        volumes.append({"name": name, **source})
        mounts.append({"name": name, "mountPath": path, **extras})
    pod["volumes"] = volumes
    container["volumeMounts"] = mounts
