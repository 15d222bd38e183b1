"""The environment an autostarted daemon gets (README, "Files and environment").

A CLI command that finds no daemon starts one in the background
(:meth:`supervisord.client.api.Client.connect`). That daemon outlives the
shell, serves every later command of every shell, and local runs no longer
start from its environment (``local.env_from: submitter``): so it must not
carry the first shell's variables (a token exported there would sit in
``/proc/<daemon>/environ`` for the daemon's whole life). It gets a clean
environment instead, like a systemd ``--user`` unit: only the variables
:func:`daemon_env` keeps, which are what the daemon itself needs:

* where things are: ``PATH`` (``git``, ``nvidia-smi``, ``systemd-run``,
  ``kubectl``, ``sbatch``, ``ssh``), ``HOME``, ``USER``, ``LOGNAME``,
  ``SHELL``, ``TMPDIR``, every ``XDG_*`` (state, config, data and runtime
  folders) and every ``JOBSUP_*`` (the state dir, socket and config
  overrides; a hook's ``secret_env`` may name one);
* how to speak: ``LANG``, ``LANGUAGE``, ``LC_*``, ``TZ``;
* what the backends and hooks use: ``KUBECONFIG``, ``SLURM_CONF``,
  ``SSH_AUTH_SOCK`` (the user's keys for the Slurm login node),
  ``DBUS_SESSION_BUS_ADDRESS`` (``systemd-run --user``), the proxy variables
  (``http_proxy``, ``https_proxy``, ``no_proxy``, ``all_proxy``, either case:
  webhooks honour them);
* how Python finds jobsup: ``PYTHONPATH``, ``VIRTUAL_ENV``.

Everything else is dropped. A daemon started by hand (``jobsup daemon``)
or by systemd keeps the environment it was given.

Pure: standard library only (the CLI imports it when it starts a daemon).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["KEPT_NAMES", "KEPT_PREFIXES", "daemon_env"]

#: Variables kept by name.
KEPT_NAMES: Final[frozenset[str]] = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TMPDIR",
        "LANG",
        "LANGUAGE",
        "TZ",
        "KUBECONFIG",
        "SLURM_CONF",
        "SSH_AUTH_SOCK",
        "DBUS_SESSION_BUS_ADDRESS",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        *(p for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy") for p in (name, name.upper())),
    }
)
#: Variables kept by prefix.
KEPT_PREFIXES: Final[tuple[str, ...]] = ("XDG_", "JOBSUP_", "LC_")


def daemon_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a daemon started from a process whose
    environment is ``env``: only the variables the module doc lists, with
    ``PYTHONUNBUFFERED=1`` (as the systemd unit sets)."""
    out = {k: v for k, v in env.items() if k in KEPT_NAMES or k.startswith(KEPT_PREFIXES)}
    out["PYTHONUNBUFFERED"] = "1"
    return out
