"""Shared builders for the manifest contract tests (not a test module)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import yaml

from supervisord.daemon.backends.kubernetes import RenderedRun, render_run

RUN_ID = "3f2a9c1e7b04"
EVAL_COMMAND = ["bash", "-c", 'eval "$JOBSUP_SCRIPT"']


def job(name: str = "train-{{JOBSUP_RUN}}", **spec: Any) -> dict[str, Any]:
    """A minimal valid primary Job; ``spec`` keys are set on the Job spec."""
    doc: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "run", "image": "python:3.12", "command": list(EVAL_COMMAND)}],
                }
            }
        },
    }
    doc["spec"].update(spec)
    return doc


def service(name: str = "rendezvous-{{JOBSUP_RUN}}") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "selector": {"jobsup.io/run": "{{JOBSUP_RUN}}"}, "ports": [{"port": 29500}]},
    }


def container(doc: dict[str, Any], index: int = 0) -> dict[str, Any]:
    c: dict[str, Any] = doc["spec"]["template"]["spec"]["containers"][index]
    return c


def docs_text(*docs: Mapping[str, Any]) -> str:
    return yaml.safe_dump_all([copy.deepcopy(dict(d)) for d in docs], sort_keys=False)


def render(
    text: str,
    *,
    kube_config: Mapping[str, Any] | None = None,
    namespace: str = "default",
    timeout_s: int = 14400,
    command: str = "python train.py",
) -> RenderedRun:
    return render_run(
        text,
        run_id=RUN_ID,
        project="My Project!",
        name="train",
        command=command,
        namespace=namespace,
        timeout_s=timeout_s,
        staging_timeout_s=600,
        kube_config=kube_config or {},
        manifest_path=".jobsup/k8s.yaml",
    )


def env_of(c: Mapping[str, Any]) -> dict[str, Any]:
    """name -> value of a container's env; fails on duplicate names."""
    names = [e["name"] for e in c.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}
