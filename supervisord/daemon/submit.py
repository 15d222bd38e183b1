"""Turning a submit request into a :class:`Plan` for :meth:`Supervisor.submit`.

Runs in the daemon. Order matters: everything that can reject the request
(task fields, config layers, allowed backends, git source) is checked before
anything is recorded, so bad input never leaves a half-created run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import anyio

from supervisord.daemon.outputs import check_outputs_root, outputs_root
from supervisord.shared import config as cfg
from supervisord.shared.envcheck import check_env
from supervisord.shared.exceptions import ConfigError, SourceError, TaskError
from supervisord.shared.links import check_against_snapshot, check_links_shape, resolve_links
from supervisord.shared.retry import parse_retry
from supervisord.shared.scheduling import parse_scheduling
from supervisord.shared.secret import env_digest, redact
from supervisord.shared.shellenv import DEFAULT_ENV_FROM, check_shell_env, shell_env_digest
from supervisord.shared.source import (
    ARCHIVE_TIMEOUT_S,
    Snapshot,
    SnapshotStore,
    archive_failed,
    archive_timed_out,
    disk_full,
    is_dirty,
    is_no_space,
    repo_root,
    resolve_commit,
    submodule_paths,
    untracked_files,
)
from supervisord.shared.sweep import (
    check_grid,
    check_labels,
    check_max_parallel,
    check_placeholders,
    expand,
    new_sweep_id,
    param_env,
    run_name,
    substitute,
)
from supervisord.shared.task import BACKENDS, DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S

__all__ = ["DaemonConfigCheck", "Plan", "Planner", "SubmitRequest", "SweepPlan"]

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
    else this folder). ``rev``: the revision to snapshot. ``request_id``:
    the client's random id for this submit, recorded in Submitted.
    ``umask``: the client's umask (octal text), recorded in Submitted.
    """

    task: Mapping[str, Any]
    layers: list[Mapping[str, Any]]
    cwd: str
    rev: str = "HEAD"
    force: bool = False
    hold: bool = False
    request_id: str | None = None
    umask: str | None = None
    #: The submitting shell's environment (``JOBSUP_*`` dropped), None when
    #: the client sent none (supervisord.shared.shellenv).
    shell_env: Mapping[str, str] | None = None

    @classmethod
    def from_json(cls, body: Any) -> SubmitRequest:
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
        request_id = body.get("request_id")
        if request_id is not None and (not isinstance(request_id, str) or not 0 < len(request_id) <= 64):
            raise TaskError("submit: `request_id` must be a string of 1 to 64 characters")
        umask = body.get("umask")
        if umask is not None and (not isinstance(umask, str) or not re.fullmatch(r"0?[0-7]{1,3}", umask)):
            raise TaskError('submit: `umask` must be an octal mode such as "0022"')
        return cls(
            task=task,
            layers=layers,
            cwd=cwd,
            rev=str(body.get("rev") or "HEAD"),
            force=bool(body.get("force")),
            hold=bool(body.get("hold")),
            request_id=request_id,
            umask=umask,
            shell_env=check_shell_env(body["shell_env"]) if body.get("shell_env") is not None else None,
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


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """A validated sweep: its id, the ``SweepSubmitted`` data, one
    :class:`Plan` per run (in sweep index order; one snapshot for all), and
    the warnings for the user."""

    sweep_id: str
    sweep: Mapping[str, Any]
    runs: list[Plan]
    warnings: list[str]


class Planner:
    """Validates submits against the daemon's config layer and snapshots sources."""

    def __init__(self, daemon_layer: cfg.Layer, snapshots: SnapshotStore, digest_key: bytes) -> None:
        self.daemon_layer = daemon_layer
        self.snapshots = snapshots
        self.digest_key = digest_key
        self._git = anyio.CapacityLimiter(4)
        self._daemon_config = DaemonConfigCheck()

    async def plan(self, req: SubmitRequest) -> Plan:
        """The plan, with the warnings to show the user. Raises TaskError,
        ConfigError, SourceError."""
        task = req.task
        fields = _check_task(task, hold=req.hold)
        effective, warnings = await self._effective_config(req)
        data = effective.data
        backend = task.get("backend") or data.get("backend") or "local"
        if backend not in BACKENDS:
            raise TaskError(f"--backend: {backend!r} is not a backend; use one of {', '.join(BACKENDS)}")
        slurm_asks = _shape_for_backend(backend, fields.scheduling)
        _apply_retry_policy(task, data, backend, fields.scheduling)
        context = (data.get("kubernetes") or {}).get("context") if backend == "kubernetes" else None
        cfg.check_allowed(effective, backend, context)
        if backend == "local":
            _check_local_shell(effective)
        world = await self._world(req, backend, data, fields)
        repo, commit, snapshot = await self._source(req, fields.command, world.links, warnings)
        project = str(data.get("project") or repo.name)
        name = str(task.get("name") or await self._default_name(repo, commit, fields.command))
        submitted: dict[str, Any] = {
            "project": project,
            "name": name,
            "backend": backend,
            "command": fields.command,
            "timeout_s": fields.timeout_s,
            "source": {
                "repo": str(repo),
                "rev": req.rev,
                "commit": commit,
                "snapshot_sha256": snapshot.sha256,
                "snapshot_size": snapshot.size,
            },
            "env": env_digest(world.merged_env, self.digest_key),
            "config": redact(data, self.digest_key),
            "task_file": str(task["path"]) if task.get("path") else None,
            "manifest": task.get("manifest"),
            "cwd": req.cwd,
            "submitted_by_uid": os.getuid(),
            "scheduling": fields.scheduling,
        }
        submitted.update(_optional_fields(req, slurm_asks, fields))
        if backend == "local":
            submitted.update(_world_fields(world.shell_env, world.outputs, world.links, self.digest_key))
        shell_env, merged_env = world.shell_env, world.merged_env
        run_env = {**shell_env, **merged_env} if shell_env is not None else merged_env
        return Plan(submitted=submitted, env=run_env, config=data, force=req.force, warnings=warnings)

    async def _effective_config(self, req: SubmitRequest) -> tuple[cfg.EffectiveConfig, list[str]]:
        """The effective config of the submit (daemon layer, then the
        client's), with its warnings and the daemon config drift's."""
        warnings: list[str] = []
        client_layers = cfg.layers_from_wire(req.layers)
        # The kubeconfig's current context decides which context_configs
        # apply when no layer names a context (the same rule `render` uses).
        kube_context = await anyio.to_thread.run_sync(cfg.current_kube_context, limiter=self._git)
        effective = cfg.effective_config(self.daemon_layer, client_layers, context=kube_context)
        warnings.extend(effective.warnings)
        drift = await self._daemon_config.warning(self._git)
        if drift:
            warnings.append(drift)
        return effective, warnings

    async def _world(self, req: SubmitRequest, backend: str, data: Mapping[str, Any], fields: _TaskFields) -> _World:
        """The run's environment and, for a local run, its world: the
        submitting shell's environment under the run's env, its links and
        outputs folder. Raises TaskError, ConfigError."""
        merged_env = {**{str(k): str(v) for k, v in (data.get("env") or {}).items()}, **fields.env}
        # Runs in the user's world (local runs): the submitting shell's
        # environment under the run's env, its links and outputs folder.
        shell_env = _shell_env(backend, data, req.shell_env)
        check_env(merged_env, command=fields.command, inherited=shell_env)
        links = check_links_shape(req.task.get("links"))
        if links and backend != "local":
            raise TaskError("links: only local runs get links (a Kubernetes run mounts its data: pvc_mounts)")
        outputs = outputs_root(data) if backend == "local" else None
        if outputs is not None:
            check_outputs_root(outputs)
        if links:
            home = (req.shell_env or {}).get("HOME")
            links = await anyio.to_thread.run_sync(resolve_links, links, req.cwd, home, limiter=self._git)
        return _World(merged_env=merged_env, shell_env=shell_env, links=links, outputs=outputs)

    async def _source(
        self, req: SubmitRequest, command: str, links: Mapping[str, str], warnings: list[str]
    ) -> tuple[Path, str, Snapshot]:
        """The repository, commit and snapshot of the submit; appends to
        ``warnings`` what the run will not find (uncommitted changes,
        untracked files, submodules...). Raises SourceError, TaskError."""
        task = req.task
        where = Path(str(task.get("path") or req.cwd))
        repo = await anyio.to_thread.run_sync(repo_root, where, limiter=self._git)
        commit = await anyio.to_thread.run_sync(resolve_commit, repo, req.rev, limiter=self._git)
        if await anyio.to_thread.run_sync(is_dirty, repo, limiter=self._git):
            warnings.append(f"{repo} has uncommitted changes; they will not run (jobsup runs commit {commit[:12]})")
        untracked = await anyio.to_thread.run_sync(untracked_files, repo, limiter=self._git)
        if untracked:
            shown = ", ".join(untracked[:3]) + (f" and {len(untracked) - 3} more" if len(untracked) > 3 else "")
            warnings.append(
                f"{len(untracked)} untracked file(s) are not in the snapshot: {shown} (git add and commit them to run them)"
            )
        warnings.extend(
            await anyio.to_thread.run_sync(
                _snapshot_caveats, repo, commit, task.get("path"), command, limiter=self._git
            )
        )
        snapshot = await self._snapshot(repo, commit)
        if links:
            await anyio.to_thread.run_sync(check_against_snapshot, links, snapshot.path, limiter=self._git)
        return repo, commit, snapshot

    async def plan_sweep(self, req: SubmitRequest) -> SweepPlan:
        """The plan of a sweep (the request's task has ``sweep``): the grid
        and ``max_parallel`` checked first, then :meth:`plan` once (one
        snapshot, one config) for the template, then one run per grid point
        with ``{key}`` replaced in its command (and name), its params and
        their variables. Raises TaskError naming the bad key, and what
        :meth:`plan` raises; nothing is recorded."""
        task = req.task
        grid = check_grid(task.get("sweep"), what="--sweep")
        max_parallel = check_max_parallel(task.get("max_parallel"))
        command = task.get("run")
        name = task.get("name")
        warnings = check_placeholders(
            command if isinstance(command, str) else "", name if isinstance(name, str) else None, grid
        )
        base = await self.plan(req)
        sweep_id = new_sweep_id()
        template = dict(base.submitted)
        runs: list[Plan] = []
        for index, params in enumerate(expand(grid)):
            submitted = {
                **template,
                "command": substitute(str(template["command"]), params),
                "name": run_name(str(template["name"]), params),
                "sweep_id": sweep_id,
                "sweep_index": index,
                "params": params,
            }
            if max_parallel is not None:
                submitted["sweep_max_parallel"] = max_parallel
            env = {**base.env, **param_env(params, sweep_id, index)}
            runs.append(Plan(submitted=submitted, env=env, config=base.config, force=True, warnings=[]))
        sweep: dict[str, Any] = {
            "project": template["project"],
            "name": template["name"],
            "command": template["command"],
            "grid": grid,
            "count": len(runs),
            "max_parallel": max_parallel,
        }
        for key in ("labels", "request_id"):
            if key in template:
                sweep[key] = template[key]
        return SweepPlan(sweep_id=sweep_id, sweep=sweep, runs=runs, warnings=[*base.warnings, *warnings])

    async def _default_name(self, repo: Path, commit: str, command: str) -> str:
        """The stem of the first word of ``command`` that is a file in the
        snapshot (``python train.py`` -> ``train``, ``bash scripts/eval.sh``
        -> ``eval``), else the first word's basename (``task`` for none)."""
        candidates = _file_candidates(command)
        if candidates:
            found = await anyio.to_thread.run_sync(_files_in_commit, repo, commit, candidates, limiter=self._git)
            for word in candidates:
                if word in found:
                    return Path(word).stem or Path(word).name
        return _default_name(command)

    async def source_at(self, repo: Path, rev: str) -> dict[str, Any]:
        """A Submitted ``source`` for commit ``rev`` of ``repo`` (``rerun
        --rev``): the commit resolved and snapshotted as a submit does.
        Raises SourceError naming ``--rev``."""
        if not repo.is_dir():  # noqa: ASYNC240 - one stat per rerun --rev
            raise SourceError(f"--rev {rev!r}: the run's repository {repo} is not there any more")
        commit = await anyio.to_thread.run_sync(resolve_commit, repo, rev, limiter=self._git)
        snapshot = await self._snapshot(repo, commit)
        return {
            "repo": str(repo),
            "rev": rev,
            "commit": commit,
            "snapshot_sha256": snapshot.sha256,
            "snapshot_size": snapshot.size,
        }

    async def _snapshot(self, repo: Path, commit: str) -> Snapshot:
        """:meth:`SnapshotStore.create`, cancellable: ``git archive`` runs
        as a child process that a cancel kills (a stopping daemon does not
        wait for a slow archive: git filters, LFS), the file work in worker
        threads of the git limiter. Raises SourceError."""
        snapshots, limiter = self.snapshots, self._git
        try:
            fd, tmp = await anyio.to_thread.run_sync(snapshots.new_temp, limiter=limiter)
        except OSError as err:
            if is_no_space(err):
                raise disk_full(snapshots.root, f"the source snapshot of {commit[:12]} could not be written") from err
            raise
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    with anyio.fail_after(ARCHIVE_TIMEOUT_S):
                        code, stderr = await _run_group(snapshots.archive_command(repo, commit), out)
                except TimeoutError:
                    raise archive_timed_out(repo, commit) from None
                if code != 0:  # (a full disk is checked in a thread: statvfs may block)
                    failed = functools.partial(archive_failed, repo, commit, stderr, store_root=snapshots.root)
                    raise await anyio.to_thread.run_sync(failed, limiter=limiter)
                await anyio.to_thread.run_sync(os.fsync, out.fileno(), limiter=limiter)
            return await anyio.to_thread.run_sync(snapshots.adopt, tmp, limiter=limiter)
        except OSError as err:
            if is_no_space(err):
                raise disk_full(snapshots.root, f"the source snapshot of {commit[:12]} could not be written") from err
            raise
        finally:
            tmp.unlink(missing_ok=True)


async def _run_group(command: list[str], out: IO[bytes]) -> tuple[int, bytes]:
    """Run ``command`` in a session of its own, stdout to ``out``; returns
    ``(exit code, stderr)``. If the wait is cancelled (a stop, a timeout),
    the whole process group is killed: git's filters (LFS, a smudge
    command) are its children and would outlive a kill of git alone."""
    async with await anyio.open_process(command, stdout=out, stderr=subprocess.PIPE, start_new_session=True) as proc:
        try:
            err = b""
            if proc.stderr is not None:
                async for chunk in proc.stderr:
                    err += chunk[: max(0, 65536 - len(err))]
            return await proc.wait(), err
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise


def _snapshot_caveats(repo: Path, commit: str, task_path: object, command: str) -> list[str]:
    """Warnings about what the run will not find where the user may expect
    it: submodules (empty in a ``git archive``), and the working folder when
    the task file sits in a subfolder the command does not mention (the
    command runs at the top level)."""
    warnings: list[str] = []
    subs = submodule_paths(repo, commit)
    if subs:
        shown = ", ".join(subs[:3]) + (f" and {len(subs) - 3} more" if len(subs) > 3 else "")
        warnings.append(
            f"{len(subs)} submodule(s) will be empty folders in the snapshot: {shown} "
            "(git archive does not include submodules)"
        )
    if isinstance(task_path, str) and task_path:
        folder = Path(task_path).parent
        try:
            rel = folder.resolve().relative_to(repo.resolve())
        except ValueError:
            rel = None
        if rel is not None and str(rel) != "." and str(rel) not in command:
            warnings.append(
                f"the task file is in {rel}/ but its command runs at the top of the repository, not there "
                f"(start `run:` with `cd {rel} && ` if it expects its own folder)"
            )
    return warnings


@dataclasses.dataclass(frozen=True)
class _TaskFields:
    """The task's own fields a submit checks first (``scheduling`` is
    adjusted later for the backend and the config's retry policy)."""

    command: str
    timeout_s: int
    scheduling: dict[str, Any]
    env: dict[str, str]
    labels: dict[str, str]
    on_done: list[str] | None


@dataclasses.dataclass(frozen=True)
class _World:
    """A run's environment (``merged_env``: config env under the task's),
    the submitting shell's (None: the daemon's), its resolved links and
    outputs folder (local runs)."""

    merged_env: dict[str, str]
    shell_env: dict[str, str] | None
    links: dict[str, str]
    outputs: Path | None


def _check_task(task: Mapping[str, Any], *, hold: bool) -> _TaskFields:
    """Check the task's command, timeout, scheduling, env, labels,
    ``max_parallel`` and ``on_done``, in that order. Raises TaskError."""
    command = task.get("run")
    if not isinstance(command, str) or not command.strip():
        raise TaskError("no command: give `run:` in the task file or `-- CMD...` on the command line")
    timeout_s = task.get("timeout_s") or DEFAULT_TIMEOUT_S
    if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise TaskError(f"timeout must be a whole number of seconds in 1..{MAX_TIMEOUT_S}, got {timeout_s!r}")
    scheduling = parse_scheduling(task, hold=hold)
    env = task.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TaskError("env must map names to string values")
    labels = check_labels(task.get("labels"), what="--label")
    if task.get("max_parallel") is not None and task.get("sweep") is None:
        raise TaskError("--max-parallel: only a sweep (--sweep KEY=V1,V2,... or task `sweep:`) has runs to limit")
    on_done = task.get("on_done")
    if on_done is not None and (
        not isinstance(on_done, list)
        or not on_done
        or not all(isinstance(w, str) and w and "\0" not in w for w in on_done)
    ):
        raise TaskError("--on-done: the command must be a non-empty list of non-empty words")
    return _TaskFields(
        command=command, timeout_s=timeout_s, scheduling=scheduling, env=env, labels=labels, on_done=on_done
    )


def _shape_for_backend(backend: str, scheduling: dict[str, Any]) -> dict[str, Any]:
    """What a Slurm run asks of sbatch (moved out of ``scheduling``:
    ``gpus``, ``memory_bytes``, ``cpus``); refuses GPUs and limits for a
    Kubernetes run (its manifest is its shape). Raises TaskError."""
    slurm_asks: dict[str, Any] = {}
    if backend == "slurm":
        # The cluster's GPUs, memory and CPUs, asked of sbatch (--gpus,
        # --mem, --cpus-per-task): none of this machine's.
        if scheduling["gpus"]:
            slurm_asks["gpus"], scheduling["gpus"] = scheduling["gpus"], 0
        for key in ("memory_bytes", "cpus"):
            if scheduling.get(key) is not None:
                slurm_asks[key] = scheduling.pop(key)
    if backend == "kubernetes" and scheduling["gpus"]:
        raise TaskError(f"--gpus: only local runs get GPUs from jobsup; {SHAPE_FLAGS_GPUS_HINT}")
    for key, flag in (("memory_bytes", "--memory"), ("cpus", "--cpus")):
        if backend == "kubernetes" and scheduling.get(key) is not None:
            raise TaskError(f"{flag}: only local runs take limits from jobsup; for Kubernetes set them in the manifest")
    return slurm_asks


def _apply_retry_policy(
    task: Mapping[str, Any], data: Mapping[str, Any], backend: str, scheduling: dict[str, Any]
) -> None:
    """Set ``scheduling["retry"]`` from the config's retry policy (user,
    project or task config layer): the policy when the task gives none,
    the reasons and backoff of a bare ``--retry N`` (supervisord.shared.retry).
    Raises TaskError for ``--retry`` on a Slurm run."""
    conf_retry = data.get("retry")
    if backend == "slurm":
        # Attempts of a Slurm run would share its remote run folder and
        # exit-code file: not retried yet (a config policy does not apply).
        if scheduling.get("retry") is not None:
            raise TaskError(
                "--retry: Slurm runs are not retried by jobsup yet; Slurm's own `--requeue` can go in slurm.sbatch_args"
            )
        conf_retry = None
    if isinstance(conf_retry, dict):
        raw = task.get("retry")
        if raw is None and conf_retry.get("attempts") is not None:
            scheduling["retry"] = parse_retry(conf_retry, label="config `retry`")
        elif isinstance(raw, int) and not isinstance(raw, bool):
            scheduling["retry"] = parse_retry({**conf_retry, "attempts": raw}, label="--retry")


def _optional_fields(req: SubmitRequest, slurm_asks: Mapping[str, Any], fields: _TaskFields) -> dict[str, Any]:
    """The Submitted fields a submit has only when given: ``umask``,
    ``request_id``, ``slurm``, ``on_done``, ``labels`` (in that order)."""
    extra: dict[str, Any] = {}
    if req.umask is not None:
        # The submitting shell's umask: a local run's files get it.
        extra["umask"] = f"{int(req.umask, 8):04o}"
    if req.request_id:
        # The client's id for this submit: after a connection lost
        # mid-submit it finds out whether the run was recorded.
        extra["request_id"] = req.request_id
    if slurm_asks:
        extra["slurm"] = slurm_asks
    if fields.on_done is not None:
        # Run by the on-done hook when the run ends (supervisord.daemon.hooks).
        extra["on_done"] = list(fields.on_done)
    if fields.labels:
        extra["labels"] = fields.labels
    return extra


def _check_local_shell(effective: cfg.EffectiveConfig) -> None:
    """``local.shell`` must be a program on the daemon's PATH: a bad value
    is the user's config, so ConfigError (exit 2) naming the layer and file
    it came from, before anything is recorded."""
    shell = str((effective.data.get("local") or {}).get("shell") or "bash")
    if shutil.which(shell) is None:
        origin = effective.origins.get("local.shell")
        where = f" (set in {cfg.describe_origin(origin)})" if origin is not None else ""
        raise ConfigError(f"local.shell {shell!r} is not on the daemon's PATH{where}")


def _shell_env(backend: str, data: Mapping[str, Any], sent: Mapping[str, str] | None) -> dict[str, str] | None:
    """The shell environment a local run starts from (``local.env_from:
    submitter``, the default), or None: the daemon's (``daemon``, a
    Kubernetes run, a client that sent none)."""
    local = data.get("local") or {}
    env_from = str(local.get("env_from") or DEFAULT_ENV_FROM) if isinstance(local, Mapping) else DEFAULT_ENV_FROM
    if backend != "local" or env_from != "submitter" or sent is None:
        return None
    return dict(sent)


def _world_fields(
    shell_env: Mapping[str, str] | None, outputs: Path | None, links: Mapping[str, str], key: bytes
) -> dict[str, Any]:
    """What a local run's Submitted records of its world: ``env_from``
    (``submitter`` | ``daemon``), ``shell_env`` (names and keyed digests,
    never values), ``outputs_root`` and ``links`` (resolved targets)."""
    fields: dict[str, Any] = {"env_from": "submitter" if shell_env is not None else "daemon"}
    if shell_env is not None:
        fields["shell_env"] = shell_env_digest(shell_env, key)
    if outputs is not None:
        fields["outputs_root"] = str(outputs)
    if links:
        fields["links"] = dict(links)
    return fields


def _default_name(command: str) -> str:
    words = command.split()
    return Path(words[0]).name if words else "task"


def _file_candidates(command: str) -> list[str]:
    """The words of ``command`` (its first 32) that could name a file of
    the snapshot: relative paths, ``./`` dropped; no option, variable
    assignment, placeholder or path out of the repository."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    out: list[str] = []
    for word in words[:32]:
        while word.startswith("./"):
            word = word[2:]
        if (
            not word
            or word.startswith(("-", "/", "~", "$"))
            or "=" in word.split("/", 1)[0]
            or any(c in word for c in "{}*?[]$`'\"\n")
            or ".." in word.split("/")
        ):
            continue
        if word not in out:
            out.append(word)
    return out


def _files_in_commit(repo: Path, commit: str, paths: list[str]) -> set[str]:
    """Which of ``paths`` are files (blobs) in ``commit``: one ``git
    cat-file --batch-check``. Any git failure: none (the name falls back)."""
    request = "".join(f"{commit}:{p}\n" for p in paths)
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "--batch-check=%(objecttype)"],
            input=request.encode(),
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if proc.returncode != 0:
        return set()
    kinds = proc.stdout.decode(errors="replace").splitlines()
    return {p for p, kind in zip(paths, kinds, strict=False) if kind.strip() == "blob"}


def _stat_key(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class DaemonConfigCheck:
    """Notices a daemon config file that was edited after the daemon read it
    and no longer validates. The daemon keeps the config it started with, so
    such a file breaks nothing until the next start, which it then refuses
    (``jobsup daemon`` exits 2): :meth:`warning` says so at each submit, so
    the user fixes it now rather than when a restart fails. The file is
    validated again only when its stat (inode, size, times) changes."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self._env = env
        try:
            self._path: Path | None = cfg.config_file_path("daemon", env=env)[0]
        except ConfigError:  # the daemon started, so this cannot be; nothing to watch then
            self._path = None
        self._key = None if self._path is None else _stat_key(self._path)
        self._warning: str | None = None

    async def warning(self, limiter: anyio.CapacityLimiter) -> str | None:
        """The warning for the file as it is now, or None (unchanged since
        the start, or changed and still valid). Reads and validates the file
        in a worker thread (``limiter``) when its stat changed."""
        if self._path is None:
            return None
        key = _stat_key(self._path)
        if key != self._key:
            self._key = key
            self._warning = await anyio.to_thread.run_sync(self._check, limiter=limiter)
        return self._warning

    def _check(self) -> str | None:
        try:
            cfg.validate_daemon_config(cfg.load_daemon_layer(self._env), self._env)
        except ConfigError as err:
            first = err.errors[0] if err.errors else str(err)
            more = f" (and {len(err.errors) - 1} more)" if len(err.errors) > 1 else ""
            what = "the daemon config" if str(self._path) in first else f"the daemon config {self._path}"
            return (
                f"{what} changed since the daemon started and is now invalid: {first}{more};"
                " this daemon keeps the config it started with, but would not start with this file: fix it"
                " (`jobsup daemon` shows every error)"
            )
        return None
