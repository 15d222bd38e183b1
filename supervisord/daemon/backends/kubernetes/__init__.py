"""The Kubernetes backend: the manifest contract and render, and the backend
proper (:class:`KubernetesBackend`: cluster access, preflight, submit and
rollback, source staging, shared watches, phase mapping, logs, cancel,
reattach).

The contract (docs/kubernetes.md): the run's shape
lives in a manifest committed to the repository; jobsup reads it from the
recorded commit (:func:`load_manifest_at_commit`), lints and injects the run
contract, applies the config's pod patch and sandbox options, and gets the
exact objects to create from :func:`render_run`.

Layout:

- ``manifest/`` — the contract, pure (no cluster client, store or HTTP; an
  import-linter contract holds it): ``load``, ``lint``, ``inject``,
  ``sandbox``, ``script``, ``render``;
- ``client/`` — the cluster: ``access`` (kubeconfig, clients, retries),
  ``errors`` (API errors by status, KubeconfigError), ``resources``
  (objects and their paths), ``watches`` (the shared Job/Pod watches);
- runtime, modules named for what they do: ``runstate`` (a run's settings
  from its RunSpec, in-memory state, the errors that end it),
  ``connections`` (clusters, resolvers, the shared watches), ``preflight``
  (checks and doctor, with a cache of cluster facts), ``launch`` (start:
  dry runs, creates, staging, one budget), ``cleanup`` (rollback, cancel,
  end-of-run deletions), ``reconciler`` (the per-run supervision loop; it
  receives its collaborators), ``phase`` (Job/pod -> phase and reason,
  pure), ``staging`` (the exec upload), ``logs``;
- ``backend`` — :class:`KubernetesBackend`, the Backend protocol by
  delegation to the runtime modules.

Import contracts in pyproject.toml hold the layering: ``manifest`` imports
nothing of the client, the runtime, the store or httpx; ``client`` imports
nothing of the runtime; the runtime modules never import ``backend``.
"""

from __future__ import annotations

from supervisord.daemon.backends.kubernetes.backend import KubernetesBackend
from supervisord.shared.manifest.inject import ENV_SECRET, LABEL_NAME, LABEL_PROJECT, LABEL_RUN
from supervisord.shared.manifest.lint import PRIMARY_LABEL, SCRIPT_ENV
from supervisord.shared.manifest.load import (
    DEFAULT_MANIFEST_PATH,
    RUN_TOKEN,
    load_manifest_at_commit,
    manifest_path_for,
)
from supervisord.shared.manifest.render import (
    DEFAULT_STAGING_TIMEOUT_S,
    RenderedRun,
    objects_to_json,
    objects_to_yaml,
    render_run,
)
from supervisord.shared.manifest.script import (
    READY_MARKER,
    SOURCE_TAR,
    STAGING_DIR,
    STAGING_TIMEOUT_EXIT_CODE,
)

__all__ = [
    "DEFAULT_MANIFEST_PATH",
    "DEFAULT_STAGING_TIMEOUT_S",
    "ENV_SECRET",
    "LABEL_NAME",
    "LABEL_PROJECT",
    "LABEL_RUN",
    "PRIMARY_LABEL",
    "READY_MARKER",
    "RUN_TOKEN",
    "SCRIPT_ENV",
    "SOURCE_TAR",
    "STAGING_DIR",
    "STAGING_TIMEOUT_EXIT_CODE",
    "KubernetesBackend",
    "RenderedRun",
    "load_manifest_at_commit",
    "manifest_path_for",
    "objects_to_json",
    "objects_to_yaml",
    "render_run",
]
