"""Limits enforced by the kernel: a local run with ``--memory``/``--cpus``
starts in a transient systemd scope (``systemd-run --user --scope -p
MemoryMax=… -p CPUQuota=…``) when a user systemd manager answers; else the
daemon's sampler watches the memory (:mod:`supervisord.daemon.usage.sampler`).

Which one applies is decided once, at daemon start (:func:`probe`), and
recorded in each limited run's ``Admitted`` (``limits.enforcement``) and
shown by ``jobsup doctor``. ``systemd-run --scope`` registers its own
process as the scope and then execs the command, so the job keeps the pid
and process group the runner gave it.

Blocking functions (:func:`probe`): call them from a worker thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Final

from supervisord.shared.limits import ENFORCE_SAMPLER, ENFORCE_SYSTEMD

__all__ = ["PROBE_TIMEOUT_S", "Probe", "probe", "scope_argv"]

_NOT_PASSED: Final = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"})
#: How long the start-up probe may take (a hung D-Bus must not hold the daemon up).
PROBE_TIMEOUT_S: Final = 5.0


class Probe:
    """The outcome of :func:`probe`: ``enforcement`` (``systemd-scope`` or
    ``sampler``), ``systemd_run`` (the program's path when it answered) and
    ``detail`` (one line for ``doctor``)."""

    def __init__(self, enforcement: str, detail: str, systemd_run: str | None = None) -> None:
        self.enforcement = enforcement
        self.detail = detail
        self.systemd_run = systemd_run


def probe(timeout_s: float = PROBE_TIMEOUT_S, env: dict[str, str] | None = None) -> Probe:
    """Whether this daemon can put runs in transient user scopes: a
    ``systemd-run`` on PATH that starts ``true`` in a scope with a
    ``MemoryMax`` and a ``CPUQuota`` (so the properties are delegated too)
    within ``timeout_s``. Never raises: anything else is the sampler, with
    the reason in ``detail``."""
    # Not the daemon's NOTIFY_SOCKET: systemd-run would tell the daemon's
    # own manager its error ("ERRNO=...") as if the daemon had sent it.
    env = {k: v for k, v in (env if env is not None else os.environ).items() if k not in _NOT_PASSED}
    path = shutil.which("systemd-run", path=env.get("PATH"))
    if path is None:
        return Probe(ENFORCE_SAMPLER, "no systemd-run on PATH: the daemon's sampler enforces --memory")
    argv = [*scope_argv(path, "probe", 64 << 20, 1.0, unit_suffix=str(os.getpid())), "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired:
        return Probe(ENFORCE_SAMPLER, f"systemd-run --user did not answer in {timeout_s:g} s: the sampler enforces")
    except OSError as err:
        return Probe(ENFORCE_SAMPLER, f"cannot run systemd-run ({err}): the sampler enforces")
    if done.returncode != 0:
        why = (done.stderr or b"").decode(errors="replace").strip().splitlines()
        return Probe(
            ENFORCE_SAMPLER,
            f"no user systemd manager ({why[-1] if why else f'systemd-run exited {done.returncode}'}): "
            "the daemon's sampler enforces --memory; --cpus is claimed but not enforced",
        )
    return Probe(
        ENFORCE_SYSTEMD,
        "limited runs start in systemd scopes (MemoryMax, CPUQuota); the sampler records usage",
        systemd_run=path,
    )


def scope_argv(
    systemd_run: str, run_id: str, memory_bytes: int | None, cpus: float | None, *, unit_suffix: str = ""
) -> list[str]:
    """The argv prefix that starts a command in a transient user scope named
    ``jobsup-<run_id>[-suffix].scope`` with ``MemoryMax`` (bytes; swap
    denied too, so the limit is the memory the run may use) and
    ``CPUQuota`` (``cpus`` times 100 %); the command follows it."""
    unit = f"jobsup-{run_id}" + (f"-{unit_suffix}" if unit_suffix else "")
    argv = [systemd_run, "--user", "--scope", "--quiet", "--collect", f"--unit={unit}"]
    if memory_bytes:
        argv += ["-p", f"MemoryMax={int(memory_bytes)}", "-p", "MemorySwapMax=0"]
    if cpus:
        argv += ["-p", f"CPUQuota={max(1, round(cpus * 100))}%"]
    return [*argv, "--"]
