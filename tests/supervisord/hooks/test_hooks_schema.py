"""Hooks are part of the config's JSON Schema (``jobsup schema config``
shows them), and the schema and the hook checks (which word each problem)
agree on what a valid hook is."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from supervisord.shared import hooksconfig as hooks_config
from supervisord.shared.config.layer import Layer
from supervisord.shared.config.schema import HOOK_SCHEMA, schema_violations

ENV = {"HOOK_KEY": "s3cret"}
URL = "https://chat.example/hooks/abc"

VALID: list[dict[str, Any]] = [
    {"name": "a", "command": ["notify-send", "x"]},
    {"name": "b.c_d-1", "when": "completed", "command": ["true"], "timeout_s": 2.5, "backfill": True},
    {
        "name": "w",
        "when": ["ERROR", "Canceled"],
        "match": {"project": "ml", "reason": ["OOMKilled"]},
        "webhook": {"url": URL},
    },
    {
        "name": "w2",
        "webhook": {"url": URL, "secret_env": "HOOK_KEY", "timeout_s": 1, "retry_for_s": 60, "in_flight": 64},
    },
]

INVALID: list[dict[str, Any]] = [
    {"command": ["true"]},  # no name
    {"name": "bad name!", "command": ["true"]},
    {"name": "on-done", "command": ["true"]},
    {"name": "x" * 64, "command": ["true"]},
    {"name": "a", "when": [], "command": ["true"]},
    {"name": "a", "when": ["FINISHED"], "command": ["true"]},
    {"name": "a", "when": [True], "command": ["true"]},
    {"name": "a", "match": {"phase": "x"}, "command": ["true"]},
    {"name": "a", "match": {"project": 3}, "command": ["true"]},
    {"name": "a", "match": {"project": []}, "command": ["true"]},
    {"name": "a", "match": "ml", "command": ["true"]},
    {"name": "a"},  # neither command nor webhook
    {"name": "a", "command": ["true"], "webhook": {"url": URL}},  # both
    {"name": "a", "command": "notify-send x"},
    {"name": "a", "command": []},
    {"name": "a", "command": ["ok", True]},
    {"name": "a", "command": ["ok", ""]},
    {"name": "a", "command": ["a\0b"]},
    {"name": "a", "command": ["true"], "timeout_s": 0},
    {"name": "a", "command": ["true"], "timeout_s": 7 * 86400 + 1},
    {"name": "a", "command": ["true"], "timeout_s": "30"},
    {"name": "a", "command": ["true"], "backfill": "yes"},
    {"name": "a", "command": ["true"], "on": ["ERROR"]},
    {"name": "a", "webhook": {"url": URL}, "timeout_s": 3},
    {"name": "a", "webhook": "https://x"},
    {"name": "a", "webhook": {}},
    {"name": "a", "webhook": {"url": URL, "extra": 1}},
    {"name": "a", "webhook": {"url": URL, "secret_env": "not a name"}},
    {"name": "a", "webhook": {"url": URL, "in_flight": 0}},
    {"name": "a", "webhook": {"url": URL, "in_flight": 65}},
    {"name": "a", "webhook": {"url": URL, "retry_for_s": -1}},
    {"name": "a", "webhook": {"url": URL, "timeout_s": True}},
    "not a mapping",  # type: ignore[list-item]
]


def _checks_accept(raw: Any) -> bool:
    errors: list[str] = []
    return hooks_config._one_hook(raw, "hooks[0]", "test", errors, ENV) is not None and not errors


def _schema_accepts(raw: Any) -> bool:
    item = {k: v for k, v in raw.items() if v is not None} if isinstance(raw, dict) else raw
    return not schema_violations({"hooks": [item]})


@pytest.mark.parametrize("raw", VALID, ids=lambda r: str(r.get("name")))
def test_a_valid_hook_passes_both(raw: dict[str, Any]) -> None:
    assert _checks_accept(raw) and _schema_accepts(raw)
    hooks, errors = hooks_config.hooks_from_layers([Layer("user", None, {"hooks": [raw]})], ENV)
    assert errors == [] and [h.name for h in hooks] == [raw["name"]]


@pytest.mark.parametrize("raw", INVALID, ids=lambda r: json.dumps(r, default=str)[:60])
def test_an_invalid_hook_fails_both(raw: Any) -> None:
    assert not _checks_accept(raw)
    assert not _schema_accepts(raw)


def test_the_schema_refuses_what_the_checks_would_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema is the contract: a hook it refuses is refused, also if a
    check were to let it through; the message shows no value."""
    monkeypatch.setitem(HOOK_SCHEMA["properties"]["webhook"]["properties"], "in_flight", {"maximum": 4})
    raw = {"name": "w", "webhook": {"url": URL, "in_flight": 8}}
    hooks, errors = hooks_config.hooks_from_layers([Layer("user", None, {"hooks": [raw]})], ENV)
    assert hooks == []
    assert errors == [
        "user config: hooks[0].webhook.in_flight: does not match the config schema (`maximum`; see `jobsup schema config`)"
    ]


def test_jobsup_schema_config_shows_the_hooks() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "supervisord", "schema", "config"], capture_output=True, text=True, check=True
    ).stdout
    hooks = json.loads(out)["properties"]["hooks"]
    assert hooks["items"]["properties"].keys() >= {"name", "when", "match", "command", "webhook", "timeout_s"}
