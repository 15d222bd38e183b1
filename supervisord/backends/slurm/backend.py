"""SlurmBackend: each run is one ``sbatch`` job (README, "Running on Slurm").

``preflight``: ``sbatch --test-only`` with the run's options (a refusal is
the user's to fix: PreflightConfigError, exit 2; nothing is created).
``start``: stage the commit once under ``<remote_dir>/src/<commit>``
(verified against the snapshot's sha256), make the run folder, write the
wrapper and the 0600 env file, ``sbatch`` -- one command; a refused job
leaves no run folder. ``supervise``: the transport's shared
:class:`~.poller.Poller` cycles (one ``squeue`` for all jobs), the exit-code
file first, ``sacct``/``sacct -c``/``scontrol`` once the job left the queue,
``Lost`` only after a minute missing from all; ``output.log`` read by byte
offset from the recorded position (the store keeps each line once).
``cancel``: ``scancel``, then wait until the job left the queue.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import structlog

from store import split_block
from supervisord.backends.base import RunReporter, RunSpec
from supervisord.backends.slurm.poller import Poller, lookup_ended
from supervisord.backends.slurm.script import (
    ENV_FILE,
    JOB_SCRIPT,
    OUTPUT_LOG,
    SNAPSHOT_MARK,
    SlurmSettings,
    env_file,
    job_name,
    quote_argv,
    remote_dir_expr,
    sbatch_argv,
    wrapper_script,
)
from supervisord.backends.slurm.status import ACTIVE_STATES, JobRecord, observe
from supervisord.backends.slurm.transport import LocalTransport, SshTransport, Transport, TransportError
from supervisord.exceptions import BackendError, ConfigError, PreflightConfigError, PreflightError

__all__ = ["SlurmBackend", "run_gpus"]

log = structlog.get_logger("jobsup.slurm")

#: Where a run's output lines are measured (the LogLines source).
LOG_SOURCE = OUTPUT_LOG
_READ_BYTES = 4 << 20
_TAIL_BYTES = 8192
#: Seconds a non-zero exit code waits for its job to leave the queue.
_SETTLE_S = 30.0
#: Oldest Slurm this backend supports (``squeue --me``: 20.11).
MIN_VERSION = (20, 11)


def run_gpus(spec: RunSpec) -> int:
    """The GPUs a Slurm run asks for (``--gpus``, recorded at submit under
    ``slurm.gpus`` of the Submitted event)."""
    section = spec.submitted.get("slurm") or {}
    gpus = section.get("gpus") if isinstance(section, Mapping) else None
    return int(gpus) if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else 0


class _RunState:
    def __init__(self) -> None:
        self.canceled = False


class SlurmBackend:
    """Runs tasks as Slurm jobs (see the module docstring).

    ``ssh_options``: extra ``ssh`` options (e.g. ``["-F", file]``; the
    daemon passes ``-F $JOBSUP_SSH_CONFIG`` when set). Seconds:
    ``poll_s`` (between two status cycles), ``lost_after_s`` (a job missing
    from every source this long is Lost), ``cancel_timeout_s``,
    ``command_timeout_s`` (one command's budget), ``upload_timeout_s``.
    ``enforce_deadline``: end a run at its exact timeout (Slurm's
    ``--time`` is whole minutes, rounded up, and checked every ~30 s; it
    stays the backstop while the daemon is down). ``doctor_config``: the
    ``slurm`` section ``doctor`` checks.
    """

    name = "slurm"

    def __init__(
        self,
        *,
        ssh_options: Sequence[str] = (),
        doctor_config: Callable[[], Mapping[str, Any]] = dict,
        poll_s: float = 2.0,
        lost_after_s: float = 60.0,
        cancel_timeout_s: float = 120.0,
        command_timeout_s: float = 60.0,
        upload_timeout_s: float = 600.0,
        enforce_deadline: bool = True,
    ) -> None:
        self.ssh_options = list(ssh_options)
        self.doctor_config = doctor_config
        self.poll_s = poll_s
        self.lost_after_s = lost_after_s
        self.cancel_timeout_s = cancel_timeout_s
        self.command_timeout_s = command_timeout_s
        self.upload_timeout_s = upload_timeout_s
        self.enforce_deadline = enforce_deadline
        self.transports: dict[str, Transport] = {}
        self.pollers: dict[str, Poller] = {}
        self._runs: dict[str, _RunState] = {}

    # -- plumbing -------------------------------------------------------------

    def transport(self, host: str | None) -> Transport:
        """The transport for ``host`` (None: this machine), made once."""
        key = host or ""
        t = self.transports.get(key)
        if t is None:
            t = SshTransport(host, ssh_options=self.ssh_options) if host else LocalTransport()
            self.transports[key] = t
        return t

    def poller(self, host: str | None) -> Poller:
        """The shared poller of ``host``'s transport."""
        key = host or ""
        p = self.pollers.get(key)
        if p is None:
            p = self.pollers[key] = Poller(
                self.transport(host), interval_s=self.poll_s, timeout_s=self.command_timeout_s
            )
        return p

    def _state(self, run_id: str) -> _RunState:
        return self._runs.setdefault(run_id, _RunState())

    @staticmethod
    def settings(spec: RunSpec) -> SlurmSettings:
        """The run's ``slurm:`` settings. Raises ConfigError."""
        return SlurmSettings.of(spec.config)

    async def serve(self) -> None:
        """Nothing shared to run: the pollers run inside the runs' supervision."""

    async def aclose(self) -> None:
        """Close the ssh connections (the jobs keep running)."""
        for t in self.transports.values():
            await t.aclose()

    # -- preflight and doctor ------------------------------------------------

    async def preflight(self, spec: RunSpec) -> list[str]:
        """``sbatch --test-only`` with the run's options. Raises
        PreflightConfigError (sbatch refused: its message), PreflightError
        (the cluster cannot be reached). Creates nothing."""
        try:
            settings = self.settings(spec)
        except ConfigError as err:
            raise PreflightConfigError(str(err)) from None
        argv = sbatch_argv(
            run_id=spec.run_id,
            run_dir="/tmp",  # noqa: S108 - a placeholder run dir for a dry sbatch --test-only
            timeout_s=spec.timeout_s,
            settings=settings,
            gpus=run_gpus(spec),
        )
        test = [a for a in argv[:-1] if not a.startswith(("--output=", "--chdir=", "--parsable"))]
        script = quote_argv([*test, "--test-only", "--output=/dev/null", "--wrap", "true"])
        try:
            done = await self.transport(settings.host).run(script, timeout_s=self.command_timeout_s)
        except TransportError as err:
            raise PreflightError(f"slurm ({settings.where}): {err}") from None
        except FileNotFoundError as err:
            raise PreflightError(f"slurm: {err}") from None
        if done.code == 127:
            raise PreflightError(f"slurm ({settings.where}): sbatch is not installed there: {done.err}")
        if done.code != 0:
            message = _sbatch_message(done.err)
            raise PreflightConfigError(
                f"sbatch refused the job ({settings.where}): {message} (check slurm.partition, slurm.account,"
                " slurm.qos, slurm.sbatch_args and --gpus)"
            )
        return []

    async def doctor(self) -> list[dict[str, Any]]:
        """Checks: reach and Slurm version, partition, accounting, remote_dir."""
        try:
            settings = SlurmSettings.of({"slurm": dict(self.doctor_config())})
        except Exception as err:  # noqa: BLE001 - doctor reports any config trouble as a failed check
            return [{"name": "slurm.config", "ok": False, "detail": str(err)}]
        t = self.transport(settings.host)
        r = remote_dir_expr(settings.remote_dir)
        part = shlex.quote(settings.partition) if settings.partition else ""
        script = (
            f"sinfo --version 2>&1; echo @@; sinfo -h -o '%P %a' {'-p ' + part if part else ''} 2>&1; echo @@; "
            'sacct -n -X -j 1 -o JobID 2>&1; echo "rc=$?"; echo @@; '
            f'mkdir -p {r} 2>&1 && t=$(mktemp -p {r} .doctor.XXXXXX) && rm -f "$t" && echo writable; true'
        )
        try:
            done = await t.run(script, timeout_s=self.command_timeout_s)
        except (TransportError, OSError) as err:
            return [{"name": "slurm.reach", "ok": False, "detail": f"{settings.where}: {err}"}]
        parts = ([*done.out.split("@@"), "", "", "", ""])[:4]
        version_text = parts[0].strip()
        m = re.search(r"(\d+)\.(\d+)", version_text)
        checks: list[dict[str, Any]] = []
        if m is None:
            checks.append({"name": "slurm.reach", "ok": False, "detail": f"{settings.where}: {version_text[:200]}"})
            return checks
        version = (int(m.group(1)), int(m.group(2)))
        checks.append({"name": "slurm.reach", "ok": True, "detail": f"{settings.where}: {version_text}"})
        checks.append(
            {
                "name": "slurm.version",
                "ok": version >= MIN_VERSION,
                "detail": f"{version_text}" + ("" if version >= MIN_VERSION else " (jobsup needs 20.11 or newer)"),
            }
        )
        partitions = parts[1].strip()
        if settings.partition:
            ok = bool(partitions) and "invalid" not in partitions.lower()
            detail = f"partition {settings.partition}: " + (partitions.splitlines()[0] if ok else "not found")
        else:
            ok = bool(partitions)
            detail = "default partition: " + (
                next((p.split()[0] for p in partitions.splitlines() if "*" in p), partitions.splitlines()[0])
                if partitions
                else "none"
            )
        checks.append({"name": "slurm.partition", "ok": ok, "detail": detail})
        acct = parts[2].strip()
        works = "rc=0" in acct
        checks.append(
            {
                "name": "slurm.accounting",
                "ok": True,
                "detail": "sacct answers"
                if works
                else "sacct does not answer (no slurmdbd): ended jobs are read with sacct -c or scontrol",
            }
        )
        writable = "writable" in parts[3]
        checks.append(
            {
                "name": "slurm.remote_dir",
                "ok": writable,
                "detail": f"{settings.remote_dir} "
                + ("is writable" if writable else f"is not writable: {parts[3].strip()}"),
            }
        )
        return checks

    # -- start ------------------------------------------------------------------

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        """Stage, write the run folder, sbatch; record and return the handle.
        Raises BackendError (nothing of the run left on the cluster)."""
        settings = self.settings(spec)
        t = self.transport(settings.host)
        state = self._state(spec.run_id)
        await reporter.phase("SCHEDULING", message=f"staging the source on {settings.where}")
        root, staged = await self._stage(spec, settings, t)
        await reporter.record("StagingStep", {"step": "reused" if staged else "uploaded"})
        run_dir = f"{root}/runs/{spec.run_id}"
        argv = sbatch_argv(
            run_id=spec.run_id, run_dir=run_dir, timeout_s=spec.timeout_s, settings=settings, gpus=run_gpus(spec)
        )
        d = shlex.quote(run_dir)
        eof = "JOBSUP_EOF_" + secrets.token_hex(8)
        script = (
            "set -e\numask 077\n"
            f"mkdir {d}\n"
            f"cp -R {shlex.quote(root + '/src/' + spec.commit)} {d}/src\n"
            f"rm -f {d}/src/{SNAPSHOT_MARK}\n"
            f"cat > {d}/{JOB_SCRIPT} <<'{eof}'\n{wrapper_script(run_id=spec.run_id, run_dir=run_dir, command=spec.command)}{eof}\n"
            f"chmod 700 {d}/{JOB_SCRIPT}\n"
            f"cat > {d}/{ENV_FILE}\n"
            "set +e\n"
            f"out=$({quote_argv(argv)} 2>&1)\n"
            "rc=$?\nif [ $rc -ne 0 ]; then rm -rf " + d + ' ; printf "%s\\n" "$out" >&2; exit 3; fi\n'
            'printf "%s\\n" "$out"\n'
        )
        if state.canceled:
            raise BackendError("canceled before submit", run_reason="Canceled")
        done = await t.run(script, stdin=env_file(spec.env), timeout_s=self.command_timeout_s)
        if done.code != 0:
            raise BackendError(
                f"sbatch refused the job ({settings.where}): {_sbatch_message(done.err)}", run_reason="SubmitFailed"
            )
        job_id = _parse_job_id(done.out)
        if job_id is None:
            raise BackendError(f"sbatch gave no job id ({settings.where}): {done.out.strip()[:300]}")
        handle = {"job_id": job_id, "host": settings.host, "run_dir": run_dir, "remote_dir": root}
        await reporter.handle(handle)
        log.info("submitted", run=spec.run_id, job=job_id, where=settings.where)
        return handle

    async def _stage(self, spec: RunSpec, settings: SlurmSettings, t: Transport) -> tuple[str, bool]:
        """``(remote_dir resolved, whether the commit was already staged)``;
        uploads and verifies the snapshot when it was not."""
        r = remote_dir_expr(settings.remote_dir)
        src = f"src/{shlex.quote(spec.commit)}"
        probe = (
            f"set -e\numask 077\nmkdir -p {r}/src {r}/runs\ncd {r}\npwd -P\n"
            f"if [ -f {src}/{SNAPSHOT_MARK} ]; then cat {src}/{SNAPSHOT_MARK}; fi\n"
        )
        done = await t.run(probe, timeout_s=self.command_timeout_s)
        if done.code != 0:
            raise BackendError(f"slurm.remote_dir {settings.remote_dir} ({settings.where}): {done.err}")
        lines = done.out.splitlines()
        root = lines[0].strip()
        if len(lines) > 1 and lines[1].strip() == spec.snapshot_sha256:
            return root, True
        data = await anyio.to_thread.run_sync(spec.snapshot.read_bytes)
        want = shlex.quote(spec.snapshot_sha256)
        upload = (
            f"set -e\numask 077\ncd {shlex.quote(root)}\n"
            f"t=$(mktemp -d src/.stage-{shlex.quote(spec.commit)}.XXXXXX)\n"
            'cat > "$t.tar"\n'
            'sum=$(sha256sum "$t.tar" | cut -d" " -f1)\n'
            f'if [ "$sum" != {want} ]; then rm -rf "$t" "$t.tar"; echo "the copy has sha256 $sum, not {want}" >&2; exit 3; fi\n'
            'tar -xf "$t.tar" -C "$t"\nrm -f "$t.tar"\n'
            f'printf "%s\\n" "$sum" > "$t/{SNAPSHOT_MARK}"\n'
            f'mv -T "$t" {src} 2>/dev/null || rm -rf "$t"\n'
            f"test -f {src}/{SNAPSHOT_MARK}\n"
        )
        done = await t.run(upload, stdin=data, timeout_s=self.upload_timeout_s)
        if done.code != 0:
            raise BackendError(f"staging the source in {root}/src ({settings.where}) failed: {done.err}")
        return root, False

    # -- supervise --------------------------------------------------------------

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        """Follow the job until it ends; report its outcome (also after a restart)."""
        try:
            if not handle.get("job_id"):
                handle = await self._adopt(spec, reporter)
            await self._follow(spec, handle, reporter)
        finally:
            self._runs.pop(spec.run_id, None)

    async def never_started(self, spec: RunSpec) -> bool:
        """Whether an admitted run with no recorded handle has no Slurm job
        (asked by a restarted daemon): no job of the user named
        ``jobsup-<id>`` with the comment ``jobsup:<id>``. False when the
        cluster cannot be asked (then ``supervise`` looks again)."""
        try:
            return await self._find_job(spec) is None
        except (TransportError, ConfigError, OSError):
            return False

    async def _find_job(self, spec: RunSpec) -> str | None:
        """The job id of ``spec``'s run found by name and comment, or None.
        Raises TransportError, ConfigError."""
        settings = self.settings(spec)
        done = await self.transport(settings.host).run(
            f"squeue -h --me -t all -n {job_name(spec.run_id)} -o '%i|%k'", timeout_s=self.command_timeout_s
        )
        if done.code != 0:
            raise TransportError(f"squeue failed ({settings.where}): {done.err}")
        for line in done.out.splitlines():
            jid, _, comment = line.partition("|")
            if comment.strip() == f"jobsup:{spec.run_id}":
                return jid.strip()
        return None

    async def _adopt(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        """A start cut short by a daemon stop: find the job by name."""
        settings = self.settings(spec)
        t = self.transport(settings.host)
        jid = await self._find_job(spec)
        if jid is not None:
            root = (await t.run(f"cd {remote_dir_expr(settings.remote_dir)} && pwd -P")).out.strip()
            handle = {"job_id": jid, "host": settings.host, "run_dir": f"{root}/runs/{spec.run_id}", "remote_dir": root}
            await reporter.handle(handle)
            return handle
        raise BackendError("the daemon stopped while submitting this run, and no Slurm job of it was found")

    async def _follow(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        host = handle.get("host") or None
        job_id = str(handle["job_id"])
        run_dir = str(handle["run_dir"])
        t = self.transport(host)
        poller = self.poller(host)
        state = self._state(spec.run_id)
        pos = await reporter.log_position(LOG_SOURCE)
        offset = int(pos) if pos and pos.isdigit() else 0
        poller.add(job_id, run_dir)
        absent_since: float | None = None
        number = 0
        settle_until: float | None = None
        try:
            while True:
                cycle = await poller.cycle(number)
                number = cycle.number
                size = cycle.sizes.get(run_dir)
                if size is not None and size > offset:
                    offset = await self._read_log(t, run_dir, offset, reporter, final=False)
                record = cycle.records.get(job_id)
                exit_file = cycle.exits.get(run_dir)
                if record is None and exit_file is None:
                    if not cycle.squeue_ok:
                        continue  # Slurm did not answer: nothing is known, nothing decided
                    try:
                        record = await lookup_ended(t, job_id, timeout_s=self.command_timeout_s)
                    except TransportError:
                        continue
                    if record is None:
                        absent_since = absent_since or time.monotonic()
                        if time.monotonic() - absent_since < self.lost_after_s:
                            continue
                        offset = await self._read_log(t, run_dir, offset, reporter, final=True)
                        await reporter.phase(
                            "ERROR",
                            reason="Lost",
                            message=f"Slurm job {job_id} is in no record (squeue, sacct, scontrol) for"
                            f" {self.lost_after_s:.0f} s",
                        )
                        return
                absent_since = None
                if record is not None and exit_file is None and record.state not in ACTIVE_STATES:
                    # Ended, but squeue gives no exit code: ask sacct/scontrol once.
                    with contextlib.suppress(TransportError):
                        record = await lookup_ended(t, job_id, timeout_s=self.command_timeout_s) or record
                if exit_file and record is not None and record.state in ACTIVE_STATES:
                    # A failed command's job is still ending: Slurm may yet say
                    # why (scancel, a memory kill's message after the exit code).
                    settle_until = settle_until or time.monotonic() + _SETTLE_S
                    if time.monotonic() < settle_until:
                        continue
                tail = ""
                if _needs_tail(record, exit_file):
                    tail = await self._tail(t, run_dir, size)
                obs = observe(record, exit_file=exit_file, canceled_by_jobsup=state.canceled, output_tail=tail)
                if obs is None:
                    continue
                if obs.terminal:
                    await self._read_log(t, run_dir, offset, reporter, final=True)
                    if exit_file is not None or (record is not None and record.elapsed_s):
                        # It ran (maybe between two cycles): say so before its outcome.
                        await reporter.phase("RUNNING")
                    # The job's own end (not a cancel's): a cancel in progress keeps it.
                    await reporter.phase(
                        obs.phase,
                        reason=obs.reason,
                        message=obs.message,
                        exit_code=obs.exit_code,
                        final=obs.phase != "CANCELED",
                    )
                    return
                if (
                    self.enforce_deadline
                    and obs.phase == "RUNNING"
                    and record is not None
                    and record.elapsed_s is not None
                    and record.elapsed_s >= spec.timeout_s
                    and not state.canceled
                ):
                    await self._scancel(t, job_id)
                    await self._wait_gone(t, job_id)
                    await self._read_log(t, run_dir, offset, reporter, final=True)
                    await reporter.phase(
                        "ERROR",
                        reason="DeadlineExceeded",
                        message=f"the run passed its timeout of {spec.timeout_s} s; jobsup canceled Slurm job {job_id}",
                    )
                    return
                await reporter.phase(obs.phase, reason=obs.reason, message=obs.message)
        finally:
            poller.remove(job_id)

    async def _read_log(self, t: Transport, run_dir: str, offset: int, reporter: RunReporter, *, final: bool) -> int:
        """Record ``output.log`` from byte ``offset`` on; return the new offset."""
        path = f"{run_dir}/{OUTPUT_LOG}"
        while True:
            data = await t.read_from(path, offset, _READ_BYTES, timeout_s=self.command_timeout_s)
            if not data:
                return offset
            last = final and len(data) < _READ_BYTES
            block, used = split_block(data, offset, last, "stdout", LOG_SOURCE)
            if block is not None:
                await reporter.log_block(block)
            offset += used
            if len(data) < _READ_BYTES or used == 0:
                return offset

    async def _tail(self, t: Transport, run_dir: str, size: int | None) -> str:
        start = max(0, (size or 0) - _TAIL_BYTES)
        data = await t.read_from(f"{run_dir}/{OUTPUT_LOG}", start, _TAIL_BYTES + 65536)
        return data.decode(errors="replace")

    # -- cancel -------------------------------------------------------------------

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        """``scancel`` the job and return once it left the queue. Idempotent.
        Raises BackendError when it is still there after ``cancel_timeout_s``."""
        state = self._state(spec.run_id)
        state.canceled = True
        job_id = handle.get("job_id")
        if not job_id:
            return
        t = self.transport(handle.get("host") or None)
        await self._scancel(t, str(job_id))
        await self._wait_gone(t, str(job_id))

    async def _scancel(self, t: Transport, job_id: str) -> None:
        done = await t.run(f"scancel {shlex.quote(job_id)}", timeout_s=self.command_timeout_s)
        if done.code != 0 and "Invalid job id" not in done.err and "already completing" not in done.err:
            raise BackendError(f"scancel {job_id} failed ({t.name}): {done.err}")

    async def _wait_gone(self, t: Transport, job_id: str) -> None:
        deadline = time.monotonic() + self.cancel_timeout_s
        while True:
            done = await t.run(f"squeue -h -t all -j {shlex.quote(job_id)} -o %T", timeout_s=self.command_timeout_s)
            states = {s.strip().split()[0] for s in done.out.splitlines() if s.strip()}
            if done.code == 0 and not (states & ACTIVE_STATES):
                return
            if done.code != 0 and "Invalid job id" in done.err:
                return
            if time.monotonic() > deadline:
                raise BackendError(
                    f"Slurm job {job_id} is still in the queue ({', '.join(sorted(states)) or done.err})"
                    f" {self.cancel_timeout_s:.0f} s after scancel"
                )
            await anyio.sleep(0.5)


def _needs_tail(record: JobRecord | None, exit_file: int | None) -> bool:
    """Whether the outcome depends on the output's last lines (a memory kill)."""
    if exit_file is not None:
        return exit_file != 0
    return record is not None and record.state == "FAILED" and record.signal == 9


def _parse_job_id(out: str) -> str | None:
    for line in reversed(out.strip().splitlines()):
        word = line.strip().split(";")[0]
        if word.isdigit():
            return word
    return None


def _sbatch_message(err: str) -> str:
    """sbatch's error lines without the ``sbatch: error:`` prefixes, joined."""
    lines = [re.sub(r"^sbatch: (error: )?", "", line).strip() for line in err.splitlines() if line.strip()]
    return "; ".join(lines) or "no message"
