"""Reason-specific next steps for ``triage`` (the MCP tool): pure functions
over a run object, its ``show`` document and the queue view, so the hint
names the figures a user acts on (the peak and the limit of a run stopped
for its memory, the timeout that would let a waiting run start now).

Each function returns one sentence, or None when it has nothing specific
to say (the caller then falls back to the reason's generic suggestion).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from supervisord.shared.limits import format_bytes

__all__ = ["deadline_hint", "effective_limits", "next_memory", "oom_hint", "reservation_hint", "short_duration"]

_MIB = 1 << 20
_GIB = 1 << 30
#: The headroom a suggested ``--memory`` gives over the peak seen.
HEADROOM = 1.25


def effective_limits(detail: Mapping[str, Any] | None) -> dict[str, int | None]:
    """``{"memory_bytes", "timeout_s", "gpus"}`` a run ran (or waits) with,
    from its ``show`` document (``submitted``, then each of ``updates``' new
    values in order); None for what it does not have."""
    if not detail:
        return {"memory_bytes": None, "timeout_s": None, "gpus": None}
    submitted = detail.get("submitted") or {}
    raw = submitted.get("scheduling")
    sched: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    values = {
        "memory_bytes": sched.get("memory_bytes"),
        "timeout_s": submitted.get("timeout_s"),
        "gpus": sched.get("gpus"),
    }
    for update in detail.get("updates") or []:
        new = (update.get("data") or {}).get("new") if isinstance(update, Mapping) else None
        if isinstance(new, Mapping):
            values.update({k: new[k] for k in values if k in new})
    return {k: v if isinstance(v, int) and not isinstance(v, bool) else None for k, v in values.items()}


def next_memory(peak: int, limit: int | None = None) -> str:
    """A ``--memory`` value for a run that peaked at ``peak`` bytes: the peak
    plus a quarter (and at least the old ``limit`` plus a quarter), rounded
    up to 64M under 1G and to a half G above: ``320M``, ``1.5G``, ``6G``."""
    want = max(peak, limit or 0) * HEADROOM
    if want < _GIB:
        return f"{max(64, math.ceil(want / (64 * _MIB)) * 64)}M"
    halves = math.ceil(want / (_GIB / 2)) / 2
    return f"{halves:g}G"


def short_duration(seconds: float) -> str:
    """A ``--timeout`` value, rounded down to what ``parse_duration`` takes
    (one unit): ``45m``, ``3h``, ``2d``; at least ``1m``."""
    s = max(60, int(seconds))
    if s >= 2 * 86400:
        return f"{s // 86400}d"
    if s >= 3 * 3600:
        return f"{s // 3600}h"
    return f"{s // 60}m"


def oom_hint(run: Mapping[str, Any], detail: Mapping[str, Any] | None) -> str | None:
    """A local run that jobsup stopped for passing its ``--memory``: its
    peak, its limit, and the value to give next (with the commands that
    give it); None without a recorded peak."""
    usage = run.get("usage") or {}
    peak = usage.get("max_rss_bytes") if isinstance(usage, Mapping) else None
    if not isinstance(peak, int) or peak <= 0:
        return None
    limit = effective_limits(detail)["memory_bytes"]
    size = next_memory(peak, limit)
    over = f" over its --memory limit of {format_bytes(limit)}" if limit else ""
    rid = run.get("id") or "RUN"
    return (
        f"the run's processes peaked at {format_bytes(peak)} of memory{over} and jobsup stopped it: "
        f"submit again with --memory {size} (`jobsup rerun {rid} --hold`, `jobsup update NEW --memory {size}`, "
        "`jobsup release NEW`), or lower its memory use (a smaller batch size, fewer workers)"
    )


def deadline_hint(run: Mapping[str, Any], detail: Mapping[str, Any] | None) -> str | None:
    """A run that hit its timeout: the timeout and a longer one to give; None
    when the timeout is unknown."""
    timeout = effective_limits(detail)["timeout_s"]
    if not timeout:
        return None
    return (
        f"the run hit its timeout of {short_duration(timeout)}: submit again with a longer one "
        f"(e.g. --timeout {short_duration(timeout * 2)}) or make it faster"
    )


def reservation_hint(run: Mapping[str, Any], detail: Mapping[str, Any] | None, queue: Mapping[str, Any]) -> str | None:
    """A run QUEUED ``WaitingForGPUs`` while a backfill reservation holds
    GPUs (``queue``: the queue view): what the reservation is, and either
    that this run holds it or the ``--timeout`` that would start it now
    (with the ``jobsup update`` that gives it); None without a reservation."""
    res = queue.get("reservation")
    if not isinstance(res, Mapping) or not res.get("message"):
        return None
    rid = run.get("id")
    if res.get("run_id") == rid:
        return (
            f"this run holds the backfill reservation: {res['message']} (when the runs holding them reach "
            "their timeouts at the latest); runs behind it start on free GPUs only if they end before then"
        )
    text = f"{res['message']}"
    backfill = res.get("backfill_timeout_s")
    limits = effective_limits(detail)
    timeout, need = limits["timeout_s"], limits["gpus"] or 1
    free = sum(1 for g in queue.get("gpus") or [] if isinstance(g, Mapping) and g.get("holder") is None)
    # A shorter timeout helps only a run the free GPUs could take now.
    if (
        need <= free
        and isinstance(backfill, (int, float))
        and backfill >= 120
        and (timeout is None or timeout > backfill)
    ):
        shorter = short_duration(backfill - 60)
        text += f": `jobsup update {rid} --timeout {shorter}` would let it start now, if it can finish in that"
    return text
