"""Config applied at render: pod_config patch, custom_metadata, sandbox options."""

from __future__ import annotations

from typing import Any

import pytest
from k8s_fixtures import RUN_ID, container, docs_text, env_of, job, render, service

from supervisord.shared.exceptions import ConfigError, ManifestError


def pod_of(doc: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = doc["spec"]["template"]["spec"]
    return pod


# --- nothing when unset -------------------------------------------------------------


@pytest.mark.parametrize(
    "kube_config",
    [
        {},
        {"namespace": "default", "context": "x", "pod_ready_timeout_s": 90},
        {"runtime_class": None, "tolerations": [], "node_selector": {}, "pvc_mounts": [], "secret_mounts": []},
        {"pod_config": {}, "custom_metadata": {}},
    ],
)
def test_unset_options_change_nothing(kube_config: dict[str, Any]) -> None:
    text = docs_text(service(), job())
    assert render(text, kube_config=kube_config).objects == render(text).objects


# --- pod_config ----------------------------------------------------------------------------


def test_pod_config_is_merged_with_the_manifest_lowest() -> None:
    doc = job()
    pod_of(doc)["nodeSelector"] = {"pool": "a"}
    container(doc)["env"] = [{"name": "A", "value": "manifest"}, {"name": "B", "value": "manifest"}]
    pod_config = {
        "metadata": {"labels": {"cost-center": "ml"}},
        "spec": {
            "nodeSelector": {"pool": "b", "zone": "z1"},
            "containers": [{"name": "run", "env": [{"name": "B", "value": "config"}, {"name": "C", "value": "3"}]}],
            "imagePullSecrets": [{"name": "regcred"}],
        },
    }
    run = render(docs_text(doc), kube_config={"pod_config": pod_config})
    template = run.primary_job["spec"]["template"]
    assert template["metadata"]["labels"]["cost-center"] == "ml"
    assert template["metadata"]["labels"]["jobsup.io/run"] == RUN_ID
    pod = template["spec"]
    assert pod["nodeSelector"] == {"pool": "b", "zone": "z1"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    env = env_of(container(run.primary_job))
    assert env["A"] == "manifest" and env["B"] == "config" and env["C"] == "3"
    assert "JOBSUP_SCRIPT" in env


def test_pod_config_cannot_override_the_contract() -> None:
    pod_config = {"spec": {"containers": [{"name": "run", "env": [{"name": "JOBSUP_SCRIPT", "value": "x"}]}]}}
    run = render(docs_text(job()), kube_config={"pod_config": pod_config})
    assert env_of(container(run.primary_job))["JOBSUP_SCRIPT"].startswith("set -euo pipefail")


def test_pod_config_that_breaks_the_contract_is_an_error() -> None:
    pod_config = {"spec": {"restartPolicy": "OnFailure"}}
    with pytest.raises(ManifestError) as info:
        render(docs_text(job()), kube_config={"pod_config": pod_config})
    assert len(info.value.errors) == 1
    assert "restartPolicy" in info.value.errors[0]
    assert "kubernetes.pod_config" in info.value.errors[0]


def test_pod_config_kind_conflict_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        render(docs_text(job()), kube_config={"pod_config": {"spec": {"containers": {"name": "run"}}}})


def test_pod_config_only_touches_the_primary_job() -> None:
    other = job("other-{{JOBSUP_RUN}}")
    primary = job()
    primary["metadata"]["labels"] = {"jobsup.io/primary": "true"}
    run = render(docs_text(other, primary), kube_config={"pod_config": {"spec": {"nodeSelector": {"a": "b"}}}})
    assert "nodeSelector" not in pod_of(run.objects[0])
    assert pod_of(run.objects[1])["nodeSelector"] == {"a": "b"}


# --- custom_metadata ---------------------------------------------------------------------


def test_custom_metadata_goes_on_every_object_and_the_pod_template() -> None:
    custom = {"labels": {"team": "nlp"}, "annotations": {"owner": "me@example.com"}}
    doc = job()
    doc["metadata"]["labels"] = {"team": "manifest"}
    run = render(docs_text(service(), doc), kube_config={"custom_metadata": custom})
    for meta in [o["metadata"] for o in run.objects] + [run.primary_job["spec"]["template"]["metadata"]]:
        assert meta["labels"]["team"] == "nlp"
        assert meta["labels"]["jobsup.io/run"] == RUN_ID
        assert meta["annotations"]["owner"] == "me@example.com"


def test_custom_metadata_may_not_set_jobsup_labels() -> None:
    with pytest.raises(ConfigError, match="jobsup.io/run"):
        render(docs_text(job()), kube_config={"custom_metadata": {"labels": {"jobsup.io/run": "x"}}})


# --- sandbox options --------------------------------------------------------------------


def test_runtime_class_tolerations_and_node_selector() -> None:
    doc = job()
    pod_of(doc)["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    pod_of(doc)["nodeSelector"] = {"pool": "a", "arch": "amd64"}
    config = {
        "runtime_class": "kata",
        "tolerations": [
            {"key": "gpu", "operator": "Exists"},
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        ],
        "node_selector": {"pool": "b", "zone": "z1"},
    }
    run = render(docs_text(doc), kube_config=config)
    pod = pod_of(run.primary_job)
    assert pod["runtimeClassName"] == "kata"
    assert pod["tolerations"] == [
        {"key": "gpu", "operator": "Exists"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
    ]
    assert pod["nodeSelector"] == {"pool": "b", "arch": "amd64", "zone": "z1"}
    assert any("nodeSelector pool='a' replaced" in n for n in run.notes)


def test_pvc_and_secret_mounts_go_on_the_script_container_only() -> None:
    doc = job()
    pod = pod_of(doc)
    pod["initContainers"] = [{"name": "init", "image": "busybox", "command": ["true"]}]
    pod["containers"].insert(0, {"name": "side", "image": "busybox", "command": ["sleep", "inf"]})
    config = {
        "pvc_mounts": [
            {"claim_name": "datasets", "mount_path": "/data"},
            {"claim_name": "scratch", "mount_path": "/scratch", "read_only": False},
        ],
        "secret_mounts": [{"secret_name": "hf-token", "mount_path": "/secrets/hf"}],
    }
    run = render(docs_text(doc), kube_config=config)
    pod = pod_of(run.primary_job)
    assert pod["volumes"] == [
        {"name": "jobsup-pvc-0", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
        {"name": "jobsup-pvc-1", "persistentVolumeClaim": {"claimName": "scratch", "readOnly": False}},
        {"name": "jobsup-secret-0", "secret": {"secretName": "hf-token", "optional": False}},
    ]
    assert container(run.primary_job, 1)["volumeMounts"] == [
        {"name": "jobsup-pvc-0", "mountPath": "/data", "readOnly": True},
        {"name": "jobsup-pvc-1", "mountPath": "/scratch", "readOnly": False},
        {"name": "jobsup-secret-0", "mountPath": "/secrets/hf", "readOnly": True},
    ]
    assert "volumeMounts" not in container(run.primary_job, 0)
    assert "volumeMounts" not in pod["initContainers"][0]


def test_generated_volume_names_avoid_the_manifests_own() -> None:
    doc = job()
    pod_of(doc)["volumes"] = [{"name": "jobsup-pvc-0", "emptyDir": {}}, {"name": "jobsup-pvc-0-1", "emptyDir": {}}]
    container(doc)["volumeMounts"] = [{"name": "jobsup-pvc-0", "mountPath": "/cache"}]
    run = render(docs_text(doc), kube_config={"pvc_mounts": [{"claim_name": "d", "mount_path": "/data"}]})
    names = [v["name"] for v in pod_of(run.primary_job)["volumes"]]
    assert names == ["jobsup-pvc-0", "jobsup-pvc-0-1", "jobsup-pvc-0-2"]
    assert container(run.primary_job)["volumeMounts"][-1]["name"] == "jobsup-pvc-0-2"


def test_mount_path_colliding_with_the_manifests_mount_is_a_manifest_error() -> None:
    doc = job()
    pod_of(doc)["volumes"] = [{"name": "cache", "emptyDir": {}}]
    container(doc)["volumeMounts"] = [{"name": "cache", "mountPath": "/data"}]
    with pytest.raises(ManifestError) as info:
        render(docs_text(doc), kube_config={"secret_mounts": [{"secret_name": "s", "mount_path": "/data"}]})
    assert len(info.value.errors) == 1
    assert "/data" in info.value.errors[0]
    assert f"Job/train-{RUN_ID} container 'run'" in info.value.errors[0]


def test_badly_shaped_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"kubernetes.pvc_mounts\[0\].claim_name"):
        render(docs_text(job()), kube_config={"pvc_mounts": [{"mount_path": "/d"}]})
    with pytest.raises(ConfigError, match="kubernetes.tolerations must be a list"):
        render(docs_text(job()), kube_config={"tolerations": {"key": "x"}})
