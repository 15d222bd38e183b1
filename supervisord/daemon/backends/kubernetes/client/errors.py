"""Kubernetes API errors by HTTP status, and the kubeconfig error.

One class per status jobsup acts on, each a :class:`KubernetesApiError` (so
``except KubernetesApiError`` still catches them all), built from the
answer by :func:`api_error`; callers test ``isinstance(err, NotFoundError)``
instead of ``err.status == 404``. The shape follows kopf
(``kopf/_cogs/clients/errors.py``: ``APIError`` and its ``APINotFoundError``,
``APIConflictError``... picked by status).

- :class:`BadRequestError` — 400 (e.g. a container's log before it started);
- :class:`UnauthorizedError` — 401 (the credentials were refused);
- :class:`ForbiddenError` — 403 (RBAC denied the verb);
- :class:`NotFoundError` — 404 (the object or the namespace is gone);
- :class:`ConflictError` — 409 (``AlreadyExists``, or a stale
  resourceVersion/precondition);
- :class:`GoneError` — 410 (a watch's or list's resourceVersion is too old:
  relist);
- :class:`UnreachableError` — status 0: the server never answered (refused,
  hung, TLS failure).

:class:`KubeconfigError` is not an API error: the kubeconfig (or the pod's
service account) could not be loaded, so no request was made.
"""

from __future__ import annotations

from supervisord.shared.exceptions import BackendError, KubernetesApiError

__all__ = [
    "BadRequestError",
    "ConflictError",
    "ForbiddenError",
    "GoneError",
    "KubeconfigError",
    "KubernetesApiError",
    "NotFoundError",
    "UnauthorizedError",
    "UnreachableError",
    "api_error",
]


class BadRequestError(KubernetesApiError):
    """HTTP 400: the request is wrong for the object's state (a log of a
    container waiting to start, an exec into a container not running)."""


class UnauthorizedError(KubernetesApiError):
    """HTTP 401: the API server refused the credentials."""


class ForbiddenError(KubernetesApiError):
    """HTTP 403: the credentials may not do this (RBAC)."""


class NotFoundError(KubernetesApiError):
    """HTTP 404: the object (or its namespace, or the resource type) does not exist."""


class ConflictError(KubernetesApiError):
    """HTTP 409: ``AlreadyExists``, or the object changed since it was read."""


class GoneError(KubernetesApiError):
    """HTTP 410 (``Expired``/``Gone``): a resourceVersion too old to resume from."""


class UnreachableError(KubernetesApiError):
    """Status 0: the API server did not answer (refused, timed out, broken TLS)."""


class KubeconfigError(BackendError):
    """The kubeconfig (or the in-cluster service account) cannot be used:
    missing file, unknown context, unparsable YAML, a failing exec
    credential plugin. ``reason`` is ``"KubeconfigError"``."""

    reason = "KubeconfigError"


_BY_STATUS: dict[int, type[KubernetesApiError]] = {
    0: UnreachableError,
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
}


def api_error(
    message: str, *, status: int, reason: str, body: object = None, retry_after_s: float | None = None
) -> KubernetesApiError:
    """The :class:`KubernetesApiError` subclass for ``status`` (the base class
    for statuses without one of their own), with the same fields."""
    cls = _BY_STATUS.get(status, KubernetesApiError)
    return cls(message, status=status, reason=reason, body=body, retry_after_s=retry_after_s)
