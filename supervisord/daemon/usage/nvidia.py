"""GPU memory per process and utilisation per GPU from ``nvidia-smi``.

Two queries per sampling interval, for all runs at once (never one per run):

* ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory
  --format=csv,noheader,nounits``: each process using a GPU and its memory
  (MiB), matched by the sampler to the runs' process trees;
* ``nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used
  --format=csv,noheader,nounits``: each GPU's utilisation (%) and memory.

Never raises: a missing tool, a failure, a timeout (a hung driver) or
output that does not parse gives no data and a note (``doctor`` shows the
last one); lines that do not parse are skipped and counted. Blocking: call
from a worker thread.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Final

__all__ = [
    "APPS_ARGS",
    "GPUS_ARGS",
    "GpuApp",
    "GpuSample",
    "GpuState",
    "parse_apps",
    "parse_gpus",
    "query",
]

APPS_ARGS: Final = ("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")
GPUS_ARGS: Final = ("--query-gpu=index,uuid,utilization.gpu,memory.used", "--format=csv,noheader,nounits")
_MIB: Final = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class GpuApp:
    """One process on a GPU: ``gpu_uuid``, ``pid`` (as nvidia-smi sees it), ``memory_bytes``."""

    gpu_uuid: str
    pid: int
    memory_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU now: ``index``, ``uuid``, ``utilization`` (percent; None when
    not reported), ``memory_used_bytes`` (None when not reported)."""

    index: int
    uuid: str
    utilization: int | None
    memory_used_bytes: int | None


@dataclasses.dataclass(frozen=True)
class GpuSample:
    """One interval's answer: ``apps`` and ``gpus``; ``note`` says what went
    wrong (None: nothing); ``skipped`` lines that did not parse; ``at``
    (epoch seconds) and ``seconds`` the queries took."""

    apps: tuple[GpuApp, ...] = ()
    gpus: tuple[GpuState, ...] = ()
    note: str | None = None
    skipped: int = 0
    at: float = 0.0
    seconds: float = 0.0
    ok: bool = True


def _int(text: str) -> int | None:
    text = text.strip()
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", garbage


def parse_apps(text: str) -> tuple[list[GpuApp], int]:
    """``gpu_uuid, pid, used_memory`` lines (MiB, no units) -> (apps, lines skipped)."""
    apps: list[GpuApp] = []
    skipped = 0
    for raw in text.splitlines():
        if not raw.strip():
            continue
        if "No running" in raw:  # older drivers print a sentence instead of nothing
            continue
        parts = [p.strip() for p in raw.split(",")]
        pid = _int(parts[1]) if len(parts) == 3 else None
        mem = _int(parts[2]) if len(parts) == 3 else None
        if pid is None or pid <= 0 or not parts[0]:
            skipped += 1
            continue
        apps.append(GpuApp(parts[0], pid, max(0, mem or 0) * _MIB))
    return apps, skipped


def parse_gpus(text: str) -> tuple[list[GpuState], int]:
    """``index, uuid, utilization.gpu, memory.used`` lines -> (GPUs, lines skipped)."""
    gpus: list[GpuState] = []
    skipped = 0
    for raw in text.splitlines():
        if not raw.strip():
            continue
        parts = [p.strip() for p in raw.split(",")]
        index = _int(parts[0]) if len(parts) == 4 else None
        if index is None or index < 0 or not parts[1]:
            skipped += 1
            continue
        util = _int(parts[2])
        mem = _int(parts[3])
        gpus.append(GpuState(index, parts[1], util, None if mem is None else mem * _MIB))
    return gpus, skipped


def _run(exe: str, args: tuple[str, ...], timeout_s: float) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why it failed)."""
    try:
        proc = subprocess.run(
            [exe, *args], capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi did not answer within {timeout_s:g} s; GPU samples skipped"
    except OSError as err:
        return None, f"nvidia-smi failed ({err}); GPU samples skipped"
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[:1]
        return (
            None,
            f"nvidia-smi exited {proc.returncode} ({detail[0] if detail else 'no output'}); GPU samples skipped",
        )
    return proc.stdout, None


def query(timeout_s: float, which: Callable[[str], str | None] = shutil.which) -> GpuSample:
    """Ask nvidia-smi for the processes on GPUs and each GPU's utilisation.
    Never raises; each query waits at most ``timeout_s``."""
    started = time.monotonic()
    at = time.time()
    exe = which("nvidia-smi")
    if exe is None:
        return GpuSample(note="nvidia-smi is not on PATH; GPU samples skipped", at=at, ok=False)
    out, note = _run(exe, APPS_ARGS, timeout_s)
    if out is None:
        return GpuSample(note=note, at=at, seconds=time.monotonic() - started, ok=False)
    apps, skipped = parse_apps(out)
    out, note = _run(exe, GPUS_ARGS, timeout_s)
    gpus: list[GpuState] = []
    if out is not None:
        gpus, more = parse_gpus(out)
        skipped += more
    if skipped and note is None:
        note = f"nvidia-smi printed {skipped} line(s) jobsup could not read; they were skipped"
    return GpuSample(tuple(apps), tuple(gpus), note, skipped, at, time.monotonic() - started)
