"""Where jobsup keeps its files (README, "Files and environment variables").

========================  ==========================================  ========================
what                      default                                     override
========================  ==========================================  ========================
state dir                 ``$XDG_STATE_HOME/jobsup``                  ``JOBSUP_STATE_DIR``
database                  ``<state dir>/jobsup.db``                   —
API socket                ``$XDG_RUNTIME_DIR/jobsup/jobsup.sock``,    ``JOBSUP_SOCKET``
                          else ``<state dir>/jobsup.sock``
========================  ==========================================  ========================

Config file paths live in :mod:`supervisord.shared.config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

__all__ = ["Paths"]


class Paths(NamedTuple):
    """The resolved locations for one daemon (and its clients). A named
    tuple, not a dataclass: :mod:`dataclasses` imports :mod:`inspect`,
    which every CLI command would pay for at start."""

    state_dir: Path
    socket: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Paths:
        """Resolve from ``env`` (default ``os.environ``) as the table above says."""
        env = os.environ if env is None else env
        if env.get("JOBSUP_STATE_DIR"):
            state = Path(env["JOBSUP_STATE_DIR"]).expanduser()
        elif env.get("XDG_STATE_HOME"):
            state = Path(env["XDG_STATE_HOME"]).expanduser() / "jobsup"
        else:
            import platformdirs  # only here: the CLI pays for it only when it needs it

            state = Path(platformdirs.user_state_dir("jobsup", appauthor=False))
        if env.get("JOBSUP_SOCKET"):
            sock = Path(env["JOBSUP_SOCKET"]).expanduser()
        elif env.get("XDG_RUNTIME_DIR"):
            sock = Path(env["XDG_RUNTIME_DIR"]) / "jobsup" / "jobsup.sock"
        else:
            sock = state / "jobsup.sock"
        return cls(state_dir=state.absolute(), socket=sock.absolute())

    @property
    def database(self) -> Path:
        """``<state dir>/jobsup.db``."""
        return self.state_dir / "jobsup.db"

    @property
    def runs_dir(self) -> Path:
        """``<state dir>/runs``: one private folder per run."""
        return self.state_dir / "runs"

    @property
    def snapshots_dir(self) -> Path:
        """``<state dir>/snapshots``: content-addressed source archives."""
        return self.state_dir / "snapshots"

    @property
    def daemon_log(self) -> Path:
        """``<state dir>/daemon.log``: the log of a daemon the CLI started."""
        return self.state_dir / "daemon.log"
