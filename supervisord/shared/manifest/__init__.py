"""The manifest contract, pure: load the manifest from the recorded commit
(:mod:`.load`), lint it (:mod:`.lint`), inject the run contract
(:mod:`.inject`), apply sandbox options (:mod:`.sandbox`), build the gated
script (:mod:`.script`), and render the exact objects (:mod:`.render`).

Imports nothing of the cluster client, the event store or httpx (an
import-linter contract in pyproject.toml holds it to that): ``jobsup
render`` and tests use it without a cluster.
"""

from supervisord.shared.manifest import inject, lint, load, render, sandbox, script

__all__ = ["inject", "lint", "load", "render", "sandbox", "script"]
