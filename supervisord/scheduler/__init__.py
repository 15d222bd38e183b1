"""The workstation scheduler: QUEUED runs, GPUs, queues, priorities,
dependencies, hold/release (README.md, "Scheduling").

* :mod:`~supervisord.scheduler.policy`: the pure decision function (no I/O).
* :mod:`~supervisord.scheduler.gpus`: the machine's GPUs and a run's GPU env.
* :mod:`~supervisord.scheduler.options`: submit flags -> ``scheduling`` data.
* :mod:`~supervisord.scheduler.driver`: the daemon task that turns commits
  into decisions and decisions into events.
* :mod:`~supervisord.scheduler.rerun`: a new run from a recorded one.

Import the driver and rerun modules directly (they depend on the supervisor).
"""

from supervisord.scheduler.gpus import Inventory, gpu_env, inventory
from supervisord.scheduler.options import parse_scheduling, scheduling_of
from supervisord.scheduler.policy import Decision, Gpu, Situation, decide

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
