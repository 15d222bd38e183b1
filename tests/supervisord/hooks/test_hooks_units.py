"""The pure parts of hooks: config parsing, matching, back-off, Retry-After,
signatures; and the command runner on real processes."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import anyio
import pytest

from store import RecordedEvent
from supervisord.daemon.hooks.command import run_command
from supervisord.daemon.hooks.delivery import backoff_s
from supervisord.daemon.hooks.match import matches
from supervisord.daemon.hooks.webhook import retry_after_seconds, signature
from supervisord.shared.config import Layer, effective_config
from supervisord.shared.exceptions import ConfigError, TaskError
from supervisord.shared.hooksconfig import (
    WebhookTarget,
    hooks_from_layers,
    load_hooks,
    parse_on_done,
)


def _pc(phase: str, reason: str | None = None) -> RecordedEvent:
    return RecordedEvent(7, "r1", 3, "PhaseChanged", "2026-01-01T00:00:00.000000Z", {"phase": phase, "reason": reason})


def test_hooks_parse_with_defaults() -> None:
    daemon = Layer("daemon", "/etc/d.yaml", {"hooks": [{"name": "n", "command": ["notify-send", "x"]}]})
    user = Layer(
        "user",
        None,
        {
            "hooks": [
                {
                    "name": "w",
                    "when": ["running", "ERROR"],
                    "backfill": True,
                    "webhook": {"url": "https://h.example/p?q=1", "secret_env": "S"},
                }
            ]
        },
    )
    [n, w] = load_hooks([daemon, user], env={"S": "x"})
    assert n.when == {"COMPLETED", "ERROR", "CANCELED", "DELETED"} and n.timeout_s == 30 and not n.backfill
    assert n.command == ("notify-send", "x") and n.kind == "command" and n.checkpoint_name == "hook:n"
    assert w.when == {"RUNNING", "ERROR"} and w.backfill and w.kind == "webhook"
    assert w.webhook == WebhookTarget("https://h.example/p?q=1", "S", 10.0, 3600.0)
    assert w.describe()["target"] == "https://h.example/…"  # the path (a chat webhook's secret) is not shown
    assert n.source == "/etc/d.yaml (daemon config)"


def test_hooks_in_other_layers_are_ignored_here_and_refused_by_the_config() -> None:
    project = Layer("project", "/repo/.jobsup.yaml", {"hooks": [{"name": "x", "command": ["x"]}]})
    assert hooks_from_layers([project]) == ([], [])
    with pytest.raises(ConfigError) as info:
        effective_config(Layer("daemon", None, {}), [project])
    assert info.value.errors == [
        (
            "/repo/.jobsup.yaml (project config): hooks: hooks come only from the daemon config and the user config; "
            "a project file may not add them (a cloned repository must not run commands on this machine)"
        )
    ]
    # In the daemon and user layers, hooks are not part of a run's config.
    eff = effective_config(
        Layer("daemon", None, {"hooks": [{"name": "a", "command": ["a"]}]}),
        [Layer("user", None, {"hooks": [{"name": "b", "command": ["b"]}]})],
    )
    assert "hooks" not in eff.data


def test_every_error_is_reported_at_once() -> None:
    layer = Layer("user", "/u.yaml", {"hooks": [
        {"name": "bad name!", "command": []},
        {"name": "on-done", "command": ["x"], "match": {"phase": "x", "project": 3}},
        {"name": "w", "webhook": {"url": "https://x", "extra": 1, "in_flight": 0}, "timeout_s": 5, "backfill": "yes"},
        "not a mapping",
    ]})  # fmt: skip
    _, errors = hooks_from_layers([layer], env={})
    assert errors == [
        "/u.yaml (user config): hooks[0].name: is required: 1-63 letters, digits, '.', '_' or '-', got 'bad name!' (a string)",
        "/u.yaml (user config): hooks[0].command: must be a non-empty list of argv words, got a list",
        "/u.yaml (user config): hooks[1].name: 'on-done' is reserved for `submit --on-done`",
        "/u.yaml (user config): hooks[1].match.phase: unknown key; allowed: project, name, backend, reason",
        "/u.yaml (user config): hooks[1].match.project: must be a non-empty string (a glob) or a list of them, got 3",
        "/u.yaml (user config): hooks[2].webhook.extra: unknown key; allowed: url, secret_env, timeout_s, retry_for_s, in_flight",
        "/u.yaml (user config): hooks[2].webhook.in_flight: must be a whole number in 1..64, got 0",
        "/u.yaml (user config): hooks[2].timeout_s: is for command hooks; a webhook's is webhook.timeout_s",
        "/u.yaml (user config): hooks[2].backfill: must be true or false, got 'yes' (a string)",
        "/u.yaml (user config): hooks[3]: must be a mapping (name, when, match, command or webhook), got 'not a mapping' (a string)",
    ]
    _, errors = hooks_from_layers([Layer("user", "/u.yaml", {"hooks": {"name": "x"}})])
    assert errors == ["/u.yaml (user config): hooks: must be a list of hooks, got a mapping"]


def test_a_webhook_url_is_never_shown_in_errors() -> None:
    layer = Layer("user", None, {"hooks": [{"name": "w", "webhook": {"url": "ftp://tok3n@host/s3cret"}}]})
    _, errors = hooks_from_layers([layer])
    assert len(errors) == 1 and "s3cret" not in errors[0] and "tok3n" not in errors[0]


def test_match_uses_globs_and_the_events_own_reason() -> None:
    [hook] = load_hooks([Layer("user", None, {"hooks": [
        {"name": "m", "command": ["x"], "match": {"project": ["ml-*", "nlp"], "reason": "OOM*"}}
    ]})])  # fmt: skip
    run = {"project": "ml-a", "name": "t", "backend": "local", "reason": "something later"}
    assert matches(hook, _pc("ERROR", "OOMKilled"), run)
    assert not matches(hook, _pc("ERROR", "NonZeroExit"), run)
    assert not matches(hook, _pc("ERROR", None), run)
    assert not matches(hook, _pc("RUNNING", "OOMKilled"), run)  # not in `when`
    assert not matches(hook, _pc("ERROR", "OOMKilled"), {**run, "project": "ML-a"})  # case-sensitive
    assert matches(hook, _pc("ERROR", "OOMKilled"), {**run, "project": "nlp"})


def test_backoff_is_exponential_and_capped() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(10) == 300.0 and backoff_s(10_000) == 300.0


def test_retry_after_seconds_and_dates() -> None:
    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30.0
    assert retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_signature_is_hmac_sha256_hex() -> None:
    # RFC 4231 test case 2.
    assert signature(b"Jefe", b"what do ya want for nothing?") == (
        "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )


def test_parse_on_done() -> None:
    assert parse_on_done("claude --resume abc -p 'run done'") == ["claude", "--resume", "abc", "-p", "run done"]
    for bad in ("", "   ", "echo 'open"):
        with pytest.raises(TaskError, match="--on-done"):
            parse_on_done(bad)


@pytest.mark.anyio
async def test_command_output_is_capped_at_4_kib() -> None:
    got = await run_command(
        ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a; exit 0"], env=dict(os.environ), stdin=b"", timeout_s=30
    )
    assert got.ok and got.exit_code == 0 and got.output == "a" * 4096


@pytest.mark.anyio
async def test_command_that_cannot_start_fails_permanently(tmp_path: Path) -> None:
    got = await run_command([str(tmp_path / "missing")], env={}, stdin=b"", timeout_s=5)
    assert not got.ok and not got.retry and "cannot start" in (got.error or "")


@pytest.mark.anyio
async def test_command_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    got = await run_command(
        ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], env=dict(os.environ), stdin=b"", timeout_s=1
    )
    assert not got.ok and got.error is not None and got.error.startswith("timed out after 1 s")
    assert time.monotonic() - started < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the background child survived"
        await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_command_that_ignores_stdin_and_leaves_a_child_holding_stdout() -> None:
    # Exits at once; its background child keeps the output pipe open.
    got = await run_command(
        ["sh", "-c", "echo hi; sleep 5 &"], env=dict(os.environ), stdin=b"x" * 1_000_000, timeout_s=30
    )
    assert got.ok and got.output.startswith("hi") and got.duration_s < 4


@pytest.mark.anyio
async def test_command_timeout_also_kills_what_the_hook_moved_out_of_its_group(tmp_path: Path) -> None:
    """C17: a process the hook detached with setsid (its own session and
    group) outlived the timeout's group kill; it carries the attempt's
    marker, so it goes too."""
    pidfile = tmp_path / "pid"
    got = await run_command(
        ["sh", "-c", f"setsid sleep 301 & echo $! > {pidfile}; wait"], env=dict(os.environ), stdin=b"", timeout_s=1
    )
    assert not got.ok and got.error is not None and got.error.startswith("timed out after 1 s")
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the setsid child survived"
        await anyio.sleep(0.05)
