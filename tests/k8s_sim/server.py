"""The HTTP face of the simulated cluster: a Starlette app speaking the
Kubernetes REST API (paths, verbs, query parameters, Status errors, watch
streams, pods/log, pods/exec over WebSocket).

Copied behaviour, by part:

- paths and verbs: the API reference's operations for each resource
  (``/api/v1/namespaces/{ns}/pods``, ``/apis/batch/v1/namespaces/{ns}/jobs``...);
- auth: bearer tokens; no or wrong token -> 401 Status "Unauthorized";
  optional RBAC enforcement from the same rules SelfSubjectAccessReview
  answers (403 Status "... is forbidden: User ... cannot ...");
- create/replace/patch/delete: generic registry semantics (see store.py),
  ``dryRun=All`` runs defaulting and validation but stores nothing;
- defaulting and validation of Jobs and Pods: pkg/apis/batch and
  pkg/apis/core (the subset jobsup's manifests exercise);
- watch: "Efficient detection of changes" in the API concepts page:
  resourceVersion unset/"0" sends synthetic ADDED events first, an exact
  resourceVersion resumes after it, one older than the retained window is
  answered with HTTP 200 and an ERROR event carrying a 410 Expired Status;
  timeoutSeconds ends the stream; BOOKMARK events with allowWatchBookmarks;
  objects moving in or out of a label/field selector are ADDED/DELETED;
- pods/log: kubelet ReadLogs (see kubelet.stream_log); sinceTime is applied at
  one-second granularity because the apiserver forwards it to the kubelet as
  a metav1.Time (RFC 3339 seconds);
- pods/exec: the v4 and v5 ``channel.k8s.io`` WebSocket subprotocols
  (k8s.io/apimachinery/pkg/util/httpstream/wsstream and the kubelet's
  remotecommand websocket server): binary frames whose first byte is the
  channel (0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize, v5: 255 close);
  an empty frame on the lowest writable channel at start; the status channel
  carries a metav1.Status: Success, or Failure with reason NonZeroExitCode and
  the exit code in details.causes[0].message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from .controller import JobController
from .faults import Faults
from .kubelet import Kubelet, ServerKilledError, stream_log
from .store import JOBS, NAMESPACES, PODS, RESOURCES, SECRETS, ObjectStore, ResourceType, WatchEvent, list_item
from .util import (
    JSON,
    ApiError,
    cause,
    clone,
    dumps,
    err_bad_request,
    err_invalid,
    json_patch,
    match_fields,
    merge_patch,
    parse_field_selector,
    parse_label_selector,
    parse_rfc3339_ns,
    status_failure,
)

log = structlog.get_logger("tests.k8s_sim.server")

SERVER_VERSION: JSON = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-jobsup-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


ServerKilled = ServerKilledError


@dataclass(frozen=True)
class AccessRule:
    """One RBAC-like rule: ``verbs``, API ``groups`` ("" core), ``resources``
    (``pods``, ``pods/exec``, ``jobs``...), ``namespaces``; ``"*"`` matches any.
    A request (or SelfSubjectAccessReview) is allowed when any rule matches."""

    verbs: tuple[str, ...] = ("*",)
    groups: tuple[str, ...] = ("*",)
    resources: tuple[str, ...] = ("*",)
    namespaces: tuple[str, ...] = ("*",)

    def matches(self, verb: str, group: str, resource: str, namespace: str) -> bool:
        """Whether this rule allows the attributes."""

        def hit(values: tuple[str, ...], v: str) -> bool:
            return "*" in values or v in values

        return (
            hit(self.verbs, verb)
            and hit(self.groups, group)
            and hit(self.resources, resource)
            and (hit(self.namespaces, namespace) or namespace == "")
        )


@dataclass
class SimState:
    """Everything the HTTP layer serves; outlives one HTTP server (restart)."""

    store: ObjectStore
    kubelet: Kubelet
    controller: JobController
    faults: Faults
    tokens: dict[str, str]
    """bearer token -> user name."""
    access_rules: list[AccessRule] = field(default_factory=lambda: [AccessRule()])
    enforce_rbac: bool = False
    bookmark_interval_s: float = 5.0
    default_watch_timeout_s: float = 1800.0
    exec_protocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io")
    killed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while the HTTP server is being killed: open streams abort."""
    requests: int = 0

    def allowed(self, verb: str, group: str, resource: str, namespace: str) -> bool:
        """Whether the access rules allow the request attributes."""
        return any(r.matches(verb, group, resource, namespace) for r in self.access_rules)


# ------------------------------------------------------------------ defaulting

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def default_pod_spec(spec: JSON) -> None:
    """Apply the API defaults of a PodSpec and its containers in place
    (pkg/apis/core/v1/defaults.go: restartPolicy Always, dnsPolicy ClusterFirst,
    schedulerName, terminationGracePeriodSeconds 30, securityContext {};
    containers: terminationMessagePath/Policy, imagePullPolicy Always for
    ``:latest`` or untagged images else IfNotPresent, resources {})."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccountName", spec.get("serviceAccount", "default"))
    spec.setdefault("enableServiceLinks", True)
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            image = str(c.get("image", ""))
            tag = image.rsplit("/", 1)[-1]
            c.setdefault(
                "imagePullPolicy",
                "Always" if (":" not in tag or tag.endswith(":latest")) and "@" not in tag else "IfNotPresent",
            )
            c.setdefault("resources", {})


def _validate_pod_spec(spec: JSON, path: str) -> list[JSON]:
    causes: list[JSON] = []
    containers = spec.get("containers")
    if not containers:
        causes.append(cause("FieldValueRequired", f"{path}.containers", "Required value"))
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            p = f"{path}.{key}[{i}]"
            name = c.get("name")
            if not name:
                causes.append(cause("FieldValueRequired", f"{p}.name", "Required value"))
            elif not _DNS1123_LABEL.match(name) or len(name) > 63:
                causes.append(
                    cause(
                        "FieldValueInvalid",
                        f"{p}.name",
                        f"Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                    )
                )
            elif name in seen:
                causes.append(cause("FieldValueDuplicate", f"{p}.name", f'Duplicate value: "{name}"'))
            else:
                seen.add(name)
            if not c.get("image"):
                causes.append(cause("FieldValueRequired", f"{p}.image", "Required value"))
            for j, e in enumerate(c.get("env") or []):
                if not e.get("name"):
                    causes.append(cause("FieldValueRequired", f"{p}.env[{j}].name", "Required value"))
    rp = spec.get("restartPolicy", "Always")
    if rp not in ("Always", "OnFailure", "Never"):
        causes.append(
            cause(
                "FieldValueNotSupported",
                f"{path}.restartPolicy",
                f'Unsupported value: "{rp}": supported values: "Always", "OnFailure", "Never"',
            )
        )
    return causes


def _validate_name(res: ResourceType, name: str) -> list[JSON]:
    if not name:
        return []
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        return [
            cause(
                "FieldValueInvalid",
                "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric '
                "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
                "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            )
        ]
    if res is JOBS and len(name) > 63:
        return [
            cause("FieldValueInvalid", "metadata.name", f'Invalid value: "{name}": must be no more than 63 characters')
        ]
    return []


def default_and_validate(res: ResourceType, obj: JSON) -> None:
    """Defaulting then validation on create (registry strategies PrepareForCreate
    + Validate). Raises ApiError 422 Invalid listing every cause."""
    md = obj.setdefault("metadata", {})
    name = md.get("name") or ""
    causes = _validate_name(res, name)
    if res is SECRETS:
        data = dict(obj.get("data") or {})
        for k, v in (obj.pop("stringData", None) or {}).items():
            data[k] = base64.b64encode(str(v).encode()).decode()
        obj["data"] = data
        obj.setdefault("type", "Opaque")
    elif res is PODS:
        spec = obj.setdefault("spec", {})
        default_pod_spec(spec)
        causes += _validate_pod_spec(spec, "spec")
        obj.setdefault("status", {"phase": "Pending", "qosClass": "BestEffort"})
    elif res is JOBS:
        spec = obj.setdefault("spec", {})
        spec.setdefault("parallelism", 1)
        spec.setdefault("completions", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        spec.setdefault("manualSelector", None)
        if spec.get("manualSelector") is None:
            spec.pop("manualSelector")
        template = spec.get("template")
        if not isinstance(template, dict):
            causes.append(cause("FieldValueRequired", "spec.template", "Required value"))
        else:
            tspec = template.setdefault("spec", {})
            default_pod_spec(tspec)
            causes += _validate_pod_spec(tspec, "spec.template.spec")
            rp = tspec.get("restartPolicy")
            if rp not in ("OnFailure", "Never"):
                causes.append(
                    cause(
                        "FieldValueNotSupported",
                        "spec.template.spec.restartPolicy",
                        f'Unsupported value: "{rp}": supported values: "OnFailure", "Never"',
                    )
                )
        for fld in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "parallelism", "completions"):
            v = spec.get(fld)
            if v is not None and (not isinstance(v, int) or v < 0 or (fld == "activeDeadlineSeconds" and v == 0)):
                causes.append(
                    cause(
                        "FieldValueInvalid",
                        f"spec.{fld}",
                        f"Invalid value: {json.dumps(v)}: must be greater than{' ' if fld == 'activeDeadlineSeconds' else ' or equal to '}0",
                    )
                )
        if spec.get("completionMode") == "Indexed":
            causes.append(
                cause(
                    "FieldValueNotSupported",
                    "spec.completionMode",
                    'Unsupported value: "Indexed": the simulator runs NonIndexed Jobs only',
                )
            )
        obj.setdefault("status", {})
    if causes:
        raise err_invalid(res.kind, res.group, name, causes)


def _job_selector_labels(obj: JSON) -> None:
    """Set the Job's generated selector and template labels (batch strategy
    PrepareForCreate + generateSelector), once the uid is known."""
    md, spec = obj["metadata"], obj["spec"]
    uid = md["uid"]
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    tmd = spec["template"].setdefault("metadata", {})
    labels = tmd.setdefault("labels", {})
    labels.update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": md["name"],
            "controller-uid": uid,
            "job-name": md["name"],
        }
    )


# ----------------------------------------------------------------- routing


@dataclass
class Target:
    """A parsed resource path."""

    res: ResourceType
    namespace: str
    name: str | None
    sub: str | None


_PATH = re.compile(
    r"^/(?:api/(?P<cver>v1)|apis/(?P<group>[^/]+)/(?P<gver>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?/?$"
)


def parse_path(path: str) -> Target | None:
    """Map a REST path onto (resource, namespace, name, subresource); None when
    it names no served resource. ``/api/v1/namespaces/x`` is the Namespace x;
    a namespaced resource without a namespace is the all-namespaces list."""
    m = _PATH.match(path)
    if not m:
        return None
    group = m.group("group") or ""
    version = m.group("cver") or m.group("gver")
    ns, plural, name, sub = m.group("ns"), m.group("plural"), m.group("name"), m.group("sub")
    res = RESOURCES.get((group, plural))
    if res is None or res.version != version:
        return None
    if not res.namespaced:
        return None if ns is not None else Target(res, "", name, sub)
    if ns is None:
        return Target(res, "", None, None) if name is None else None
    return Target(res, ns, name, sub)


def _bool(q: Any, key: str) -> bool:
    return str(q.get(key, "")).lower() in ("true", "1")


def _int(q: Any, key: str) -> int | None:
    v = q.get(key)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise err_bad_request(f"invalid value for {key}: {v!r} is not an integer") from None


def _json_response(obj: JSON, code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(obj), status_code=code, media_type="application/json", headers=headers)


def _error_response(exc: ApiError) -> Response:
    return _json_response(exc.status, exc.code, exc.headers)


class SimApp:
    """Builds the Starlette app over a :class:`SimState`."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    def build(self) -> Starlette:
        """The ASGI app."""
        return Starlette(
            routes=[
                WebSocketRoute("/api/v1/namespaces/{namespace}/pods/{name}/exec", self.exec_ws),
                Route("/{path:path}", self.http, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            ]
        )

    # ------------------------------------------------------------- auth/faults

    def _user(self, headers: Any) -> str:
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            user = self.state.tokens.get(auth[7:].strip())
            if user is not None:
                return user
        raise ApiError(status_failure(401, "Unauthorized", "Unauthorized"))

    def _fault(self, method: str, path: str) -> None:
        f = self.state.faults.take_request_failure(method, path)
        if f is None:
            return
        if f.status == 429:
            raise ApiError(
                status_failure(
                    429,
                    "TooManyRequests",
                    "Too many requests, please try again later.",
                    {"retryAfterSeconds": f.retry_after_s},
                ),
                {"Retry-After": str(f.retry_after_s)},
            )
        raise ApiError(
            status_failure(
                500,
                "InternalError",
                "Internal error occurred: injected by the simulator",
                {"causes": [{"message": "injected by the simulator"}]},
            )
        )

    def _authorize(self, user: str, verb: str, t: Target) -> None:
        if not self.state.enforce_rbac:
            return
        resource = t.res.plural + (f"/{t.sub}" if t.sub else "")
        if self.state.allowed(verb, t.res.group, resource, t.namespace):
            return
        where = f' in the namespace "{t.namespace}"' if t.namespace else " at the cluster scope"
        group = f'"{t.res.group}"' if t.res.group else '""'
        raise ApiError(
            status_failure(
                403,
                "Forbidden",
                (f'{t.res.qualified} "{t.name}"' if t.name else t.res.qualified)
                + f' is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group {group}{where}',
                {"name": t.name or "", "group": t.res.group, "kind": t.res.plural},
            )
        )

    # ------------------------------------------------------------------ HTTP

    async def http(self, request: Request) -> Response:
        """Every non-WebSocket request."""
        self.state.requests += 1
        path = request.url.path.rstrip("/") or "/"
        try:
            user = self._user(request.headers)
            self._fault(request.method, path)
            if path == "/version":
                return _json_response(SERVER_VERSION)
            if (
                path in ("/api", "/apis", "/healthz", "/readyz", "/livez")
                or path.startswith("/api/v1")
                and path.count("/") == 2
                or re.match(r"^/apis/[^/]+/[^/]+/?$", path)
            ):
                return self._discovery(path)
            if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" and request.method == "POST":
                return self._ssar(user, await self._body(request))
            t = parse_path(path)
            if t is None:
                raise ApiError(status_failure(404, "NotFound", "the server could not find the requested resource", {}))
            return await self._resource(request, user, t)
        except ApiError as exc:
            return _error_response(exc)

    async def _body(self, request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw) if raw else {}
        except ValueError as exc:
            raise err_bad_request(f"the request body is not valid JSON: {exc}") from None

    def _discovery(self, path: str) -> Response:
        if path in ("/healthz", "/readyz", "/livez"):
            return Response(b"ok", media_type="text/plain")
        if path == "/api":
            return _json_response(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
                }
            )
        if path == "/apis":
            groups: dict[str, list[str]] = {}
            for r in RESOURCES.values():
                if r.group:
                    groups.setdefault(r.group, [])
                    if r.version not in groups[r.group]:
                        groups[r.group].append(r.version)
            groups.setdefault("authorization.k8s.io", ["v1"])
            return _json_response(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                            "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                        }
                        for g, vs in sorted(groups.items())
                    ],
                }
            )
        gv = path.strip("/").split("/", 1)[1] if path.startswith("/apis/") else "v1"
        group = gv.split("/")[0] if "/" in gv else ""
        resources = [
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            }
            for r in RESOURCES.values()
            if r.group == group and r.api_version == gv
        ]
        if group == "authorization.k8s.io":
            resources.append(
                {
                    "name": "selfsubjectaccessreviews",
                    "singularName": "selfsubjectaccessreview",
                    "namespaced": False,
                    "kind": "SelfSubjectAccessReview",
                    "verbs": ["create"],
                }
            )
        if not resources:
            raise ApiError(status_failure(404, "NotFound", "the server could not find the requested resource", {}))
        return _json_response(
            {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
        )

    def _ssar(self, user: str, body: JSON) -> Response:
        """SelfSubjectAccessReview: answered from the access rules."""
        spec = body.get("spec") or {}
        ra = spec.get("resourceAttributes")
        if ra is None:
            allowed = False
        else:
            resource = ra.get("resource", "") + (f"/{ra['subresource']}" if ra.get("subresource") else "")
            allowed = self.state.allowed(ra.get("verb", ""), ra.get("group", ""), resource, ra.get("namespace", ""))
        out = {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": {"allowed": allowed}
            | ({} if allowed else {"reason": f'no rule of the simulator allows user "{user}"'}),
        }
        return _json_response(out, 201)

    async def _resource(self, request: Request, user: str, t: Target) -> Response:
        store = self.state.store
        q = request.query_params
        method = request.method
        if (
            t.namespace
            and t.res is not NAMESPACES
            and method == "POST"
            and store.find(NAMESPACES, "", t.namespace) is None
        ):
            raise ApiError(
                status_failure(
                    404,
                    "NotFound",
                    f'namespaces "{t.namespace}" not found',
                    {"name": t.namespace, "kind": "namespaces"},
                )
            )
        if t.sub == "log" and t.res is PODS and method == "GET":
            self._authorize(user, "get", t)
            return await self._logs(request, t)
        if t.sub == "exec" and t.res is PODS:
            raise err_bad_request("Upgrade request required")
        if t.sub not in (None, "status"):
            raise ApiError(status_failure(404, "NotFound", "the server could not find the requested resource", {}))
        if t.name is None:
            if method == "GET":
                watch = _bool(q, "watch")
                self._authorize(user, "watch" if watch else "list", t)
                if watch:
                    return self._watch(request, t)
                return self._list(request, t)
            if method == "POST":
                self._authorize(user, "create", t)
                body = await self._body(request)
                return self._create(t, body, q.get("dryRun") == "All")
            if method == "DELETE":
                self._authorize(user, "deletecollection", t)
                body = await self._body(request)
                return self._delete_collection(request, t, body if isinstance(body, dict) else {})
            raise ApiError(
                status_failure(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            )
        if method == "GET":
            self._authorize(user, "get", t)
            return _json_response(store.get(t.res, t.namespace, t.name))
        if method == "PUT":
            self._authorize(user, "update", t)
            body = await self._body(request)
            return self._replace(t, body, q.get("dryRun") == "All")
        if method == "PATCH":
            self._authorize(user, "patch", t)
            body = await self._body(request)
            return self._patch(t, body, request.headers.get("content-type", ""), q.get("dryRun") == "All")
        if method == "DELETE":
            self._authorize(user, "delete", t)
            body = await self._body(request)
            return self._delete(t, body if isinstance(body, dict) else {}, q)
        raise ApiError(
            status_failure(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        )

    # ------------------------------------------------------------------ CRUD

    def _create(self, t: Target, body: Any, dry_run: bool) -> Response:
        store = self.state.store
        if not isinstance(body, dict):
            raise err_bad_request("the request body must be a JSON object")
        kind = body.get("kind")
        if kind and kind != t.res.kind:
            raise err_bad_request(f"the kind of the object ({kind}) does not match the URL's resource ({t.res.plural})")
        obj = clone(body)
        default_and_validate(t.res, obj)
        obj = store.prepare_new(t.res, t.namespace, obj)
        if t.res is JOBS:
            _job_selector_labels(obj)
        if t.res is PODS:
            obj["status"] = {"phase": "Pending", "qosClass": obj.get("status", {}).get("qosClass", "BestEffort")}
        if dry_run:
            return _json_response(obj, 201)
        return _json_response(store.create(t.res, t.namespace, obj), 201)

    def _check_immutable(self, t: Target, old: JSON, new: JSON) -> None:
        if t.res is not JOBS:
            return
        ospec, nspec = old.get("spec") or {}, new.get("spec") or {}
        causes = []
        for fld in ("template", "selector", "completionMode", "completions"):
            if fld in nspec and nspec.get(fld) != ospec.get(fld):
                causes.append(cause("FieldValueInvalid", f"spec.{fld}", "Invalid value: field is immutable"))
        if causes:
            raise err_invalid(t.res.kind, t.res.group, t.name or "", causes)

    def _replace(self, t: Target, body: Any, dry_run: bool) -> Response:
        store = self.state.store
        assert t.name is not None
        if not isinstance(body, dict):
            raise err_bad_request("the request body must be a JSON object")
        old = store.get(t.res, t.namespace, t.name)
        new = clone(body)
        if t.sub != "status":
            self._check_immutable(t, old, new)
            if t.res is JOBS:
                spec = new.setdefault("spec", {})
                for k, v in (old.get("spec") or {}).items():
                    spec.setdefault(k, v)
        if dry_run:
            return _json_response(new)
        return _json_response(store.replace(t.res, t.namespace, t.name, new, status_only=t.sub == "status"))

    def _patch(self, t: Target, body: Any, content_type: str, dry_run: bool) -> Response:
        store = self.state.store
        assert t.name is not None
        old = store.get(t.res, t.namespace, t.name)
        ct = content_type.split(";")[0].strip()
        if ct == "application/json-patch+json":
            if not isinstance(body, list):
                raise err_bad_request("a json patch must be a JSON array")
            new = json_patch(old, body)
        elif ct in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            new = merge_patch(old, body)
        elif ct == "application/apply-patch+yaml":
            raise ApiError(
                status_failure(415, "UnsupportedMediaType", "the simulator does not implement server-side apply")
            )
        else:
            raise ApiError(
                status_failure(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {ct!r})",
                )
            )
        if not isinstance(new, dict):
            raise err_bad_request("the patch does not produce an object")
        if t.sub != "status":
            self._check_immutable(t, old, new)
        md = new.setdefault("metadata", {})
        if isinstance(body, dict) and not (body.get("metadata") or {}).get("resourceVersion"):
            md.pop("resourceVersion", None)
        if dry_run:
            return _json_response(new)
        return _json_response(store.replace(t.res, t.namespace, t.name, new, status_only=t.sub == "status"))

    def _delete(self, t: Target, body: JSON, q: Any) -> Response:
        assert t.name is not None
        propagation = q.get("propagationPolicy") or body.get("propagationPolicy")
        if propagation is None and body.get("orphanDependents") is not None:
            propagation = "Orphan" if body["orphanDependents"] else "Background"
        grace = _int(q, "gracePeriodSeconds")
        if grace is None and body.get("gracePeriodSeconds") is not None:
            grace = int(body["gracePeriodSeconds"])
        pre = body.get("preconditions") or {}
        dry = q.get("dryRun") == "All" or body.get("dryRun") == ["All"]
        headers: dict[str, str] = {}
        if t.res is JOBS and propagation is None:
            # pkg/registry/batch/job/storage: the warning for the orphan default.
            headers["Warning"] = (
                '299 - "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background '
                'to remove them or set propagationPolicy=Orphan to suppress this warning"'
            )
        code, out = self.state.store.delete(
            t.res,
            t.namespace,
            t.name,
            propagation=propagation,
            grace_seconds=grace,
            precondition_uid=pre.get("uid"),
            precondition_rv=pre.get("resourceVersion"),
            dry_run=dry,
        )
        return _json_response(out, code, headers)

    def _delete_collection(self, request: Request, t: Target, body: JSON) -> Response:
        """DELETE on a collection (deletecollection): every object matching the
        selectors is deleted with the given options; the answer is the list of
        what was deleted (or is being deleted)."""
        store = self.state.store
        q = request.query_params
        ok = self._filters(request, t)
        items = [o for o in store.items(t.res, t.namespace or None) if ok(o)]
        out: list[JSON] = []
        for o in items:
            sub = Target(t.res, o["metadata"].get("namespace", ""), o["metadata"]["name"], None)
            self._delete(sub, body, q)
            out.append(list_item(o))
        return _json_response(
            {
                "kind": t.res.kind + "List",
                "apiVersion": t.res.api_version,
                "metadata": {"resourceVersion": str(store.rv)},
                "items": out,
            }
        )

    # ------------------------------------------------------------ list/watch

    def _filters(self, request: Request, t: Target) -> Callable[[JSON], bool]:
        q = request.query_params
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), t.res.fields)
        ns = t.namespace

        def ok(obj: JSON) -> bool:
            md = obj.get("metadata") or {}
            if ns and t.res.namespaced and md.get("namespace") != ns:
                return False
            return labels(md.get("labels") or {}) and match_fields(obj, fields)

        return ok

    def _list(self, request: Request, t: Target) -> Response:
        """List with labelSelector, fieldSelector, limit and continue (the token
        pins the list's resourceVersion; once compacted it is 410 Expired)."""
        store = self.state.store
        q = request.query_params
        ok = self._filters(request, t)
        items = [o for o in store.items(t.res, t.namespace or None) if ok(o)]
        rv = store.rv
        limit = _int(q, "limit")
        cont = q.get("continue")
        start = 0
        if cont:
            try:
                token = json.loads(base64.urlsafe_b64decode(cont.encode()))
                start_key, rv = str(token["start"]), int(token["rv"])
            except (ValueError, KeyError, TypeError):
                raise err_bad_request(f"continue key is not valid: {cont!r}") from None
            if rv + 1 < store.min_rv:
                raise ApiError(
                    status_failure(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You can start "
                        "a new list without the continue parameter, or use the continue token in this response to "
                        "retrieve the remainder of the results. Continuing with the provided token results in an "
                        "inconsistent list - objects that were created, modified, or deleted between the time the first "
                        "chunk was returned and now may show up in the list.",
                    )
                )
            keys = [f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}" for o in items]
            start = next((i for i, k in enumerate(keys) if k > start_key), len(keys))
        meta: JSON = {"resourceVersion": str(rv)}
        page = items[start:]
        if limit and limit > 0 and len(page) > limit:
            page = page[:limit]
            last = page[-1]["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"start": f"{last.get('namespace', '')}/{last['name']}", "rv": rv}).encode()
            ).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        body = {
            "kind": t.res.kind + "List",
            "apiVersion": t.res.api_version,
            "metadata": meta,
            "items": [list_item(o) for o in page],
        }
        return _json_response(body)

    def _watch(self, request: Request, t: Target) -> Response:
        store = self.state.store
        q = request.query_params
        ok = self._filters(request, t)
        timeout = _int(q, "timeoutSeconds")
        timeout_s = float(timeout) if timeout is not None and timeout > 0 else self.state.default_watch_timeout_s
        bookmarks = _bool(q, "allowWatchBookmarks")
        rv_text = q.get("resourceVersion") or ""
        initial: list[bytes] = []
        error: bytes | None = None
        # Snapshot and registration happen in one step of the loop: no gap.
        if rv_text in ("", "0"):
            for o in store.items(t.res, t.namespace or None):
                if ok(o):
                    initial.append(dumps({"type": "ADDED", "object": o}) + b"\n")
            backlog: list[WatchEvent] = []
        else:
            try:
                rv = int(rv_text)
            except ValueError:
                raise err_bad_request(f"invalid resource version: {rv_text!r}") from None
            try:
                backlog = store.events_since(t.res, rv)
            except ApiError as exc:
                error = dumps({"type": "ERROR", "object": exc.status}) + b"\n"
                backlog = []
        watcher = store.add_watcher(t.res) if error is None else None
        state = self.state
        kind, api_version = t.res.kind, t.res.api_version

        def render(ev: WatchEvent) -> bytes | None:
            now = ok(ev.obj)
            before = ev.prev is not None and ok(ev.prev)
            if ev.type == "DELETED":
                return ev.line() if (now or before) else None
            if now and (before or ev.type == "ADDED"):
                return ev.line()
            if now:
                return ev.line("ADDED")
            if before:
                return ev.line("DELETED")
            return None

        async def body() -> AsyncIterator[bytes]:
            try:
                if error is not None:
                    yield error
                    return
                assert watcher is not None
                for first in initial:
                    yield first
                for ev in backlog:
                    rendered = render(ev)
                    if rendered is not None:
                        yield rendered
                deadline = time.monotonic() + timeout_s
                next_bookmark = time.monotonic() + state.bookmark_interval_s
                kill_wait = asyncio.ensure_future(state.killed.wait())
                try:
                    while True:
                        now = time.monotonic()
                        if now >= deadline:
                            return
                        wake = deadline if not bookmarks else min(deadline, next_bookmark)
                        get = asyncio.ensure_future(watcher.queue.get())
                        done, _ = await asyncio.wait(
                            {get, kill_wait}, timeout=max(wake - now, 0), return_when=asyncio.FIRST_COMPLETED
                        )
                        if kill_wait in done:
                            get.cancel()
                            raise ServerKilled("the API server was stopped")
                        if get not in done:
                            get.cancel()
                            if bookmarks and time.monotonic() >= next_bookmark:
                                next_bookmark = time.monotonic() + state.bookmark_interval_s
                                yield (
                                    dumps(
                                        {
                                            "type": "BOOKMARK",
                                            "object": {
                                                "kind": kind,
                                                "apiVersion": api_version,
                                                "metadata": {"resourceVersion": str(store.rv)},
                                            },
                                        }
                                    )
                                    + b"\n"
                                )
                            continue
                        item = get.result()
                        if item is None:
                            return
                        if isinstance(item, WatchEvent):
                            rendered = render(item)
                            if rendered is not None:
                                yield rendered
                        else:
                            yield item
                            return
                finally:
                    kill_wait.cancel()
            finally:
                if watcher is not None:
                    store.remove_watcher(watcher)

        return StreamingResponse(body(), media_type="application/json", headers={"Cache-Control": "no-cache, private"})

    # ------------------------------------------------------------------ logs

    async def _logs(self, request: Request, t: Target) -> Response:
        assert t.name is not None
        q = request.query_params
        follow = _bool(q, "follow")
        timestamps = _bool(q, "timestamps")
        previous = _bool(q, "previous")
        tail = _int(q, "tailLines")
        limit = _int(q, "limitBytes")
        since_ns: int | None = None
        if q.get("sinceTime"):
            try:
                since_ns = parse_rfc3339_ns(q["sinceTime"])
            except ValueError:
                raise err_bad_request(f"invalid sinceTime {q['sinceTime']!r}: want RFC 3339") from None
            since_ns -= since_ns % 1_000_000_000  # metav1.Time carries whole seconds to the kubelet
        since_s = _int(q, "sinceSeconds")
        if since_s is not None:
            if since_s < 1:
                raise err_invalid(
                    "PodLogOptions",
                    "",
                    "",
                    [cause("FieldValueInvalid", "sinceSeconds", "Invalid value: must be greater than 0")],
                )
            since_ns = time.time_ns() - since_s * 1_000_000_000
        which = q.get("stream") or "All"
        if which not in ("All", "Stdout", "Stderr"):
            raise err_invalid(
                "PodLogOptions",
                "",
                "",
                [
                    cause(
                        "FieldValueNotSupported",
                        "stream",
                        f'Unsupported value: "{which}": supported values: "All", "Stderr", "Stdout"',
                    )
                ],
            )
        if which != "All" and tail is not None:
            raise err_invalid(
                "PodLogOptions",
                "",
                "",
                [
                    cause(
                        "FieldValueForbidden",
                        "tailLines",
                        "Forbidden: tailLines and specific stream are mutually exclusive for now",
                    )
                ],
            )
        only_stream = None if which == "All" else which.lower().encode()
        c, path = self.state.kubelet.log_source(t.namespace, t.name, q.get("container"), previous)
        fault = self.state.faults.take_log_fault(t.name)
        killed = self.state.killed

        async def body() -> AsyncIterator[bytes]:
            lines = 0
            gen: AsyncGenerator[bytes, None] = stream_log(
                c,
                path,
                follow=follow and not previous,
                timestamps=timestamps,
                since_ns=since_ns,
                tail_lines=tail,
                limit_bytes=limit,
                only_stream=only_stream,
                killed=killed,
            )
            async with contextlib.aclosing(gen):
                async for chunk in gen:
                    if fault is None:
                        yield chunk
                        continue
                    # Split into whole lines so a fault acts after exactly N lines.
                    for piece in chunk.splitlines(keepends=True):
                        if lines >= fault.after_lines:
                            break
                        yield piece
                        if piece.endswith(b"\n"):
                            lines += 1
                    if lines >= fault.after_lines:
                        if fault.mode == "cut":
                            raise ServerKilled("log stream cut by the simulator")
                        if fault.mode == "end":
                            return
                        await killed.wait()
                        raise ServerKilled("the API server was stopped")

        return StreamingResponse(body(), media_type="text/plain")

    # ------------------------------------------------------------------ exec

    async def exec_ws(self, ws: WebSocket) -> None:
        """pods/exec over WebSocket (v4/v5 channel protocols)."""
        self.state.requests += 1
        ns = ws.path_params["namespace"]
        name = ws.path_params["name"]
        q = ws.query_params
        try:
            user = self._user(ws.headers)
            self._fault("GET", ws.url.path)
            self._authorize(user, "create", Target(PODS, ns, name, "exec"))
            offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
            proto = next((p for p in offered if p in self.state.exec_protocols), None)
            if proto is None:
                raise err_bad_request(
                    f"unable to upgrade connection: none of the offered subprotocols {offered} is supported; "
                    f"supported: {list(self.state.exec_protocols)}"
                )
            command = q.getlist("command")
            want_stdin = _bool(q, "stdin")
            want_stdout = q.get("stdout", "true").lower() in ("true", "1")
            want_stderr = q.get("stderr", "true").lower() in ("true", "1")
            if _bool(q, "tty"):
                raise err_bad_request("the simulator does not support tty exec sessions")
            if not (want_stdin or want_stdout or want_stderr):
                raise err_bad_request("you must specify at least 1 of stdin, stdout, stderr")
            proc = await self.state.kubelet.exec_process(ns, name, q.get("container"), command, want_stdin)
        except ApiError as exc:
            await ws.send_denial_response(_error_response(exc))
            return
        await ws.accept(subprotocol=proto)
        await _run_exec(ws, proc, proto, command, want_stdout, want_stderr, self.state)


async def _run_exec(
    ws: WebSocket,
    proc: asyncio.subprocess.Process,
    proto: str,
    command: list[str],
    want_stdout: bool,
    want_stderr: bool,
    state: SimState,
) -> None:
    send_lock = asyncio.Lock()

    async def send(channel: int, data: bytes) -> None:
        async with send_lock:
            await ws.send_bytes(bytes([channel]) + data)

    # remotecommand: an empty frame on the lowest writable channel tells the
    # client the session is established.
    await send(1 if want_stdout else 2 if want_stderr else 3, b"")

    async def pump(stream: asyncio.StreamReader | None, channel: int, forward: bool) -> None:
        if stream is None:
            return
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            if forward:
                await send(channel, chunk)

    async def feed() -> None:
        stdin = proc.stdin
        try:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                data = msg.get("bytes")
                if data is None:
                    text = msg.get("text")
                    if text is None:
                        continue
                    data = text.encode("utf-8")
                if not data:
                    continue
                channel, payload = data[0], data[1:]
                if channel == 0 and stdin is not None and not stdin.is_closing():
                    stdin.write(payload)
                    await stdin.drain()
                elif channel == 255 and proto == "v5.channel.k8s.io" and payload[:1] == b"\x00":
                    if stdin is not None and not stdin.is_closing():
                        stdin.close()
        except (WebSocketDisconnect, ConnectionError, RuntimeError):
            pass
        finally:
            if stdin is not None and not stdin.is_closing():
                with contextlib.suppress(Exception):
                    stdin.close()

    feeder = asyncio.ensure_future(feed())
    kill_wait = asyncio.ensure_future(state.killed.wait())
    pumps = asyncio.ensure_future(asyncio.gather(pump(proc.stdout, 1, want_stdout), pump(proc.stderr, 2, want_stderr)))
    waiter = asyncio.ensure_future(proc.wait())
    try:
        done, _ = await asyncio.wait({waiter, kill_wait}, return_when=asyncio.FIRST_COMPLETED)
        if kill_wait in done:
            _kill(proc)
            return
        await asyncio.wait({pumps}, timeout=10)
        rc = proc.returncode if proc.returncode is not None else -9
        code = 128 - rc if rc < 0 else rc
        if not state.faults.exec_empty_status:
            if code == 0:
                status: JSON = {"metadata": {}, "status": "Success"}
            else:
                status = {
                    "metadata": {},
                    "status": "Failure",
                    "message": f"command terminated with non-zero exit code: error executing command {json.dumps(command)}, exit code {code}",
                    "reason": "NonZeroExitCode",
                    "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
                }
            with contextlib.suppress(Exception):
                await send(3, dumps(status))
        with contextlib.suppress(Exception):
            await ws.close(1000)
    finally:
        _kill(proc)
        futures: list[asyncio.Future[Any]] = [feeder, kill_wait, pumps, waiter]
        for f in futures:
            f.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait(futures, timeout=5)


def _kill(proc: asyncio.subprocess.Process) -> None:
    import os
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
