"""A sweep's runs as one Slurm array job (``sbatch --array=0-N%max_parallel``).

The runs of a sweep are admitted together (the scheduler leaves a Slurm
sweep's ``max_parallel`` to Slurm) and each one's ``start`` joins a
:class:`Gathering` of its sweep: the first to arrive waits until no other
has come for ``quiet_s`` (at most ``most_s``), then submits one array job
for all of them (array index = the run's index in the sweep). A run that
arrives after its sweep's array was submitted (held, released later) gets
an array job of its own kind with the late ones. Each task runs its run's
own wrapper, with its own env file, in its own run folder; jobsup's run
ids, events and logs stay per run.

:func:`array_upload` builds what the submit sends: one shell script (the
folders, the source copies, sbatch) and one tar on stdin (each run's
wrapper and 0600 env file, the array script, the ``<index>`` links) --
env values never on a command line, and no command line that grows with
the sweep beyond its run ids.
"""

from __future__ import annotations

import dataclasses
import io
import secrets
import shlex
import tarfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from supervisord.daemon.backends.base import RunSpec
from supervisord.shared.slurmscript import (
    ENV_FILE,
    JOB_SCRIPT,
    SNAPSHOT_MARK,
    SWEEPS_DIR,
    array_spec,
    array_wrapper_script,
    env_file,
    quote_argv,
    sbatch_argv,
    wrapper_script,
)

__all__ = ["Gathering", "SweepRef", "array_upload", "sweep_ref"]


@dataclasses.dataclass(frozen=True)
class SweepRef:
    """A run's place in its sweep: ``sweep_id``, ``index`` (its array
    index), the sweep's ``max_parallel`` (None: no limit)."""

    sweep_id: str
    index: int
    max_parallel: int | None


def sweep_ref(spec: RunSpec) -> SweepRef | None:
    """The sweep of ``spec``'s run (Submitted ``sweep_id``, ``sweep_index``,
    ``sweep_max_parallel``), or None for a run of no sweep."""
    data = spec.submitted
    sweep, index = data.get("sweep_id"), data.get("sweep_index")
    if not isinstance(sweep, str) or not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return None
    cap = data.get("sweep_max_parallel")
    return SweepRef(sweep, index, cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None)


class Gathering:
    """The runs of one sweep that will share one array job. ``members``:
    run id -> spec, in arrival order. ``done`` is set once the leader
    submitted (``handles``: run id -> handle) or failed (``error``)."""

    def __init__(self) -> None:
        self.members: dict[str, RunSpec] = {}
        self.closed = False
        self.last_arrival = time.monotonic()
        self.first_arrival = self.last_arrival
        self.done = anyio.Event()
        self.handles: dict[str, dict[str, Any]] = {}
        self.error: BaseException | None = None

    def join(self, spec: RunSpec) -> None:
        """Add a run (before the group closed)."""
        self.members[spec.run_id] = spec
        self.last_arrival = time.monotonic()

    async def settle(self, quiet_s: float, most_s: float) -> None:
        """Wait until no run joined for ``quiet_s`` (or ``most_s`` passed
        since the first), then close the group."""
        while True:
            now = time.monotonic()
            wait = min(self.last_arrival + quiet_s, self.first_arrival + most_s) - now
            if wait <= 0:
                break
            await anyio.sleep(wait)
        self.closed = True


def array_upload(
    *,
    root: str,
    sweep_id: str,
    commit: str,
    members: Sequence[tuple[RunSpec, SweepRef]],
    argv_of: Mapping[str, Any],
) -> tuple[str, bytes, str, list[str]]:
    """``(script, stdin tar, sweep dir, sbatch argv)`` of an array job for
    ``members`` under the resolved ``root`` (remote_dir). ``argv_of``: the
    keyword arguments of :func:`sbatch_argv` besides run_id, run_dir and
    array (timeout_s, settings, gpus, memory_bytes, cpus). The script makes
    the run folders and source copies, unpacks the tar (wrappers 0700, env
    files 0600, the array script, the index links), then runs sbatch; a
    refusal removes every folder it made and exits 3 with sbatch's message."""
    sweep_dir = f"{root}/{SWEEPS_DIR}/{sweep_id}-{secrets.token_hex(3)}"
    rel_sweep = sweep_dir[len(root) + 1 :]
    max_parallel = members[0][1].max_parallel
    argv = sbatch_argv(
        run_id=sweep_id,
        run_dir=sweep_dir,
        array=array_spec([ref.index for _, ref in members], max_parallel),
        **argv_of,
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes, mode: int) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))

        add(f"{rel_sweep}/{JOB_SCRIPT}", array_wrapper_script(sweep_id=sweep_id, sweep_dir=sweep_dir).encode(), 0o700)
        for spec, ref in members:
            run_dir = f"{root}/runs/{spec.run_id}"
            add(
                f"runs/{spec.run_id}/{JOB_SCRIPT}",
                wrapper_script(run_id=spec.run_id, run_dir=run_dir, command=spec.command).encode(),
                0o700,
            )
            add(f"runs/{spec.run_id}/{ENV_FILE}", env_file(spec.env), 0o600)
            link = tarfile.TarInfo(f"{rel_sweep}/{ref.index}")
            link.type, link.linkname, link.mtime = tarfile.SYMTYPE, f"../../runs/{spec.run_id}", int(time.time())
            tar.addfile(link)
    ids = " ".join(shlex.quote(spec.run_id) for spec, _ in members)
    dirs = " ".join(shlex.quote(f"runs/{spec.run_id}") for spec, _ in members)
    src = shlex.quote(f"src/{commit}")
    script = (
        "set -e\numask 077\n"
        f"cd {shlex.quote(root)}\n"
        f"mkdir -p {shlex.quote(SWEEPS_DIR)}\nmkdir {shlex.quote(rel_sweep)}\n"
        f"for id in {ids}; do mkdir runs/$id; cp -R {src} runs/$id/src; rm -f runs/$id/src/{SNAPSHOT_MARK}; done\n"
        "tar -xf - --no-same-owner\n"
        "set +e\n"
        f"out=$({quote_argv(argv)} 2>&1)\n"
        f"rc=$?\nif [ $rc -ne 0 ]; then rm -rf {dirs} {shlex.quote(rel_sweep)}; "
        'printf "%s\\n" "$out" >&2; exit 3; fi\n'
        'printf "%s\\n" "$out"\n'
    )
    return script, buf.getvalue(), sweep_dir, argv
