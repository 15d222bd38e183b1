"""The web page: runs, a run (timeline, live log, cancel, rerun), events and
the queue, served by the daemon on 127.0.0.1 behind a one-time token.

Public surface: :class:`UiServer` (the daemon side) and :class:`UiActions`
(what the page may do besides reading the store).
"""

from supervisord.daemon.ui.app import UiActions
from supervisord.daemon.ui.server import UiConfigError, UiServer

__all__ = ["UiActions", "UiConfigError", "UiServer"]
