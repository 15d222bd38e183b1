"""Imports every command module so that each registers its commands on ``cli``."""

from __future__ import annotations

from supervisord.cli import runs_cmd  # noqa: F401
from supervisord.cli import render_cmd  # noqa: F401
from supervisord.cli import config_cmd  # noqa: F401
from supervisord.cli import queue_cmd  # noqa: F401
from supervisord.cli import schema_cmd  # noqa: F401
from supervisord.cli import mcp_cmd  # noqa: F401
from supervisord.cli import hooks_cmd  # noqa: F401
from supervisord.cli import ui_cmd  # noqa: F401
