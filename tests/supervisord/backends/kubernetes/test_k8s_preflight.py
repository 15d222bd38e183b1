"""Preflight on the simulated cluster: kubeconfig, API server, RBAC through
SelfSubjectAccessReview, referenced Secrets/PVCs/RuntimeClasses; one line per
problem, nothing created, successes cached briefly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisord.daemon.backends.base import RunSpec
from supervisord.daemon.backends.kubernetes import KubernetesBackend
from supervisord.shared.exceptions import ManifestError, PreflightError
from supervisord.shared.source import resolve_commit
from tests.k8s_sim import AccessRule, SimCluster
from tests.supervisord.backends.kubernetes.k8s_backend_helpers import (
    MANIFEST_PATH,
    job_manifest,
    kube_config,
    make_backend,
    run_objects,
    sim_cluster,
)
from tests.supervisord.jobsup_env import make_repo

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

RUN_ID = "aa11bb22cc33"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    with sim_cluster(tmp_path_factory.mktemp("sim")) as cluster:
        cluster.create_secret("present-secret", {"k": "v"})
        cluster.create_pvc("present-claim")
        cluster.create_pvc("pending-claim", phase="Pending")
        cluster.create_runtime_class("gvisor")
        yield cluster


@pytest.fixture(autouse=True)
def open_access(sim: SimCluster) -> Iterator[None]:
    yield
    sim.set_access_rules([AccessRule()], enforce=False)


@pytest.fixture
async def backend(sim: SimCluster) -> AsyncIterator[KubernetesBackend]:
    b = make_backend(sim, preflight_cache_s=30.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(b.serve)
        yield b
        tg.cancel_scope.cancel()
    await b.aclose()


def spec(tmp_path: Path, sim: SimCluster, manifest: str, **kube: Any) -> RunSpec:
    repo = tmp_path / "repo"
    commit = resolve_commit(make_repo(repo, {MANIFEST_PATH: manifest, "x.txt": "x\n"}), "HEAD")
    config = kube_config(sim, **kube)
    return RunSpec(
        run_id=RUN_ID,
        project="p",
        name="t",
        backend="kubernetes",
        command="echo hi",
        timeout_s=60,
        env={},
        config=config,
        snapshot=tmp_path / "none.tar",
        snapshot_sha256="",
        commit=commit,
        repo=str(repo),
        run_dir=tmp_path / "run",
        submitted={"manifest": MANIFEST_PATH, "config": config},
        manifest=MANIFEST_PATH,
    )


def nothing_created(sim: SimCluster) -> bool:
    return not any(run_objects(sim, RUN_ID, r) for r in ("jobs.batch", "secrets", "configmaps", "pods"))


async def test_preflight_passes_and_is_cached(tmp_path: Path, sim: SimCluster, backend: KubernetesBackend) -> None:
    s = spec(tmp_path, sim, job_manifest())
    before = sim.requests_served
    assert await backend.preflight(s) == []
    first = sim.requests_served - before
    before = sim.requests_served
    await backend.preflight(s)
    assert sim.requests_served - before < first / 3, "the second preflight should use the cached answers"
    assert nothing_created(sim)


async def test_broken_manifest_is_refused_at_preflight(
    tmp_path: Path, sim: SimCluster, backend: KubernetesBackend
) -> None:
    with pytest.raises(ManifestError) as err:
        await backend.preflight(spec(tmp_path, sim, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"))
    assert "Job" in str(err.value)
    assert nothing_created(sim)


async def test_unknown_context_names_the_kubeconfig(
    tmp_path: Path, sim: SimCluster, backend: KubernetesBackend
) -> None:
    with pytest.raises(PreflightError) as err:
        await backend.preflight(spec(tmp_path, sim, job_manifest(), context="no-such-context"))
    assert "no-such-context" in str(err.value) and str(sim.kubeconfig_path) in str(err.value)
    assert "jobsup-sim" in str(err.value)  # the contexts that exist


async def test_a_refused_token_is_named_as_such(tmp_path: Path, sim: SimCluster) -> None:
    import yaml

    doc = yaml.safe_load(sim.kubeconfig_path.read_text())
    for user in doc["users"]:
        if "token" in user["user"]:
            user["user"]["token"] = "not-the-token"
    bad = tmp_path / "bad-kubeconfig"
    bad.write_text(yaml.safe_dump(doc))
    b = make_backend(sim, kubeconfig=str(bad))
    try:
        with pytest.raises(PreflightError) as err:
            await b.preflight(spec(tmp_path, sim, job_manifest(), context="jobsup-sim"))
        assert "refused the credentials" in str(err.value) and "401" in str(err.value)
    finally:
        await b.aclose()


async def test_missing_permissions_are_one_line_each(
    tmp_path: Path, sim: SimCluster, backend: KubernetesBackend
) -> None:
    # Everything but exec and secrets updates.
    sim.set_access_rules(
        [
            AccessRule(groups=("batch",)),
            AccessRule(verbs=("get", "list", "watch"), groups=("",), resources=("pods", "pods/log")),
            AccessRule(verbs=("create", "get"), groups=("",), resources=("secrets",)),
        ]
    )
    with pytest.raises(PreflightError) as err:
        await backend.preflight(spec(tmp_path, sim, job_manifest()))
    problems = err.value.problems
    assert len(problems) == 2, problems
    assert any("create pods/exec" in p and 'resources: ["pods/exec"]' in p for p in problems)
    assert any("update secrets" in p for p in problems)
    assert nothing_created(sim)


async def test_missing_secret_pvc_and_runtime_class(
    tmp_path: Path, sim: SimCluster, backend: KubernetesBackend
) -> None:
    volumes = [
        {"name": "a", "secret": {"secretName": "absent-secret"}},
        {"name": "b", "secret": {"secretName": "optional-secret", "optional": True}},
        {"name": "c", "secret": {"secretName": "present-secret"}},
    ]
    env = [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent-too", "key": "k"}}}]
    s = spec(
        tmp_path,
        sim,
        job_manifest(volumes=volumes, env=env),
        runtime_class="no-such-runtime",
        pvc_mounts=[
            {"claim_name": "absent-claim", "mount_path": "/data"},
            {"claim_name": "present-claim", "mount_path": "/ok"},
        ],
    )
    with pytest.raises(PreflightError) as err:
        await backend.preflight(s)
    problems = err.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    for name in ("absent-secret", "absent-too", "absent-claim", "no-such-runtime"):
        assert name in text
    assert "optional-secret" not in text and "present-secret" not in text and "present-claim" not in text
    assert nothing_created(sim)


async def test_objects_the_manifest_creates_are_not_required(
    tmp_path: Path, sim: SimCluster, backend: KubernetesBackend
) -> None:
    own = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "own-{{JOBSUP_RUN}}"}, "stringData": {"k": "v"}}]
    volumes = [{"name": "a", "secret": {"secretName": "own-{{JOBSUP_RUN}}"}}]
    assert await backend.preflight(spec(tmp_path, sim, job_manifest(volumes=volumes, extra_docs=own))) == []


async def test_runtime_class_forbidden_is_a_warning_and_pending_pvc_too(
    tmp_path: Path, sim: SimCluster, backend: KubernetesBackend
) -> None:
    sim.set_access_rules([AccessRule(groups=("", "batch"))], enforce=True)
    s = spec(
        tmp_path,
        sim,
        job_manifest(),
        runtime_class="gvisor",
        pvc_mounts=[{"claim_name": "pending-claim", "mount_path": "/d"}],
    )
    warnings = await backend.preflight(s)
    assert any("RuntimeClass gvisor" in w and "forbidden" in w for w in warnings), warnings
    assert any("pending-claim" in w and "Pending" in w for w in warnings), warnings
    assert nothing_created(sim)


async def test_a_hung_api_server_fails_preflight_in_bounded_time(tmp_path: Path, sim: SimCluster) -> None:
    # Not refused, never answered: preflight gives up with the one line
    # that says so, well before a user would think submit froze.
    b = make_backend(sim)
    await anyio.to_thread.run_sync(sim.hang)
    try:
        started = anyio.current_time()
        with pytest.raises(PreflightError) as err:
            await b.preflight(spec(tmp_path, sim, job_manifest()))
        took = anyio.current_time() - started
        assert "does not answer" in str(err.value), err.value
        assert took < 25, f"preflight took {took:.1f}s against a hung API server"
    finally:
        await anyio.to_thread.run_sync(sim.restart)
        await b.aclose()
    assert nothing_created(sim)


# -------------------------------------- doctor: nothing read from the user's home


async def test_doctor_uses_the_kubeconfig_it_is_given_not_the_home(
    tmp_path: Path, sim: SimCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon resolves the kubeconfig and the config doctor checks; the
    # backend must not read ~/.kube/config (here broken) or KUBECONFIG.
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("clusters: [unclosed\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("JOBSUP_DAEMON_CONFIG", raising=False)
    monkeypatch.delenv("JOBSUP_CONFIG", raising=False)
    b = make_backend(sim)
    try:
        checks = await b.doctor()
    finally:
        await b.aclose()
    assert checks and all(c["ok"] for c in checks), checks
    names = {c["name"]: c for c in checks}
    assert str(sim.kubeconfig_path) in names["kubeconfig"]["detail"]


async def test_doctor_checks_the_context_and_namespace_the_daemon_gives(tmp_path: Path, sim: SimCluster) -> None:
    b = make_backend(sim, doctor_config=lambda: {"context": "no-such-context", "namespace": sim.namespace})
    try:
        checks = await b.doctor()
    finally:
        await b.aclose()
    assert [c["name"] for c in checks] == ["kubeconfig"] and not checks[0]["ok"]
    assert "no-such-context" in checks[0]["detail"]


def test_the_kubernetes_backend_reads_nothing_from_the_home_or_the_environment_s_kubeconfig() -> None:
    # Everything it needs arrives through RunSpec or its constructor: no
    # Path.home(), no expanduser(), no KUBECONFIG, no config layers read.
    import ast

    import supervisord.daemon.backends.kubernetes as pkg

    root = Path(pkg.__file__).parent
    forbidden_names = {"home", "expanduser", "load_client_layers", "load_daemon_layer", "current_kube_context"}
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in forbidden_names:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
            if isinstance(node, ast.Constant) and node.value == "KUBECONFIG":
                found.append(f"{path.relative_to(root)}:{node.lineno}: the KUBECONFIG variable")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("supervisord.shared.config.sources"):
                found.append(f"{path.relative_to(root)}:{node.lineno}: imports {node.module}")
    assert found == []
