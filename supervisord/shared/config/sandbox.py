"""Semantic checks of the Kubernetes sandbox options (docs/config.md).

The JSON schema (:mod:`supervisord.shared.config.schema`) checks shapes and types;
this module checks what a schema cannot say well: Kubernetes names and label
syntax, toleration rules, mount paths, and the
``JOBSUP_K8S_POD_READY_TIMEOUT_S`` variable. Every check returns a list of error
strings (``"<key path>: <reason>"``) so that all problems are reported at once;
none raises except :func:`pod_ready_timeout_from_env`.

Options (under ``kubernetes:`` of any layer allowed to set them)::

    pod_ready_timeout_s: 90          # positive YAML integer (schema)
    runtime_class: kata              # DNS-1123 subdomain -> spec.runtimeClassName
    tolerations: [{key, operator, value, effect, tolerationSeconds}]
    node_selector: {label key: label value}
    pvc_mounts: [{claim_name, mount_path, read_only: true}]
    secret_mounts: [{secret_name, mount_path}]

Sources of the rules (Kubernetes documentation):

* names: https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
  (DNS-1123 subdomain: at most 253 characters, lowercase alphanumerics, ``-``
  and ``.``, starting and ending alphanumeric; each dot-separated label at most
  63 characters; DNS-1123 label: at most 63, no dots);
* labels: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set
  (key: optional DNS subdomain prefix and ``/``, then a name of at most 63
  characters ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``; value: empty or at
  most 63 characters of the same form);
* tolerations: https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling
  and https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/
  (operator ``Equal`` by default or ``Exists``; an empty key needs ``Exists``;
  with ``Exists`` the value must be empty; effect ``NoSchedule``,
  ``PreferNoSchedule`` or ``NoExecute``; ``tolerationSeconds`` only matters for
  ``NoExecute``; checked as in ``ValidateTolerations`` of
  k8s.io/kubernetes/pkg/apis/core/validation).

Patterns are matched with ``re.fullmatch`` (never ``$``, which would accept a
trailing newline).
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

from supervisord.shared.config.keypath import KeyPath, format_path
from supervisord.shared.exceptions import ConfigError
from supervisord.shared.secret import looks_secret

__all__ = [
    "ENV_POD_READY_TIMEOUT",
    "RESERVED_MOUNT_PATHS",
    "check_dns1123_label",
    "check_dns1123_subdomain",
    "check_kubernetes_options",
    "check_label_key",
    "check_label_value",
    "check_mount_paths",
    "check_tolerations",
    "pod_ready_timeout_from_env",
]

#: The variable read for ``kubernetes.pod_ready_timeout_s`` when no layer sets it.
ENV_POD_READY_TIMEOUT = "JOBSUP_K8S_POD_READY_TIMEOUT_S"

#: Paths a PVC or Secret mount may not equal, lie under, or be an ancestor of:
#: OS directories, ``/tmp`` (which holds the run's staging folder
#: ``/tmp/jobsup-source``), ``/dev`` (and so ``/dev/shm``) and the service
#: account token projection.
RESERVED_MOUNT_PATHS: tuple[str, ...] = (
    "/tmp",  # noqa: S108 - a mount path refused, not a file made
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/opt",
    "/run",
    "/var/run",
    "/var/lock",
    "/boot",
    "/var/run/secrets/kubernetes.io/serviceaccount",
)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_TIMEOUT_TEXT = re.compile(r"[0-9]+(\.[0-9]*)?")
_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def check_dns1123_label(name: str) -> str | None:
    """The reason ``name`` is not a DNS-1123 label (RFC 1123, as Kubernetes
    uses it for namespaces), or None when it is one: 1-63 characters,
    lowercase alphanumerics and ``-``, alphanumeric at both ends."""
    if not name:
        return "must not be empty"
    if len(name) > 63:
        return f"is {len(name)} characters long; a DNS-1123 label has at most 63"
    if not _DNS_LABEL.fullmatch(name):
        return "is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit)"
    return None


def check_dns1123_subdomain(name: str) -> str | None:
    """The reason ``name`` is not a DNS-1123 subdomain (Kubernetes object
    names such as RuntimeClass, PersistentVolumeClaim, Secret), or None: at
    most 253 characters, one or more DNS-1123 labels (each at most 63
    characters) joined by single dots."""
    if not name:
        return "must not be empty"
    if len(name) > 253:
        return f"is {len(name)} characters long; a DNS-1123 subdomain has at most 253"
    for part in name.split("."):
        if not part or len(part) > 63 or not _DNS_LABEL.fullmatch(part):
            return (
                "is not a DNS-1123 subdomain (dot-separated parts of lowercase letters, digits and '-', "
                "each 1-63 characters, starting and ending with a letter or digit)"
            )
    return None


def check_label_key(key: str) -> str | None:
    """The reason ``key`` is not a valid Kubernetes label key, or None.

    A key is ``[prefix/]name``: the optional prefix a DNS-1123 subdomain of at
    most 253 characters, the name 1-63 characters matching
    ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``.
    """
    if not key:
        return "must not be empty"
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            return "has an empty prefix before '/'"
        reason = check_dns1123_subdomain(prefix)
        if reason:
            return f"has a prefix {prefix!r} that {reason}"
    if not name:
        return "has an empty name"
    if len(name) > 63:
        return f"has a name of {len(name)} characters; at most 63"
    if not _LABEL_NAME.fullmatch(name):
        return (
            f"has a name {name!r} that is not valid (letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit)"
        )
    return None


def check_label_value(value: str) -> str | None:
    """The reason ``value`` is not a valid Kubernetes label value, or None:
    empty, or at most 63 characters matching
    ``(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?``."""
    if value == "":
        return None
    if len(value) > 63:
        return f"is {len(value)} characters long; a label value has at most 63"
    if not _LABEL_NAME.fullmatch(value):
        return (
            "is not a valid label value (letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
        )
    return None


def check_mount_paths(paths: Sequence[str], existing: Sequence[str]) -> list[str]:
    """Check mount paths that jobsup adds to the primary container
    (``pvc_mounts`` and ``secret_mounts`` together) against the rules of issue
    8 and against ``existing`` mount paths (e.g. the manifest's own
    ``volumeMounts``). Returns error strings (``"mount_path[i]: <reason>"``, i
    indexing ``paths``), empty when all is well.

    Each path must be absolute and already normalized (no ``.`` or ``..``
    segments, no ``//``, no trailing ``/``, no surrounding whitespace), not
    ``/``, and must not equal, lie under or be an ancestor of a path in
    :data:`RESERVED_MOUNT_PATHS`. No two paths may be equal or nested; no path
    may equal or nest with an ``existing`` one.
    """
    return _mount_path_errors([(f"mount_path[{i}]", p) for i, p in enumerate(paths)], existing)


def _mount_path_errors(entries: Sequence[tuple[str, str]], existing: Sequence[str]) -> list[str]:
    errors: list[str] = []
    good: list[tuple[str, str]] = []
    for where, path in entries:
        reason = _mount_path_reason(path)
        if reason:
            errors.append(f"{where}: {reason}")
        else:
            good.append((where, path))
    for i, (where_a, a) in enumerate(good):
        for where_b, b in good[:i]:
            if a == b:
                errors.append(f"{where_a}: {a!r} is also the mount path of {where_b}; mount paths must be unique")
            elif _nested(a, b):
                outer, inner = (a, b) if len(a) < len(b) else (b, a)
                errors.append(f"{where_a}: {a!r} and {b!r} ({where_b}) are nested ({inner!r} lies under {outer!r})")
        for e in existing:
            if a == e:
                errors.append(f"{where_a}: {a!r} is already a mount path of the manifest's container")
            elif _nested(a, e):
                errors.append(f"{where_a}: {a!r} is nested with the manifest's mount path {e!r}")
    return errors


def _nested(a: str, b: str) -> bool:
    return a.startswith(b + "/") or b.startswith(a + "/")


def _mount_path_reason(path: Any) -> str | None:
    if not isinstance(path, str):
        return "must be a string"  # the schema says so too; kept for direct callers
    if path != path.strip():
        return f"{path!r} has surrounding whitespace"
    if not path.startswith("/"):
        return f"{path!r} must be an absolute path"
    if ":" in path or "\0" in path:
        # Kubernetes refuses ':' in a mountPath (ValidateVolumeMounts), and
        # no path can hold a NUL byte.
        return f"{path!r} must not contain ':' or a NUL character"
    if path == "/":
        return "'/' cannot be a mount path"
    if path.startswith("//") or posixpath.normpath(path) != path:
        normal = posixpath.normpath("/" + path.lstrip("/"))
        problem = _mount_path_reason(normal)
        return f"{path!r} is not normalized (no '.' or '..' segments, no '//', no trailing '/')" + (
            f"; did you mean {normal!r}?" if problem is None else f"; and normalized, {problem}"
        )
    clashes = [r for r in RESERVED_MOUNT_PATHS if path == r or _nested(path, r)]
    if clashes:
        return (
            f"{path!r} overlaps the reserved path{'s' if len(clashes) > 1 else ''} {', '.join(clashes)} "
            "(system directories, /tmp with the staging folder, /dev and the service-account token "
            "cannot be mounted over, under or above)"
        )
    return None


def check_tolerations(tolerations: Any, path: KeyPath) -> list[str]:
    """Check a ``tolerations`` list (Kubernetes ``Toleration`` objects) beyond
    its schema: a key, when given, is a non-empty valid label key; omitting the
    key needs ``operator: Exists``; ``Exists`` takes no value; a value is a
    valid label value; ``tolerationSeconds`` (>= 0) only with ``effect:
    NoExecute``. Entries of the wrong type are left to the schema."""
    errors: list[str] = []
    if not isinstance(tolerations, list):
        return errors
    for i, item in enumerate(tolerations):
        if not isinstance(item, Mapping):
            continue
        where = format_path((*path, i))
        operator = item.get("operator", "Equal")
        key = item.get("key")
        if key is None:
            if operator != "Exists":
                errors.append(
                    f"{where}: a toleration without `key` tolerates every taint and needs `operator: Exists` "
                    f"(got operator {operator!r})"
                )
        elif isinstance(key, str):
            reason = (
                "must not be empty (omit `key` with `operator: Exists` to tolerate every taint)"
                if key == ""
                else check_label_key(key)
            )
            if reason:
                errors.append(f"{where}.key: {key!r} {reason}" if key else f"{where}.key: {reason}")
        value = item.get("value")
        if isinstance(value, str):
            if operator == "Exists" and value != "":
                errors.append(f"{where}.value: {value!r} is not allowed with `operator: Exists` (it matches any value)")
            else:
                reason = check_label_value(value)
                if reason:
                    errors.append(f"{where}.value: {value!r} {reason}")
        seconds = item.get("tolerationSeconds")
        if seconds is not None and item.get("effect") != "NoExecute":
            errors.append(
                f"{where}.tolerationSeconds: only applies with `effect: NoExecute` (got effect {item.get('effect')!r})"
            )
    return errors


def check_kubernetes_options(kubernetes: Any, path: KeyPath = ("kubernetes",)) -> list[str]:
    """Semantic checks of one ``kubernetes`` mapping (a layer's, the merged
    one, or one ``context_configs.<context>`` entry at ``path``): namespace,
    runtime_class, tolerations, node_selector, custom_metadata, pvc_mounts and
    secret_mounts (mount paths of both lists together). Values of the wrong
    type are skipped here: the schema reports them."""
    errors: list[str] = []
    if not isinstance(kubernetes, Mapping):
        return errors

    def at(*segments: str | int) -> str:
        return format_path(path + segments)

    # Empty strings are left to the schema (minLength), as are wrong types.
    namespace = kubernetes.get("namespace")
    if isinstance(namespace, str) and namespace:
        reason = check_dns1123_label(namespace)
        if reason:
            errors.append(f"{at('namespace')}: {namespace!r} {reason}")
    runtime_class = kubernetes.get("runtime_class")
    if isinstance(runtime_class, str) and runtime_class:
        reason = check_dns1123_subdomain(runtime_class)
        if reason:
            errors.append(f"{at('runtime_class')}: {runtime_class!r} {reason}")
    errors.extend(check_tolerations(kubernetes.get("tolerations"), (*path, "tolerations")))
    errors.extend(_label_map_errors(kubernetes.get("node_selector"), (*path, "node_selector"), values=True))
    metadata = kubernetes.get("custom_metadata")
    if isinstance(metadata, Mapping):
        errors.extend(_label_map_errors(metadata.get("labels"), (*path, "custom_metadata", "labels"), values=True))
        errors.extend(
            _label_map_errors(metadata.get("annotations"), (*path, "custom_metadata", "annotations"), values=False)
        )
    entries: list[tuple[str, str]] = []
    for list_key, name_key in (("pvc_mounts", "claim_name"), ("secret_mounts", "secret_name")):
        mounts = kubernetes.get(list_key)
        if not isinstance(mounts, list):
            continue
        for i, mount in enumerate(mounts):
            if not isinstance(mount, Mapping):
                continue
            name = mount.get(name_key)
            if isinstance(name, str) and name:
                reason = check_dns1123_subdomain(name)
                if reason:
                    errors.append(f"{at(list_key, i, name_key)}: {name!r} {reason}")
            mount_path = mount.get("mount_path")
            if isinstance(mount_path, str) and mount_path:
                entries.append((at(list_key, i, "mount_path"), mount_path))
    errors.extend(_mount_path_errors(entries, ()))
    return errors


def _label_map_errors(mapping: Any, path: KeyPath, *, values: bool) -> list[str]:
    errors: list[str] = []
    if not isinstance(mapping, Mapping):
        return errors
    for key, value in mapping.items():
        where = format_path((*path, key))
        if isinstance(key, str):
            reason = check_label_key(key)
            if reason:
                errors.append(f"{where}: the key {key!r} {reason}")
        if values and isinstance(value, str):
            reason = check_label_value(value)
            if reason:
                shown = "the value (not shown: the key looks secret)" if looks_secret(str(key)) else repr(value)
                errors.append(f"{where}: {shown} {reason}")
    return errors


def pod_ready_timeout_from_env(env: Mapping[str, str]) -> int | None:
    """Read ``JOBSUP_K8S_POD_READY_TIMEOUT_S`` (call only when no config layer
    sets ``kubernetes.pod_ready_timeout_s``). Returns whole seconds, or None
    when the variable is unset.

    Accepts a decimal number of seconds, optionally with a fraction
    (``"120"``, ``"120.0"``, ``" 120.9 "``), truncated to whole seconds.
    Raises ConfigError naming the variable when it is empty, not a plain
    decimal number (``abc``, ``inf``, ``nan``, ``1e3``, ``-5``), or less
    than one second after truncation (``0``, ``0.5``).
    """
    raw = env.get(ENV_POD_READY_TIMEOUT)
    if raw is None:
        return None
    text = raw.strip()
    if not _TIMEOUT_TEXT.fullmatch(text):
        shown = "empty" if not text else f"{raw!r}, not a positive number of seconds"
        raise ConfigError(
            f"{ENV_POD_READY_TIMEOUT}: {shown}; give whole seconds such as 120 "
            "(or unset it to use kubernetes.pod_ready_timeout_s, default 90)"
        )
    seconds = float(text)
    if not math.isfinite(seconds) or int(seconds) < 1:
        raise ConfigError(f"{ENV_POD_READY_TIMEOUT}: {raw!r} must be at least 1 second")
    if seconds > 604800:
        raise ConfigError(f"{ENV_POD_READY_TIMEOUT}: {raw!r} is more than the maximum of 604800 seconds (a week)")
    return int(seconds)
