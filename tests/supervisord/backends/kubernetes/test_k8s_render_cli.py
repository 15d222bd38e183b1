"""``jobsup render`` end to end: a real CLI process in a temp git repository.

Golden files (``golden/*.yaml``) hold the exact stdout; every rendered object
is validated against the official Kubernetes OpenAPI schemas
(``kubernetes-validate``, strict: unknown fields are errors), so what jobsup
renders is what a real API server accepts. Regenerate the golden files with
``JOBSUP_UPDATE_GOLDEN=1`` and review the diff.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.supervisord.jobsup_env import make_repo

HERE = Path(__file__).parent
MANIFESTS = HERE / "manifests"
GOLDEN = HERE / "golden"
EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
RUN_ID = "0123456789ab"
K8S_VERSION = "1.31"
UPDATE = os.environ.get("JOBSUP_UPDATE_GOLDEN") == "1"

TRAIN_TASK = "name: train\nrun: python train.py --epochs 3 --out 'runs/$(date +%s)'\ntimeout: 2h\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=_env(repo.parent))


def _env(root: Path) -> dict[str, str]:
    """A clean environment: no user config, no kubeconfig, no JOBSUP_ overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSUP_", "XDG_", "KUBECONFIG"))}
    env.update(
        HOME=str(root / "home"),
        XDG_CONFIG_HOME=str(root / "xdg"),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    return env


def demo_repo(tmp_path: Path, files: dict[str, str]) -> Path:
    """The harness's repository (:func:`make_repo`) named ``demo`` (the
    project name) with ``files`` committed, beside an empty home folder."""
    (tmp_path / "home").mkdir()
    return make_repo(tmp_path / "demo", files)


def jobsup(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``jobsup`` CLI (a new Python process) in ``repo``."""
    code = "from supervisord.client.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=repo,
        env=_env(repo.parent),
        capture_output=True,
        text=True,
        timeout=120,
    )


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} is missing; run with JOBSUP_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"render output differs from {path.name}"


def render_ok(repo: Path, *args: str) -> tuple[str, str]:
    proc = jobsup(repo, "render", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


# --- golden files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "notes"),
    [
        ("pytorch-gpu", [f"Job/train-{RUN_ID}: spec.backoffLimit 2 overridden to 0"]),
        ("headless-service", []),
        ("init-volumes", []),
    ],
)
def test_golden_render_of_realistic_manifests(tmp_path: Path, name: str, notes: list[str]) -> None:
    repo = demo_repo(tmp_path, {".jobsup/k8s.yaml": (MANIFESTS / f"{name}.yaml").read_text(), "task.yaml": TRAIN_TASK})
    out, err = render_ok(repo, "task.yaml", "--run-id", RUN_ID)
    objects = list(yaml.safe_load_all(out))
    validate(objects)
    check_golden(name, out)
    for note in notes:
        assert note in err
    if not notes:
        assert err == ""
    # The gated script carries the task's command as written.
    assert "  python train.py --epochs 3 --out 'runs/$(date +%s)'\n" in out


SANDBOX_CASES: list[tuple[str, dict[str, Any], set[str]]] = [
    ("sandbox-runtime-class", {"runtime_class": "kata"}, {"spec.template.spec.runtimeClassName"}),
    (
        "sandbox-tolerations",
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        {"spec.template.spec.tolerations"},
    ),
    (
        "sandbox-node-selector",
        {"node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"}},
        {"spec.template.spec.nodeSelector"},
    ),
    (
        "sandbox-pvc-mounts",
        {"pvc_mounts": [{"claim_name": "datasets", "mount_path": "/data"}]},
        {"spec.template.spec.volumes[1]", "spec.template.spec.containers[0].volumeMounts[1]"},
    ),
    (
        "sandbox-secret-mounts",
        {"secret_mounts": [{"secret_name": "wandb-key", "mount_path": "/secrets/wandb"}]},
        {"spec.template.spec.volumes[1]", "spec.template.spec.containers[0].volumeMounts[1]"},
    ),
]


def added_paths(base: Any, new: Any, path: str = "") -> set[str]:
    """Paths present in ``new`` but not in ``base``; any changed or removed value
    fails the assertion (the options may only add)."""
    if isinstance(base, dict) and isinstance(new, dict):
        assert set(base) <= set(new), f"{path}: keys removed: {set(base) - set(new)}"
        out: set[str] = set()
        for key, value in new.items():
            sub = f"{path}.{key}" if path else str(key)
            out |= {sub} if key not in base else added_paths(base[key], value, sub)
        return out
    if isinstance(base, list) and isinstance(new, list):
        assert len(base) <= len(new), f"{path}: items removed"
        out = set()
        for i, value in enumerate(new):
            out |= {f"{path}[{i}]"} if i >= len(base) else added_paths(base[i], value, f"{path}[{i}]")
        return out
    assert base == new, f"{path}: {base!r} changed to {new!r}"
    return set()


@pytest.mark.parametrize(("name", "options", "expected"), SANDBOX_CASES, ids=[c[0] for c in SANDBOX_CASES])
def test_golden_sandbox_options_add_exactly_their_fields(
    tmp_path: Path, name: str, options: dict[str, Any], expected: set[str]
) -> None:
    repo = demo_repo(
        tmp_path,
        {
            ".jobsup/k8s.yaml": (MANIFESTS / "pytorch-gpu.yaml").read_text(),
            "task.yaml": TRAIN_TASK,
            "sandbox.yaml": yaml.safe_dump({"kubernetes": options}),
        },
    )
    out, _ = render_ok(repo, "task.yaml", "--run-id", RUN_ID, "--config", "sandbox.yaml")
    objects = list(yaml.safe_load_all(out))
    validate(objects)
    check_golden(name, out)
    base = list(yaml.safe_load_all((GOLDEN / "pytorch-gpu.yaml").read_text()))
    assert len(objects) == len(base) == 1
    assert added_paths(base[0], objects[0]) == expected


def test_without_sandbox_options_output_is_byte_identical(tmp_path: Path) -> None:
    unrelated = {"kubernetes": {"namespace": "default", "pod_ready_timeout_s": 120}, "backend": "kubernetes"}
    repo = demo_repo(
        tmp_path,
        {
            ".jobsup/k8s.yaml": (MANIFESTS / "pytorch-gpu.yaml").read_text(),
            "task.yaml": TRAIN_TASK,
            ".jobsup.yaml": yaml.safe_dump(unrelated),
        },
    )
    out, _ = render_ok(repo, "task.yaml", "--run-id", RUN_ID)
    assert out == (GOLDEN / "pytorch-gpu.yaml").read_text()


def test_the_shipped_example_renders_and_validates(tmp_path: Path) -> None:
    files = {
        "examples/kubernetes/task.yaml": (EXAMPLES / "kubernetes" / "task.yaml").read_text(),
        "examples/kubernetes/.jobsup/k8s.yaml": (EXAMPLES / "kubernetes" / ".jobsup" / "k8s.yaml").read_text(),
    }
    repo = demo_repo(tmp_path, files)
    out, err = render_ok(repo, "examples/kubernetes/task.yaml", "--run-id", RUN_ID)
    assert err == ""
    objects = list(yaml.safe_load_all(out))
    validate(objects)
    check_golden("example-digits", out)


# --- behaviour of the command ----------------------------------------------------------------


def test_json_output_is_a_list_of_the_same_objects(tmp_path: Path) -> None:
    repo = demo_repo(
        tmp_path, {".jobsup/k8s.yaml": (MANIFESTS / "headless-service.yaml").read_text(), "task.yaml": TRAIN_TASK}
    )
    out_yaml, _ = render_ok(repo, "task.yaml", "--run-id", RUN_ID)
    out_json, _ = render_ok(repo, "task.yaml", "--run-id", RUN_ID, "-o", "json")
    doc = json.loads(out_json)
    assert doc["apiVersion"] == "v1" and doc["kind"] == "List"
    assert doc["items"] == list(yaml.safe_load_all(out_yaml))
    assert [o["kind"] for o in doc["items"]] == ["Service", "Job"]


def test_manifest_is_read_from_the_commit_and_rev(tmp_path: Path) -> None:
    repo = demo_repo(
        tmp_path, {"infra/run.yaml": (MANIFESTS / "pytorch-gpu.yaml").read_text(), "task.yaml": TRAIN_TASK}
    )
    first = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    # An uncommitted edit is not rendered; a later commit is, unless --rev says otherwise.
    (repo / "infra/run.yaml").write_text((MANIFESTS / "pytorch-gpu.yaml").read_text().replace("trainer", "edited"))
    out, _ = render_ok(repo, "task.yaml", "--manifest", "infra/run.yaml", "--run-id", RUN_ID)
    assert "edited" not in out and "name: trainer" in out
    _git(repo, "commit", "-q", "-am", "edit")
    out, _ = render_ok(repo, "task.yaml", "--manifest", "infra/run.yaml", "--run-id", RUN_ID)
    assert "name: edited" in out
    out, _ = render_ok(repo, "task.yaml", "--manifest", "infra/run.yaml", "--run-id", RUN_ID, "--rev", first.strip())
    assert "name: trainer" in out


def test_task_manifest_key_and_command_after_dashes(tmp_path: Path) -> None:
    task = "kubernetes:\n  manifest: infra/run.yaml\n"
    repo = demo_repo(tmp_path, {"infra/run.yaml": (MANIFESTS / "pytorch-gpu.yaml").read_text(), "t.yml": task})
    out, _ = render_ok(repo, "t.yml", "--run-id", RUN_ID, "--timeout", "90s", "--", "python", "eval.py")
    job = next(iter(yaml.safe_load_all(out)))
    assert job["spec"]["activeDeadlineSeconds"] == 90
    assert job["metadata"]["labels"]["jobsup.io/name"] == "python"
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    script = next(e["value"] for e in env if e["name"] == "JOBSUP_SCRIPT")
    assert "\ncd repo\n(\npython eval.py\n) &\n" in script
    out, _ = render_ok(repo, "--manifest", "infra/run.yaml", "--run-id", RUN_ID, "--", "bash", "go.sh")
    assert next(iter(yaml.safe_load_all(out)))["spec"]["activeDeadlineSeconds"] == 4 * 3600


def test_random_run_id_without_the_flag(tmp_path: Path) -> None:
    repo = demo_repo(
        tmp_path, {".jobsup/k8s.yaml": (MANIFESTS / "pytorch-gpu.yaml").read_text(), "task.yaml": TRAIN_TASK}
    )
    ids = set()
    for _ in range(2):
        out, _ = render_ok(repo, "task.yaml")
        run_id = next(iter(yaml.safe_load_all(out)))["metadata"]["labels"]["jobsup.io/run"]
        assert re.fullmatch(r"[0-9a-f]{12}", run_id)
        assert "{{JOBSUP_RUN}}" not in out
        ids.add(run_id)
    assert len(ids) == 2


def test_contract_violations_exit_2_with_every_error(tmp_path: Path) -> None:
    bad = (MANIFESTS / "pytorch-gpu.yaml").read_text()
    bad = bad.replace("restartPolicy: Never", "restartPolicy: OnFailure")
    bad = bad.replace('"eval \\"$JOBSUP_SCRIPT\\""', '"$JOBSUP_SCRIPT"')
    bad = bad.replace("name: train-{{JOBSUP_RUN}}", "generateName: train-")
    assert bad.count("OnFailure") == 1 and "generateName" in bad and '"$JOBSUP_SCRIPT"]' in bad
    repo = demo_repo(tmp_path, {".jobsup/k8s.yaml": bad, "task.yaml": TRAIN_TASK})
    proc = jobsup(repo, "render", "task.yaml", "--run-id", RUN_ID)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "(3 problems)" in proc.stderr
    assert "generateName" in proc.stderr
    assert "restartPolicy is 'OnFailure'" in proc.stderr
    assert "eval" in proc.stderr


def test_missing_manifest_exits_2_and_says_to_commit_it(tmp_path: Path) -> None:
    repo = demo_repo(tmp_path, {"task.yaml": TRAIN_TASK})
    proc = jobsup(repo, "render", "task.yaml", "--run-id", RUN_ID)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "no Kubernetes manifest at '.jobsup/k8s.yaml'" in proc.stderr
    assert "--manifest PATH" in proc.stderr
    (repo / ".jobsup").mkdir()
    (repo / ".jobsup/k8s.yaml").write_text((MANIFESTS / "pytorch-gpu.yaml").read_text())  # not committed
    proc = jobsup(repo, "render", "task.yaml", "--run-id", RUN_ID)
    assert proc.returncode == 2
    assert proc.stdout == ""
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert proc.stderr == (
        f"error: Kubernetes manifest '.jobsup/k8s.yaml' exists in the working tree but not in commit {commit[:12]}: "
        "commit it (jobsup reads the manifest from the recorded commit, never from the working tree)\n"
    )


def test_every_contract_error_names_the_file_and_the_key(tmp_path: Path) -> None:
    """Each violation's line starts with the manifest's repository-relative
    path and names the key to change, for a manifest given by --manifest
    as for the default one; so does the pod_config check."""
    bad = (MANIFESTS / "pytorch-gpu.yaml").read_text()
    bad = bad.replace("restartPolicy: Never", "restartPolicy: OnFailure")
    bad = bad.replace('"eval \\"$JOBSUP_SCRIPT\\""', '"$JOBSUP_SCRIPT"')
    bad = bad.replace("name: train-{{JOBSUP_RUN}}", "generateName: train-")
    two_jobs = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: a}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: b}\n"
    no_job = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
    repo = demo_repo(
        tmp_path,
        {"infra/run.yaml": bad, "infra/two.yaml": two_jobs, "infra/none.yaml": no_job, "task.yaml": TRAIN_TASK},
    )
    cases = {
        "infra/run.yaml": ["metadata.generateName", "restartPolicy", "command"],
        "infra/two.yaml": ["metadata.labels.jobsup.io/primary"],
        "infra/none.yaml": ["kind"],
    }
    for path, keys in cases.items():
        proc = jobsup(repo, "render", "task.yaml", "--manifest", path, "--run-id", RUN_ID)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        head, *lines = proc.stderr.splitlines()
        assert head.startswith(f"error: {path} breaks the jobsup run contract ({len(keys)} problem"), proc.stderr
        assert len(lines) == len(keys), proc.stderr
        for line, key in zip(lines, keys):
            assert line.startswith(f"  - {path}: "), line
            assert re.search(rf"(^|[ :.]){re.escape(key)}[ :']", line.split(": ", 1)[1]), (key, line)
    config = "kubernetes:\n  pod_config:\n    spec:\n      restartPolicy: OnFailure\n"
    (repo / "cfg.yaml").write_text(config)
    good = (MANIFESTS / "pytorch-gpu.yaml").read_text()
    (repo / "infra" / "good.yaml").write_text(good)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "good")
    proc = jobsup(
        repo, "render", "task.yaml", "--manifest", "infra/good.yaml", "--config", "cfg.yaml", "--run-id", RUN_ID
    )
    assert proc.returncode == 2, proc.stderr
    head, *lines = proc.stderr.splitlines()
    assert head.startswith("error: infra/good.yaml with kubernetes.pod_config merged breaks the jobsup run contract")
    assert lines and all(line.startswith("  - infra/good.yaml: ") and "restartPolicy" in line for line in lines)


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--image", "python:3.12"], "--image does not shape a jobsup run"),
        (["--gpus", "2"], "--gpus does not shape a jobsup run"),
        (["--run-id", "XYZ"], "--run-id"),
        (["--timeout", "soon"], "--timeout"),
    ],
)
def test_bad_flags_are_usage_errors(tmp_path: Path, args: list[str], phrase: str) -> None:
    repo = demo_repo(
        tmp_path, {".jobsup/k8s.yaml": (MANIFESTS / "pytorch-gpu.yaml").read_text(), "task.yaml": TRAIN_TASK}
    )
    proc = jobsup(repo, "render", "task.yaml", *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert phrase in proc.stderr
    if "--image" in args or "--gpus" in args:
        assert "manifest" in proc.stderr


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    repo = demo_repo(tmp_path, {".jobsup/k8s.yaml": (MANIFESTS / "pytorch-gpu.yaml").read_text()})
    proc = jobsup(repo, "render", "--run-id", RUN_ID)
    assert proc.returncode == 2
    assert "no command" in proc.stderr


def test_golden_files_have_no_leftovers() -> None:
    expected = {"pytorch-gpu", "headless-service", "init-volumes", "example-digits"} | {c[0] for c in SANDBOX_CASES}
    assert {p.stem for p in GOLDEN.glob("*.yaml")} == expected


def alias_bomb_manifest() -> str:
    """A valid Job whose annotations hold a "billion laughs": ten levels of
    ten aliases each, 10**10 strings once expanded, in under 2 KB of text."""
    levels = ['    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        levels.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    bomb = "\n".join(levels)
    return (
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: t-{{JOBSUP_RUN}}\n"
        f"spec:\n  bomb:\n{bomb}\n"
        "  template:\n    spec:\n      restartPolicy: Never\n      containers:\n"
        "        - name: main\n          image: python:3.12\n"
        '          command: [bash, -c, "eval \\"$JOBSUP_SCRIPT\\""]\n'
    )


def test_an_alias_bomb_manifest_is_refused_naming_the_file(tmp_path: Path) -> None:
    # A cloned repository's manifest expanding to 10**10 values must not
    # hang render (or exhaust memory): the YAML caps of config files apply.
    text = alias_bomb_manifest()
    assert len(text) < 2000
    repo = demo_repo(tmp_path, {".jobsup/k8s.yaml": text, "task.yaml": TRAIN_TASK})
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "from supervisord.client.cli.main import main; main()", "render", "task.yaml"],
            cwd=repo,
            env=_env(repo.parent),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("jobsup render hung on an alias-bomb manifest")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert ".jobsup/k8s.yaml" in proc.stderr and "expands to more than 200000 values" in proc.stderr


def test_a_recursive_alias_and_an_oversized_manifest_are_refused(tmp_path: Path) -> None:
    from supervisord.shared.exceptions import ManifestError
    from supervisord.shared.manifest.load import parse_manifest

    with pytest.raises(ManifestError, match=r"^m\.yaml: document 1, line \d+.*recursive alias"):
        parse_manifest("apiVersion: v1\nkind: ConfigMap\nmetadata: &m {name: x, self: *m}\n", manifest_path="m.yaml")
    with pytest.raises(ManifestError, match=r"^m\.yaml: \d+ characters is over the limit"):
        parse_manifest("# " + "x" * (4 * 1024 * 1024) + "\n", manifest_path="m.yaml")
