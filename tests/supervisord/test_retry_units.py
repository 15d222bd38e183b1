"""The retry policy (supervisord.shared.retry) without a daemon: parsing and its
errors, which failures retry, the backoff, the attempt list and which
attempt wrote a line; a task file's ``retry: {on: [...]}`` (YAML 1.1 reads
a bare ``on`` as true) and ``--retry N`` over it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from supervisord.shared.config.yamlload import load_yaml
from supervisord.shared.exceptions import ConfigError, TaskError
from supervisord.shared.retry import DEFAULT_ON, RetryPolicy, attempt_of_line, attempts_of, parse_retry, policy_of
from supervisord.shared.scheduling import parse_scheduling, scheduling_of
from supervisord.shared.task import load_task


def test_retry_n_is_n_retries_on_the_default_reasons() -> None:
    assert parse_retry(2, label="--retry") == {"attempts": 2, "on": list(DEFAULT_ON), "backoff_s": 10.0}


def test_a_mapping_names_reasons_exit_codes_and_a_backoff() -> None:
    got = parse_retry({"attempts": 3, "on": ["OOMKilled", "exit:75", "OOMKilled"], "backoff": "2m"})
    assert got == {"attempts": 3, "on": ["OOMKilled", "exit:75"], "backoff_s": 120.0}
    assert parse_retry({"attempts": 1, "backoff": "0s"})["backoff_s"] == 0.0
    # The recorded form is accepted again (rerun).
    assert parse_retry(got) == got


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (0, "--retry: must be in 1..100"),
        (101, "--retry: must be in 1..100"),
        (True, "--retry: must be a whole number"),
        ({"on": ["Lost"]}, "needs `attempts`"),
        ({"attempts": 2, "on": ["Bogus"]}, "--retry.on: 'Bogus' is not a failure reason"),
        ({"attempts": 2, "on": []}, "--retry.on: must be a non-empty list"),
        ({"attempts": 2, "on": ["exit:0"]}, "an exit code to retry on is 1..255"),
        ({"attempts": 2, "backoff": "-5s"}, "--retry.backoff: '-5s' is not a duration; use e.g. 30s"),
        ({"attempts": 2, "backoff": -1}, "must not be negative"),
        ({"attempts": 2, "backoff": "2d"}, "not a duration"),
        ({"attempts": 2, "backoff": "2h"}, "longer than the maximum of 1h"),
        ({"attempts": 2, "tries": 1}, "unknown key(s) tries"),
    ],
)
def test_bad_policies_name_the_key(value: Any, needle: str) -> None:
    with pytest.raises(TaskError) as err:
        parse_retry(value, label="--retry")
    assert needle in str(err.value)


def test_which_failures_retry() -> None:
    policy = RetryPolicy(2, ("Lost", "exit:3"), 5.0)
    assert policy.retries("Lost", None)
    assert policy.retries("NonZeroExit", 3)
    assert not policy.retries("NonZeroExit", 4)
    assert not policy.retries("OOMKilled", 137)
    assert RetryPolicy(1, ("NonZeroExit",), 0).retries("NonZeroExit", 1)


def test_the_backoff_doubles_up_to_an_hour() -> None:
    policy = RetryPolicy(20, DEFAULT_ON, 10.0)
    assert [policy.delay_s(n) for n in (1, 2, 3)] == [10.0, 20.0, 40.0]
    assert policy.delay_s(15) == 3600.0
    assert RetryPolicy(3, DEFAULT_ON, 0.0).delay_s(3) == 0.0


def test_the_policy_is_recorded_in_scheduling_and_kept_by_rerun() -> None:
    sched = parse_scheduling({"retry": {"attempts": 2, "on": ["Evicted"]}})
    assert sched["retry"] == {"attempts": 2, "on": ["Evicted"], "backoff_s": 10.0}
    assert scheduling_of({"scheduling": sched})["retry"] == sched["retry"]
    assert "retry" not in parse_scheduling({})
    assert policy_of({"scheduling": sched}) == RetryPolicy(2, ("Evicted",), 10.0)
    assert policy_of({"scheduling": parse_scheduling({})}) is None


def test_a_task_files_retry_reads_on_as_a_word(tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text("run: x\nretry:\n  attempts: 2\n  on: [Lost, 'exit:3']\n  backoff: 5s\n")
    assert load_task(task).scheduling["retry"] == {"attempts": 2, "on": ["Lost", "exit:3"], "backoff": "5s"}
    # `--retry N` over it: N retries, its reasons and backoff.
    over = load_task(task).with_overrides(scheduling={"retry": 4})
    assert over.scheduling["retry"] == {"attempts": 4, "on": ["Lost", "exit:3"], "backoff": "5s"}
    task.write_text("run: x\nretry: {attempts: 2, on: [Bogus]}\n")
    with pytest.raises(TaskError, match="`retry`.on: 'Bogus' is not a failure reason"):
        load_task(task)
    # Elsewhere a bare `on:` is still the boolean YAML reads, and an error.
    with pytest.raises(ConfigError, match="a hook's phases go under `when:`"):
        load_yaml("hooks:\n  - on: [ERROR]\n", source="c.yaml")
    with pytest.raises(ConfigError, match="key True is not a string"):
        load_yaml("retry: {attempts: 2, x: {on: 1}}\n", source="c.yaml")


@dataclasses.dataclass
class _E:
    type: str
    at: str
    data: dict[str, Any]


def test_attempts_from_events_and_the_run() -> None:
    events = [
        _E("AttemptEnded", "t1", {"attempt": 1, "reason": "Lost", "retry_in_s": 0.0, "last_line": 3}),
        _E("AttemptStarted", "t2", {"attempt": 2}),
        _E(
            "AttemptEnded",
            "t3",
            {"attempt": 2, "reason": "NonZeroExit", "exit_code": 3, "retry_in_s": 1.0, "last_line": 3},
        ),
        _E("AttemptStarted", "t4", {"attempt": 3}),
    ]
    run = {
        "attempt": 3,
        "phase": "COMPLETED",
        "reason": None,
        "exit_code": 0,
        "started_at": "t0",
        "ended_at": "t5",
        "log_lines": 7,
    }
    got = attempts_of(events, run)
    assert [
        (a["attempt"], a["started_at"], a["ended_at"], a["reason"], a["first_line"], a["last_line"]) for a in got
    ] == [
        (1, "t0", "t1", "Lost", 1, 3),
        (2, "t2", "t3", "NonZeroExit", 4, 3),  # wrote nothing
        (3, "t4", "t5", None, 4, 7),
    ]
    assert [attempt_of_line(got, n) for n in (1, 3, 4, 7)] == [1, 1, 3, 3]
    assert attempts_of([], {"attempt": 1, "phase": "ERROR"}) == []
    running = attempts_of(events[:2], {"attempt": 2, "phase": "RUNNING", "log_lines": 5})
    assert running[-1]["ended_at"] is None and running[-1]["last_line"] is None
    assert attempt_of_line(running, 5) == 2


def test_hooks_see_retrying_only_when_they_name_it() -> None:
    from store import RecordedEvent
    from supervisord.daemon.hooks.match import matches
    from supervisord.shared.config import Layer
    from supervisord.shared.hooksconfig import load_hooks

    def pc(phase: str, reason: str | None) -> RecordedEvent:
        return RecordedEvent(7, "r1", 3, "PhaseChanged", "2026-01-01T00:00:00Z", {"phase": phase, "reason": reason})

    [running, retrying, ended] = load_hooks([Layer("user", None, {"hooks": [
        {"name": "a", "command": ["x"], "when": ["RUNNING"]},
        {"name": "b", "command": ["x"], "when": ["retrying", "ERROR"]},
        {"name": "c", "command": ["x"]},
    ]})])  # fmt: skip
    run = {"project": "p", "name": "n", "backend": "local"}
    assert retrying.when == {"Retrying", "ERROR"} and retrying.describe()["when"] == ["ERROR", "Retrying"]
    assert [h.name for h in (running, retrying, ended) if matches(h, pc("RUNNING", "Retrying"), run)] == ["b"]
    assert [h.name for h in (running, retrying, ended) if matches(h, pc("RUNNING", None), run)] == ["a"]
    assert [h.name for h in (running, retrying, ended) if matches(h, pc("ERROR", "Lost"), run)] == ["b", "c"]
    with pytest.raises(ConfigError, match=r"when: must be a list of phases .*got 'Retry'.*or Retrying"):
        load_hooks([Layer("user", None, {"hooks": [{"name": "d", "command": ["x"], "when": ["Retry"]}]})])
