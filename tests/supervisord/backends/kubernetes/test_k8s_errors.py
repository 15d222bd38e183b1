"""Kubernetes API errors by status, and the kubeconfig error apart from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisord.daemon.backends.kubernetes.client.access import ClusterAccess, api_error_from_body, is_transient
from supervisord.daemon.backends.kubernetes.client.errors import (
    BadRequestError,
    ConflictError,
    ForbiddenError,
    GoneError,
    KubeconfigError,
    KubernetesApiError,
    NotFoundError,
    UnauthorizedError,
    UnreachableError,
    api_error,
)


@pytest.mark.parametrize(
    "status,cls",
    [
        (0, UnreachableError),
        (400, BadRequestError),
        (401, UnauthorizedError),
        (403, ForbiddenError),
        (404, NotFoundError),
        (409, ConflictError),
        (410, GoneError),
        (422, KubernetesApiError),
        (500, KubernetesApiError),
    ],
)
def test_error_class_by_status(status: int, cls: type[KubernetesApiError]) -> None:
    err = api_error("x", status=status, reason="R")
    assert type(err) is cls and isinstance(err, KubernetesApiError)
    assert (err.status, err.reason) == (status, "R")


def test_status_body_gives_the_class_reason_and_message() -> None:
    body = b'{"kind":"Status","status":"Failure","reason":"AlreadyExists","message":"jobs.batch \\"t\\" already exists","code":409}'
    err = api_error_from_body(409, body, "create Job/t")
    assert isinstance(err, ConflictError) and err.reason == "AlreadyExists"
    assert str(err) == 'create Job/t: jobs.batch "t" already exists'
    gone = api_error_from_body(
        410, b'{"kind":"Status","reason":"Expired","message":"too old resource version"}', "watch"
    )
    assert isinstance(gone, GoneError) and not is_transient(gone)
    assert is_transient(api_error("x", status=0, reason="Unreachable")) and is_transient(
        api_error_from_body(503, b"", "x")
    )


@pytest.mark.anyio
async def test_a_missing_kubeconfig_is_a_kubeconfig_error_not_an_api_error(tmp_path: Path) -> None:
    access = ClusterAccess(kubeconfig=str(tmp_path / "nope"))
    with pytest.raises(KubeconfigError) as err:
        await access.cluster(None)
    assert not isinstance(err.value, KubernetesApiError)
    assert str(tmp_path / "nope") in str(err.value)
    (tmp_path / "bad").write_text("apiVersion: v1\nkind: Config\ncontexts: []\nclusters: []\nusers: []\n")
    with pytest.raises(KubeconfigError):
        await ClusterAccess(kubeconfig=str(tmp_path / "bad")).cluster("missing-context")
