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
import dataclasses
import fcntl
import gc
import os
import shutil
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import click
import structlog
from starlette.applications import Starlette

from store import EventStore
from store.errors import StoreError, StoreOpenError
from supervisord import version
from supervisord.daemon.api.inflight import InFlight
from supervisord.daemon.api.server import create_app
from supervisord.daemon.api.streams import StreamCloser
from supervisord.daemon.api.uvicorn_server import Config, PeerCredProtocol, Server
from supervisord.daemon.backends.base import Backend
from supervisord.daemon.backends.kubernetes import KubernetesBackend
from supervisord.daemon.backends.local import LocalBackend
from supervisord.daemon.backends.slurm import SlurmBackend
from supervisord.daemon.commands import Commands
from supervisord.daemon.health import disk_full_hint, output_space_check, storage_check
from supervisord.daemon.hooks.delivery import HookService
from supervisord.daemon.malloc import tune_malloc
from supervisord.daemon.outputs.recorder import OutputsRecorder
from supervisord.daemon.retention import Retention, RetentionSettings
from supervisord.daemon.scheduler.driver import Scheduler, SchedulerSettings, with_capacity
from supervisord.daemon.scheduler.gpus import Inventory
from supervisord.daemon.scheduler.gpus import inventory as gpu_inventory
from supervisord.daemon.scope import probe as probe_scopes
from supervisord.daemon.submit import Planner
from supervisord.daemon.supervisor import Supervisor
from supervisord.daemon.ui import UiServer
from supervisord.daemon.ui.actions import CommandActions
from supervisord.daemon.ui.server import check_ui_settings
from supervisord.daemon.usage.sampler import UsageSampler, usage_sampler
from supervisord.shared import config as cfg
from supervisord.shared.config.sources import config_file_path
from supervisord.shared.config.unimplemented import not_implemented_warnings
from supervisord.shared.events import CONFIG_RELOADED, ConfigReloadedData
from supervisord.shared.exceptions import ConfigError, DaemonError, JobsupError, UsageError
from supervisord.shared.hooksconfig import HookSpec, load_hooks
from supervisord.shared.logging import configure_logging
from supervisord.shared.ownership import check_state_dir, remove_snapshot_leftovers
from supervisord.shared.paths import Paths
from supervisord.shared.secret import load_digest_key

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

    def __init__(
        self,
        paths: Paths,
        daemon_layer: cfg.Layer,
        hooks: list[HookSpec] | None = None,
        gpus: Inventory | None = None,
    ) -> None:
        self.paths = paths
        self.daemon_layer = daemon_layer
        self.hooks = list(hooks or [])
        #: The GPUs (None: found by ``run()`` before it starts anything).
        self.gpus = gpus
        self.settings: dict[str, Any] = dict(cfg.effective_config(daemon_layer, []).data.get("daemon") or {})
        self._stop = anyio.Event()
        #: The process's exit code once ``run()`` returns: 75 when a
        #: ``daemon restart`` asked a daemon under systemd to stop, so that
        #: systemd (Restart=on-failure) starts it again.
        self.exit_code = 0
        self.under_systemd = bool(os.environ.get("NOTIFY_SOCKET"))
        self.config_files = ConfigFiles.now()

    def stop(self) -> None:
        """Ask ``run()`` to shut down."""
        self._stop.set()

    def _ui_server(
        self, store: EventStore, commands: Commands, scheduler: Scheduler, streams: StreamCloser
    ) -> UiServer:
        settings = cfg.effective_config(self.daemon_layer, []).data.get("ui") or {}
        return UiServer(
            store=store,
            actions=CommandActions(commands, queue=scheduler.view),
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
            "slurm": SlurmBackend(ssh_options=_ssh_options(), doctor_config=self._slurm_doctor_config),
        }

    def _slurm_doctor_config(self) -> Mapping[str, Any]:
        """The ``slurm`` section ``doctor`` checks: the daemon's config and
        the user's (blocking: reads files). Raises ConfigError."""
        layers = cfg.load_client_layers(task=None, cli_config=[], cwd=Path.home())
        section = cfg.effective_config(self.daemon_layer, layers).data.get("slurm") or {}
        return section if isinstance(section, Mapping) else {}

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
        daemon_config = cfg.effective_config(self.daemon_layer, []).data
        # What can fail on the config fails here, before anything starts:
        # an error raised in the task group below would reach run_daemon
        # inside an ExceptionGroup, after the backends started.
        gpus = self.gpus
        if gpus is None:
            gpus = await anyio.to_thread.run_sync(gpu_inventory, (daemon_config.get("scheduler") or {}).get("gpus"))
        scheduler_settings = SchedulerSettings.from_config(daemon_config)
        retention_settings = RetentionSettings.from_config(daemon_config)
        held = await self._acquire()
        try:
            async with anyio.create_task_group() as tg:
                running = await _Running.start(
                    self, tg, held, daemon_config, gpus, scheduler_settings, retention_settings
                )
                await self._serve(tg, running, held.sock)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await held.release(self.paths)
            log.info("stopped")

    def _lock(self) -> int:
        """Create the state and runs dirs, lock the state dir (returns the
        lock's file descriptor) and remove interrupted snapshots."""
        self.paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_state_dir(self.paths.state_dir)
        self.paths.runs_dir.mkdir(mode=0o700, exist_ok=True)
        lock_fd = _lock_state_dir(self.paths.state_dir)
        for leftover in remove_snapshot_leftovers(self.paths.snapshots_dir):
            log.info("removed an interrupted snapshot", path=str(leftover))
        return lock_fd

    async def _acquire(self) -> _Held:
        """Take what the daemon holds while it runs, in order: the state
        dir's lock, the socket, the store, the digest key and the backends.
        When one step fails, what the earlier ones took is released and the
        error raised."""
        lock_fd = self._lock()
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
        try:
            digest_key = load_digest_key(self.paths.state_dir)
            backends = self._backends()
        except BaseException:
            await store.close()
            sock.close()
            self.paths.socket.unlink(missing_ok=True)
            os.close(lock_fd)
            raise
        return _Held(lock_fd=lock_fd, sock=sock, store=store, digest_key=digest_key, backends=backends)

    async def _serve(self, tg: anyio.abc.TaskGroup, running: _Running, sock: socket.socket) -> None:
        """Serve the API on ``sock`` until ``stop()`` or SIGTERM/SIGINT, then
        end the requests in flight (see :func:`_stop_serving`)."""
        inflight = InFlight(running.create_app())
        config = Config(
            inflight,
            http=PeerCredProtocol,
            lifespan="off",
            log_config=None,
            access_log=False,
            # A backstop only: InFlight.drain below ends every request first.
            timeout_graceful_shutdown=STOP_GRACE_S + 5,
        )
        server = Server(config)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            tg.start_soon(self._stop_on_signals, signals)
            async with anyio.create_task_group() as api:
                api.start_soon(server.serve, [sock])
                with anyio.fail_after(30):
                    await server.ready.wait()
                # What start-up allocated lives as long as the daemon: keep
                # the garbage collector from re-scanning it on every pass.
                gc.freeze()
                log.info("ready", socket=str(self.paths.socket), pid=os.getpid(), reattached=running.reattached)
                sd_notify("READY=1")
                await self._stop.wait()
                sd_notify("STOPPING=1")
                await _stop_serving(server, running, inflight)

    async def _stop_on_signals(self, signals: AsyncIterator[signal.Signals]) -> None:
        async for signum in signals:
            log.info("stopping", signal=signal.Signals(signum).name)
            self._stop.set()


async def _stop_serving(server: Server, running: _Running, inflight: InFlight) -> None:
    """uvicorn closes the listener. Once it no longer accepts, the streams
    (logs -f, events -f, wait, the page's live updates) end, cleanly: their
    clients reconnect to the next daemon. The other requests get
    STOP_GRACE_S to finish; those left are answered DaemonStoppingError."""
    server.stop_listening()
    running.page.shutdown()
    running.streams.close_all()
    cancelled = await inflight.drain(STOP_GRACE_S)
    if cancelled:
        log.warning("stop.requests_cancelled", count=cancelled, grace_s=STOP_GRACE_S)


@dataclasses.dataclass(eq=False)
class _Held:
    """What a running daemon holds, released by :meth:`release` when it stops."""

    lock_fd: int
    sock: socket.socket
    store: EventStore
    digest_key: bytes
    backends: dict[str, Backend]

    async def release(self, paths: Paths) -> None:
        """Close the backends and the store, remove the socket file and
        unlock the state dir (in that order)."""
        for backend in self.backends.values():
            await backend.aclose()
        await self.store.close()
        paths.socket.unlink(missing_ok=True)
        os.close(self.lock_fd)


@dataclasses.dataclass(eq=False)
class _Running:
    """The parts a serving daemon started, and the handlers of the API's
    daemon-level requests (doctor, reload, stop, ui, hooks) that act on
    them. ``reload`` replaces the hook service and the two scopes."""

    daemon: Daemon
    tg: anyio.abc.TaskGroup
    store: EventStore
    backends: dict[str, Backend]
    supervisor: Supervisor
    planner: Planner
    reattached: int
    sampler: UsageSampler
    scheduler: Scheduler
    hook_service: HookService
    hook_scope: anyio.CancelScope
    retention: Retention
    retention_scope: anyio.CancelScope
    #: Open streams end cleanly when the daemon stops (not cancelled).
    streams: StreamCloser
    #: The one command path of the API and the page.
    commands: Commands
    page: UiServer

    @classmethod
    async def start(
        cls,
        daemon: Daemon,
        tg: anyio.abc.TaskGroup,
        held: _Held,
        daemon_config: Mapping[str, Any],
        gpus: Inventory,
        scheduler_settings: SchedulerSettings,
        retention_settings: RetentionSettings,
    ) -> _Running:
        """Start the backends, reattach to the runs, then start the
        scheduler, the usage sampler, hooks, retention, the outputs
        recorder and the page, in ``tg``."""
        store, backends = held.store, held.backends
        for backend in backends.values():
            tg.start_soon(backend.serve, name=f"backend-{backend.name}")
        supervisor = Supervisor(store, backends, daemon.paths, tg)
        supervisor.gated = True  # runs wait in QUEUED for the scheduler
        planner = Planner(daemon.daemon_layer, supervisor.snapshots, held.digest_key)
        reattached = await supervisor.reattach_all()
        await supervisor.remove_orphan_pending()
        sampler = await _usage_sampler(store, supervisor, backends, daemon_config, gpus)
        settings = with_capacity(scheduler_settings, daemon_config, enforcement=sampler.enforcement)
        scheduler = Scheduler(store, supervisor, gpus, settings)
        scheduler.gpu_notes = sampler.foreign_gpu_notes
        scheduler.gpu_usage = sampler.gpu_usage
        await scheduler.load()
        tg.start_soon(scheduler.run, name="scheduler")
        tg.start_soon(sampler.run, name="usage")
        hook_service = HookService(store, daemon.hooks, user_agent=f"jobsup/{_version()}")
        hook_scope = await tg.start(_in_scope, hook_service.run, name="hooks")
        retention = Retention(store, daemon.paths, retention_settings)
        retention_scope = await tg.start(_in_scope, retention.run, name="retention")
        tg.start_soon(OutputsRecorder(store).run, name="outputs")
        streams = StreamCloser()
        commands = Commands(supervisor, planner, scheduler)
        page = daemon._ui_server(store, commands, scheduler, streams)
        tg.start_soon(page.serve, name="ui")
        return cls(
            daemon=daemon,
            tg=tg,
            store=store,
            backends=backends,
            supervisor=supervisor,
            planner=planner,
            reattached=reattached,
            sampler=sampler,
            scheduler=scheduler,
            hook_service=hook_service,
            hook_scope=hook_scope,
            retention=retention,
            retention_scope=retention_scope,
            streams=streams,
            commands=commands,
            page=page,
        )

    def create_app(self) -> Starlette:
        """The API application over the started parts and these handlers."""
        daemon = self.daemon
        info = {
            "pid": os.getpid(),
            "uid": os.getuid(),
            "version": version(),
            "state_dir": str(daemon.paths.state_dir),
            "socket": str(daemon.paths.socket),
            "database": str(daemon.paths.database),
            "backends": sorted(self.backends),
        }
        return create_app(
            supervisor=self.supervisor,
            planner=self.planner,
            store=self.store,
            info=info,
            doctor=self.doctor,
            ui=self.ui,
            scheduler=self.scheduler,
            hooks=self.hooks_status,
            config_changed=self.config_changed,
            daemon_control=self.control,
            retention=self.retention,
            streams=self.streams,
            usage=self.sampler.snapshot,
            commands=self.commands,
        )

    def config_changed(self) -> list[str]:
        """The config files changed since the daemon read them (looked up
        late: a reload replaces ``daemon.config_files``)."""
        return self.daemon.config_files.changed()

    async def hooks_status(self) -> list[dict[str, Any]]:
        """The hooks' delivery status (of the current hook service)."""
        return await self.hook_service.status()

    async def reload(self) -> dict[str, Any]:
        """Read the config again and apply it: hooks and retention restart
        when theirs changed; the scheduler takes its new settings. Raises
        ConfigError (nothing changed)."""
        daemon = self.daemon
        layer, hooks = await anyio.to_thread.run_sync(_reload_config)  # ConfigError: nothing changed
        old = cfg.effective_config(daemon.daemon_layer, []).data
        new = cfg.effective_config(layer, []).data
        report = config_changes(old, new, daemon.hooks, hooks)
        # The capacity --memory/--cpus claims come out of, as at start (ConfigError: nothing changed).
        scheduler_settings = with_capacity(
            SchedulerSettings.from_config(new), new, enforcement=self.scheduler.settings.enforcement
        )
        daemon.daemon_layer = self.planner.daemon_layer = layer
        daemon.config_files = ConfigFiles.now()
        if any(report["hooks"].values()):
            # Each hook resumes from its stored checkpoint.
            self.hook_scope.cancel()
            daemon.hooks = hooks
            self.hook_service = HookService(self.store, hooks, user_agent=f"jobsup/{_version()}")
            self.hook_scope = await self.tg.start(_in_scope, self.hook_service.run, name="hooks")
        new_retention = RetentionSettings.from_config(new)
        if new_retention != self.retention.settings:
            self.retention_scope.cancel()
            self.retention.settings = new_retention
            self.retention_scope = await self.tg.start(_in_scope, self.retention.run, name="retention")
        self.scheduler.settings = scheduler_settings
        await self.scheduler.record_daemon_event(CONFIG_RELOADED(report))
        log.info("config reloaded", changed=report["changed"], hooks=report["hooks"])
        return dict(report)

    async def control(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """``daemon stop`` (``restart``: exit 75 under systemd) or ``reload``.
        Raises UsageError for another action."""
        daemon = self.daemon
        if action == "reload":
            return await self.reload()
        if action != "stop":
            raise UsageError(f"daemon: unknown action {action!r} (use stop or reload)")
        if body.get("restart") and daemon.under_systemd:
            daemon.exit_code = 75  # Restart=on-failure starts it again
        log.info("stopping", requested="restart" if body.get("restart") else "stop")
        self.tg.start_soon(self._stop_later)
        return {"pid": os.getpid(), "supervised": self.supervisor.supervised(), "systemd": daemon.under_systemd}

    async def _stop_later(self) -> None:
        await anyio.sleep(0.05)  # after the answer went out
        self.daemon.stop()

    async def doctor(self) -> list[dict[str, Any]]:
        """The daemon's checks, then each backend's (n/a when not used)."""
        daemon = self.daemon
        checks = [
            {"name": "daemon", "ok": True, "detail": f"pid {os.getpid()} on {daemon.paths.socket}"},
            storage_check(self.store, await self.store.last_seq()),
            await anyio.to_thread.run_sync(output_space_check, daemon.paths.runs_dir, self.supervisor.running_local()),
        ]
        stale = daemon.config_files.changed()
        checks.append(
            {
                "name": "config",
                "ok": True,
                "detail": "warning: " + "; ".join(stale) if stale else "as the daemon read it",
            }
        )
        checks.append(self.scheduler.doctor())
        checks.append(self.sampler.doctor())
        for backend in self.backends.values():
            skip = _doctor_not_applicable(backend.name, daemon.daemon_layer)
            if skip is not None:
                checks.append({"name": backend.name, "ok": True, "detail": f"n/a: {skip}"})
            else:
                checks.extend(await backend.doctor())
        return checks

    async def ui(self, body: dict[str, Any]) -> dict[str, Any]:
        """Turn the page off (``stop``) or on (on ``port``, if given).
        Raises UsageError for a port out of 1..65535."""
        if body.get("stop"):
            await self.page.disable()
            return {}
        port = body.get("port")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
            raise UsageError(f"--port {port!r}: use a port number 1..65535")
        return await self.page.enable(port)


async def _usage_sampler(
    store: EventStore,
    supervisor: Supervisor,
    backends: Mapping[str, Backend],
    daemon_config: Mapping[str, Any],
    gpus: Inventory,
) -> UsageSampler:
    """The usage sampler: limits are enforced in systemd scopes when a user
    manager answers (the local backend then starts runs with systemd-run),
    else by the sampler."""
    found = await anyio.to_thread.run_sync(probe_scopes)
    local_backend = backends.get("local")
    if isinstance(local_backend, LocalBackend):
        local_backend.systemd_run = found.systemd_run
    log.info("limits enforcement", enforcement=found.enforcement, detail=found.detail)
    return usage_sampler(
        store,
        supervisor,
        daemon_config,
        gpus,
        enforcement=found.enforcement,
        enforcement_detail=found.detail,
    )


def _doctor_not_applicable(backend: str, daemon_layer: cfg.Layer) -> str | None:
    """Why ``doctor`` skips the checks of ``backend`` (shown as n/a, not as
    failures), or None to run them: the daemon config does not allow it,
    or (Kubernetes) there is no kubeconfig to use: no file in
    ``$KUBECONFIG`` / ``~/.kube/config`` and not inside a cluster."""
    allowed = cfg.effective_config(daemon_layer, []).data.get("allowed_backends") or []
    if backend not in allowed:
        return f"the {backend} backend is not allowed (allowed_backends: {', '.join(allowed) or 'none'})"
    if backend == "slurm":
        layers = [daemon_layer]
        with contextlib.suppress(ConfigError):
            layers.append(cfg.load_user_layer())
        host = (cfg.effective_config(daemon_layer, layers[1:]).data.get("slurm") or {}).get("host")
        if not host and shutil.which("sbatch") is None:
            return "no slurm.host and no sbatch on this machine"
    if backend == "kubernetes":
        files = cfg.kubeconfig_files()
        if not any(f.is_file() for f in files) and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return "no kubeconfig (" + os.pathsep.join(str(f) for f in files) + ") and not inside a cluster"
    return None


def _ssh_options() -> list[str]:
    """Extra ``ssh`` options of the Slurm backend: ``-F $JOBSUP_SSH_CONFIG``
    when that names an ssh config file (else ssh reads the user's own)."""
    path = os.environ.get("JOBSUP_SSH_CONFIG")
    return ["-F", path] if path else []


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


def _load_config_and_hooks(layer: cfg.Layer) -> tuple[list[HookSpec], Inventory]:
    """Validate the daemon config (its ``ui`` section included), the hooks of
    the daemon and user configs and, once these are valid, the configured
    GPUs against the machine's (``scheduler.gpus``; blocks up to 15 s on
    ``nvidia-smi``). Returns ``(hooks, gpus)``; raises ConfigError with every
    error found at once."""
    errors: list[str] = []
    try:
        cfg.validate_daemon_config(layer)
    except ConfigError as exc:
        errors.extend(exc.errors)
    data = cfg.effective_config(layer, []).data
    try:
        check_ui_settings(data.get("ui") or {})
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
    gpus = Inventory(())
    if not errors:
        try:
            gpus = gpu_inventory((data.get("scheduler") or {}).get("gpus"))
        except ConfigError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigError.of(errors)
    return hooks, gpus


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The exceptions of ``group``, nested groups flattened, in order."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def run_daemon() -> None:
    """``jobsup daemon``: validate the daemon config (exit 2 with every
    error), configure logging, and serve until SIGTERM/SIGINT (exit 1 with
    one ``error:`` line when the daemon cannot start)."""
    try:
        layer = cfg.load_daemon_layer()
        hooks, gpus = _load_config_and_hooks(layer)
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
    # Before the event loop and its threads allocate (see supervisord.daemon.malloc).
    log.info("malloc.tuned" if tune_malloc() else "malloc.default")
    daemon = Daemon(paths, layer, hooks, gpus)
    try:
        anyio.run(daemon.run, backend="asyncio")
    except* (JobsupError, StoreError, OSError) as group:
        # One clear line, then exit 1 (never a traceback, never a hang),
        # whether the error came alone or from the daemon's task group. The
        # log may be on the full disk: the CLI that autostarted us names it too.
        text = "; ".join(dict.fromkeys(str(e) for e in _leaves(group))) + disk_full_hint(paths.state_dir)
        log.error("cannot start", error=text)
        with contextlib.suppress(OSError):
            click.echo(f"error: jobsup daemon: {text}", err=True)
        sys.exit(1)
    if daemon.exit_code:
        sys.exit(daemon.exit_code)


async def _in_scope(
    fn: Callable[[], Awaitable[None]],
    *,
    task_status: anyio.abc.TaskStatus[anyio.CancelScope] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``fn`` in a cancel scope of its own, handed to the starter (to
    stop it alone: a config reload restarts the hooks and retention)."""
    with anyio.CancelScope() as scope:
        task_status.started(scope)
        await fn()


def _reload_config() -> tuple[cfg.Layer, list[HookSpec]]:
    """Read and check the daemon config and the user config's hooks again
    (blocking: reads files). Raises ConfigError with every error."""
    layer = cfg.load_daemon_layer()
    hooks, _gpus = _load_config_and_hooks(layer)  # the GPUs are checked; a change needs a restart
    return layer, hooks


class ConfigFiles:
    """What the daemon and user config files were when the daemon read
    them (path -> (size, mtime_ns) or None when absent), to tell when they
    changed since (``jobsup hooks``, ``doctor``)."""

    def __init__(self, seen: dict[str, tuple[int, int] | None]) -> None:
        self.seen = seen

    @staticmethod
    def _stat(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns)

    @classmethod
    def now(cls) -> ConfigFiles:
        """The files as they are now."""
        seen: dict[str, tuple[int, int] | None] = {}
        for name in ("daemon", "user"):
            try:
                path, _ = config_file_path(name, cwd=None, env=os.environ)
            except (ConfigError, OSError):
                continue
            seen[str(path)] = cls._stat(path)
        return cls(seen)

    def changed(self) -> list[str]:
        """One message per file that changed since it was read."""
        out = []
        for path, before in self.seen.items():
            after = self._stat(Path(path))
            if after != before:
                what = "was created" if before is None else "was removed" if after is None else "changed"
                out.append(f"{path} {what} since the daemon read it; `jobsup daemon reload` applies it")
        return out


#: Config keys a reload records but that take effect only at the next start.
_RESTART_KEYS = ("daemon.synchronous", "daemon.log_level", "scheduler.gpus")


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], old_hooks: list[HookSpec], new_hooks: list[HookSpec]
) -> ConfigReloadedData:
    """The ConfigReloaded data for going from the effective daemon config
    ``old`` to ``new`` and hooks ``old_hooks`` to ``new_hooks``:
    ``{"changed": [dotted keys, two levels deep], "hooks": {"added",
    "removed", "changed": [hook names]}, "restart_needed": [keys]}``. Keys
    only, never values (a config may hold secrets)."""

    def flat(doc: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in doc.items():
            if key == "hooks":
                continue
            if isinstance(value, Mapping) and value:
                for sub, v in value.items():
                    out[f"{key}.{sub}"] = v
            else:
                out[str(key)] = value
        return out

    a, b = flat(old), flat(new)
    changed = sorted(k for k in {*a, *b} if a.get(k) != b.get(k))
    before = {h.name: h for h in old_hooks}
    after = {h.name: h for h in new_hooks}
    hooks = {
        "added": sorted(set(after) - set(before)),
        "removed": sorted(set(before) - set(after)),
        "changed": sorted(n for n in set(before) & set(after) if before[n] != after[n]),
    }
    restart = [k for k in changed if k in _RESTART_KEYS]
    return {"changed": changed, "hooks": hooks, "restart_needed": restart}
