"""Deleting a run's objects: the rollback of a failed start, cancel, the
end of a run (auxiliary objects), and a submit the daemon stopped in the
middle of.

Every deletion goes newest first (Jobs with propagationPolicy Background;
NotFound counts as gone) and is recorded as ``ObjectDeleted`` when a
reporter is given. Rollback and cancel each have one budget
(``timeout_s``): an API server that accepts connections and never answers
must not hold them in retries for minutes. A rollback that runs out of it
records ``CleanupFailed`` naming what may remain (cleanup pending).
"""

from __future__ import annotations

from typing import Any

import anyio
import structlog

from supervisord.daemon.backends.base import RunReporter
from supervisord.daemon.backends.kubernetes.client.access import Cluster
from supervisord.daemon.backends.kubernetes.client.resources import ObjectRef, ResourceResolver
from supervisord.shared.events import CLEANUP_FAILED, OBJECT_DELETED, ObjectCreatedData
from supervisord.shared.exceptions import BackendError, KubernetesApiError

__all__ = ["Cleanup"]

log = structlog.get_logger("jobsup.kubernetes.cleanup")


class Cleanup:
    """Deletes run objects; ``timeout_s``: the budget of one rollback or
    one cancel, in seconds."""

    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def delete_refs(
        self,
        resolver: ResourceResolver,
        ns: str,
        refs: list[ObjectRef],
        reporter: RunReporter | None,
        *,
        deleted: list[str] | None = None,
    ) -> list[str]:
        """Delete ``refs`` in the order given; returns what was deleted (also
        appended to ``deleted`` as it goes, when given). Errors other than
        NotFound are collected and raised together as BackendError after
        trying every object. No budget of its own."""
        deleted = [] if deleted is None else deleted
        errors: list[str] = []
        for ref in refs:
            try:
                if await resolver.delete(ref, ns):
                    deleted.append(str(ref))
                    if reporter is not None:
                        await reporter.record(OBJECT_DELETED(object_data(ref)))
            except KubernetesApiError as err:
                errors.append(str(err))
        if errors:
            raise BackendError("could not delete every object of the run: " + "; ".join(errors))
        return deleted

    async def rollback(
        self, resolver: ResourceResolver, ns: str, refs: list[ObjectRef], reporter: RunReporter | None
    ) -> str:
        """Delete ``refs`` (newest first already) after a failure, within
        ``timeout_s``; returns the text to append to the error (what was
        deleted, or what could not be). When the budget runs out, what may
        remain is recorded as ``CleanupFailed`` (cleanup pending)."""
        if not refs:
            return ""
        deleted: list[str] = []
        try:
            with anyio.fail_after(self.timeout_s):
                await self.delete_refs(resolver, ns, refs, reporter, deleted=deleted)
        except TimeoutError:
            left = [str(r) for r in refs if str(r) not in deleted]
            message = (
                f"cleanup pending: the API server did not answer within {self.timeout_s:g}s while jobsup "
                f"deleted what it had created; these may remain in namespace {ns}: {', '.join(left)} "
                f"(kubectl -n {ns} delete them once the cluster answers)"
            )
            if reporter is not None:
                await reporter.record(CLEANUP_FAILED({"message": message}))
            return f"; {message}"
        except BackendError as err:
            return f"; rolling back failed too: {err}"
        return f"; jobsup deleted what it had created ({', '.join(deleted)})" if deleted else ""

    async def find_run_objects(
        self, resolver: ResourceResolver, ns: str, run_id: str, refs: list[ObjectRef]
    ) -> list[ObjectRef]:
        """``refs`` plus every object of their kinds (and Jobs and Secrets)
        labelled with the run, in ``refs`` order then the others."""
        out = list(refs)
        names = {(r.kind, r.name) for r in refs}
        kinds = {(r.api_version, r.kind) for r in refs} | {("batch/v1", "Job"), ("v1", "Secret")}
        for api_version, kind in sorted(kinds):
            try:
                items = await resolver.list_run(api_version, kind, ns, run_id)
            except KubernetesApiError as err:
                log.warning("cannot list the run's objects", kind=kind, error=str(err))
                continue
            for item in items:
                ref = ObjectRef.of(item)
                if (ref.kind, ref.name) not in names:
                    names.add((ref.kind, ref.name))
                    out.append(ref)
        return out

    async def cancel(
        self, cluster: Cluster, resolver: ResourceResolver, ns: str, run_id: str, refs: list[ObjectRef]
    ) -> None:
        """Delete the run's objects (``refs`` and whatever carries its label)
        newest first and return once no pod of the run remains, all within
        ``timeout_s``. Raises BackendError when an object cannot be deleted,
        the server does not answer in time, or pods are still there."""
        pods: list[dict[str, Any]] = []
        step = "find the run's objects"
        try:
            with anyio.fail_after(self.timeout_s):
                found = await self.find_run_objects(resolver, ns, run_id, refs)
                step = "delete the run's objects"
                await self.delete_refs(resolver, ns, list(reversed(found)), None)
                step = "wait for the run's pods to go"
                while True:
                    pods = await resolver.list_run("v1", "Pod", ns, run_id)
                    if not pods:
                        log.info("canceled", run=run_id)
                        return
                    await anyio.sleep(0.5)
        except TimeoutError:
            pass
        if pods:
            names = ", ".join(str(p["metadata"]["name"]) for p in pods)
            raise BackendError(f"the run's pods are still terminating after {self.timeout_s:g}s: {names}")
        raise BackendError(
            f"could not {step} within {self.timeout_s:g}s: the Kubernetes API server at {cluster.host} "
            "does not answer in time"
        )

    async def abandoned_submit(
        self, resolver: ResourceResolver | None, ns: str, run_id: str, refs: list[ObjectRef], reporter: RunReporter
    ) -> None:
        """The daemon stopped while creating this run's objects: delete what
        exists (``refs``, or found by the run label; nothing when
        ``resolver`` is None: no handle was recorded) and report ERROR
        ``SubmitInterrupted``."""
        deleted: list[str] = []
        if resolver is not None:
            found = await self.find_run_objects(resolver, ns, run_id, refs)
            deleted = await self.delete_refs(resolver, ns, list(reversed(found)), reporter)
        await reporter.phase(
            "ERROR",
            reason="SubmitInterrupted",
            message="the daemon stopped while this run's objects were being created; "
            + (f"jobsup deleted them ({', '.join(deleted)})" if deleted else "nothing of it was left on the cluster"),
        )


def object_data(ref: ObjectRef) -> ObjectCreatedData:
    """The data of an ObjectCreated/ObjectDeleted event naming ``ref``
    (the keys of :meth:`ObjectRef.to_json`, in its order)."""
    return {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name, "uid": ref.uid}
