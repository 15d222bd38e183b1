"""Sweeps end to end: the real daemon and CLI, real local jobs.

One submit records the whole grid (one transaction: SweepSubmitted, then
each run's Submitted); the sweep id works in runs, wait, cancel, hold,
release and --after; --max-parallel holds the rest in QUEUED
(WaitingForSlot naming the sweep); every run gets its params; progress
files become Progress events and the results table shows the metrics.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisord.shared.schemas import schema_errors
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(240)

# Records its params and env, reports progress with metrics, then waits
# for a gate file (when given) and exits.
TRAIN = (
    "import json, os, sys, time\n"
    "out, gate = sys.argv[1], sys.argv[2]\n"
    "env = {k: v for k, v in os.environ.items() if k.startswith('JOBSUP_') or k == 'TOKEN'}\n"
    "with open(out, 'a') as f: f.write(json.dumps({'argv': sys.argv[3:], 'env': env, 't': time.time()}) + '\\n')\n"
    "lr = float(os.environ.get('JOBSUP_PARAM_LR', '0'))\n"
    "with open(os.environ['JOBSUP_PROGRESS_FILE'], 'w') as f:\n"
    "    f.write(json.dumps({'step': 3, 'total': 3, 'metrics': {'acc': round(1 - lr, 4)}}))\n"
    "while gate != '-' and not os.path.exists(gate): time.sleep(0.05)\n"
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"train.py": TRAIN, "scripts/eval.sh": "echo eval\n"})


def _until(pred: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def _sweep_doc(js: JobsupEnv, sweep: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(js.cli("runs", "--sweep", sweep, "-o", "json").stdout)
    return doc


def _queued_doc(js: JobsupEnv, sweep: str, n: int) -> dict[str, Any] | None:
    doc = _sweep_doc(js, sweep)
    return doc if doc["counts"].get("QUEUED") == n else None


def test_sweep_runs_the_grid_with_params_limits_parallelism_and_reports_metrics(js: JobsupEnv, repo: Path) -> None:
    js.daemon_config("local:\n  progress_interval_s: 0.2\n")
    js.start_daemon()
    out, gate = js.root / "rec.jsonl", js.root / "gate"
    proc = js.cli(
        "submit",
        "--sweep",
        "lr=0.1,0.2",
        "--sweep",
        "seed=1..2",
        "--max-parallel",
        "2",
        "--label",
        "team=vision",
        "--",
        f"{sys.executable} train.py {out} {gate} --lr {{lr}} --seed {{seed}}",
        cwd=repo,
    )
    sweep = proc.stdout.strip()
    assert len(sweep) == 12 and sweep.startswith("s"), proc.stdout
    # Two start; the other two wait for a slot of the sweep.
    _until(lambda: len(_records(out)) == 2, what="two runs started")
    doc = _until(lambda: _queued_doc(js, sweep[:6], 2), what="two queued")
    queued = [r for r in doc["rows"] if r["phase"] == "QUEUED"]
    runs = {
        r["id"]: r
        for r in json.loads(js.cli("runs", "--sweep", sweep, "--all", "--label", "team=vision", "-o", "json").stdout)[
            "rows"
        ]
    }
    assert len(runs) == 4
    for q in queued:
        run = js.show(q["id"])
        assert run["reason"] == "WaitingForSlot" and sweep in run["message"], run
    time.sleep(1.0)
    assert len(_records(out)) == 2  # still only two at once
    gate.write_text("go")
    assert js.cli("wait", sweep, check=False).returncode == 0
    recs = _records(out)
    assert sorted(tuple(r["argv"]) for r in recs) == [
        ("--lr", "0.1", "--seed", "1"),
        ("--lr", "0.1", "--seed", "2"),
        ("--lr", "0.2", "--seed", "1"),
        ("--lr", "0.2", "--seed", "2"),
    ]
    for r in recs:
        env = r["env"]
        assert env["JOBSUP_SWEEP_ID"] == sweep
        assert env["JOBSUP_PARAM_LR"] == r["argv"][1] and env["JOBSUP_PARAM_SEED"] == r["argv"][3]
        assert env["JOBSUP_PROGRESS_FILE"].endswith("/progress")
    assert sorted(r["env"]["JOBSUP_SWEEP_INDEX"] for r in recs) == ["0", "1", "2", "3"]
    doc = _sweep_doc(js, sweep)
    assert schema_errors("sweep", doc) == []
    assert schema_errors("runs", json.loads(js.cli("runs", "--all", "-o", "json").stdout)) == []
    assert schema_errors("run-detail", js.show(doc["rows"][0]["id"])) == []
    db = sqlite3.connect(js.state_dir / "jobsup.db")
    for row in db.execute("SELECT seq, run_id, version, type, at, data FROM events ORDER BY seq"):
        event = dict(zip(("seq", "run_id", "version", "type", "at"), row[:5]), data=json.loads(row[5]))
        assert schema_errors("event", event) == [], event
    db.close()
    assert doc["sweep"]["grid"] == {"lr": ["0.1", "0.2"], "seed": ["1", "2"]}
    assert doc["sweep"]["max_parallel"] == 2 and doc["params"] == ["lr", "seed"] and doc["metrics"] == ["acc"]
    assert [r["name"] for r in doc["rows"]] == [
        "train[lr=0.1,seed=1]",
        "train[lr=0.1,seed=2]",
        "train[lr=0.2,seed=1]",
        "train[lr=0.2,seed=2]",
    ]
    for row in doc["rows"]:
        assert row["phase"] == "COMPLETED" and row["elapsed_s"] is not None
        assert row["metrics"] == {"acc": round(1 - float(row["params"]["lr"]), 4)}
        assert row["progress"]["step"] == 3
    # The table, sorted by the metric (descending) and as CSV.
    table = js.cli("runs", "--sweep", sweep, "--sort", "-acc").stdout.splitlines()
    assert table[0].split()[:6] == ["ID", "LR", "SEED", "PHASE", "ELAPSED_S", "STEP"] and table[0].split()[-1] == "ACC"
    assert [line.split()[1] for line in table[1:]] == ["0.1", "0.1", "0.2", "0.2"]
    csv = js.cli("runs", "--sweep", sweep, "--csv", "--sort", "acc").stdout.splitlines()
    assert csv[0] == "id,lr,seed,phase,elapsed_s,step,acc" and csv[1].split(",")[1] == "0.2"
    # Run objects carry labels, sweep and params; `runs` shows PROGRESS.
    listed = json.loads(js.cli("runs", "--label", "team=vision", "--name", "train[[]lr=0.1*", "-o", "json").stdout)
    assert len(listed) == 2 and all(r["sweep_id"] == sweep and r["labels"] == {"team": "vision"} for r in listed)
    assert {r["params"]["seed"] for r in listed} == {"1", "2"}
    assert "PROGRESS" in js.cli("runs").stdout.splitlines()[0]
    assert json.loads(js.cli("runs", "--label", "team=other", "-o", "json").stdout) == []
    # One transaction: SweepSubmitted, then the four Submitted, consecutive seqs.
    db = sqlite3.connect(js.state_dir / "jobsup.db")
    rows = db.execute(
        "SELECT seq, run_id, type FROM events WHERE type IN ('SweepSubmitted', 'Submitted') ORDER BY seq"
    ).fetchall()
    db.close()
    assert [t for _, _, t in rows] == ["SweepSubmitted"] + ["Submitted"] * 4
    assert rows[0][1] == sweep and [s for s, _, _ in rows] == list(range(rows[0][0], rows[0][0] + 5))


def test_sweep_handle_cancel_hold_release_after(live: JobsupEnv, repo: Path) -> None:
    js = live
    gate = js.root / "gate"
    sweep = js.cli(
        "submit",
        "--hold",
        "--sweep",
        "lr=0.1,0.2,0.3",
        "--",
        f"{sys.executable} train.py /dev/null {gate} {{lr}}",
        cwd=repo,
    ).stdout.strip()
    after = js.submit(repo, "--name", "report", "--after", sweep, "--", "true")
    assert js.show(after)["reason"] == "WaitingForDependency" or js.show(after)["phase"] == "QUEUED"
    doc = _sweep_doc(js, sweep)
    assert [r["reason"] for r in doc["rows"]] == ["Held"] * 3
    js.cli("release", sweep)
    _until(lambda: _sweep_doc(js, sweep)["counts"].get("RUNNING") == 3, what="three running")
    js.cli("cancel", sweep[:7])
    doc = _sweep_doc(js, sweep)
    assert doc["counts"] == {"CANCELED": 3}
    assert js.cli("wait", sweep, check=False).returncode == 3  # as for several runs: CANCELED
    # The run after the whole sweep fails its dependency.
    _until(lambda: js.show(after)["phase"] == "CANCELED", what="dependent canceled")
    assert js.show(after)["reason"] == "DependencyFailed"


def test_default_names_and_the_in_flight_rule(live: JobsupEnv, repo: Path) -> None:
    js = live
    gate = js.root / "gate"
    first = js.submit(repo, "--", f"{sys.executable} train.py /dev/null {gate}")
    assert js.show(first)["name"] == "train"
    # A second single run of that name in flight is refused, as before.
    refused = js.cli("submit", "--", f"{sys.executable} train.py /dev/null {gate}", cwd=repo, check=False)
    assert refused.returncode != 0 and "in flight" in refused.stderr
    assert js.show(js.submit(repo, "--", "bash scripts/eval.sh"))["name"] == "eval"
    assert js.show(js.submit(repo, "--", "echo hi"))["name"] == "echo"
    gate.write_text("go")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--sweep", "lr="], "--sweep lr: the value list is empty"),
        (["--sweep", "1lr=1,2"], "is not a valid key"),
        (["--sweep", "lr=1", "--sweep", "lr=2"], "given twice"),
        (["--sweep", "seed=5..1"], "range 5..1 is empty"),
        (["--sweep", "a=1..100", "--sweep", "b=1..101"], "10100 runs"),
        (["--sweep", "lr=1,2", "--max-parallel", "0"], "--max-parallel: must be in 1..10000"),
        (["--sweep", "lr=1,2", "--", "echo {lr} {seed}"], "{seed}: the command uses it but no --sweep defines it"),
        (["--max-parallel", "2", "--", "echo"], "--max-parallel: only a sweep"),
        (["--label", "bad key=1", "--", "echo"], "is not a label key"),
    ],
)
def test_bad_sweeps_are_one_error_line_and_record_nothing(
    live: JobsupEnv, repo: Path, args: list[str], needle: str
) -> None:
    js = live
    cmd = args if "--" in args else [*args, "--", "echo {lr}"]
    proc = js.cli("submit", *cmd, cwd=repo, check=False)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []


def test_an_unused_sweep_key_is_a_warning(live: JobsupEnv, repo: Path) -> None:
    proc = live.cli("submit", "--sweep", "lr=1", "--sweep", "seed=1,2", "--", "echo {lr}", cwd=repo)
    assert "warning: --sweep seed: the command never uses {seed}" in proc.stderr
    assert live.cli("wait", proc.stdout.strip()).returncode == 0


def test_a_queued_sweep_keeps_its_env_across_a_daemon_restart(live: JobsupEnv, repo: Path) -> None:
    js = live
    out = js.root / "rec.jsonl"
    sweep = js.cli(
        "submit", "--hold", "--env", "TOKEN=s3cret", "--sweep", "lr=0.1,0.2",
        "--", f"{sys.executable} train.py {out} - {{lr}}", cwd=repo,
    ).stdout.strip()  # fmt: skip
    pending = js.state_dir / "runs" / sweep / "pending.json"
    assert pending.exists() and "s3cret" in pending.read_text()
    js.stop_daemon()
    js.start_daemon()
    js.cli("release", sweep)
    assert js.cli("wait", sweep).returncode == 0
    recs = _records(out)
    assert sorted(r["env"]["JOBSUP_PARAM_LR"] for r in recs) == ["0.1", "0.2"]
    assert {r["env"]["JOBSUP_SWEEP_ID"] for r in recs} == {sweep}
    assert {r["env"]["TOKEN"] for r in recs} == {"s3cret"}
    assert not pending.exists()  # no value kept once every run started


def test_a_rerun_of_a_sweep_run_gets_its_params(live: JobsupEnv, repo: Path) -> None:
    js = live
    out = js.root / "rec.jsonl"
    sweep = js.cli("submit", "--sweep", "lr=0.3", "--", f"{sys.executable} train.py {out} - {{lr}}", cwd=repo)
    assert js.cli("wait", sweep.stdout.strip()).returncode == 0
    first = _sweep_doc(js, sweep.stdout.strip())["rows"][0]["id"]
    again = js.cli("rerun", first).stdout.strip()
    assert js.cli("wait", again).returncode == 0
    recs = _records(out)
    assert [r["env"]["JOBSUP_PARAM_LR"] for r in recs] == ["0.3", "0.3"]
