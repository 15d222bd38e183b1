"""Runs in the user's world, end to end: the submitting shell's environment,
the JOBSUP_* folders, task links, outputs folders and their provenance
(README, "Where your run runs, and where its results go")."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisord.shared import schemas
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(180), pytest.mark.daemon]

MARKER = "mArKeR-5e1c7b2d-not-for-anyone"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "proj",
        {
            "README": "x\n",
            "env.sh": 'echo "setting=${MY_SETTING:-}"\necho "python=$(command -v python)"\n'
            'echo "secret-set=${MY_TOKEN:+yes}"\n',
            "folders.sh": 'echo "submit=$JOBSUP_SUBMIT_DIR"\necho "repo=$JOBSUP_REPO_DIR"\n'
            'echo "out=$JOBSUP_OUTPUT_DIR"\necho "after=${JOBSUP_AFTER_OUTPUTS-unset}"\n',
            "sub/.keep": "",
        },
    )


def _wait(js: JobsupEnv, run_id: str) -> dict[str, Any]:
    r = js.cli("wait", run_id, "-o", "json", check=False)
    doc: dict[str, Any] = json.loads(r.stdout)[0]
    return doc


def _logs(js: JobsupEnv, run_id: str) -> list[str]:
    return js.cli("logs", run_id).stdout.splitlines()


def _outputs(js: JobsupEnv, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """The run's outputs document once recorded."""
    deadline = time.monotonic() + timeout
    while True:
        doc: dict[str, Any] = json.loads(js.cli("outputs", run_id, "-o", "json").stdout)
        if doc["state"] == "recorded" or time.monotonic() > deadline:
            return doc
        time.sleep(0.1)


def test_shell_env_venv_python_and_secret_never_written(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    shell = {"PATH": f"{venv / 'bin'}:{js.env['PATH']}", "MY_SETTING": "hello", "MY_TOKEN": MARKER}
    run_id = js.cli("submit", "--", "bash", "env.sh", cwd=repo, extra_env=shell).stdout.strip()
    assert _wait(js, run_id)["phase"] == "COMPLETED"
    lines = _logs(js, run_id)
    assert "setting=hello" in lines
    assert f"python={venv / 'bin' / 'python'}" in lines
    assert "secret-set=yes" in lines
    doc = js.show(run_id)
    sub = doc
    assert sub["env_from"] == "submitter"
    assert set(sub["shell_env"]) >= {"PATH", "MY_SETTING", "MY_TOKEN"}
    assert all(v.startswith("hmac-sha256:") for v in sub["shell_env"].values())
    assert not any(k.startswith("JOBSUP_") for k in sub["shell_env"])
    # The marker is nowhere jobsup writes or answers.
    _outputs(js, run_id)
    places = {
        "events": js.cli("events", run_id, "-o", "json").stdout,
        "show": json.dumps(doc),
        "logs": "\n".join(lines),
        "outputs": js.cli("outputs", run_id, "-o", "json").stdout,
        "daemon log": js.daemon_log.read_text(errors="replace"),
    }
    assert js.daemon is not None
    places["daemon environ"] = Path(f"/proc/{js.daemon.pid}/environ").read_bytes().decode(errors="replace")
    page = _page_html(js, run_id)
    assert "the submitting shell's" in page and 'id="outputs"' in page
    places["page"] = page
    for where, text in places.items():
        assert MARKER not in text, where
    # Nor in the database's file, nor the run's folder (the pending file is gone once it started).
    assert MARKER.encode() not in (js.state_dir / "jobsup.db").read_bytes()
    for p in (js.state_dir / "runs").rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert MARKER.encode() not in p.read_bytes(), p


def _page_html(js: JobsupEnv, run_id: str) -> str:
    """The web page's run view (HTML), fetched as a browser would: the
    one-time token for the session cookie, then the page."""
    import httpx

    from tests.supervisord.ui.conftest import page_url

    url = page_url(js)
    with httpx.Client(base_url=url.split("/?")[0], follow_redirects=False, timeout=30) as client:
        assert client.get(url).status_code == 303
        resp = client.get(f"/runs/{run_id}")
        assert resp.status_code == 200, resp.text
        return resp.text


def test_env_from_daemon_keeps_the_old_behaviour(js: JobsupEnv, repo: Path) -> None:
    js.user_config("local:\n  env_from: daemon\n")
    run_id = js.cli("submit", "--", "bash", "env.sh", cwd=repo, extra_env={"MY_SETTING": "hello"}).stdout.strip()
    assert _wait(js, run_id)["phase"] == "COMPLETED"
    assert "setting=" in _logs(js, run_id)
    assert js.show(run_id)["env_from"] == "daemon"
    assert "shell_env" not in js.show(run_id)


_API_SUBMIT = """
import json, sys
from pathlib import Path
from supervisord.client.api import Client
from supervisord.client.cli.submit_request import build_task, submit_body
from supervisord.shared.exceptions import UsageError
shell = json.loads(sys.stdin.read())
task = build_task(None, ["true"], name=None, backend=None, timeout=None, manifest=None)
body = submit_body(task, config_args=[], cwd=Path.cwd(), rev="HEAD", force=False, hold=False, shell_env=shell)
try:
    Client().submit(body)
except UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize(
    ("shell", "message"),
    [
        ({"HUGE_ONE": "x" * 140_000}, "HUGE_ONE: NAME=VALUE is 140010 bytes"),
        ({"NUL_ONE": "a\x00b"}, "NUL_ONE: the value holds a NUL byte"),
        ({"A=B": "x"}, "'A=B' is not a name"),
    ],
)
def test_a_shell_variable_no_process_can_take_is_refused_by_name(
    js: JobsupEnv, repo: Path, shell: dict[str, str], message: str
) -> None:
    # Sent as the API's body: no shell could have started the CLI with it.
    r = subprocess.run(
        [sys.executable, "-c", _API_SUBMIT],
        input=json.dumps({**shell, "PATH": os.environ["PATH"]}),
        cwd=repo,
        env=js.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "x" * 100 not in r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []


def test_folders_and_the_after_chain(js: JobsupEnv, repo: Path) -> None:
    sub = repo / "sub"
    pre = js.cli(
        "submit", "--name", "pre", "--", "bash", "-c", 'echo data-42 > "$JOBSUP_OUTPUT_DIR/processed.txt"', cwd=sub
    ).stdout.strip()
    train = js.cli(
        "submit",
        "--name",
        "train",
        "--after",
        pre,
        "--",
        "bash",
        "-c",
        'cat "$JOBSUP_AFTER_OUTPUTS/processed.txt"; bash folders.sh',
        cwd=sub,
    ).stdout.strip()
    assert _wait(js, train)["phase"] == "COMPLETED"
    lines = _logs(js, train)
    pre_out = json.loads(js.cli("outputs", pre, "-o", "json").stdout)["dir"]
    out = js.cli("outputs", train, "--path").stdout.strip()
    assert lines[0] == "data-42"
    assert f"submit={sub}" in lines and f"repo={repo}" in lines and f"out={out}" in lines
    assert f"after={pre_out}" in lines
    assert out.endswith(f"/proj/{train}") and pre_out.endswith(f"/proj/{pre}")
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    # A run without --after has no JOBSUP_AFTER_OUTPUTS.
    solo = js.cli("submit", "--name", "solo", "--", "bash", "folders.sh", cwd=repo).stdout.strip()
    _wait(js, solo)
    assert "after=unset" in _logs(js, solo)


def test_links(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    data = tmp_path / "datasets" / "cifar"
    data.mkdir(parents=True)
    (data / "x.txt").write_text("pixels\n")
    task = repo / "links-task.yaml"  # untracked: read by the client, not run from the snapshot
    task.write_text(
        f"run: cat data/x.txt; ls -l deep/ckpt | cut -c1\nlinks:\n  data: ../datasets/cifar\n  deep/ckpt: {data}\n"
    )
    run_id = js.cli("submit", str(task), cwd=repo).stdout.strip()
    # relative targets are taken against the submit folder: tmp/proj/../datasets/cifar
    assert _wait(js, run_id)["phase"] == "COMPLETED", _logs(js, run_id)
    assert _logs(js, run_id) == ["pixels", "l"]
    assert js.show(run_id)["links"] == {"data": str(data), "deep/ckpt": str(data)}
    bad = {
        "escape": ("../outside", str(data), "escapes the snapshot"),
        "clash": ("README", str(data), "clashes with the committed file README"),
        "missing": ("data", str(tmp_path / "nope"), "does not exist"),
    }
    for what, (path, target, message) in bad.items():
        task.write_text(f"run: 'true'\nlinks:\n  {path}: {target}\n")
        r = js.cli("submit", str(task), cwd=repo, check=False)
        assert r.returncode == 2, (what, r.stderr)
        assert f"links.{path}" in r.stderr and message in r.stderr, (what, r.stderr)
    assert len(json.loads(js.cli("runs", "--all", "-o", "json").stdout)) == 1


def test_outputs_recorded_and_which(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    script = (
        'cd "$JOBSUP_OUTPUT_DIR" && mkdir -p ckpt && head -c 3000000 /dev/urandom > ckpt/model.bin'
        " && echo hi > a.txt && ln -s /etc/passwd link && mkfifo pipe"
    )
    run_id = js.cli("submit", "--", "bash", "-c", script, cwd=repo).stdout.strip()
    assert _wait(js, run_id)["phase"] == "COMPLETED"
    doc = _outputs(js, run_id)
    assert doc["state"] == "recorded"
    schemas.validate("outputs", doc)
    for line in js.cli("events", run_id, "-o", "json").stdout.splitlines():
        schemas.validate("event", json.loads(line))
    # The outputs are listed on the page's run view.
    assert "ckpt/model.bin" in _page_html(js, run_id)
    model = Path(doc["dir"]) / "ckpt" / "model.bin"
    files = {f["path"]: f for f in doc["files"]}
    assert set(files) == {"a.txt", "ckpt/model.bin"}
    assert files["ckpt/model.bin"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert files["ckpt/model.bin"]["bytes"] == 3000000 and doc["total_bytes"] == 3000003
    assert {s["path"]: s["kind"] for s in doc["skipped"]} == {"link": "symlink", "pipe": "fifo"}
    # `which` finds the run from a copy of the file anywhere.
    copy = tmp_path / "model-copy.bin"
    copy.write_bytes(model.read_bytes())
    w = js.cli("which", str(copy), "-o", "json")
    schemas.validate("which", json.loads(w.stdout))
    found = json.loads(w.stdout)["files"][0]["runs"]
    assert [m["run"] for m in found] == [run_id]
    assert found[0]["path"] == "ckpt/model.bin" and len(found[0]["commit"]) == 40
    assert found[0]["config_digest"].startswith("sha256:")
    other = tmp_path / "other.bin"
    other.write_text("nobody made me\n")
    r = js.cli("which", str(other), check=False)
    assert r.returncode == 1 and "no recorded run produced" in r.stderr
    table = js.cli("outputs", run_id).stdout
    assert "ckpt/model.bin" in table


def test_an_outputs_dir_others_can_write_is_refused(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared-out"
    shared.mkdir()
    shared.chmod(0o777)
    js.user_config(f"local:\n  outputs_dir: {shared}\n")
    r = js.cli("submit", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "local.outputs_dir" in r.stderr and "writable by other users" in r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []


def test_rerun_takes_the_environment_of_the_shell_that_runs_it(js: JobsupEnv, repo: Path) -> None:
    first = js.cli("submit", "--", "bash", "env.sh", cwd=repo, extra_env={"MY_SETTING": "first"}).stdout.strip()
    _wait(js, first)
    again = js.cli("rerun", first, extra_env={"MY_SETTING": "second"}).stdout.strip()
    assert _wait(js, again)["phase"] == "COMPLETED"
    assert "setting=second" in _logs(js, again)
    shown = js.show(again)
    assert shown["env_from"] == "submitter" and "MY_SETTING" in shown["shell_env"]
    assert shown["shell_env"]["MY_SETTING"] != js.show(first)["shell_env"]["MY_SETTING"]


def test_prune_never_removes_outputs(js: JobsupEnv, repo: Path) -> None:
    run_id = js.cli("submit", "--", "bash", "-c", 'echo kept > "$JOBSUP_OUTPUT_DIR/result.txt"', cwd=repo).stdout
    run_id = run_id.strip()
    _wait(js, run_id)
    doc = _outputs(js, run_id)
    js.cli("prune", "--older-than", "0s", "--run-dirs")
    assert not (js.state_dir / "runs" / run_id).exists()  # the run's snapshot folder went
    assert (Path(doc["dir"]) / "result.txt").read_text() == "kept\n"
