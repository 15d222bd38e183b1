"""Unit tests of the sweep grammar (supervisord.shared.sweep), progress reports
(supervisord.shared.progress), the results table (supervisord.client.cli.sweep_table)
and the scheduler's sweep cap (supervisord.daemon.scheduler.policy)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisord.daemon.scheduler.policy import WAITING_FOR_SLOT, Active, Situation, Waiting, decide
from supervisord.shared.exceptions import TaskError, UsageError
from supervisord.shared.progress import MAX_READ, ProgressFile, RateLimit, parse_progress, progress_text
from supervisord.shared.sweep import (
    MAX_RUNS,
    check_grid,
    check_handles,
    check_labels,
    check_placeholders,
    expand,
    is_sweep_ref,
    new_sweep_id,
    param_env,
    parse_labels,
    parse_sweep_pairs,
    run_name,
    substitute,
)
from supervisord.shared.sweeptable import flat_rows, sort_rows, table_columns, to_csv

# -- the grammar ------------------------------------------------------------------


def test_pairs_ranges_and_the_product_in_order() -> None:
    grid = parse_sweep_pairs(["lr=1e-4,3e-4,1e-3", "seed=1..3"])
    assert grid == {"lr": ["1e-4", "3e-4", "1e-3"], "seed": ["1", "2", "3"]}
    runs = expand(grid)
    assert len(runs) == 9 and runs[0] == {"lr": "1e-4", "seed": "1"} and runs[1] == {"lr": "1e-4", "seed": "2"}
    assert parse_sweep_pairs(["x=-2..0"]) == {"x": ["-2", "-1", "0"]}


@pytest.mark.parametrize(
    ("pairs", "needle"),
    [
        (["lr="], "value list is empty"),
        (["lr=1,,2"], "empty value"),
        (["lr"], "use KEY=V1,V2"),
        (["2x=1"], "not a valid key"),
        (["my-key=1"], "not a valid key"),
        (["lr=1", "lr=2"], "given twice"),
        (["lr=1", "LR=2"], "given twice"),
        (["seed=5..1"], "range 5..1 is empty"),
        (["lr=1,1"], "twice"),
        (["a=1..101", "b=1..100"], "10100 runs"),
        ([f"a=0..{MAX_RUNS}"], "more than"),
    ],
)
def test_bad_pairs_name_the_flag(pairs: list[str], needle: str) -> None:
    with pytest.raises(TaskError, match="--sweep") as info:
        parse_sweep_pairs(pairs)
    assert needle in str(info.value)


def test_task_file_grids() -> None:
    assert check_grid({"lr": [0.001, "3e-4"], "seed": "1..2", "n": 5}) == {
        "lr": ["0.001", "3e-4"],
        "seed": ["1", "2"],
        "n": ["5"],
    }
    for bad in ({}, {"lr": []}, {"lr": [True]}, {"lr": [[1]]}, {"lr": None}, [1]):
        with pytest.raises(TaskError):
            check_grid(bad)


def test_placeholders_names_and_env() -> None:
    grid = {"lr": ["1e-4"], "seed": ["1"]}
    assert check_placeholders("python t.py --lr {lr} --seed {seed}", None, grid) == []
    warnings = check_placeholders("python t.py --lr {lr} ${HOME}", None, grid)
    assert warnings == ["--sweep seed: the command never uses {seed} (the run gets it as $JOBSUP_PARAM_SEED only)"]
    with pytest.raises(TaskError, match=r"\{epochs\}: the command uses it but no --sweep defines it"):
        check_placeholders("python t.py {lr} {epochs}", None, grid)
    assert check_placeholders("t {lr}", "run-{seed}", grid) == []
    params = {"lr": "1e-4", "seed": "1"}
    assert substitute("x {lr} ${lr} {other}", params) == "x 1e-4 ${lr} {other}"
    assert run_name("train", params) == "train[lr=1e-4,seed=1]"
    assert run_name("t-{lr}", params) == "t-1e-4"
    assert param_env(params, "s0123456789a", 4) == {
        "JOBSUP_PARAM_LR": "1e-4",
        "JOBSUP_PARAM_SEED": "1",
        "JOBSUP_SWEEP_ID": "s0123456789a",
        "JOBSUP_SWEEP_INDEX": "4",
    }


def test_sweep_ids_and_handles() -> None:
    sid = new_sweep_id()
    assert len(sid) == 12 and sid[0] == "s" and is_sweep_ref(sid) and is_sweep_ref(sid[:5].upper())
    assert not is_sweep_ref(sid[:4]) and not is_sweep_ref("0123456789ab") and not is_sweep_ref("sxyz12")
    check_handles([sid, "abcd", "0123456789ab"])
    with pytest.raises(UsageError, match="nothing was done"):
        check_handles([sid, "zz"])


def test_labels() -> None:
    assert parse_labels(["team=vision", "exp=a=b"]) == {"team": "vision", "exp": "a=b"}
    assert check_labels({"k8s.io/x": 1}) == {"k8s.io/x": "1"}
    for bad in (["novalue"], ["bad key=1"], ["a=1", "a=2"], ["-x=1"]):
        with pytest.raises(TaskError, match="--label"):
            parse_labels(bad)


# -- progress -----------------------------------------------------------------------


def test_parse_progress() -> None:
    assert parse_progress(b'{"step": 5, "total": 100, "message": "ep 1", "metrics": {"loss": 0.31, "x": [1]}}') == {
        "step": 5,
        "total": 100,
        "message": "ep 1",
        "metrics": {"loss": 0.31},
    }
    assert parse_progress(b"epoch 3 of 10\nmore") == {"message": "epoch 3 of 10"}
    assert parse_progress(b'{"step": 5, "tot') is None  # a write caught halfway
    assert parse_progress(b"") is None and parse_progress(b"  \n") is None
    assert parse_progress(b'{"step": NaN, "metrics": {"a": Infinity}}') is None
    garbage = parse_progress(bytes(range(256)))
    assert garbage is None or all(c.isprintable() for c in garbage["message"])
    assert parse_progress(b'{"step": 1}' + b" " * 10 * MAX_READ) == {"step": 1}
    assert parse_progress(b'{"message": "' + b"x" * (2 * MAX_READ) + b'"}') is None  # cut at 4 KiB


def test_progress_text() -> None:
    assert progress_text({"step": 5, "total": 100, "metrics": {"loss": 0.31234567, "acc": 0.88}}) == (
        "5/100 loss=0.3123 acc=0.88"
    )
    assert progress_text({"message": "warming up"}) == "warming up"
    assert progress_text(None) == "-"


def test_rate_limit_never_records_more_than_the_interval_allows() -> None:
    limit = RateLimit(10.0)
    recorded = []
    for i in range(100_000):  # 10,000 reports a second for 10 s
        now = i / 10_000
        limit.offer({"step": i})
        got = limit.take(now)
        if got is not None:
            recorded.append(now)
    assert recorded == [0.0]
    assert limit.final() == {"step": 99_999}
    assert limit.final() is None  # nothing new since


def test_progress_file_reads_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    watcher = ProgressFile(path, 10.0)
    assert watcher.poll(0.0) is None  # no file yet
    path.write_text('{"step": 1}')
    assert watcher.poll(5.0) is None  # looked at 0.0: not again before 10.0
    assert watcher.poll(10.0) == {"step": 1}
    path.write_text('{"step": 2}')
    assert watcher.poll(15.0) is None
    assert watcher.poll(20.0) == {"step": 2}
    assert watcher.poll(30.0) is None  # unchanged
    path.write_bytes(b'{"step": 3')  # halfway
    assert watcher.poll(40.0) is None
    path.write_text('{"step": 3}')
    assert watcher.final() == {"step": 3}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert ProgressFile(fifo, 1.0).poll(0.0) is None  # not a regular file: never blocks


# -- the results table ------------------------------------------------------------


def _doc() -> dict[str, object]:
    def row(i: int, lr: str, acc: float | None, phase: str = "COMPLETED") -> dict[str, object]:
        return {
            "id": f"{i:012x}",
            "params": {"lr": lr},
            "phase": phase,
            "reason": None,
            "elapsed_s": 1.5,
            "progress": {"step": 3, "total": 3} if acc is not None else None,
            "metrics": {"acc": acc} if acc is not None else {},
        }

    return {
        "params": ["lr"],
        "metrics": ["acc"],
        "rows": [row(1, "10", 0.5), row(2, "9", 0.9), row(3, "x", None, "QUEUED")],
    }


def test_results_table_sort_and_csv() -> None:
    doc = _doc()
    cols = table_columns(doc)
    assert cols == ["id", "lr", "phase", "elapsed_s", "step", "acc"]
    rows = flat_rows(doc)
    assert [r["id"][-1] for r in sort_rows(rows, "-acc", cols)] == ["2", "1", "3"]
    assert [r["id"][-1] for r in sort_rows(rows, "acc", cols)] == ["1", "2", "3"]
    assert [r["lr"] for r in sort_rows(rows, "lr", cols)] == ["10", "9", "x"]  # not all numbers: as text
    with pytest.raises(UsageError, match="--sort 'loss'"):
        sort_rows(rows, "loss", cols)
    assert to_csv(rows, cols).splitlines()[:2] == [
        "id,lr,phase,elapsed_s,step,acc",
        "000000000001,10,COMPLETED,1.5,3/3,0.5",
    ]


# -- the scheduler's sweep cap -------------------------------------------------------


def test_the_sweep_cap_holds_the_rest_waiting_for_a_slot() -> None:
    waiting = [Waiting(f"r{i}", order=i, sweep="s0123456789a", sweep_cap=2) for i in range(5)]
    other = Waiting("x", order=9)
    d = decide(Situation([*waiting, other], [], [], {}, {}, 0.0))
    assert [a.run_id for a in d.admit] == ["r0", "r1", "x"]
    assert {rid: p.reason for rid, p in d.pending.items()} == {f"r{i}": WAITING_FOR_SLOT for i in (2, 3, 4)}
    assert "sweep s0123456789a already runs 2 runs (max_parallel 2)" in d.pending["r2"].message
    active = [Active("r0", "default", (), 1e12, sweep="s0123456789a")]
    d = decide(Situation(waiting[2:], active, [], {}, {}, 0.0))
    assert [a.run_id for a in d.admit] == ["r2"]
