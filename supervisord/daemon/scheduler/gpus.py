"""The machine's GPUs: found with ``nvidia-smi`` or listed in the daemon
config, and the environment a run gets for the GPUs it holds.

``scheduler.gpus: auto`` (the default) runs
``nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader``
(NVIDIA's documented query interface, ``nvidia-smi --help-query-gpu``); no
``nvidia-smi``, or one that fails, means no GPUs and a note for ``doctor``,
never an error. A list (``[0, 2]`` or ``[GPU-…, …]``) restricts the daemon to
those GPUs; entries are matched against what ``nvidia-smi`` lists when it
answers, else taken as written.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from supervisord.daemon.scheduler.policy import Gpu
from supervisord.shared.exceptions import ConfigError

__all__ = ["NVIDIA_SMI_ARGS", "Inventory", "gpu_env", "inventory", "parse_nvidia_smi", "query_nvidia_smi"]

NVIDIA_SMI_ARGS = ("--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader")
_TIMEOUT_S = 15.0


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The GPUs the daemon hands out (index order) and, when there are
    none or some could not be read, a one-line ``note`` for ``doctor``."""

    gpus: tuple[Gpu, ...]
    note: str | None = None
    source: str = "auto"


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """The GPUs in nvidia-smi's ``csv,noheader`` output of ``index, uuid,
    name, memory.total`` (e.g. ``0, GPU-5e1c…, NVIDIA A100-SXM4-40GB, 40960
    MiB``). Raises ValueError naming a line that does not parse."""
    gpus: list[Gpu] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        parts = [p.strip() for p in raw.split(",")]
        if len(parts) < 4 or not parts[0].isdigit() or not parts[1]:
            raise ValueError(f"unexpected nvidia-smi line {raw.strip()!r}")
        # A GPU name may itself hold a comma: everything between uuid and memory.
        gpus.append(Gpu(int(parts[0]), parts[1], ", ".join(parts[2:-1]), parts[-1]))
    return sorted(gpus, key=lambda g: g.index)


def query_nvidia_smi(which: Callable[[str], str | None] = shutil.which) -> tuple[list[Gpu], str | None]:
    """Ask nvidia-smi (found on PATH) for the GPUs: ``(gpus, note)``; the
    note says why there are none (absent tool, failure, bad output). Blocks
    up to 15 s: call it from a worker thread."""
    exe = which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi is not on PATH: no GPUs are managed (runs with --gpus cannot start)"
    try:
        proc = subprocess.run([exe, *NVIDIA_SMI_ARGS], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [], f"nvidia-smi failed ({err}): no GPUs are managed"
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[:1]
        return [], f"nvidia-smi exited {proc.returncode} ({detail[0] if detail else 'no output'}): no GPUs are managed"
    try:
        gpus = parse_nvidia_smi(proc.stdout)
    except ValueError as err:
        return [], f"nvidia-smi: {err}: no GPUs are managed"
    if not gpus:
        return [], "nvidia-smi lists no GPU: no GPUs are managed"
    return gpus, None


def inventory(setting: Any, query: Callable[[], tuple[list[Gpu], str | None]] = query_nvidia_smi) -> Inventory:
    """The GPUs for ``scheduler.gpus`` (``"auto"``/None, or a list of
    indices and UUIDs). Raises ConfigError naming ``scheduler.gpus`` for a
    duplicate entry or an index/UUID that nvidia-smi does not list."""
    if setting is None or setting == "auto":
        gpus, note = query()
        return Inventory(tuple(gpus), note, "auto")
    if not isinstance(setting, list):
        raise ConfigError(f"scheduler.gpus: must be `auto` or a list of GPU indices or UUIDs, got {setting!r}")
    found, note = query()
    by_index = {g.index: g for g in found}
    by_uuid = {g.uuid: g for g in found}
    out: list[Gpu] = []
    for pos, entry in enumerate(setting):
        if isinstance(entry, bool) or not isinstance(entry, (int, str)) or entry == "":
            raise ConfigError(f"scheduler.gpus[{pos}]: must be a GPU index or UUID, got {entry!r}")
        gpu: Gpu | None
        if found:
            gpu = by_index.get(entry) if isinstance(entry, int) else by_uuid.get(entry)
            if gpu is None and isinstance(entry, str) and entry.isdigit():
                gpu = by_index.get(int(entry))
            if gpu is None:
                raise ConfigError(f"scheduler.gpus[{pos}]: nvidia-smi lists no GPU {entry!r}")
        elif isinstance(entry, int):
            gpu = Gpu(entry, str(entry))
        else:
            gpu = Gpu(int(entry) if entry.isdigit() else pos, entry)
        if any(g.uuid == gpu.uuid or g.index == gpu.index for g in out):
            raise ConfigError(f"scheduler.gpus[{pos}]: GPU {entry!r} is listed twice")
        out.append(gpu)
    return Inventory(tuple(sorted(out, key=lambda g: g.index)), None, "config")


def gpu_env(gpus: Sequence[Gpu], *, managed: bool, cpu_runs_see_gpus: bool) -> Mapping[str, str]:
    """What a local run's environment gets for ``gpus``.

    With GPUs: ``CUDA_VISIBLE_DEVICES`` (their UUIDs, comma-separated),
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so CUDA numbers devices like
    nvidia-smi) and ``JOBSUP_GPUS`` (their nvidia-smi indices). Without: an
    empty ``CUDA_VISIBLE_DEVICES`` when the daemon ``managed`` GPUs, unless
    ``cpu_runs_see_gpus``; else nothing.
    """
    if gpus:
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "JOBSUP_GPUS": ",".join(str(g.index) for g in gpus),
        }
    if managed and not cpu_runs_see_gpus:
        return {"CUDA_VISIBLE_DEVICES": ""}
    return {}
