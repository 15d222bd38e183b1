"""What the runtime modules share about one run: its settings (from the
RunSpec), what the backend keeps in memory about it, and the errors that
end it.

- :class:`RunSettings` — the run's ``kubernetes:`` settings, read from the
  effective config recorded at submit (``spec.config["kubernetes"]``) and
  the task's manifest path; :func:`render_spec` renders the manifest of the
  recorded commit with them.
- :class:`RunState` — per run, in memory: a lock, whether a cancel arrived,
  the objects created so far.
- :class:`RunFailed` (a BackendError carrying the run's ``reason``) and
  :class:`StartCanceled` (a cancel arrived while the run was starting).

Pure of the cluster: nothing here talks to the API server.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from supervisord.daemon.backends.base import RunSpec
from supervisord.daemon.backends.kubernetes.client.resources import ObjectRef
from supervisord.shared.exceptions import ConfigError, RunFailed
from supervisord.shared.manifest.inject import env_secret_name
from supervisord.shared.manifest.load import load_manifest_at_commit, manifest_path_for
from supervisord.shared.manifest.render import DEFAULT_STAGING_TIMEOUT_S, RenderedRun, render_run

__all__ = [
    "DEFAULT_POD_READY_TIMEOUT_S",
    "RunFailed",
    "RunSettings",
    "RunState",
    "StartCanceled",
    "env_digests",
    "reason_of",
    "render_spec",
    "wall_to_monotonic",
]

#: ``kubernetes.pod_ready_timeout_s`` when the recorded config has none.
DEFAULT_POD_READY_TIMEOUT_S = 90


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The run's ``kubernetes:`` settings, from the recorded effective config."""

    context: str | None
    namespace: str
    pod_ready_timeout_s: int
    manifest_path: str
    kube: Mapping[str, Any]

    @classmethod
    def of(cls, spec: RunSpec) -> RunSettings:
        """The settings of ``spec``. Raises ConfigError for a ``kubernetes``
        section that is not a mapping or a bad ``pod_ready_timeout_s``."""
        kube = spec.config.get("kubernetes") or {}
        if not isinstance(kube, Mapping):
            raise ConfigError("kubernetes: must be a mapping in the effective config")
        timeout = kube.get("pod_ready_timeout_s") or DEFAULT_POD_READY_TIMEOUT_S
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
            raise ConfigError(
                f"kubernetes.pod_ready_timeout_s must be a positive whole number of seconds, got {timeout!r}"
            )
        task_manifest = spec.manifest
        return cls(
            context=str(kube["context"]) if kube.get("context") else None,
            namespace=str(kube.get("namespace") or "default"),
            pod_ready_timeout_s=timeout,
            manifest_path=manifest_path_for(str(task_manifest) if task_manifest else None, kube),
            kube=kube,
        )


def attempt_name(name: str, attempt: int, *, limit: int = 63) -> str:
    """``name`` for attempt ``attempt`` of a retried run (supervisord.shared.retry):
    ``name`` itself for the first, ``<name>-a<N>`` after (the name cut to
    keep within ``limit`` characters: a Job's name is a label value)."""
    if attempt <= 1:
        return name
    suffix = f"-a{attempt}"
    return name[: limit - len(suffix)].rstrip("-.") + suffix


def attempt_env_secret(spec: RunSpec) -> str:
    """The name of the run's env Secret for ``spec.attempt``
    (``jobsup-env-<run>``, ``jobsup-env-<run>-a<N>`` for a retry: the
    first attempt's stays with its Job)."""
    return attempt_name(env_secret_name(spec.run_id), spec.attempt, limit=253)


async def render_spec(spec: RunSpec, settings: RunSettings, *, limiter: anyio.CapacityLimiter) -> RenderedRun:
    """Render the run's objects from the manifest at the recorded commit
    (git runs in a worker thread under ``limiter``). For attempt N > 1 of a
    retried run the primary Job is ``<name>-a<N>`` and its env Secret
    :func:`attempt_env_secret` (the earlier attempts' objects keep their
    names). Raises ManifestError, ConfigError, SourceError."""
    text = await anyio.to_thread.run_sync(
        load_manifest_at_commit, Path(spec.repo), spec.commit, settings.manifest_path, limiter=limiter
    )
    rendered = render_run(
        text,
        run_id=spec.run_id,
        project=spec.project,
        name=spec.name,
        command=spec.command,
        namespace=settings.namespace,
        timeout_s=spec.timeout_s,
        staging_timeout_s=max(DEFAULT_STAGING_TIMEOUT_S, settings.pod_ready_timeout_s + 60),
        kube_config=settings.kube,
        manifest_path=settings.manifest_path,
        env_secret=attempt_env_secret(spec),
    )
    if spec.attempt > 1:
        meta = rendered.primary_job["metadata"]
        meta["name"] = attempt_name(str(meta["name"]), spec.attempt)
    return rendered


def env_digests(spec: RunSpec) -> dict[str, str | None]:
    """NAME -> the digest the Submitted event recorded for it (the daemon's
    keyed hash; None when it has none): never a value."""
    digests = spec.env_digests
    return {name: (str(digests[name]) if digests.get(name) is not None else None) for name in sorted(spec.env)}


def wall_to_monotonic(rfc3339: str | None, plus_s: float) -> float:
    """The monotonic time of (an RFC 3339 instant + ``plus_s``); now + plus_s
    when the instant is missing."""
    now_wall, now_mono = time.time(), time.monotonic()
    if not rfc3339:
        return now_mono + plus_s
    try:
        when = dt.datetime.fromisoformat(rfc3339).timestamp()
    except ValueError:
        return now_mono + plus_s
    return now_mono + (when + plus_s - now_wall)


class StartCanceled(RunFailed):
    """A cancel arrived while the run was starting (the supervisor records CANCELED)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "Canceled")


def reason_of(err: BaseException, default: str) -> str:
    """``err.reason`` when it is a non-empty string, else ``default``."""
    reason = getattr(err, "reason", None)
    return reason if isinstance(reason, str) and reason else default


class RunState:
    """What the backend keeps in memory about one run: ``lock`` (held while
    an object is created, so a cancel sees every one), ``canceled``, and
    ``created`` (the objects created so far, oldest first)."""

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.canceled = False
        self.created: list[ObjectRef] = []
