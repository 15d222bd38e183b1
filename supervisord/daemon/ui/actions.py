"""What the page does beyond reading: its commands go through the daemon's
one command path (:class:`supervisord.daemon.commands.Commands`), as the
Unix-socket API's do."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from store import RunStatus
from supervisord.daemon.commands import Commands, RerunRequest

__all__ = ["CommandActions"]


class CommandActions:
    """:class:`supervisord.daemon.ui.UiActions` over the daemon's commands.

    ``rerun`` is the API's rerun with no env values: env values are never
    stored, so a run rerun from the page gets none (the page is for tasks
    that need none). ``queue`` returns the scheduler's view (None: no
    scheduler); ``set_priority`` is ``jobsup update RUN --priority P``.
    """

    def __init__(self, commands: Commands, *, queue: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self._commands, self._queue = commands, queue

    async def resolve(self, ref: str) -> str:
        return await self._commands.resolve(ref)

    async def cancel(self, run_id: str) -> RunStatus:
        return (await self._commands.cancel(run_id)).run

    async def rerun(self, run_id: str) -> RunStatus:
        return (await self._commands.rerun(run_id, RerunRequest())).run

    async def queue(self) -> Mapping[str, Any] | None:
        return self._queue() if self._queue is not None else None

    async def pause(self, run_id: str) -> RunStatus:
        return (await self._commands.pause(run_id)).run

    async def resume(self, run_id: str) -> RunStatus:
        return (await self._commands.resume(run_id)).run

    async def set_priority(self, run_id: str, priority: int) -> RunStatus:
        result = await self._commands.update([run_id], {"priority": priority})
        return result.runs[0]
