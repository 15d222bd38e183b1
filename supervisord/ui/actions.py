"""What the page does beyond reading: cancel and rerun through the daemon's
supervisor and scheduler (the same calls the Unix-socket API makes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from store import RunStatus
from supervisord.supervisor import Supervisor

__all__ = ["SupervisorActions"]


class SupervisorActions:
    """:class:`supervisord.ui.UiActions` over a running supervisor.

    ``rerun`` is the daemon's own rerun (the API's, through the scheduler).
    Env values are never stored, so a run rerun from the page gets none: the
    page is for tasks that need none. ``queue`` returns the scheduler's view;
    ``update`` is ``jobsup update`` of one run (``{"priority": P}``).
    """

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        rerun: Callable[[str], Awaitable[RunStatus]],
        queue: Callable[[], Awaitable[Mapping[str, Any]]],
        update: Callable[[str, Mapping[str, Any]], Awaitable[object]],
    ) -> None:
        self._supervisor, self._rerun, self._queue, self._update = supervisor, rerun, queue, update

    async def resolve(self, ref: str) -> str:
        return await self._supervisor.resolve(ref)

    async def cancel(self, run_id: str) -> RunStatus:
        return await self._supervisor.cancel(run_id)

    async def rerun(self, run_id: str) -> RunStatus:
        return await self._rerun(run_id)

    async def queue(self) -> Mapping[str, Any] | None:
        return await self._queue()

    async def pause(self, run_id: str) -> RunStatus:
        return await self._supervisor.pause(run_id)

    async def resume(self, run_id: str) -> RunStatus:
        return await self._supervisor.resume(run_id)

    async def set_priority(self, run_id: str, priority: int) -> RunStatus:
        await self._update(run_id, {"priority": priority})
        return await self._supervisor.get(run_id)
