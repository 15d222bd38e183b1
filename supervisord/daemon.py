"""The daemon: config -> store -> backends -> supervisor -> API.

Start-up order (each step fails fast with a clear message, before serving):

1. read and validate the daemon config layer (every error at once);
2. lock the state dir (one daemon per state dir, whatever its socket);
3. check the socket folder (created 0700; refused when others can write it)
   and that no other daemon answers on the socket;
4. open the event store (refuses corrupt or newer databases);
5. reattach to every non-terminal run;
6. serve the API on the socket (0600), then tell systemd READY=1.

SIGTERM/SIGINT stop supervision and the API cleanly; runs keep running (the
next daemon reattaches to them).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import signal
import socket
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import click
import structlog
import uvicorn

from store import EventStore, RunStatus
from store.errors import StoreError, StoreOpenError
from supervisord import config as cfg
from supervisord import version
from supervisord.api.inflight import InFlight
from supervisord.api.server import PeerCredProtocol, create_app
from supervisord.api.streams import StreamCloser
from supervisord.backends.base import Backend
from supervisord.backends.kubernetes import KubernetesBackend
from supervisord.backends.local import LocalBackend
from supervisord.config.unimplemented import not_implemented_warnings
from supervisord.exceptions import ConfigError, DaemonError, JobsupError, UsageError
from supervisord.health import disk_full_hint, output_space_check, storage_check
from supervisord.hooks.config import HookSpec, load_hooks
from supervisord.hooks.delivery import HookService
from supervisord.logging import configure_logging
from supervisord.malloc import tune_malloc
from supervisord.ownership import check_state_dir, remove_snapshot_leftovers
from supervisord.paths import Paths
from supervisord.retention import Retention, RetentionSettings
from supervisord.scheduler.driver import Scheduler, SchedulerSettings
from supervisord.scheduler.gpus import inventory as gpu_inventory
from supervisord.scheduler.rerun import rerun_run
from supervisord.secret import load_digest_key
from supervisord.submit import Planner
from supervisord.supervisor import Supervisor
from supervisord.ui import UiServer
from supervisord.ui.actions import SupervisorActions

__all__ = ["STOP_GRACE_S", "Daemon", "run_daemon", "sd_notify"]

log = structlog.get_logger("jobsup.daemon")

#: Seconds a stopping daemon gives the requests it is handling (a submit
#: snapshotting a big repository, a cancel waiting for its job) to finish;
#: the rest are answered DaemonStoppingError. With the listener's second
#: and closing the store, a stop stays well within the unit's
#: TimeoutStopSec=20 (systemd/jobsup.service).
STOP_GRACE_S = 10


def sd_notify(message: str) -> bool:
    """Send ``message`` (e.g. ``READY=1``) to systemd's ``$NOTIFY_SOCKET``
    (sd_notify(3)); returns False when not run under systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    target = "\0" + addr[1:] if addr.startswith("@") else addr
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.connect(target)
        s.sendall(message.encode())
    return True


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _prepare_socket(path: Path) -> socket.socket:
    """Create the socket folder (0700) if needed, refuse one others can
    write, refuse a socket another daemon answers on, and bind a fresh socket
    with mode 0600. Raises DaemonError."""
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DaemonError(
            f"socket folder {folder} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod 700 {folder}` or set JOBSUP_SOCKET elsewhere"
        )
    if st.st_uid != os.getuid():
        raise DaemonError(f"socket folder {folder} belongs to uid {st.st_uid}, not to you")
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink()  # stale socket of a daemon that died
        except OSError as err:
            raise DaemonError(f"cannot check existing socket {path}: {err}") from None
        else:
            raise DaemonError(f"another jobsup daemon already answers on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(socket.SOMAXCONN)
    sock.setblocking(False)
    return sock


def _lock_state_dir(state_dir: Path) -> int:
    """Hold ``<state dir>/daemon.lock`` (flock, exclusive) for the daemon's
    life: one daemon per state dir, whatever socket each was given. Returns
    the descriptor (closed by the OS when the daemon exits). Raises DaemonError."""
    path = state_dir / "daemon.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DaemonError(
            f"another jobsup daemon (pid {other}) already uses the state dir {state_dir}; "
            "stop it first, or point JOBSUP_STATE_DIR elsewhere"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class Daemon:
    """One daemon instance. ``run()`` serves until ``stop()`` or a signal."""

    def __init__(self, paths: Paths, daemon_layer: cfg.Layer, hooks: list[HookSpec] | None = None) -> None:
        self.paths = paths
        self.daemon_layer = daemon_layer
        self.hooks = list(hooks or [])
        self.settings: dict[str, Any] = dict(cfg.effective_config(daemon_layer, []).data.get("daemon") or {})
        self._stop = anyio.Event()

    def stop(self) -> None:
        """Ask ``run()`` to shut down."""
        self._stop.set()

    def _ui_server(
        self,
        store: EventStore,
        supervisor: Supervisor,
        scheduler: Scheduler,
        digest_key: bytes,
        streams: StreamCloser,
    ) -> UiServer:
        settings = cfg.effective_config(self.daemon_layer, []).data.get("ui") or {}

        async def rerun(run_id: str) -> RunStatus:
            # The page has no env values to give: the names stay unfilled.
            return (await rerun_run(supervisor, scheduler, digest_key, run_id, {}))[0]

        async def queue() -> dict[str, Any]:
            return scheduler.view()

        return UiServer(
            store=store,
            actions=SupervisorActions(supervisor, store, rerun=rerun, queue=queue),
            state_dir=self.paths.state_dir,
            settings=settings,
            streams=streams,
        )

    def _backends(self) -> dict[str, Backend]:
        # What a backend needs arrives here: the kubeconfig the daemon's
        # environment names (KUBECONFIG, else ~/.kube/config), and the
        # config doctor checks. Backends read no file of the user's home.
        kubeconfig = os.pathsep.join(str(f) for f in cfg.kubeconfig_files())
        return {
            "local": LocalBackend(),
            "kubernetes": KubernetesBackend(kubeconfig=kubeconfig, doctor_config=self._kubernetes_doctor_config),
        }

    def _kubernetes_doctor_config(self) -> Mapping[str, Any]:
        """The ``kubernetes`` section ``doctor`` checks: the daemon's config
        and the user's, with the kubeconfig's current context (blocking:
        reads files). Raises ConfigError."""
        layers = cfg.load_client_layers(task=None, cli_config=[], cwd=Path.home())
        eff = cfg.effective_config(self.daemon_layer, layers, context=cfg.current_kube_context())
        section = eff.data.get("kubernetes") or {}
        return section if isinstance(section, Mapping) else {}

    async def run(self) -> None:
        """Start everything in order (see the module docstring) and serve."""
        # Everything the daemon creates (database, run dirs, snapshots) is
        # private to the user.
        os.umask(0o077)
        self.paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_state_dir(self.paths.state_dir)
        self.paths.runs_dir.mkdir(mode=0o700, exist_ok=True)
        lock_fd = _lock_state_dir(self.paths.state_dir)
        for leftover in remove_snapshot_leftovers(self.paths.snapshots_dir):
            log.info("removed an interrupted snapshot", path=str(leftover))
        try:
            sock = _prepare_socket(self.paths.socket)
        except BaseException:
            os.close(lock_fd)
            raise
        try:
            store = await _open_store(self.paths.database, synchronous=self.settings.get("synchronous", "FULL"))
        except BaseException:
            sock.close()
            self.paths.socket.unlink(missing_ok=True)
            os.close(lock_fd)
            raise
        backends = self._backends()
        try:
            async with anyio.create_task_group() as tg:
                for backend in backends.values():
                    tg.start_soon(backend.serve, name=f"backend-{backend.name}")
                supervisor = Supervisor(store, backends, self.paths, tg)
                supervisor.gated = True  # runs wait in QUEUED for the scheduler
                planner = Planner(self.daemon_layer, supervisor.snapshots, load_digest_key(self.paths.state_dir))
                daemon_config = cfg.effective_config(self.daemon_layer, []).data
                gpus = await anyio.to_thread.run_sync(gpu_inventory, (daemon_config.get("scheduler") or {}).get("gpus"))
                reattached = await supervisor.reattach_all()
                await supervisor.remove_orphan_pending()
                scheduler = Scheduler(store, supervisor, gpus, SchedulerSettings.from_config(daemon_config))
                await scheduler.load()
                tg.start_soon(scheduler.run, name="scheduler")
                hook_service = HookService(store, self.hooks, user_agent=f"jobsup/{_version()}")
                tg.start_soon(hook_service.run, name="hooks")
                retention = Retention(store, self.paths, RetentionSettings.from_config(daemon_config))
                tg.start_soon(retention.run, name="retention")
                info = {
                    "pid": os.getpid(),
                    "uid": os.getuid(),
                    "version": version(),
                    "state_dir": str(self.paths.state_dir),
                    "socket": str(self.paths.socket),
                    "database": str(self.paths.database),
                    "backends": sorted(backends),
                }

                async def doctor() -> list[dict[str, Any]]:
                    checks = [
                        {"name": "daemon", "ok": True, "detail": f"pid {os.getpid()} on {self.paths.socket}"},
                        storage_check(store, await store.last_seq()),
                        await anyio.to_thread.run_sync(
                            output_space_check, self.paths.runs_dir, supervisor.running_local()
                        ),
                    ]
                    checks.append(scheduler.doctor())
                    for backend in backends.values():
                        skip = _doctor_not_applicable(backend.name, self.daemon_layer)
                        if skip is not None:
                            checks.append({"name": backend.name, "ok": True, "detail": f"n/a: {skip}"})
                        else:
                            checks.extend(await backend.doctor())
                    return checks

                # Open streams end cleanly when the daemon stops (not cancelled).
                streams = StreamCloser()
                page = self._ui_server(store, supervisor, scheduler, planner.digest_key, streams)
                tg.start_soon(page.serve, name="ui")

                async def ui(body: dict[str, Any]) -> dict[str, Any]:
                    if body.get("stop"):
                        await page.disable()
                        return {}
                    port = body.get("port")
                    if port is not None and (
                        not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536
                    ):
                        raise UsageError(f"--port {port!r}: use a port number 1..65535")
                    return await page.enable(port)

                app = create_app(
                    supervisor=supervisor,
                    planner=planner,
                    store=store,
                    info=info,
                    doctor=doctor,
                    ui=ui,
                    scheduler=scheduler,
                    hooks=hook_service.status,
                    retention=retention,
                    streams=streams,
                )
                inflight = InFlight(app)
                config = uvicorn.Config(
                    inflight,
                    http=PeerCredProtocol,
                    lifespan="off",
                    log_config=None,
                    access_log=False,
                    # A backstop only: InFlight.drain below ends every request first.
                    timeout_graceful_shutdown=STOP_GRACE_S + 5,
                )
                server = _Server(config)
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

                    async def on_signal() -> None:
                        async for signum in signals:
                            log.info("stopping", signal=signal.Signals(signum).name)
                            self._stop.set()

                    tg.start_soon(on_signal)
                    async with anyio.create_task_group() as api:
                        api.start_soon(server.serve, [sock])
                        with anyio.fail_after(30):
                            while not server.started:
                                await anyio.sleep(0.01)
                        # What start-up allocated lives as long as the daemon: keep
                        # the garbage collector from re-scanning it on every pass.
                        gc.freeze()
                        log.info("ready", socket=str(self.paths.socket), pid=os.getpid(), reattached=reattached)
                        sd_notify("READY=1")
                        await self._stop.wait()
                        sd_notify("STOPPING=1")
                        # uvicorn closes the listener. Once it no longer accepts,
                        # the streams (logs -f, events -f, wait, the page's live
                        # updates) end, cleanly: their clients reconnect to the
                        # next daemon. The other requests get STOP_GRACE_S to
                        # finish; those left are answered DaemonStoppingError.
                        server.should_exit = True
                        page.shutdown()
                        with anyio.move_on_after(1):
                            while any(s.is_serving() for s in getattr(server, "servers", [])):
                                await anyio.sleep(0.01)
                        streams.close_all()
                        cancelled = await inflight.drain(STOP_GRACE_S)
                        if cancelled:
                            log.warning("stop.requests_cancelled", count=cancelled, grace_s=STOP_GRACE_S)
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                for backend in backends.values():
                    await backend.aclose()
                await store.close()
                self.paths.socket.unlink(missing_ok=True)
                os.close(lock_fd)
            log.info("stopped")


def _doctor_not_applicable(backend: str, daemon_layer: cfg.Layer) -> str | None:
    """Why ``doctor`` skips the checks of ``backend`` (shown as n/a, not as
    failures), or None to run them: the daemon config does not allow it,
    or (Kubernetes) there is no kubeconfig to use: no file in
    ``$KUBECONFIG`` / ``~/.kube/config`` and not inside a cluster."""
    allowed = cfg.effective_config(daemon_layer, []).data.get("allowed_backends") or []
    if backend not in allowed:
        return f"the {backend} backend is not allowed (allowed_backends: {', '.join(allowed) or 'none'})"
    if backend == "kubernetes":
        files = cfg.kubeconfig_files()
        if not any(f.is_file() for f in files) and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return "no kubeconfig (" + os.pathsep.join(str(f) for f in files) + ") and not inside a cluster"
    return None


def _version() -> str:
    from supervisord import version

    return version()


async def _open_store(path: Path, *, synchronous: Any) -> EventStore:
    """Open the event store at ``path``: the daemon boundary for store errors.

    Raises DaemonError (with the store's error as ``__cause__``) naming the
    file and what to do when it is not a usable jobsup database."""
    try:
        return await EventStore.open(path, synchronous=synchronous)
    except StoreOpenError as err:
        raise DaemonError(
            f"cannot use the event store: {err}. Move the file aside (the daemon then starts a new, empty"
            f" store there) or set JOBSUP_STATE_DIR to another state dir"
        ) from err
    except StoreError as err:
        raise DaemonError(f"cannot open the event store {path}: {err}") from err


def _load_config_and_hooks(layer: cfg.Layer) -> list[HookSpec]:
    """Validate the daemon config and the hooks of the daemon and user
    configs; raise ConfigError with every error of both at once."""
    errors: list[str] = []
    try:
        cfg.validate_daemon_config(layer)
    except ConfigError as exc:
        errors.extend(exc.errors)
    layers = [layer]
    try:
        layers.append(cfg.load_user_layer())
    except ConfigError as exc:
        errors.extend(exc.errors)
    hooks: list[HookSpec] = []
    try:
        hooks = load_hooks(layers)
    except ConfigError as exc:
        errors.extend(exc.errors)
    if errors:
        summary = (
            errors[0] if len(errors) == 1 else f"{len(errors)} config errors:\n" + "\n".join(f"  - {e}" for e in errors)
        )
        raise ConfigError(summary, errors)
    return hooks


def run_daemon() -> None:
    """``jobsup daemon``: validate the daemon config (exit 2 with every
    error), configure logging, and serve until SIGTERM/SIGINT (exit 1 when
    the daemon cannot start)."""
    try:
        layer = cfg.load_daemon_layer()
        hooks = _load_config_and_hooks(layer)
    except JobsupError as err:
        click.echo(f"error: jobsup daemon: {err}", err=True)
        for line in getattr(err, "errors", [])[1:] if len(getattr(err, "errors", [])) > 1 else []:
            click.echo(f"  {line}", err=True)
        sys.exit(2)
    data = cfg.effective_config(layer, []).data
    settings = data.get("daemon") or {}
    configure_logging(str(settings.get("log_level") or "info"))
    for message in not_implemented_warnings(data):
        log.warning("config key not implemented", detail=message)
    paths = Paths.from_env()
    # Before the event loop and its threads allocate (see supervisord.malloc).
    log.info("malloc.tuned" if tune_malloc() else "malloc.default")
    try:
        anyio.run(Daemon(paths, layer, hooks).run, backend="asyncio")
    except (JobsupError, StoreError, OSError) as err:
        # One clear line, then exit 1 (never a traceback, never a hang). The
        # log may be on the full disk: the CLI that autostarted us names it too.
        text = f"{err}{disk_full_hint(paths.state_dir)}"
        log.error("cannot start", error=text)
        try:
            click.echo(f"error: jobsup daemon: {text}", err=True)
        except OSError:
            pass
        sys.exit(1)
