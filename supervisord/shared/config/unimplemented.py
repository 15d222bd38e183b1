"""Config keys the schema accepts but jobsup does not act on yet.

A key listed here validates (so existing config files keep loading) but
changes nothing; ``jobsup config validate`` and the daemon's start-up say so
with a warning instead of letting a user believe it works.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from supervisord.shared.config.keypath import KeyPath, format_path

__all__ = ["NOT_IMPLEMENTED", "not_implemented_warnings"]

#: key path -> what happens instead.
#: (daemon.max_running was here until the scheduler made it the default
#: queue's cap.)
NOT_IMPLEMENTED: Final[dict[KeyPath, str]] = {}


def not_implemented_warnings(data: Mapping[str, Any]) -> list[str]:
    """One line per :data:`NOT_IMPLEMENTED` key set (not None) in the
    effective config ``data``: ``"<key.path> is not implemented: ..."``."""
    out: list[str] = []
    for path, what in NOT_IMPLEMENTED.items():
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            out.append(f"{format_path(path)} is not implemented: {what}")
    return out
