"""The workstation scheduler: QUEUED runs, GPUs, queues, priorities,
dependencies, hold/release (README.md, "Scheduling").

* :mod:`~supervisord.daemon.scheduler.policy`: the pure decision function (no I/O).
* :mod:`~supervisord.daemon.scheduler.gpus`: the machine's GPUs and a run's GPU env.
* :mod:`~supervisord.shared.scheduling`: submit flags -> ``scheduling`` data.
* :mod:`~supervisord.daemon.scheduler.driver`: the daemon task that turns commits
  into decisions and decisions into events.
* :mod:`~supervisord.daemon.scheduler.rerun`: a new run from a recorded one.

Import the driver and rerun modules directly (they depend on the supervisor).
"""

from supervisord.daemon.scheduler.gpus import Inventory, gpu_env, inventory
from supervisord.daemon.scheduler.policy import Decision, Gpu, Situation, decide
from supervisord.shared.scheduling import parse_scheduling, scheduling_of

__all__ = [
    "Decision",
    "Gpu",
    "Inventory",
    "Situation",
    "decide",
    "gpu_env",
    "inventory",
    "parse_scheduling",
    "scheduling_of",
]
