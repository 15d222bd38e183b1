"""SimCluster: the simulated cluster as one object for tests and benchmarks.

It runs the API server (uvicorn + Starlette, TLS on 127.0.0.1, random port),
the Job controller and the kubelet on one asyncio event loop in a thread of
its own (an anyio blocking portal), so synchronous test code and the official
``kubernetes`` client can talk to it; every helper method below is synchronous
and thread-safe.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio.from_thread
import structlog
import uvicorn
import yaml

from .controller import JobController
from .faults import Faults
from .kubelet import Kubelet
from .server import AccessRule, ServerKilled, SimApp, SimState, default_and_validate
from .store import JOBS, NAMESPACES, RESOURCES, ObjectStore, ResourceType
from .util import JSON, SimError, dumps, status_failure

log = structlog.get_logger("tests.k8s_sim.cluster")

T = TypeVar("T")

TOKEN_USER = "jobsup-sim-user"
EXEC_USER = "jobsup-sim-exec-user"


class _DropServerKilled(logging.Filter):
    """Keep uvicorn quiet about streams the simulator aborts on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        seen: set[int] = set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            if isinstance(exc, ServerKilled):
                return False
            if isinstance(exc, BaseExceptionGroup) and any(isinstance(e, ServerKilled) for e in exc.exceptions):
                return False
            exc = exc.__cause__ or exc.__context__
        return True


_FILTER = _DropServerKilled()
logging.getLogger("uvicorn.error").addFilter(_FILTER)

# uvicorn's "websockets" protocol is the one that supports the ASGI
# websocket.http.response extension, which exec needs to refuse an upgrade
# with a Status body (400 "container not found") the way the kubelet does;
# the sans-I/O one can only answer 403 without a body. Its module warns that
# it is deprecated when imported: import it quietly, once.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from uvicorn.protocols.websockets.websockets_impl import WebSocketProtocol as _LegacyWebSocketProtocol


class _ExecWebSocketProtocol(_LegacyWebSocketProtocol):
    """uvicorn's websockets protocol with a one-argument handler, so that the
    websockets library does not warn about the legacy two-argument form on
    every connection."""

    async def ws_handler(self, protocol: Any, path: str = "") -> Any:
        return await super().ws_handler(protocol, path or protocol.path)


def _listen_socket() -> socket.socket:
    """A TCP socket for the API server. proto must be IPPROTO_TCP: asyncio only
    sets TCP_NODELAY on accepted sockets whose proto says TCP, and without it
    every keep-alive request waits ~40 ms for a delayed ACK."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    return sock


def _probe_private_tmp(root: Path) -> bool:
    """Whether ``unshare --mount`` + a bind mount on /tmp works here (root, a
    kernel with mount namespaces, util-linux's unshare)."""
    if shutil.which("unshare") is None:
        return False
    probe = root / "probe-tmp"
    probe.mkdir(parents=True, exist_ok=True)
    (probe / "marker").write_text("x")
    try:
        r = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-c",
                'mount --bind "$0" /tmp && test -f /tmp/marker',
                str(probe),
            ],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return r.returncode == 0


def _make_certs(directory: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost, made
    with the openssl CLI. Returns (ca.crt, server.crt, server.key)."""
    ca_crt, ca_key = directory / "ca.crt", directory / "ca.key"
    crt, key, csr, ext = (
        directory / "server.crt",
        directory / "server.key",
        directory / "server.csr",
        directory / "server.ext",
    )
    if ca_crt.exists() and crt.exists() and key.exists():
        return ca_crt, crt, key
    if shutil.which("openssl") is None:
        raise SimError(
            "SimCluster(tls=True) needs the openssl CLI to make certificates; install openssl or pass tls=False"
        )
    directory.mkdir(parents=True, exist_ok=True)
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        r = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise SimError(f"openssl {args[0]} failed: {r.stderr.strip()}")

    run(
        "req",
        "-x509",
        *curve,
        "-keyout",
        str(ca_key),
        "-out",
        str(ca_crt),
        "-days",
        "7",
        "-subj",
        "/CN=jobsup-k8s-sim-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    run("req", *curve, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=jobsup-k8s-sim-apiserver")
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca_crt),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(crt),
        "-days",
        "7",
        "-extfile",
        str(ext),
    )
    return ca_crt, crt, key


_EXEC_PLUGIN = '''\
"""client-go exec credential plugin of the jobsup Kubernetes simulator."""
import json, os, sys
info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{}")
with open(sys.argv[2], "a") as calls:
    calls.write("call\\n")
print(json.dumps({
    "apiVersion": info.get("apiVersion", "client.authentication.k8s.io/v1beta1"),
    "kind": "ExecCredential",
    "status": {"token": sys.argv[1]},
}))
'''


class SimCluster:
    """A simulated one-node Kubernetes cluster on loopback.

    Use :meth:`start` (a context manager). Attributes:

    - ``kubeconfig_path``: a kubeconfig with two contexts (``contexts``):
      ``jobsup-sim`` (static bearer token) and ``jobsup-sim-exec`` (token from
      an exec credential plugin); both default to ``namespace``.
    - ``namespace``: the namespace made for the tests (``default`` exists too).
    - ``url``: ``https://127.0.0.1:<port>``.
    - ``faults``: the fault knobs (:class:`~tests.k8s_sim.faults.Faults`).
    - ``root``: the folder holding certificates, kubeconfig and pod dirs.
    """

    def __init__(self, root: Path, namespace: str, tls: bool, watch_window: int) -> None:
        self.root = root
        self.namespace = namespace
        self.tls = tls
        self.contexts: tuple[str, str] = ("jobsup-sim", "jobsup-sim-exec")
        self.kubeconfig_path = root / "kubeconfig"
        self.faults = Faults()
        self._watch_window = watch_window
        self._stack = ExitStack()
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._server: uvicorn.Server | None = None
        self._hung: socket.socket | None = None
        """The listening socket that never accepts, while :meth:`hang` is in effect."""
        self._serve_task: asyncio.Task[None] | None = None
        self._port = 0
        self._tokens = {
            "sim-token-" + os.urandom(12).hex(): TOKEN_USER,
            "sim-exec-token-" + os.urandom(12).hex(): EXEC_USER,
        }
        self._state: SimState | None = None
        self._certs: tuple[Path, Path, Path] | None = None
        self.private_tmp = False
        self._running = False

    # ---------------------------------------------------------------- start

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        root: Path | str,
        *,
        namespace: str = "jobsup-test",
        tls: bool = True,
        watch_window: int = 10_000,
        private_tmp: bool | None = None,
    ) -> Iterator[SimCluster]:
        """Start a cluster whose files live under ``root`` (created if needed);
        stop it and kill every container on exit.

        ``watch_window`` is how many events are retained for watches to resume
        from (older resourceVersions get 410). ``private_tmp`` None probes
        whether mount namespaces work (root + unshare) and uses them if so;
        False forces the fallback that rewrites /tmp paths; True fails with
        SimError when they do not work. Raises SimError when the certificates
        cannot be made.
        """
        sim = cls(Path(root), namespace, tls, watch_window)
        sim._open(private_tmp)
        try:
            yield sim
        finally:
            sim.close()

    def _open(self, private_tmp: bool | None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.private_tmp = _probe_private_tmp(self.root) if private_tmp is not False else False
        if private_tmp and not self.private_tmp:
            raise SimError(
                "private_tmp=True: unshare --mount with a bind mount on /tmp does not work here (needs root and util-linux unshare)"
            )
        if not self.private_tmp:
            log.warning("no mount namespaces here: /tmp paths are rewritten to per-container folders")
        if self.tls:
            self._certs = _make_certs(self.root / "pki")
        try:
            self._portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal("asyncio"))
            self._portal.call(self._astart)
            self._running = True
            self._write_kubeconfig()
        except BaseException:
            self._stack.close()
            raise

    async def _astart(self) -> None:
        import threading

        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        store = ObjectStore(window=self._watch_window)
        kubelet = Kubelet(store, self.faults, self.root / "pods", private_tmp=self.private_tmp)
        controller = JobController(store)
        loop = self._loop

        def notify() -> None:
            loop.call_soon_threadsafe(kubelet.faults_changed)

        self.faults.notify = notify
        self._state = SimState(
            store=store, kubelet=kubelet, controller=controller, faults=self.faults, tokens=self._tokens
        )
        for ns in ("default", "kube-system", self.namespace):
            if store.find(NAMESPACES, "", ns) is None:
                obj = store.prepare_new(
                    NAMESPACES,
                    "",
                    {
                        "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
                        "spec": {"finalizers": ["kubernetes"]},
                        "status": {"phase": "Active"},
                    },
                )
                store.create(NAMESPACES, "", obj)
        controller.start()
        sock = _listen_socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        await self._aserve(sock)

    async def _aserve(self, sock: socket.socket | None = None) -> None:
        assert self._state is not None
        if sock is None:
            sock = _listen_socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self._port))
        self._state.killed = asyncio.Event()
        app = SimApp(self._state).build()
        kwargs: dict[str, Any] = {}
        if self._certs is not None:
            kwargs.update(ssl_certfile=str(self._certs[1]), ssl_keyfile=str(self._certs[2]))
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            ws=_ExecWebSocketProtocol,
            ws_max_size=64 * 1024 * 1024,
            ws_per_message_deflate=False,
            ws_ping_interval=None,
            timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
            **kwargs,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._serve_task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="sim apiserver")
        for _ in range(500):
            if server.started or self._serve_task.done():
                break
            await asyncio.sleep(0.01)
        if self._serve_task.done():
            self._serve_task.result()
            raise SimError("the simulated API server stopped at once")

    async def _astop_server(self) -> None:
        assert self._state is not None
        self._state.killed.set()
        if self._server is not None:
            # A kill, not a drain: drop every connection at once.
            for conn in list(self._server.server_state.connections):
                transport = getattr(conn, "transport", None)
                if transport is not None:
                    transport.abort()
            self._server.should_exit = True
        if self._serve_task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._serve_task, timeout=10)
        self._server = None
        self._serve_task = None

    def _write_kubeconfig(self) -> None:
        tokens = {user: tok for tok, user in self._tokens.items()}
        cluster: JSON = {"server": self.url}
        if self._certs is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self._certs[0].read_bytes()).decode()
        plugin = self.root / "exec-credential.py"
        plugin.write_text(_EXEC_PLUGIN)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "jobsup-sim", "cluster": cluster}],
            "users": [
                {"name": TOKEN_USER, "user": {"token": tokens[TOKEN_USER]}},
                {
                    "name": EXEC_USER,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": sys.executable,
                            "args": [str(plugin), tokens[EXEC_USER], str(self.root / "exec-credential.calls")],
                            "interactiveMode": "Never",
                            "provideClusterInfo": False,
                        }
                    },
                },
            ],
            "contexts": [
                {
                    "name": self.contexts[0],
                    "context": {"cluster": "jobsup-sim", "user": TOKEN_USER, "namespace": self.namespace},
                },
                {
                    "name": self.contexts[1],
                    "context": {"cluster": "jobsup-sim", "user": EXEC_USER, "namespace": self.namespace},
                },
            ],
            "current-context": self.contexts[0],
        }
        self.kubeconfig_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig_path.chmod(0o600)

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The API server's base URL."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._port}"

    @property
    def port(self) -> int:
        """The API server's TCP port (kept across :meth:`restart`)."""
        return self._port

    @property
    def ca_cert_path(self) -> Path | None:
        """The CA certificate the kubeconfig trusts (None without TLS)."""
        return None if self._certs is None else self._certs[0]

    @property
    def api_running(self) -> bool:
        """Whether the HTTP server is up (False between stop and restart)."""
        return self._server is not None

    def stop(self) -> None:
        """Kill the API server: open watches, log streams and exec sessions are
        aborted and new connections are refused. Objects, the kubelet's
        containers and the controllers keep going (like etcd and a node while
        the apiserver is down)."""
        self._call(self._astop_server)

    def hang(self, *, backlog: int = 8) -> None:
        """Make the API server unreachable the way a dead or firewalled host
        is, not the way a stopped process is: the server is killed (open
        watches, log streams and exec sessions are aborted) and its port is
        held by a socket that listens but never accepts. The kernel completes
        up to ``backlog`` TCP handshakes, after which nothing answers: TLS
        handshakes and requests hang until the client's own timeout; once the
        backlog is full, new connects hang in SYN. No connection is refused,
        so every call's timeout is exercised. :meth:`restart` ends it."""

        async def go() -> None:
            if self._server is not None:
                await self._astop_server()
            self._release_hang()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self._port))
            sock.listen(backlog)
            self._hung = sock

        self._call(go)

    def _release_hang(self) -> None:
        if self._hung is not None:
            self._hung.close()
            self._hung = None

    def restart(self, *, drop_watch_history: bool = False) -> None:
        """Start the API server again on the same port with the same state (a
        stop first if it is running). With ``drop_watch_history`` the new
        server starts with an empty watch cache, as a real apiserver does
        (its cache is filled from etcd at the current revision): a watch or
        continue token from any resourceVersion before the restart gets 410
        Expired, so a client that resumes instead of relisting misses what
        changed while the server was down."""

        async def go() -> None:
            if self._server is not None:
                await self._astop_server()
            self._release_hang()
            if drop_watch_history:
                assert self._state is not None
                self._state.store.compact()
            await self._aserve()

        self._call(go)

    def close(self) -> None:
        """Stop everything: the API server, every container (SIGKILL), the
        controllers and the event loop. Idempotent."""
        if not self._running:
            return
        self._running = False

        async def go() -> None:
            assert self._state is not None
            await self._astop_server()
            self._release_hang()
            await self._state.kubelet.close()
            await self._state.controller.close()

        try:
            self._call(go)
        finally:
            self._stack.close()

    def _call(self, fn: Callable[[], Any], *args: Any) -> Any:
        if self._portal is None:
            raise SimError("the simulated cluster is not running")
        import threading

        if threading.get_ident() == self._loop_thread_id:
            raise SimError("SimCluster methods are for other threads; the simulator's loop called one")
        return self._portal.call(fn, *args)

    def _sync(self, fn: Callable[..., T], *args: Any) -> T:
        async def run() -> T:
            return fn(*args)

        result: T = self._call(run)
        return result

    # --------------------------------------------------------------- clients

    def api_client(self, context: str | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` built from the kubeconfig (context
        defaults to the token one)."""
        from kubernetes import config as k8s_config

        new_client: Any = k8s_config.new_client_from_config
        return new_client(config_file=str(self.kubeconfig_path), context=context or self.contexts[0])

    def exec_plugin_calls(self) -> int:
        """How many times the exec credential plugin has run."""
        p = self.root / "exec-credential.calls"
        return len(p.read_text().splitlines()) if p.exists() else 0

    @property
    def requests_served(self) -> int:
        """HTTP requests (and WebSocket sessions) the API server has seen."""
        assert self._state is not None
        return self._state.requests

    def cpu_seconds(self) -> float:
        """CPU seconds used by the simulator's event-loop thread (API server,
        controllers, kubelet bookkeeping; not the containers)."""
        return float(self._sync(time.thread_time))

    def configure(
        self,
        *,
        job_backoff_s: float | None = None,
        crash_backoff_s: float | None = None,
        image_pull_backoff_s: float | None = None,
        bookmark_interval_s: float | None = None,
        watch_window: int | None = None,
        exec_protocols: tuple[str, ...] | None = None,
        log_runtime: str | None = None,
        log_utc_offset_s: int | None = None,
    ) -> None:
        """Tune timings: the Job controller's first pod-replacement back-off,
        the kubelet's first CrashLoopBackOff and ErrImagePull->ImagePullBackOff
        delays, the watch BOOKMARK interval, how many events watches can
        resume from, and which exec subprotocols the server accepts (e.g.
        ``("v4.channel.k8s.io",)`` to force v4). ``log_runtime``:
        ``"containerd"`` (default: each log line stamped on its own, UTC) or
        ``"cri-o"`` (every line of one read buffer gets the same timestamp, in
        the node's zone ``log_utc_offset_s`` seconds east of UTC, e.g. 3600
        for ``+01:00``); applies to containers started afterwards too."""
        state = self._require_state()
        if log_runtime not in (None, "containerd", "cri-o"):
            raise SimError(f"log_runtime must be 'containerd' or 'cri-o', got {log_runtime!r}")

        def apply() -> None:
            if job_backoff_s is not None:
                state.controller.backoff_base_s = job_backoff_s
            if crash_backoff_s is not None:
                state.kubelet.crash_backoff_s = crash_backoff_s
            if image_pull_backoff_s is not None:
                state.kubelet.image_pull_backoff_s = image_pull_backoff_s
            if bookmark_interval_s is not None:
                state.bookmark_interval_s = bookmark_interval_s
            if watch_window is not None:
                state.store.window = watch_window
            if exec_protocols is not None:
                state.exec_protocols = exec_protocols
            if log_runtime is not None:
                state.kubelet.log_runtime = log_runtime
            if log_utc_offset_s is not None:
                state.kubelet.log_utc_offset_s = log_utc_offset_s

        self._sync(apply)

    def _require_state(self) -> SimState:
        if self._state is None:
            raise SimError("the simulated cluster is not running")
        return self._state

    # ------------------------------------------------------------ objects

    def create_object(self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None) -> JSON:
        """Create any served object directly in the store (defaulting and
        validation as over HTTP). ``resource`` is ``pods``, ``jobs.batch``,
        ``runtimeclasses.node.k8s.io``... Returns the stored object; raises
        ApiError (409, 422...) like the API would."""
        res = _resource(resource)
        ns = (namespace or self.namespace) if res.namespaced else ""
        state = self._require_state()
        body = json.loads(dumps(dict(obj)))

        def create() -> JSON:
            from .server import _job_selector_labels

            default_and_validate(res, body)
            prepared = state.store.prepare_new(res, ns, body)
            if res is JOBS:
                _job_selector_labels(prepared)
            stored: JSON = json.loads(dumps(state.store.create(res, ns, prepared)))
            return stored

        return self._sync(create)

    def get_object(self, resource: str, name: str, *, namespace: str | None = None) -> JSON | None:
        """A stored object (a copy), or None."""
        res = _resource(resource)
        ns = (namespace or self.namespace) if res.namespaced else ""
        state = self._require_state()

        def get() -> JSON | None:
            obj = state.store.find(res, ns, name)
            return None if obj is None else json.loads(dumps(obj))

        return self._sync(get)

    def require_object(self, resource: str, name: str, *, namespace: str | None = None) -> JSON:
        """A stored object (a copy); raises SimError naming it when absent."""
        obj = self.get_object(resource, name, namespace=namespace)
        if obj is None:
            raise SimError(f"{resource} {name!r} does not exist in namespace {namespace or self.namespace!r}")
        return obj

    def list_objects(self, resource: str, *, namespace: str | None = None) -> list[JSON]:
        """Stored objects of a resource in ``namespace`` (default: the test
        namespace; cluster-scoped resources ignore it), as copies."""
        res = _resource(resource)
        ns = (namespace or self.namespace) if res.namespaced else None
        state = self._require_state()
        return self._sync(lambda: [json.loads(dumps(o)) for o in state.store.items(res, ns)])

    def create_namespace(self, name: str) -> JSON:
        """Create a Namespace."""
        return self.create_object(
            "namespaces",
            {
                "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
                "status": {"phase": "Active"},
            },
        )

    def create_secret(
        self,
        name: str,
        data: Mapping[str, str | bytes],
        *,
        namespace: str | None = None,
        type_: str = "Opaque",
    ) -> JSON:
        """Create a Secret; values are given raw and stored base64-encoded."""
        encoded = {k: base64.b64encode(v if isinstance(v, bytes) else v.encode()).decode() for k, v in data.items()}
        return self.create_object(
            "secrets", {"metadata": {"name": name}, "type": type_, "data": encoded}, namespace=namespace
        )

    def create_configmap(self, name: str, data: Mapping[str, str], *, namespace: str | None = None) -> JSON:
        """Create a ConfigMap."""
        return self.create_object("configmaps", {"metadata": {"name": name}, "data": dict(data)}, namespace=namespace)

    def create_pvc(
        self,
        name: str,
        *,
        storage: str = "1Gi",
        phase: str = "Bound",
        storage_class: str = "standard",
        namespace: str | None = None,
    ) -> JSON:
        """Create a PersistentVolumeClaim with the given status phase (Bound,
        Pending, Lost); pods mounting it see :meth:`pvc_path`."""
        return self.create_object(
            "persistentvolumeclaims",
            {
                "metadata": {"name": name},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": storage}},
                    "storageClassName": storage_class,
                    "volumeMode": "Filesystem",
                },
                "status": {"phase": phase, "accessModes": ["ReadWriteOnce"], "capacity": {"storage": storage}}
                if phase == "Bound"
                else {"phase": phase},
            },
            namespace=namespace,
        )

    def pvc_path(self, claim: str, *, namespace: str | None = None) -> Path:
        """The host folder that pods mounting PersistentVolumeClaim ``claim``
        see at their mountPath (made on first use), e.g. to seed files."""
        state = self._require_state()
        path: Path = self._sync(state.kubelet.pvc_dir, namespace or self.namespace, claim)
        return path

    def create_runtime_class(self, name: str, handler: str = "runc") -> JSON:
        """Create a RuntimeClass (node.k8s.io/v1); pods using it run like any other."""
        return self.create_object("runtimeclasses.node.k8s.io", {"metadata": {"name": name}, "handler": handler})

    def set_access_rules(self, rules: list[AccessRule], *, enforce: bool = False) -> None:
        """Replace the rules SelfSubjectAccessReview answers from (default: one
        rule allowing everything). With ``enforce`` requests they do not allow
        get 403 Forbidden."""
        state = self._require_state()

        def apply() -> None:
            state.access_rules = list(rules)
            state.enforce_rbac = enforce

        self._sync(apply)

    # ---------------------------------------------------------------- faults

    def expire_watches(self, *, notify_open: bool = True) -> int:
        """Compact the event history: any watch or continue token from an older
        resourceVersion gets 410 Expired. With ``notify_open`` every open watch
        receives an ERROR event (410 Expired Status) and ends. Returns the
        current resourceVersion (resumable from now on)."""
        state = self._require_state()

        def go() -> int:
            rv = state.store.compact()
            if notify_open:
                line = (
                    dumps(
                        {
                            "type": "ERROR",
                            "object": status_failure(410, "Expired", f"too old resource version: {rv - 1} ({rv})"),
                        }
                    )
                    + b"\n"
                )
                for ws in state.store.watchers.values():
                    for w in ws:
                        w.queue.put_nowait(line)
            return rv

        return self._sync(go)

    def evict_pod(
        self,
        name: str,
        *,
        namespace: str | None = None,
        message: str = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi. ",
    ) -> None:
        """Evict a running pod like kubelet node-pressure eviction: containers
        are killed, the pod ends Failed with reason Evicted and a
        DisruptionTarget condition; its Job controller may replace it."""
        state = self._require_state()
        self._sync(state.kubelet.evict, namespace or self.namespace, name, message)

    def oom_kill(self, pod: str, container: str | None = None, *, namespace: str | None = None) -> None:
        """Kill a running container as the OOM killer would (exit 137, OOMKilled)."""
        state = self._require_state()
        self._sync(state.kubelet.oom_kill, namespace or self.namespace, pod, container)

    def rotate_log(self, pod: str, container: str | None = None, *, namespace: str | None = None) -> Path:
        """Rotate a running container's log file (see Kubelet.rotate_log)."""
        state = self._require_state()
        path: Path = self._sync(state.kubelet.rotate_log, namespace or self.namespace, pod, container)
        return path

    def delete_object(
        self,
        resource: str,
        name: str,
        *,
        namespace: str | None = None,
        propagation: Literal["Background", "Foreground", "Orphan"] | None = "Background",
        grace_seconds: int | None = None,
    ) -> None:
        """Delete an object behind the client's back (e.g. a Job or pod another
        actor removes), with API DELETE semantics."""
        res = _resource(resource)
        ns = (namespace or self.namespace) if res.namespaced else ""
        state = self._require_state()
        self._sync(lambda: state.store.delete(res, ns, name, propagation=propagation, grace_seconds=grace_seconds))

    def delete_job(
        self,
        name: str,
        *,
        namespace: str | None = None,
        propagation: Literal["Background", "Foreground", "Orphan"] = "Background",
    ) -> None:
        """Delete a Job behind jobsup's back (Background: its pods go too)."""
        self.delete_object("jobs.batch", name, namespace=namespace, propagation=propagation)

    # --------------------------------------------------------------- waiting

    def wait_for(
        self, predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"
    ) -> Any:
        """Poll ``predicate`` (in the caller's thread) until it returns a truthy
        value, and return it; raises TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(interval)

    def pod_of_job(self, job: str, *, namespace: str | None = None) -> JSON | None:
        """The newest pod labelled ``job-name=<job>``, or None."""
        pods = [
            p
            for p in self.list_objects("pods", namespace=namespace)
            if (p["metadata"].get("labels") or {}).get("job-name") == job
        ]
        pods.sort(key=lambda p: (p["metadata"]["creationTimestamp"], int(p["metadata"]["resourceVersion"])))
        return pods[-1] if pods else None


def _resource(name: str) -> ResourceType:
    """Resolve ``plural`` or ``plural.group`` to a served resource."""
    plural, _, group = name.partition(".")
    res = RESOURCES.get((group, plural))
    if res is None:
        known = ", ".join(sorted(r.qualified for r in RESOURCES.values()))
        raise SimError(f"unknown resource {name!r}; served: {known}")
    return res
