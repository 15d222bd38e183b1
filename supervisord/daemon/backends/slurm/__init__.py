"""The Slurm backend: each run is one ``sbatch`` job on a Slurm cluster,
reached by the Slurm commands of this machine or over ``ssh`` to a login
node (README, "Running on Slurm").

Layout: ``script`` (pure: settings, the sbatch command, the wrapper, the
env file), ``status`` (pure: Slurm's answers -> phase and reason),
``transport`` (local commands or ssh, one multiplexed connection),
``poller`` (one squeue per cycle for all jobs), ``backend``
(:class:`SlurmBackend`).
"""

from __future__ import annotations

from supervisord.daemon.backends.slurm.backend import SlurmBackend, run_gpus
from supervisord.shared.slurmscript import SlurmSettings, sbatch_argv, wrapper_script

__all__ = ["SlurmBackend", "SlurmSettings", "run_gpus", "sbatch_argv", "wrapper_script"]
