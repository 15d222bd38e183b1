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

A sweep's runs share one array job (:mod:`.arrays`): each run's handle
names its task (``job_id`` ``A_I``, ``array_job_id`` A, ``array_index``
I); cancels that arrive together are one ``scancel`` (of the whole array
when they are all its live tasks). The env file stays until the job has
truly ended (a requeued job reads it again), then the backend deletes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import secrets
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import structlog

from store import split_block
from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.backends.slurm.arrays import Gathering, SweepRef, array_upload, sweep_ref
from supervisord.daemon.backends.slurm.poller import LOG_CHUNK_BYTES, Cycle, Poller, lookup_ended
from supervisord.daemon.backends.slurm.status import ACTIVE_STATES, WAITING_STATES, JobRecord, Observation, observe
from supervisord.daemon.backends.slurm.transport import LocalTransport, SshTransport, Transport, TransportError
from supervisord.shared.events import STAGING_STEP
from supervisord.shared.exceptions import BackendError, ConfigError, PreflightConfigError, PreflightError
from supervisord.shared.slurmscript import (
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

__all__ = ["SlurmBackend", "run_asks", "run_gpus"]

log = structlog.get_logger("jobsup.slurm")

#: Where a run's output lines are measured (the LogLines source).
LOG_SOURCE = OUTPUT_LOG
_READ_BYTES = 4 << 20
_TAIL_BYTES = 8192
#: Seconds a non-zero exit code waits for its job to leave the queue.
_SETTLE_S = 30.0
#: Seconds the cancels of one array's tasks are gathered into one scancel.
_CANCEL_GATHER_S = 0.3
#: Oldest Slurm this backend supports (``squeue --me``: 20.11).
MIN_VERSION = (20, 11)


def run_gpus(spec: RunSpec) -> int:
    """The GPUs a Slurm run asks for (``--gpus``, recorded at submit under
    ``slurm.gpus`` of the Submitted event)."""
    section = spec.submitted.get("slurm") or {}
    gpus = section.get("gpus") if isinstance(section, Mapping) else None
    return int(gpus) if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else 0


def run_asks(spec: RunSpec) -> dict[str, Any]:
    """What a Slurm run asks of sbatch from its flags, recorded at submit
    under ``slurm`` of the Submitted event: ``gpus`` (``--gpus``),
    ``memory_bytes`` (``--mem``), ``cpus`` (``--cpus-per-task``)."""
    section = spec.submitted.get("slurm") or {}
    if not isinstance(section, Mapping):
        return {"gpus": 0}
    memory = section.get("memory_bytes")
    cpus = section.get("cpus")
    return {
        "gpus": run_gpus(spec),
        "memory_bytes": int(memory) if isinstance(memory, int) and not isinstance(memory, bool) else None,
        "cpus": float(cpus) if isinstance(cpus, int | float) and not isinstance(cpus, bool) else None,
    }


class _RunState:
    def __init__(self) -> None:
        self.canceled = False


@dataclasses.dataclass(eq=False)
class _Following:
    """One followed run: its job, where it runs, and what the polling has
    seen so far (log offset, poller cycle, since when the job is in no
    record, until when a failed job may settle)."""

    spec: RunSpec
    reporter: RunReporter
    t: Transport
    poller: Poller
    state: _RunState
    job_id: str
    run_dir: str
    offset: int = 0
    number: int = 0
    absent_since: float | None = None
    settle_until: float | None = None


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
    ``slurm`` section ``doctor`` checks. ``arrays``: a sweep's runs become
    one array job; ``gather_quiet_s``/``gather_most_s``: how long the first
    run of a sweep waits for the others (no new one for this long / at most).
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
        arrays: bool = True,
        gather_quiet_s: float = 1.0,
        gather_most_s: float = 10.0,
    ) -> None:
        self.ssh_options = list(ssh_options)
        self.doctor_config = doctor_config
        self.poll_s = poll_s
        self.lost_after_s = lost_after_s
        self.cancel_timeout_s = cancel_timeout_s
        self.command_timeout_s = command_timeout_s
        self.upload_timeout_s = upload_timeout_s
        self.enforce_deadline = enforce_deadline
        self.arrays = arrays
        self.gather_quiet_s = gather_quiet_s
        self.gather_most_s = gather_most_s
        self._gathering: dict[str, Gathering] = {}
        self._cancels: dict[tuple[str, str], _CancelBatch] = {}
        self.scancels = 0
        """scancel commands run so far (tests count them)."""
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
                self.transport(host), interval_s=self.poll_s, timeout_s=self.command_timeout_s, batch_logs=bool(host)
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
            **run_asks(spec),
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
        ref = sweep_ref(spec) if self.arrays else None
        if ref is not None:
            return await self._start_in_array(spec, reporter, settings, ref)
        await reporter.phase("SCHEDULING", message=f"staging the source on {settings.where}")
        root, staged = await self._stage(spec, settings, t)
        await reporter.record(STAGING_STEP({"step": "reused" if staged else "uploaded"}))
        run_dir = f"{root}/runs/{spec.run_id}"
        argv = sbatch_argv(
            run_id=spec.run_id, run_dir=run_dir, timeout_s=spec.timeout_s, settings=settings, **run_asks(spec)
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

    async def _start_in_array(
        self, spec: RunSpec, reporter: RunReporter, settings: SlurmSettings, ref: SweepRef
    ) -> Mapping[str, Any]:
        """Join the sweep's gathering; its first run submits the array job
        for all that joined. Raises BackendError (the array was refused:
        nothing of it left on the cluster)."""
        await reporter.phase("SCHEDULING", message=f"staging the source on {settings.where} (array job)")
        key = f"{settings.host or ''}|{ref.sweep_id}"
        group = self._gathering.get(key)
        leader = group is None or group.closed
        if group is None or group.closed:
            group = self._gathering[key] = Gathering()
        group.join(spec)
        if leader:
            try:
                await group.settle(self.gather_quiet_s, self.gather_most_s)
                if self._gathering.get(key) is group:
                    del self._gathering[key]
                await self._submit_array(group, settings, ref, reporter)
            except BaseException as err:
                group.error = err
                raise
            finally:
                group.done.set()
        else:
            await group.done.wait()
        if spec.run_id not in group.handles:
            if self._state(spec.run_id).canceled:
                raise BackendError("canceled before submit", run_reason="Canceled")
            failure = group.error
            if isinstance(failure, BackendError):
                raise BackendError(str(failure), run_reason=failure.run_reason)
            raise BackendError(f"the sweep's array job was not submitted: {failure!r}")
        handle = group.handles[spec.run_id]
        await reporter.handle(handle)
        return handle

    async def _submit_array(
        self, group: Gathering, settings: SlurmSettings, ref: SweepRef, reporter: RunReporter
    ) -> None:
        """Stage once, make every member's folder, sbatch --array; fill
        ``group.handles``. Members canceled meanwhile are left out."""
        members = [
            (spec, r)
            for spec in group.members.values()
            if not self._state(spec.run_id).canceled and (r := sweep_ref(spec)) is not None
        ]
        if not members:
            return
        first = members[0][0]
        t = self.transport(settings.host)
        root, staged = await self._stage(first, settings, t)
        await reporter.record(STAGING_STEP({"step": "reused" if staged else "uploaded"}))
        script, tar, sweep_dir, _ = array_upload(
            root=root,
            sweep_id=ref.sweep_id,
            commit=first.commit,
            members=members,
            argv_of={"timeout_s": first.timeout_s, "settings": settings, **run_asks(first)},
        )
        done = await t.run(script, stdin=tar, timeout_s=self.upload_timeout_s)
        if done.code != 0:
            raise BackendError(
                f"sbatch refused the sweep's array job ({settings.where}): {_sbatch_message(done.err)}",
                run_reason="SubmitFailed",
            )
        array_id = _parse_job_id(done.out)
        if array_id is None:
            raise BackendError(f"sbatch gave no job id ({settings.where}): {done.out.strip()[:300]}")
        for spec, r in members:
            group.handles[spec.run_id] = {
                "job_id": f"{array_id}_{r.index}",
                "array_job_id": array_id,
                "array_index": r.index,
                "host": settings.host,
                "run_dir": f"{root}/runs/{spec.run_id}",
                "remote_dir": root,
                "sweep_dir": sweep_dir,
            }
        log.info("submitted array", sweep=ref.sweep_id, job=array_id, runs=len(members), where=settings.where)

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
        ref = sweep_ref(spec) if self.arrays else None
        owner = ref.sweep_id if ref is not None else spec.run_id
        done = await self.transport(settings.host).run(
            f"squeue -h --me -t all -r -n {job_name(owner)} -o '%i|%k'", timeout_s=self.command_timeout_s
        )
        if done.code != 0:
            raise TransportError(f"squeue failed ({settings.where}): {done.err}")
        for line in done.out.splitlines():
            jid, _, comment = line.partition("|")
            jid = jid.strip()
            if comment.strip() == f"jobsup:{owner}" and (ref is None or jid.endswith(f"_{ref.index}")):
                return jid
        return None

    async def _adopt(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        """A start cut short by a daemon stop: find the job by name."""
        settings = self.settings(spec)
        t = self.transport(settings.host)
        jid = await self._find_job(spec)
        if jid is not None:
            root = (await t.run(f"cd {remote_dir_expr(settings.remote_dir)} && pwd -P")).out.strip()
            handle: dict[str, Any] = {
                "job_id": jid,
                "host": settings.host,
                "run_dir": f"{root}/runs/{spec.run_id}",
                "remote_dir": root,
            }
            if "_" in jid:
                handle["array_job_id"], _, index = jid.partition("_")
                handle["array_index"] = int(index)
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
        f = _Following(spec=spec, reporter=reporter, t=t, poller=poller, state=state, job_id=job_id, run_dir=run_dir)
        pos = await reporter.log_position(LOG_SOURCE)
        f.offset = int(pos) if pos and pos.isdigit() else 0
        poller.add(job_id, run_dir, f.offset)
        try:
            await self._poll(f)
        finally:
            poller.remove(job_id)

    async def _poll(self, f: _Following) -> None:
        """Report the phases of ``f``'s job, one poller cycle at a time,
        until it ends (or is Lost, or passes its deadline)."""
        t, run_dir, job_id = f.t, f.run_dir, f.job_id
        while True:
            cycle = await f.poller.cycle(f.number)
            f.number = cycle.number
            size = cycle.sizes.get(run_dir)
            f.offset = await self._take_log(t, cycle, run_dir, f.offset, f.reporter)
            f.poller.offsets[run_dir] = f.offset
            record = cycle.records.get(job_id)
            exit_file = cycle.exits.get(run_dir)
            if exit_file is not None and record is not None and record.state in WAITING_STATES:
                exit_file = None  # from before a requeue: the job runs again (its wrapper removes it)
            if record is None and exit_file is None:
                if not cycle.squeue_ok:
                    continue  # Slurm did not answer: nothing is known, nothing decided
                try:
                    record = await lookup_ended(t, job_id, timeout_s=self.command_timeout_s)
                except TransportError:
                    continue
                if record is None:
                    f.absent_since = f.absent_since or time.monotonic()
                    if time.monotonic() - f.absent_since < self.lost_after_s:
                        continue
                    await self._end_lost(f)
                    return
            f.absent_since = None
            record = await self._ended_record(f, record, exit_file)
            if exit_file and record is not None and record.state in ACTIVE_STATES:
                # A failed command's job is still ending: Slurm may yet say
                # why (scancel, a memory kill's message after the exit code).
                f.settle_until = f.settle_until or time.monotonic() + _SETTLE_S
                if time.monotonic() < f.settle_until:
                    continue
            obs = await self._observe(f, record, exit_file, size)
            if obs is None:
                continue
            if obs.terminal:
                await self._end(f, obs, record, exit_file)
                return
            if self._past_deadline(f, obs, record):
                await self._end_deadline(f)
                return
            await f.reporter.phase(obs.phase, reason=obs.reason, message=obs.message)

    async def _ended_record(self, f: _Following, record: JobRecord | None, exit_file: int | None) -> JobRecord | None:
        """``record``, or when it has ended but squeue gives no exit code,
        what sacct/scontrol say once (an older record, e.g. a requeue's,
        never undoes the end)."""
        if record is not None and exit_file is None and record.state not in ACTIVE_STATES:
            with contextlib.suppress(TransportError):
                looked = await lookup_ended(f.t, f.job_id, timeout_s=self.command_timeout_s)
                if looked is not None and looked.state not in ACTIVE_STATES:
                    record = looked
        return record

    async def _observe(
        self, f: _Following, record: JobRecord | None, exit_file: int | None, size: int | None
    ) -> Observation | None:
        """What ``record`` and the exit file say (with the output's tail
        when the outcome needs it), or None: nothing to report."""
        tail = ""
        if _needs_tail(record, exit_file):
            tail = await self._tail(f.t, f.run_dir, size)
        return observe(record, exit_file=exit_file, canceled_by_jobsup=f.state.canceled, output_tail=tail)

    def _past_deadline(self, f: _Following, obs: Observation, record: JobRecord | None) -> bool:
        """Whether jobsup ends the running job for its timeout (when it
        enforces deadlines and has not canceled it already)."""
        return (
            self.enforce_deadline
            and obs.phase == "RUNNING"
            and record is not None
            and record.elapsed_s is not None
            and record.elapsed_s >= f.spec.timeout_s
            and not f.state.canceled
        )

    async def _end(self, f: _Following, obs: Observation, record: JobRecord | None, exit_file: int | None) -> None:
        """The job ended: read the rest of its output, clean up, report."""
        await self._read_log(f.t, f.run_dir, f.offset, f.reporter, final=True)
        await self._cleanup(f.t, f.run_dir)
        if exit_file is not None or (record is not None and record.elapsed_s):
            # It ran (maybe between two cycles): say so before its outcome.
            await f.reporter.phase("RUNNING")
        # The job's own end (not a cancel's): a cancel in progress keeps it.
        await f.reporter.phase(
            obs.phase,
            reason=obs.reason,
            message=obs.message,
            exit_code=obs.exit_code,
            final=obs.phase != "CANCELED",
        )

    async def _end_lost(self, f: _Following) -> None:
        """The job has been in no record for ``lost_after_s``: ERROR Lost."""
        f.offset = await self._read_log(f.t, f.run_dir, f.offset, f.reporter, final=True)
        await self._cleanup(f.t, f.run_dir)
        await f.reporter.phase(
            "ERROR",
            reason="Lost",
            message=f"Slurm job {f.job_id} is in no record (squeue, sacct, scontrol) for {self.lost_after_s:.0f} s",
        )

    async def _end_deadline(self, f: _Following) -> None:
        """The run passed its timeout: cancel its job, then ERROR
        DeadlineExceeded."""
        await self._scancel(f.t, f.job_id)
        await self._wait_gone(f.t, f.job_id)
        await self._read_log(f.t, f.run_dir, f.offset, f.reporter, final=True)
        await self._cleanup(f.t, f.run_dir)
        await f.reporter.phase(
            "ERROR",
            reason="DeadlineExceeded",
            message=f"the run passed its timeout of {f.spec.timeout_s} s; jobsup canceled Slurm job {f.job_id}",
        )

    async def _take_log(self, t: Transport, cycle: Cycle, run_dir: str, offset: int, reporter: RunReporter) -> int:
        """Record what the cycle read of ``output.log`` (batched over ssh)
        when it starts at ``offset``, else read it when it grew; return the
        new offset."""
        chunk = cycle.logs.get(run_dir)
        if chunk is not None and chunk.offset == offset:
            block, used = split_block(chunk.data, offset, False, "stdout", LOG_SOURCE)
            if block is not None:
                await reporter.log_block(block)
            offset += used
            if len(chunk.data) < LOG_CHUNK_BYTES:
                return offset  # a partial last line waits for the next cycle
        size = cycle.sizes.get(run_dir)
        if size is not None and size > offset:
            return await self._read_log(t, run_dir, offset, reporter, final=False)
        return offset

    async def _cleanup(self, t: Transport, run_dir: str) -> None:
        """The job has ended for good: delete its env file (kept until now
        for a requeue). A failure is logged, never the run's outcome."""
        try:
            done = await t.run(f"rm -f {shlex.quote(run_dir + '/' + ENV_FILE)}", timeout_s=self.command_timeout_s)
            if done.code != 0:
                log.warning("env file not removed", run_dir=run_dir, error=done.err)
        except (TransportError, OSError) as err:
            log.warning("env file not removed", run_dir=run_dir, error=str(err))

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
        array_id = handle.get("array_job_id")
        if array_id:
            await self._cancel_task(t, str(array_id), str(job_id))
        else:
            await self._scancel(t, str(job_id))
            await self._wait_gone(t, str(job_id))
        if handle.get("run_dir"):
            await self._cleanup(t, str(handle["run_dir"]))

    async def _cancel_task(self, t: Transport, array_id: str, job_id: str) -> None:
        """scancel an array task and wait until it left the queue; the
        cancels of one array that arrive within ``_CANCEL_GATHER_S`` go in
        one ``scancel`` (of the whole array when they are every task of it
        this backend follows: a canceled sweep; else of those tasks) and one
        wait (one ``squeue`` per check for all of them)."""
        key = (t.name, array_id)
        batch = self._cancels.get(key)
        if batch is not None and not batch.closed:
            batch.tasks.add(job_id)
            await batch.done.wait()
            if batch.error is not None:
                raise BackendError(str(batch.error))
            return
        batch = self._cancels[key] = _CancelBatch({job_id})
        try:
            await anyio.sleep(_CANCEL_GATHER_S)
            batch.closed = True
            followed = {j for p in self.pollers.values() for j in p.jobs if j.split("_")[0] == array_id}
            if followed and followed <= batch.tasks:
                await self._scancel(t, array_id)
            else:
                await self._scancel(t, *sorted(batch.tasks))
            await self._wait_gone(t, array_id, tasks=batch.tasks)
        except BackendError as err:
            batch.error = err
            raise
        finally:
            batch.closed = True
            if self._cancels.get(key) is batch:
                del self._cancels[key]
            batch.done.set()

    async def _scancel(self, t: Transport, *job_ids: str) -> None:
        done = await t.run(f"scancel {quote_argv(job_ids)}", timeout_s=self.command_timeout_s)
        if done.code != 0 and "Invalid job id" not in done.err and "already completing" not in done.err:
            raise BackendError(f"scancel {' '.join(job_ids)} failed ({t.name}): {done.err}")
        self.scancels += 1

    async def _wait_gone(self, t: Transport, job_id: str, *, tasks: set[str] | None = None) -> None:
        """Return once ``job_id`` (with ``tasks``: those tasks of the array
        ``job_id``) left the queue. Raises BackendError after ``cancel_timeout_s``."""
        deadline = time.monotonic() + self.cancel_timeout_s
        while True:
            done = await t.run(
                f"squeue -h -t all -r -j {shlex.quote(job_id)} -o '%i %T'", timeout_s=self.command_timeout_s
            )
            rows = [line.split() for line in done.out.splitlines() if len(line.split()) >= 2]
            states = {state for jid, state, *_ in rows if tasks is None or jid in tasks}
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


@dataclasses.dataclass
class _CancelBatch:
    """Array tasks to scancel together (see ``SlurmBackend._cancel_task``)."""

    tasks: set[str]
    closed: bool = False
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    error: BaseException | None = None


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
