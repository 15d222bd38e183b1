"""One status call per cycle for every live job of one transport.

Every run's supervision asks :meth:`Poller.cycle` for the next cycle; the
first caller runs it (one ``squeue`` for all jobs, plus the sizes of their
``output.log`` and their exit-code files, in one command: one process, or
one ssh round trip) and every other caller gets the same answer. A cycle
that could not ask Slurm (slurmctld down, ssh cut) says so (``squeue_ok``
False): nothing is decided from it but what the exit-code files say.
"""

from __future__ import annotations

import dataclasses
import shlex
import time

import anyio
import structlog

from supervisord.backends.slurm.script import EXIT_CODE_FILE, OUTPUT_LOG
from supervisord.backends.slurm.status import JobRecord, parse_accounting, parse_scontrol, parse_squeue
from supervisord.backends.slurm.transport import Transport, TransportError

__all__ = ["Cycle", "Poller", "lookup_ended"]

log = structlog.get_logger("jobsup.slurm")

_MARK = "@@jobsup@@"


@dataclasses.dataclass(frozen=True)
class Cycle:
    """One poll: ``number`` (increasing), ``squeue_ok``, ``records`` (job id
    -> record, every job of the user slurmctld holds), ``sizes`` (run dir
    -> output.log size), ``exits`` (run dir -> exit code from the file),
    ``error`` (why squeue gave nothing), ``at`` (monotonic time)."""

    number: int
    squeue_ok: bool
    records: dict[str, JobRecord]
    sizes: dict[str, int]
    exits: dict[str, int]
    error: str = ""
    at: float = 0.0


def poll_script(run_dirs: list[str]) -> str:
    """The cycle's command: squeue, then output sizes, then exit codes
    (bash builtins: no process per job)."""
    logs = " ".join(shlex.quote(f"{d}/{OUTPUT_LOG}") for d in run_dirs)
    exits = " ".join(shlex.quote(f"{d}/{EXIT_CODE_FILE}") for d in run_dirs)
    parts = [
        "squeue -h --me -t all -o '%i|%T|%r|%M' 2>&1",
        f'echo "{_MARK} $?"',
    ]
    if run_dirs:
        parts += [
            f"stat -c '%s|%n' -- {logs} 2>/dev/null",
            f"echo {_MARK}",
            f'for f in {exits}; do [ -f "$f" ] && read -r c < "$f" && printf "%s|%s\\n" "$c" "$f"; done 2>/dev/null',
        ]
    parts.append("true")
    return "\n".join(parts)


def parse_poll(number: int, text: str) -> Cycle:
    """The output of :func:`poll_script` -> a :class:`Cycle`."""
    sections = text.split(_MARK)
    squeue_text = sections[0]
    rc_line = sections[1].splitlines()[0].strip() if len(sections) > 1 and sections[1].strip() else "1"
    ok = rc_line.split()[0] == "0" if rc_line else False
    records = parse_squeue(squeue_text) if ok else {}
    sizes: dict[str, int] = {}
    exits: dict[str, int] = {}
    if len(sections) > 1:
        for line in sections[1].splitlines()[1:]:
            size, _, path = line.partition("|")
            if size.isdigit() and path.endswith("/" + OUTPUT_LOG):
                sizes[path[: -len(OUTPUT_LOG) - 1]] = int(size)
    if len(sections) > 2:
        for line in sections[2].splitlines():
            code, _, path = line.partition("|")
            if code.strip().lstrip("-").isdigit() and path.endswith("/" + EXIT_CODE_FILE):
                exits[path[: -len(EXIT_CODE_FILE) - 1]] = int(code.strip())
    error = "" if ok else squeue_text.strip()[-500:]
    return Cycle(number, ok, records, sizes, exits, error, time.monotonic())


class Poller:
    """The cycles of one transport. ``interval_s``: the least time between
    two cycles; ``timeout_s``: one cycle's budget."""

    def __init__(self, transport: Transport, *, interval_s: float = 2.0, timeout_s: float = 60.0) -> None:
        self.transport = transport
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.jobs: dict[str, str] = {}
        """Live jobs: job id -> run dir."""
        self._lock = anyio.Lock()
        self._last: Cycle | None = None
        self.cycles = 0
        """Cycles run so far (one squeue each)."""

    def add(self, job_id: str, run_dir: str) -> None:
        """Follow ``job_id`` from the next cycle on."""
        self.jobs[job_id] = run_dir

    def remove(self, job_id: str) -> None:
        """Stop following ``job_id``."""
        self.jobs.pop(job_id, None)

    async def cycle(self, after: int) -> Cycle:
        """The first cycle numbered above ``after``, run now by this caller
        unless another caller already did (waits ``interval_s`` after the
        previous cycle). Never raises for an unreachable cluster: the cycle
        says ``squeue_ok`` False."""
        async with self._lock:
            last = self._last
            if last is not None and last.number > after:
                return last
            if last is not None:
                await anyio.sleep(max(0.0, last.at + self.interval_s - time.monotonic()))
            number = (last.number if last else 0) + 1
            dirs = sorted(set(self.jobs.values()))
            self.cycles += 1
            try:
                done = await self.transport.run(poll_script(dirs), timeout_s=self.timeout_s)
                cycle = parse_poll(number, done.out)
            except TransportError as err:
                cycle = Cycle(number, False, {}, {}, {}, str(err), time.monotonic())
            if not cycle.squeue_ok:
                log.info("slurm poll without squeue", where=self.transport.name, error=cycle.error)
            self._last = cycle
            return cycle


async def lookup_ended(transport: Transport, job_id: str, *, timeout_s: float = 60.0) -> JobRecord | None:
    """The record of a job that left squeue: ``sacct`` (when accounting
    works), else ``sacct -c`` (the job completion file), else ``scontrol
    show job``; None when no source knows it. Raises TransportError."""
    jid = shlex.quote(job_id)
    script = (
        f"sacct -n -P -X -o JobID,State,ExitCode -j {jid} 2>/dev/null; echo {_MARK}; "
        f"sacct -c -n -P -o JobID,State,ExitCode -j {jid} 2>/dev/null; echo {_MARK}; "
        f"scontrol show job {jid} 2>/dev/null; true"
    )
    sections = (await transport.run(script, timeout_s=timeout_s)).out.split(_MARK)
    for text in sections[:2]:
        record = parse_accounting(text, job_id)
        if record is not None:
            return record
    return parse_scontrol(sections[2], job_id) if len(sections) > 2 else None
