"""Lint: does a parsed manifest keep the jobsup run contract?

:func:`lint_manifest` checks every rule and reports every violation at once
(one line each, naming the object as ``Kind/name`` and what to change), in a
single ManifestError. The rules (docs/kubernetes.md, "The rules"):

- every object has ``apiVersion``, ``kind`` and ``metadata.name``;
  ``generateName`` is rejected (jobsup must know exactly what it created, to
  cancel it); a ``metadata.namespace`` other than the configured namespace is
  rejected; cluster-scoped kinds are rejected (runs live in one namespace);
- at least one ``batch/v1`` Job; with several, exactly one carries the label
  ``jobsup.io/primary: "true"``;
- the primary Job runs one pod: ``completions`` and ``parallelism`` must be 1
  when set, and ``completionMode: Indexed`` is rejected (the source snapshot
  is staged into one pod);
- the primary pod's ``restartPolicy`` is ``Never`` (a restarted container
  would not have the staged source);
- exactly one container of the primary Job references ``JOBSUP_SCRIPT`` in
  ``command`` or ``args`` (a container mentioning it in both counts once);
- a bare ``$JOBSUP_SCRIPT`` / ``${JOBSUP_SCRIPT}`` argument is rejected:
  Kubernetes expands only ``$(VAR)`` in command/args
  (https://kubernetes.io/docs/tasks/inject-data-application/define-command-argument-container/#use-environment-variables-to-define-arguments),
  and bash given the bare text word-splits the script and never parses its
  ``;``/newline separators: it runs ``set`` with the rest of the script as
  positional parameters, so the command never runs and the container exits 0.
  ``eval "$JOBSUP_SCRIPT"`` and ``$(JOBSUP_SCRIPT)`` work.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from supervisord.shared.exceptions import ManifestError

__all__ = [
    "CLUSTER_SCOPED_KINDS",
    "EVAL_FORM",
    "PRIMARY_LABEL",
    "SCRIPT_ENV",
    "LintResult",
    "contract_error",
    "describe",
    "lint_manifest",
    "lint_primary_job",
]

#: The label that picks the primary Job when the manifest has several.
PRIMARY_LABEL = "jobsup.io/primary"
#: The env var holding the gated script; the script container references it.
SCRIPT_ENV = "JOBSUP_SCRIPT"
#: The form that runs the script, named in error messages.
EVAL_FORM = 'command: ["bash", "-c", "eval \\"$JOBSUP_SCRIPT\\""]'

#: Kinds that are not namespaced (``kubectl api-resources --namespaced=false``,
#: Kubernetes 1.31, plus well-known extension kinds). A run lives in one
#: namespace, and jobsup deletes what it created on cancel, so it never
#: creates cluster-wide objects.
CLUSTER_SCOPED_KINDS: frozenset[str] = frozenset(
    {
        "APIService",
        "CertificateSigningRequest",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterTrustBundle",
        "ComponentStatus",
        "CSIDriver",
        "CSINode",
        "CustomResourceDefinition",
        "DeviceClass",
        "FlowSchema",
        "IngressClass",
        "IPAddress",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "MutatingWebhookConfiguration",
        "Namespace",
        "Node",
        "PersistentVolume",
        "PriorityClass",
        "PriorityLevelConfiguration",
        "ResourceSlice",
        "RuntimeClass",
        "SelfSubjectAccessReview",
        "SelfSubjectReview",
        "SelfSubjectRulesReview",
        "ServiceCIDR",
        "StorageClass",
        "StorageVersion",
        "StorageVersionMigration",
        "SubjectAccessReview",
        "TokenReview",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
        "VolumeAttachment",
        # common extensions
        "ClusterIssuer",
        "ClusterPolicy",
        "ClusterQueue",
        "ResourceFlavor",
    }
)

# DNS-1123 subdomain: what metadata.name must be for most kinds
# (k8s.io/apimachinery/pkg/util/validation IsDNS1123Subdomain).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BARE_REFS = {f"${SCRIPT_ENV}", f"${{{SCRIPT_ENV}}}"}


@dataclasses.dataclass(frozen=True)
class LintResult:
    """A manifest that keeps the contract: ``primary_index`` is the primary
    Job's position in the object list; ``script_container`` is the name of the
    container (in ``spec.template.spec.containers``) that runs the script."""

    primary_index: int
    script_container: str


def describe(obj: Mapping[str, Any], index: int) -> str:
    """How errors name an object: ``Kind/name``, else ``Kind #N`` (1-based
    position in the manifest) when it has no usable name."""
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) and obj.get("kind") else "object"
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if isinstance(name, str) and name:
        return f"{kind}/{name}"
    return f"{kind} #{index + 1}"


def _is_batch_job(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == "Job" and obj.get("apiVersion") == "batch/v1"


def contract_error(manifest_path: str, errors: Sequence[str], *, what: str = "") -> ManifestError:
    """The ManifestError for contract violations ``errors`` of the manifest
    at repository-relative ``manifest_path``: each line (``.errors``, as
    the API, the MCP tools and the web page show them) starts with that
    path, and the message says ``PATH breaks the jobsup run contract (N
    problems):`` (``what``, e.g. ``with kubernetes.pod_config merged``,
    after PATH) then the lines."""
    lines = [f"{manifest_path}: {e}" for e in errors]
    count = "1 problem" if len(lines) == 1 else f"{len(lines)} problems"
    head = f"{manifest_path}{' ' + what if what else ''} breaks the jobsup run contract ({count}):"
    return ManifestError(head + "".join(f"\n  - {e}" for e in lines), errors=lines)


def lint_manifest(objects: Sequence[Mapping[str, Any]], *, namespace: str, manifest_path: str) -> LintResult:
    """Check ``objects`` (parsed, flattened, token already replaced) against
    the run contract for a run in ``namespace``; ``manifest_path`` is the
    manifest's repository-relative path, which every error names.

    Returns the primary Job and the script container. Raises ManifestError
    (:func:`contract_error`) whose ``errors`` lists every violation (one
    line each, naming the file, the object as ``Kind/name``, the key and
    the change to make) when any rule is broken.
    """
    errors: list[str] = []
    for index, obj in enumerate(objects):
        errors.extend(_lint_object(obj, index, namespace))

    jobs = [i for i, obj in enumerate(objects) if _is_batch_job(obj)]
    primary: int | None = None
    if not jobs:
        errors.append(
            "kind: the manifest has no batch/v1 Job: add one (apiVersion: batch/v1, kind: Job); "
            "its completion or failure is the run's outcome"
        )
    elif len(jobs) == 1:
        primary = jobs[0]
    else:
        primary = _pick_primary(objects, jobs, errors)

    script_container = ""
    if primary is not None:
        job_errors, script_container = _lint_primary(objects[primary], primary)
        errors.extend(job_errors)
    if errors:
        raise contract_error(manifest_path, errors)
    assert primary is not None
    return LintResult(primary_index=primary, script_container=script_container)


def lint_primary_job(job: Mapping[str, Any], index: int = 0) -> tuple[list[str], str]:
    """Check only the primary-Job rules (one pod, ``restartPolicy: Never``,
    one script container, no bare reference) on ``job``.

    Returns ``(errors, script_container)``; ``script_container`` is ``""``
    when there are errors about it. Used again after a config pod patch is
    merged into the Job, which could break these rules.
    """
    return _lint_primary(job, index)


def _lint_object(obj: Mapping[str, Any], index: int, namespace: str) -> list[str]:
    errors: list[str] = []
    who = describe(obj, index)
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not api_version:
        errors.append(f"{who}: apiVersion is missing; set it (e.g. batch/v1 for a Job, v1 for a Service)")
    if not isinstance(kind, str) or not kind:
        errors.append(f"{who}: kind is missing; set it (e.g. Job, Service, ConfigMap)")
    elif kind in CLUSTER_SCOPED_KINDS:
        errors.append(
            f"{who}: kind {kind} is cluster-scoped; a run creates only namespaced objects in namespace "
            f"{namespace!r} — create it outside jobsup (e.g. with kubectl) and remove it from the manifest"
        )
    elif kind == "Job" and str(api_version).startswith("batch/") and api_version != "batch/v1":
        errors.append(f"{who}: apiVersion {api_version!r} is not served for Jobs; use apiVersion: batch/v1")

    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        errors.append(
            f"{who}: metadata is missing; set metadata.name (use {{{{JOBSUP_RUN}}}} in it to keep names unique per run)"
        )
        return errors
    name = meta.get("name")
    if "generateName" in meta:
        errors.append(
            f"{who}: metadata.generateName is not supported (jobsup must know exactly what it created, "
            "to cancel it); set metadata.name instead, e.g. name: train-{{JOBSUP_RUN}}"
        )
    if not isinstance(name, str) or not name:
        if "generateName" not in meta:
            errors.append(
                f"{who}: metadata.name is missing; every object needs one "
                "(use {{JOBSUP_RUN}} in it to keep names unique per run, e.g. train-{{JOBSUP_RUN}})"
            )
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(
            f"{who}: metadata.name {name!r} is not a valid Kubernetes name "
            "(lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )
    elif _is_batch_job(obj) and len(name) > 63:
        errors.append(
            f"{who}: metadata.name: a Job name may have at most 63 characters (it becomes a pod label); shorten it"
        )
    ns = meta.get("namespace")
    if ns is not None and ns != namespace:
        errors.append(
            f"{who}: metadata.namespace is {ns!r} but runs go to the configured namespace {namespace!r}; "
            "remove metadata.namespace from the manifest (jobsup sets it)"
        )
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is None:
            continue
        if not isinstance(value, dict):
            errors.append(f'{who}: metadata.{field} must be a mapping of key: "string value"')
            continue
        for key, val in value.items():
            if not isinstance(val, str):
                errors.append(
                    f"{who}: metadata.{field}.{key} is {val!r} ({type(val).__name__}); "
                    f'quote it: {key}: "{val if not isinstance(val, bool) else str(val).lower()}"'
                )
    return errors


def _pick_primary(objects: Sequence[Mapping[str, Any]], jobs: list[int], errors: list[str]) -> int | None:
    marked: list[int] = []
    for i in jobs:
        meta = objects[i].get("metadata")
        labels = meta.get("labels") if isinstance(meta, dict) else None
        if isinstance(labels, dict) and labels.get(PRIMARY_LABEL) == "true":
            marked.append(i)
    if len(marked) == 1:
        return marked[0]
    names = ", ".join(describe(objects[i], i) for i in jobs)
    if not marked:
        errors.append(
            f"metadata.labels.{PRIMARY_LABEL}: the manifest has {len(jobs)} Jobs ({names}): label exactly one with "
            f'{PRIMARY_LABEL}: "true" so jobsup knows whose completion is the run\'s outcome'
        )
    else:
        marked_names = ", ".join(describe(objects[i], i) for i in marked)
        errors.append(
            f'metadata.labels.{PRIMARY_LABEL}: {len(marked)} Jobs are labelled {PRIMARY_LABEL}: "true" ({marked_names}); '
            "exactly one may be the primary — remove the label from the others"
        )
    return None


def _lint_primary(job: Mapping[str, Any], index: int) -> tuple[list[str], str]:
    """(errors, the name of the container that runs the script, or "") of
    the primary Job ``job`` (the ``index``-th document)."""
    who = describe(job, index)
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return [f"{who}: spec is missing; a Job needs spec.template.spec.containers"], ""
    errors = _lint_one_pod(spec, who)
    template = spec.get("template")
    pod = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(pod, dict):
        errors.append(f"{who}: spec.template.spec is missing; the Job needs a pod template with containers")
        return errors, ""
    if pod.get("restartPolicy") != "Never":
        current = pod.get("restartPolicy")
        now = f"is {current!r}" if current is not None else "is not set"
        errors.append(
            f"{who}: spec.template.spec.restartPolicy {now}; set it to Never "
            "(a restarted container would not have the staged source)"
        )
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        errors.append(f"{who}: spec.template.spec.containers is empty; the Job needs a container that runs the script")
        return errors, ""
    referencing: list[str] = []
    for ci, container in enumerate(containers):
        if not isinstance(container, dict):
            errors.append(f"{who}: spec.template.spec.containers[{ci}] is not a mapping")
            continue
        if _lint_container(container, f"{who} containers[{ci}]", who, errors):
            cname = container.get("name")
            referencing.append(cname if isinstance(cname, str) else "")
    errors += _lint_script_owner(referencing, who)
    script = referencing[0] if len(referencing) == 1 else ""
    return errors, script


def _lint_one_pod(spec: Mapping[str, Any], who: str) -> list[str]:
    """The errors of a primary Job spec that would run more than one pod."""
    errors = []
    single_pod = "jobsup stages the source snapshot into exactly one pod"
    for field in ("completions", "parallelism"):
        value = spec.get(field)
        if value is not None and value != 1:
            errors.append(
                f"{who}: spec.{field} is {value!r}; the primary Job must run one pod ({single_pod}): "
                f"remove spec.{field} or set it to 1"
            )
    if spec.get("completionMode") == "Indexed":
        errors.append(
            f"{who}: spec.completionMode Indexed is not supported; the primary Job must run one pod "
            f"({single_pod}): remove completionMode"
        )
    return errors


def _lint_container(container: Mapping[str, Any], unnamed: str, who: str, errors: list[str]) -> bool:
    """Whether ``container`` references the script in its command or args;
    its errors (a bare ``$VAR`` argument, no name on the script's
    container) appended to ``errors``. ``unnamed``: how to call it when it
    has no name."""
    cname = container.get("name")
    cwho = f"{who} container {cname!r}" if isinstance(cname, str) and cname else unnamed
    mentions = False
    for field in ("command", "args"):
        words = container.get(field)
        if words is None:
            continue
        if not isinstance(words, list):
            errors.append(f"{cwho}: {field} must be a list of strings")
            continue
        for word in words:
            if not isinstance(word, str):
                continue
            if SCRIPT_ENV in word:
                mentions = True
            if _is_bare_reference(word):
                errors.append(
                    f"{cwho}: {field} passes {word.strip()!r} as a bare argument; Kubernetes does not "
                    "expand $VAR in command/args and bash would only word-split the script, never run "
                    f"it: use {EVAL_FORM}"
                )
    if mentions and (not isinstance(cname, str) or not cname):
        errors.append(f"{cwho}: name is missing; the container that runs the script needs a name")
    return mentions


def _lint_script_owner(referencing: list[str], who: str) -> list[str]:
    """The error when not exactly one container (``referencing``) runs the script."""
    if not referencing:
        none = (
            f"{who}: spec.template.spec.containers: no container references {SCRIPT_ENV} in command or args; the container that runs the task must, "
            f"e.g. {EVAL_FORM} (the script waits for the source snapshot, extracts it and runs the command)"
        )
        return [none]
    if len(referencing) > 1:
        names = ", ".join(repr(n) for n in referencing)
        several = (
            f"{who}: spec.template.spec.containers: {len(referencing)} containers reference {SCRIPT_ENV} ({names}); exactly one "
            "container runs the task — remove the reference from the others"
        )
        return [several]
    return []


def _is_bare_reference(word: str) -> bool:
    text = word.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text in _BARE_REFS
