"""The pure scheduling policy, table-driven."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from supervisord.daemon.scheduler.policy import (
    Active,
    Gpu,
    Situation,
    Waiting,
    decide,
    find_cycle,
)

G = [Gpu(i, f"GPU-{i}") for i in range(4)]
NOW = 1_000_000.0


def W(rid: str, order: int, **kw: object) -> Waiting:
    return Waiting(run_id=rid, order=order, **kw)  # type: ignore[arg-type]


def S(
    waiting: list[Waiting],
    active: list[Active] | None = None,
    caps: dict[str, int | None] | None = None,
    phases: dict[str, str] | None = None,
    gpus: list[Gpu] | None = None,
) -> Situation:
    return Situation(waiting, active or [], G if gpus is None else gpus, caps or {}, phases or {}, NOW)


CASES = [
    # name, situation, admitted ids (in order), pending {id: reason}, failed ids
    ("fifo, no gpus", S([W("b", 2), W("a", 1)]), ["a", "b"], {}, []),
    ("priority first", S([W("a", 1, gpus=4), W("b", 2, gpus=4, priority=5)]), ["b"], {"a": "WaitingForGPUs"}, []),
    ("held waits", S([W("a", 1, held=True)]), [], {"a": "Held"}, []),
    ("slot cap", S([W("a", 1, queue="q"), W("b", 2, queue="q")], caps={"q": 1}), ["a"], {"b": "WaitingForSlot"}, []),
    (
        "slot cap counts active",
        S([W("a", 1, queue="q")], active=[Active("x", "q", (), NOW + 10)], caps={"q": 1}),
        [],
        {"a": "WaitingForSlot"},
        [],
    ),
    ("dependency waits", S([W("a", 1, after=("x",))], phases={"x": "RUNNING"}), [], {"a": "WaitingForDependency"}, []),
    ("dependency done", S([W("a", 1, after=("x",))], phases={"x": "COMPLETED"}), ["a"], {}, []),
    ("after-any on error", S([W("a", 1, after_any=("x",))], phases={"x": "ERROR"}), ["a"], {}, []),
    (
        "after fails, cascades",
        S([W("a", 1, after=("x",)), W("b", 2, after=("a",)), W("c", 3, after_any=("b",))], phases={"x": "ERROR"}),
        ["c"],
        {},
        ["a", "b"],
    ),
    ("too many gpus for the machine", S([W("a", 1, gpus=5), W("b", 2, gpus=1)]), ["b"], {"a": "WaitingForGPUs"}, []),
    (
        "head reserves: long 1-gpu run may not pass a 4-gpu head",
        S(
            [W("big", 1, gpus=4), W("small", 2, gpus=1, timeout_s=3600)],
            active=[Active("x", "default", ("GPU-0",), NOW + 600)],
        ),
        [],
        {"big": "WaitingForGPUs", "small": "WaitingForGPUs"},
        [],
    ),
    (
        "backfill: short run that ends before the shadow time passes",
        S(
            [W("big", 1, gpus=4), W("short", 2, gpus=1, timeout_s=60)],
            active=[Active("x", "default", ("GPU-0",), NOW + 600)],
        ),
        ["short"],
        {"big": "WaitingForGPUs"},
        [],
    ),
    (
        "backfill on extra gpus: head needs 2, 3 free at shadow",
        S(
            [W("head", 1, gpus=3), W("long", 2, gpus=1, timeout_s=99999)],
            active=[Active("x", "default", ("GPU-0", "GPU-1"), NOW + 600)],
        ),
        ["long"],
        {"head": "WaitingForGPUs"},
        [],
    ),
    (
        "cpu runs pass a gpu head",
        S([W("big", 1, gpus=4), W("cpu", 2)], active=[Active("x", "default", ("GPU-0",), NOW + 9)]),
        ["cpu"],
        {"big": "WaitingForGPUs"},
        [],
    ),
]


@pytest.mark.parametrize("name,situation,admitted,pending,failed", CASES, ids=[c[0] for c in CASES])
def test_decide(
    name: str, situation: Situation, admitted: list[str], pending: dict[str, str], failed: list[str]
) -> None:
    d = decide(situation)
    assert [a.run_id for a in d.admit] == admitted
    assert {k: p.reason for k, p in d.pending.items()} == pending
    assert sorted(f.run_id for f in d.fail) == failed


def test_head_message_names_holders_and_deep_messages_are_stable() -> None:
    active = [Active("r1", "default", ("GPU-1",), NOW + 100)]
    d = decide(S([W("a", 1, gpus=4), W("b", 2, gpus=1, timeout_s=9999)], active=active))
    when = time.strftime("%H:%M UTC", time.gmtime(NOW + 100))
    assert (
        d.pending["a"].message
        == f"needs 4 GPUs, 3 free: GPU 1 held by run r1; GPUs 0-3 reserved for it from about {when}"
    )
    later = decide(
        S(
            [W("a", 1, gpus=4), W("b", 2, gpus=1, timeout_s=9999)],
            active=[Active("r2", "default", ("GPU-2", "GPU-3"), NOW + 100)],
        )
    )
    assert later.pending["b"].message == d.pending["b"].message
    # The QUEUED message names the reservation, without the time left (it
    # would change at every pass, and each change is an event per run).
    assert d.pending["b"].message == (
        f"needs 1 GPU; GPUs 0-3 reserved for run a (needs 4) from about {when}: only a run that ends before then "
        "may start on the free ones (a shorter --timeout could let it start now; `jobsup queue` says how short)"
    )
    a_minute_on = decide(
        dataclasses.replace(S([W("a", 1, gpus=4), W("b", 2, gpus=1, timeout_s=9999)], active=active), now=NOW + 61)
    )
    assert a_minute_on.pending["b"].message == d.pending["b"].message
    assert a_minute_on.pending["a"].message == d.pending["a"].message
    # Holders past their deadlines: no time to name, and still no churn.
    overdue = [Active("r1", "default", ("GPU-1", "GPU-2"), NOW - 100)]
    late = decide(S([W("a", 1, gpus=4), W("b", 2, gpus=3), W("c", 3, gpus=1, timeout_s=9999)], active=overdue))
    assert late.pending["b"].message.endswith(
        "(GPUs 0-3 reserved for run a (needs 4) from when their holders, past their timeouts, end)"
    )
    later_still = decide(
        dataclasses.replace(
            S([W("a", 1, gpus=4), W("b", 2, gpus=3), W("c", 3, gpus=1, timeout_s=9999)], active=overdue),
            now=NOW + 3600,
        )
    )
    assert {k: p.message for k, p in later_still.pending.items()} == {k: p.message for k, p in late.pending.items()}


def test_admission_takes_lowest_free_indices() -> None:
    d = decide(S([W("a", 1, gpus=2)], active=[Active("x", "default", ("GPU-0", "GPU-2"), NOW + 5)]))
    assert [g.index for g in d.admit[0].gpus] == [1, 3]


def test_randomized_never_shares_a_gpu() -> None:
    rng = random.Random(7)
    for _ in range(300):
        active: list[Active] = []
        pool = [g.uuid for g in G]
        rng.shuffle(pool)
        for i in range(rng.randint(0, 3)):
            n = rng.randint(0, min(2, len(pool)))
            active.append(Active(f"x{i}", "default", tuple(pool[:n]), NOW + rng.randint(1, 999)))
            del pool[:n]
        waiting = [
            W(f"w{i}", i, gpus=rng.randint(0, 4), priority=rng.randint(-2, 2), timeout_s=rng.randint(1, 2000))
            for i in range(rng.randint(1, 12))
        ]
        d = decide(S(waiting, active=active))
        taken = [u for a in active for u in a.gpus] + [g.uuid for a in d.admit for g in a.gpus]
        assert len(taken) == len(set(taken))
        assert len(d.admit) + len(d.pending) == len(waiting)


def test_find_cycle() -> None:
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["a"]}) == ["a", "a"]
