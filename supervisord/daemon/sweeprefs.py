"""Many run references resolved at once: run ids, unique prefixes of one,
and sweep ids (all of their runs), for a command on many runs
(``jobsup cancel``: :meth:`supervisord.daemon.commands.Commands.cancel_many`)."""

from __future__ import annotations

from store import EventStore
from supervisord.daemon.readside import resolve_run_id
from supervisord.daemon.sweepread import resolve_sweep_id
from supervisord.shared.exceptions import AmbiguousRunError, RunNotFoundError, UsageError
from supervisord.shared.runref import RUN_ID_LENGTH, is_run_ref, normalize_run_ref
from supervisord.shared.sweep import is_sweep_ref

__all__ = ["resolve_refs"]


async def resolve_refs(store: EventStore, refs: list[str]) -> list[str]:
    """Full run ids for ``refs``, in order without duplicates, in as few
    reads as it takes (full run ids in one query). Raises UsageError naming
    every ref that names no run (or several), ending ``nothing was done``
    when several refs were given."""
    full = [normalize_run_ref(r) for r in refs if not is_sweep_ref(r) and is_run_ref(normalize_run_ref(r))]
    known = await store.get_runs([r for r in full if len(r) == RUN_ID_LENGTH]) if full else {}
    out: dict[str, None] = {}
    bad: list[str] = []
    for ref in refs:
        try:
            if is_sweep_ref(ref):
                sweep_id = await resolve_sweep_id(store, ref)
                for run in await store.sweep_runs(sweep_id):
                    out.setdefault(run.id, None)
            elif normalize_run_ref(ref) in known:
                out.setdefault(normalize_run_ref(ref), None)
            else:
                out.setdefault(await resolve_run_id(store, ref), None)
        except (RunNotFoundError, AmbiguousRunError, UsageError) as err:
            bad.append(str(err))
    if bad:
        raise UsageError("; ".join(dict.fromkeys(bad)) + ("" if len(refs) == 1 else "; nothing was done"))
    return list(out)
