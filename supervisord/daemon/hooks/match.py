"""Which events a hook runs for: a pure function of the hook, the event and
the run's fields (no I/O)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from store.types import PHASE_CHANGED, RecordedEvent
from supervisord.shared.hooksconfig import HookSpec
from supervisord.shared.retry import RETRYING

__all__ = ["is_candidate", "matches"]


def is_candidate(hook: HookSpec, event: RecordedEvent) -> bool:
    """Whether ``event`` is a ``PhaseChanged`` to one of ``hook.when``: the
    events worth looking up the run for. The ``Retrying`` of a retried
    run's failed attempt (RUNNING, reason Retrying: supervisord.shared.retry) is
    only for hooks whose ``when`` names ``Retrying``: the others see the
    final outcome alone."""
    if event.type != PHASE_CHANGED:
        return False
    if event.data.get("reason") == RETRYING:
        return RETRYING in hook.when
    return event.data.get("phase") in hook.when


def matches(hook: HookSpec, event: RecordedEvent, run: Mapping[str, Any]) -> bool:
    """Whether ``hook`` runs for ``event``: a candidate (see
    :func:`is_candidate`) whose run fields pass every ``match`` key.

    ``run`` holds at least ``project``, ``name`` and ``backend`` (the run
    object); ``reason`` is the event's own (the reason of that phase
    change, not a later one). A field that is missing or null matches no
    glob. Globs are :func:`fnmatch.fnmatchcase` patterns (``*``, ``?``,
    ``[...]``), case-sensitive.
    """
    if not is_candidate(hook, event):
        return False
    for key, globs in hook.match.items():
        value = event.data.get("reason") if key == "reason" else run.get(key)
        if not isinstance(value, str) or not any(fnmatch.fnmatchcase(value, g) for g in globs):
            return False
    return True
