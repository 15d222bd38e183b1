"""What a run uses: limits (``--memory``, ``--cpus``), the machine's capacity,
and the sampler that measures local runs' process trees (CPU, RSS, GPU
memory) and stops a run that passes its memory limit.

Modules: :mod:`.limits` (pure parsing and formatting), :mod:`.procs` (one
pass over the process table), :mod:`.nvidia` (one ``nvidia-smi`` query per
interval), :mod:`.sampler` (the daemon's service).
"""

from supervisord.shared.limits import format_bytes, parse_cpus, parse_memory

__all__ = ["format_bytes", "parse_cpus", "parse_memory"]
