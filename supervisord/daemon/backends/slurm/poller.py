"""One status call per cycle for every live job of one transport.

Every run's supervision asks :meth:`Poller.cycle` for the next cycle; the
first caller runs it (one ``squeue`` for all jobs, plus the sizes of their
``output.log`` and their exit-code files, in one command: one process, or
one ssh round trip) and every other caller gets the same answer. Over ssh
(``batch_logs``) the same command also reads each followed ``output.log``
from its follower's byte offset (``tail -c +N``, up to
:data:`LOG_CHUNK_BYTES` each): one ssh command per cycle for all runs' logs,
not one per run. A cycle
that could not ask Slurm (slurmctld down, ssh cut) says so (``squeue_ok``
False): nothing is decided from it but what the exit-code files say.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Mapping

import anyio
import structlog

from supervisord.daemon.backends.slurm.status import JobRecord, parse_accounting, parse_scontrol, parse_squeue
from supervisord.daemon.backends.slurm.transport import Transport, TransportError
from supervisord.shared.slurmscript import EXIT_CODE_FILE, OUTPUT_LOG

__all__ = ["LOG_CHUNK_BYTES", "Cycle", "LogChunk", "Poller", "lookup_ended", "parse_poll", "poll_script"]

log = structlog.get_logger("jobsup.slurm")

_MARK = "@@jobsup@@"
_LOGS_MARK = "@@jobsup-logs@@"
#: The most bytes of one output.log a cycle reads (the rest: next cycle).
LOG_CHUNK_BYTES = 1 << 20


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
    logs: dict[str, LogChunk] = dataclasses.field(default_factory=dict)
    """Run dir -> the bytes of its output.log read in this cycle (batched
    reads over ssh only; a run whose log did not grow has none)."""


@dataclasses.dataclass(frozen=True)
class LogChunk:
    """``data``: the bytes of an output.log from byte ``offset`` on."""

    offset: int
    data: bytes


def poll_script(run_dirs: list[str], offsets: Mapping[str, int] | None = None) -> str:
    """The cycle's command: squeue, then output sizes, then exit codes
    (bash builtins: no process per job); with ``offsets`` (run dir -> byte
    offset), then each such output.log that grew, from its offset: a
    ``N|OFFSET|RUN_DIR`` line and exactly N bytes."""
    logs = " ".join(shlex.quote(f"{d}/{OUTPUT_LOG}") for d in run_dirs)
    exits = " ".join(shlex.quote(f"{d}/{EXIT_CODE_FILE}") for d in run_dirs)
    parts = [
        "squeue -h --me -t all -r -o '%i|%T|%r|%M' 2>&1",
        f'echo "{_MARK} $?"',
    ]
    if run_dirs:
        parts += [
            f"st=$(stat -c '%s|%n' -- {logs} 2>/dev/null)",
            '[ -n "$st" ] && printf "%s\\n" "$st"',
            f"echo {_MARK}",
            f'for f in {exits}; do [ -f "$f" ] && read -r c < "$f" && printf "%s|%s\\n" "$c" "$f"; done 2>/dev/null',
        ]
        wanted = [(d, offsets[d]) for d in run_dirs if offsets and d in offsets]
        if wanted:
            parts += [
                f"echo {_LOGS_MARK}",
                "declare -A sz",
                'while IFS="|" read -r s n; do [ -n "$n" ] && sz["$n"]=$s; done <<<"$st"',
                "r() { local s=${sz[$2/" + OUTPUT_LOG + ']:-0} n; if [ "$s" -gt "$1" ]; then n=$((s - $1));'
                f" [ $n -gt {LOG_CHUNK_BYTES} ] && n={LOG_CHUNK_BYTES};"
                ' printf "%s|%s|%s\\n" "$n" "$1" "$2"; tail -c +$(($1 + 1)) -- "$2/'
                + OUTPUT_LOG
                + '" | head -c "$n"; fi; }',
                *(f"r {int(off)} {shlex.quote(d)}" for d, off in wanted),
            ]
    parts.append("true")
    return "\n".join(parts)


def parse_logs(data: bytes) -> dict[str, LogChunk]:
    """The log section of :func:`poll_script`'s output -> run dir -> chunk.
    A record that does not parse ends the section (its run reads its log
    itself)."""
    out: dict[str, LogChunk] = {}
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            break
        n, _, rest = data[pos:end].decode(errors="replace").partition("|")
        offset, _, run_dir = rest.partition("|")
        if not (n.isdigit() and offset.isdigit() and run_dir):
            break
        chunk = data[end + 1 : end + 1 + int(n)]
        if len(chunk) != int(n):
            break
        out[run_dir] = LogChunk(int(offset), chunk)
        pos = end + 1 + int(n)
    return out


def parse_poll(number: int, output: str | bytes) -> Cycle:
    """The output of :func:`poll_script` -> a :class:`Cycle`."""
    raw = output.encode() if isinstance(output, str) else output
    head, found, tail = raw.partition(_LOGS_MARK.encode() + b"\n")
    logs = parse_logs(tail) if found else {}
    text = head.decode(errors="replace")
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
    return Cycle(number, ok, records, sizes, exits, error, time.monotonic(), logs)


class Poller:
    """The cycles of one transport. ``interval_s``: the least time between
    two cycles; ``timeout_s``: one cycle's budget."""

    def __init__(
        self, transport: Transport, *, interval_s: float = 2.0, timeout_s: float = 60.0, batch_logs: bool = False
    ) -> None:
        self.transport = transport
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.batch_logs = batch_logs
        self.jobs: dict[str, str] = {}
        """Live jobs: job id -> run dir."""
        self.offsets: dict[str, int] = {}
        """Run dir -> the byte offset its follower has recorded output.log up to
        (``batch_logs``: the cycle reads on from there)."""
        self._lock = anyio.Lock()
        self._last: Cycle | None = None
        self.cycles = 0
        """Cycles run so far (one squeue each)."""

    def add(self, job_id: str, run_dir: str, offset: int = 0) -> None:
        """Follow ``job_id`` from the next cycle on (its log from ``offset``)."""
        self.jobs[job_id] = run_dir
        self.offsets[run_dir] = offset

    def remove(self, job_id: str) -> None:
        """Stop following ``job_id``."""
        run_dir = self.jobs.pop(job_id, None)
        if run_dir is not None and run_dir not in self.jobs.values():
            self.offsets.pop(run_dir, None)

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
                offsets = {d: self.offsets.get(d, 0) for d in dirs} if self.batch_logs else None
                done = await self.transport.run(poll_script(dirs, offsets), timeout_s=self.timeout_s)
                cycle = parse_poll(number, done.stdout)
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
