"""Sources, --config pairs, task whitelist, daemon-only keys, context fallback,
provenance, redaction and the wire form (docs/config.md): table-driven where
the cases are alike, real files in tmp_path throughout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from supervisord.shared.config import (
    Layer,
    check_allowed,
    effective_config,
    layers_from_wire,
    layers_to_wire,
    load_client_layers,
    load_daemon_layer,
    validate_daemon_config,
)
from supervisord.shared.exceptions import ConfigError
from supervisord.shared.secret import redact
from supervisord.shared.task import Task, load_task

DAEMON = Layer("daemon", None, {})


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A private HOME / XDG_CONFIG_HOME with no config files."""
    home = tmp_path / "home"
    (home / ".config" / "jobsup").mkdir(parents=True)
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    d = tmp_path / "project"
    d.mkdir()
    return d


def cli_layer(args: list[str], cwd: Path, env: dict[str, str]) -> Layer:
    layers = load_client_layers(task=None, cli_config=args, cwd=cwd, env=env)
    assert layers[-1].name == "cli"
    return layers[-1]


# ---------------------------------------------------------------------------
# --config KEY.PATH=VALUE: typing, '=' in values, quoting, null, repeats

PAIR_CASES: list[tuple[str, list[str], dict[str, Any]]] = [
    ("value parsed as YAML int", ["local.kill_grace_s=30"], {"local": {"kill_grace_s": 30}}),
    ("value parsed as YAML list", ["allowed_backends=[local]"], {"allowed_backends": ["local"]}),
    (
        "value parsed as YAML mapping",
        ["kubernetes.node_selector={a: b}"],
        {"kubernetes": {"node_selector": {"a": "b"}}},
    ),
    ("split at the first = only", ["env.OPTS=a=b=c"], {"env": {"OPTS": "a=b=c"}}),
    ("string key keeps 1e5", ["env.X=1e5"], {"env": {"X": "1e5"}}),
    ("string key keeps 0600", ["env.MODE=0600"], {"env": {"MODE": "0600"}}),
    ("string key keeps yes", ["local.shell=yes"], {"local": {"shell": "yes"}}),
    ("string key keeps spaces and quotes", ["env.Q= 'a' "], {"env": {"Q": " 'a' "}}),
    ("string key keeps an empty value", ["env.EMPTY="], {"env": {"EMPTY": ""}}),
    (
        "free-form pod spec value is YAML",
        ["kubernetes.pod_config.spec.priority=10"],
        {"kubernetes": {"pod_config": {"spec": {"priority": 10}}}},
    ),
    ("null clears", ["kubernetes.context=null"], {"kubernetes": {"context": None}}),
    ("~ clears", ["env=~"], {"env": None}),
    ("last one wins", ["backend=local", "backend=kubernetes"], {"backend": "kubernetes"}),
    ("siblings merge", ["local.shell=zsh", "local.kill_grace_s=5"], {"local": {"shell": "zsh", "kill_grace_s": 5}}),
    ("later child replaces an earlier scalar", ["local=5", "local.shell=sh"], {"local": {"shell": "sh"}}),
    (
        "later parent replaces earlier children",
        ["local.shell=sh", "local={kill_grace_s: 3}"],
        {"local": {"kill_grace_s": 3}},
    ),
    (
        "quoted key holds dots",
        ['kubernetes.node_selector."example.com/gpu"=a100'],
        {"kubernetes": {"node_selector": {"example.com/gpu": "a100"}}},
    ),
    (
        "index into a list from an earlier pair",
        ["kubernetes.tolerations=[{key: a, operator: Exists}]", "kubernetes.tolerations.0.effect=NoSchedule"],
        {"kubernetes": {"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoSchedule"}]}},
    ),
    (
        "null at an index removes the item",
        ["allowed_backends=[local, kubernetes]", "allowed_backends.0=null"],
        {"allowed_backends": ["kubernetes"]},
    ),
    (
        "YAML dates stay strings",
        ["kubernetes.pod_config.metadata.annotations.day=2024-01-01"],
        {"kubernetes": {"pod_config": {"metadata": {"annotations": {"day": "2024-01-01"}}}}},
    ),
]


@pytest.mark.parametrize("args,expected", [c[1:] for c in PAIR_CASES], ids=[c[0] for c in PAIR_CASES])
def test_cli_pairs(args: list[str], expected: dict[str, Any], project: Path, env: dict[str, str]) -> None:
    layer = cli_layer(args, project, env)
    assert layer.file is None
    assert layer.data == expected


def test_index_into_an_inherited_list(project: Path, env: dict[str, str]) -> None:
    (project / ".jobsup.yaml").write_text(
        "kubernetes:\n"
        "  tolerations: [{key: a, operator: Exists}, {key: b, operator: Exists}]\n"
        "  pod_config:\n"
        "    spec:\n"
        "      containers: [{name: main, image: x, args: [a, b]}]\n"
    )
    layer = cli_layer(
        ["kubernetes.tolerations.1.effect=NoExecute", "kubernetes.pod_config.spec.containers.0.args.1=c"], project, env
    )
    # the cli layer carries the whole inherited list with the element changed
    assert layer.data["kubernetes"]["tolerations"] == [
        {"key": "a", "operator": "Exists"},
        {"key": "b", "operator": "Exists", "effect": "NoExecute"},
    ]
    layers = load_client_layers(
        task=None, cli_config=["kubernetes.pod_config.spec.containers.0.args.1=c"], cwd=project, env=env
    )
    eff = effective_config(DAEMON, layers, env={})
    assert eff.data["kubernetes"]["pod_config"]["spec"]["containers"] == [
        {"name": "main", "image": "x", "args": ["a", "c"]}
    ]


PAIR_ERRORS: list[tuple[str, list[str], str]] = [
    ("number never creates a map key", ["kubernetes.node_selector.0=x"], "kubernetes.node_selector is not a list"),
    ("number on a missing list", ["kubernetes.pvc_mounts.0.read_only=false"], "index 0 is out of range"),
    ("number on nothing at all", ["kubernetes.pod_config.spec.volumes.0.name=x"], "holds no list"),
    ("index out of range", ["allowed_backends=[local]", "allowed_backends.3=kubernetes"], "index 3 is out of range"),
    (
        "string key into a list",
        ["allowed_backends=[local]", "allowed_backends.x=1"],
        "is a list; index it with a number",
    ),
    ("empty value for a non-string key", ["local.kill_grace_s="], "empty value; write null"),
    ("bad YAML value", ["kubernetes.node_selector={a: [}"], "not valid YAML"),
    ("empty key segment", ["local..shell=x"], "not a valid key path"),
    ("file must be the only --config", ["extra.yaml", "backend=local"], "must be the only --config"),
    ("missing file", ["nope.yaml"], "does not exist"),
]


@pytest.mark.parametrize("args,fragment", [c[1:] for c in PAIR_ERRORS], ids=[c[0] for c in PAIR_ERRORS])
def test_cli_pair_errors(args: list[str], fragment: str, project: Path, env: dict[str, str]) -> None:
    (project / "extra.yaml").write_text("backend: local\n")
    with pytest.raises(ConfigError) as info:
        load_client_layers(task=None, cli_config=args, cwd=project, env=env)
    assert fragment in str(info.value)


def test_cli_errors_all_reported(project: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_client_layers(task=None, cli_config=["local..x=1", "local.kill_grace_s=", "env.A=1"], cwd=project, env=env)
    assert len(info.value.errors) == 2


@pytest.mark.parametrize(
    "arg", ["env.A.B=hunter2", "env=hunter2", "kubernetes.custom_metadata.labels.api_token=hunter 12345"]
)
def test_secret_value_never_echoed_in_errors(arg: str, project: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        effective_config(DAEMON, load_client_layers(task=None, cli_config=[arg], cwd=project, env=env), env={})
    assert "hunter2" not in str(info.value) and "12345" not in str(info.value)


def test_union_list_in_pod_spec_cannot_be_indexed(project: Path, env: dict[str, str]) -> None:
    (project / ".jobsup.yaml").write_text("kubernetes: {pod_config: {spec: {tolerations: [{key: a}]}}}\n")
    with pytest.raises(ConfigError, match="merged as a union"):
        load_client_layers(
            task=None, cli_config=["kubernetes.pod_config.spec.tolerations.0.key=b"], cwd=project, env=env
        )


def test_cli_config_file(project: Path, env: dict[str, str]) -> None:
    (project / "c.yaml").write_text("local: {shell: zsh}\n")
    layer = cli_layer(["c.yaml"], project, env)
    assert layer.file == str(project / "c.yaml")
    assert layer.data == {"local": {"shell": "zsh"}}


# ---------------------------------------------------------------------------
# files and override variables

FILE_ERRORS: list[tuple[str, str, str | None, list[str]]] = [
    # (id, file text or None for "variable at a missing file", variable, fragments)
    ("override variable at a missing file", None, "JOBSUP_CONFIG", ["JOBSUP_CONFIG=", "does not exist"]),
    ("project variable at a missing file", None, "JOBSUP_PROJECT_CONFIG", ["JOBSUP_PROJECT_CONFIG=", "does not exist"]),
    (
        "YAML syntax error names file and line",
        "local:\n  shell: zsh\n  kill_grace_s: [1\n",
        "JOBSUP_CONFIG",
        ["c.yaml: line 4", "not valid YAML"],
    ),
    ("top level a list", "- a\n- b\n", "JOBSUP_CONFIG", ["c.yaml: line 1", "must be a mapping", "list"]),
    ("top level a string", "just text\n", "JOBSUP_PROJECT_CONFIG", ["c.yaml", "must be a mapping"]),
    (
        "duplicate key",
        "backend: local\nbackend: kubernetes\n",
        "JOBSUP_CONFIG",
        ["c.yaml: line 2", "duplicate key 'backend'"],
    ),
    (
        "non-string key",
        "kubernetes:\n  node_selector:\n    yes: a\n",
        "JOBSUP_CONFIG",
        ["c.yaml: line 3", "not a string"],
    ),
]


@pytest.mark.parametrize("text,variable,fragments", [c[1:] for c in FILE_ERRORS], ids=[c[0] for c in FILE_ERRORS])
def test_file_errors(
    text: str | None, variable: str, fragments: list[str], tmp_path: Path, project: Path, env: dict[str, str]
) -> None:
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_client_layers(task=None, cli_config=[], cwd=project, env={**env, variable: str(path)})
    for fragment in fragments:
        assert fragment in str(info.value)


def test_empty_variable_is_an_error(project: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="JOBSUP_CONFIG is set but empty"):
        load_client_layers(task=None, cli_config=[], cwd=project, env={**env, "JOBSUP_CONFIG": ""})


def test_daemon_variable_at_missing_file(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="JOBSUP_DAEMON_CONFIG="):
        load_daemon_layer({**env, "JOBSUP_DAEMON_CONFIG": str(tmp_path / "missing.yaml")})


def test_empty_files_are_empty_layers(project: Path, env: dict[str, str]) -> None:
    user = Path(env["XDG_CONFIG_HOME"]) / "jobsup" / "config.yaml"
    user.write_text("")
    (project / ".jobsup.yaml").write_text("# only a comment\n")
    layers = load_client_layers(task=None, cli_config=[], cwd=project, env=env)
    assert [(layer.name, layer.file, layer.data) for layer in layers] == [
        ("user", str(user), {}),
        ("project", str(project / ".jobsup.yaml"), {}),
    ]


def test_missing_default_files_are_empty(project: Path, env: dict[str, str]) -> None:
    layers = load_client_layers(task=None, cli_config=[], cwd=project, env=env)
    assert [(layer.name, layer.file, layer.data) for layer in layers] == [("user", None, {}), ("project", None, {})]
    assert load_daemon_layer(env) == Layer("daemon", None, {})


def test_broken_user_file_does_not_hide_broken_project_file(project: Path, env: dict[str, str]) -> None:
    (Path(env["XDG_CONFIG_HOME"]) / "jobsup" / "config.yaml").write_text("a: [\n")
    (project / ".jobsup.yaml").write_text("- x\n")
    with pytest.raises(ConfigError) as info:
        load_client_layers(task=None, cli_config=[], cwd=project, env=env)
    assert len(info.value.errors) == 2


# ---------------------------------------------------------------------------
# precedence, validation, task whitelist, daemon-only keys


def test_five_sources_in_order(tmp_path: Path, project: Path, env: dict[str, str]) -> None:
    conf = Path(env["XDG_CONFIG_HOME"]) / "jobsup"
    (conf / "daemon.yaml").write_text(
        "kubernetes: {namespace: d, runtime_class: d, node_selector: {d: d}}\nlocal: {shell: d}\n"
    )
    (conf / "config.yaml").write_text("kubernetes: {runtime_class: u, node_selector: {u: u}}\nlocal: {shell: u}\n")
    (project / ".jobsup.yaml").write_text("local: {shell: p}\nkubernetes: {node_selector: {p: p}}\n")
    task_file = tmp_path / "task.yaml"
    task_file.write_text("run: echo\nconfig:\n  local: {shell: t, kill_grace_s: 7}\n")
    task = load_task(task_file)
    layers = load_client_layers(task=task, cli_config=["local.kill_grace_s=8"], cwd=project, env=env)
    eff = effective_config(load_daemon_layer(env), layers, env={})
    assert eff.data["kubernetes"]["namespace"] == "d"
    assert eff.data["kubernetes"]["runtime_class"] == "u"
    assert eff.data["kubernetes"]["node_selector"] == {"d": "d", "u": "u", "p": "p"}
    assert eff.data["local"] == {"kill_grace_s": 8, "shell": "t"}
    assert eff.origins["local.shell"] == ("task", str(task_file.resolve()))
    assert eff.origins["local.kill_grace_s"] == ("cli", None)
    assert eff.origins["kubernetes.namespace"] == ("daemon", str(conf / "daemon.yaml"))
    assert eff.origins["kubernetes.node_selector.u"] == ("user", str(conf / "config.yaml"))
    assert eff.origins["backend"] == ("default", None)


SCHEMA_ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top-level key", {"bakend": "local"}, "bakend: unknown key"),
    ("unknown nested key", {"local": {"kill_grace": 3}}, "local.kill_grace: unknown key"),
    (
        "wrong type",
        {"local": {"kill_grace_s": "10"}},
        "local.kill_grace_s: must be a positive integer, got '10' (a string)",
    ),
    ("bad enum", {"backend": "docker"}, "backend: must be one of local, kubernetes, slurm, got 'docker'"),
    ("non-positive", {"local": {"kill_grace_s": 0}}, "local.kill_grace_s: must be a positive integer, got 0"),
    ("slurm unknown key", {"slurm": {"hots": "login"}}, "slurm.hots: unknown key; allowed: account, host, partition"),
    ("slurm sbatch_args type", {"slurm": {"sbatch_args": "--mem=4G"}}, "slurm.sbatch_args: must be a list"),
    ("bad env name", {"env": {"1X": "v"}}, "env.1X: is not a valid environment variable name"),
    ("env value type hidden", {"env": {"X": 5}}, "env.X: must be a string, got a value (not shown"),
    (
        "bad namespace",
        {"kubernetes": {"namespace": "Team_A"}},
        "kubernetes.namespace: 'Team_A' is not a DNS-1123 label",
    ),
    (
        "context_configs cannot hold allowed_contexts",
        {"kubernetes": {"context_configs": {"kind": {"allowed_contexts": ["x"]}}}},
        "kubernetes.context_configs.kind.allowed_contexts: unknown key",
    ),
    (
        "pod_config top keys",
        {"kubernetes": {"pod_config": {"containers": []}}},
        "kubernetes.pod_config.containers: unknown key; allowed: metadata, spec",
    ),
]


@pytest.mark.parametrize("data,fragment", [c[1:] for c in SCHEMA_ERRORS], ids=[c[0] for c in SCHEMA_ERRORS])
def test_schema_errors_name_file_and_key(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        effective_config(DAEMON, [Layer("user", "/home/me/.config/jobsup/config.yaml", data)], env={})
    assert len(info.value.errors) == 1
    assert info.value.errors[0].startswith("/home/me/.config/jobsup/config.yaml (user config): ")
    assert fragment in info.value.errors[0]


def test_every_error_of_every_layer() -> None:
    with pytest.raises(ConfigError) as info:
        effective_config(
            Layer("daemon", "/d.yaml", {"daemon": {"synchronous": "OFF"}}),
            [
                Layer("user", "/u.yaml", {"backend": 1, "local": {"x": 1}}),
                Layer("cli", None, {"kubernetes": {"runtime_class": "Kata!"}}),
            ],
            env={},
        )
    errors = info.value.errors
    assert len(errors) == 4
    assert any(e.startswith("/d.yaml (daemon config): daemon.synchronous") for e in errors)
    assert any(e.startswith("--config: kubernetes.runtime_class") for e in errors)


def test_null_clears_and_default_returns() -> None:
    eff = effective_config(
        Layer("daemon", "/d.yaml", {"kubernetes": {"namespace": "team", "runtime_class": "kata"}}),
        [Layer("user", "/u.yaml", {"kubernetes": {"namespace": None, "runtime_class": None}})],
        env={},
    )
    assert eff.data["kubernetes"]["namespace"] == "default"  # cleared: the default applies
    assert "runtime_class" not in eff.data["kubernetes"]
    assert eff.origins["kubernetes.namespace"] == ("default", None)


def test_kind_conflict_between_layers_names_both() -> None:
    with pytest.raises(ConfigError) as info:
        effective_config(
            Layer("daemon", "/d.yaml", {"kubernetes": {"pod_config": {"spec": {"containers": [{"name": "m"}]}}}}),
            [Layer("project", "/p.yaml", {"kubernetes": {"pod_config": {"spec": {"containers": {"name": "m"}}}}})],
            env={},
        )
    (error,) = info.value.errors
    assert error.startswith("kubernetes.pod_config.spec.containers: the project layer (/p.yaml) sets a mapping")
    assert "the daemon layer (/d.yaml) set a list" in error


TASK_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "allowed keys",
        {
            "kubernetes": {
                "pod_config": {"spec": {}},
                "custom_metadata": {"labels": {"a": "b"}},
                "pod_ready_timeout_s": 5,
                "node_selector": {"a": "b"},
                "tolerations": [],
            },
            "env": {"A": "1"},
            "local": {"shell": "sh"},
        },
        [],
    ),
    ("namespace rejected", {"kubernetes": {"namespace": "x"}}, ["kubernetes.namespace: a task may not set this key"]),
    (
        "runtime_class rejected",
        {"kubernetes": {"runtime_class": "kata"}},
        ["kubernetes.runtime_class: a task may not set"],
    ),
    (
        "context_configs rejected",
        {"kubernetes": {"context_configs": {}}},
        ["kubernetes.context_configs: a task may not set"],
    ),
    ("backend rejected", {"backend": "local"}, ["backend: a task may not set"]),
    ("daemon key rejected", {"daemon": {"log_level": "debug"}}, ["daemon: a task may not set"]),
    ("whole kubernetes null rejected", {"kubernetes": None}, ["kubernetes: a task may set only some keys"]),
    (
        "several at once",
        {"project": "p", "kubernetes": {"pvc_mounts": [], "context": "c"}},
        ["project:", "kubernetes.pvc_mounts:", "kubernetes.context:"],
    ),
]


@pytest.mark.parametrize("config,fragments", [c[1:] for c in TASK_CASES], ids=[c[0] for c in TASK_CASES])
def test_task_whitelist(config: dict[str, Any], fragments: list[str]) -> None:
    task = Layer("task", "/repo/task.yaml", config)
    if not fragments:
        effective_config(DAEMON, [task], env={})
        return
    with pytest.raises(ConfigError) as info:
        effective_config(DAEMON, [task], env={})
    assert len(info.value.errors) == len(fragments)
    for fragment, error in zip(fragments, info.value.errors):
        assert error.startswith("/repo/task.yaml (task `config:`): ")
        assert fragment in error


def test_daemon_only_keys_ignored_with_warning() -> None:
    daemon = Layer(
        "daemon",
        "/d.yaml",
        {"allowed_backends": ["local"], "kubernetes": {"allowed_contexts": ["prod"]}, "daemon": {"max_running": 2}},
    )
    user = Layer(
        "user",
        "/u.yaml",
        {
            "allowed_backends": ["local", "kubernetes"],
            "daemon": {"max_running": 50, "log_level": "debug"},
            "kubernetes": {"allowed_contexts": ["dev"], "namespace": "me"},
        },
    )
    eff = effective_config(daemon, [user], env={})
    assert eff.data["allowed_backends"] == ["local"]
    assert eff.data["kubernetes"]["allowed_contexts"] == ["prod"]
    assert eff.data["daemon"] == {"synchronous": "FULL", "max_running": 2, "log_level": "info"}
    assert eff.data["kubernetes"]["namespace"] == "me"  # the rest of the layer still applies
    named = " ".join(eff.warnings)
    for key in ("allowed_backends", "daemon.max_running", "daemon.log_level", "kubernetes.allowed_contexts"):
        assert key in named
    assert all("/u.yaml" in w for w in eff.warnings)


def test_client_cannot_clear_daemon_only_keys_through_a_parent() -> None:
    daemon = Layer("daemon", "/d.yaml", {"kubernetes": {"allowed_contexts": ["prod"], "namespace": "x"}})
    eff = effective_config(daemon, [Layer("user", "/u.yaml", {"kubernetes": None})], env={})
    assert eff.data["kubernetes"]["allowed_contexts"] == ["prod"]
    assert eff.data["kubernetes"]["namespace"] == "default"


ALLOWED_CASES: list[tuple[str, dict[str, Any], str, str | None, str | None]] = [
    ("backend allowed", {"allowed_backends": ["local"]}, "local", None, None),
    ("backend refused", {"allowed_backends": ["local"]}, "kubernetes", "c", "backend 'kubernetes' is not allowed"),
    ("any context when unset", {}, "kubernetes", "anything", None),
    ("context allowed", {"kubernetes": {"allowed_contexts": ["a", "b"]}}, "kubernetes", "b", None),
    ("context refused", {"kubernetes": {"allowed_contexts": ["a"]}}, "kubernetes", "b", "context 'b' is not allowed"),
    (
        "unknown context refused when restricted",
        {"kubernetes": {"allowed_contexts": ["a"]}},
        "kubernetes",
        None,
        "context is unknown",
    ),
    ("contexts do not restrict local", {"kubernetes": {"allowed_contexts": ["a"]}}, "local", None, None),
]


@pytest.mark.parametrize(
    "daemon,backend,context,error", [c[1:] for c in ALLOWED_CASES], ids=[c[0] for c in ALLOWED_CASES]
)
def test_check_allowed(daemon: dict[str, Any], backend: str, context: str | None, error: str | None) -> None:
    eff = effective_config(Layer("daemon", "/d.yaml", daemon), [], env={})
    if error is None:
        check_allowed(eff, backend, context)
    else:
        with pytest.raises(ConfigError, match=error):
            check_allowed(eff, backend, context)


# ---------------------------------------------------------------------------
# per-context settings


CTX_DAEMON = Layer(
    "daemon",
    "/d.yaml",
    {
        "kubernetes": {
            "namespace": "plain",
            "pod_ready_timeout_s": 60,
            "context_configs": {
                "gpu": {
                    "namespace": "gpu-ns",
                    "pod_ready_timeout_s": 600,
                    "pod_config": {"spec": {"volumes": [{"name": "b", "emptyDir": {}}]}},
                },
            },
            "pod_config": {"spec": {"volumes": [{"name": "a", "emptyDir": {}}]}},
        }
    },
)


def test_context_value_overrides_plain_key_of_same_layer() -> None:
    eff = effective_config(CTX_DAEMON, [], context="gpu", env={})
    k = eff.data["kubernetes"]
    assert (k["namespace"], k["pod_ready_timeout_s"]) == ("gpu-ns", 600)
    assert k["pod_config"]["spec"]["volumes"] == [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}]
    assert k["context"] == "gpu" and eff.origins["kubernetes.context"] == ("kubeconfig", None)
    assert "context_configs" not in k and eff.context == "gpu"


def test_other_context_falls_back_to_plain_key() -> None:
    eff = effective_config(CTX_DAEMON, [], context="cpu", env={})
    assert (eff.data["kubernetes"]["namespace"], eff.data["kubernetes"]["pod_ready_timeout_s"]) == ("plain", 60)


def test_configured_context_beats_the_current_one() -> None:
    eff = effective_config(
        CTX_DAEMON, [Layer("user", "/u.yaml", {"kubernetes": {"context": "gpu"}})], context="cpu", env={}
    )
    assert eff.data["kubernetes"]["namespace"] == "gpu-ns"
    assert eff.origins["kubernetes.context"] == ("user", "/u.yaml")


def test_precedence_stays_layer_first() -> None:
    task = Layer("task", "/t.yaml", {"kubernetes": {"pod_ready_timeout_s": 30}})
    eff = effective_config(CTX_DAEMON, [task], context="gpu", env={})
    assert eff.data["kubernetes"]["pod_ready_timeout_s"] == 30  # task plain beats daemon per-context
    assert eff.data["kubernetes"]["namespace"] == "gpu-ns"


def test_context_null_clears_lower_layer() -> None:
    daemon = Layer("daemon", "/d.yaml", {"kubernetes": {"runtime_class": "kata"}})
    user = Layer("user", "/u.yaml", {"kubernetes": {"context_configs": {"kind": {"runtime_class": None}}}})
    assert "runtime_class" not in effective_config(daemon, [user], context="kind", env={}).data["kubernetes"]
    assert effective_config(daemon, [user], context="other", env={}).data["kubernetes"]["runtime_class"] == "kata"


def test_unknown_context_keeps_context_configs_for_later() -> None:
    eff = effective_config(CTX_DAEMON, [], env={})
    assert eff.context is None
    assert "gpu" in eff.data["kubernetes"]["context_configs"]
    assert eff.data["kubernetes"]["namespace"] == "plain"


# ---------------------------------------------------------------------------
# JOBSUP_K8S_POD_READY_TIMEOUT_S is read only when no layer sets the key


@pytest.mark.parametrize(
    "layer_value,env_value,expected,origin",
    [
        (None, None, 90, ("default", None)),
        (None, "120", 120, ("env", "JOBSUP_K8S_POD_READY_TIMEOUT_S")),
        (None, "120.9", 120, ("env", "JOBSUP_K8S_POD_READY_TIMEOUT_S")),
        (45, "300", 45, ("user", "/u.yaml")),
        (45, "abc", 45, ("user", "/u.yaml")),  # not read at all when a layer sets the key
    ],
)
def test_pod_ready_timeout_env(
    layer_value: int | None, env_value: str | None, expected: int, origin: tuple[str, str | None]
) -> None:
    user = Layer("user", "/u.yaml", {"kubernetes": {"pod_ready_timeout_s": layer_value}} if layer_value else {})
    env = {"JOBSUP_K8S_POD_READY_TIMEOUT_S": env_value} if env_value is not None else {}
    eff = effective_config(DAEMON, [user], env=env)
    assert eff.data["kubernetes"]["pod_ready_timeout_s"] == expected
    assert eff.origins["kubernetes.pod_ready_timeout_s"] == origin


def test_pod_ready_timeout_env_error_names_variable() -> None:
    with pytest.raises(ConfigError, match="JOBSUP_K8S_POD_READY_TIMEOUT_S"):
        effective_config(DAEMON, [], env={"JOBSUP_K8S_POD_READY_TIMEOUT_S": "inf"})


# ---------------------------------------------------------------------------
# merged-result checks, daemon start, redaction, wire


def test_merged_result_checked_across_layers() -> None:
    daemon = Layer("daemon", "/d.yaml", {"kubernetes": {"pvc_mounts": [{"claim_name": "data", "mount_path": "/data"}]}})
    user = Layer("user", "/u.yaml", {"kubernetes": {"secret_mounts": [{"secret_name": "s", "mount_path": "/data"}]}})
    with pytest.raises(ConfigError) as info:
        effective_config(daemon, [user], env={})
    (error,) = info.value.errors
    assert error.startswith("merged config: kubernetes.secret_mounts[0].mount_path: '/data' is also the mount path")
    assert "/d.yaml" in error and "/u.yaml" in error


def test_validate_daemon_config_reports_everything() -> None:
    layer = Layer(
        "daemon",
        "/etc/jobsup/daemon.yaml",
        {
            "daemon": {"max_running": 0, "log_level": "loud"},
            "kubernetes": {"runtime_class": "Not_A_DNS_Name", "pod_ready_timeout_s": "90"},
        },
    )
    with pytest.raises(ConfigError) as info:
        validate_daemon_config(layer, env={})
    errors = info.value.errors
    assert len(errors) == 4
    assert all(e.startswith("/etc/jobsup/daemon.yaml (daemon config): ") for e in errors)
    text = "\n".join(errors)
    for fragment in (
        "daemon.max_running",
        "'loud'",
        "'Not_A_DNS_Name'",
        "kubernetes.pod_ready_timeout_s: must be a positive integer, got '90'",
    ):
        assert fragment in text
    validate_daemon_config(Layer("daemon", None, {}), env={})  # an empty daemon config is fine


def test_validate_daemon_config_checks_the_timeout_variable() -> None:
    bad = {"JOBSUP_K8S_POD_READY_TIMEOUT_S": "0"}
    with pytest.raises(ConfigError, match="JOBSUP_K8S_POD_READY_TIMEOUT_S"):
        validate_daemon_config(Layer("daemon", None, {}), env=bad)
    # not read when the daemon config sets the key
    validate_daemon_config(Layer("daemon", "/d.yaml", {"kubernetes": {"pod_ready_timeout_s": 60}}), env=bad)


def test_redact() -> None:
    config = {
        "env": {"API_TOKEN": "hunter2", "SEED": "1"},
        "kubernetes": {
            "pod_config": {
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "m",
                            "env": [
                                {"name": "PASSWORD", "value": "pw"},
                                {"name": "R", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                            ],
                        }
                    ],
                    "volumes": [{"name": "v", "secret": {"secretName": "creds"}}],
                }
            },
            "secret_mounts": [{"secret_name": "creds", "mount_path": "/s"}],
        },
        "extra": {"github_token": "ghp_x", "db_password": 5},
    }
    key = b"k" * 32
    out = redact(config, key)
    text = repr(out)
    for secret in ("hunter2", "'pw'", "ghp_x"):
        assert secret not in text
    assert out["env"]["SEED"].startswith("<redacted hmac-sha256:")
    assert out["env"]["API_TOKEN"] == redact({"env": {"X": "hunter2"}}, key)["env"]["X"]  # same value, same hash
    assert out["env"]["API_TOKEN"] != out["env"]["SEED"]
    spec = out["kubernetes"]["pod_config"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["env"][0]["name"] == "PASSWORD"
    assert spec["containers"][0]["env"][1]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert spec["volumes"][0]["secret"] == {"secretName": "creds"}
    assert out["kubernetes"]["secret_mounts"] == [{"secret_name": "creds", "mount_path": "/s"}]
    assert out["extra"]["db_password"].startswith("<redacted hmac-sha256:")
    assert config["env"]["API_TOKEN"] == "hunter2"  # input untouched


def test_wire_round_trip(tmp_path: Path, project: Path, env: dict[str, str]) -> None:
    (project / ".jobsup.yaml").write_text("local: {shell: zsh}\n")
    task = Task(run="echo", config={"env": {"A": "1"}}, path=tmp_path / "t.yaml")
    layers = load_client_layers(task=task, cli_config=["backend=kubernetes"], cwd=project, env=env)
    assert layers_from_wire(layers_to_wire(layers)) == layers


@pytest.mark.parametrize(
    "wire,fragment",
    [
        ({"name": "user"}, "exactly name, file and data"),
        ([{"name": "daemon", "file": None, "data": {}}], "not a client layer"),
        ([{"name": "cli", "file": None, "data": {}}, {"name": "user", "file": None, "data": {}}], "out of order"),
        ([{"name": "user", "file": None, "data": []}], "data must be an object"),
    ],
)
def test_wire_rejects(wire: Any, fragment: str) -> None:
    if isinstance(wire, dict):
        wire = [wire]
    with pytest.raises(ConfigError, match=fragment):
        layers_from_wire(wire)
