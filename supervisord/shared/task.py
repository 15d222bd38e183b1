"""Tasks: what to run, read from a task YAML file and/or CLI flags.

A task YAML file is a mapping with these keys (all optional; unknown keys are
an error naming the key and the file)::

    name: train                 # default: first word of the command
    run: python train.py        # the command, as bash text
    backend: local              # local | kubernetes | slurm (default: config, else local)
    timeout: 30m                # 90s | 30m | 4h | 1d
    env: {SEED: "1"}            # values are secrets: recorded by name and hash only
    config: {...}               # the task config layer (see supervisord.shared.config)
    kubernetes:
      manifest: .jobsup/k8s.yaml   # repository-relative path in the recorded commit
    gpus: 1                     # local runs: whole GPUs of this machine; slurm: sbatch --gpus (default 0)
    queue: default              # the scheduler queue
    priority: 0                 # -1000..1000; higher starts first
    after: [RUN]                # start once these runs are COMPLETED
    after_any: [RUN]            # start once these runs are terminal
    sweep: {lr: [1e-4, 3e-4], seed: 1..3}   # one run per combination ({lr} in run: replaced)
    max_parallel: 2             # a sweep's runs admitted at once
    labels: {team: vision}      # shown and filtered on (`jobsup runs --label team=vision`)
    after_failed: [RUN]         # start only if these runs ended ERROR
    links: {data: ~/datasets/x} # local runs: symlinks in the snapshot (supervisord.shared.links)
    memory: 16G                 # local runs: memory limit of the whole process tree
    cpus: 2                     # local runs: CPUs it needs (and may use)
    retry: {attempts: 2, on: [Lost, OOMKilled, exit:75], backoff: 30s}   # supervisord.shared.retry

CLI flags override the file key by key (``--env`` adds to / replaces keys of
``env``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisord.shared.exceptions import ConfigError, TaskError

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "MAX_TIMEOUT_S",
    "Task",
    "check_name",
    "load_task",
    "parse_duration",
    "parse_env_pairs",
]

#: Backends a task may name.
BACKENDS: tuple[str, ...] = ("local", "kubernetes", "slurm")
#: The run timeout when neither the task nor the CLI gives one (README, "Task files": 4h).
DEFAULT_TIMEOUT_S = 4 * 3600
#: The longest timeout accepted: 366 days.
MAX_TIMEOUT_S = 366 * 86400

_TASK_KEYS = {
    "name",
    "run",
    "backend",
    "timeout",
    "env",
    "config",
    "kubernetes",
    "gpus",
    "queue",
    "priority",
    "after",
    "after_any",
    "sweep",
    "max_parallel",
    "labels",
    "after_failed",
    "links",
    "memory",
    "cpus",
    "retry",
}
#: The scheduling keys of a task (their checks: supervisord.shared.scheduling).
SCHEDULING_KEYS = ("gpus", "queue", "priority", "after", "after_any", "after_failed", "memory", "cpus", "retry")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Task:
    """One task. ``timeout_s`` is whole seconds; ``env`` maps names to values
    (kept in memory and sent to the daemon, never recorded); ``config`` is the
    task's config layer as written; ``path`` is the task file, if any."""

    name: str | None = None
    run: str | None = None
    backend: str | None = None
    timeout_s: int | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    manifest: str | None = None
    path: Path | None = None
    #: ``gpus``, ``queue``, ``priority``, ``after``, ``after_any`` as given (checked by the daemon).
    scheduling: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: A sweep's grid (KEY -> values, supervisord.shared.sweep), its ``max_parallel``, and the run's labels.
    sweep: dict[str, list[str]] | None = None
    max_parallel: int | None = None
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    #: ``links:`` as written: path in the snapshot -> target (resolved by the daemon at submit).
    links: dict[str, str] = dataclasses.field(default_factory=dict)

    def with_overrides(
        self,
        *,
        name: str | None = None,
        run: str | None = None,
        backend: str | None = None,
        timeout_s: int | None = None,
        env: Mapping[str, str] | None = None,
        manifest: str | None = None,
        scheduling: Mapping[str, Any] | None = None,
        sweep: Mapping[str, list[str]] | None = None,
        max_parallel: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Task:
        """Return a copy with every given (non-None) field replaced; ``env``
        and ``labels`` entries are added over the file's; ``scheduling``
        keys whose value is not None replace the file's; a ``sweep`` grid
        replaces the file's."""
        merged_env = dict(self.env)
        merged_env.update(env or {})
        merged_sched = dict(self.scheduling)
        for key, value in (scheduling or {}).items():
            if value is None:
                continue
            if key == "retry" and isinstance(value, int) and isinstance(merged_sched.get("retry"), Mapping):
                # `--retry N` over a task's `retry:`: N retries, on its reasons, with its backoff
                value = {**merged_sched["retry"], "attempts": value}
            merged_sched[key] = value
        return dataclasses.replace(
            self,
            name=name if name is not None else self.name,
            run=run if run is not None else self.run,
            backend=backend if backend is not None else self.backend,
            timeout_s=timeout_s if timeout_s is not None else self.timeout_s,
            env=merged_env,
            manifest=manifest if manifest is not None else self.manifest,
            scheduling=merged_sched,
            sweep=dict(sweep) if sweep else self.sweep,
            max_parallel=max_parallel if max_parallel is not None else self.max_parallel,
            labels={**self.labels, **(labels or {})},
        )

    def default_name(self) -> str:
        """``name``, else the first word of the command (its basename), else ``task``."""
        if self.name:
            return self.name
        if self.run and self.run.split():
            return Path(self.run.split()[0]).name or "task"
        return "task"


def parse_duration(text: str, *, what: str = "--timeout") -> int:
    """Parse ``90s``, ``30m``, ``4h`` or ``1d`` into whole seconds (> 0, at
    most :data:`MAX_TIMEOUT_S`).

    Raises TaskError naming ``what`` (the flag or key) for anything else,
    including zero, negatives, fractions and missing units.
    """
    match = _DURATION.match(str(text))
    if not match:
        raise TaskError(
            f"{what}: {text!r} is not a duration; use a positive whole number with a unit: 90s, 30m, 4h or 1d"
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise TaskError(f"{what}: {text!r} must be positive")
    if seconds > MAX_TIMEOUT_S:
        raise TaskError(f"{what}: {text!r} is longer than the maximum of 366d")
    return seconds


def parse_env_pairs(pairs: Sequence[str], *, what: str = "--env") -> dict[str, str]:
    """Parse ``K=V`` pairs (split at the first ``=``) into a dict.

    Raises TaskError naming ``what`` and the pair when the ``=`` is missing or
    the name is not a valid environment variable name. Never echoes a value.
    """
    env: dict[str, str] = {}
    for i, pair in enumerate(pairs, 1):
        name, sep, value = pair.partition("=")
        if not sep:
            # Not even the name is shown: without '=', the argument may be
            # the secret itself (`--env "$TOKEN"`).
            raise TaskError(
                f"{what}: argument {i} of {len(pairs)} is not NAME=VALUE (it has no '='; "
                "its text is not shown, as it may be a secret)"
            )
        _check_env_name(name, what)
        env[name] = value
    return env


def _check_env_name(name: str, what: str) -> None:
    if not _ENV_NAME.match(name):
        raise TaskError(f"{what}: {name!r} is not a valid environment variable name")


def load_task(path: str | Path) -> Task:
    """Read a task YAML file.

    Raises TaskError naming the file (and line, for YAML syntax errors) when
    the file is missing, not YAML, not a mapping, has unknown keys or values
    of the wrong type.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"{p}: task file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{p}: cannot read task file: {exc}") from None
    try:
        # The config loader: safe, and a duplicated key is an error naming
        # its line (never "the last one wins" silently).
        from supervisord.shared.config.yamlload import load_yaml  # PyYAML: only when a file is read

        doc = load_yaml(text, source=str(p))
    except ConfigError as exc:
        raise TaskError(str(exc)) from None
    if doc is None:
        raise TaskError(f"{p}: task file is empty; it needs at least `run:`")
    if not isinstance(doc, dict):
        raise TaskError(f"{p}: the top level must be a mapping of task keys, got {type(doc).__name__}")
    return _task_from_mapping(doc, p, env_as_written=_env_as_written(text), as_written=_top_scalars_as_written(text))


def check_name(name: str, *, what: str = "--name") -> str:
    """A run name: 1 to 63 characters, none of them whitespace other than a
    space or a control character. Returns it; raises TaskError naming ``what``."""
    if not name or not name.strip():
        raise TaskError(f"{what}: the name must not be empty")
    if len(name) > 63:
        raise TaskError(f"{what}: the name is {len(name)} characters long; at most 63 are allowed")
    if any(not c.isprintable() for c in name):
        raise TaskError(f"{what}: the name must not contain control characters")
    return name


def _env_as_written(text: str) -> dict[str, str]:
    """The scalars of the top-level ``env:`` mapping exactly as the file
    writes them: YAML would read an unquoted ``1.10`` as 1.1, ``02134`` as
    1116, ``off`` as false and ``12:30`` as 750, but an environment value is
    text. Empty (null) values are left out. The text was already parsed once
    (so it is valid YAML)."""
    import yaml  # PyYAML: only when a file is read

    from supervisord.shared.config.yamlload import ConfigLoader

    root = yaml.compose(text, Loader=ConfigLoader)
    if not isinstance(root, yaml.MappingNode):
        return {}
    for key, value in root.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "env" and isinstance(value, yaml.MappingNode):
            return {
                str(k.value): str(v.value)
                for k, v in value.value
                if isinstance(k, yaml.ScalarNode)
                and isinstance(v, yaml.ScalarNode)
                and v.tag != "tag:yaml.org,2002:null"
            }
    return {}


def _top_scalars_as_written(text: str) -> dict[str, str]:
    """The top-level plain scalars of a task file exactly as written (key ->
    text): YAML 1.1 reads ``1_000`` as 1000, ``0x10`` as 16 and ``1:30``
    as 90, which a whole-number key refuses. The text was already parsed
    once (so it is valid YAML)."""
    import yaml  # PyYAML: only when a file is read

    from supervisord.shared.config.yamlload import ConfigLoader

    root = yaml.compose(text, Loader=ConfigLoader)
    if not isinstance(root, yaml.MappingNode):
        return {}
    return {
        str(k.value): str(v.value)
        for k, v in root.value
        if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode) and not v.style
    }


_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


def _task_from_mapping(
    doc: Mapping[Any, Any],
    p: Path,
    *,
    env_as_written: Mapping[str, str] | None = None,
    as_written: Mapping[str, str] | None = None,
) -> Task:
    _check_task_keys(doc, p)
    backend = _string(doc, p, "backend")
    if backend is not None and backend not in BACKENDS:
        raise TaskError(f"{p}: `backend` must be one of {', '.join(BACKENDS)}, got {backend!r}")
    timeout_s = None
    if doc.get("timeout") is not None:
        timeout_s = parse_duration(str(doc["timeout"]), what=f"{p}: `timeout`")
    env = _task_env(doc, p, env_as_written)
    config = doc.get("config")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise TaskError(f"{p}: `config` must be a mapping")
    manifest = _task_manifest(doc, p)
    scheduling = _task_scheduling(doc, p, as_written)
    from supervisord.shared.sweep import check_grid, check_labels, check_max_parallel

    sweep = check_grid(doc["sweep"], what=f"{p}: `sweep`") if doc.get("sweep") is not None else None
    max_parallel = check_max_parallel(doc.get("max_parallel"), what=f"{p}: `max_parallel`")
    labels = check_labels(doc.get("labels"), what=f"{p}: `labels`")
    name = _string(doc, p, "name")
    from supervisord.shared.links import check_links_shape

    links = check_links_shape(doc.get("links"), where=f"{p}: `links`")
    return Task(
        name=check_name(name, what=f"{p}: `name`") if name is not None else None,
        run=_string(doc, p, "run"),
        backend=backend,
        timeout_s=timeout_s,
        env=env,
        config=dict(config),
        manifest=manifest,
        path=p.resolve(),
        scheduling=scheduling,
        sweep=sweep,
        max_parallel=max_parallel,
        labels=labels,
        links=links,
    )


def _check_task_keys(doc: Mapping[Any, Any], p: Path) -> None:
    """Raise TaskError for hooks (never from a task file) or an unknown key."""
    if "hooks" in doc or "on_done" in doc:
        key = "hooks" if "hooks" in doc else "on_done"
        raise TaskError(
            f"{p}: {key}: a task file may not add hooks (a cloned repository must not run commands on this "
            "machine); hooks come from the daemon and user config, or `submit --on-done CMD` for one run"
        )
    unknown = sorted(str(k) for k in doc if k not in _TASK_KEYS)
    if unknown:
        raise TaskError(f"{p}: unknown task key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_TASK_KEYS))}")


def _string(doc: Mapping[Any, Any], p: Path, key: str) -> str | None:
    """``doc[key]``: None when absent, else a non-empty string (TaskError)."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{p}: `{key}` must be a non-empty string")
    return value


def _task_env(doc: Mapping[Any, Any], p: Path, env_as_written: Mapping[str, str] | None) -> dict[str, str]:
    """The task's ``env``: NAME -> text (a value YAML read as another
    scalar only as written in the file, from ``env_as_written``)."""
    env_doc = doc.get("env") or {}
    if not isinstance(env_doc, dict):
        raise TaskError(f"{p}: `env` must be a mapping of NAME: value")
    env: dict[str, str] = {}
    for name, value in env_doc.items():
        _check_env_name(str(name), f"{p}: `env`")
        if isinstance(value, (dict, list)) or value is None:
            raise TaskError(f"{p}: `env.{name}` must be a scalar value")
        if isinstance(value, str):
            env[str(name)] = value
        elif env_as_written is not None and str(name) in env_as_written:
            env[str(name)] = env_as_written[str(name)]
        else:
            raise TaskError(f"{p}: `env.{name}` is not text (YAML read a {type(value).__name__}); quote it")
    return env


def _task_manifest(doc: Mapping[Any, Any], p: Path) -> str | None:
    """``kubernetes.manifest``: a repository-relative path, or None."""
    k8s = doc.get("kubernetes") or {}
    if not isinstance(k8s, dict) or set(k8s) - {"manifest"}:
        raise TaskError(f"{p}: `kubernetes` may only hold `manifest: PATH`")
    manifest = k8s.get("manifest")
    if manifest is not None and (not isinstance(manifest, str) or not manifest):
        raise TaskError(f"{p}: `kubernetes.manifest` must be a repository-relative path")
    return manifest


def _task_scheduling(doc: Mapping[Any, Any], p: Path, as_written: Mapping[str, str] | None) -> dict[str, Any]:
    """The task's scheduling keys (gpus, priority, queue, memory, cpus,
    after, after_any, after_failed), each checked naming the file and key."""
    scheduling: dict[str, Any] = {}
    for key in ("gpus", "priority"):
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TaskError(f"{p}: `{key}` must be a whole number, got {value!r}")
        written = (as_written or {}).get(key)
        if value is not None and written is not None and not _WHOLE_NUMBER.fullmatch(written):
            raise TaskError(f"{p}: `{key}`: must be a whole number in plain digits, got {written!r}")
        if value is not None:
            scheduling[key] = value
    queue = _string(doc, p, "queue")
    if queue is not None:
        scheduling["queue"] = queue
    for key in ("memory", "cpus"):  # checked by the daemon (supervisord.shared.limits)
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise TaskError(f"{p}: `{key}` must be a number or text like 16G, got {value!r}")
        if value is not None:
            scheduling[key] = value
    if doc.get("retry") is not None:  # checked by parse_scheduling below (supervisord.shared.retry)
        scheduling["retry"] = doc["retry"]
    for key in ("after", "after_any", "after_failed"):
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TaskError(f"{p}: `{key}` must be a list of run ids")
        scheduling[key] = list(value)
    # The daemon checks these again, naming the flags; here the file and key.
    from supervisord.shared.scheduling import parse_scheduling  # only when a file is read

    parse_scheduling(scheduling, names={key: f"{p}: `{key}`" for key in SCHEDULING_KEYS})
    return scheduling
