"""Turning a submit request into a :class:`Plan` for :meth:`Supervisor.submit`.

Runs in the daemon. Order matters: everything that can reject the request
(task fields, config layers, allowed backends, git source) is checked before
anything is recorded, so bad input never leaves a half-created run.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

import anyio

from supervisord import config as cfg
from supervisord.exceptions import TaskError
from supervisord.scheduler.options import parse_scheduling
from supervisord.source import SnapshotStore, is_dirty, repo_root, resolve_commit, untracked_files
from supervisord.supervisor import env_digest
from supervisord.task import BACKENDS, DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S

__all__ = ["SubmitRequest", "Plan", "Planner"]

SHAPE_FLAGS_GPUS_HINT = (
    "for Kubernetes the manifest (.jobsup/k8s.yaml or --manifest PATH, committed) is the run's shape: "
    "set the GPU count there (resources.limits: {nvidia.com/gpu: N})"
)


@dataclasses.dataclass(frozen=True)
class SubmitRequest:
    """The body of ``POST /v1/runs``.

    ``task``: ``{name, run, backend, timeout_s, env, manifest, path}`` as the
    CLI resolved them from the task file and flags. ``layers``: the client's
    config layers (user, project, task, cli) in wire form. ``cwd``: the
    folder the CLI ran in (the repository is the one holding the task file,
    else this folder). ``rev``: the revision to snapshot.
    """

    task: Mapping[str, Any]
    layers: list[Mapping[str, Any]]
    cwd: str
    rev: str = "HEAD"
    force: bool = False
    hold: bool = False

    @classmethod
    def from_json(cls, body: Any) -> "SubmitRequest":
        """Parse a request body; raises TaskError naming the bad field."""
        if not isinstance(body, dict):
            raise TaskError("submit: the request body must be a JSON object")
        task = body.get("task")
        if not isinstance(task, dict):
            raise TaskError("submit: `task` must be an object")
        layers = body.get("layers") or []
        if not isinstance(layers, list):
            raise TaskError("submit: `layers` must be a list")
        cwd = body.get("cwd")
        if not isinstance(cwd, str) or not cwd:
            raise TaskError("submit: `cwd` must be the client's working directory")
        return cls(
            task=task, layers=layers, cwd=cwd, rev=str(body.get("rev") or "HEAD"), force=bool(body.get("force")),
            hold=bool(body.get("hold")),
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """A validated submit: the Submitted event data (secrets hashed), the
    env values and the unredacted effective config (both for the backend
    only), whether to skip the in-flight guard, and warnings for the user."""

    submitted: Mapping[str, Any]
    env: Mapping[str, str]
    config: Mapping[str, Any]
    force: bool
    warnings: list[str]


class Planner:
    """Validates submits against the daemon's config layer and snapshots sources."""

    def __init__(self, daemon_layer: cfg.Layer, snapshots: SnapshotStore, digest_key: bytes) -> None:
        self.daemon_layer = daemon_layer
        self.snapshots = snapshots
        self.digest_key = digest_key
        self._git = anyio.CapacityLimiter(4)

    async def plan(self, req: SubmitRequest) -> Plan:
        """The plan, with the warnings to show the user. Raises TaskError,
        ConfigError, SourceError."""
        task = req.task
        warnings: list[str] = []
        command = task.get("run")
        if not isinstance(command, str) or not command.strip():
            raise TaskError("no command: give `run:` in the task file or `-- CMD...` on the command line")
        timeout_s = task.get("timeout_s") or DEFAULT_TIMEOUT_S
        if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise TaskError(f"timeout must be a whole number of seconds in 1..{MAX_TIMEOUT_S}, got {timeout_s!r}")
        scheduling = parse_scheduling(task, hold=req.hold)
        env = task.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TaskError("env must map names to string values")

        client_layers = cfg.layers_from_wire(req.layers)
        # The kubeconfig's current context decides which context_configs
        # apply when no layer names a context (the same rule `render` uses).
        kube_context = await anyio.to_thread.run_sync(cfg.current_kube_context, limiter=self._git)
        effective = cfg.effective_config(self.daemon_layer, client_layers, context=kube_context)
        warnings.extend(effective.warnings)
        data = effective.data
        backend = task.get("backend") or data.get("backend") or "local"
        if backend not in BACKENDS:
            raise TaskError(f"--backend: {backend!r} is not a backend; use one of {', '.join(BACKENDS)}")
        if backend != "local" and scheduling["gpus"]:
            raise TaskError(f"--gpus: only local runs get GPUs from jobsup; {SHAPE_FLAGS_GPUS_HINT}")
        context = (data.get("kubernetes") or {}).get("context") if backend == "kubernetes" else None
        cfg.check_allowed(effective, backend, context)
        merged_env = {**{str(k): str(v) for k, v in (data.get("env") or {}).items()}, **env}

        where = Path(str(task.get("path") or req.cwd))
        repo = await anyio.to_thread.run_sync(repo_root, where, limiter=self._git)
        commit = await anyio.to_thread.run_sync(resolve_commit, repo, req.rev, limiter=self._git)
        if await anyio.to_thread.run_sync(is_dirty, repo, limiter=self._git):
            warnings.append(
                f"{repo} has uncommitted changes; they will not run (jobsup runs commit {commit[:12]})"
            )
        untracked = await anyio.to_thread.run_sync(untracked_files, repo, limiter=self._git)
        if untracked:
            shown = ", ".join(untracked[:3]) + (f" and {len(untracked) - 3} more" if len(untracked) > 3 else "")
            warnings.append(f"{len(untracked)} untracked file(s) are not in the snapshot: {shown} (git add and commit them to run them)")
        snapshot = await anyio.to_thread.run_sync(self.snapshots.create, repo, commit, limiter=self._git)
        project = str(data.get("project") or repo.name)
        name = str(task.get("name") or _default_name(command))
        submitted: dict[str, Any] = {
            "project": project,
            "name": name,
            "backend": backend,
            "command": command,
            "timeout_s": timeout_s,
            "source": {
                "repo": str(repo),
                "rev": req.rev,
                "commit": commit,
                "snapshot_sha256": snapshot.sha256,
                "snapshot_size": snapshot.size,
            },
            "env": env_digest(merged_env, self.digest_key),
            "config": cfg.redact(data),
            "task_file": str(task["path"]) if task.get("path") else None,
            "manifest": task.get("manifest"),
            "cwd": req.cwd,
            "submitted_by_uid": os.getuid(),
            "scheduling": scheduling,
        }
        return Plan(submitted=submitted, env=merged_env, config=data, force=req.force, warnings=warnings)


def _default_name(command: str) -> str:
    words = command.split()
    return Path(words[0]).name if words else "task"
