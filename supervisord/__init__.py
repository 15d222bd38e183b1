"""jobsup: the ``jobsup`` CLI and its daemon, in three sides.

- :mod:`supervisord.client`: the command line, the MCP server and the
  daemon API's client;
- :mod:`supervisord.daemon`: the service, the API server, the command path,
  the supervisor, the scheduler, hooks, the page and the backends;
- :mod:`supervisord.shared`: what both use (errors, the event catalog,
  config, the API's wire format, the contracts' pure halves).

:mod:`supervisord.entry` (the console script) is the one module that
composes both sides. Import contracts in pyproject.toml hold it:
``entry -> client | daemon -> shared -> store``, with the client and the
daemon independent of each other.

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
