"""jobsup's daemon side: the API, the CLI, backends, config and the supervisor.

Layers (enforced by import-linter): ``cli -> api.client`` for the command
line; ``daemon -> api.server -> supervisor -> backends -> store``.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
