"""A local run's world around its snapshot: the RunSpec fields and the
``JOBSUP_*`` folder variables (README, "Where your run runs, and where its
results go").

Every local run gets ``JOBSUP_SUBMIT_DIR`` (where ``submit`` ran),
``JOBSUP_REPO_DIR`` (the working tree the snapshot came from),
``JOBSUP_OUTPUT_DIR`` (its outputs folder), and a run started ``--after``
or ``--after-any`` other runs ``JOBSUP_AFTER_OUTPUTS``: their outputs
folders, ``:``-separated, in the order given (``after`` then
``after_any``). None of them is a secret: each is recorded in Submitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from store import EventStore
from supervisord.daemon.backends.base import RunSpec
from supervisord.daemon.outputs import run_outputs_dir

__all__ = ["with_after_outputs", "world_fields"]


def world_fields(run_id: str, submitted: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The :class:`RunSpec` keyword arguments of a run's world, from its
    Submitted data: ``env_from`` (``submitter`` only when ``env``, the
    values kept for its start, is there: a run whose values are gone starts
    from the daemon's environment rather than an empty one),
    ``outputs_dir``, ``links`` and ``jobsup_env`` (without
    ``JOBSUP_AFTER_OUTPUTS``: :func:`with_after_outputs`)."""
    if submitted.get("backend") != "local":
        return {}
    outputs = run_outputs_dir(submitted, run_id)
    source = submitted.get("source") or {}
    jobsup_env: dict[str, str] = {}
    if submitted.get("cwd"):
        jobsup_env["JOBSUP_SUBMIT_DIR"] = str(submitted["cwd"])
    if isinstance(source, Mapping) and source.get("repo"):
        jobsup_env["JOBSUP_REPO_DIR"] = str(source["repo"])
    if outputs is not None:
        jobsup_env["JOBSUP_OUTPUT_DIR"] = str(outputs)
    links = submitted.get("links")
    return {
        "env_from": "submitter" if submitted.get("env_from") == "submitter" and env else "daemon",
        "outputs_dir": outputs,
        "links": {str(k): str(v) for k, v in links.items()} if isinstance(links, Mapping) else {},
        "jobsup_env": jobsup_env,
    }


async def with_after_outputs(store: EventStore, spec: RunSpec) -> RunSpec:
    """``spec`` with ``JOBSUP_AFTER_OUTPUTS`` in its ``jobsup_env`` when it
    is a local run that waited for others: the outputs folders of those
    (``after`` then ``after_any``, in the order given; runs without one
    are left out). Unchanged otherwise."""
    if spec.backend != "local":
        return spec
    sched = spec.submitted.get("scheduling") or {}
    ids = [str(r) for r in [*(sched.get("after") or []), *(sched.get("after_any") or [])]]
    if not ids:
        return spec
    firsts = await store.first_events(ids)
    folders = []
    for rid in ids:
        event = firsts.get(rid)
        folder = run_outputs_dir(event.data, rid) if event is not None else None
        if folder is not None:
            folders.append(str(folder))
    return dataclasses.replace(spec, jobsup_env={**spec.jobsup_env, "JOBSUP_AFTER_OUTPUTS": ":".join(folders)})
