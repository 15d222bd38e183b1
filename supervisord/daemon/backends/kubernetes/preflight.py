"""Preflight: can this run start on this cluster? (docs/kubernetes.md,
"Preflight and `jobsup doctor`".)

Checked, each failure one line saying what to fix, nothing created:

1. the kubeconfig loads and names the context (:mod:`.access`);
2. the API server answers (``GET /version``);
3. SelfSubjectAccessReview (authorization.k8s.io/v1) allows, in the
   namespace: create/delete/list/watch Jobs, list/watch Pods, create
   ``pods/exec``, get ``pods/log``, create/update Secrets, and create every
   other kind the manifest holds;
4. every Secret and PersistentVolumeClaim the rendered pod templates
   reference (volumes, ``envFrom``, ``secretKeyRef``; optional references
   excepted; objects the manifest itself creates excepted) exists, and so
   does the RuntimeClass; a 403 on reading a RuntimeClass is a warning (many
   users may not read cluster-scoped objects), not a refusal.

Each problem says who has to fix it (:class:`Problem`): the user's own
config or input (the kubeconfig, ``kubernetes.context``,
``kubernetes.namespace``, the manifest's references; bad input, exit 2),
or the cluster itself (an API server that does not answer, throttles or
fails with a 5xx; exit 1). :func:`preflight_error` builds the error.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.to_thread

from supervisord.daemon.backends.base import RunSpec
from supervisord.daemon.backends.kubernetes.client.access import Cluster, is_transient
from supervisord.daemon.backends.kubernetes.client.errors import (
    ForbiddenError,
    KubeconfigError,
    KubernetesApiError,
    UnauthorizedError,
    UnreachableError,
)
from supervisord.daemon.backends.kubernetes.client.resources import ResourceResolver
from supervisord.daemon.backends.kubernetes.connections import Connections
from supervisord.daemon.backends.kubernetes.runstate import RunSettings, render_spec
from supervisord.shared.exceptions import JobsupError, PreflightConfigError, PreflightError
from supervisord.shared.manifest.render import RenderedRun

__all__ = [
    "REQUIRED_ACCESS",
    "AccessCheck",
    "PreflightChecker",
    "Problem",
    "References",
    "check_access",
    "check_api",
    "check_references",
    "preflight_error",
    "references",
]


@dataclasses.dataclass(frozen=True)
class AccessCheck:
    """One permission: ``verb`` on ``resource`` (plural, e.g. ``jobs``) of API
    ``group`` ("" for core), optionally a ``subresource`` (``exec``, ``log``)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""

    def describe(self) -> str:
        """``create jobs.batch``, ``create pods/exec``."""
        res = self.resource + (f".{self.group}" if self.group else "")
        return f"{self.verb} {res}" + (f"/{self.subresource}" if self.subresource else "")

    def rule(self) -> str:
        """The RBAC Role rule that grants it, for the fix-it line."""
        res = self.resource + (f"/{self.subresource}" if self.subresource else "")
        return f'apiGroups: ["{self.group}"], resources: ["{res}"], verbs: ["{self.verb}"]'


@dataclasses.dataclass(frozen=True)
class Problem:
    """One failed check: ``text`` (one line saying what to fix) and whether
    the cluster itself is at fault (``cluster``: no answer, throttling, a
    5xx) rather than the user's config or input."""

    text: str
    cluster: bool = False

    @classmethod
    def of_api_error(cls, text: str, err: KubernetesApiError) -> Problem:
        """A problem caused by ``err``: the cluster's when it is transient
        (no answer, 429, 5xx), else the user's (403, 404, 422...)."""
        return cls(text, cluster=is_transient(err))


def preflight_error(head: str, problems: list[Problem]) -> PreflightError:
    """The error for ``problems`` (one line each under ``head``): a
    :class:`~supervisord.shared.exceptions.PreflightConfigError` (bad input, exit 2)
    when every problem is the user's to fix, else a PreflightError (exit 1)."""
    lines = [p.text for p in problems]
    message = head + "\n" + "\n".join(f"  - {line}" for line in lines)
    if any(p.cluster for p in problems):
        return PreflightError(message, lines)
    return PreflightConfigError(message, lines)


#: What every run needs in its namespace.
REQUIRED_ACCESS: tuple[AccessCheck, ...] = (
    AccessCheck("create", "batch", "jobs"),
    AccessCheck("delete", "batch", "jobs"),
    AccessCheck("list", "batch", "jobs"),
    AccessCheck("watch", "batch", "jobs"),
    AccessCheck("list", "", "pods"),
    AccessCheck("watch", "", "pods"),
    AccessCheck("create", "", "pods", "exec"),
    AccessCheck("get", "", "pods", "log"),
    AccessCheck("create", "", "secrets"),
    AccessCheck("update", "", "secrets"),
)


#: Seconds ``check_api`` may take in all, retries included: a server that
#: accepts connections and never answers must not make a submit look frozen.
API_CHECK_BUDGET_S = 15.0


async def check_api(
    cluster: Cluster, *, kubeconfig: str = "the kubeconfig", budget_s: float = API_CHECK_BUDGET_S
) -> tuple[Problem | None, str]:
    """``GET /version``: (problem or None, detail such as ``Kubernetes
    v1.33.0``). Transient failures are retried for at most ``budget_s``
    seconds in all. Refused credentials (401/403) are the user's problem
    (naming ``kubeconfig``, the file(s) they came from); no answer is the
    cluster's."""
    try:
        with anyio.fail_after(budget_s):
            version = await cluster.request("GET", "/version", what="GET /version", timeout=(5.0, 10.0))
    except TimeoutError:
        err = UnreachableError(
            f"GET /version: no answer within {budget_s:g}s (connections are not refused, nothing answers)",
            status=0,
            reason="Unreachable",
        )
        return (
            Problem(
                f"the API server of context {cluster.context} ({cluster.host}) does not answer: {err}; "
                "check the network/VPN and that `kubectl version` works with this context",
                cluster=True,
            ),
            str(err),
        )
    except KubernetesApiError as err:
        if isinstance(err, (UnauthorizedError, ForbiddenError)):
            # It answered: the credentials are what is wrong.
            return (
                Problem(
                    f"the API server of context {cluster.context} ({cluster.host}) refused the credentials "
                    f"(HTTP {err.status}: {err}); refresh the token or the exec plugin's login for this "
                    f"context in {kubeconfig}"
                ),
                str(err),
            )
        return (
            Problem(
                f"the API server of context {cluster.context} ({cluster.host}) does not answer: {err}; "
                "check the network/VPN and that `kubectl version` works with this context",
                cluster=True,
            ),
            str(err),
        )
    return (
        None,
        f"{cluster.host} answers, Kubernetes {version.get('gitVersion') if isinstance(version, dict) else version}",
    )


async def check_access(
    cluster: Cluster, namespace: str, checks: Iterable[AccessCheck]
) -> list[tuple[AccessCheck, str | None]]:
    """One SelfSubjectAccessReview per check; returns (check, problem or
    None) in order. Raises KubernetesApiError when the review itself fails."""
    out: list[tuple[AccessCheck, str | None]] = []
    for check in checks:
        attrs: dict[str, Any] = {
            "namespace": namespace,
            "verb": check.verb,
            "group": check.group,
            "resource": check.resource,
        }
        if check.subresource:
            attrs["subresource"] = check.subresource
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        review = await cluster.request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body=body,
            what=f"SelfSubjectAccessReview for {check.describe()}",
        )
        status = review.get("status") or {}
        if status.get("allowed"):
            out.append((check, None))
            continue
        why = status.get("reason") or status.get("evaluationError") or "denied"
        out.append(
            (
                check,
                (
                    f"not allowed to {check.describe()} in namespace {namespace} (kubernetes.namespace; "
                    f"context {cluster.context}): {why}; ask for a Role/RoleBinding with {check.rule()} "
                    "or set kubernetes.namespace to a namespace you may use"
                ),
            )
        )
    return out


@dataclasses.dataclass
class References:
    """Objects the pod templates need: ``secrets`` and ``pvcs`` (name ->
    where it is used, e.g. ``Job/train volume "creds"``) and the
    ``runtime_classes`` (name -> where)."""

    secrets: dict[str, str] = dataclasses.field(default_factory=dict)
    pvcs: dict[str, str] = dataclasses.field(default_factory=dict)
    runtime_classes: dict[str, str] = dataclasses.field(default_factory=dict)


def _pod_specs(objects: Iterable[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    out: list[tuple[str, Mapping[str, Any]]] = []
    for obj in objects:
        who = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        spec = obj.get("spec") or {}
        if obj.get("kind") == "Pod":
            out.append((who, spec))
        template = spec.get("template") if isinstance(spec, Mapping) else None
        if isinstance(template, Mapping) and isinstance(template.get("spec"), Mapping):
            out.append((who, template["spec"]))
        job_template = spec.get("jobTemplate") if isinstance(spec, Mapping) else None
        if isinstance(job_template, Mapping):
            inner = ((job_template.get("spec") or {}).get("template") or {}).get("spec")
            if isinstance(inner, Mapping):
                out.append((who, inner))
    return out


def references(objects: Iterable[Mapping[str, Any]]) -> References:
    """The Secrets, PVCs and RuntimeClasses the pod templates of ``objects``
    reference (non-optional references only), minus the Secrets and PVCs
    ``objects`` create themselves. Pure."""
    objects = list(objects)
    own = {(o.get("kind"), (o.get("metadata") or {}).get("name")) for o in objects}
    refs = References()
    for who, pod in _pod_specs(objects):
        for vol in pod.get("volumes") or []:
            if not isinstance(vol, Mapping):
                continue
            where = f'{who} volume "{vol.get("name")}"'
            secret = vol.get("secret")
            if isinstance(secret, Mapping) and secret.get("secretName") and not secret.get("optional"):
                refs.secrets.setdefault(str(secret["secretName"]), where)
            pvc = vol.get("persistentVolumeClaim")
            if isinstance(pvc, Mapping) and pvc.get("claimName"):
                refs.pvcs.setdefault(str(pvc["claimName"]), where)
            projected = vol.get("projected")
            for source in (projected.get("sources") or []) if isinstance(projected, Mapping) else []:
                sec = source.get("secret") if isinstance(source, Mapping) else None
                if isinstance(sec, Mapping) and sec.get("name") and not sec.get("optional"):
                    refs.secrets.setdefault(str(sec["name"]), where)
        for field in ("initContainers", "containers"):
            for c in pod.get(field) or []:
                if not isinstance(c, Mapping):
                    continue
                cwho = f'{who} container "{c.get("name")}"'
                for ef in c.get("envFrom") or []:
                    ref = ef.get("secretRef") if isinstance(ef, Mapping) else None
                    if isinstance(ref, Mapping) and ref.get("name") and not ref.get("optional"):
                        refs.secrets.setdefault(str(ref["name"]), f"{cwho} envFrom")
                for env in c.get("env") or []:
                    vf = env.get("valueFrom") if isinstance(env, Mapping) else None
                    key_ref = vf.get("secretKeyRef") if isinstance(vf, Mapping) else None
                    if isinstance(key_ref, Mapping) and key_ref.get("name") and not key_ref.get("optional"):
                        refs.secrets.setdefault(str(key_ref["name"]), f"{cwho} env {env.get('name')}")
        if pod.get("runtimeClassName"):
            refs.runtime_classes.setdefault(str(pod["runtimeClassName"]), f"{who} runtimeClassName")
    for name in list(refs.secrets):
        if ("Secret", name) in own:
            del refs.secrets[name]
    for name in list(refs.pvcs):
        if ("PersistentVolumeClaim", name) in own:
            del refs.pvcs[name]
    return refs


async def check_references(
    resolver: ResourceResolver, namespace: str, refs: References
) -> tuple[list[Problem], list[str]]:
    """Check each referenced object exists: (problems, warnings). A missing
    Secret, PVC or RuntimeClass is a problem (the user's); a PVC that is not
    Bound is a warning (the pod waits for it); a 403 on a RuntimeClass is a
    warning."""
    problems: list[Problem] = []
    warnings: list[str] = []
    for name, where in sorted(refs.secrets.items()):
        try:
            found = await resolver.get("v1", "Secret", name, namespace)
        except KubernetesApiError as err:
            problems.append(
                Problem.of_api_error(
                    f"cannot read Secret {name} (used by {where}) in namespace {namespace}: {err}", err
                )
            )
            continue
        if found is None:
            problems.append(
                Problem(
                    f"Secret {name} (used by {where}) does not exist in namespace {namespace}: create it "
                    f"(kubectl -n {namespace} create secret generic {name} ...) or change the reference"
                )
            )
    for name, where in sorted(refs.pvcs.items()):
        try:
            pvc = await resolver.get("v1", "PersistentVolumeClaim", name, namespace)
        except KubernetesApiError as err:
            problems.append(
                Problem.of_api_error(
                    f"cannot read PersistentVolumeClaim {name} (used by {where}) in namespace {namespace}: {err}", err
                )
            )
            continue
        if pvc is None:
            problems.append(
                Problem(
                    f"PersistentVolumeClaim {name} (used by {where}) does not exist in namespace {namespace}: "
                    "create the claim or fix kubernetes.pvc_mounts / the manifest's volumes"
                )
            )
        elif (pvc.get("status") or {}).get("phase") not in (None, "Bound"):
            warnings.append(
                f"PersistentVolumeClaim {name} is {(pvc.get('status') or {}).get('phase')}, not Bound: "
                "the pod waits until it binds"
            )
    for name, where in sorted(refs.runtime_classes.items()):
        try:
            rc = await resolver.get("node.k8s.io/v1", "RuntimeClass", name, "")
        except ForbiddenError:
            warnings.append(
                f"cannot check RuntimeClass {name} (used by {where}): reading RuntimeClasses is forbidden "
                "to you; the pod fails to start if it does not exist"
            )
            continue
        except KubernetesApiError as err:
            problems.append(Problem.of_api_error(f"cannot read RuntimeClass {name} (used by {where}): {err}", err))
            continue
        if rc is None:
            problems.append(
                Problem(
                    f"RuntimeClass {name} (used by {where}) does not exist on this cluster: "
                    "fix kubernetes.runtime_class (kubectl get runtimeclasses lists the available ones)"
                )
            )
    return problems, warnings


class PreflightChecker:
    """Preflight and doctor, with a cache of cluster facts: successful
    permission checks and referenced objects that exist are remembered for
    ``cache_s`` seconds per (context, namespace), so a burst of submits costs
    one round of checks. It caches facts about the cluster, never anything
    of a run: ``start`` gets everything from its RunSpec.

    ``connections``: the clusters; ``files``: limits the worker threads
    reading the manifest from git and ``doctor_config``; ``doctor_config``:
    returns the ``kubernetes`` config section ``doctor`` checks (the daemon
    resolves it from its config layers; it may read files and raise
    JobsupError; called in a worker thread).
    """

    def __init__(
        self,
        connections: Connections,
        *,
        files: anyio.CapacityLimiter,
        cache_s: float = 30.0,
        doctor_config: Callable[[], Mapping[str, Any]] = dict,
    ) -> None:
        self.connections = connections
        self.files = files
        self.cache_s = cache_s
        self.doctor_config = doctor_config
        self._access_ok: dict[tuple[str, str, frozenset[AccessCheck]], float] = {}
        self._refs_ok: dict[tuple[str, str, str, str], float] = {}

    async def check_cluster(
        self, cluster: Cluster, namespace: str, rendered: RenderedRun | None, manifest_path: str = ""
    ) -> tuple[list[Problem], list[str]]:
        """(problems, warnings) for the cluster part of preflight; successes
        are cached for ``preflight_cache_s``."""
        now = time.monotonic()
        problems: list[Problem] = []
        warnings: list[str] = []
        checks = set(REQUIRED_ACCESS)
        resolver = self.connections.resolver(cluster)
        if rendered is not None:
            for obj in rendered.objects:
                try:
                    info = await resolver.info_of(obj)
                except KubernetesApiError as err:
                    where = f" (in {manifest_path})" if manifest_path else ""
                    problems.append(
                        Problem.of_api_error(
                            f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}{where}: {err}", err
                        )
                    )
                    continue
                group = info.group_version.split("/")[0] if "/" in info.group_version else ""
                checks.add(AccessCheck("create", group, info.plural))
        key = (cluster.context, namespace, frozenset(checks))
        if self._access_ok.get(key, 0) < now:
            problem, _ = await check_api(cluster, kubeconfig=self.connections.access.kubeconfig_paths())
            if problem is not None:
                return [problem], warnings
            try:
                results = await check_access(cluster, namespace, sorted(checks, key=lambda c: c.describe()))
            except KubernetesApiError as err:
                return [
                    *problems,
                    Problem.of_api_error(f"cannot check permissions with SelfSubjectAccessReview: {err}", err),
                ], warnings
            denied = [Problem(p) for _, p in results if p is not None]
            problems.extend(denied)
            if not denied:
                self._access_ok[key] = now + self.cache_s
        if rendered is not None:
            refs = references(rendered.objects)
            # Positive answers are cached; a missing object is asked again next time.
            for kind, table in (
                ("Secret", refs.secrets),
                ("PersistentVolumeClaim", refs.pvcs),
                ("RuntimeClass", refs.runtime_classes),
            ):
                for name in list(table):
                    if self._refs_ok.get((cluster.context, namespace, kind, name), 0) >= now:
                        del table[name]
            ref_problems, ref_warnings = await check_references(resolver, namespace, refs)
            problems.extend(ref_problems)
            warnings.extend(ref_warnings)
            if not ref_problems and not ref_warnings:
                for kind, table in (
                    ("Secret", refs.secrets),
                    ("PersistentVolumeClaim", refs.pvcs),
                    ("RuntimeClass", refs.runtime_classes),
                ):
                    for name in table:
                        self._refs_ok[(cluster.context, namespace, kind, name)] = now + self.cache_s
        return problems, warnings

    async def check(self, spec: RunSpec) -> list[str]:
        """Render the manifest and check the cluster; return warnings.

        Raises ManifestError (the manifest breaks the contract), ConfigError,
        PreflightConfigError (one line per problem, each the user's to fix:
        kubeconfig, context, namespace, RBAC, missing Secret/PVC/RuntimeClass,
        a kind the cluster does not have), PreflightError (the cluster itself
        failed: no answer, 5xx). Creates nothing.
        """
        settings = RunSettings.of(spec)
        rendered = await render_spec(spec, settings, limiter=self.files)
        try:
            cluster = await self.connections.access.cluster(settings.context)
        except KubeconfigError as err:
            source = (
                f"kubernetes.context is {settings.context!r}"
                if settings.context
                else "kubernetes.context is not set, so the kubeconfig's current-context is used"
            )
            line = f"{err} ({source})"
            raise PreflightConfigError(f"Kubernetes preflight failed: {line}", [line]) from None
        problems, warnings = await self.check_cluster(cluster, settings.namespace, rendered, settings.manifest_path)
        if problems:
            head = f"Kubernetes preflight failed (context {cluster.context}, namespace {settings.namespace}):"
            raise preflight_error(head, problems)
        return warnings + list(rendered.notes)

    async def doctor(self) -> list[dict[str, Any]]:
        """Checks for ``jobsup doctor`` with the ``kubernetes`` config section
        the daemon resolves (``doctor_config``: context, namespace):
        kubeconfig, API server, each RBAC permission. Items are ``{"name",
        "ok", "detail"}``; never raises for a failed check."""
        try:
            kube = await anyio.to_thread.run_sync(self.doctor_config, limiter=self.files)
        except JobsupError as err:
            return [{"name": "kubernetes config", "ok": False, "detail": str(err)}]
        items: list[dict[str, Any]] = []
        namespace = str(kube.get("namespace") or "default")
        try:
            cluster = await self.connections.access.cluster(str(kube["context"]) if kube.get("context") else None)
        except KubeconfigError as err:
            return [{"name": "kubeconfig", "ok": False, "detail": str(err)}]
        items.append(
            {
                "name": "kubeconfig",
                "ok": True,
                "detail": f"{self.connections.access.kubeconfig_paths()}: context {cluster.context}",
            }
        )
        problem, detail = await check_api(cluster, kubeconfig=self.connections.access.kubeconfig_paths())
        items.append({"name": "kubernetes api", "ok": problem is None, "detail": problem.text if problem else detail})
        if problem is not None:
            return items
        try:
            results = await check_access(cluster, namespace, REQUIRED_ACCESS)
        except KubernetesApiError as err:
            items.append({"name": "kubernetes rbac", "ok": False, "detail": str(err)})
            return items
        for check, denied in results:
            items.append(
                {
                    "name": f"rbac: {check.describe()}",
                    "ok": denied is None,
                    "detail": denied or f"allowed in namespace {namespace}",
                }
            )
        return items
