"""Render one run: manifest text in, the exact Kubernetes objects out.

:func:`render_run` is pure and deterministic (no cluster, no git, no clock):
the same inputs give the same objects. It is what ``jobsup render`` prints
and what the Kubernetes backend creates, in this order:

1. replace ``{{JOBSUP_RUN}}`` with the run id (:mod:`.manifest`);
2. parse the YAML documents, flatten ``kind: List`` (:mod:`.manifest`);
3. lint the contract, reporting every violation (:mod:`.lint`);
4. merge the effective ``kubernetes.pod_config`` into the primary Job's pod
   template with the Kubernetes patch-merge rules, the manifest lowest
   (:func:`supervisord.shared.config.merge.merge_pod_spec`), and lint the primary Job
   again (a patch could break the contract);
5. inject the contract: namespace, run labels, deadline, TTL, backoffLimit 0,
   ``JOBSUP_SCRIPT`` (the gated script of :mod:`.script`), Python env, the
   ``jobsup-env`` Secret, the default-container annotation (:mod:`.inject`);
6. apply the sandbox options (:mod:`.sandbox`);
7. add ``kubernetes.custom_metadata`` labels and annotations to every object
   and to the primary pod template (jobsup's own ``jobsup.io/`` labels win
   and may not be set there).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

from supervisord.shared.config.merge import merge_pod_spec
from supervisord.shared.exceptions import ConfigError, ManifestError
from supervisord.shared.manifest.inject import ENV_SECRET, inject_contract, run_labels
from supervisord.shared.manifest.lint import (
    LintResult,
    contract_error,
    describe,
    lint_manifest,
    lint_primary_job,
)
from supervisord.shared.manifest.load import check_run_id, parse_manifest, substitute_run_token
from supervisord.shared.manifest.sandbox import apply_sandbox_options
from supervisord.shared.manifest.script import gated_script

__all__ = [
    "DEFAULT_STAGING_TIMEOUT_S",
    "RenderedRun",
    "objects_to_json",
    "objects_to_yaml",
    "render_run",
]

#: How long the gated script waits for the source once its container runs, in
#: seconds, when the config does not say (``kubernetes.staging_timeout_s``).
DEFAULT_STAGING_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class RenderedRun:
    """The objects one run creates.

    ``objects``: every object, in creation order (the manifest's order), as
    JSON-compatible dicts. ``primary_job``: the primary Job (the same dict as
    in ``objects``). ``script_container``: the name of the container that runs
    the task (the pod's default container; the source is staged into it).
    ``notes``: one line per author value jobsup overrode or a risk it saw
    (e.g. ``Job/train-…: spec.backoffLimit 3 overridden to 0 …``), for stderr.
    """

    objects: list[dict[str, Any]]
    primary_job: dict[str, Any]
    script_container: str
    notes: list[str]

    @property
    def primary_job_name(self) -> str:
        """The primary Job's ``metadata.name``."""
        return str(self.primary_job["metadata"]["name"])


def render_run(
    manifest_text: str,
    *,
    run_id: str,
    project: str,
    name: str,
    command: str,
    namespace: str,
    timeout_s: int,
    staging_timeout_s: int,
    kube_config: Mapping[str, Any],
    manifest_path: str,
    env_secret: str = ENV_SECRET,
) -> RenderedRun:
    """Render the run ``run_id`` (12 lowercase hex) of task ``name`` in
    ``project`` from the manifest text (read from the recorded commit at
    ``manifest_path``, which errors name).

    ``command`` is the task's bash command; ``namespace`` the configured
    namespace; ``timeout_s`` (seconds, > 0) becomes ``activeDeadlineSeconds``
    unless the manifest sets it; ``staging_timeout_s`` (seconds, > 0) bounds
    the script's wait for the source; ``kube_config`` is the effective
    ``kubernetes:`` config section (``pod_config``, ``custom_metadata`` and
    the sandbox options are read from it; other keys are ignored);
    ``env_secret`` is the name of the env Secret every container reads
    through ``envFrom`` (default ``jobsup-env``; the Kubernetes backend passes
    a per-run ``jobsup-env-<run id>``, so concurrent submits never share one).

    Raises ManifestError (``errors``: every violation, each naming
    ``manifest_path``, the object and the key) when the manifest breaks the
    contract, including after the pod patch and the sandbox mounts;
    ConfigError when a config value cannot be applied.
    """
    check_run_id(run_id)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s <= 0:
        raise ManifestError(f"the run timeout must be a positive number of seconds, got {timeout_s!r}")
    if not command.strip():
        raise ManifestError("the task has no command to run: give `run:` in the task YAML or a command after --")

    objects = parse_manifest(substitute_run_token(manifest_text, run_id), manifest_path=manifest_path)
    lint = lint_manifest(objects, namespace=namespace, manifest_path=manifest_path)
    job = objects[lint.primary_index]
    who = describe(job, lint.primary_index)

    pod_config = kube_config.get("pod_config")
    if pod_config:
        if not isinstance(pod_config, Mapping):
            raise ConfigError("kubernetes.pod_config must be a mapping shaped like a pod template (metadata, spec)")
        job["spec"]["template"] = merge_pod_spec(job["spec"]["template"], pod_config)
        errors, script_container = lint_primary_job(job, lint.primary_index)
        if errors:
            errors = [f"{e} (after merging kubernetes.pod_config)" for e in errors]
            raise contract_error(manifest_path, errors, what="with kubernetes.pod_config merged")
        lint = LintResult(primary_index=lint.primary_index, script_container=script_container)

    notes = [
        f"{describe(obj, i)}: metadata.name does not contain {{{{JOBSUP_RUN}}}}; a second run fails "
        "with AlreadyExists while this one's object exists"
        for i, obj in enumerate(objects)
        if run_id not in str(obj["metadata"]["name"])
    ]
    custom_labels, custom_annotations = _custom_metadata(kube_config)
    if custom_labels or custom_annotations:
        for obj in [*objects, job["spec"].setdefault("template", {})]:
            meta = obj.setdefault("metadata", {})
            if custom_labels:
                meta.setdefault("labels", {}).update(custom_labels)
            if custom_annotations:
                meta.setdefault("annotations", {}).update(custom_annotations)

    script = gated_script(command, staging_timeout_s=staging_timeout_s)
    labels = run_labels(run_id=run_id, project=project, name=name)
    notes += inject_contract(
        objects, lint, namespace=namespace, labels=labels, timeout_s=timeout_s, script=script, env_secret=env_secret
    )
    try:
        notes += apply_sandbox_options(job, script_container=lint.script_container, kube_config=kube_config, who=who)
    except ManifestError as exc:
        # The manifest's script container and the config's mounts collide.
        raise contract_error(manifest_path, exc.errors, what="with kubernetes.pvc_mounts / secret_mounts") from None
    return RenderedRun(objects=objects, primary_job=job, script_container=lint.script_container, notes=notes)


def _custom_metadata(kube_config: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    custom = kube_config.get("custom_metadata")
    if not custom:
        return {}, {}
    if not isinstance(custom, Mapping):
        raise ConfigError("kubernetes.custom_metadata must be a mapping with `labels` and/or `annotations`")
    out: list[dict[str, str]] = []
    for field in ("labels", "annotations"):
        values = custom.get(field) or {}
        if not isinstance(values, Mapping):
            raise ConfigError(f'kubernetes.custom_metadata.{field} must be a mapping of key: "string value"')
        for key, value in values.items():
            if not isinstance(value, str):
                raise ConfigError(f"kubernetes.custom_metadata.{field}.{key} must be a string; quote it")
            if str(key).startswith("jobsup.io/"):
                raise ConfigError(
                    f"kubernetes.custom_metadata.{field}.{key}: the jobsup.io/ prefix is jobsup's own; use another key"
                )
        out.append({str(k): v for k, v in values.items()})
    return out[0], out[1]


class _Dumper(yaml.SafeDumper):
    """Block YAML; multi-line strings (the script) in literal ``|`` style."""


# What Go's YAML decoders (sigs.k8s.io/yaml, used by kubectl) read as a
# number when plain, although YAML 1.1 (PyYAML) reads some of it, e.g.
# "012345678901" (a possible run id), as a string.
_GO_NUMBER = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ("'" if _GO_NUMBER.fullmatch(value) else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def objects_to_yaml(objects: list[dict[str, Any]]) -> str:
    """``objects`` as a multi-document YAML stream (``---`` between objects),
    keys in their order, multi-line strings as literal blocks; what
    ``kubectl create -f -`` accepts."""
    return yaml.dump_all(
        objects,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        explicit_start=True,
        width=4096,
    )


def objects_to_json(objects: list[dict[str, Any]]) -> str:
    """``objects`` as one JSON ``v1`` List (``{"apiVersion": "v1", "kind":
    "List", "items": [...]}``), indented; what ``kubectl create -f -`` accepts."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2, ensure_ascii=False) + "\n"
