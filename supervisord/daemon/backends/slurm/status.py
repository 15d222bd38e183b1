"""Slurm's answers -> a run's phase and reason: pure (text in, values out).

Sources, parsed here: ``squeue -h -t all -r -o '%i|%T|%r|%M'`` lines (every
job slurmctld still holds, including those ended less than ``MinJobAge``
ago; ``-r``: one line per array task, ``A_I``), ``sacct -n -P -o
JobID,State,ExitCode`` (or ``sacct -c``, the job
completion file) and ``scontrol show job`` for jobs that left the queue.

Mapping (README, "Running on Slurm"): PENDING -> SCHEDULING with reason
``WaitingForSlurm`` and Slurm's pending reason in the message; RUNNING ->
RUNNING; COMPLETED -> COMPLETED; FAILED -> ERROR ``NonZeroExit`` with the
exit code (ExitCode ``0:9`` and "exceeded memory limit" in the output, the
kill of a job over ``--mem`` on a cluster without cgroups: ``OOMKilled``);
OUT_OF_MEMORY -> ``OOMKilled``; TIMEOUT and DEADLINE -> ``DeadlineExceeded``;
PREEMPTED -> ``Preempted``; NODE_FAIL and BOOT_FAIL -> ``NodeFailure``;
CANCELLED not asked by jobsup -> CANCELED ``Canceled``.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = [
    "ACTIVE_STATES",
    "WAITING_STATES",
    "JobRecord",
    "Observation",
    "elapsed_seconds",
    "observe",
    "parse_accounting",
    "parse_scontrol",
    "parse_squeue",
]

#: States of a job waiting to start (again, after a requeue).
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
#: States of a job that is still in the queue or running.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
    }
)
#: End states in which Slurm killed the job: they explain a non-zero exit
#: code the wrapper may still have written as the kill arrived.
SLURM_KILLS = frozenset({"TIMEOUT", "OUT_OF_MEMORY", "DEADLINE", "CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
_WAITING = WAITING_STATES
OOM_MARK = "exceeded memory limit"


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """One job as a source reports it. ``state``: Slurm's base state
    (``CANCELLED`` for ``CANCELLED by 0``). ``exit_code``/``signal``: from
    ``ExitCode=N:S`` (None when not given). ``reason``: the pending or
    end reason. ``elapsed_s``: run time so far (squeue ``%M``)."""

    job_id: str
    state: str
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    elapsed_s: int | None = None


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a record means for the run."""

    phase: str
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None

    @property
    def terminal(self) -> bool:
        """Whether this is the run's outcome."""
        return self.phase in ("COMPLETED", "ERROR", "CANCELED")


def _base_state(word: str) -> str:
    return word.split(maxsplit=1)[0].rstrip("+").upper() if word.strip() else ""


def elapsed_seconds(text: str) -> int | None:
    """squeue's ``%M`` (``[D-]HH:MM:SS``, ``MM:SS``) in seconds; None for
    anything else (``INVALID``, empty)."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_squeue(text: str) -> dict[str, JobRecord]:
    """``squeue -h -t all -o '%i|%T|%r|%M'`` output -> job id -> record."""
    out: dict[str, JobRecord] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0]:
            continue
        elapsed = elapsed_seconds(parts[3]) if len(parts) > 3 else None
        out[parts[0]] = JobRecord(parts[0], _base_state(parts[1]), parts[2].strip(), elapsed_s=elapsed)
    return out


def _exit_pair(text: str) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"(\d+):(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def parse_accounting(text: str, job_id: str) -> JobRecord | None:
    """``sacct -n -P -o JobID,State,ExitCode`` (or ``sacct -c``) output ->
    the record of ``job_id`` itself (not its steps), or None. The job
    completion file (``sacct -c``) has a line per end, and a requeued job
    ended more than once (``PENDING`` at the requeue): the last line is the
    latest. An array task ``A_I``: ``sacct -c`` names it by its own job id,
    so when asked for that task alone, its lines (one id) are it."""
    rows = [parts for line in text.splitlines() if len(parts := line.strip().split("|")) >= 3 and parts[0]]
    mine = [parts for parts in rows if parts[0] == job_id]
    if not mine and "_" in job_id and len({parts[0] for parts in rows}) == 1:
        mine = rows
    if not mine:
        return None
    parts = mine[-1]
    code, sig = _exit_pair(parts[2])
    return JobRecord(job_id, _base_state(parts[1]), exit_code=code, signal=sig)


def parse_scontrol(text: str, job_id: str) -> JobRecord | None:
    """``scontrol show job ID`` output -> its record, or None."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    array_id, _, task = job_id.partition("_")
    named = fields.get("JobId") == job_id or (
        bool(task) and fields.get("ArrayJobId") == array_id and fields.get("ArrayTaskId") == task
    )
    if not named or "JobState" not in fields:
        return None
    code, sig = _exit_pair(fields.get("ExitCode", ""))
    return JobRecord(job_id, _base_state(fields["JobState"]), fields.get("Reason", ""), code, sig)


def observe(
    record: JobRecord | None,
    *,
    exit_file: int | None,
    canceled_by_jobsup: bool = False,
    output_tail: str = "",
) -> Observation | None:
    """The run's phase from the exit-code file (first: it is the command's
    own word) and the job's ``record``; None when neither says anything."""
    state = record.state if record else ""
    if exit_file is not None and (exit_file == 0 or state not in SLURM_KILLS):
        if exit_file == 0:
            return Observation("COMPLETED", exit_code=0)
        if OOM_MARK in output_tail:
            return _oom(exit_file)
        return Observation("ERROR", "NonZeroExit", f"the command exited with code {exit_file}", exit_code=exit_file)
    if record is None:
        return None
    jid = record.job_id
    if state in _WAITING:
        why = record.reason if record.reason and record.reason != "None" else "waiting"
        return Observation("SCHEDULING", "WaitingForSlurm", f"Slurm job {jid} is {state} ({why})")
    if state in ACTIVE_STATES:
        return Observation("RUNNING")
    if state == "COMPLETED":
        return Observation("COMPLETED", exit_code=record.exit_code or 0)
    if state == "FAILED":
        if record.signal == 9 and OOM_MARK in output_tail:
            return _oom(None)
        code = record.exit_code or None
        if code is None and record.signal:
            code = 128 + record.signal
        detail = f"exited with code {code}" if code is not None else "failed"
        return Observation("ERROR", "NonZeroExit", f"Slurm job {jid} {detail}", exit_code=code)
    if state == "OUT_OF_MEMORY":
        return _oom(None)
    if state in ("TIMEOUT", "DEADLINE"):
        return Observation("ERROR", "DeadlineExceeded", f"Slurm job {jid} ran past its time limit ({state})")
    if state == "PREEMPTED":
        return Observation("ERROR", "Preempted", f"Slurm job {jid} was preempted")
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return Observation("ERROR", "NodeFailure", f"Slurm job {jid} ended with {state} (its node failed)")
    if state == "CANCELLED":
        if canceled_by_jobsup:
            return Observation("CANCELED", "Canceled", "canceled by request")
        return Observation(
            "CANCELED",
            "Canceled",
            f"Slurm job {jid} was canceled outside jobsup (scancel by its owner or an administrator,"
            " or by Slurm itself)",
        )
    return Observation("ERROR", "BackendError", f"Slurm job {jid} ended in state {state or 'unknown'}")


def _oom(code: int | None) -> Observation:
    return Observation(
        "ERROR", "OOMKilled", "the job exceeded its memory limit and was killed (Slurm --mem)", exit_code=code
    )
