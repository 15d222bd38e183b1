"""What the page does beyond reading: cancel and rerun through the daemon's
supervisor (the same calls the Unix-socket API makes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from store import EventStore, RunStatus
from supervisord.exceptions import UsageError
from supervisord.supervisor import Supervisor

__all__ = ["SupervisorActions"]

#: Keys of a Submitted event that describe the submission, not the task: a
#: rerun records its own.
_PER_SUBMIT = ("request_id", "submitted_by_uid", "submitted_by_pid", "rerun_of")


class SupervisorActions:
    """:class:`supervisord.ui.UiActions` over a running supervisor.

    ``rerun`` (when given) is the daemon's own rerun; without it a rerun
    records the old run's Submitted data again (same task, commit, recorded
    config) with ``rerun_of`` set. Env values are never stored, so a run
    rerun from the page gets none: the page is for tasks that need none.
    ``queue`` (when given) returns the scheduler's view; ``update`` (when
    given) is ``jobsup update`` of one run (``{"priority": P}``).
    """

    def __init__(
        self,
        supervisor: Supervisor,
        store: EventStore,
        *,
        rerun: Callable[[str], Awaitable[RunStatus]] | None = None,
        queue: Callable[[], Awaitable[Mapping[str, Any]]] | None = None,
        update: Callable[[str, Mapping[str, Any]], Awaitable[object]] | None = None,
    ) -> None:
        self._supervisor, self._store, self._rerun, self._queue = supervisor, store, rerun, queue
        self._update = update

    async def resolve(self, ref: str) -> str:
        return await self._supervisor.resolve(ref)

    async def cancel(self, run_id: str) -> RunStatus:
        return await self._supervisor.cancel(run_id)

    async def rerun(self, run_id: str) -> RunStatus:
        if self._rerun is not None:
            return await self._rerun(run_id)
        first = await self._store.read_all(0, limit=1, run_id=run_id)
        if not first:
            raise UsageError(f"run {run_id} has no Submitted event")
        data = {k: v for k, v in first[0].data.items() if k not in _PER_SUBMIT}
        data["rerun_of"] = run_id
        return await self._supervisor.submit(data)

    async def queue(self) -> Mapping[str, Any] | None:
        return await self._queue() if self._queue is not None else None

    async def pause(self, run_id: str) -> RunStatus:
        return await self._supervisor.pause(run_id)

    async def resume(self, run_id: str) -> RunStatus:
        return await self._supervisor.resume(run_id)

    async def set_priority(self, run_id: str, priority: int) -> RunStatus:
        if self._update is None:
            raise UsageError("this daemon has no scheduler: a run's priority cannot change")
        await self._update(run_id, {"priority": priority})
        return await self._supervisor.get(run_id)
