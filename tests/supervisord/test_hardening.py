"""Security and input hardening: the real daemon and the real CLI as processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(180)

NOBODY = 65534
_SYSTEM_PYTHON = "/usr/bin/python3"
needs_root = pytest.mark.skipif(
    os.getuid() != 0 or not os.access(_SYSTEM_PYTHON, os.X_OK),
    reason="needs root (and /usr/bin/python3) to act as another user",
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"job.sh": "echo hello\n"})


# -- helpers -------------------------------------------------------------------

_LISTENER = r"""
import os, socket, sys
path, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(8)
print("ready", flush=True)
s.settimeout(30)
got = b""
try:
    while True:
        c, _ = s.accept()
        c.settimeout(2)
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                got += data
                with open(out, "wb") as f:
                    f.write(got)
        except OSError:
            pass
        c.close()
except OSError:
    pass
"""


class _ForeignListener:
    """A process running as another user (``nobody``) listening on a Unix
    socket at ``bind_path`` and writing every byte it receives to ``out``."""

    def __init__(self, bind_path: Path, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            # The system Python: the test's own may live where nobody can read.
            [_SYSTEM_PYTHON, "-I", "-c", _LISTENER, str(bind_path), str(out)],
            user=NOBODY,
            cwd="/",
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def received(self) -> bytes:
        return self.out.read_bytes() if self.out.exists() else b""

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def _nobody_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="js-nobody-", dir="/tmp"))
    os.chown(d, NOBODY, NOBODY)
    return d


# -- the client checks who it talks to --------------------------


@needs_root
def test_client_refuses_socket_folder_of_another_user(js: JobsupEnv, repo: Path) -> None:
    foreign = _nobody_dir()
    sock = foreign / "jobsup.sock"
    listener = _ForeignListener(sock, foreign / "got")
    try:
        r = js.cli(
            "submit",
            "--env",
            "TOKEN=s3cr3t-value",
            "--",
            "bash",
            "job.sh",
            cwd=repo,
            check=False,
            extra_env={"JOBSUP_SOCKET": str(sock)},
        )
        assert r.returncode != 0
        assert f"socket folder {foreign}" in r.stderr and "belongs to uid 65534" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        time.sleep(0.3)
        assert listener.received() == b""
    finally:
        listener.close()
        subprocess.run(["rm", "-rf", str(foreign)], check=False)


@needs_root
def test_client_refuses_peer_of_another_uid(js: JobsupEnv, repo: Path) -> None:
    # The socket folder is ours and private, but the process listening on the
    # socket in it runs as another user (bound elsewhere, moved in).
    foreign = _nobody_dir()
    listener = _ForeignListener(foreign / "jobsup.sock", foreign / "got")
    try:
        os.rename(foreign / "jobsup.sock", js.socket)
        r = js.cli("submit", "--env", "TOKEN=s3cr3t-value", "--", "bash", "job.sh", cwd=repo, check=False)
        assert r.returncode != 0
        assert "runs as uid 65534, not as you" in r.stderr, r.stderr
        time.sleep(0.3)
        assert listener.received() == b""
    finally:
        listener.close()
        subprocess.run(["rm", "-rf", str(foreign)], check=False)


# -- the state dir, file modes, the snapshot digest -------------


def _daemon(js: JobsupEnv) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"],
        env=js.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_daemon_refuses_state_dir_writable_by_others(js: JobsupEnv) -> None:
    js.state_dir.mkdir(mode=0o700)
    os.chmod(js.state_dir, 0o777)
    r = _daemon(js)
    assert r.returncode == 1, r.stderr
    assert f"state dir {js.state_dir} is writable by other users" in r.stderr
    assert not js.socket.exists()


@needs_root
def test_daemon_refuses_snapshot_folder_of_another_user(js: JobsupEnv) -> None:
    js.start_daemon()
    js.stop_daemon()
    planted = js.state_dir / "snapshots" / "ab"
    planted.mkdir(parents=True)
    os.chown(planted, NOBODY, NOBODY)
    r = _daemon(js)
    assert r.returncode == 1, r.stderr
    assert f"{planted} (in the state dir" in r.stderr and "belongs to uid 65534" in r.stderr, r.stderr


def test_daemon_refuses_run_folder_writable_by_others(js: JobsupEnv) -> None:
    js.start_daemon()
    js.stop_daemon()
    run_dir = js.state_dir / "runs" / "0123456789ab"
    run_dir.mkdir()
    os.chmod(run_dir, 0o733)
    r = _daemon(js)
    assert r.returncode == 1 and f"{run_dir} (in the state dir" in r.stderr, r.stderr


def test_state_tree_is_private_and_daemon_log_0600(js: JobsupEnv, repo: Path) -> None:
    # An older jobsup left the daemon log readable by others: fixed on autostart.
    js.state_dir.mkdir(mode=0o700)
    (js.state_dir / "daemon.log").write_text("old\n")
    os.chmod(js.state_dir / "daemon.log", 0o644)
    env = {k: v for k, v in js.env.items() if k != "JOBSUP_NO_AUTOSTART"}
    old = os.umask(0o022)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "supervisord", "submit", "--", "bash", "job.sh"],
            env=env,
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    pid = int((js.state_dir / "daemon.lock").read_text().strip())
    try:
        js.cli("wait", r.stdout.strip())
        for path in [js.state_dir, *js.state_dir.rglob("*")]:
            if "repo" in path.relative_to(js.state_dir).parts:
                continue  # the job's own files, inside its private run folder
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode & 0o077 == 0, f"{path} has mode {mode:o}"
    finally:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while js.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def test_runner_refuses_a_snapshot_changed_after_submit(tmp_path: Path) -> None:
    # The runner, as the local backend starts it: the snapshot's bytes no
    # longer match the digest recorded at submit.
    src = make_repo(tmp_path / "src", {"job.sh": "echo ran > ../ran.txt\n"})
    tar = tmp_path / "snap.tar"
    subprocess.run(["git", "-C", str(src), "archive", "--format=tar", "-o", str(tar), "HEAD"], check=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    status_path = tmp_path / "status"
    spec = {
        "command": "bash job.sh",
        "env": {},
        "timeout_s": 60,
        "kill_grace_s": 1,
        "shell": "bash",
        "snapshot": str(tar),
        "snapshot_sha256": "0" * 64,
        "run_id": "0123456789ab",
        "status_path": str(status_path),
        "status_key": "00" * 32,
    }
    subprocess.run(
        [sys.executable, "-m", "supervisord.daemon.backends.local.runner", str(run_dir)],
        input=json.dumps(spec).encode(),
        check=True,
        timeout=30,
    )
    deadline = time.monotonic() + 30
    status: dict[str, object] = {}
    while time.monotonic() < deadline:
        try:
            status = json.loads(status_path.read_bytes().split(b"\n", 1)[0])
        except (FileNotFoundError, ValueError):
            status = {}
        if status.get("state") == "exited":
            break
        time.sleep(0.05)
    assert status.get("reason") == "StagingFailed", status
    assert "0" * 64 in str(status.get("message")), status
    assert not (run_dir / "ran.txt").exists()


# -- --env without '=' -------------------------------------------


def test_env_without_equals_is_not_echoed(js: JobsupEnv, repo: Path) -> None:
    r = js.cli("submit", "--env", "A=1", "--env", "s3cr3t-token-value", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2
    assert "--env" in r.stderr and "argument 2" in r.stderr
    assert "s3cr3t" not in r.stderr + r.stdout


# -- wait --for PHASE exit codes -----------------------------------


def test_wait_for_a_terminal_phase_exits_0_only_when_reached(live: JobsupEnv, repo: Path) -> None:
    ok = live.submit(repo, "--name", "ok", "--", "true")
    bad = live.submit(repo, "--name", "bad", "--", "exit 7")
    live.cli("wait", ok, bad, check=False)
    assert live.cli("wait", ok, "--for", "COMPLETED").returncode == 0
    assert live.cli("wait", bad, "--for", "ERROR").returncode == 0
    # Asked-for phase not reached: the code of the phase the run ended in...
    assert live.cli("wait", bad, "--for", "CANCELED", check=False).returncode == 1
    assert live.cli("wait", bad, "--for", "COMPLETED", check=False).returncode == 1
    # ...and for a run that COMPLETED (code 0 in the table) while another
    # terminal phase was asked for: 5.
    assert live.cli("wait", ok, "--for", "ERROR", check=False).returncode == 5
    assert live.cli("wait", ok, bad, "--for", "ERROR", check=False).returncode == 5
    assert live.cli("wait", bad, ok, "--for", "ERROR", check=False).returncode == 5
    # A non-terminal phase passed on the way to COMPLETED is reached.
    assert live.cli("wait", ok, "--for", "RUNNING").returncode == 0


# -- cancel resolves every id first --------------------------------


def test_cancel_with_a_bad_id_cancels_nothing(live: JobsupEnv, repo: Path) -> None:
    a = live.submit(repo, "--name", "a", "--", "sleep 300")
    b = live.submit(repo, "--name", "b", "--", "sleep 300")
    r = live.cli("cancel", a, "ffff0000", b, check=False)
    assert r.returncode == 2, r.stderr
    assert "ffff0000" in r.stderr and "nothing was done" in r.stderr
    runs = {x["id"]: x for x in json.loads(live.cli("runs", "-o", "json").stdout)}
    assert runs[a]["phase"] not in ("CANCELED",) and runs[b]["phase"] not in ("CANCELED",)
    events = [json.loads(x) for x in live.cli("events", "-o", "json").stdout.splitlines()]
    assert not [e for e in events if e["type"] == "CancelRequested"]
    live.cli("cancel", a, b)


@pytest.mark.parametrize("action", ["hold", "release"])
def test_hold_and_release_with_a_bad_id_do_nothing(live: JobsupEnv, repo: Path, action: str) -> None:
    """``jobsup hold A BAD`` resolves every id (and checks each run is
    QUEUED) before it touches any: one line naming each bad one, exit 2,
    no Held / HoldReleased recorded for A."""
    done = live.submit(repo, "--name", "done", "--", "true")
    live.cli("wait", done)
    blocker = live.submit(repo, "--name", "blocker", "--", "sleep 300")
    # QUEUED until the blocker ends; held too for release.
    hold = ["--hold"] if action == "release" else []
    a = live.submit(repo, "--name", "a", "--after", blocker, *hold, "--", "true")
    b = live.submit(repo, "--name", "b", "--after", blocker, *hold, "--", "true")

    def events_of_a_and_b() -> list[str]:
        return [line for run in (a, b) for line in live.cli("events", run, "-o", "json").stdout.splitlines()]

    before = events_of_a_and_b()
    for args in ([a, "ffff0000"], [a, b, "ffff0000"], [a, done], [a, "ffff0000", done]):
        r = live.cli(action, *args, check=False)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), (args, r.stderr)
        assert r.stderr.rstrip().endswith("nothing was done"), r.stderr
        if "ffff0000" in args:
            assert "ffff0000" in r.stderr, r.stderr
        if done in args:
            assert f"run {done} is COMPLETED: only a queued run can be" in r.stderr, r.stderr
    assert events_of_a_and_b() == before
    live.cli("cancel", a, b, blocker)


# -- logs -f --tail N resumes after a reconnect --------------------


def test_logs_follow_tail_resumes_from_the_line_reached(live: JobsupEnv, tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    repo = make_repo(
        tmp_path / "tailrepo",
        {
            "job.sh": (
                "echo early-1\necho early-2\n"
                f"while [ ! -e {flags}/go ]; do sleep 0.05; done\n"
                "echo during-1\necho during-2\n"
                f"while [ ! -e {flags}/end ]; do sleep 0.05; done\n"
                "echo after-1\n"
            )
        },
    )
    run = live.submit(repo, "--", "bash job.sh")
    deadline = time.monotonic() + 60
    while "early-2" not in live.cli("logs", run).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    env = {**live.env, "JOBSUP_NO_AUTOSTART": "1"}
    # --tail 0: no line reaches the follower before the daemon goes away.
    follower = subprocess.Popen(
        [sys.executable, "-m", "supervisord", "logs", "-f", "--tail", "0", run],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_connected(follower.pid)
        time.sleep(1.0)  # past the connection check: the log stream is open
        live.kill_daemon(signal.SIGKILL)
        (flags / "go").touch()
        time.sleep(1.0)  # during-* are written while no daemon runs
        live.start_daemon()
        deadline = time.monotonic() + 60
        while "during-2" not in live.cli("logs", run).stdout:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        (flags / "end").touch()
        out, err = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert out.splitlines() == ["during-1", "during-2", "after-1"], err


def _wait_connected(pid: int) -> None:
    """Until process ``pid`` has a socket open (the CLI reached the daemon)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fds = Path(f"/proc/{pid}/fd")
        try:
            if any(os.readlink(fd).startswith("socket:") for fd in fds.iterdir()):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("the CLI never connected")


# -- a stopping daemon, a lost socket ------------------------------


def test_cli_waits_for_a_stopping_daemon_then_starts_one(js: JobsupEnv, repo: Path) -> None:
    js.start_daemon()
    pid = js.daemon.pid if js.daemon else 0
    os.kill(pid, signal.SIGSTOP)  # holds the state dir like a daemon still stopping
    try:
        js.socket.unlink()  # its API is already closed
        env = {k: v for k, v in js.env.items() if k != "JOBSUP_NO_AUTOSTART"}
        submit = subprocess.Popen(
            [sys.executable, "-m", "supervisord", "submit", "--", "true"],
            env=env,
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The CLI finds nothing answering (within ~1 s of starting), and the
        # old daemon is gone only later: within the CLI's 10 s of patience,
        # but after a daemon it started at once would have found the state
        # dir still locked.
        time.sleep(6.0)
        os.kill(pid, signal.SIGKILL)
        out, err = submit.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert submit.returncode == 0, err
    assert len(out.strip()) == 12
    new_pid = int((js.state_dir / "daemon.lock").read_text().strip())
    os.kill(new_pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while js.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_cli_names_a_daemon_that_lost_its_socket(live: JobsupEnv) -> None:
    live.socket.unlink()
    r = live.cli("runs", check=False, timeout=60)
    assert r.returncode == 69
    assert f"daemon pid {live.daemon.pid if live.daemon else 0} lost its socket" in r.stderr, r.stderr


# -- bad query parameters on streaming endpoints -------------------


def test_bad_query_parameters_are_400_naming_them(live: JobsupEnv, repo: Path) -> None:
    import httpx

    run = live.submit(repo, "--", "true")
    live.cli("wait", run)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(live.socket)), base_url="http://jobsup/v1") as c:
        for path, param in [
            ("/events?limit=-1", "limit"),
            ("/events?limit=0", "limit"),
            (f"/events?after={2**64}", "after"),
            ("/events?after=-3", "after"),
            (f"/runs/{run}/logs?tail=-5", "tail"),
            (f"/runs/{run}/logs?after_line=-1", "after_line"),
            (f"/runs/{run}/logs?after_line={2**63}", "after_line"),
            (f"/wait?run={run}&after=-1", "after"),
            (f"/wait?run={run}&timeout=nan", "timeout"),
        ]:
            resp = c.get(path)
            assert resp.status_code == 400, (path, resp.status_code, resp.text[:200])
            assert f"query parameter {param}=" in resp.json()["error"]["message"], path
        assert c.get(f"/events?after={2**63 - 1}").status_code == 200
    assert "Traceback" not in live.daemon_log.read_text()


# -- env values no process can be given ----------------------------


def test_env_values_no_process_can_take_are_refused_at_submit(live: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "envrepo",
        {
            "nul.yaml": 'run: "true"\nenv:\n  HAS_NUL: "a\\0b"\n',
            "big.yaml": 'run: "true"\nenv:\n  BIG: "' + "x" * 140000 + '"\n',
            "total.yaml": 'run: "true"\nenv:\n' + "".join(f'  V{i}: "{"y" * 100000}"\n' for i in range(30)),
        },
    )
    for task, key in [("nul.yaml", "HAS_NUL"), ("big.yaml", "BIG"), ("total.yaml", "env.V")]:
        r = live.cli("submit", task, cwd=repo, check=False)
        assert r.returncode == 2, (task, r.returncode, r.stderr)
        assert key in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert "xxxx" not in r.stderr and "yyyy" not in r.stderr
    assert json.loads(live.cli("runs", "--all", "-o", "json").stdout) == []


# -- env scalars as written ---------------------------------------


def test_task_env_scalars_are_taken_as_written(live: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "scalars",
        {
            "task.yaml": (
                'run: echo "$VERSION $ZIP $MODE $AT $QUOTED"\n'
                "env:\n  VERSION: 1.10\n  ZIP: 02134\n  MODE: off\n  AT: 12:30\n  QUOTED: '007'\n"
            )
        },
    )
    run = live.submit(repo, "task.yaml")
    live.cli("wait", run)
    assert live.cli("logs", run).stdout.splitlines() == ["1.10 02134 off 12:30 007"]


# -- a local run's umask --------------------------------------------


def test_local_run_gets_the_umask_of_the_submitting_shell(live: JobsupEnv, repo: Path) -> None:
    for mask, mode in [(0o022, "644"), (0o027, "640")]:
        proc = subprocess.run(
            [sys.executable, "-m", "supervisord", "submit", "--name", f"u{mask:o}", "--", "touch f && stat -c %a f"],
            env=live.env,
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=120,
            umask=mask,
            check=True,
        )
        run = proc.stdout.strip()
        live.cli("wait", run)
        assert live.cli("logs", run).stdout.strip() == mode
        submitted = json.loads(live.cli("events", run, "-o", "json").stdout.splitlines()[0])
        assert submitted["data"]["umask"] == f"{mask:04o}"


# -- arguments that are not UTF-8 -----------------------------------


def test_non_utf8_argument_is_one_line_and_exit_2(live: JobsupEnv, repo: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "submit", "--", "echo", b"caf\xe9"],
        env=live.env,
        cwd=repo,
        capture_output=True,
        timeout=120,
        check=False,
    )
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, err
    assert err.strip().count("\n") == 0 and "argument 4 is not valid UTF-8" in err, err
    assert json.loads(live.cli("runs", "--all", "-o", "json").stdout) == []


# -- YAML alias bombs and document size -----------------------------


def _bomb(levels: int) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_in_a_config_layer_is_refused_naming_the_file(live: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "bomb", {"job.sh": "true\n"})
    (repo / ".jobsup.yaml").write_text("env:\n  X:\n" + "".join("    " + ln + "\n" for ln in _bomb(7).splitlines()))
    r = live.cli("submit", "--", "true", cwd=repo, check=False, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"{repo / '.jobsup.yaml'}" in r.stderr and "expands to more than" in r.stderr
    big = repo / "big.yaml"
    big.write_text("run: 'true'\nname: '" + "x" * (5 * 1024 * 1024) + "'\n")
    r = live.cli("submit", str(big), cwd=repo, check=False, timeout=60)
    assert r.returncode == 2 and str(big) in r.stderr and "over the limit" in r.stderr, r.stderr[:300]


# -- exit codes -----------------------------------------------------


def test_unknown_run_id_and_bad_user_config_exit_2(live: JobsupEnv, repo: Path) -> None:
    for args in (
        ["show", "ffff0000"],
        ["logs", "ffff0000"],
        ["wait", "ffff0000"],
        ["cancel", "ffff0000"],
        ["events", "ffff0000"],
        ["logs", "-f", "ffff0000"],
    ):
        r = live.cli(*args, check=False)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "ffff0000" in r.stderr
    (repo / ".jobsup.yaml").write_text("local:\n  shell: no-such-shell-here\n")
    r = live.cli("submit", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2, r.stderr
    assert "no-such-shell-here" in r.stderr and str(repo / ".jobsup.yaml") in r.stderr
    assert json.loads(live.cli("runs", "--all", "-o", "json").stdout) == []


# -- doctor without Kubernetes --------------------------------------


def test_doctor_shows_kubernetes_as_na_without_kubeconfig_or_when_not_allowed(js: JobsupEnv, tmp_path: Path) -> None:
    js.env.pop("KUBECONFIG", None)
    js.start_daemon()
    r = js.cli("doctor", "-o", "json", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert checks["kubernetes"]["detail"].startswith("n/a: no kubeconfig")
    table = js.cli("doctor", check=False).stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "OK"] and "True" not in "\n".join(table), table
    assert all(line.split()[1] == "yes" for line in table[1:] if line.startswith(("daemon ", "store "))), table
    js.stop_daemon()
    daemon_cfg = tmp_path / "daemon.yaml"
    daemon_cfg.write_text("allowed_backends: [local]\n")
    js.env["JOBSUP_DAEMON_CONFIG"] = str(daemon_cfg)
    kube = tmp_path / "kubeconfig"
    kube.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n")
    js.env["KUBECONFIG"] = str(kube)
    js.start_daemon()
    r = js.cli("doctor", "-o", "json", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert checks["kubernetes"]["detail"].startswith("n/a: the kubernetes backend is not allowed")


# -- leftovers -----------------------------------------------------


def test_interrupted_submit_says_it_was_not_recorded_and_leftovers_go(
    js: JobsupEnv, repo: Path, tmp_path: Path
) -> None:
    # A git whose `archive` hangs, so the daemon can be killed mid-submit.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    flag = tmp_path / "archiving"
    real_git = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
    (bindir / "git").write_text(
        f'#!/bin/sh\ncase "$*" in *" archive "*) touch {flag}; sleep 20;; esac\nexec {real_git} "$@"\n'
    )
    os.chmod(bindir / "git", 0o755)
    js.start_daemon(extra_env={"PATH": f"{bindir}:{js.env['PATH']}"})
    submit = js.popen("submit", "--", "true", cwd=repo)
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert time.monotonic() < deadline and submit.poll() is None
        time.sleep(0.05)
    assert list((js.state_dir / "snapshots").glob(".archive-*"))
    js.kill_daemon(signal.SIGKILL)
    js.start_daemon()
    out, err = submit.communicate(timeout=120)
    assert submit.returncode == 69, err
    assert "the run was NOT recorded" in err and out == ""
    assert not list((js.state_dir / "snapshots").glob(".archive-*"))


def test_submit_warns_about_submodules_and_a_task_file_in_a_subfolder(live: JobsupEnv, tmp_path: Path) -> None:
    sub = make_repo(tmp_path / "lib", {"lib.sh": "echo lib\n"})
    repo = make_repo(tmp_path / "withsub", {"jobs/task.yaml": "run: bash ../lib.sh\n"})
    git = [
        "git",
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.invalid",
        "-c",
        "protocol.file.allow=always",
        "-C",
        str(repo),
    ]
    subprocess.run([*git, "submodule", "add", "-q", str(sub), "vendor/lib"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "sub"], check=True)
    r = live.cli("submit", "jobs/task.yaml", cwd=repo)
    assert "submodule(s) will be empty folders in the snapshot: vendor/lib" in r.stderr, r.stderr
    assert "the task file is in jobs/ but its command runs at the top of the repository" in r.stderr


def test_submitted_and_cancel_requested_record_the_peer(live: JobsupEnv, repo: Path) -> None:
    submit = subprocess.Popen(
        [sys.executable, "-m", "supervisord", "submit", "--", "sleep 300"],
        env=live.env,
        cwd=repo,
        stdout=subprocess.PIPE,
        text=True,
    )
    run = submit.communicate(timeout=120)[0].strip()
    cancel = subprocess.Popen(
        [sys.executable, "-m", "supervisord", "cancel", run],
        env=live.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    cancel.communicate(timeout=120)
    assert cancel.returncode == 0
    events = [json.loads(x) for x in live.cli("events", run, "-o", "json").stdout.splitlines()]
    submitted = events[0]["data"]
    assert (submitted["submitted_by_uid"], submitted["submitted_by_pid"]) == (os.getuid(), submit.pid)
    (requested,) = [e["data"] for e in events if e["type"] == "CancelRequested"]
    assert requested == {"requested_by_uid": os.getuid(), "requested_by_pid": cancel.pid}


def test_daemon_only_key_in_a_task_config_is_an_error_as_the_readme_says(live: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "donly", {"task.yaml": "run: 'true'\nconfig:\n  allowed_backends: [local]\n"})
    r = live.cli("submit", "task.yaml", cwd=repo, check=False)
    assert r.returncode == 2 and "allowed_backends" in r.stderr and str(repo / "task.yaml") in r.stderr, r.stderr
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    assert "a task's `config:` setting them (or any key outside the list above) is an error" in readme
