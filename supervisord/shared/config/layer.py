"""The config layer: one source's document, and the names of the sources.

Sources, lowest to highest priority (README, "Configuration")::

    default   built-in defaults (supervisord.shared.config.defaults())
    daemon    $XDG_CONFIG_HOME/jobsup/daemon.yaml   or JOBSUP_DAEMON_CONFIG
    user      $XDG_CONFIG_HOME/jobsup/config.yaml   or JOBSUP_CONFIG
    project   ./.jobsup.yaml                        or JOBSUP_PROJECT_CONFIG
    task      the task YAML's ``config:`` field
    cli       ``--config FILE`` or ``--config KEY.PATH=VALUE`` pairs
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

__all__ = ["CLIENT_LAYER_NAMES", "LAYER_NAMES", "Layer", "LayerName", "Origin", "describe_origin"]

LayerName = Literal["default", "daemon", "user", "project", "task", "cli"]
#: Every layer name, lowest priority first.
LAYER_NAMES: tuple[LayerName, ...] = ("default", "daemon", "user", "project", "task", "cli")
#: The layers a client reads and sends with a submit, lowest priority first.
CLIENT_LAYER_NAMES: tuple[LayerName, ...] = ("user", "project", "task", "cli")
#: Where a value came from: (layer name, file or None). ``file`` is the path of
#: the layer's file; for the ``cli`` layer given as pairs it is ``None``; for a
#: value taken from an environment variable the layer is ``"env"`` and ``file``
#: the variable's name.
Origin = tuple[str, "str | None"]


@dataclasses.dataclass(frozen=True)
class Layer:
    """One config source.

    ``name`` is the source (see :data:`LAYER_NAMES`), ``file`` the file it was
    read from (``None`` for defaults and ``--config`` pairs), ``data`` the
    document: a mapping with string keys, JSON-compatible values.
    """

    name: LayerName
    file: str | None
    data: dict[str, Any]

    def describe(self) -> str:
        """``the user layer (/home/me/.config/jobsup/config.yaml)``: for errors."""
        return describe_origin((self.name, self.file))


def describe_origin(origin: Origin) -> str:
    """Name an origin for a user: ``the <layer> layer (<file>)``."""
    name, file = origin
    if name == "env":
        return f"the environment variable {file}"
    return f"the {name} layer ({file})" if file else f"the {name} layer"
