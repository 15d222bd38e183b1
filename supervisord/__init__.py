"""jobsup's daemon side: the API, the CLI, backends, config and the supervisor.

Layers (enforced by import-linter, see pyproject.toml): ``cli -> api.client``
for the command line; ``daemon -> api.server -> supervisor -> backends ->
store``.

``__version__`` is the installed distribution's version
(:func:`importlib.metadata.version`): pyproject.toml is its one source.
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__", "version"]


def version() -> str:
    """The installed ``jobsup`` version (pyproject.toml), or ``0+unknown``
    when the package runs without being installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _dist_version

    try:
        return _dist_version("jobsup")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
