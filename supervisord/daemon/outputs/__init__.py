"""A run's outputs folder (README, "Where your run runs, and where its results go").

``JOBSUP_OUTPUT_DIR`` is ``<outputs dir>/<project>/<run id>/``
(:func:`run_outputs_dir`), ``<outputs dir>`` being ``local.outputs_dir``,
default ``$XDG_DATA_HOME/jobsup/outputs`` (:func:`outputs_root`). It is
created 0700 before the run starts and never removed by jobsup. When the
run ends, the daemon lists every file under it with its sha256
(:mod:`supervisord.shared.outputscan`, driven from the event log by
:mod:`supervisord.daemon.outputs.recorder`) in an ``OutputsRecorded`` event.

This module is pure (the CLI imports it).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisord.shared.events import OUTPUTS_RECORDED
from supervisord.shared.exceptions import ConfigError

__all__ = ["OUTPUTS_RECORDED", "check_outputs_root", "outputs_root", "run_outputs_dir"]


def outputs_root(config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Path:
    """The outputs dir for an effective ``config``: ``local.outputs_dir``
    (``~`` expanded; it must then be absolute), else
    ``$XDG_DATA_HOME/jobsup/outputs`` (platformdirs, as the state dir is
    found). Raises ConfigError naming the key."""
    local = config.get("local") or {}
    given = local.get("outputs_dir") if isinstance(local, Mapping) else None
    if given is not None:
        path = Path(os.path.expanduser(str(given)))
        if not path.is_absolute():
            raise ConfigError(f"local.outputs_dir {given!r}: give an absolute path (or one starting with ~)")
        return Path(os.path.normpath(path))
    env = os.environ if env is None else env
    if env.get("XDG_DATA_HOME"):
        return Path(env["XDG_DATA_HOME"]).expanduser().absolute() / "jobsup" / "outputs"
    import platformdirs

    return Path(platformdirs.user_data_dir("jobsup", appauthor=False)).absolute() / "outputs"


def run_outputs_dir(submitted: Mapping[str, Any], run_id: str) -> Path | None:
    """``<outputs dir>/<project>/<run id>`` of a run from its Submitted
    data (``outputs_root``, ``project``); None for a run without one (a
    Kubernetes run, a run recorded before outputs folders)."""
    root = submitted.get("outputs_root")
    if not isinstance(root, str) or not root:
        return None
    return Path(root) / str(submitted.get("project") or "_") / run_id


def check_outputs_root(root: Path) -> None:
    """Refuse an outputs dir that another user could tamper with (as the
    state dir is refused): once it exists, it must belong to this user and
    neither group nor others may write it (a folder that does not exist yet
    is created 0700 at the first run's start). Raises ConfigError naming
    ``local.outputs_dir``."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return
    except OSError as err:
        raise ConfigError(f"local.outputs_dir {root}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"local.outputs_dir {root} is not a folder")
    if st.st_uid != os.getuid():
        raise ConfigError(f"local.outputs_dir {root} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"local.outputs_dir {root} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod 700 {root}`"
        )
