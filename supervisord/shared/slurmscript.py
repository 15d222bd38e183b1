"""What the Slurm backend sends to the cluster, as text: pure (no process,
no file, no clock), so ``jobsup render --backend slurm`` prints exactly what
the backend runs.

- :class:`SlurmSettings` -- the run's ``slurm:`` config keys;
- :func:`sbatch_argv` -- the ``sbatch`` command line of a run;
- :func:`wrapper_script` -- the batch script: sources the env
  file, runs the command in the run's copy of the source, records the exit
  code atomically in the run folder;
- :func:`env_file` -- the env values as ``export NAME='value'`` lines (the
  file is created 0600 in the run folder and never on a command line);
- :func:`remote_dir_expr` -- ``remote_dir`` as a shell word (``~`` is the
  cluster user's home).

Layout on the cluster (``R`` = ``remote_dir``)::

    R/src/<commit>/            the commit's source, unpacked once, verified
    R/src/<commit>/.jobsup-snapshot   the snapshot's sha256 (written last)
    R/runs/<id>/src/           the run's copy of the source (its working dir)
    R/runs/<id>/job.sh         the wrapper (the batch script)
    R/runs/<id>/env.sh         env values (0600; deleted once the job ended)
    R/runs/<id>/output.log     stdout and stderr (sbatch --output, append)
    R/runs/<id>/exit_code      the command's exit code (written atomically)
    R/sweeps/<sweep>/job.sh    a sweep's array job script (task N: N/job.sh)
    R/sweeps/<sweep>/<N>       a link to the folder of the sweep's run N
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from supervisord.shared.exceptions import ConfigError

__all__ = [
    "DEFAULT_REMOTE_DIR",
    "ENV_FILE",
    "EXIT_CODE_FILE",
    "JOB_SCRIPT",
    "OUTPUT_LOG",
    "SNAPSHOT_MARK",
    "SWEEPS_DIR",
    "SlurmSettings",
    "array_spec",
    "array_wrapper_script",
    "env_file",
    "job_name",
    "remote_dir_expr",
    "sbatch_argv",
    "time_limit",
    "wrapper_script",
]

DEFAULT_REMOTE_DIR = "~/.jobsup"
OUTPUT_LOG = "output.log"
EXIT_CODE_FILE = "exit_code"
ENV_FILE = "env.sh"
JOB_SCRIPT = "job.sh"
SNAPSHOT_MARK = ".jobsup-snapshot"
SWEEPS_DIR = "sweeps"


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """The ``slurm:`` keys of a run's effective config. ``host``: None for
    the Slurm commands of this machine, else an ssh destination (a host or
    an alias of the user's ssh config)."""

    host: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch_args: tuple[str, ...] = ()
    remote_dir: str = DEFAULT_REMOTE_DIR

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> SlurmSettings:
        """The settings in an effective config (``config["slurm"]``).
        Raises ConfigError for a value of the wrong type."""
        section = config.get("slurm") or {}
        if not isinstance(section, Mapping):
            raise ConfigError("slurm: must be a mapping")

        def text(key: str) -> str | None:
            value = section.get(key)
            if value is None or value == "":
                return None
            if not isinstance(value, str):
                raise ConfigError(f"slurm.{key}: must be a string, got {value!r}")
            return value

        args = section.get("sbatch_args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) and a for a in args):
            raise ConfigError("slurm.sbatch_args: must be a list of non-empty strings")
        return cls(
            host=text("host"),
            partition=text("partition"),
            account=text("account"),
            qos=text("qos"),
            sbatch_args=tuple(args),
            remote_dir=text("remote_dir") or DEFAULT_REMOTE_DIR,
        )

    @property
    def where(self) -> str:
        """``this machine`` or ``ssh HOST``, for messages."""
        return f"ssh {self.host}" if self.host else "this machine"


def remote_dir_expr(remote_dir: str) -> str:
    """``remote_dir`` as one shell word in which a leading ``~`` (alone or
    ``~/...``) is the cluster user's ``$HOME`` and nothing else expands."""
    if remote_dir == "~":
        return '"$HOME"'
    if remote_dir.startswith("~/"):
        return '"$HOME"/' + shlex.quote(remote_dir[2:])
    return shlex.quote(remote_dir)


def job_name(run_id: str) -> str:
    """The Slurm job name of a run: ``jobsup-<id>``."""
    return f"jobsup-{run_id}"


def time_limit(timeout_s: int) -> str:
    """``--time`` for a timeout: whole minutes, rounded up (Slurm's unit).
    jobsup itself ends the run at the exact timeout; this is the cluster's
    backstop, which also holds while the daemon is down."""
    return str(max(1, -(-timeout_s // 60)))


def sbatch_argv(
    *,
    run_id: str,
    run_dir: str,
    timeout_s: int,
    settings: SlurmSettings,
    gpus: int = 0,
    memory_bytes: int | None = None,
    cpus: float | None = None,
    array: str | None = None,
) -> list[str]:
    """The ``sbatch`` command of a run whose folder on the cluster is
    ``run_dir`` (an absolute path). The batch script is ``run_dir/job.sh``,
    last; ``sbatch_args`` come after jobsup's own options (so they can
    override e.g. ``--time``, as sbatch lets the last one win).
    ``memory_bytes``/``cpus``: the run's ``--memory``/``--cpus`` as
    ``--mem`` (MiB, rounded up) and ``--cpus-per-task`` (rounded up).
    ``array``: a sweep's array job (``--array=SPEC``, see :func:`array_spec`):
    ``run_id`` is then the sweep id, ``run_dir`` the sweep's folder, and each
    task writes ``run_dir/<index>/output.log`` (``<index>`` links to the run's
    folder)."""
    output = f"{run_dir}/%a/{OUTPUT_LOG}" if array else f"{run_dir}/{OUTPUT_LOG}"
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name(run_id)}",
        f"--comment=jobsup:{run_id}",
        f"--output={output}",
        "--open-mode=append",
        f"--time={time_limit(timeout_s)}",
        f"--chdir={run_dir}",
    ]
    if array:
        argv.append(f"--array={array}")
    if settings.partition:
        argv.append(f"--partition={settings.partition}")
    if settings.account:
        argv.append(f"--account={settings.account}")
    if settings.qos:
        argv.append(f"--qos={settings.qos}")
    if gpus:
        argv.append(f"--gpus={gpus}")
    if memory_bytes:
        argv.append(f"--mem={-(-memory_bytes // (1 << 20))}M")
    if cpus:
        argv.append(f"--cpus-per-task={math.ceil(cpus)}")
    argv.extend(settings.sbatch_args)
    argv.append(f"{run_dir}/{JOB_SCRIPT}")
    return argv


def wrapper_script(*, run_id: str, run_dir: str, command: str) -> str:
    """The batch script: source the env file, run ``command`` with bash in
    ``run_dir/src``, and record its exit code in ``run_dir/exit_code``
    (write to a temporary name, then rename: a reader sees the whole number
    or nothing). A job killed by Slurm (timeout, memory, scancel) writes no
    exit code: its state comes from Slurm. The env file stays (0600, in a
    0700 folder) until the job has truly ended: a requeued job (``scontrol
    requeue``, a node failure) runs this script again from the start and
    reads it again; jobsup deletes it once the job left the queue. A stale
    exit code (from before a requeue) is removed first."""
    d = shlex.quote(run_dir)
    return (
        "#!/bin/bash\n"
        f"# jobsup run {run_id}: the wrapper jobsup submitted with sbatch.\n"
        f"rm -f {d}/{EXIT_CODE_FILE}\n"
        f"cd {d}/src || exit 120\n"
        f"if [ -f {d}/{ENV_FILE} ]; then\n"
        f"    set -a; . {d}/{ENV_FILE}; set +a\n"
        "fi\n"
        f"bash -c {shlex.quote(command)}\n"
        "code=$?\n"
        f'printf "%s\\n" "$code" > {d}/{EXIT_CODE_FILE}.tmp && mv -f {d}/{EXIT_CODE_FILE}.tmp {d}/{EXIT_CODE_FILE}\n'
        'exit "$code"\n'
    )


def array_spec(indices: Sequence[int], max_parallel: int | None) -> str:
    """``--array``'s value: the indices as ranges (``0-3,7``), then
    ``%max_parallel`` when given (Slurm runs at most that many at once)."""
    parts: list[str] = []
    ordered = sorted(set(indices))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts) + (f"%{max_parallel}" if max_parallel else "")


def array_wrapper_script(*, sweep_id: str, sweep_dir: str) -> str:
    """The batch script of a sweep's array job: each task runs the wrapper
    of its run, ``sweep_dir/<SLURM_ARRAY_TASK_ID>/job.sh`` (``<index>``
    links to the run's folder, which has its own wrapper and env file)."""
    d = shlex.quote(sweep_dir)
    return (
        "#!/bin/bash\n"
        f"# jobsup sweep {sweep_id}: the array job jobsup submitted with sbatch; task N runs run N's wrapper.\n"
        f'exec {d}/"$SLURM_ARRAY_TASK_ID"/{JOB_SCRIPT}\n'
    )


def env_file(env: Mapping[str, str]) -> bytes:
    """The env file's text: one ``NAME='value'`` line per value (the
    wrapper sources it with ``set -a``). Names are checked at submit."""
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(env.items())).encode()


def quote_argv(argv: Sequence[str]) -> str:
    """``argv`` as one shell command line."""
    return " ".join(shlex.quote(a) for a in argv)
