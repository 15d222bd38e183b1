"""End to end through the CLI: the real daemon (a subprocess reading the
simulator's kubeconfig through KUBECONFIG), the real CLI, the simulated
cluster running real containers."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s_sim import SimCluster
from tests.supervisord.backends.kubernetes.k8s_backend_helpers import MANIFEST_PATH, job_manifest, sim_cluster, use_sim
from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    with sim_cluster(tmp_path_factory.mktemp("sim")) as cluster:
        yield cluster


@pytest.fixture
def js(js: JobsupEnv, sim: SimCluster) -> JobsupEnv:
    """The harness's environment (tests/supervisord/conftest.py) on the
    simulator, with a short pod-ready budget, its daemon running."""
    use_sim(js, sim, pod_ready_timeout_s=20)
    js.start_daemon()
    return js


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "proj",
        {
            MANIFEST_PATH: job_manifest(),
            "count.py": (
                "import sys, time\n"
                "n = int(sys.argv[1]); pause = float(sys.argv[2])\n"
                "for i in range(1, n + 1):\n"
                "    print(i, flush=True)\n"
                "    time.sleep(pause)\n"
            ),
            "task.yaml": "name: hello\nbackend: kubernetes\nrun: echo hello from $TOKEN_NAME; python3 count.py 3 0\ntimeout: 5m\nenv:\n  TOKEN_NAME: s3cr3t-value\n",
        },
    )


def test_submit_wait_logs_completed(js: JobsupEnv, repo: Path, sim: SimCluster) -> None:
    run_id = js.submit(repo, "task.yaml")
    w = js.cli("wait", run_id, "--timeout", "2m", check=False)
    assert w.returncode == 0, w.stdout + w.stderr
    assert js.cli("logs", run_id).stdout.splitlines() == ["hello from s3cr3t-value", "1", "2", "3"]
    shown = js.show(run_id)
    assert shown["phase"] == "COMPLETED" and shown["exit_code"] == 0 and shown["backend"] == "kubernetes"
    assert "s3cr3t-value" not in json.dumps(shown)
    events = js.cli("events", run_id, "-o", "json").stdout
    # The job itself prints the value (a log line); no other event holds it.
    assert all("s3cr3t-value" not in line for line in events.splitlines() if '"LogLines"' not in line)
    types = [json.loads(line)["type"] for line in events.splitlines()]
    assert types.count("ObjectCreated") == 2 and "StagingStep" in types
    phases = [
        json.loads(line)["data"]["phase"] for line in events.splitlines() if json.loads(line)["type"] == "PhaseChanged"
    ]
    assert phases[0] == "SCHEDULING" and phases[-2:] == ["RUNNING", "COMPLETED"], phases


def test_failing_command_exits_1(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--backend", "kubernetes", "--", "echo bye; exit 5")
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "2m", check=False)
    assert w.returncode == 1, w.stdout + w.stderr
    run = json.loads(w.stdout)[0]
    assert run["phase"] == "ERROR" and run["exit_code"] == 5 and "NonZeroExit" in run["message"]


def test_cancel_leaves_no_pod(js: JobsupEnv, repo: Path, sim: SimCluster) -> None:
    run_id = js.submit(repo, "--backend", "kubernetes", "--", "echo started; sleep 300")
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "60s", check=False).returncode == 0
    js.cli("cancel", run_id)
    w = js.cli("wait", run_id, "--timeout", "60s", check=False)
    assert w.returncode == 3, w.stdout + w.stderr
    labelled = [
        p for p in sim.list_objects("pods") if (p["metadata"].get("labels") or {}).get("jobsup.io/run") == run_id
    ]
    assert labelled == []


def test_kill_9_daemon_mid_run_loses_and_doubles_nothing(js: JobsupEnv, repo: Path) -> None:
    n = 400
    run_id = js.submit(repo, "--backend", "kubernetes", "--", f"python3 count.py {n} 0.01")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if js.show(run_id)["log_lines"] > 50:
            break
        time.sleep(0.1)
    js.kill_daemon(signal.SIGKILL)
    time.sleep(1.0)  # the container keeps printing while no daemon runs
    js.start_daemon()
    w = js.cli("wait", run_id, "--timeout", "2m", check=False)
    assert w.returncode == 0, w.stdout + w.stderr
    lines = js.cli("logs", run_id).stdout.splitlines()
    assert lines == [str(i) for i in range(1, n + 1)]
    js.stop_daemon()
    js.start_daemon()
    assert js.cli("logs", run_id).stdout.splitlines() == lines


def test_broken_manifest_is_refused_and_nothing_recorded(js: JobsupEnv, repo: Path) -> None:
    (repo / "bad.yaml").write_text("kind: ConfigMap\napiVersion: v1\nmetadata: {name: x}\n")
    import subprocess

    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e.invalid", "-C", str(repo), "add", "-A"], check=True
    )
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e.invalid", "-C", str(repo), "commit", "-qm", "bad"],
        check=True,
    )
    r = js.cli("submit", "--backend", "kubernetes", "--manifest", "bad.yaml", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Job" in r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []


def test_doctor_checks_kubernetes(js: JobsupEnv, sim: SimCluster) -> None:
    r = js.cli("doctor", "-o", "json", check=False)
    checks = json.loads(r.stdout)
    names = {c["name"]: c for c in checks}
    assert names["kubeconfig"]["ok"] and sim.contexts[0] in names["kubeconfig"]["detail"]
    assert names["kubernetes api"]["ok"]
    assert names["rbac: create pods/exec"]["ok"]
    assert r.returncode == 0, r.stdout + r.stderr


def _commit(repo: Path, files: dict[str, str]) -> None:
    import subprocess

    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e.invalid", "-C", str(repo)]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "change"], check=True)


def test_an_alias_bomb_manifest_is_refused_at_submit_and_nothing_recorded(js: JobsupEnv, repo: Path) -> None:
    # Before the caps the submit was recorded and the daemon then expanded
    # 10**10 values when it serialised the Job (hung, then MemoryError).
    import subprocess

    from tests.supervisord.backends.kubernetes.test_k8s_render_cli import alias_bomb_manifest

    _commit(repo, {"bomb.yaml": alias_bomb_manifest()})
    try:
        r = js.cli(
            "submit",
            "--backend",
            "kubernetes",
            "--manifest",
            "bomb.yaml",
            "--",
            "true",
            cwd=repo,
            check=False,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("submit hung on an alias-bomb manifest")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "bomb.yaml" in r.stderr and "expands to more than 200000 values" in r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json", timeout=30).stdout) == []


# ------------------------------------------- preflight: whose fault is it?


def _refused(js: JobsupEnv, repo: Path, *args: str) -> str:
    """Submit; assert exit 2 (bad input) and nothing recorded; the stderr."""
    r = js.cli("submit", "--backend", "kubernetes", *args, "--", "true", cwd=repo, check=False, timeout=90)
    assert r.returncode == 2, r.stdout + r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []
    return r.stderr


def test_preflight_unknown_context_is_bad_input_naming_the_kubeconfig_and_key(
    js: JobsupEnv, repo: Path, sim: SimCluster
) -> None:
    err = _refused(js, repo, "--config", "kubernetes.context=no-such-context")
    assert "no-such-context" in err and str(sim.kubeconfig_path) in err and "kubernetes.context" in err


def test_preflight_namespace_not_allowed_is_bad_input_naming_the_key(
    js: JobsupEnv, repo: Path, sim: SimCluster
) -> None:
    from tests.k8s_sim import AccessRule

    sim.set_access_rules([AccessRule(namespaces=(sim.namespace,))])
    try:
        err = _refused(js, repo, "--config", "kubernetes.namespace=elsewhere")
    finally:
        sim.set_access_rules([AccessRule()])
    assert "not allowed to create jobs.batch in namespace elsewhere" in err and "kubernetes.namespace" in err


def test_preflight_missing_secret_in_the_manifest_is_bad_input(js: JobsupEnv, repo: Path) -> None:
    _commit(repo, {"vol.yaml": job_manifest(volumes=[{"name": "a", "secret": {"secretName": "absent-secret"}}])})
    err = _refused(js, repo, "--manifest", "vol.yaml")
    assert "Secret absent-secret" in err and "does not exist" in err


def test_preflight_a_kubeconfig_that_does_not_parse_is_bad_input_naming_it(
    tmp_path: Path, repo: Path, sim: SimCluster
) -> None:
    broken = tmp_path / "broken-kubeconfig"
    with jobsup_env(tmp_path / "broken") as env:
        for text in ("clusters: [unclosed\n", "apiVersion: v1\nkind: Config\nclusters: 5\ncontexts: 7\nusers: []\n"):
            broken.write_text(text)
            env.env["KUBECONFIG"] = str(broken)
            env.start_daemon()
            try:
                err = _refused(env, repo, "--config", f"kubernetes.context={sim.contexts[0]}")
                assert str(broken) in err, err
            finally:
                env.stop_daemon()


def test_preflight_an_api_server_failing_with_5xx_stays_exit_1(js: JobsupEnv, repo: Path, sim: SimCluster) -> None:
    sim.faults.fail_requests(500, path_contains="/version")
    try:
        r = js.cli("submit", "--backend", "kubernetes", "--", "true", cwd=repo, check=False, timeout=90)
    finally:
        sim.faults.clear_request_failures()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "does not answer" in r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []
