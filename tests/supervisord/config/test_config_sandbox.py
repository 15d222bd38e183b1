"""Validation of the Kubernetes sandbox options (docs/config.md): every
accepted and rejected value class, table-driven, through the same path a
config layer takes (schema + semantic checks, errors with key paths)."""

from __future__ import annotations

from typing import Any

import pytest

from supervisord.shared.config import (
    Layer,
    check_mount_paths,
    effective_config,
    layer_errors,
    pod_ready_timeout_from_env,
)
from supervisord.shared.exceptions import ConfigError

ENV = "JOBSUP_K8S_POD_READY_TIMEOUT_S"


def errors_for(kubernetes: dict[str, Any]) -> list[str]:
    return layer_errors(Layer("user", "/u.yaml", {"kubernetes": kubernetes}))


def tol(**fields: Any) -> dict[str, Any]:
    return {"tolerations": [fields]}


def pvc(*paths: str, claim: str = "data") -> list[dict[str, Any]]:
    return [{"claim_name": claim, "mount_path": p} for p in paths]


def sec(*paths: str, name: str = "creds") -> list[dict[str, Any]]:
    return [{"secret_name": name, "mount_path": p} for p in paths]


# (id, kubernetes mapping, None when accepted / a fragment of the one error)
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    # pod_ready_timeout_s: a positive YAML integer
    ("timeout 90", {"pod_ready_timeout_s": 90}, None),
    ("timeout 1", {"pod_ready_timeout_s": 1}, None),
    ("timeout huge", {"pod_ready_timeout_s": 86400 * 7}, None),
    ("timeout over a week", {"pod_ready_timeout_s": 99999999999999999999999}, "pod_ready_timeout_s"),
    ("timeout 0", {"pod_ready_timeout_s": 0}, "pod_ready_timeout_s: must be a positive integer, got 0"),
    ("timeout negative", {"pod_ready_timeout_s": -5}, "must be a positive integer, got -5"),
    ("timeout string", {"pod_ready_timeout_s": "90"}, "got '90' (a string)"),
    ("timeout float", {"pod_ready_timeout_s": 90.0}, "got 90.0 (a float)"),
    ("timeout bool", {"pod_ready_timeout_s": True}, "got true (a boolean)"),
    # runtime_class: DNS-1123 subdomain
    ("runtime_class kata", {"runtime_class": "kata"}, None),
    ("runtime_class dotted", {"runtime_class": "gvisor.example.com"}, None),
    ("runtime_class with dash", {"runtime_class": "kata-qemu"}, None),
    ("runtime_class uppercase", {"runtime_class": "Kata"}, "'Kata' is not a DNS-1123 subdomain"),
    ("runtime_class underscore", {"runtime_class": "Not_A_DNS_Name"}, "is not a DNS-1123 subdomain"),
    ("runtime_class leading dash", {"runtime_class": "-kata"}, "is not a DNS-1123 subdomain"),
    ("runtime_class double dot", {"runtime_class": "a..b"}, "is not a DNS-1123 subdomain"),
    ("runtime_class trailing dot", {"runtime_class": "kata."}, "is not a DNS-1123 subdomain"),
    ("runtime_class trailing newline", {"runtime_class": "kata\n"}, "is not a DNS-1123 subdomain"),
    ("runtime_class 64-char label", {"runtime_class": "a" * 64}, "is not a DNS-1123 subdomain"),
    (
        "runtime_class too long",
        {"runtime_class": ".".join(["a" * 63] * 4) + ".ab"},
        "a DNS-1123 subdomain has at most 253",
    ),
    ("runtime_class empty", {"runtime_class": ""}, "runtime_class: must not be empty"),
    ("runtime_class not a string", {"runtime_class": 5}, "runtime_class: must be a string"),
    # tolerations
    ("toleration equal", tol(key="gpu", operator="Equal", value="a100", effect="NoSchedule"), None),
    ("toleration default operator", tol(key="example.com/role", value="sandbox"), None),
    ("toleration exists", tol(key="gpu", operator="Exists"), None),
    ("toleration match all", tol(operator="Exists"), None),
    (
        "toleration NoExecute with seconds",
        tol(key="k", operator="Exists", effect="NoExecute", tolerationSeconds=60),
        None,
    ),
    ("toleration PreferNoSchedule", tol(key="k", operator="Exists", effect="PreferNoSchedule"), None),
    ("toleration empty value with Equal", tol(key="k", value=""), None),
    ("toleration no key with Equal", tol(value="x"), "needs `operator: Exists`"),
    ("toleration empty mapping", {"tolerations": [{}]}, "needs `operator: Exists`"),
    ("toleration empty key", tol(key="", operator="Exists"), "tolerations[0].key: must not be empty"),
    ("toleration bad key", tol(key="bad key!", operator="Exists"), "tolerations[0].key: 'bad key!'"),
    ("toleration bad key prefix", tol(key="a/b/c", operator="Exists"), "has a prefix 'a/b'"),
    (
        "toleration exists with value",
        tol(key="k", operator="Exists", value="v"),
        "is not allowed with `operator: Exists`",
    ),
    ("toleration lowercase operator", tol(key="k", operator="exists"), "operator: must be one of Equal, Exists"),
    (
        "toleration bad effect",
        tol(key="k", operator="Exists", effect="NoEvict"),
        "effect: must be one of NoSchedule, PreferNoSchedule, NoExecute",
    ),
    (
        "toleration seconds without NoExecute",
        tol(key="k", operator="Exists", effect="NoSchedule", tolerationSeconds=5),
        "only applies with `effect: NoExecute`",
    ),
    (
        "toleration seconds without effect",
        tol(key="k", operator="Exists", tolerationSeconds=5),
        "only applies with `effect: NoExecute`",
    ),
    (
        "toleration seconds not integer",
        tol(key="k", operator="Exists", effect="NoExecute", tolerationSeconds="5"),
        "tolerationSeconds: must be an integer",
    ),
    (
        "toleration seconds negative",
        tol(key="k", operator="Exists", effect="NoExecute", tolerationSeconds=-1),
        "must be at least 0",
    ),
    (
        "toleration snake_case key",
        tol(key="k", operator="Exists", toleration_seconds=5),
        "toleration_seconds: unknown key",
    ),
    ("toleration bad value", tol(key="k", value="has space"), "value: 'has space' is not a valid label value"),
    ("toleration value trailing newline", tol(key="k", value="abc\n"), "is not a valid label value"),
    ("tolerations not a list", {"tolerations": {"key": "k"}}, "tolerations: must be a list"),
    # node_selector
    ("node_selector plain", {"node_selector": {"pool": "gpu"}}, None),
    ("node_selector prefixed key", {"node_selector": {"cloud.google.com/gke-nodepool": "pool-1"}}, None),
    ("node_selector empty value", {"node_selector": {"k": ""}}, None),
    ("node_selector bad value", {"node_selector": {"k": "a b"}}, "node_selector.k: 'a b' is not a valid label value"),
    ("node_selector long value", {"node_selector": {"k": "v" * 64}}, "a label value has at most 63"),
    ("node_selector bad key", {"node_selector": {"-k": "v"}}, "the key '-k' has a name"),
    ("node_selector long key name", {"node_selector": {"k" * 64: "v"}}, "has a name of 64 characters"),
    ("node_selector bad key prefix", {"node_selector": {"Example.com/k": "v"}}, "has a prefix 'Example.com'"),
    ("node_selector empty key prefix", {"node_selector": {"/k": "v"}}, "has an empty prefix"),
    ("node_selector non-string value", {"node_selector": {"k": 1}}, "node_selector.k: must be a string, got 1"),
    # pvc_mounts / secret_mounts: shapes and names
    ("pvc mount", {"pvc_mounts": pvc("/mnt/data")}, None),
    ("pvc mount writable", {"pvc_mounts": [{"claim_name": "data", "mount_path": "/data", "read_only": False}]}, None),
    ("secret mount", {"secret_mounts": sec("/home/user/.aws")}, None),
    (
        "pvc bad claim name",
        {"pvc_mounts": pvc("/mnt/a", claim="Data_1")},
        "claim_name: 'Data_1' is not a DNS-1123 subdomain",
    ),
    ("pvc missing claim name", {"pvc_mounts": [{"mount_path": "/mnt/a"}]}, "pvc_mounts[0].claim_name: is required"),
    (
        "pvc read_only not bool",
        {"pvc_mounts": [{"claim_name": "d", "mount_path": "/mnt/a", "read_only": "yes"}]},
        "read_only: must be true or false",
    ),
    (
        "secret bad name",
        {"secret_mounts": sec("/mnt/s", name="my_secret")},
        "secret_name: 'my_secret' is not a DNS-1123 subdomain",
    ),
    (
        "secret read_only unknown",
        {"secret_mounts": [{"secret_name": "s", "mount_path": "/s", "read_only": True}]},
        "secret_mounts[0].read_only: unknown key",
    ),
    # mount path rules
    ("mount /srv", {"pvc_mounts": pvc("/srv")}, None),
    ("mount /var/lib/x", {"pvc_mounts": pvc("/var/lib/x")}, None),
    ("mount /libexec (per component)", {"pvc_mounts": pvc("/libexec")}, None),
    ("mount /tmpfs (per component)", {"pvc_mounts": pvc("/tmpfs")}, None),
    ("mount /", {"pvc_mounts": pvc("/")}, "'/' cannot be a mount path"),
    ("mount relative", {"pvc_mounts": pvc("data")}, "must be an absolute path"),
    ("mount trailing slash", {"pvc_mounts": pvc("/dev/shm/")}, "'/dev/shm/' is not normalized"),
    ("mount double slash", {"pvc_mounts": pvc("/dev//shm")}, "'/dev//shm' is not normalized"),
    ("mount leading double slash", {"pvc_mounts": pvc("//mnt")}, "'//mnt' is not normalized"),
    ("mount dotdot", {"pvc_mounts": pvc("/home/user/../etc")}, "'/home/user/../etc' is not normalized"),
    ("mount dot", {"pvc_mounts": pvc("/mnt/./a")}, "is not normalized"),
    ("mount trailing space", {"pvc_mounts": pvc("/mnt/x ")}, "has surrounding whitespace"),
    ("mount leading space", {"secret_mounts": sec(" /mnt/x")}, "has surrounding whitespace"),
    ("mount /tmp", {"pvc_mounts": pvc("/tmp")}, "overlaps the reserved path /tmp"),
    ("mount staging folder", {"pvc_mounts": pvc("/tmp/jobsup-source")}, "overlaps the reserved path /tmp"),
    ("mount /dev/shm", {"pvc_mounts": pvc("/dev/shm")}, "overlaps the reserved path /dev"),
    ("mount /proc/x", {"pvc_mounts": pvc("/proc/x")}, "reserved path /proc"),
    ("mount /etc", {"secret_mounts": sec("/etc")}, "reserved path /etc"),
    ("mount /usr/local/x", {"pvc_mounts": pvc("/usr/local/x")}, "reserved path /usr"),
    ("mount /opt/venv", {"pvc_mounts": pvc("/opt/venv")}, "reserved path /opt"),
    ("mount /run/secrets", {"secret_mounts": sec("/run/secrets")}, "reserved path /run"),
    ("mount /var ancestor", {"pvc_mounts": pvc("/var")}, "overlaps the reserved paths /var/run, /var/lock"),
    (
        "mount token path",
        {"secret_mounts": sec("/var/run/secrets/kubernetes.io/serviceaccount")},
        "reserved paths /var/run, /var/run/secrets/kubernetes.io/serviceaccount",
    ),
    ("mount /boot", {"pvc_mounts": pvc("/boot")}, "reserved path /boot"),
    ("mount /lib64", {"pvc_mounts": pvc("/lib64")}, "reserved path /lib64"),
    (
        "mount duplicate pvc",
        {"pvc_mounts": pvc("/mnt/a", "/mnt/a")},
        "pvc_mounts[1].mount_path: '/mnt/a' is also the mount path of kubernetes.pvc_mounts[0].mount_path",
    ),
    (
        "mount nested pvc",
        {"pvc_mounts": pvc("/mnt/a", "/mnt/a/b")},
        "'/mnt/a/b' and '/mnt/a' (kubernetes.pvc_mounts[0].mount_path) are nested",
    ),
    (
        "mount nested reverse order",
        {"secret_mounts": sec("/mnt/a/b", "/mnt/a")},
        "are nested ('/mnt/a/b' lies under '/mnt/a')",
    ),
    (
        "mount same path pvc and secret",
        {"pvc_mounts": pvc("/data"), "secret_mounts": sec("/data")},
        "secret_mounts[0].mount_path: '/data' is also the mount path of kubernetes.pvc_mounts[0].mount_path",
    ),
    ("mount nested pvc and secret", {"pvc_mounts": pvc("/data"), "secret_mounts": sec("/data/keys")}, "are nested"),
    ("mount siblings fine", {"pvc_mounts": pvc("/mnt/a", "/mnt/ab"), "secret_mounts": sec("/mnt/b")}, None),
    # namespace and custom metadata
    ("namespace ok", {"namespace": "team-a"}, None),
    ("namespace with dot", {"namespace": "team.a"}, "'team.a' is not a DNS-1123 label"),
    (
        "custom label ok",
        {"custom_metadata": {"labels": {"example.com/team": "ml"}, "annotations": {"note": "any text at all"}}},
        None,
    ),
    (
        "custom label bad value",
        {"custom_metadata": {"labels": {"team": "ml team"}}},
        "custom_metadata.labels.team: 'ml team'",
    ),
    (
        "custom annotation bad key",
        {"custom_metadata": {"annotations": {"bad key": "x"}}},
        'annotations."bad key": the key',
    ),
    # the same checks apply inside context_configs
    (
        "context runtime_class checked",
        {"context_configs": {"kind": {"runtime_class": "Bad!"}}},
        "kubernetes.context_configs.kind.runtime_class: 'Bad!'",
    ),
    (
        "context mounts checked",
        {"context_configs": {"kind": {"pvc_mounts": pvc("/tmp/x")}}},
        "context_configs.kind.pvc_mounts[0].mount_path",
    ),
]


@pytest.mark.parametrize("kubernetes,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_sandbox_option(kubernetes: dict[str, Any], expected: str | None) -> None:
    errors = errors_for(kubernetes)
    if expected is None:
        assert errors == []
        return
    assert len(errors) == 1, errors
    assert errors[0].startswith("/u.yaml (user config): kubernetes.")
    assert expected in errors[0]


def test_every_error_at_once() -> None:
    errors = errors_for(
        {
            "pod_ready_timeout_s": 0,
            "runtime_class": "Bad_Class",
            "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}, {"key": "k", "tolerationSeconds": 3}],
            "node_selector": {"k": "bad value"},
            "pvc_mounts": pvc("/dev/shm/", "/mnt/a"),
            "secret_mounts": sec("/mnt/a/b"),
        }
    )
    assert len(errors) == 7


# JOBSUP_K8S_POD_READY_TIMEOUT_S (read only when no layer sets the key)
ENV_CASES: list[tuple[str, int | None]] = [
    ("120", 120),
    ("120.0", 120),
    ("120.9", 120),
    (" 30 ", 30),
    ("1", 1),
    ("1.5", 1),
    ("", None),
    ("   ", None),
    ("abc", None),
    ("0", None),
    ("0.5", None),
    ("-5", None),
    ("inf", None),
    ("nan", None),
    ("1e3", None),
    ("0x10", None),
]


@pytest.mark.parametrize("raw,expected", ENV_CASES, ids=[repr(c[0]) for c in ENV_CASES])
def test_pod_ready_timeout_env(raw: str, expected: int | None) -> None:
    if expected is not None:
        assert pod_ready_timeout_from_env({ENV: raw}) == expected
        assert (
            effective_config(Layer("daemon", None, {}), [], env={ENV: raw}).data["kubernetes"]["pod_ready_timeout_s"]
            == expected
        )
        return
    with pytest.raises(ConfigError) as info:
        pod_ready_timeout_from_env({ENV: raw})
    assert str(info.value).startswith(f"{ENV}: ")


def test_pod_ready_timeout_env_unset() -> None:
    assert pod_ready_timeout_from_env({}) is None


# check_mount_paths: the helper render reuses against the manifest's volumeMounts
MOUNT_HELPER_CASES: list[tuple[list[str], list[str], list[str]]] = [
    (["/mnt/a"], ["/workspace"], []),
    (
        ["/workspace"],
        ["/workspace"],
        ["mount_path[0]: '/workspace' is already a mount path of the manifest's container"],
    ),
    (
        ["/workspace/data"],
        ["/workspace"],
        ["mount_path[0]: '/workspace/data' is nested with the manifest's mount path '/workspace'"],
    ),
    (["/data"], ["/data/cache"], ["mount_path[0]: '/data' is nested with the manifest's mount path '/data/cache'"]),
    (
        ["/mnt/a", "/mnt/a"],
        [],
        ["mount_path[1]: '/mnt/a' is also the mount path of mount_path[0]; mount paths must be unique"],
    ),
]


@pytest.mark.parametrize("paths,existing,expected", MOUNT_HELPER_CASES)
def test_check_mount_paths(paths: list[str], existing: list[str], expected: list[str]) -> None:
    assert check_mount_paths(paths, existing) == expected


@pytest.mark.parametrize("path", ["/data:ro", "/da\x00ta"])
def test_mount_path_with_colon_or_nul_is_refused(path: str) -> None:
    from supervisord.shared.config.sandbox import check_mount_paths

    errors = check_mount_paths([path], [])
    assert errors and "':'" in errors[0]


@pytest.mark.parametrize("value", ["604801", "99999999999999999999"])
def test_timeout_variable_has_a_maximum(value: str) -> None:
    from supervisord.shared.config.sandbox import pod_ready_timeout_from_env
    from supervisord.shared.exceptions import ConfigError

    with pytest.raises(ConfigError, match="maximum"):
        pod_ready_timeout_from_env({"JOBSUP_K8S_POD_READY_TIMEOUT_S": value})
