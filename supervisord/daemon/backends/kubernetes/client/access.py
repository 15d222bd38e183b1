"""Cluster access: kubeconfig, one client per context, limiters, timeouts,
retries (docs/kubernetes.md, "Access").

Credentials come from the kubeconfig exactly as the official ``kubernetes``
client loads it (exec credential plugins, bearer tokens, client
certificates, CA data), from the path list it is given (the daemon resolves
``KUBECONFIG``, else ``~/.kube/config``: nothing here reads the user's home
or ``KUBECONFIG``), or from the pod's service account when jobsup runs
inside a cluster and no kubeconfig exists. One :class:`Cluster` per context
is loaded once and kept.

Three kinds of traffic, kept apart so one never starves another:

- **short calls** (get, list, create, delete, SelfSubjectAccessReview) use
  the official client's ``ApiClient`` in worker threads under a
  :class:`anyio.CapacityLimiter` of their own; every call has a connect and
  a read timeout; transient failures (HTTP 429 and 5xx, connection errors,
  timeouts) are retried with capped exponential backoff, honouring
  ``Retry-After``;
- **exec sessions** (source staging) run in worker threads under a second
  limiter (:mod:`.staging`);
- **long-lived streams** (watches, log follows) are read with ``httpx`` on
  the event loop, using the TLS settings and credentials the official client
  loaded: no thread is held per stream and a stream can always be cancelled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import ssl
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx
import structlog
import urllib3

from supervisord.daemon.backends.kubernetes.client.errors import (
    KubeconfigError,
    KubernetesApiError,
    UnreachableError,
    api_error,
)
from supervisord.shared.exceptions import ConfigError
from supervisord.shared.kubeconfig import current_context

__all__ = [
    "IN_CLUSTER_CONTEXT",
    "Cluster",
    "ClusterAccess",
    "RetryPolicy",
    "api_error_from_body",
    "is_transient",
]

log = structlog.get_logger("jobsup.kubernetes.access")

T = TypeVar("T")

#: The context name jobsup records when it uses the pod's service account.
IN_CLUSTER_CONTEXT = "in-cluster"

#: HTTP statuses worth retrying: throttling and server-side trouble.
_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})

_SHORT_TIMEOUT = (10.0, 30.0)

#: How many connection pools the keyed streams (log follows) are spread over.
STREAM_POOLS = 32


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff: attempt ``n`` (1-based) waits
    ``min(cap_s, base_s * 2**(n-1))`` seconds with +-20 % jitter, or the
    server's ``Retry-After`` when that is longer (still capped); at most
    ``attempts`` tries in all."""

    attempts: int = 6
    base_s: float = 0.2
    cap_s: float = 5.0

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (1-based)."""
        wait = min(self.cap_s, self.base_s * (2.0 ** (attempt - 1)))
        wait *= random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not a secret
        if retry_after_s is not None:
            wait = max(wait, min(retry_after_s, self.cap_s))
        return wait


def is_transient(err: BaseException) -> bool:
    """Whether a failed call is worth retrying: a :class:`KubernetesApiError`
    with status 0 (no answer), 429 or 5xx."""
    return isinstance(err, UnreachableError) or (
        isinstance(err, KubernetesApiError) and err.status in _TRANSIENT_STATUS
    )


def api_error_from_body(status: int, body: bytes, what: str, *, retry_after: str | None = None) -> KubernetesApiError:
    """A :class:`KubernetesApiError` from an HTTP error answer: ``body`` is
    a ``metav1.Status`` (its ``reason`` and ``message`` are used) or anything
    else (the first 300 bytes become the message). ``what`` says what jobsup
    was doing ("create Job/train-…")."""
    reason = _reason_for(status)
    message = ""
    parsed: Any = None
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        reason = str(parsed.get("reason") or reason)
        message = str(parsed.get("message") or "")
    if not message:
        message = body[:300].decode("utf-8", "replace").strip() or f"HTTP {status}"
    wait: float | None = None
    if retry_after:
        try:
            wait = float(retry_after)
        except ValueError:
            wait = None
    return api_error(f"{what}: {message}", status=status, reason=reason, body=parsed, retry_after_s=wait)


def _reason_for(status: int) -> str:
    return {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        405: "MethodNotAllowed",
        409: "Conflict",
        410: "Expired",
        415: "UnsupportedMediaType",
        422: "Invalid",
        429: "TooManyRequests",
        500: "InternalError",
        503: "ServiceUnavailable",
        504: "Timeout",
    }.get(status, "Unknown" if status else "Unreachable")


class Cluster:
    """One kubeconfig context: its loaded ``Configuration``, an ``ApiClient``
    for short calls and an ``httpx.AsyncClient`` for streams.

    Build through :meth:`ClusterAccess.cluster`. ``context`` is the context's
    name (:data:`IN_CLUSTER_CONTEXT` for the service account);
    ``default_namespace`` is the context's namespace, if it sets one.
    """

    def __init__(
        self,
        context: str,
        configuration: Any,
        *,
        limiter: anyio.CapacityLimiter,
        exec_limiter: anyio.CapacityLimiter,
        retry: RetryPolicy,
        default_namespace: str | None = None,
    ) -> None:
        from kubernetes import client as k8s_client

        self.context = context
        self.configuration = configuration
        self.default_namespace = default_namespace
        self.limiter = limiter
        self.exec_limiter = exec_limiter
        self.retry = retry
        # Retries are ours (capped, logged); urllib3 must not add its own.
        configuration.retries = False
        configuration.connection_pool_maxsize = max(int(limiter.total_tokens) + int(exec_limiter.total_tokens), 8)
        self.api_client = k8s_client.ApiClient(configuration)
        self._auth_limiter = anyio.CapacityLimiter(4)
        self.host = str(configuration.host).rstrip("/")
        self.ssl_context: ssl.SSLContext | None = self._ssl_context()
        """The TLS settings the kubeconfig gave (None for a plain-HTTP server)."""
        self._http = self._new_http_client()
        # Streams keyed by a name go to one of STREAM_POOLS clients (created on
        # first use): httpcore looks at every connection of a pool on each
        # request and each response closed, and one pool holding the log
        # streams of 500 runs spent a third of the daemon's loop doing so.
        self._pools: dict[int, httpx.AsyncClient] = {}

    def _new_http_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.host,
            verify=self.ssl_context if self.ssl_context is not None else False,
            proxy=self.configuration.proxy or None,
            timeout=httpx.Timeout(connect=15.0, read=None, write=15.0, pool=15.0),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=64),
            trust_env=False,
        )

    def _stream_client(self, pool_key: str | None) -> httpx.AsyncClient:
        """The client for a stream: the shared one, or for ``pool_key`` one of
        :data:`STREAM_POOLS` (the same one for the same key, so a log's
        final read finds the connection its follow just released)."""
        if pool_key is None:
            return self._http
        index = zlib.crc32(pool_key.encode()) % STREAM_POOLS
        client = self._pools.get(index)
        if client is None:
            client = self._pools[index] = self._new_http_client()
        return client

    def _ssl_context(self) -> ssl.SSLContext | None:
        cfg = self.configuration
        if not self.host.startswith("https://"):
            return None
        ctx = ssl.create_default_context(
            cafile=cfg.ssl_ca_cert or None, cadata=getattr(cfg, "ca_cert_data", None) or None
        )
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif cfg.assert_hostname is False:
            ctx.check_hostname = False
        return ctx

    # ------------------------------------------------------------ short calls

    def auth_headers(self) -> dict[str, str]:
        """The credential headers for one request (blocking: an exec
        credential plugin may run when the token has expired)."""
        headers: dict[str, str] = {}
        self.api_client.update_params_for_auth(headers, [], ["BearerToken"], "", "GET", None)
        return headers

    async def _stream_auth_headers(self) -> dict[str, str]:
        """:meth:`auth_headers` for opening a stream. Static credentials (no
        ``refresh_api_key_hook``: a bearer token, client certificates) are
        read here, on the loop; a refresh hook (an exec credential plugin,
        the service account's rotating token) may block, so it runs in a
        worker thread under a limiter of its own: not the short calls', where
        500 runs' final log reads queued behind each other's LISTs."""
        if getattr(self.configuration, "refresh_api_key_hook", None) is None:
            return self.auth_headers()
        return await anyio.to_thread.run_sync(self.auth_headers, limiter=self._auth_limiter, abandon_on_cancel=True)

    def _call_sync(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, Any]],
        body: Any,
        content_type: str | None,
        timeout: tuple[float, float],
    ) -> tuple[int, bytes, Mapping[str, str]]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        request = self.api_client.param_serialize(
            method,
            path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response: Any = self.api_client.call_api(*request, _request_timeout=timeout)
            response.read()
        except urllib3.exceptions.HTTPError as exc:
            return 0, f"{type(exc).__name__}: {exc}".encode(), {}
        except OSError as exc:
            return 0, f"{type(exc).__name__}: {exc}".encode(), {}
        except Exception as exc:  # the client wraps TLS errors in ApiException(status=0)
            status = getattr(exc, "status", None)
            if status == 0:
                return 0, str(getattr(exc, "reason", exc)).encode(), {}
            raise
        return int(response.status), bytes(response.data or b""), dict(response.getheaders() or {})

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, Any]] = (),
        body: Any = None,
        content_type: str | None = None,
        what: str | None = None,
        timeout: tuple[float, float] = _SHORT_TIMEOUT,
        retry: bool = True,
        raw: bool = False,
    ) -> Any:
        """One API call (``path`` below the server URL, e.g.
        ``/apis/batch/v1/namespaces/ns/jobs``); returns the decoded JSON body
        (``raw``: the body's bytes, for pods/log).

        ``timeout`` is (connect, read) seconds. Transient failures are
        retried per :attr:`retry` unless ``retry`` is False. Raises
        :class:`KubernetesApiError` (``status`` 0 when the server never
        answered) whose message starts with ``what`` (default
        ``"METHOD path"``).
        """
        label = what or f"{method} {path}"
        attempt = 0
        while True:
            attempt += 1
            status, data, headers = await anyio.to_thread.run_sync(
                self._call_sync,
                method,
                path,
                query,
                body,
                content_type,
                timeout,
                limiter=self.limiter,
                abandon_on_cancel=True,
            )
            if 200 <= status < 300:
                if raw:
                    return data
                if not data:
                    return {}
                try:
                    return json.loads(data)
                except ValueError:
                    return data.decode("utf-8", "replace")
            err: KubernetesApiError
            if status == 0:
                err = UnreachableError(
                    f"{label}: the Kubernetes API server at {self.host} did not answer ({data.decode('utf-8', 'replace')})",
                    status=0,
                    reason="Unreachable",
                )
            else:
                err = api_error_from_body(status, data, label, retry_after=_header(headers, "Retry-After"))
            if not retry or not is_transient(err) or attempt >= self.retry.attempts:
                raise err
            wait = self.retry.delay(attempt, err.retry_after_s)
            log.info("retrying", call=label, status=status, attempt=attempt, wait_s=round(wait, 2))
            await anyio.sleep(wait)

    async def call_in_thread(self, fn: Callable[..., T], *args: Any, exec_session: bool = False) -> T:
        """Run a blocking ``fn(*args)`` in a worker thread under this
        cluster's short-call limiter (or the exec limiter)."""
        limiter = self.exec_limiter if exec_session else self.limiter
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=True)

    # --------------------------------------------------------------- streams

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, query: Sequence[tuple[str, Any]], *, what: str, pool_key: str | None = None
    ) -> AsyncIterator[httpx.Response]:
        """Open a long-lived GET (a watch or a log follow) and yield the
        response once its status is 2xx; the body is read by the caller, who
        bounds each read with its own timeout. ``pool_key`` (e.g. the log's
        source) spreads the streams over several connection pools. Raises
        KubernetesApiError for an error status (status 0 when the server
        cannot be reached)."""
        headers = await self._stream_auth_headers()
        headers["Accept"] = "application/json, */*"
        client = self._stream_client(pool_key)
        request = client.build_request("GET", path, params=[(k, str(v)) for k, v in query], headers=headers)
        try:
            response = await client.send(request, stream=True)
        except (httpx.HTTPError, OSError, ssl.SSLError) as exc:
            raise UnreachableError(
                f"{what}: the Kubernetes API server at {self.host} did not answer ({type(exc).__name__}: {exc})",
                status=0,
                reason="Unreachable",
            ) from None
        try:
            if response.status_code >= 300:
                body = await response.aread()
                raise api_error_from_body(
                    response.status_code, body, what, retry_after=response.headers.get("Retry-After")
                )
            yield response
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        """Close the HTTP clients (their connections)."""
        for client in [self._http, *self._pools.values()]:
            await client.aclose()
        await anyio.to_thread.run_sync(self.api_client.close, limiter=self.limiter)


def _config_module() -> tuple[Any, type[Exception]]:
    """``kubernetes.config`` (untyped, hence Any) and its ConfigException."""
    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    module: Any = k8s_config
    return module, ConfigException


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


class ClusterAccess:
    """Loads and keeps one :class:`Cluster` per kubeconfig context.

    ``kubeconfig``: the kubeconfig path(s) (``os.pathsep``-separated), as
    resolved by the caller; None or empty: no kubeconfig (the pod's service
    account inside a cluster).
    ``short_calls`` / ``exec_sessions``: how many blocking short calls / exec
    sessions may run at once (worker threads).
    """

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        short_calls: int = 16,
        exec_sessions: int = 8,
        retry: RetryPolicy = RetryPolicy(),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.retry = retry
        self._limiter = anyio.CapacityLimiter(short_calls)
        self._exec_limiter = anyio.CapacityLimiter(exec_sessions)
        self._load_limiter = anyio.CapacityLimiter(2)
        self._clusters: dict[str, Cluster] = {}
        self._lock = anyio.Lock()

    def kubeconfig_paths(self) -> str:
        """The kubeconfig path list in effect (``os.pathsep``-separated; ""
        when none was given)."""
        return (self.kubeconfig or "").strip()

    def _kubeconfig_exists(self) -> bool:
        return any(Path(p).is_file() for p in self.kubeconfig_paths().split(os.pathsep) if p.strip())

    def current_context(self) -> str:
        """The kubeconfig's current context (blocking: reads the files), or
        :data:`IN_CLUSTER_CONTEXT` inside a pod without a kubeconfig.
        Raises KubeconfigError."""
        paths = self.kubeconfig_paths()
        if not self._kubeconfig_exists():
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                return IN_CLUSTER_CONTEXT
            raise KubeconfigError(
                f"no kubeconfig at {paths or '(none given)'}: set KUBECONFIG for the daemon or create "
                "~/.kube/config (`kubectl config view` should show your cluster)"
            )
        try:
            name = current_context(Path(p) for p in paths.split(os.pathsep) if p.strip())
        except ConfigError as exc:
            raise KubeconfigError(f"kubeconfig {paths}: {exc}") from None
        if not name:
            raise KubeconfigError(
                f"kubeconfig {paths} has no current-context: set one (kubectl config use-context NAME) "
                "or set kubernetes.context"
            )
        return str(name)

    def _load(self, context: str) -> Cluster:
        from kubernetes import client as k8s_client

        k8s_config, ConfigException = _config_module()

        configuration = k8s_client.Configuration()
        paths = self.kubeconfig_paths()
        if context == IN_CLUSTER_CONTEXT and not self._kubeconfig_exists():
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except ConfigException as exc:
                raise KubeconfigError(f"in-cluster config: {exc}") from None
            ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            ns = ns_file.read_text().strip() if ns_file.is_file() else None
            return self._make(IN_CLUSTER_CONTEXT, configuration, ns)
        if not self._kubeconfig_exists():
            raise KubeconfigError(
                f"no kubeconfig at {paths or '(none given)'}: set KUBECONFIG for the daemon or create ~/.kube/config"
            )
        try:
            contexts, _active = k8s_config.list_kube_config_contexts(config_file=paths)
            entry = next((c for c in contexts or [] if c.get("name") == context), None)
            if entry is None:
                names = ", ".join(sorted(str(c.get("name")) for c in contexts or [])) or "none"
                raise ConfigException(f"context {context!r} is not in the kubeconfig (have: {names})")
            k8s_config.load_kube_config(
                config_file=paths, context=context, client_configuration=configuration, persist_config=False
            )
        except ConfigException as exc:
            raise KubeconfigError(f"kubeconfig {paths}: {exc}") from None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise KubeconfigError(
                f"kubeconfig {paths}: cannot load context {context}: {type(exc).__name__}: {exc}"
            ) from None
        ns = (entry.get("context") or {}).get("namespace")
        return self._make(context, configuration, ns)

    def _make(self, name: str, configuration: Any, namespace: str | None) -> Cluster:
        return Cluster(
            name,
            configuration,
            limiter=self._limiter,
            exec_limiter=self._exec_limiter,
            retry=self.retry,
            default_namespace=namespace,
        )

    async def cluster(self, context: str | None) -> Cluster:
        """The :class:`Cluster` for ``context`` (None: the kubeconfig's
        current context, read again on every call), loaded on first use.
        Raises KubeconfigError naming the
        kubeconfig when it cannot be loaded."""
        name = context
        if not name:
            name = await anyio.to_thread.run_sync(self.current_context, limiter=self._load_limiter)
        async with self._lock:
            found = self._clusters.get(name)
            if found is not None:
                return found
            loaded = await anyio.to_thread.run_sync(self._load, name, limiter=self._load_limiter)
            self._clusters[name] = loaded
            log.info("cluster loaded", context=loaded.context, host=loaded.host)
            return loaded

    async def aclose(self) -> None:
        """Close every cluster's clients."""
        seen: set[int] = set()
        for cluster in list(self._clusters.values()):
            if id(cluster) in seen:
                continue
            seen.add(id(cluster))
            try:
                await cluster.aclose()
            except Exception as exc:  # noqa: BLE001 - closing sockets at shutdown: report, go on with the others
                log.warning("closing the cluster client failed", context=cluster.context, error=repr(exc))
        self._clusters.clear()
