"""The daemon's outputs recorder: after a local run's terminal phase, list
its outputs folder (:func:`supervisord.shared.outputscan.scan`, in a worker
thread) and record ``OutputsRecorded``.

Driven from the event log, not from the run's supervision: it follows
terminal ``PhaseChanged`` events from its checkpoint (``outputs``), which
moves in the same transaction as each ``OutputsRecorded``. So the terminal
phase is recorded first (a 20 GB checkpoint never delays ``wait``), and a
daemon stopped or killed mid-hash finds the run again after its restart
and lists it then. Runs without an outputs folder (Kubernetes runs, runs
that never started) are passed over.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, cast

import anyio
import structlog

from store import (
    PHASE_CHANGED,
    TERMINAL_PHASES,
    Checkpoint,
    EventStore,
    RecordedEvent,
    StoreClosedError,
    StoreError,
)
from supervisord.daemon.outputs import run_outputs_dir
from supervisord.shared.events import OUTPUTS_RECORDED, OutputsRecordedData
from supervisord.shared.outputscan import scan

__all__ = ["CHECKPOINT", "OutputsRecorder"]

log = structlog.get_logger("jobsup.outputs")

#: The recorder's checkpoint name in the store.
CHECKPOINT: Final = "outputs"
_BATCH: Final = 200
#: Without a run ending, the checkpoint moves at most once per this many seqs.
_SAVE_EVERY: Final = 10_000
_RESTART_S: Final = 5.0


class OutputsRecorder:
    """Records ``OutputsRecorded`` for every local run that ends (see the
    module docstring). :meth:`run` runs for the daemon's lifetime."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._limiter = anyio.CapacityLimiter(1)
        #: Run ids listed since the start (for tests and `doctor`-like views).
        self.recorded = 0

    async def run(self) -> None:
        """Follow the log from the checkpoint, forever (cancel to stop);
        after an unexpected error (logged) start again from the checkpoint
        a few seconds later; return when the store closes."""
        while True:
            try:
                cursor = self._saved = await self.store.get_checkpoint(CHECKPOINT) or 0
                while True:
                    events = await self.store.wait_for_events(cursor, types=[PHASE_CHANGED], limit=_BATCH)
                    cursor = await self.handle(events, cursor)
            except StoreClosedError:
                return
            except Exception:
                log.exception("outputs.recorder_failed", restart_in_s=_RESTART_S)
                await anyio.sleep(_RESTART_S)

    _saved = 0

    async def handle(self, events: Sequence[RecordedEvent], cursor: int) -> int:
        """List the outputs of the runs that ``events`` (PhaseChanged, in
        seq order) end; return the seq handled up to. The checkpoint moves
        with each ``OutputsRecorded`` (one transaction), so a run at or
        before it is listed, and one after it is not yet: going over the
        events after it again after a restart lists each run once. Without
        a listing it moves only now and then (every ``_SAVE_EVERY`` seqs).
        One run whose listing fails (logged) does not stop the others."""
        ends = {e.seq for e in events if e.data.get("phase") in TERMINAL_PHASES}
        firsts = await self.store.first_events({e.run_id for e in events if e.seq in ends}) if ends else {}
        for event in events:
            cursor = event.seq
            first = firsts.get(event.run_id)
            if event.seq not in ends or first is None:
                continue
            folder = run_outputs_dir(first.data, event.run_id)
            if folder is None or not await anyio.to_thread.run_sync(os.path.isdir, folder):
                continue
            data = await self._scan(event.run_id, folder)
            if data is None:
                continue
            await self._append(event, data)
        if cursor - self._saved >= _SAVE_EVERY:
            await self.store.save_checkpoint(Checkpoint(CHECKPOINT, cursor))
            self._saved = cursor
        return cursor

    async def _append(self, event: RecordedEvent, data: dict[str, Any]) -> None:
        """Record ``OutputsRecorded`` for ``event``'s run, the checkpoint moved
        to ``event`` in the same transaction (a storage hiccup is waited out)."""
        try:
            await self.store.append(
                event.run_id,
                None,
                [OUTPUTS_RECORDED(cast(OutputsRecordedData, data))],
                checkpoint=Checkpoint(CHECKPOINT, event.seq),
                wait_for_storage=True,
            )
        except StoreClosedError:
            raise
        except StoreError as err:  # e.g. a listing too large to record: logged, the others go on
            log.error("outputs not recorded", run=event.run_id, error=str(err))
            return
        self._saved = max(self._saved, event.seq)
        self.recorded += 1
        log.info("outputs recorded", run=event.run_id, files=data["total_files"], bytes=data["total_bytes"])

    async def _scan(self, run_id: str, folder: Path) -> dict[str, Any] | None:
        """:func:`scan` of ``folder`` in a worker thread; a cancel (the
        daemon stopping) stops it between two reads. None (logged) when the
        folder cannot be listed."""
        stop = threading.Event()
        started = time.monotonic()
        try:
            data = await anyio.to_thread.run_sync(
                lambda: scan(folder, should_stop=stop.is_set), limiter=self._limiter, abandon_on_cancel=True
            )
        except anyio.get_cancelled_exc_class():
            stop.set()
            raise
        except OSError as err:
            log.warning("outputs not listed", run=run_id, dir=str(folder), error=str(err))
            return None
        data["elapsed_s"] = round(time.monotonic() - started, 3)
        return data
