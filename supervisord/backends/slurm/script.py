"""What the Slurm backend sends to the cluster, as text: pure (no process,
no file, no clock), so ``jobsup render --backend slurm`` prints exactly what
the backend runs.

- :class:`SlurmSettings` -- the run's ``slurm:`` config keys;
- :func:`sbatch_argv` -- the ``sbatch`` command line of a run;
- :func:`wrapper_script` -- the batch script: sources and deletes the env
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
    R/runs/<id>/env.sh         env values (0600; deleted by the wrapper)
    R/runs/<id>/output.log     stdout and stderr (sbatch --output, append)
    R/runs/<id>/exit_code      the command's exit code (written atomically)
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from supervisord.exceptions import ConfigError

__all__ = [
    "DEFAULT_REMOTE_DIR",
    "ENV_FILE",
    "EXIT_CODE_FILE",
    "JOB_SCRIPT",
    "OUTPUT_LOG",
    "SNAPSHOT_MARK",
    "SlurmSettings",
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


def sbatch_argv(*, run_id: str, run_dir: str, timeout_s: int, settings: SlurmSettings, gpus: int = 0) -> list[str]:
    """The ``sbatch`` command of a run whose folder on the cluster is
    ``run_dir`` (an absolute path). The batch script is ``run_dir/job.sh``,
    last; ``sbatch_args`` come after jobsup's own options (so they can
    override e.g. ``--time``, as sbatch lets the last one win)."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name(run_id)}",
        f"--comment=jobsup:{run_id}",
        f"--output={run_dir}/{OUTPUT_LOG}",
        "--open-mode=append",
        f"--time={time_limit(timeout_s)}",
        f"--chdir={run_dir}",
    ]
    if settings.partition:
        argv.append(f"--partition={settings.partition}")
    if settings.account:
        argv.append(f"--account={settings.account}")
    if settings.qos:
        argv.append(f"--qos={settings.qos}")
    if gpus:
        argv.append(f"--gpus={gpus}")
    argv.extend(settings.sbatch_args)
    argv.append(f"{run_dir}/{JOB_SCRIPT}")
    return argv


def wrapper_script(*, run_id: str, run_dir: str, command: str) -> str:
    """The batch script: source the env file (then delete it), run
    ``command`` with bash in ``run_dir/src``, and record its exit code in
    ``run_dir/exit_code`` (write to a temporary name, then rename: a reader
    sees the whole number or nothing). A job killed by Slurm (timeout,
    memory, scancel) writes no exit code: its state comes from Slurm."""
    d = shlex.quote(run_dir)
    return (
        "#!/bin/bash\n"
        f"# jobsup run {run_id}: the wrapper jobsup submitted with sbatch.\n"
        f"cd {d}/src || exit 120\n"
        f"if [ -f {d}/{ENV_FILE} ]; then\n"
        f"    set -a; . {d}/{ENV_FILE}; set +a\n"
        f"    rm -f {d}/{ENV_FILE}\n"
        "fi\n"
        f"bash -c {shlex.quote(command)}\n"
        "code=$?\n"
        f'printf "%s\\n" "$code" > {d}/{EXIT_CODE_FILE}.tmp && mv -f {d}/{EXIT_CODE_FILE}.tmp {d}/{EXIT_CODE_FILE}\n'
        'exit "$code"\n'
    )


def env_file(env: Mapping[str, str]) -> bytes:
    """The env file's text: one ``NAME='value'`` line per value (the
    wrapper sources it with ``set -a``). Names are checked at submit."""
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(env.items())).encode()


def quote_argv(argv: Sequence[str]) -> str:
    """``argv`` as one shell command line."""
    return " ".join(shlex.quote(a) for a in argv)
