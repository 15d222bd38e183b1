"""The usage sampler: every ``local.usage_interval_s`` (default 5 s) it
measures the process tree of every running local run in one pass
(:mod:`.procs`), asks ``nvidia-smi`` once for all runs where the daemon
manages GPUs (:mod:`.nvidia`), records ``ResourceUsage`` events, keeps
the live view ``jobsup top`` shows, and stops a run whose tree passes its
``--memory`` limit.

``ResourceUsage`` data (README, "Events")::

    {"cpu_s": float, "rss_bytes": int, "max_rss_bytes": int,
     "gpu_memory_bytes": {index: int}, "gpu_memory_max_bytes": {index: int},
     "processes": int, "samples": int, "final": bool,
     "memory_limit_bytes": int (when the run has one)}

recorded at most once every :data:`RECORD_EVERY_S` while the run runs
(the first after its first sample) and once after it ended (``final``:
the last sample's figures; CPU up to that sample).

The memory watchdog (enforcement ``sampler``): when a tree's RSS passes
the run's limit, the run is marked (its outcome becomes ERROR
``OOMKilled``, the message with the peak and the limit) and stopped the
way a cancel stops it: SIGTERM to its runner, which sends SIGTERM to the
job's process group and SIGKILL after the kill grace (default 10 s) and
stops the processes that left the group. Without a live runner the
sampler signals the tree's processes itself (SIGTERM, SIGKILL after the
grace). Every signal first checks that the pid still names the process
the pass saw (its start time; :func:`.procs.signal_process`), so a reused
pid is never signalled.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
import anyio.abc
import structlog

from store import EventStore, RunStatus
from supervisord.daemon.crashpoints import crash_point
from supervisord.daemon.scheduler.gpus import Inventory
from supervisord.daemon.supervisor import Supervisor
from supervisord.daemon.usage import nvidia
from supervisord.daemon.usage.procs import ProcessScanner, RunTree, TreeSpec, signal_process
from supervisord.shared.events import RESOURCE_USAGE, ResourceUsageData
from supervisord.shared.limits import ENFORCE_SAMPLER, format_bytes

__all__ = ["DEFAULT_INTERVAL_S", "RECORD_EVERY_S", "RESOURCE_USAGE", "UsageSampler", "usage_sampler"]

log = structlog.get_logger("jobsup.usage")

DEFAULT_INTERVAL_S: Final = 5.0
#: A running run's ResourceUsage events are at least this far apart.
RECORD_EVERY_S: Final = 60.0


@dataclasses.dataclass
class _Track:
    """What the sampler knows of one running run between passes."""

    run_id: str
    memory_limit: int | None
    cpus: float | None
    kill_grace_s: int
    samples: int = 0
    cpu_s: float = 0.0
    cpu_percent: float | None = None
    rss: int = 0
    max_rss: int = 0
    processes: int = 0
    gpu_now: dict[str, int] = dataclasses.field(default_factory=dict)
    gpu_max: dict[str, int] = dataclasses.field(default_factory=dict)
    sampled_at: float = 0.0  # time.monotonic() of the last sample
    recorded_at: float | None = None  # time.monotonic() of the last ResourceUsage
    stopping: bool = False
    #: the runner this track measures: a new runner (a retry's next attempt) gets a new track
    runner_pid: int | None = None

    def event_data(self, *, final: bool) -> ResourceUsageData:
        data: ResourceUsageData = {
            "cpu_s": round(self.cpu_s, 3),
            "rss_bytes": self.rss,
            "max_rss_bytes": self.max_rss,
            "gpu_memory_bytes": dict(self.gpu_now),
            "gpu_memory_max_bytes": dict(self.gpu_max),
            "processes": self.processes,
            "samples": self.samples,
            "final": final,
        }
        if self.memory_limit is not None:
            data["memory_limit_bytes"] = self.memory_limit
        return data


def _limits(submitted: Mapping[str, Any]) -> tuple[int | None, float | None]:
    sched = submitted.get("scheduling")
    if not isinstance(sched, Mapping):
        return None, None
    mem, cpus = sched.get("memory_bytes"), sched.get("cpus")
    return (
        int(mem) if isinstance(mem, int) and not isinstance(mem, bool) and mem > 0 else None,
        float(cpus) if isinstance(cpus, (int, float)) and not isinstance(cpus, bool) and cpus > 0 else None,
    )


class UsageSampler:
    """Samples the running local runs of ``supervisor`` every ``interval_s``.

    ``gpus``: uuid -> index of the GPUs the daemon manages (empty: no
    ``nvidia-smi`` call). ``enforcement``: how memory limits are enforced
    (``sampler``: this watchdog stops the run; ``systemd-scope``: the
    kernel does, and the watchdog stays out of it). Use: ``tg.start_soon(
    sampler.run)`` for the daemon's life; :meth:`snapshot` for ``top``.
    """

    def __init__(
        self,
        store: EventStore,
        supervisor: Supervisor,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        gpus: Mapping[str, int] | None = None,
        enforcement: str = ENFORCE_SAMPLER,
        record_every_s: float = RECORD_EVERY_S,
        nvidia_timeout_s: float | None = None,
    ) -> None:
        self.store = store
        self.supervisor = supervisor
        self.interval_s = float(interval_s)
        self.gpus = dict(gpus or {})
        self.enforcement = enforcement
        self.record_every_s = record_every_s
        self.nvidia_timeout_s = nvidia_timeout_s or max(1.0, min(10.0, self.interval_s))
        self._scanner = ProcessScanner()
        self._tracks: dict[str, _Track] = {}
        self._gpu_state: tuple[nvidia.GpuState, ...] = ()
        self._foreign: dict[int, list[str]] = {}  # GPU index -> foreign pids' descriptions
        self.gpu_note: str | None = None
        self.gpu_note_at: float | None = None
        self.passes = 0
        self.last_pass_s = 0.0
        #: Why this enforcement (the start-up probe's line), for ``doctor``.
        self.enforcement_detail: str | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self._tg: anyio.abc.TaskGroup | None = None

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        """Sample every ``interval_s`` for the daemon's life. A failed pass
        (a storage hiccup recording an event) is logged and the next one
        runs as usual: sampling never decides a run's outcome."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            while True:
                started = time.monotonic()
                try:
                    await self.sample_once()
                except Exception:  # logged with its traceback; the next pass tries again
                    log.exception("usage sampling pass failed")
                self.last_pass_s = time.monotonic() - started
                await anyio.sleep(max(0.0, self.interval_s - self.last_pass_s))

    async def sample_once(self) -> None:
        """One pass: measure, enforce, ask nvidia-smi, record what is due."""
        self.passes += 1
        views = {v.run_id: v for v in self.supervisor.sampled_local_runs()}
        specs = [
            TreeSpec(v.run_id, _int_or_none(v.handle.get("runner_pid")), _int_or_none(v.handle.get("runner_start")))
            for v in views.values()
        ]
        trees = await anyio.to_thread.run_sync(self._scanner.scan, specs, limiter=self._limiter) if specs else {}
        now = time.monotonic()
        for rid, view in views.items():
            track = self._tracks.get(rid)
            runner = _int_or_none(view.handle.get("runner_pid"))
            if track is None or track.runner_pid != runner:
                # A run's next attempt is a new runner: its own limits' watch (not stopping) and peaks.
                mem, cpus = _limits(view.submitted)
                track = self._tracks[rid] = _Track(rid, mem, cpus, view.kill_grace_s, runner_pid=runner)
            self._update(track, trees[rid], now)
        for rid, track in list(self._tracks.items()):
            if rid in views:
                await self._enforce(track, trees[rid])
        if self.gpus and views:
            await self._sample_gpus(trees)
        due: list[tuple[str, ResourceUsageData]] = []
        for rid, track in list(self._tracks.items()):
            if rid not in views:
                del self._tracks[rid]
                if track.samples:
                    due.append((rid, track.event_data(final=True)))
            elif track.recorded_at is None or now - track.recorded_at >= self.record_every_s:
                track.recorded_at = now
                due.append((rid, track.event_data(final=False)))
        if due:
            async with anyio.create_task_group() as tg:
                for rid, data in due:
                    tg.start_soon(self._record, rid, data)

    async def _record(self, run_id: str, data: ResourceUsageData) -> None:
        try:
            await self.supervisor.append_event(run_id, RESOURCE_USAGE(data))
        except Exception as err:  # noqa: BLE001 - a run pruned meanwhile, storage trouble: the next record says it again
            log.warning("usage not recorded", run=run_id, error=str(err))

    @staticmethod
    def _update(track: _Track, tree: RunTree, now: float) -> None:
        cpu = max(track.cpu_s, tree.cpu_s)  # cumulative: never goes down
        if track.samples and now > track.sampled_at:
            track.cpu_percent = round(100.0 * (cpu - track.cpu_s) / (now - track.sampled_at), 1)
        track.cpu_s = cpu
        track.rss = tree.rss_bytes
        track.max_rss = max(track.max_rss, tree.rss_bytes)
        track.processes = len(tree.procs)
        track.sampled_at = now
        track.samples += 1

    # -- the memory watchdog ---------------------------------------------------------

    async def _enforce(self, track: _Track, tree: RunTree) -> None:
        """Stop the run when its tree passed its memory limit. The mark
        comes first: a ResourceUsage with the peak that ended it and
        ``over_limit`` (the message) is committed before any signal, so a
        daemon restarted before the run's end is recorded still ends it
        OOMKilled; when that append fails nothing is stopped this pass (the
        next one tries again)."""
        limit = track.memory_limit
        if limit is None or track.stopping or self.enforcement != ENFORCE_SAMPLER or tree.rss_bytes <= limit:
            return
        message = (
            f"the run's processes used {format_bytes(track.max_rss)} of memory ({track.max_rss} bytes), "
            f"over its --memory limit of {format_bytes(limit)} ({limit} bytes): stopped by jobsup"
        )
        try:
            marked = await self.supervisor.mark_over_limit(track.run_id, message, track.event_data(final=False))
        except Exception as err:  # noqa: BLE001 - storage trouble: stop nothing unrecorded; the next pass tries again
            log.warning(
                "memory limit passed; not stopped yet (the mark is not recorded)", run=track.run_id, error=str(err)
            )
            return
        if not marked:
            return
        track.stopping = True
        track.recorded_at = time.monotonic()
        log.warning("memory limit passed; stopping the run", run=track.run_id, rss=tree.rss_bytes, limit=limit)
        # The runner stops the group (SIGTERM, SIGKILL after the grace) and what left it.
        if tree.runner is None or not signal_process(tree.runner, signal.SIGTERM):
            self._stop_tree(track, tree)
        crash_point("usage.over_limit_stopping")

    def _stop_tree(self, track: _Track, tree: RunTree) -> None:
        """No runner to ask: SIGTERM the tree's processes, SIGKILL after the grace."""
        for proc in tree.procs:
            signal_process(proc, signal.SIGTERM)
        procs = list(tree.procs)
        grace = track.kill_grace_s

        async def kill_later() -> None:
            await anyio.sleep(grace)
            for proc in procs:
                signal_process(proc, signal.SIGKILL)

        if self._tg is not None:
            self._tg.start_soon(kill_later, name=f"oom-kill-{track.run_id}")

    # -- GPUs --------------------------------------------------------------------------

    async def _sample_gpus(self, trees: Mapping[str, RunTree]) -> None:
        sample = await anyio.to_thread.run_sync(nvidia.query, self.nvidia_timeout_s, limiter=self._limiter)
        if sample.note is not None:
            if sample.note != self.gpu_note:
                log.warning("nvidia-smi", note=sample.note)
            self.gpu_note, self.gpu_note_at = sample.note, sample.at
        elif self.gpu_note is not None:
            self.gpu_note = None
        if not sample.ok:
            return  # skipped: the last figures stay as they were
        self._gpu_state = sample.gpus
        index_of = dict(self.gpus)
        index_of.update({g.uuid: g.index for g in sample.gpus})
        owner = {pid: rid for rid, tree in trees.items() for pid in tree.pids}
        marked = self._scanner.known_pids()
        per_run: dict[str, dict[str, int]] = {rid: {} for rid in trees}
        foreign: dict[int, list[str]] = {}
        for app in sample.apps:
            index = index_of.get(app.gpu_uuid)
            if index is None:
                continue
            rid = owner.get(app.pid) or marked.get(app.pid)
            if rid is not None and rid in per_run:
                key = str(index)
                per_run[rid][key] = per_run[rid].get(key, 0) + app.memory_bytes
            elif rid is None and app.gpu_uuid in self.gpus:
                foreign.setdefault(index, []).append(f"pid {app.pid} ({format_bytes(app.memory_bytes)})")
        self._foreign = foreign
        for rid, mem in per_run.items():
            track = self._tracks.get(rid)
            if track is None:
                continue
            track.gpu_now = mem
            for key, value in mem.items():
                track.gpu_max[key] = max(track.gpu_max.get(key, 0), value)

    # -- what others read ------------------------------------------------------------------

    def foreign_gpu_notes(self) -> list[str]:
        """One line per managed GPU busy with a process jobsup did not start
        (from the last nvidia-smi answer)."""
        return [
            f"GPU {index} is busy with a process jobsup did not start: {', '.join(pids)}"
            for index, pids in sorted(self._foreign.items())
        ]

    def gpu_usage(self) -> dict[int, tuple[int | None, int | None]]:
        """GPU index -> (utilisation %, memory used bytes) from the last
        nvidia-smi answer (only GPUs the daemon manages)."""
        return {g.index: (g.utilization, g.memory_used_bytes) for g in self._gpu_state if g.uuid in self.gpus}

    def doctor(self) -> dict[str, Any]:
        """The ``usage`` check of ``jobsup doctor``: interval, enforcement,
        the last nvidia-smi trouble and foreign GPU processes (never a failure)."""
        parts = [
            f"local runs sampled every {self.interval_s:g} s ({len(self._tracks)} now)",
            f"memory limits enforced by {'the daemon sampler' if self.enforcement == ENFORCE_SAMPLER else 'a systemd scope'}",
        ]
        if self.enforcement_detail:
            parts.append(self.enforcement_detail)
        elif self.enforcement == ENFORCE_SAMPLER:
            parts.append("--cpus reserves CPUs at admission but is not enforced (no user systemd manager)")
        if self.gpu_note:
            when = time.strftime("%H:%M:%S", time.localtime(self.gpu_note_at or 0))
            parts.append(f"{self.gpu_note} (last at {when})")
        parts.extend(self.foreign_gpu_notes())
        return {"name": "usage", "ok": True, "detail": "; ".join(parts)}

    async def snapshot(self) -> dict[str, Any]:
        """What ``jobsup top -o json`` prints: ``{"at", "interval_s",
        "runs": [...], "gpus": [...], "notes": [...]}`` (see the ``top``
        schema): the last sample's figures, with each run's object read now
        (one query: its name, times, GPUs, progress)."""
        statuses: dict[str, RunStatus] = await self.store.get_runs(list(self._tracks)) if self._tracks else {}
        util = {g.index: g for g in self._gpu_state}
        runs = []
        for rid, track in self._tracks.items():
            status = statuses.get(rid)
            doc = status.to_json() if status is not None else {"id": rid}
            gpus = [int(i) for i in doc.get("gpus") or []]
            runs.append(
                {
                    "id": rid,
                    "project": doc.get("project"),
                    "name": doc.get("name"),
                    "started_at": doc.get("started_at"),
                    "elapsed_s": doc.get("elapsed_s"),
                    "cpu_percent": track.cpu_percent,
                    "cpu_s": round(track.cpu_s, 3),
                    "rss_bytes": track.rss,
                    "max_rss_bytes": track.max_rss,
                    "memory_limit_bytes": track.memory_limit,
                    "cpus": track.cpus,
                    "processes": track.processes,
                    "gpus": gpus,
                    "gpu_memory_bytes": dict(track.gpu_now),
                    "gpu_utilization": {
                        str(i): util[i].utilization for i in gpus if i in util and util[i].utilization is not None
                    },
                    "progress": doc.get("progress"),
                }
            )
        runs.sort(key=lambda r: str(r.get("started_at") or ""))
        gpu_rows = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "utilization": g.utilization,
                "memory_used_bytes": g.memory_used_bytes,
                "foreign": self._foreign.get(g.index, []),
            }
            for g in self._gpu_state
            if g.uuid in self.gpus
        ]
        notes = ([self.gpu_note] if self.gpu_note else []) + self.foreign_gpu_notes()
        return {"at": time.time(), "interval_s": self.interval_s, "runs": runs, "gpus": gpu_rows, "notes": notes}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_sampler(
    store: EventStore,
    supervisor: Supervisor,
    config: Mapping[str, Any],
    inventory: Inventory,
    *,
    enforcement: str = ENFORCE_SAMPLER,
    enforcement_detail: str | None = None,
) -> UsageSampler:
    """The daemon's sampler from its effective ``config`` (``local.usage_interval_s``)
    and GPU ``inventory`` (GPUs with a real uuid are asked about with
    nvidia-smi). ``enforcement``: what the start-up probe found
    (:func:`supervisord.daemon.scope.probe`): with ``systemd-scope`` the
    kernel enforces limits and the watchdog stays out of it;
    ``enforcement_detail`` is what ``doctor`` says of it."""
    local = config.get("local") or {}
    interval = local.get("usage_interval_s") if isinstance(local, Mapping) else None
    gpus = {g.uuid: g.index for g in inventory.gpus}
    sampler = UsageSampler(
        store, supervisor, interval_s=float(interval or DEFAULT_INTERVAL_S), gpus=gpus, enforcement=enforcement
    )
    sampler.enforcement_detail = enforcement_detail
    return sampler
