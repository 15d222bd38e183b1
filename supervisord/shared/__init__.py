"""What the client and the daemon share: errors (:mod:`.exceptions`, whose
root :class:`JobsupError` is re-exported here), the event catalog
(:mod:`.events`), run phases (:mod:`.lifecycle`), config (:mod:`.config`),
the API's wire format (:mod:`.wire`), JSON Schemas, task files, and the pure
halves of the contracts (the Kubernetes manifest, the Slurm script,
scheduling options, limits, hooks config, retries). Nothing here imports
the client or the daemon."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["JobsupError"]

if TYPE_CHECKING:
    from supervisord.shared.exceptions import JobsupError


def __getattr__(attr: str) -> Any:
    if attr == "JobsupError":
        return importlib.import_module("supervisord.shared.exceptions").JobsupError
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
