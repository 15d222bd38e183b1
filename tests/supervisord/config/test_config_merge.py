"""Merge rules and the pod-spec patch (docs/config.md): table-driven."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from supervisord.shared.config.layer import Layer
from supervisord.shared.config.merge import merge, merge_layers, merge_pod_spec
from supervisord.shared.exceptions import ConfigError

C = "containers"


def pod(**spec: Any) -> dict[str, Any]:
    return {"spec": spec}


# (id, base, patch, expected) for merge_pod_spec
POD_CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    (
        "containers merge on name",
        pod(containers=[{"name": "main", "image": "a", "resources": {"limits": {"cpu": "1"}}}]),
        pod(containers=[{"name": "main", "resources": {"limits": {"memory": "1Gi"}}}]),
        pod(containers=[{"name": "main", "image": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]),
    ),
    (
        "unmatched container appended, order kept",
        pod(containers=[{"name": "main", "image": "a"}]),
        pod(containers=[{"name": "side", "image": "b"}, {"name": "main", "image": "c"}]),
        pod(containers=[{"name": "main", "image": "c"}, {"name": "side", "image": "b"}]),
    ),
    (
        "initContainers merge on name",
        pod(initContainers=[{"name": "i", "image": "a"}]),
        pod(initContainers=[{"name": "i", "image": "b"}, {"name": "j", "image": "c"}]),
        pod(initContainers=[{"name": "i", "image": "b"}, {"name": "j", "image": "c"}]),
    ),
    (
        "ephemeralContainers merge on name",
        pod(ephemeralContainers=[{"name": "dbg", "image": "a"}]),
        pod(ephemeralContainers=[{"name": "dbg", "tty": True}]),
        pod(ephemeralContainers=[{"name": "dbg", "image": "a", "tty": True}]),
    ),
    (
        "volumes merge on name",
        pod(volumes=[{"name": "data", "emptyDir": {}}]),
        pod(volumes=[{"name": "data", "emptyDir": {"medium": "Memory"}}, {"name": "cache", "emptyDir": {}}]),
        pod(volumes=[{"name": "data", "emptyDir": {"medium": "Memory"}}, {"name": "cache", "emptyDir": {}}]),
    ),
    (
        "env merges on name",
        pod(containers=[{"name": "m", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}]),
        pod(containers=[{"name": "m", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}]),
        pod(
            containers=[
                {
                    "name": "m",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
                }
            ]
        ),
    ),
    (
        "volumeMounts merge on mountPath",
        pod(containers=[{"name": "m", "volumeMounts": [{"name": "a", "mountPath": "/data"}]}]),
        pod(containers=[{"name": "m", "volumeMounts": [{"name": "b", "mountPath": "/data", "readOnly": True}]}]),
        pod(containers=[{"name": "m", "volumeMounts": [{"name": "b", "mountPath": "/data", "readOnly": True}]}]),
    ),
    (
        "hostAliases merge on ip, hostnames union",
        pod(hostAliases=[{"ip": "10.0.0.1", "hostnames": ["a"]}]),
        pod(hostAliases=[{"ip": "10.0.0.1", "hostnames": ["a", "b"]}, {"ip": "10.0.0.2", "hostnames": ["c"]}]),
        pod(hostAliases=[{"ip": "10.0.0.1", "hostnames": ["a", "b"]}, {"ip": "10.0.0.2", "hostnames": ["c"]}]),
    ),
    (
        "ports merge on containerPort",
        pod(containers=[{"name": "m", "ports": [{"containerPort": 80, "name": "http"}]}]),
        pod(containers=[{"name": "m", "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 443}]}]),
        pod(
            containers=[
                {
                    "name": "m",
                    "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}, {"containerPort": 443}],
                }
            ]
        ),
    ),
    (
        "volumeDevices merge on devicePath",
        pod(containers=[{"name": "m", "volumeDevices": [{"name": "a", "devicePath": "/dev/xvda"}]}]),
        pod(containers=[{"name": "m", "volumeDevices": [{"name": "b", "devicePath": "/dev/xvda"}]}]),
        pod(containers=[{"name": "m", "volumeDevices": [{"name": "b", "devicePath": "/dev/xvda"}]}]),
    ),
    (
        "args replaced whole",
        pod(containers=[{"name": "m", "args": ["a", "b"]}]),
        pod(containers=[{"name": "m", "args": ["c"]}]),
        pod(containers=[{"name": "m", "args": ["c"]}]),
    ),
    (
        "command replaced whole",
        pod(containers=[{"name": "m", "command": ["bash", "-c", "x"]}]),
        pod(containers=[{"name": "m", "command": ["sh"]}]),
        pod(containers=[{"name": "m", "command": ["sh"]}]),
    ),
    (
        "command atomic at any depth (lifecycle exec)",
        pod(containers=[{"name": "m", "lifecycle": {"preStop": {"exec": {"command": ["a"]}}}}]),
        pod(containers=[{"name": "m", "lifecycle": {"preStop": {"exec": {"command": ["b"]}}}}]),
        pod(containers=[{"name": "m", "lifecycle": {"preStop": {"exec": {"command": ["b"]}}}}]),
    ),
    (
        "imagePullSecrets replaced whole",
        pod(imagePullSecrets=[{"name": "a"}, {"name": "b"}]),
        pod(imagePullSecrets=[{"name": "c"}]),
        pod(imagePullSecrets=[{"name": "c"}]),
    ),
    (
        "empty imagePullSecrets clears",
        pod(imagePullSecrets=[{"name": "a"}]),
        pod(imagePullSecrets=[]),
        pod(imagePullSecrets=[]),
    ),
    (
        "empty args clears",
        pod(containers=[{"name": "m", "args": ["x"]}]),
        pod(containers=[{"name": "m", "args": []}]),
        pod(containers=[{"name": "m", "args": []}]),
    ),
    (
        "tolerations are a union",
        pod(tolerations=[{"key": "a", "operator": "Exists"}]),
        pod(tolerations=[{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]),
        pod(tolerations=[{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]),
    ),
    (
        "scalar union list: no duplicates",
        {"metadata": {"finalizers": ["x"]}},
        {"metadata": {"finalizers": ["x", "y", "y"]}},
        {"metadata": {"finalizers": ["x", "y"]}},
    ),
    (
        "null clears a field",
        pod(containers=[{"name": "m", "image": "a", "resources": {"limits": {"cpu": "1"}}}]),
        pod(containers=[{"name": "m", "resources": None}]),
        pod(containers=[{"name": "m", "image": "a"}]),
    ),
    (
        "null clears a list",
        pod(tolerations=[{"key": "a", "operator": "Exists"}], nodeName="n"),
        pod(tolerations=None),
        pod(nodeName="n"),
    ),
    (
        "null over nothing is dropped, also inside appended items",
        pod(containers=[{"name": "m"}]),
        pod(priorityClassName=None, containers=[{"name": "s", "image": None, "tty": True}]),
        pod(containers=[{"name": "m"}, {"name": "s", "tty": True}]),
    ),
    (
        "metadata labels merge key by key",
        {"metadata": {"labels": {"a": "1", "b": "2"}}},
        {"metadata": {"labels": {"b": "3", "a": None}}},
        {"metadata": {"labels": {"b": "3"}}},
    ),
    (
        "patch into empty base",
        {},
        pod(containers=[{"name": "m", "image": "x"}], tolerations=[{"key": "a", "operator": "Exists"}]),
        pod(containers=[{"name": "m", "image": "x"}], tolerations=[{"key": "a", "operator": "Exists"}]),
    ),
]


@pytest.mark.parametrize("base,patch,expected", [c[1:] for c in POD_CASES], ids=[c[0] for c in POD_CASES])
def test_merge_pod_spec(base: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]) -> None:
    base_before, patch_before = copy.deepcopy(base), copy.deepcopy(patch)
    result = merge_pod_spec(base, patch)
    assert result == expected
    # pure: inputs untouched, and the result shares nothing mutable with them
    assert base == base_before and patch == patch_before
    # idempotent: the same patch again changes nothing
    assert merge_pod_spec(result, patch) == expected


def test_merge_pod_spec_result_shares_nothing() -> None:
    base = pod(containers=[{"name": "m", "env": [{"name": "A", "value": "1"}]}])
    patch = pod(volumes=[{"name": "v", "emptyDir": {}}])
    result = merge_pod_spec(base, patch)
    result["spec"]["containers"][0]["env"].append({"name": "B"})
    result["spec"]["volumes"][0]["emptyDir"]["medium"] = "Memory"
    assert base == pod(containers=[{"name": "m", "env": [{"name": "A", "value": "1"}]}])
    assert patch == pod(volumes=[{"name": "v", "emptyDir": {}}])


# (id, base, patch, expected) for plain config merges (no pod-spec rules)
CONFIG_CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("mappings merge key by key", {"a": {"x": 1, "y": 2}}, {"a": {"y": 3, "z": 4}}, {"a": {"x": 1, "y": 3, "z": 4}}),
    ("scalar replaces scalar", {"backend": "local"}, {"backend": "kubernetes"}, {"backend": "kubernetes"}),
    ("scalar type may change (schema checks it)", {"a": 1}, {"a": "x"}, {"a": "x"}),
    (
        "lists outside pod specs are replaced",
        {"kubernetes": {"tolerations": [{"key": "a", "operator": "Exists"}], "allowed_contexts": ["c1", "c2"]}},
        {"kubernetes": {"tolerations": [{"key": "b", "operator": "Exists"}], "allowed_contexts": ["c3"]}},
        {"kubernetes": {"tolerations": [{"key": "b", "operator": "Exists"}], "allowed_contexts": ["c3"]}},
    ),
    ("empty list replaces", {"allowed_backends": ["local"]}, {"allowed_backends": []}, {"allowed_backends": []}),
    (
        "null clears a scalar",
        {"kubernetes": {"context": "c", "namespace": "n"}},
        {"kubernetes": {"context": None}},
        {"kubernetes": {"namespace": "n"}},
    ),
    ("null clears a subtree", {"env": {"A": "1"}, "backend": "local"}, {"env": None}, {"backend": "local"}),
    ("null over nothing is dropped", {"a": 1}, {"b": None, "c": {"d": None, "e": 1}}, {"a": 1, "c": {"e": 1}}),
    (
        "pod_config lists use pod-spec rules",
        {"kubernetes": {"pod_config": pod(containers=[{"name": "m", "image": "a"}], tolerations=[{"key": "a"}])}},
        {"kubernetes": {"pod_config": pod(containers=[{"name": "m", "tty": True}], tolerations=[{"key": "b"}])}},
        {
            "kubernetes": {
                "pod_config": pod(
                    containers=[{"name": "m", "image": "a", "tty": True}], tolerations=[{"key": "a"}, {"key": "b"}]
                )
            }
        },
    ),
    (
        "context_configs pod_config lists use pod-spec rules too",
        {"kubernetes": {"context_configs": {"kind": {"pod_config": pod(volumes=[{"name": "a", "emptyDir": {}}])}}}},
        {"kubernetes": {"context_configs": {"kind": {"pod_config": pod(volumes=[{"name": "b", "emptyDir": {}}])}}}},
        {
            "kubernetes": {
                "context_configs": {
                    "kind": {"pod_config": pod(volumes=[{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}])}
                }
            }
        },
    ),
    (
        "pod_config null clears the whole patch",
        {"kubernetes": {"pod_config": pod(nodeName="n"), "namespace": "x"}},
        {"kubernetes": {"pod_config": None}},
        {"kubernetes": {"namespace": "x"}},
    ),
    (
        "a list named like a pod field outside pod_config is replaced",
        {"kubernetes": {"custom_metadata": {"labels": {"a": "1"}}}, "env": {"A": "1"}},
        {"env": {"B": "2"}},
        {"kubernetes": {"custom_metadata": {"labels": {"a": "1"}}}, "env": {"A": "1", "B": "2"}},
    ),
]


@pytest.mark.parametrize("base,patch,expected", [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES])
def test_merge_config(base: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]) -> None:
    base_before = copy.deepcopy(base)
    result = merge(base, patch)
    assert result == expected
    assert base == base_before
    assert merge(result, patch) == expected  # idempotent


# (id, base, patch, fragments expected in the one error)
CONFLICT_CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    ("scalar over mapping", {"local": {"shell": "bash"}}, {"local": 5}, ["local:", "a scalar", "a mapping"]),
    ("mapping over scalar", {"backend": "local"}, {"backend": {"x": 1}}, ["backend:", "a mapping", "a scalar"]),
    (
        "list over mapping",
        {"kubernetes": {"node_selector": {"a": "b"}}},
        {"kubernetes": {"node_selector": ["a"]}},
        ["kubernetes.node_selector:", "a list", "a mapping"],
    ),
    (
        "scalar over list",
        {"allowed_backends": ["local"]},
        {"allowed_backends": "local"},
        ["allowed_backends:", "a scalar", "a list"],
    ),
    (
        "mapping over list in pod spec",
        {"kubernetes": {"pod_config": pod(containers=[{"name": "m"}])}},
        {"kubernetes": {"pod_config": pod(containers={"name": "m"})}},
        ["kubernetes.pod_config.spec.containers:", "a mapping", "a list"],
    ),
    (
        "keyed item without its key",
        {"kubernetes": {"pod_config": pod(containers=[{"name": "m"}])}},
        {"kubernetes": {"pod_config": pod(containers=[{"image": "x"}])}},
        ["kubernetes.pod_config.spec.containers[0]:", "needs `name`"],
    ),
    (
        "keyed item without its key, into empty base",
        {},
        {"kubernetes": {"pod_config": pod(volumes=[{"emptyDir": {}}])}},
        ["kubernetes.pod_config.spec.volumes[0]:", "needs `name`"],
    ),
]


@pytest.mark.parametrize("base,patch,fragments", [c[1:] for c in CONFLICT_CASES], ids=[c[0] for c in CONFLICT_CASES])
def test_merge_conflicts(base: dict[str, Any], patch: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        merge(base, patch, base_layer="the user layer (/u.yaml)", patch_layer="the project layer (/p.yaml)")
    assert len(info.value.errors) == 1
    for fragment in fragments:
        assert fragment in info.value.errors[0]


def test_merge_conflict_names_both_layers_and_files() -> None:
    layers = [
        Layer("user", "/home/me/config.yaml", {"kubernetes": {"node_selector": {"a": "b"}}, "local": {"shell": "zsh"}}),
        Layer("project", "/repo/.jobsup.yaml", {"kubernetes": {"node_selector": "gpu"}, "local": ["x"]}),
    ]
    with pytest.raises(ConfigError) as info:
        merge_layers(layers)
    errors = info.value.errors
    assert len(errors) == 2  # every conflict, not only the first
    assert errors[0].startswith("kubernetes.node_selector: the project layer (/repo/.jobsup.yaml) sets a scalar")
    assert "the user layer (/home/me/config.yaml) set a mapping" in errors[0]
    assert errors[1].startswith("local: the project layer (/repo/.jobsup.yaml) sets a list")


def test_merge_layers_origins() -> None:
    layers = [
        Layer(
            "default",
            None,
            {"kubernetes": {"namespace": "default", "custom_metadata": {"labels": {}}}, "backend": "local"},
        ),
        Layer("user", "/u.yaml", {"kubernetes": {"namespace": "team", "custom_metadata": {"labels": {"a": "1"}}}}),
        Layer("project", "/p.yaml", {"kubernetes": {"pod_config": pod(containers=[{"name": "m", "image": "x"}])}}),
        Layer(
            "cli", None, {"kubernetes": {"pod_config": pod(containers=[{"name": "m", "image": "y"}])}, "backend": None}
        ),
    ]
    result = merge_layers(layers)
    assert result.origins == {
        ("kubernetes", "namespace"): ("user", "/u.yaml"),
        ("kubernetes", "custom_metadata", "labels", "a"): ("user", "/u.yaml"),
        ("kubernetes", "pod_config", "spec", "containers", 0, "name"): ("cli", None),
        ("kubernetes", "pod_config", "spec", "containers", 0, "image"): ("cli", None),
    }
    assert "backend" not in result.data  # cleared by the cli layer's null


def test_merge_layers_idempotent_and_pure() -> None:
    layer = Layer(
        "user",
        "/u.yaml",
        {
            "kubernetes": {
                "pod_config": pod(
                    tolerations=[{"key": "a"}], containers=[{"name": "m", "env": [{"name": "A", "value": "1"}]}]
                )
            }
        },
    )
    before = copy.deepcopy(layer.data)
    once = merge_layers([layer])
    twice = merge_layers([layer, layer])
    assert once.data == twice.data
    assert layer.data == before
