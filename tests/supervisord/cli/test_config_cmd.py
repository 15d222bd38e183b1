"""``jobsup config show`` / ``jobsup config validate`` end to end: the real CLI
as a subprocess, real config files in a temporary home and project, no daemon
(JOBSUP_NO_AUTOSTART=1 and a socket path nothing listens on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ENTRY = "from supervisord.entry import main; main()"


class Home:
    """A private HOME, XDG config dir and project directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.conf = self.home / ".config" / "jobsup"
        self.conf.mkdir(parents=True)
        self.project = root / "project"
        self.project.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSUP_", "XDG_", "KUBECONFIG"))}
        self.env.update(
            {
                "HOME": str(self.home),
                "XDG_CONFIG_HOME": str(self.home / ".config"),
                "JOBSUP_STATE_DIR": str(root / "state"),
                "JOBSUP_SOCKET": str(root / "nobody.sock"),
                "JOBSUP_NO_AUTOSTART": "1",
            }
        )

    def write(self, path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", ENTRY, "config", *args],
            cwd=self.project,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def h(tmp_path: Path) -> Home:
    home = Home(tmp_path)
    home.write(
        home.conf / "daemon.yaml",
        "allowed_backends: [local, kubernetes]\n"
        "kubernetes:\n"
        "  namespace: shared\n"
        "  allowed_contexts: [kind-dev]\n"
        "  pod_config:\n"
        "    spec:\n"
        "      containers: [{name: main, resources: {limits: {cpu: '2'}}}]\n"
        "daemon: {max_running: 4}\n",
    )
    home.write(home.conf / "config.yaml", "env:\n  API_TOKEN: hunter2\nlocal: {shell: zsh}\n")
    home.write(
        home.project / ".jobsup.yaml",
        "kubernetes:\n"
        "  tolerations: [{key: gpu, operator: Exists}]\n"
        "  pod_config:\n"
        "    spec:\n"
        "      containers: [{name: main, env: [{name: A, value: '1'}]}]\n",
    )
    home.write(
        home.project / "task.yaml",
        "run: python train.py\n"
        "config:\n"
        "  kubernetes:\n"
        "    pod_ready_timeout_s: 300\n"
        "    pod_config:\n"
        "      spec:\n"
        "        containers: [{name: main, resources: {limits: {memory: 4Gi}}}]\n",
    )
    return home


def test_show_json_merges_every_layer(h: Home) -> None:
    r = h.run("show", "task.yaml", "--config", "local.kill_grace_s=3", "--config", "env.MODE=0600", "-o", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    k = data["kubernetes"]
    assert k["namespace"] == "shared"  # daemon
    assert k["tolerations"] == [{"key": "gpu", "operator": "Exists"}]  # project
    assert k["pod_ready_timeout_s"] == 300  # task
    (container,) = k["pod_config"]["spec"]["containers"]  # daemon + project + task merged on the name
    assert container["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"}}
    assert [e["name"] for e in container["env"]] == ["A"]
    assert data["local"] == {"kill_grace_s": 3, "shell": "zsh"}  # cli + user
    assert data["daemon"]["max_running"] == 4
    # secrets are redacted, in env and in container env alike
    assert "hunter2" not in r.stdout and "0600" not in r.stdout
    assert data["env"]["API_TOKEN"].startswith("<redacted")
    assert k["pod_config"]["spec"]["containers"][0]["env"][0]["value"].startswith("<redacted")
    assert r.stderr == ""


def test_show_origin(h: Home) -> None:
    r = h.run("show", "task.yaml", "--config", "backend=kubernetes", "--origin", "-o", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["backend"] == {"value": "kubernetes", "layer": "cli", "file": None}
    assert data["local"]["shell"] == {"value": "zsh", "layer": "user", "file": str(h.conf / "config.yaml")}
    assert data["local"]["kill_grace_s"] == {"value": 10, "layer": "default", "file": None}
    assert data["kubernetes"]["namespace"]["layer"] == "daemon"
    assert data["kubernetes"]["pod_ready_timeout_s"] == {
        "value": 300,
        "layer": "task",
        "file": str(h.project / "task.yaml"),
    }
    container = data["kubernetes"]["pod_config"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["cpu"]["file"] == str(h.conf / "daemon.yaml")
    assert container["env"][0]["name"]["file"] == str(h.project / ".jobsup.yaml")
    assert container["env"][0]["value"]["value"].startswith("<redacted")


def test_show_yaml_default_and_env_timeout(h: Home) -> None:
    r = h.run("show", env={"JOBSUP_K8S_POD_READY_TIMEOUT_S": "120.0"})
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(r.stdout)
    assert data["kubernetes"]["pod_ready_timeout_s"] == 120
    assert list(data)[:4] == ["backend", "env", "local", "kubernetes"]


def test_show_warns_on_daemon_only_keys(h: Home) -> None:
    h.write(h.project / ".jobsup.yaml", "allowed_backends: [local]\ndaemon: {log_level: debug}\n")
    r = h.run("show", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["allowed_backends"] == ["local", "kubernetes"]
    assert "warning: allowed_backends is a daemon-only key" in r.stderr
    assert "warning: daemon.log_level is a daemon-only key" in r.stderr
    assert str(h.project / ".jobsup.yaml") in r.stderr


def test_validate_ok(h: Home) -> None:
    r = h.run("validate", "task.yaml", "--config", "kubernetes.runtime_class=kata")
    assert r.returncode == 0, r.stderr
    assert "config OK: daemon" in r.stderr and "task" in r.stderr and "cli" in r.stderr
    assert r.stdout == ""


def test_validate_reports_every_error_of_every_layer(h: Home) -> None:
    h.write(h.conf / "daemon.yaml", "daemon: {synchronous: OFF}\n")
    h.write(h.conf / "config.yaml", "local:\n  shell: zsh\n  kill_grace_s: [1\n")
    h.write(
        h.project / ".jobsup.yaml",
        "kubernetes:\n  pvc_mounts: [{claim_name: data, mount_path: /dev/shm/}]\n  bogus: 1\n",
    )
    h.write(h.project / "task.yaml", "run: echo\nconfig: {kubernetes: {namespace: other}}\n")
    r = h.run("validate", "task.yaml", "--config", "kubernetes.pod_ready_timeout_s=0")
    assert r.returncode == 2
    err = r.stderr
    assert "config errors:" in err
    expected = [
        f"{h.conf / 'config.yaml'}: line 4",  # YAML error with its line
        f"{h.conf / 'daemon.yaml'} (daemon config): daemon.synchronous: must be one of FULL, NORMAL, got false (a boolean) (YAML reads yes/no/on/off/true/false as booleans: quote the word",
        f"{h.project / '.jobsup.yaml'} (project config): kubernetes.bogus: unknown key",
        f"{h.project / '.jobsup.yaml'} (project config): kubernetes.pvc_mounts[0].mount_path: '/dev/shm/' is not normalized",
        f"{h.project / 'task.yaml'} (task `config:`): kubernetes.namespace: a task may not set this key",
        "--config: kubernetes.pod_ready_timeout_s: must be a positive integer, got 0",
    ]
    for line in expected:
        assert line in err, f"missing {line!r} in:\n{err}"


def test_validate_refuses_a_backend_the_daemon_does_not_allow(h: Home) -> None:
    h.write(h.conf / "daemon.yaml", "allowed_backends: [kubernetes]\n")
    r = h.run("validate")
    assert r.returncode == 2
    assert "backend 'local' is not allowed" in r.stderr
    assert str(h.conf / "daemon.yaml") in r.stderr


@pytest.mark.parametrize("key", ["archive_logs_after", "run_dirs_after"])
def test_validate_says_a_bad_duration_is_not_a_duration(h: Home, key: str) -> None:
    # Every duration-valued key: a human message, not the schema's regex.
    h.write(h.conf / "daemon.yaml", f"retention: {{{key}: 10x}}\n")
    r = h.run("validate")
    assert r.returncode == 2, r.stderr
    assert (
        f"{h.conf / 'daemon.yaml'} (daemon config): retention.{key}: "
        "'10x' is not a duration; use e.g. 90s, 30m, 4h or 30d"
    ) in r.stderr, r.stderr
    assert "does not match" not in r.stderr and "[smhd]" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    "variable,command",
    [("JOBSUP_CONFIG", "show"), ("JOBSUP_PROJECT_CONFIG", "validate"), ("JOBSUP_DAEMON_CONFIG", "show")],
)
def test_override_variable_at_missing_file(h: Home, variable: str, command: str) -> None:
    r = h.run(command, env={variable: str(h.root / "missing.yaml")})
    assert r.returncode == 2
    assert f"error: {variable}=" in r.stderr and "does not exist" in r.stderr
    assert r.stdout == ""


def test_config_file_and_pairs_do_not_mix(h: Home) -> None:
    h.write(h.project / "extra.yaml", "local: {shell: sh}\n")
    r = h.run("show", "--config", "extra.yaml", "--config", "backend=local")
    assert r.returncode == 2
    assert "must be the only --config" in r.stderr
    r = h.run("show", "--config", "extra.yaml", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["local"]["shell"] == "sh"


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict) and value and set(value) != {"value", "layer", "file"}:
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list) and value:
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def test_origin_annotates_every_leaf(h: Home) -> None:
    r = h.run("show", "task.yaml", "--origin", "-o", "json")
    assert r.returncode == 0, r.stderr
    leaves = _leaves(json.loads(r.stdout))
    assert leaves and all(isinstance(leaf, dict) and leaf.get("layer") for leaf in leaves), leaves
