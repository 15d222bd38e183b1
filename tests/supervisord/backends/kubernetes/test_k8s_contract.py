"""The manifest contract: parse, lint, inject (render_run without a cluster)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from k8s_fixtures import RUN_ID, container, docs_text, env_of, job, render, service

from supervisord.shared.exceptions import ManifestError
from supervisord.shared.manifest.inject import label_value


def errors_of(text: str, **kwargs: Any) -> list[str]:
    with pytest.raises(ManifestError) as info:
        render(text, **kwargs)
    return info.value.errors


# --- injection ---------------------------------------------------------------


def test_single_job_gets_namespace_labels_deadline_ttl_backoff_script_and_secret() -> None:
    run = render(docs_text(job()), namespace="ml")
    assert len(run.objects) == 1
    j = run.primary_job
    assert j is run.objects[0]
    assert run.primary_job_name == f"train-{RUN_ID}"
    assert j["metadata"]["namespace"] == "ml"
    labels = {"jobsup.io/run": RUN_ID, "jobsup.io/project": "My-Project", "jobsup.io/name": "train"}
    assert j["metadata"]["labels"] == labels
    template = j["spec"]["template"]
    assert template["metadata"]["labels"] == labels
    assert template["metadata"]["annotations"] == {"kubectl.kubernetes.io/default-container": "run"}
    assert j["spec"]["activeDeadlineSeconds"] == 14400
    assert j["spec"]["ttlSecondsAfterFinished"] == 86400
    assert j["spec"]["backoffLimit"] == 0
    c = container(j)
    env = env_of(c)
    assert env["JOBSUP_SCRIPT"].startswith("set -euo pipefail\n")
    assert "cd repo\n(\npython train.py\n) &\n" in env["JOBSUP_SCRIPT"]
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONIOENCODING"] == "utf-8"
    assert c["envFrom"] == [{"secretRef": {"name": "jobsup-env", "optional": True}}]
    assert run.script_container == "run"
    assert run.notes == []


def test_timeout_becomes_the_deadline() -> None:
    run = render(docs_text(job()), timeout_s=90)
    assert run.primary_job["spec"]["activeDeadlineSeconds"] == 90


def test_author_deadline_is_kept_but_retries_are_forced_to_zero() -> None:
    run = render(docs_text(job(activeDeadlineSeconds=60, backoffLimit=3, ttlSecondsAfterFinished=5)))
    spec = run.primary_job["spec"]
    assert spec["activeDeadlineSeconds"] == 60
    assert spec["ttlSecondsAfterFinished"] == 5
    assert spec["backoffLimit"] == 0
    assert len(run.notes) == 1
    assert "backoffLimit 3 overridden to 0" in run.notes[0]
    assert f"Job/train-{RUN_ID}" in run.notes[0]


def test_author_backoff_zero_gives_no_note() -> None:
    assert render(docs_text(job(backoffLimit=0))).notes == []


def test_list_with_auxiliary_service_keeps_order_labels_service_and_finds_job() -> None:
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [service(), job()]}, sort_keys=False)
    run = render(text)
    assert [o["kind"] for o in run.objects] == ["Service", "Job"]
    svc = run.objects[0]
    assert svc["metadata"]["labels"]["jobsup.io/run"] == RUN_ID
    assert svc["metadata"]["namespace"] == "default"
    assert svc["spec"]["selector"] == {"jobsup.io/run": RUN_ID}
    assert run.primary_job is run.objects[1]
    assert "envFrom" not in str(svc)  # auxiliary objects get namespace and labels only


def test_separate_documents_work_the_same_as_a_list() -> None:
    from_docs = render(docs_text(service(), job()))
    from_list = render(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [service(), job()]}))
    assert from_docs.objects == from_list.objects
    assert from_docs.primary_job is from_docs.objects[1]


def test_empty_documents_are_skipped() -> None:
    run = render("---\n---\n" + docs_text(job()) + "---\n")
    assert len(run.objects) == 1


def test_python_env_defaulted_but_author_value_wins_never_duplicated() -> None:
    doc = job()
    container(doc)["env"] = [{"name": "PYTHONUNBUFFERED", "value": "0"}, {"name": "FOO", "value": "1"}]
    env = env_of(container(render(docs_text(doc)).primary_job))
    assert env["PYTHONUNBUFFERED"] == "0"
    assert env["PYTHONIOENCODING"] == "utf-8"
    assert env["FOO"] == "1"


def test_author_python_env_from_a_reference_counts_as_set() -> None:
    doc = job()
    container(doc)["env"] = [
        {"name": "PYTHONIOENCODING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "enc"}}}
    ]
    c = container(render(docs_text(doc)).primary_job)
    assert [e["name"] for e in c["env"]].count("PYTHONIOENCODING") == 1


def test_author_script_value_is_replaced_and_secret_reference_not_duplicated() -> None:
    doc = job()
    container(doc)["env"] = [
        {"name": "JOBSUP_SCRIPT", "value": "evil"},
        {"name": "FOO", "value": "1"},
        {"name": "JOBSUP_SCRIPT", "value": "evil2"},
    ]
    container(doc)["envFrom"] = [{"secretRef": {"name": "jobsup-env"}}, {"configMapRef": {"name": "x"}}]
    run = render(docs_text(doc))
    c = container(run.primary_job)
    names = [e["name"] for e in c["env"]]
    assert names == ["FOO", "JOBSUP_SCRIPT", "PYTHONUNBUFFERED", "PYTHONIOENCODING"]
    assert "evil" not in str(c["env"])
    assert c["envFrom"] == [{"secretRef": {"name": "jobsup-env"}}, {"configMapRef": {"name": "x"}}]
    assert any("JOBSUP_SCRIPT env entry is replaced" in n for n in run.notes)


def test_secret_reference_goes_on_every_container_of_the_primary_job_only() -> None:
    doc = job()
    pod = doc["spec"]["template"]["spec"]
    pod["containers"].append({"name": "sidecar", "image": "busybox", "command": ["sleep", "inf"]})
    pod["initContainers"] = [{"name": "fetch", "image": "busybox", "command": ["true"]}]
    other = job("other-{{JOBSUP_RUN}}")
    doc["metadata"]["labels"] = {"jobsup.io/primary": "true"}
    run = render(docs_text(doc, other))
    ref = [{"secretRef": {"name": "jobsup-env", "optional": True}}]
    j = run.primary_job
    assert [c["envFrom"] for c in j["spec"]["template"]["spec"]["containers"]] == [ref, ref]
    assert j["spec"]["template"]["spec"]["initContainers"][0]["envFrom"] == ref
    # the script and Python env only on the script container
    assert "env" not in j["spec"]["template"]["spec"]["containers"][1]
    # the other Job is auxiliary: labels and namespace only
    aux = run.objects[1]
    assert "envFrom" not in container(aux)
    assert "backoffLimit" not in aux["spec"]
    assert aux["metadata"]["labels"]["jobsup.io/run"] == RUN_ID


def test_run_labels_overwrite_author_labels_and_keep_others() -> None:
    doc = job()
    doc["metadata"]["labels"] = {"jobsup.io/run": "forged", "team": "nlp"}
    labels = render(docs_text(doc)).primary_job["metadata"]["labels"]
    assert labels["jobsup.io/run"] == RUN_ID
    assert labels["team"] == "nlp"


def test_token_replaced_everywhere() -> None:
    doc = job()
    doc["metadata"]["annotations"] = {"note": "run {{JOBSUP_RUN}}"}
    container(doc)["args"] = ["--out", "/out/{{JOBSUP_RUN}}"]
    container(doc)["env"] = [{"name": "RUN", "value": "{{JOBSUP_RUN}}{{JOBSUP_RUN}}"}]
    run = render(docs_text(service(), doc))
    text = yaml.safe_dump(run.objects)
    assert "{{JOBSUP_RUN}}" not in text
    assert "JOBSUP_RUN" not in text
    assert run.objects[0]["metadata"]["name"] == f"rendezvous-{RUN_ID}"
    assert container(run.primary_job)["args"] == ["--out", f"/out/{RUN_ID}"]
    assert env_of(container(run.primary_job))["RUN"] == RUN_ID * 2
    assert run.primary_job["metadata"]["annotations"]["note"] == f"run {RUN_ID}"


def test_fixed_names_get_a_note_about_reruns() -> None:
    run = render(docs_text(job("train")))
    assert any("Job/train" in n and "AlreadyExists" in n for n in run.notes)


def test_dollar_paren_reference_is_accepted() -> None:
    doc = job()
    container(doc)["command"] = ["bash", "-c", "$(JOBSUP_SCRIPT)"]
    assert render(docs_text(doc)).script_container == "run"


def test_reference_in_command_and_args_of_one_container_counts_once() -> None:
    doc = job()
    container(doc)["command"] = ["bash", "-c", 'eval "$JOBSUP_SCRIPT"', "--"]
    container(doc)["args"] = ["JOBSUP_SCRIPT"]
    assert render(docs_text(doc)).script_container == "run"


def test_script_container_need_not_be_the_first() -> None:
    doc = job()
    pod = doc["spec"]["template"]["spec"]
    pod["containers"].insert(0, {"name": "proxy", "image": "envoy", "args": ["--x"]})
    run = render(docs_text(doc))
    assert run.script_container == "run"
    annotations = run.primary_job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/default-container"] == "run"
    assert "JOBSUP_SCRIPT" in env_of(container(run.primary_job, 1))
    assert "env" not in container(run.primary_job, 0)


def test_author_namespace_equal_to_the_configured_one_is_fine() -> None:
    doc = job()
    doc["metadata"]["namespace"] = "ml"
    assert render(docs_text(doc), namespace="ml").primary_job["metadata"]["namespace"] == "ml"


def test_label_values_are_sanitized() -> None:
    assert label_value("My Project!") == "My-Project"
    assert label_value("ok_name.v1") == "ok_name.v1"
    assert label_value("--x--") == "x"
    assert label_value("é") == ""
    long = label_value("a" * 62 + "-b" + "c" * 10)
    assert len(long) <= 63 and long[-1].isalnum()


# --- lint ----------------------------------------------------------------------


def test_no_job_is_an_error() -> None:
    errors = errors_of(docs_text(service()))
    assert len(errors) == 1
    assert "no batch/v1 Job" in errors[0]


def test_two_jobs_need_the_primary_label() -> None:
    a, b = job("a-{{JOBSUP_RUN}}"), job("b-{{JOBSUP_RUN}}")
    errors = errors_of(docs_text(a, b))
    assert any('jobsup.io/primary: "true"' in e and "2 Jobs" in e for e in errors)
    b["metadata"]["labels"] = {"jobsup.io/primary": "true"}
    run = render(docs_text(a, b))
    assert run.primary_job_name == f"b-{RUN_ID}"
    assert run.objects[0]["spec"].get("backoffLimit") is None


def test_two_primary_labels_are_an_error() -> None:
    a, b = job("a-{{JOBSUP_RUN}}"), job("b-{{JOBSUP_RUN}}")
    for d in (a, b):
        d["metadata"]["labels"] = {"jobsup.io/primary": "true"}
    errors = errors_of(docs_text(a, b))
    assert any("2 Jobs are labelled" in e for e in errors)


def test_unquoted_label_value_is_an_error_naming_the_fix() -> None:
    a, b = job("a-{{JOBSUP_RUN}}"), job("b-{{JOBSUP_RUN}}")
    b["metadata"]["labels"] = {"jobsup.io/primary": True}
    errors = errors_of(docs_text(a, b))
    assert any('quote it: jobsup.io/primary: "true"' in e for e in errors)


def test_job_must_reference_the_script() -> None:
    doc = job()
    container(doc)["command"] = ["python", "train.py"]
    errors = errors_of(docs_text(doc))
    assert len(errors) == 1
    assert "no container references JOBSUP_SCRIPT" in errors[0]
    assert 'eval \\"$JOBSUP_SCRIPT\\"' in errors[0]


def test_two_script_containers_are_an_error() -> None:
    doc = job()
    doc["spec"]["template"]["spec"]["containers"].append(
        {"name": "second", "image": "x", "command": ["bash", "-c", 'eval "$JOBSUP_SCRIPT"']}
    )
    errors = errors_of(docs_text(doc))
    assert any("2 containers reference JOBSUP_SCRIPT ('run', 'second')" in e for e in errors)


@pytest.mark.parametrize("bare", ["$JOBSUP_SCRIPT", "${JOBSUP_SCRIPT}", ' "$JOBSUP_SCRIPT" '])
def test_bare_reference_is_an_error_naming_eval(bare: str) -> None:
    doc = job()
    container(doc)["command"] = ["bash", "-c"]
    container(doc)["args"] = [bare]
    errors = errors_of(docs_text(doc))
    assert len(errors) == 1
    assert "bare argument" in errors[0]
    assert "eval" in errors[0]
    assert "container 'run'" in errors[0]


def test_generate_name_is_an_error() -> None:
    doc = job()
    doc["metadata"] = {"generateName": "train-"}
    errors = errors_of(docs_text(doc))
    assert len(errors) == 1
    assert "generateName" in errors[0] and "metadata.name" in errors[0]
    assert errors[0].startswith(".jobsup/k8s.yaml: Job #1: metadata.generateName")


def test_missing_name_is_an_error() -> None:
    svc = service()
    del svc["metadata"]["name"]
    errors = errors_of(docs_text(svc, job()))
    assert errors == [
        ".jobsup/k8s.yaml: Service #1: metadata.name is missing; every object needs one (use {{JOBSUP_RUN}} in it to keep "
        "names unique per run, e.g. train-{{JOBSUP_RUN}})"
    ]


def test_foreign_namespace_is_an_error() -> None:
    doc = job()
    doc["metadata"]["namespace"] = "other"
    errors = errors_of(docs_text(doc), namespace="ml")
    assert len(errors) == 1
    assert "'other'" in errors[0] and "'ml'" in errors[0] and "remove metadata.namespace" in errors[0]


@pytest.mark.parametrize(
    ("field", "value", "phrase"),
    [
        ("parallelism", 2, "spec.parallelism is 2"),
        ("completions", 4, "spec.completions is 4"),
        ("completions", 0, "spec.completions is 0"),
        ("completionMode", "Indexed", "completionMode Indexed"),
    ],
)
def test_parallel_and_indexed_jobs_are_rejected(field: str, value: Any, phrase: str) -> None:
    errors = errors_of(docs_text(job(**{field: value})))
    assert len(errors) == 1
    assert phrase in errors[0]
    assert "one pod" in errors[0]


def test_explicit_single_pod_values_are_fine() -> None:
    render(docs_text(job(parallelism=1, completions=1, completionMode="NonIndexed")))


@pytest.mark.parametrize("policy", ["OnFailure", None])
def test_restart_policy_must_be_never(policy: str | None) -> None:
    doc = job()
    if policy is None:
        del doc["spec"]["template"]["spec"]["restartPolicy"]
    else:
        doc["spec"]["template"]["spec"]["restartPolicy"] = policy
    errors = errors_of(docs_text(doc))
    assert len(errors) == 1
    assert "restartPolicy" in errors[0] and "set it to Never" in errors[0]


def test_missing_api_version_and_kind_and_cluster_scoped_kinds() -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}
    bare = {"metadata": {"name": "x"}}
    errors = errors_of(docs_text(ns, role, bare, job()))
    assert any(e.startswith(".jobsup/k8s.yaml: Namespace/scratch: kind Namespace is cluster-scoped") for e in errors)
    assert any(e.startswith(".jobsup/k8s.yaml: ClusterRole/r: kind ClusterRole is cluster-scoped") for e in errors)
    assert any(e.startswith(".jobsup/k8s.yaml: object/x: apiVersion is missing") for e in errors)
    assert any(e.startswith(".jobsup/k8s.yaml: object/x: kind is missing") for e in errors)
    assert len(errors) == 4


def test_all_violations_are_reported_at_once() -> None:
    doc = job(parallelism=3)
    doc["metadata"]["namespace"] = "elsewhere"
    doc["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    container(doc)["command"] = ["bash", "-c", "$JOBSUP_SCRIPT"]
    svc = service()
    svc["metadata"] = {"generateName": "svc-"}
    with pytest.raises(ManifestError) as info:
        render(docs_text(svc, doc))
    errors = info.value.errors
    assert len(errors) == 5, errors
    message = str(info.value)
    assert "(5 problems)" in message
    for e in errors:
        assert e in message


def test_yaml_error_names_document_and_line() -> None:
    text = docs_text(service()) + "---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: [unclosed\n"
    with pytest.raises(ManifestError) as info:
        render(text)
    message = str(info.value)
    assert message.startswith(".jobsup/k8s.yaml: document 2, line ")
    assert "not valid YAML" in message


def test_duplicate_keys_are_an_error_naming_lines() -> None:
    text = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: a\n  name: b\n"
    with pytest.raises(ManifestError) as info:
        render(text)
    assert "document 1, line 5" in str(info.value)
    assert "duplicate key 'name' (first given on line 4)" in str(info.value)


def test_dates_stay_strings() -> None:
    doc = job()
    doc["metadata"]["annotations"] = {"created": "2024-01-01"}
    text = docs_text(doc).replace("'2024-01-01'", "2024-01-01")
    assert "created: 2024-01-01\n" in text
    assert render(text).primary_job["metadata"]["annotations"]["created"] == "2024-01-01"


def test_non_mapping_document_and_empty_manifest() -> None:
    with pytest.raises(ManifestError, match="document 1 is a list"):
        render("- a\n- b\n")
    with pytest.raises(ManifestError, match="contains no Kubernetes objects"):
        render("---\n# nothing\n")


def test_bad_run_id_is_rejected() -> None:
    from supervisord.daemon.backends.kubernetes import render_run

    with pytest.raises(ManifestError, match="12 lowercase hex"):
        render_run(
            docs_text(job()),
            run_id="ABC",
            project="p",
            name="n",
            command="true",
            namespace="default",
            timeout_s=10,
            staging_timeout_s=10,
            kube_config={},
            manifest_path="k.yaml",
        )


def test_render_is_deterministic_and_does_not_share_state() -> None:
    text = docs_text(service(), job())
    first, second = render(text), render(text)
    assert first.objects == second.objects
    first.objects[0]["metadata"]["name"] = "changed"
    assert second.objects[0]["metadata"]["name"] == f"rendezvous-{RUN_ID}"
