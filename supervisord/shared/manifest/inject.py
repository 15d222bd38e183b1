"""Inject the run contract into a linted manifest (docs/kubernetes.md,
"What jobsup adds").

On every object: ``metadata.namespace`` and the labels ``jobsup.io/run``,
``jobsup.io/project``, ``jobsup.io/name`` (jobsup's values win over the
author's). On the primary Job:

- the same labels on the pod template, and the annotation
  ``kubectl.kubernetes.io/default-container`` naming the script container
  (so ``kubectl logs/exec/cp`` pick it; see
  https://kubernetes.io/docs/reference/labels-annotations-taints/#kubectl-kubernetes-io-default-container);
- ``spec.activeDeadlineSeconds`` from the run timeout unless the author set
  it; ``spec.ttlSecondsAfterFinished: 86400`` unless set; ``spec.backoffLimit:
  0`` always (a replacement pod would not have the staged source; an
  author's other value is overridden and a note says so);
- on the script container: ``JOBSUP_SCRIPT`` in ``env`` (every author entry
  of that name is replaced), ``PYTHONUNBUFFERED=1`` and
  ``PYTHONIOENCODING=utf-8`` unless the author set them;
- on every container and init container: ``envFrom`` the ``jobsup-env``
  Secret with ``optional: true`` unless an entry already references it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from supervisord.shared.manifest.lint import SCRIPT_ENV, LintResult, describe

__all__ = [
    "DEFAULT_CONTAINER_ANNOTATION",
    "ENV_SECRET",
    "LABEL_NAME",
    "LABEL_PROJECT",
    "LABEL_RUN",
    "TTL_SECONDS_AFTER_FINISHED",
    "env_secret_name",
    "inject_contract",
    "label_value",
    "run_labels",
]

LABEL_RUN = "jobsup.io/run"
LABEL_PROJECT = "jobsup.io/project"
LABEL_NAME = "jobsup.io/name"
#: The namespace's env Secret every primary container reads (optional).
ENV_SECRET = "jobsup-env"  # noqa: S105 - a Secret's name, not a secret


def env_secret_name(run_id: str) -> str:
    """The run's env Secret: ``jobsup-env-<run id>``, one per run, so
    concurrent submits never overwrite each other's values (not one shared
    ``jobsup-env``: a shared Secret races between submits)."""
    return f"{ENV_SECRET}-{run_id}"


DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
#: Finished Jobs are garbage-collected after a day unless the author says otherwise.
TTL_SECONDS_AFTER_FINISHED = 86400
_PYTHON_ENV = (("PYTHONUNBUFFERED", "1"), ("PYTHONIOENCODING", "utf-8"))

_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def label_value(text: str) -> str:
    """``text`` made into a valid label value: at most 63 characters of
    ``[A-Za-z0-9_.-]``, starting and ending with an alphanumeric (Kubernetes
    label value syntax, k8s.io/apimachinery IsValidLabelValue). Runs of other
    characters become ``-``; the result may be ``""`` (a valid value)."""
    value = _LABEL_EDGE.sub("", _LABEL_BAD.sub("-", text))
    return _LABEL_EDGE.sub("", value[:63])


def run_labels(*, run_id: str, project: str, name: str) -> dict[str, str]:
    """The three run labels, values made valid with :func:`label_value`."""
    return {
        LABEL_RUN: label_value(run_id),
        LABEL_PROJECT: label_value(project),
        LABEL_NAME: label_value(name),
    }


def _lead(mapping: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Reorder ``mapping`` in place so that ``keys`` (those present) come
    first, the rest keeping their order: rendered YAML reads like a manifest
    (metadata.name, then namespace; a pod template's metadata before spec)."""
    rest = dict(mapping)
    mapping.clear()
    for key in keys:
        if key in rest:
            mapping[key] = rest.pop(key)
    mapping.update(rest)


def _mapping(parent: MutableMapping[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = {}
        parent[key] = value
    return value


def inject_contract(
    objects: list[dict[str, Any]],
    lint: LintResult,
    *,
    namespace: str,
    labels: Mapping[str, str],
    timeout_s: int,
    script: str,
    env_secret: str = ENV_SECRET,
) -> list[str]:
    """Inject the contract into ``objects`` in place (they must have passed
    :func:`~supervisord.shared.manifest.lint.lint_manifest`, which gave
    ``lint``). ``timeout_s`` (seconds, > 0) becomes the primary Job's
    ``activeDeadlineSeconds`` unless set; ``script`` is the ``JOBSUP_SCRIPT``
    value; ``env_secret`` names the env Secret every container reads through
    ``envFrom`` (the backend passes its per-run ``jobsup-env-<run id>``).

    Returns notes, one line each, for every author value jobsup overrode
    (e.g. ``Job/train-…: spec.backoffLimit 3 overridden to 0 …``).
    """
    notes: list[str] = []
    for obj in objects:
        meta = _mapping(obj, "metadata")
        meta["namespace"] = namespace
        _mapping(meta, "labels").update(labels)
        _lead(meta, ("name", "namespace"))

    job = objects[lint.primary_index]
    who = describe(job, lint.primary_index)
    spec = job["spec"]
    template = _mapping(spec, "template")
    template_meta = _mapping(template, "metadata")
    _mapping(template_meta, "labels").update(labels)
    _mapping(template_meta, "annotations")[DEFAULT_CONTAINER_ANNOTATION] = lint.script_container
    _lead(template, ("metadata", "spec"))

    if spec.get("activeDeadlineSeconds") is None:
        spec["activeDeadlineSeconds"] = timeout_s
    if spec.get("ttlSecondsAfterFinished") is None:
        spec["ttlSecondsAfterFinished"] = TTL_SECONDS_AFTER_FINISHED
    backoff = spec.get("backoffLimit")
    if backoff is not None and backoff != 0:
        notes.append(
            f"{who}: spec.backoffLimit {backoff} overridden to 0 (a retried pod would not have the staged source)"
        )
    spec["backoffLimit"] = 0

    pod = template["spec"]
    for container in pod["containers"]:
        if container.get("name") == lint.script_container:
            notes.extend(_inject_script_env(container, script, who))
    for field in ("initContainers", "containers"):
        for container in pod.get(field) or []:
            if isinstance(container, dict):
                _inject_env_secret(container, env_secret)
    return notes


def _inject_script_env(container: dict[str, Any], script: str, who: str) -> list[str]:
    notes: list[str] = []
    env = container.get("env")
    if not isinstance(env, list):
        env = []
    kept = [e for e in env if not (isinstance(e, dict) and e.get("name") == SCRIPT_ENV)]
    if len(kept) != len(env):
        notes.append(
            f"{who} container {container.get('name')!r}: the author's {SCRIPT_ENV} env entry "
            "is replaced by jobsup's script"
        )
    kept.append({"name": SCRIPT_ENV, "value": script})
    present = {e.get("name") for e in kept if isinstance(e, dict)}
    for name, value in _PYTHON_ENV:
        if name not in present:
            kept.append({"name": name, "value": value})
    container["env"] = kept
    return notes


def _inject_env_secret(container: dict[str, Any], env_secret: str) -> None:
    env_from = container.get("envFrom")
    if not isinstance(env_from, list):
        env_from = []
    for entry in env_from:
        ref = entry.get("secretRef") if isinstance(entry, dict) else None
        if isinstance(ref, dict) and ref.get("name") == env_secret:
            container["envFrom"] = env_from
            return
    env_from.append({"secretRef": {"name": env_secret, "optional": True}})
    container["envFrom"] = env_from
