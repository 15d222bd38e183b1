"""Talking to the cluster: kubeconfig and clients (:mod:`.access`), API
errors by status (:mod:`.errors`), objects and their resource paths
(:mod:`.resources`), the shared Job and Pod watches (:mod:`.watches`).

Knows nothing of runs, the event store or the manifest contract beyond the
run label it selects on.
"""

from supervisord.daemon.backends.kubernetes.client import access, errors, resources, watches

__all__ = ["access", "errors", "resources", "watches"]
